"""The door: the `"uop"` torch.compile backend.

Dynamo hands `uop_backend` an FX graph of torch calls. AOTAutograd traces it to ATen (forward,
backward, or inference), applying `decomposition_table()` to reach core ATen, and calls
`compile_fx_graph` on each resulting graph. That lowers the graph to UOps, schedules, compiles and
returns a `CompiledGraph` (boxed calling convention). A graph with symbolic sizes becomes a
`SizeSpecializedGraph`, which compiles a static copy per distinct set of call sizes. Nothing raises
for an unsupported op: nodes fall back to ATen; graphs the IR cannot hold (inputs on several devices, or on one
that is neither the CPU nor CUDA) run as they are. `graph_target` picks where a graph's kernels run
(runtime/devices.py): CUDA for CUDA tensors, else the `device` option (LLVM on the CPU, or OpenCL).
"""
from __future__ import annotations
import contextlib
import functools
import gc
import logging
import os
import sys
import time
import torch
from torch._dynamo.backends.common import aot_autograd
from torch._dynamo import register_backend
from torch._decomp import core_aten_decompositions, get_decompositions
from torch_uop.config import Config
from torch_uop import counters as _metrics, log
from torch_uop.lowering.specialize import call_signature
from torch_uop.core.spec import SpecError

aten = torch.ops.aten
_log = log.get("compile")
_freeze_log = log.get("freezing")

# decompositions beyond core ATen that give simpler graphs for the lowerings
_EXTRA_DECOMPS = [
  aten._log_softmax, aten._softmax_backward_data, aten._log_softmax_backward_data,
  aten.native_layer_norm, aten.native_layer_norm_backward, aten.native_batch_norm,
  aten._native_batch_norm_legit, aten._native_batch_norm_legit_functional, aten._native_batch_norm_legit_no_training,
  aten.native_batch_norm_backward, aten.gelu, aten.gelu_backward,
  aten.nll_loss_forward, aten.nll_loss_backward,
  aten._adaptive_avg_pool2d_backward, aten.avg_pool2d, aten.avg_pool2d_backward,
  aten.addmm, aten.mv, aten.dot, aten.tanh_backward, aten.sigmoid_backward, aten.threshold_backward,
  aten.silu, aten.silu_backward, aten.hardtanh, aten.leaky_relu, aten.elu, aten.log_sigmoid_forward,
  aten.mse_loss, aten.mse_loss_backward, aten._to_copy, aten.clamp_min, aten.clamp_max,
  # OpInfo coverage: ops whose decompositions reach lowered ops
  aten.addmv, aten.native_group_norm, aten.narrow_copy, aten.permute_copy, aten.unbind_copy, aten.as_strided_copy,
  aten._batch_norm_with_update_functional, aten.ldexp, aten.dist, aten.max_pool3d_with_indices, aten.bucketize,
  aten.grid_sampler_2d,
]

# Nearest resizes: torch registers their Python decomposition as their autograd kernel (py_impl), which AOTAutograd's
# tracing runs whatever the decomposition table says, and that decomposition's backward is an index_put with
# accumulate (for each input position, a scan of every output position). torch_uop lowers them and their backward.
_NEAREST_RESIZES = [(getattr(aten, f"{name}{nd}d"), nd) for name in ("upsample_nearest", "_upsample_nearest_exact")
                    for nd in (1, 2, 3)]


# ops torch_uop lowers whole: keep them out of the table even if core ATen decomposes them
_KEEP_WHOLE = {aten._softmax.default, aten.max_pool2d_with_indices.default, aten.max_pool2d_with_indices_backward.default,
               aten.embedding_dense_backward.default, aten.adaptive_max_pool2d.default, aten.adaptive_max_pool3d.default,
               aten._adaptive_avg_pool2d.default, aten._adaptive_avg_pool3d.default, aten.avg_pool3d.default, aten.embedding.default,
               aten._scaled_dot_product_flash_attention_for_cpu.default, aten.index_add.default, aten.index_copy.default,
               aten.index_fill.int_Scalar, aten.index_fill.int_Tensor, aten.bernoulli.default,
               aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
               *(op for packet, _ in _NEAREST_RESIZES for op in (packet.default, packet.vec))}


def _vec_via_default(default_op, nd: int):
  """A .vec overload's kernel that computes the output size as torch's decomposition does (symbolic sizes stay
  symbolic) and calls the .default overload, whose autograd formula gives the op's own backward."""
  from torch._decomp.decompositions import upsample_compute_output_size
  def kernel(input, output_size, scale_factors):
    size = upsample_compute_output_size(input.size(), output_size, scale_factors)
    return default_op(input, size, *(scale_factors if scale_factors else [None] * nd))
  return kernel


@contextlib.contextmanager
def _nearest_resizes_kept_whole():
  """While AOTAutograd traces, the nearest resizes reach the graph as themselves: the .default overloads dispatch to
  their C++ kernels (autograd formula included), the .vec ones to `_vec_via_default`. torch's own kernels are put
  back after, so other backends see torch's behaviour; with a torch whose internals differ, nothing changes."""
  from torch._C import DispatchKey
  import torch._decomp.decompositions as decomps
  if not hasattr(decomps, "upsample_compute_output_size"):  # a torch without the size helper: its own behaviour
    yield
    return
  keys = (DispatchKey.Autograd, DispatchKey.CompositeImplicitAutograd)
  saved = []
  try:
    for packet, nd in _NEAREST_RESIZES:
      for op, replacement in ((packet.default, None), (packet.vec, _vec_via_default(packet.default, nd))):
        kernels, cache = getattr(op, "py_kernels", None), getattr(op, "_dispatch_cache", None)
        if not isinstance(kernels, dict) or not isinstance(cache, dict): continue
        for key in keys:
          if key not in kernels: continue
          saved.append((op, key, kernels[key]))
          if replacement is None: del kernels[key]
          else: kernels[key] = replacement
        cache.clear()
    yield
  finally:
    for op, key, kernel in saved: op.py_kernels[key] = kernel
    for packet, _ in _NEAREST_RESIZES:
      for op in (packet.default, packet.vec): getattr(op, "_dispatch_cache", {}).clear()


@functools.cache
def decomposition_table() -> dict:
  table = dict(core_aten_decompositions())
  table.update(get_decompositions(_EXTRA_DECOMPS))
  for op in _KEEP_WHOLE: table.pop(op, None)
  return table


@contextlib.contextmanager
def _no_collections_while_compiling():
  """While torch_uop compiles, the cyclic garbage collector does not run on its own, and the heap from before (what
  Dynamo, FX and fake tensors built) is frozen (gc.freeze): a collection something asks for walks only the compile's
  objects. The compiler builds millions of small UOps, tuples and dicts, most freed by reference counting; with
  collections on, every few hundred allocations set one off, and as the objects of the compile pile up, each full
  collection walked all of them (UNet's training step: 22 full collections, 7 s of a 40 s first call; BERT's: 1.4 s
  of 7.6 s with the old heap frozen alone). Peak memory stays the same (measured: UNet, DeiT-tiny, EfficientNet-B0
  training). Left alone where something else has frozen objects or turned collections off, and inside another
  compile (AOTAutograd's trace around each graph's): there gc.get_freeze_count() would count the whole frozen heap,
  object by object (10-45 ms a graph; the OpInfo tests' thousands of small compiles spent 40% of their time on it)."""
  global _collections_held
  if _collections_held or not gc.isenabled() or gc.get_freeze_count():
    yield
    return
  gc.freeze()
  gc.disable()
  _collections_held = True
  try: yield
  finally:
    _collections_held = False
    gc.enable()
    gc.unfreeze()


_collections_held = False  # whether a compile on some thread has frozen the heap (_no_collections_while_compiling)


@_no_collections_while_compiling()
def compile_fx_graph(gm: torch.fx.GraphModule, example_inputs, config: Config, kind: str = "graph", recorder=None,
                     specialization: bool = False, constant_inputs: frozenset = frozenset()):
  """One ATen FX graph -> a boxed callable running torch_uop kernels (from the graph cache when it has them).
  `specialization`: gm is the static copy a SizeSpecializedGraph made for one call's sizes. `constant_inputs`:
  positions of inputs every call passes unchanged (a frozen graph's weights, CompiledGraph's prologue)."""
  from torch_uop.lowering.graph import lower_graph, WholeGraphFallback
  from torch_uop.lowering.specialize import has_symbolic_sizes
  from torch_uop.runtime.executor import CompiledGraph
  from torch_uop.pipeline import parse_debug_after
  from torch_uop.runtime import graph_cache
  import torch_uop.lowering  # noqa: F401  fills the registry
  st = _metrics.state()
  t0 = time.perf_counter()
  if not specialization and not config.fallback_whole_graph and has_symbolic_sizes(gm):
    st["graphs_compiled"] += 1
    if recorder is not None: recorder.graph(kind, gm, None)  # the Dynamo-level cache holds static graphs only
    return SizeSpecializedGraph(gm, config, kind)
  target = graph_target(gm, config)
  cache_kind = f"{kind}|constants={sorted(constant_inputs)}" if constant_inputs else kind
  key = graph_cache.aten_key(gm, example_inputs, config, cache_kind) if _graph_cache_on(config) and target.kind == "cpu" else None
  entry = graph_cache.load(key)
  if isinstance(entry, graph_cache.GraphEntry):
    try:
      compiled = _graph_from_entry(entry, config, kind, t0, specialization)
      if recorder is not None: recorder.graph(kind, gm, entry)
      return compiled
    except Exception as e:  # e.g. an object another LLVM cannot load: compile instead
      _log.warning("a graph cache entry is unusable (%s: %s); compiling the graph", type(e).__name__, e)
  st["size_specializations" if specialization else "graphs_compiled"] += 1
  try:
    if config.fallback_whole_graph: raise WholeGraphFallback("option fallback_whole_graph")
    target.check_available()
    lowered = lower_graph(gm, device=target.torch_device, vectors=target.vector_unit())
  except (WholeGraphFallback, RuntimeError) as e:  # RuntimeError: no CUDA compiler or driver for a CUDA graph
    if recorder is not None: recorder.graph(kind, gm, None)
    return _whole_graph_fallback(gm, str(e), config)
  st["compile_time_s"]["lowering"] += time.perf_counter() - t0
  st["nodes_lowered"] += lowered.nodes_lowered
  for op in lowered.fallbacks: st["nodes_fallen_back"][op] += 1
  try:
    name = _graph_name(kind, specialization)
    compiled = CompiledGraph(lowered, debug=config.debug, opt_level=config.opt_level, name=name,
                             beam=config.beam, target=target, constant_inputs=constant_inputs,
                             debug_after=parse_debug_after(config.debug_after), spec=config.spec)
  except SpecError: raise  # asked for (option `spec`): a compiler bug shown, not hidden behind a fallback
  except Exception as e:  # a scheduling or compile bug must never break the user's program
    _log.debug("compiling %s failed", name, exc_info=True)
    if recorder is not None: recorder.graph(kind, gm, None)
    return _whole_graph_fallback(gm, f"compilation failed: {type(e).__name__}: {e}", config)
  compiled.keep_arena = config.keep_arena
  if compiled.storage_offset_guards:
    from torch._functorch.aot_autograd import make_boxed_func
    compiled.eager = make_boxed_func(gm.forward)
  entry = graph_cache.GraphEntry(compiled.plan, lowered.nodes_lowered, list(lowered.fallbacks), dict(lowered.fallback_reasons)) \
      if compiled.cacheable else None
  if entry is not None and key is not None and not graph_cache.store(key, entry): entry = None
  if recorder is not None: recorder.graph(kind, gm, entry)
  st["compile_time_s"]["total"] += time.perf_counter() - t0
  _log.info("compiled %s graph %s: %d nodes lowered, %d fell back, %d kernels in %.3fs", kind, name, lowered.nodes_lowered,
            len(lowered.fallbacks), compiled.n_kernels, time.perf_counter() - t0)
  return compiled


def _graph_name(kind: str, specialization: bool, ahead: int = 0) -> str:
  """The name of the graph just counted in the metrics (kernels and profiler steps carry it), or with `ahead=1` of the
  one about to be: forward3, or inference2_s4 for a static copy of a graph with symbolic sizes."""
  st = _metrics.state()
  if specialization: return f"{kind}{st['graphs_compiled']}_s{st['size_specializations'] + ahead}"
  return f"{kind}{st['graphs_compiled'] + ahead}"


def graph_target(gm: torch.fx.GraphModule, config: Config):
  """Where a graph's kernels run (runtime/devices.py): a graph whose tensor inputs are on a CUDA device runs there
  (CUDA C); otherwise on the configured device for CPU tensors ("cpu": LLVM, "opencl": OpenCL C)."""
  from torch_uop.runtime.devices import Target
  for node in gm.graph.nodes:
    val = node.meta.get("val") if node.op == "placeholder" else None
    if isinstance(val, torch.Tensor) and val.device.type == "cuda":
      return Target("cuda", val.device.index if val.device.index is not None else torch.cuda.current_device())
  return Target(config.device)


def _graph_cache_on(config: Config) -> bool:
  """The graph cache serves graphs unless it is off, the disk cache is off, or someone inspects kernels (debug >= 2,
  debug_after, spec, torch_uop.debug.capture): a cached graph has no kernel ASTs or sources, and runs no pipeline pass."""
  from torch_uop.runtime import cache, executor
  return config.graph_cache and cache.cache_dir() is not None and config.debug < 2 and not executor._observers \
      and not config.fallback_whole_graph and not config.debug_after and not config.spec


def _graph_from_entry(entry, config: Config, kind: str, t0: float, specialization: bool = False):
  """A CompiledGraph from a graph cache entry, counted in the metrics as its first compile was."""
  from torch_uop.runtime.executor import CompiledGraph
  st = _metrics.state()
  # (counted only once it loads: an entry that does not load is compiled, and counted, by the caller)
  compiled = CompiledGraph.from_plan(entry.plan, debug=config.debug, name=_graph_name(kind, specialization, ahead=1))
  compiled.keep_arena = config.keep_arena
  st["size_specializations" if specialization else "graphs_compiled"] += 1
  st["graph_cache_hits"] += 1
  st["nodes_lowered"] += entry.nodes_lowered
  for op in entry.fallbacks:
    st["nodes_fallen_back"][op] += 1
    _metrics.report_fallback(op, getattr(entry, "fallback_reasons", {}).get(op, "(its reason was not cached)"))
  st["kernels_compiled"] += compiled.n_kernels
  st["compile_time_s"]["graph_cache"] += time.perf_counter() - t0
  st["compile_time_s"]["total"] += time.perf_counter() - t0
  _log.info("%s graph from the graph cache: %d kernels in %.3fs", kind, compiled.n_kernels, time.perf_counter() - t0)
  return compiled


class SymbolicGraph:
  """A graph compiled once with size variables (CompiledGraph template), the guards its compile recorded, and
  where a call's arguments hold each variable's value (SizeVars)."""

  def __init__(self, compiled, sizes, guards: list, pinned: set):
    self.compiled, self.sizes, self.guards, self.pinned = compiled, sizes, guards, pinned

  def in_ranges(self, values: dict) -> bool:
    return all(v.arg[1] <= values[name] <= v.arg[2] for name, v in self.sizes.vars.items())

  def above_minimum(self, values: dict) -> bool:
    """Whether each size is at least its variable's smallest value (PyTorch's range, e.g. >= 2)."""
    return all(v.arg[1] <= values[name] for name, v in self.sizes.vars.items())

  def accepts(self, values: dict) -> bool:
    from torch_uop.core.sym import guards_hold
    return self.in_ranges(values) and guards_hold(self.guards, values)


def compile_symbolic_graph(gm: torch.fx.GraphModule, args: list, config: Config, kind: str,
                           pinned: dict | None = None) -> SymbolicGraph:
  """Lower and compile a graph with symbolic sizes as it is: its kernels take the size variables' values at run
  time. The sizes of `args` are the hints for the decisions that need a value (each recorded as a guard);
  `pinned` sizes (name -> value) are constants under a guard. Raises whatever the symbolic path cannot hold (the
  caller compiles static copies instead)."""
  from torch_uop.lowering.graph import lower_graph
  from torch_uop.lowering.specialize import SizeVars
  from torch_uop.runtime.executor import CompiledGraph
  from torch_uop.pipeline import parse_debug_after
  from torch_uop.core.sym import SizeContext
  import torch_uop.lowering  # noqa: F401  fills the registry
  st = _metrics.state()
  t0 = time.perf_counter()
  sizes = SizeVars(gm, pinned)
  decided = sizes.torch_decisions()
  target = graph_target(gm, config)
  with SizeContext(sizes.values(args)) as ctx:
    lowered = lower_graph(gm, sizes, device=target.torch_device, vectors=target.vector_unit())
    st["compile_time_s"]["lowering"] += time.perf_counter() - t0
    name = f"{kind}{st['graphs_compiled']}_sym{st['symbolic_graphs']}"
    compiled = CompiledGraph(lowered, debug=config.debug, opt_level=config.opt_level, name=name,
                             size_vars=list(sizes.vars.values()), target=target,
                             debug_after=parse_debug_after(config.debug_after), spec=config.spec)
  if compiled.storage_offset_guards: raise NotImplementedError("storage offset guards")
  compiled.keep_arena = config.keep_arena
  if sizes.torch_decisions() != decided: raise NotImplementedError("a lowering turned a torch SymInt into an int")
  st["symbolic_graphs"] += 1
  st["nodes_lowered"] += lowered.nodes_lowered
  for op in lowered.fallbacks: st["nodes_fallen_back"][op] += 1
  st["compile_time_s"]["total"] += time.perf_counter() - t0
  return SymbolicGraph(compiled, sizes, ctx.guards, ctx.pinned)


class SizeSpecializedGraph:
  """The callable for a graph with symbolic sizes (dynamic=True, mark_dynamic, automatic dynamic shapes).
  Dynamo and AOTAutograd trace it once; at each call this looks up the sizes and strides of the arguments
  (the signature) and runs what it made for them the first time it saw them: an instance of the graph compiled
  once with size variables (compile_symbolic_graph; another symbolic compile when the sizes fail the first
  one's guards), or, where the symbolic path cannot hold the graph or symbolic_shapes is off, a static copy
  for those sizes (lowering/specialize.py, counted in metrics()["size_specializations"]). A static copy that
  cannot be made runs the symbolic graph in torch for that signature, counted in graphs_fallen_back."""

  MAX_SPECIALIZATIONS = 64  # beyond this many signatures, the oldest compiled one is dropped
  MAX_SYMBOLIC = 4  # symbolic compiles of one graph (each for sizes the earlier ones' guards refuse)

  def __init__(self, gm: torch.fx.GraphModule, config: Config, kind: str):
    from torch_uop.lowering.specialize import signature_positions, SizeVars
    self.gm, self.config, self.kind = gm, config, kind
    self.compiled: dict = {}  # call signature -> (callable, positions of the arguments it takes)
    self.symbolic: list = []  # SymbolicGraph, the first that accepts a call's sizes serves it
    self.symbolic_failures = 0
    self.sources = SizeVars(gm)  # where each size variable's value is in a call's arguments
    self.first_values, self.refined = None, False
    self._boxed_call = True  # AOTAutograd passes one list of arguments
    self.positions = signature_positions(gm)

  def __call__(self, *args):
    args = args[0] if len(args) == 1 and type(args[0]) is list else list(args)
    signature = call_signature(args, *self.positions)
    entry = self.compiled.get(signature)
    if entry is None: entry = self._for_signature(args, signature)
    fn, kept = entry
    call_args = [args[i] for i in kept] if kept is not None else list(args)
    args.clear()  # boxed convention: the caller's references to the inputs go
    return fn(call_args)

  def _for_signature(self, args: list, signature: tuple):
    """The callable for a new signature: an instance of a symbolic graph whose guards its sizes pass (compiling
    one if none does, up to MAX_SYMBOLIC), else a static copy."""
    if self.config.symbolic_shapes and not self._outside_ranges(args):
      values = self.sources.values(args)
      if self.first_values is None: self.first_values = values
      elif not self.refined and self.symbolic and values != self.first_values:
        # the second sizes seen: the sizes that stayed (an image's height, a hidden size) are pinned in a second,
        # faster compile that serves every call where they stay; the first graph serves the others
        self.refined = True
        steady = {n: v for n, v in values.items() if self.first_values[n] == v}
        if steady and (graph := self._compile_symbolic(args, steady)) is not None:
          self.symbolic.insert(0, graph)
          self.compiled.clear()  # sizes seen before go to the graph that serves them best (an instance is cheap)
      for graph in self.symbolic:
        if graph.accepts(values): return self._remember(signature, (graph.compiled.instance(values), None))
      if self.symbolic_failures == 0 and len(self.symbolic) < self.MAX_SYMBOLIC:
        graph = self._compile_symbolic(args)
        if graph is not None:
          self.symbolic.append(graph)
          return self._remember(signature, (graph.compiled.instance(values), None))
    return self._specialize(args, signature)

  def _outside_ranges(self, args: list) -> bool:
    """Whether a size lies below the range its variable has (e.g. a 1 where Dynamo's ShapeEnv assumes >= 2): no
    symbolic compile can serve it."""
    return bool(self.symbolic) and not self.symbolic[-1].above_minimum(self.symbolic[-1].sizes.values(args))

  def _remember(self, signature: tuple, entry):
    if len(self.compiled) >= self.MAX_SPECIALIZATIONS: self.compiled.pop(next(iter(self.compiled)))
    self.compiled[signature] = entry
    return entry

  def _compile_symbolic(self, args: list, pinned: dict | None = None):
    t0 = time.perf_counter()
    try:
      graph = compile_symbolic_graph(self.gm, args, self.config, self.kind, pinned)
    except Exception as e:  # anything the symbolic path cannot hold: static copies instead
      self.symbolic_failures += 1
      _log.info("no symbolic %s graph (%s: %s); compiling per size", self.kind, type(e).__name__, e,
                exc_info=_log.isEnabledFor(logging.DEBUG))
      return None
    _log.info("symbolic %s graph compiled in %.3fs: variables %s, %d guards, specialized on %s", self.kind,
              time.perf_counter() - t0, sorted(graph.sizes.vars), len(graph.guards), sorted(graph.pinned) or "none")
    return graph

  def _specialize(self, args: list, signature: tuple):
    from torch_uop.lowering.specialize import specialize
    t0 = time.perf_counter()
    try:
      static, kept = specialize(self.gm, args)
      entry = compile_fx_graph(static, [args[i] for i in kept], self.config, self.kind, specialization=True), kept
    except Exception as e:  # e.g. a size torch's meta functions cannot propagate: this signature runs in torch
      _log.info("no static %s graph for %s: %s: %s", self.kind, signature, type(e).__name__, e)
      entry = _whole_graph_fallback(self.gm, f"sizes not specializable: {type(e).__name__}", self.config), None
    self._remember(signature, entry)
    _log.info("%s graph specialized for sizes %s in %.3fs", self.kind,
              [tuple(s[0]) if isinstance(s, tuple) else s for s in signature], time.perf_counter() - t0)
    return entry


class _DynamoRecorder:
  """Collects what AOTAutograd compiles for one Dynamo graph; stores a DynamoEntry once it is complete and simple."""

  def __init__(self, key: str, n_inputs: int):
    self.key, self.n_inputs = key, n_inputs
    self.fields, self.graphs, self.failed = None, {}, False

  def graph(self, kind: str, gm, entry) -> None:
    try:
      self._graph(kind, gm, entry)
    except Exception:  # bookkeeping for a cache must never break a compile
      self.failed = True

  def _graph(self, kind: str, gm, entry) -> None:
    from torch_uop.runtime import graph_cache
    if self.failed: return
    n_placeholders = sum(1 for n in gm.graph.nodes if n.op == "placeholder")
    if entry is None: self.failed = True; return
    if kind in ("forward", "inference"):
      from torch._guards import TracingContext
      ctx = TracingContext.try_get()
      meta = getattr(ctx, "fw_metadata", None) if ctx is not None else None
      n_outputs = len(next(n for n in gm.graph.nodes if n.op == "output").args[0])
      self.fields = graph_cache.simple_bookkeeping(meta, kind == "forward", n_outputs) if meta is not None else None
      if self.fields is None or n_placeholders != self.n_inputs: self.failed = True; return
    elif self.fields is None or n_placeholders != self.fields["n_saved_vc"] + self.fields["n_saved_no_vc"] + \
        sum(self.fields["outputs_requiring_grad"]):
      self.failed = True; return
    self.graphs[kind] = entry
    if "inference" in self.graphs:
      graph_cache.store(self.key, graph_cache.DynamoEntry(False, self.graphs["inference"], **self.fields))
    elif "forward" in self.graphs and "backward" in self.graphs:
      graph_cache.store(self.key, graph_cache.DynamoEntry(True, self.graphs["forward"], self.graphs["backward"], **self.fields))


def _whole_graph_fallback(gm, reason: str, config: Config):
  st = _metrics.state()
  st["graphs_fallen_back"] += 1
  for node in gm.graph.nodes:
    if node.op == "call_function": st["nodes_fallen_back"][str(getattr(node.target, "__name__", node.target))] += 1
  _metrics.report_fallback("a whole graph", reason, key=f"graph: {reason}")
  from torch._functorch.aot_autograd import make_boxed_func
  return make_boxed_func(gm.forward)


def compile_frozen_graph(gm: torch.fx.GraphModule, example_inputs, config: Config, params: dict, kind: str = "inference"):
  """An inference graph with the module's weights frozen (option `freezing`, lowering/freezing.py): `params` maps
  input positions to the real parameters and buffers Dynamo passes there. Those the graph mutates or returns views of
  stay inputs. Falls back to compile_fx_graph when the graph is not one freezing understands or nothing folds."""
  from torch._guards import TracingContext, detect_fake_mode
  from torch_uop.lowering.freezing import freeze
  from torch_uop.lowering.specialize import has_symbolic_sizes
  # (symbolic sizes: the weights' folds would need the sizes' guards; such a graph compiles as it is)
  if has_symbolic_sizes(gm): return compile_fx_graph(gm, example_inputs, config, kind)
  ctx = TracingContext.try_get()
  meta = getattr(ctx, "fw_metadata", None) if ctx is not None else None
  n_inputs = sum(1 for n in gm.graph.nodes if n.op == "placeholder")
  fake_mode = detect_fake_mode(example_inputs)
  if not params and getattr(ctx, "params_flat", None):  # Inductor's freezing flag: Dynamo made the weights attributes,
    params = {i: t for i, t in enumerate(ctx.params_flat) if isinstance(t, torch.Tensor)}  # AOTAutograd passes them first
  frozen = None
  if meta is not None and fake_mode is not None and n_inputs == len(meta.input_info) and params:
    aliased = {o.base_idx for o in meta.output_info if o.base_idx is not None}
    vals = [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]
    params = {i: t for i, t in params.items() if i < n_inputs and i not in aliased and _same_layout(t, vals[i]) and
              not meta.input_info[i].mutates_data and not meta.input_info[i].mutates_metadata}
    try:
      frozen = freeze(gm, params, fake_mode) if params else None
      args = [params.get(i) for i in range(n_inputs)]
      constants = frozen.constants(args) if frozen is not None else None
    except Exception as e:  # freezing is an optimization: a graph it cannot handle compiles as it is
      _freeze_log.info("not freezing %s graph (%s: %s)", kind, type(e).__name__, e, exc_info=_freeze_log.isEnabledFor(logging.DEBUG))
      frozen = None
  if frozen is None: return compile_fx_graph(gm, example_inputs, config, kind)
  inputs = [n.meta["val"] for n in frozen.gm.graph.nodes if n.op == "placeholder"]
  compiled = compile_fx_graph(frozen.gm, inputs, config, kind, constant_inputs=frozen.constant_inputs)
  _freeze_log.info("%s graph frozen: %d weights, %d folded constants", kind, len(frozen.param_positions),
                   len(inputs) - len(frozen.kept))
  return FrozenGraph(compiled, frozen, args, constants)


class FrozenGraph:
  """The callable of a frozen graph: passes its folded constants, then the inputs the frozen graph reads. Guarded:
  when a frozen weight is another tensor now, or was changed in place (its version counter or its storage), the
  weights are folded again before the call and the graph's prologue runs again. (An in-place op on `p.data` bumps
  no counter of `p`: that one change goes unseen.)"""

  def __init__(self, compiled, frozen, args: list, constants: list):
    self.compiled, self.frozen = compiled, frozen
    self._boxed_call = True
    self._fold(args, constants)

  def _fold(self, args: list, constants: list | None = None) -> None:
    self.constants = constants if constants is not None else self.frozen.constants(args)
    self.guards = [(i, args[i], _version(args[i]), args[i].data_ptr()) for i in self.frozen.param_positions]

  def __call__(self, *args):
    args = args[0] if len(args) == 1 and type(args[0]) is list else list(args)
    for i, t, version, ptr in self.guards:
      a = args[i]
      if a is not t or (version is not None and a._version != version) or a.data_ptr() != ptr:
        self._refold(args)
        break
    call = [*self.constants, *(args[k] for k in self.frozen.kept)]
    args.clear()
    return self.compiled(call)

  def _refold(self, args: list) -> None:
    log.warn_once("freezing", "refold", "the weights of a frozen graph changed after it was compiled: torch_uop folds "
                  "them again at the call that sees them (freezing is for weights that stay as they are)")
    _metrics.state()["frozen_refolds"] += 1
    self._fold(args)
    if hasattr(self.compiled, "refresh_constants"): self.compiled.refresh_constants()


def _same_layout(t: torch.Tensor, val) -> bool:
  """Whether a weight is what the graph's placeholder expects (shape, dtype, strides)."""
  return isinstance(val, torch.Tensor) and t.shape == val.shape and t.dtype == val.dtype and t.stride() == val.stride()


def _inductor_freezing() -> bool:
  """torch._inductor.config.freezing, if a user set it (read only when Inductor's config is already imported)."""
  cfg = sys.modules.get("torch._inductor.config")
  return bool(getattr(cfg, "freezing", False))


def _version(t: torch.Tensor):
  """A tensor's version counter, or None for an inference tensor (which has none)."""
  try: return t._version
  except RuntimeError: return None


def uop_backend(gm: torch.fx.GraphModule, example_inputs, options: dict | None = None, mode: str | None = None, **kwargs):
  """The torch.compile backend: `torch.compile(model, backend="uop", options={...})` or `mode=...` (config.MODES)."""
  from torch_uop.runtime import graph_cache
  config = Config.from_options({**(options or {}), **kwargs}, mode)
  if "freezing" not in {**(options or {}), **kwargs} and "TORCH_UOP_FREEZING" not in os.environ:
    config.freezing = _inductor_freezing()  # a user who turned on Inductor's freezing gets torch_uop's
  log.show_debug_output(max(config.debug, 1 if config.debug_after else 0))
  t0 = time.perf_counter()
  # (a frozen graph's callable is made at each compile: the Dynamo-level cache, which skips AOTAutograd, is off)
  key = graph_cache.dynamo_key(gm, example_inputs, config) if _graph_cache_on(config) and not config.freezing else None
  entry = graph_cache.load(key)
  if isinstance(entry, graph_cache.DynamoEntry):
    try:
      fn = graph_cache.make_callable(entry, lambda g, kind: _graph_from_entry(g, config, kind, time.perf_counter()))
      _metrics.state()["compile_time_s"]["dynamo_graph_cache"] += time.perf_counter() - t0
      return fn
    except Exception as e:
      _log.warning("a graph cache entry is unusable (%s: %s); compiling the graph", type(e).__name__, e)
  recorder = _DynamoRecorder(key, len(example_inputs)) if key is not None else None
  fw = functools.partial(compile_fx_graph, config=config, kind="forward", recorder=recorder)
  bw = functools.partial(compile_fx_graph, config=config, kind="backward", recorder=recorder)
  inf = functools.partial(compile_fx_graph, config=config, kind="inference", recorder=recorder)
  if config.freezing:  # Dynamo marks the module's parameters and buffers it passes as inputs as static
    params = {i: t for i, t in enumerate(example_inputs) if isinstance(t, torch.Tensor) and not isinstance(t, torch._subclasses.FakeTensor)
              and getattr(t, "_dynamo_static_input_type", None) is not None}
    inf = functools.partial(compile_frozen_graph, config=config, params=params)
  with _no_collections_while_compiling(), _nearest_resizes_kept_whole():
    return aot_autograd(fw_compiler=fw, bw_compiler=bw, inference_compiler=inf, decompositions=decomposition_table(),
                        **_partitioner(config))(gm, example_inputs)


def _partitioner(config: Config) -> dict:
  """How AOTAutograd splits a training graph into forward and backward. With `recompute` (the default), Inductor's
  min-cut partitioner: the forward saves the fewest bytes it can and the backward recomputes cheap pointwise ops from
  them (a BatchNorm's output and its SiLU from the convolution's output), which the scheduler fuses into the backward
  kernels that read them. Without it, AOTAutograd's default: the forward saves every tensor the backward reads."""
  if not config.recompute: return {}
  from torch._functorch.partitioners import min_cut_rematerialization_partition
  return {"partition_fn": min_cut_rematerialization_partition}


def reset() -> None:
  """Drop torch_uop's in-memory state that outlives compiled graphs: the simplifier's memo of index expressions
  and the memo of contiguous views. torch._dynamo.reset() and torch.compiler.reset() call it (Dynamo resets the
  backends it used); the compiled graphs, their plans and JIT code go with Dynamo's caches."""
  from torch_uop.core import symbolic
  from torch_uop.core.shapetracker import View
  symbolic._memo.clear()
  View.contiguous.cache_clear()


uop_backend.reset = reset


def _register() -> None:
  """Register "uop" with Dynamo, once. When torch finds the `torch_dynamo_backends` entry point first,
  its `lookup_backend` imports this module and then registers `uop_backend` itself; registering here
  too would raise "duplicate name", so a discovered, not yet loaded entry point is left to torch."""
  from importlib.metadata import EntryPoint
  from torch._dynamo.backends import registry
  if "uop" in getattr(registry, "_COMPILER_FNS", {}): return
  if isinstance(getattr(registry, "_BACKENDS", {}).get("uop"), EntryPoint): return
  register_backend(name="uop")(uop_backend)


_register()
