"""Graph cache: a warm start skips AOTAutograd, lowering, scheduling, codegen and LLVM.

Two levels, both on disk next to the kernel objects (runtime/cache.py, `TORCH_UOP_CACHE_DIR`):

- **ATen graphs** (`aten_key`): the code of an AOTAutograd graph, its inputs' shapes, strides and dtypes and
  its tensor constants -> the `GraphPlan` of its CompiledGraph (steps, buffers, arena, native object). Any graph
  whose plan pickles is stored (not ones with a storage offset guard or a lowering's Python host step).
- **Dynamo graphs** (`dynamo_key`): the code of the graph Dynamo hands the backend and its example inputs ->
  what AOTAutograd made of it: the inference graph, or the forward and backward graphs plus the little
  bookkeeping AOTAutograd's runtime does around them (`DynamoEntry`). A hit runs no AOTAutograd at all. Only
  graphs whose bookkeeping is simple are stored: no aliased outputs, no tensor subclasses, no effect tokens,
  no saved symbolic sizes, and input mutations only of data, of inputs that do not require grad (BatchNorm's
  running statistics). The rest are compiled through AOTAutograd each time (with ATen-level hits).

Keys hold everything the result depends on: the graph's code, the inputs' metadata, grad and autocast modes,
the options, the torch version, the host CPU, and a digest of torch_uop's own sources (so editing the compiler
invalidates every entry). A graph calling something that is not a torch function is not cached: its code does
not say what it calls. An unreadable or stale entry is a miss, never an error.
"""
from __future__ import annotations
import functools
import hashlib
import os
import pickle
from dataclasses import dataclass, field
import torch
from torch_uop.runtime import cache

SUFFIX = ".graph"


@functools.cache
def source_digest() -> str:
  """SHA-256 of torch_uop's Python sources: a change to the compiler is a change to every key."""
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  h = hashlib.sha256()
  for d, subdirs, files in sorted(os.walk(root)):
    subdirs.sort()
    for f in sorted(files):
      if f.endswith(".py"):
        h.update(os.path.relpath(os.path.join(d, f), root).encode())
        with open(os.path.join(d, f), "rb") as fh: h.update(fh.read())
  return h.hexdigest()


def _environment(config) -> list[str]:
  from torch_uop.runtime.cpu import target_id, openmp_supported, vector_unit
  return [torch.__version__, source_digest(), *target_id(), repr(vector_unit()), f"opt{config.opt_level}", f"beam{config.beam}",
          f"openmp{openmp_supported()}", f"device={config.device}", f"recompute{config.recompute}"]


def _tensor_meta(t) -> str:
  if not isinstance(t, torch.Tensor): raise _NotCacheable(f"a {type(t).__name__} input")
  if type(t) not in (torch.Tensor, torch.nn.Parameter) and not _is_fake(t): raise _NotCacheable("a tensor subclass")
  return f"{tuple(t.shape)}|{t.stride()}|{t.dtype}|{t.device.type}|{t.storage_offset()}|{t.requires_grad}|{t.is_leaf}"


def _is_fake(t) -> bool:
  from torch._subclasses.fake_tensor import FakeTensor
  return isinstance(t, FakeTensor)


class _NotCacheable(Exception):
  pass


def _constants(gm: torch.fx.GraphModule) -> list[str]:
  """The graph's attributes (get_attr): tensor constants by content, nested graphs by code."""
  out = []
  for node in gm.graph.nodes:
    if node.op != "get_attr": continue
    value = gm
    for part in node.target.split("."): value = getattr(value, part)
    if isinstance(value, torch.fx.GraphModule): out.append(f"{node.target}:{value.code}{_constants(value)}")
    elif isinstance(value, torch.Tensor) and not _is_fake(value) and value.layout is torch.strided:
      out.append(f"{node.target}:{_tensor_meta(value)}:{_content_digest(value)}")
    else:
      raise _NotCacheable(f"attribute {node.target} is a {type(value).__name__}")
  return out


def _content_digest(t: torch.Tensor) -> str:
  """SHA-256 of a real tensor's values, computed outside the compiler's fake tensor mode."""
  from torch._subclasses.fake_tensor import unset_fake_temporarily
  with unset_fake_temporarily(), torch.no_grad():
    data = t.detach().contiguous().cpu().reshape(-1)
    return hashlib.sha256(data.view(torch.uint8).numpy().tobytes() if data.numel() else b"").hexdigest()


def aten_key(gm: torch.fx.GraphModule, example_inputs, config, kind: str) -> str | None:
  """The key of an AOTAutograd (ATen) graph, or None when it cannot be cached."""
  try:
    metas = []
    for node in gm.graph.nodes:
      if node.op == "placeholder":
        val = node.meta.get("val")
        metas.append(_tensor_meta(val) if isinstance(val, torch.Tensor) else f"{type(val).__name__}:{val!r}")
    return cache.key("aten", kind, gm.code, *metas, *_constants(gm), *_environment(config))
  except _NotCacheable:
    return None


def _check_targets(gm: torch.fx.GraphModule) -> None:
  """Dynamo's graph names what it calls only by its Python name: cache it only if every call is torch's own."""
  import operator
  for node in gm.graph.nodes:
    if node.op == "call_module": raise _NotCacheable("a call_module node")
    if node.op == "call_function":
      t = node.target
      mod = getattr(t, "__module__", None) or ""
      if isinstance(t, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        # a user's custom op may change between processes; torch's own may not
        if str(t).split(".")[0] not in ("aten", "prims"): raise _NotCacheable(f"a call to custom op {t}")
      elif not (mod.split(".")[0] == "torch" or t in vars(operator).values() or mod == "builtins"):
        raise _NotCacheable(f"a call to {t!r}")


def _name(target) -> str:
  if isinstance(target, str): return target
  return f"{getattr(target, '__module__', None)}.{getattr(target, '__qualname__', None) or getattr(target, '__name__', target)}"


def _graph_text(gm: torch.fx.GraphModule) -> str:
  """The graph's nodes as text: what gm.code says, without generating Python (Dynamo's graphs are lazy)."""
  return "\n".join(f"{n.op} {n.name} {_name(n.target)} {n.args!r} {n.kwargs!r}" for n in gm.graph.nodes)


def dynamo_key(gm: torch.fx.GraphModule, example_inputs, config) -> str | None:
  """The key of the graph Dynamo hands the backend, or None when it cannot be cached."""
  try:
    _check_targets(gm)
    from torch_uop.lowering.specialize import is_symbolic
    if is_symbolic(list(example_inputs)): raise _NotCacheable("symbolic sizes (its static copies are cached per size)")
    metas, storages = [], {}
    for i, t in enumerate(example_inputs):
      metas.append(_tensor_meta(t))
      # inputs that share memory change what AOTAutograd does (deduplication, synthetic bases): not cached
      st = t.untyped_storage()._cdata if not _is_fake(t) else id(t)
      if st in storages: raise _NotCacheable("inputs share memory")
      storages[st] = i
    modes = [f"grad{torch.is_grad_enabled()}", f"det{torch.are_deterministic_algorithms_enabled()}",
             f"autocast{torch.is_autocast_enabled('cpu')}{torch.get_autocast_dtype('cpu')}",
             f"inference{torch.is_inference_mode_enabled()}"]
    return cache.key("dynamo", _graph_text(gm), *metas, *_constants(gm), *modes, *_environment(config))
  except (_NotCacheable, RuntimeError, AttributeError, TypeError):
    return None


# ----- entries -----

@dataclass
class GraphEntry:
  """One compiled ATen graph: its plan and the metrics its compile counted."""
  plan: object  # executor.GraphPlan
  nodes_lowered: int
  fallbacks: list
  fallback_reasons: dict = field(default_factory=dict)  # op name -> why it fell back (warned again when loaded)


@dataclass
class DynamoEntry:
  """What AOTAutograd made of a Dynamo graph, for graphs with simple bookkeeping (see the module docstring).
  inference: `forward` computes [new values of mutated inputs..., outputs...].
  training: `forward` computes [new values of mutated inputs..., outputs..., saved tensors...] and `backward` takes
  [saved tensors..., grads of the outputs that require grad...] and returns one grad (or None) per input."""
  training: bool
  forward: GraphEntry
  backward: GraphEntry | None = None
  mutated_inputs: list = field(default_factory=list)
  n_outputs: int = 0
  outputs_requiring_grad: list = field(default_factory=list)
  n_saved_vc: int = 0      # saved tensors whose version counter backward checks (ctx.save_for_backward)
  n_saved_no_vc: int = 0   # saved tensors it does not check (AOTAutograd keeps them on ctx)
  unsafe_view_outputs: list = field(default_factory=list)  # outputs handed out through aten._unsafe_view


def load(key: str | None):
  if key is None: return None
  data = cache.load(key, SUFFIX)
  if data is None: return None
  from torch._subclasses.fake_tensor import unset_fake_temporarily
  try:
    # backends compile under AOTAutograd's fake mode, where unpickled tensors (graph constants) would come back fake
    with unset_fake_temporarily(): return pickle.loads(data)
  except Exception:  # a stale or truncated entry is a miss
    return None


def store(key: str | None, entry) -> bool:
  if key is None: return False
  try:
    data = pickle.dumps(entry, protocol=pickle.HIGHEST_PROTOCOL)
  except (pickle.PicklingError, TypeError, AttributeError):
    return False
  cache.store(key, data, SUFFIX)
  return True


def simple_bookkeeping(meta, training: bool, n_fw_outputs: int) -> dict | None:
  """From AOTAutograd's ViewAndMutationMeta: the DynamoEntry fields, or None if its runtime does more than
  torch_uop's cached wrapper does (aliased outputs, metadata mutations, tokens, subclasses, symbolic saves)."""
  from torch._functorch._aot_autograd.schemas import OutputType, SubclassCreationMeta
  try:
    if meta.num_intermediate_bases or meta.tokens or meta.is_rng_op_functionalized: return None
    if getattr(meta, "num_graphsafe_rng_states", 0) or getattr(meta, "num_opaque_objects_saved_for_bw", 0): return None
    if any(isinstance(m, SubclassCreationMeta) for m in (*(meta.subclass_fw_graph_out_meta or ()), *(meta.subclass_inp_meta or ()))):
      return None
    # an unsafe_view_alias output is a fresh tensor that AOTAutograd re-wraps with _unsafe_view (done here too)
    if any(o.output_type not in (OutputType.non_alias, OutputType.unsafe_view_alias) for o in meta.output_info): return None
    mutated = list(meta.mutated_inp_runtime_indices)
    for i in mutated:
      info = meta.input_info[i]
      if not info.mutates_data or info.mutates_metadata or info.mutates_storage_metadata or info.requires_grad: return None
    if not training and n_fw_outputs != len(mutated) + len(meta.output_info): return None
    fields = {"mutated_inputs": mutated, "n_outputs": len(meta.output_info),
              "unsafe_view_outputs": [i for i, o in enumerate(meta.output_info) if o.output_type == OutputType.unsafe_view_alias],
              "outputs_requiring_grad": [o.requires_grad for o in meta.output_info]}
    if training:
      if meta.num_symints_saved_for_bw: return None
      if len(meta.traced_tangents) != sum(fields["outputs_requiring_grad"]): return None
      vc = range(n_fw_outputs)[meta.tensors_saved_for_backwards_with_vc_check_slice]
      no_vc = range(n_fw_outputs)[meta.tensors_saved_for_backwards_no_vc_check_slice]
      start = len(mutated) + len(meta.output_info)
      # the saved tensors follow the outputs, checked ones first, and nothing follows them
      if len(vc) and vc[0] != start or len(no_vc) and no_vc[0] != start + len(vc) or start + len(vc) + len(no_vc) != n_fw_outputs:
        return None
      fields.update(n_saved_vc=len(vc), n_saved_no_vc=len(no_vc))
    return fields
  except Exception:  # another torch version's metadata (or a field that does not apply): not cached
    return None


def _keeps_graph() -> bool:
  """Whether the running backward keeps its graph (retain_graph=True): its saved tensors must then stay."""
  keeps = getattr(torch._C._autograd, "_get_current_graph_task_keep_graph", None)
  return True if keeps is None else bool(keeps())


def make_callable(entry: DynamoEntry, load_graph):
  """The callable Dynamo gets for a DynamoEntry: runs the cached graphs with AOTAutograd's bookkeeping.
  `load_graph(graph_entry, kind)` makes a CompiledGraph."""
  fw = load_graph(entry.forward, "forward" if entry.training else "inference")
  mutated, n_out, unsafe_views = entry.mutated_inputs, entry.n_outputs, entry.unsafe_view_outputs
  n_mut = len(mutated)

  def apply_mutations(args, results):
    with torch.no_grad():
      for i, new in zip(mutated, results[:n_mut]): args[i].copy_(new)

  def user_outputs(results):
    outs = results[n_mut:n_mut + n_out]
    for i in unsafe_views: outs[i] = torch.ops.aten._unsafe_view(outs[i], outs[i].shape)
    return outs

  if not entry.training:
    def run_inference(*args):
      results = fw(list(args))
      if n_mut: apply_mutations(args, results)
      return user_outputs(results)
    return run_inference

  bw = load_graph(entry.backward, "backward")
  n_vc, n_no_vc = entry.n_saved_vc, entry.n_saved_no_vc
  differentiable = entry.outputs_requiring_grad

  class CachedCompiledFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, *args):
      results = fw(list(args))
      if n_mut: apply_mutations(args, results)
      outs = user_outputs(results)
      saved = results[n_mut + n_out:]
      ctx.save_for_backward(*(t.detach() if t._is_view() else t for t in saved[:n_vc]))
      ctx.saved_no_vc = [t.detach() if t._is_view() else t for t in saved[n_vc:n_vc + n_no_vc]]
      ctx.mark_non_differentiable(*(o for o, d in zip(outs, differentiable) if not d and isinstance(o, torch.Tensor)))
      return tuple(outs)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, *grads):
      args = [*ctx.saved_tensors, *ctx.saved_no_vc, *(g for g, d in zip(grads, differentiable) if d)]
      if not _keeps_graph():
        # the boxed graph frees each saved activation after its last reader, as eager's backward does, only where
        # nothing else still holds it: not the autograd node (as AOTAutograd's own backward does) nor this frame
        ctx.saved_no_vc = None
        ctx.maybe_clear_saved_tensors()
      return tuple(bw(args))

  def run_training(*args):
    return list(CachedCompiledFunction.apply(*args))
  return run_training
