"""FX graph -> tensor-level UOp graph, node by node.

`lower_graph(gm)` walks an ATen-level FX graph. Placeholders become BUFFER nodes seen through a
strided VIEW; each call_function node goes through the registry. A node with no lowering, whose
lowering raises, or whose result disagrees with `meta["val"]` (shape or dtype) becomes a FALLBACK
node: at run time torch runs the ATen op on realized inputs, between kernels. Tensor constants
(get_attr) of one element become CONSTs; larger ones are buffers filled by a constant step. The result,
`LoweredGraph`, says what each graph output is (a tensor node, an input, or a constant).
It raises `WholeGraphFallback` only for graphs it cannot represent at all (e.g. inputs on another device).
A complex tensor is held as its view_as_real (a real tensor with a trailing dim of 2); nodes that read or
produce one are lowered by the complex lowerings (lowering/complex.py, fft.py).
"""
from __future__ import annotations
from dataclasses import dataclass, field
import math
import operator
import torch
import torch.fx
from torch_uop.core.uop import UOp, Ops
from torch_uop.torch_dtypes import from_torch, UnsupportedDType, complex_part
from torch_uop.core.shapetracker import ShapeTracker
from torch_uop.lowering.registry import lowering_for, LoweringContext, on_graph_device
from torch_uop.lowering.scope import GraphScope, lowering_scope
from torch_uop.lowering.specialize import is_symbolic, to_size, SizeVars
from torch_uop.lowering.tensor import LT
from torch_uop import counters as _metrics, log

_log = log.get("fallback")


class WholeGraphFallback(Exception):
  """The graph cannot be represented in the IR; torch runs it as it is."""


@dataclass(eq=False)
class FallbackOp:
  """An ATen call to run at run time. `args`/`kwargs` hold `TensorRef(k)` where the k-th tensor input goes."""
  target: object
  args: tuple
  kwargs: dict
  n_outputs: int
  name: str
  # tensor inputs (TensorRef indices) and results that are complex: the executor hands the op
  # view_as_complex of the IR's real buffers and stores view_as_real of its results
  complex_inputs: frozenset = frozenset()
  complex_outputs: frozenset = frozenset()

  def __hash__(self): return id(self)

  # an ATen op pickles as its name (the graph cache); anything else (a lowering's host step) as itself, if it can
  def __getstate__(self):
    state = dict(self.__dict__)
    if isinstance(self.target, torch._ops.OpOverload):
      t = self.target
      state["target"] = ("aten_op", t.namespace, t._schema.name.split("::")[-1], t._overloadname)
    return state

  def __setstate__(self, state):
    if isinstance(state["target"], tuple) and state["target"][:1] == ("aten_op",):
      _, ns, name, overload = state["target"]
      state["target"] = getattr(getattr(getattr(torch.ops, ns), name), overload)
    self.__dict__.update(state)


@dataclass(frozen=True)
class TensorRef:
  index: int


@dataclass
class RuntimeCheck:
  """A data check eager makes at run time (an index in range, an assert): a kernel reduces the data to one scalar,
  the executor reads it once per call and, unless it equals `ok`, raises `error` (a builtin exception's name) with
  `message` formatted with value= the scalar."""
  error: str
  message: str
  ok: object = False

  def fail(self, value) -> None:
    import builtins
    raise getattr(builtins, self.error)(self.message.format(value=value))


@dataclass
class InputSpec:
  slot: int
  shape: tuple
  strides: tuple
  dtype: torch.dtype
  is_complex: bool = False  # shape/strides/dtype describe the input's view_as_real


@dataclass
class LoweredGraph:
  inputs: list                  # InputSpec per placeholder (None for non-tensor placeholders)
  outputs: list                 # per graph output: ('tensor', LT) | ('input', idx) | ('value', python value)
  buffer_slots: dict            # BUFFER node -> slot
  next_slot: int
  nodes_lowered: int = 0
  fallbacks: list = field(default_factory=list)  # op names
  # per graph output: the strides eager gives it (meta["val"]), or None. AOTAutograd bakes them into the
  # backward graph for saved tensors (an expand saved for backward has stride 0), so outputs must keep them.
  output_strides: list = field(default_factory=list)
  output_complex: list = field(default_factory=list)  # per graph output: True for a complex tensor (held as view_as_real)
  # per graph output: where its storage comes from in eager (storage_root), or None. Outputs may share memory with
  # each other or with an input only where eager's do: a clone is a copy even where the IR sees the same values.
  output_roots: list = field(default_factory=list)
  # input slot -> the storage offset the kernels were built for. Dynamo does not guard on an input's storage
  # offset, but an as_strided with an explicit offset addresses storage: another offset needs another graph.
  storage_offset_guards: dict = field(default_factory=dict)
  checks: list = field(default_factory=list)  # (scalar LT, RuntimeCheck) per run-time data check
  provenance: dict = field(default_factory=dict)  # tensor node -> name of the ATen op whose result it is (for profiles)
  fallback_reasons: dict = field(default_factory=dict)  # op name -> why its first node fell back


def storage_root(gm: torch.fx.GraphModule, node: torch.fx.Node) -> tuple:
  """Where `node`'s tensor keeps its elements in eager: followed back through the ops whose result shares their
  first argument's storage (view, permute, select, an element of unbind or split, ...). ("input", placeholder
  index), ("node", name), or ("node", name, index) for an element of an op with several new results."""
  while node.op == "call_function" and node.args and isinstance(node.args[0], torch.fx.Node):
    if node.target is operator.getitem:
      multi = node.args[0]
      if not (multi.op == "call_function" and _returns_alias(multi.target) and multi.args and isinstance(multi.args[0], torch.fx.Node)):
        return ("node", multi.name, node.args[1])
      node = multi.args[0]
    elif _returns_alias(node.target): node = node.args[0]
    else: break
  if node.op == "placeholder": return ("input", [n for n in gm.graph.nodes if n.op == "placeholder"].index(node))
  return ("node", node.name)


def _returns_alias(target) -> bool:
  """Whether an op's result shares its first argument's storage in eager: its schema says so, or it is
  _unsafe_view (a view whose schema hides it, for a base nothing else sees)."""
  if target is torch.ops.aten._unsafe_view.default: return True
  if not isinstance(target, torch._ops.OpOverload): return False
  return any(r.alias_info is not None and not r.alias_info.is_write for r in target._schema.returns)


def _map_args(x, fn):
  if isinstance(x, torch.fx.Node): return fn(x)
  if isinstance(x, (list, tuple)): return type(x)(_map_args(a, fn) for a in x)
  if isinstance(x, dict): return {k: _map_args(v, fn) for k, v in x.items()}
  return x


def ir_layout(val: torch.Tensor) -> tuple[tuple, tuple, object, bool]:
  """(shape, strides, IR dtype, is_complex) of the IR tensor holding `val`: a complex tensor is held as
  its view_as_real, a real tensor with a trailing dim of 2 (real, imag)."""
  shape, strides = tuple(to_size(s) for s in val.shape), tuple(to_size(s) for s in val.stride())
  part = complex_part(val.dtype)
  if part is None: return shape, strides, from_torch(val.dtype), False
  return shape + (2,), tuple(2 * s for s in strides) + (1,), from_torch(part), True


def _holds_complex(node: torch.fx.Node) -> bool:
  """Whether a node reads or produces a complex tensor: such nodes have their own lowerings (lowering/complex.py)."""
  vals = [n.meta.get("val") for n in node.all_input_nodes]
  out = node.meta.get("val")
  vals += list(out) if isinstance(out, (tuple, list)) else [out]
  return any(isinstance(v, torch.Tensor) and v.is_complex() for v in vals)


def _check_result(node: torch.fx.Node, out) -> None:
  """A lowering's result must match the node's meta val exactly in shape and dtype."""
  val = node.meta.get("val")
  outs = out if isinstance(out, (tuple, list)) else [out]
  vals = val if isinstance(val, (tuple, list)) else [val]
  if len(outs) != len(vals): raise TypeError(f"lowering returned {len(outs)} outputs, expected {len(vals)}")
  for o, v in zip(outs, vals):
    if v is None or o is None: continue
    if not isinstance(o, LT): raise TypeError(f"lowering returned {type(o)}")
    shape, _, dt, _ = ir_layout(v)
    if tuple(o.shape) != shape: raise TypeError(f"shape {o.shape} != eager {tuple(v.shape)}")
    if o.dtype != dt: raise TypeError(f"dtype {o.dtype} != eager {v.dtype}")


def lower_graph(gm: torch.fx.GraphModule, sizes: SizeVars | None = None,
                device: torch.device = torch.device("cpu"), vectors=None) -> LoweredGraph:
  """`sizes`: lower a graph with symbolic sizes as it is, its SymInts becoming core.sym.Syms (inside a
  core.sym.SizeContext, which records the guards the lowering's decisions need). `device`: where the graph's
  tensors live (the CPU, or the CUDA device of a graph for the CUDA target); inputs elsewhere make it fall back.
  `vectors`: the vector registers of the CPU it compiles for (core/opt.py VectorUnit; None off the CPU)."""
  with lowering_scope(GraphScope(torch.device(device), vectors, sizes)):
    try: return _lower_graph(gm)
    except UnsupportedDType as e:  # an input, or a value a fallback op would have to hold, has no IR dtype (e.g. complex)
      raise WholeGraphFallback(str(e)) from e


def _lower_graph(gm: torch.fx.GraphModule) -> LoweredGraph:
  env: dict = {}
  inputs, buffer_slots = [], {}
  slot = 0
  g = LoweredGraph(inputs, [], buffer_slots, 0)
  state = GraphState(buffer_slots, slot)
  for node in gm.graph.nodes:
    val = node.meta.get("val")
    if is_symbolic(val):
      # a graph with symbolic sizes is lowered symbolically or as a static copy (lowering/specialize.py)
      if SizeVars.active() is None: raise WholeGraphFallback(f"symbolic sizes at {node.name}")
      if isinstance(val, torch.SymBool): raise WholeGraphFallback(f"symbolic {type(val).__name__} at {node.name}")
      if isinstance(val, (torch.SymInt, torch.SymFloat)):  # a size, or arithmetic on sizes: its value as an expression
        env[node] = to_size(val)
        if node.op == "placeholder": inputs.append(None)
        continue
    if node.op == "placeholder":
      if isinstance(val, torch.Tensor):
        if not on_graph_device(val.device): raise WholeGraphFallback(f"input {node.name} is on {val.device}")
        shape, strides, dt, is_complex = ir_layout(val)  # UnsupportedDType: the whole graph falls back
        extent = 1 + sum((s - 1) * st for s, st in zip(shape, strides)) if all(s != 0 for s in shape) else 0
        buf = UOp(Ops.BUFFER, dt, (), (slot, max(extent, 1)))
        buffer_slots[buf] = slot
        lt = LT(buf).map_view(lambda st: ShapeTracker.from_strides(shape, strides))
        if lt.uop.op is not Ops.VIEW or lt.shape != shape: lt = LT(UOp(Ops.VIEW, dt, (buf,), ShapeTracker.from_strides(shape, strides)))
        env[node] = lt
        inputs.append(InputSpec(slot, shape, strides, complex_part(val.dtype) or val.dtype, is_complex))
        slot += 1
      else:
        raise WholeGraphFallback(f"non-tensor input {node.name}")
    elif node.op == "call_function":
      if node.target is operator.getitem:
        env[node] = env[node.args[0]][node.args[1]]
        continue
      fn = lowering_for(node.target, complex_values=_holds_complex(node))
      args = _map_args(node.args, lambda n: env[n])
      kwargs = _map_args(node.kwargs, lambda n: env[n])
      reason = "no lowering registered"
      if fn is not None:
        try:
          ctx = LoweringContext(node)
          ctx.graph, state.slot = state, slot
          n_checks = len(state.checks)
          try:
            out = fn(ctx, *args, **kwargs)
            _check_result(node, out)
          except Exception:
            del state.checks[n_checks:]  # the node falls back: ATen makes its checks
            raise
          finally: slot = state.slot
          env[node] = out
          g.nodes_lowered += 1
          _note_provenance(g.provenance, out, getattr(node.target, "_opname", None) or _op_name(node.target))
          continue
        except Exception as e:  # any failure of a lowering means: let torch run this node
          reason = f"{type(e).__name__}: {e}"
          _log.debug("lowering %s failed", node.name, exc_info=True)
      env[node], slot = _fallback_node(node, args, kwargs, buffer_slots, slot)
      g.fallbacks.append(_op_name(node.target))
      g.fallback_reasons.setdefault(_op_name(node.target), reason)
      _metrics.report_fallback(_op_name(node.target), reason)
    elif node.op == "get_attr":
      env[node], slot = _constant_node(gm, node, buffer_slots, slot)
    elif node.op == "output":
      for o in node.args[0]:
        val = o.meta.get("val") if isinstance(o, torch.fx.Node) else None
        g.output_strides.append(ir_layout(val)[1] if isinstance(val, torch.Tensor) else None)
        g.output_complex.append(isinstance(val, torch.Tensor) and val.is_complex())
        g.output_roots.append(storage_root(gm, o) if isinstance(val, torch.Tensor) else None)
        if isinstance(o, torch.fx.Node):
          v = env[o]
          if o.op == "placeholder": g.outputs.append(("input", [n for n in gm.graph.nodes if n.op == "placeholder"].index(o)))
          elif isinstance(v, LT): g.outputs.append(("tensor", v))
          else: g.outputs.append(("value", v))
        else: g.outputs.append(("value", o))
    else:
      raise WholeGraphFallback(f"FX node kind {node.op}")
  g.next_slot = slot
  g.storage_offset_guards = state.storage_offset_guards
  g.checks = state.checks
  return g


class _Constant:
  """The run-time step that provides a tensor constant of the graph (a fresh copy each call)."""
  __name__ = "constant"

  def __init__(self, t: torch.Tensor): self.t = t
  def __call__(self): return self.t.clone()


def _constant_node(gm, node, buffer_slots, slot):
  """A get_attr tensor: one element becomes a CONST; a larger one is a buffer a step fills at run time."""
  t = gm
  for part in node.target.split("."): t = getattr(t, part)
  if not isinstance(t, torch.Tensor): raise WholeGraphFallback(f"get_attr {node.target} is not a tensor")
  if not on_graph_device(t.device): raise WholeGraphFallback(f"constant {node.target} is on {t.device}")
  from torch._subclasses.fake_tensor import unset_fake_temporarily
  with unset_fake_temporarily():  # backends compile under a fake mode; this is a real tensor
    if t.is_complex(): t = torch.view_as_real(t.resolve_conj())
    dt = from_torch(t.dtype)
    shape = tuple(t.shape)
    if t.numel() == 1: return LT.full(shape, t.item(), dt), slot
    t = t.detach().contiguous()
  return _run_time_tensor(_Constant(t), "constant", shape, dt, buffer_slots, slot)


def _run_time_tensor(make, name: str, shape: tuple, dt, buffer_slots, slot):
  """A buffer that a step with no inputs fills at each call with `make()` (a contiguous tensor)."""
  fb = UOp(Ops.FALLBACK, dt, (), FallbackOp(make, (), {}, 1, name))
  buf = UOp(Ops.BUFFER, dt, (fb,), (slot, max(math.prod(shape), 1), 0))
  buffer_slots[buf] = slot
  return LT(UOp(Ops.VIEW, dt, (buf,), ShapeTracker.from_shape(shape))), slot + 1


class GraphState:
  """What the lowerings of one graph share: `shared` (e.g. its random seed), `run_time_tensor`, which adds a
  buffer filled at each call by a step with no inputs (`make()`, e.g. a seed drawn from torch), and `check`, which
  adds a data check eager makes at run time."""

  def __init__(self, buffer_slots: dict, slot: int):
    self.shared: dict = {}
    self.buffer_slots, self.slot = buffer_slots, slot
    self.storage_offset_guards: dict = {}
    self.checks: list = []

  def check(self, value: LT, check: RuntimeCheck) -> None:
    """Every call computes `value` (one element) and raises `check`'s error unless it equals `check.ok`."""
    entry = (value.reshape(()), check)
    if not any(v.uop is entry[0].uop and c == check for v, c in self.checks): self.checks.append(entry)

  def guard_storage_offset(self, input_slot: int, offset: int) -> None:
    """The graph is only right for calls whose input `input_slot` has this storage offset (the executor
    checks it, and runs the graph in torch otherwise)."""
    self.storage_offset_guards[input_slot] = offset

  def run_time_tensor(self, make, name: str, shape: tuple, dt) -> LT:
    lt, self.slot = _run_time_tensor(make, name, shape, dt, self.buffer_slots, self.slot)
    return lt

  def host_call(self, fn, args: list, outputs: list) -> list:
    """A lowering's own host step (LoweringContext.host_call): a FALLBACK node not counted as one."""
    op = FallbackOp(fn, tuple(TensorRef(i) for i in range(len(args))), {}, len(outputs), _op_name(fn))
    fb = UOp(Ops.FALLBACK, outputs[0][1], tuple(a.uop for a in args), op)
    results = []
    for k, (shape, dt) in enumerate(outputs):
      buf = UOp(Ops.BUFFER, dt, (fb,), (self.slot, max(math.prod(shape), 1), k))
      self.buffer_slots[buf] = self.slot
      self.slot += 1
      results.append(LT(UOp(Ops.VIEW, dt, (buf,), ShapeTracker.from_shape(tuple(shape)))))
    return results


def _op_name(target) -> str: return str(getattr(target, "__name__", target))


def _note_provenance(provenance: dict, out, name: str) -> None:
  """Remember which op each result node (and the node a result view is of) computes; the first op to claim wins."""
  for lt in out if isinstance(out, (tuple, list)) else [out]:
    if not isinstance(lt, LT): continue
    provenance.setdefault(lt.uop, name)
    if lt.uop.op is Ops.VIEW and lt.uop.src: provenance.setdefault(lt.uop.src[0], name)


def _fallback_node(node, args, kwargs, buffer_slots, slot):
  """Turn one node into a FALLBACK: its LT arguments are realized, its tensor outputs become buffers."""
  tensors: list[LT] = []
  complex_inputs = set()

  def to_ref(x, src):  # src: the same argument as FX nodes, to tell complex tensors apart
    if isinstance(x, LT):
      v = src.meta.get("val") if isinstance(src, torch.fx.Node) else None
      if isinstance(v, torch.Tensor) and v.is_complex(): complex_inputs.add(len(tensors))
      tensors.append(x)
      return TensorRef(len(tensors) - 1)
    if isinstance(x, (list, tuple)):
      return type(x)(to_ref(a, b) for a, b in zip(x, src if isinstance(src, (list, tuple)) else [None] * len(x)))
    return x

  ref_args, ref_kwargs = to_ref(args, node.args), {k: to_ref(v, node.kwargs[k]) for k, v in kwargs.items()}
  val = node.meta.get("val")
  vals = list(val) if isinstance(val, (tuple, list)) else [val]
  if any(v is not None and not isinstance(v, torch.Tensor) for v in vals):
    raise WholeGraphFallback(f"{node.name} returns non-tensors")
  layouts = [ir_layout(v) if v is not None else None for v in vals]
  op = FallbackOp(node.target, ref_args, ref_kwargs, len(vals), _op_name(node.target), frozenset(complex_inputs),
                  frozenset(k for k, lay in enumerate(layouts) if lay is not None and lay[3]))
  fb = UOp(Ops.FALLBACK, layouts[0][2] if layouts[0] is not None else from_torch(torch.float32),
           tuple(t.uop for t in tensors), op)
  outs = []
  for k, lay in enumerate(layouts):
    if lay is None: outs.append(None); continue
    shape, dt = lay[0], lay[2]
    buf = UOp(Ops.BUFFER, dt, (fb,), (slot, max(math.prod(shape), 1), k))
    buffer_slots[buf] = slot
    slot += 1
    outs.append(LT(UOp(Ops.VIEW, buf.dtype, (buf,), ShapeTracker.from_shape(shape))))
  return (tuple(outs) if isinstance(val, (tuple, list)) else outs[0]), slot
