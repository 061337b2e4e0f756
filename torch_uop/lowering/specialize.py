"""Graphs with symbolic sizes -> static graphs for the sizes of one call.

Under `torch.compile(dynamic=True)`, `torch._dynamo.mark_dynamic` or Dynamo's automatic dynamic shapes,
AOTAutograd hands the backend one graph whose sizes are SymInts: SymInt placeholders (the sizes
themselves, passed at each call), tensors with symbolic shapes, and integer arithmetic on sizes
(`operator.mul(s0, s1)`, `aten.sym_size`). Dynamo's guards make that graph valid for every size in
their range, so it is traced and handed over once.

`specialize` takes such a graph and the arguments of one call, and returns a copy in which every
size is that call's: shapes and strides re-propagated by PyTorch's own meta functions (a fresh,
static FakeTensorMode), size arithmetic folded into constants, SymInt placeholders removed. The
copy is an ordinary static graph for the rest of the pipeline. It must not change the original.
"""
from __future__ import annotations
import torch
from torch.fx.node import map_arg
from torch_uop.core.sym import Sym, SymF, sym_extreme, size_var, MAX_VAR, SizeContext
from torch_uop.core.uop import UOp, Ops
from torch_uop.core.dtypes import dtypes
from torch_uop.lowering.scope import graph_scope

_SYM = (torch.SymInt, torch.SymFloat, torch.SymBool)
_SCALAR = (int, float, bool)


def is_symbolic(v) -> bool:
  """Whether a meta value (or an example input) holds a symbolic size: a SymInt/SymFloat/SymBool, or a tensor
  whose shape, strides or storage offset are symbolic."""
  if isinstance(v, _SYM): return True
  if isinstance(v, torch.Tensor):
    return any(isinstance(s, torch.SymInt) for s in (*v.shape, *v.stride(), v.storage_offset()))
  if isinstance(v, (list, tuple)): return any(is_symbolic(x) for x in v)
  return False


def has_symbolic_sizes(gm: torch.fx.GraphModule) -> bool:
  return any(is_symbolic(n.meta.get("val")) for n in gm.graph.nodes if n.op == "placeholder")


def signature_positions(gm: torch.fx.GraphModule) -> tuple[list[int], list[int]]:
  """Which arguments decide a graph's sizes: the positions of its size (SymInt/SymFloat/SymBool) placeholders and
  of its tensors with symbolic sizes or strides. A tensor with static ones has them guarded by Dynamo (or made
  by the static copy of the graph before), and the compiled graph re-checks every layout anyway."""
  vals = [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]
  return ([i for i, v in enumerate(vals) if isinstance(v, _SYM)],
          [i for i, v in enumerate(vals) if isinstance(v, torch.Tensor) and is_symbolic(v)])


def call_signature(args, scalars: list[int], tensors: list[int]) -> tuple:
  """What a static copy is specialized on: the size arguments' values and the symbolic tensors' shapes and strides."""
  return tuple(args[i] for i in scalars) + tuple((args[i].shape, args[i].stride()) for i in tensors)


def specialize(gm: torch.fx.GraphModule, args: list) -> tuple[torch.fx.GraphModule, list[int]]:
  """A static copy of `gm` for the sizes of `args` (real tensors and ints), and the positions of the arguments
  the copy still takes (the scalar size arguments become constants)."""
  from torch._subclasses.fake_tensor import FakeTensorMode, unset_fake_temporarily
  from torch.fx.passes.fake_tensor_prop import FakeTensorProp
  graph = torch.fx.Graph()
  env: dict = {}
  out = graph.graph_copy(gm.graph, env)  # node metas are shallow copies: the original keeps its own "val"s
  graph.output(out)
  static = torch.fx.GraphModule(gm, graph)  # shares gm's parameters and constants
  with unset_fake_temporarily():
    mode = FakeTensorMode(allow_non_fake_inputs=True)  # no ShapeEnv: every size is a plain int
    fake_args = [mode.from_tensor(a, static_shapes=True) if isinstance(a, torch.Tensor) else a for a in args]
    FakeTensorProp(static, mode).propagate_dont_convert_inputs(*fake_args)
  placeholders = [n for n in static.graph.nodes if n.op == "placeholder"]
  kept = [i for i, n in enumerate(placeholders) if not isinstance(n.meta.get("val"), _SCALAR)]
  for node in list(static.graph.nodes):
    val = node.meta.get("val")
    if node.op not in ("placeholder", "call_function") or not isinstance(val, _SCALAR): continue
    # a size, or arithmetic on sizes: its users read the number instead
    for user in list(node.users):
      user.args = map_arg(user.args, lambda n: val if n is node else n)
      user.kwargs = map_arg(user.kwargs, lambda n: val if n is node else n)
    static.graph.erase_node(node)
  static.recompile()
  return static, kept


# ---------------------------------------------------------------- symbolic sizes

class SizeVars:
  """PyTorch's size symbols (the sympy Symbols of a graph's ShapeEnv) as the IR's size variables, and where a
  call's arguments hold each one's value. While a graph is lowered symbolically, `SizeVars.active()` (the
  lowering's GraphScope.sizes) converts every SymInt the lowering meets (`to_size`) into a core.sym.Sym."""

  @staticmethod
  def active() -> "SizeVars | None": return graph_scope().sizes

  def __init__(self, gm: torch.fx.GraphModule, pinned: dict | None = None):
    """`pinned`: symbol name -> the value the compile treats it as (a constant, under a guard)."""
    self.pinned = dict(pinned or {})
    self.vars: dict = {}     # symbol name -> DEFINE_VAR
    self.sources: dict = {}  # symbol name -> ("int", arg index) | ("size", arg index, dim) | ("stride", arg index, dim)
    self.shape_env = None
    placeholders = [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]
    for i, v in enumerate(placeholders):
      if isinstance(v, torch.SymInt): self._source(v, ("int", i))
      elif isinstance(v, torch.Tensor):
        for d, s in enumerate(v.shape): self._source(s, ("size", i, d))
        for d, s in enumerate(v.stride()): self._source(s, ("stride", i, d))

  def _source(self, s, where: tuple) -> None:
    import sympy
    if isinstance(s, torch.SymInt):
      self.shape_env = self.shape_env or s.node.shape_env
      if isinstance(s.node.expr, sympy.Symbol): self.sources.setdefault(str(s.node.expr), where)

  def torch_decisions(self) -> tuple:
    """A count of what PyTorch's ShapeEnv has decided: it grows when code turns a torch SymInt into an int (a
    specialization our guards would not see), which makes a symbolic compile unusable."""
    env = self.shape_env
    return (len(env.guards), len(env.replacements)) if env is not None else (0, 0)

  def values(self, args: list) -> dict:
    """Each variable's value in a call (by name)."""
    out = {}
    for name, where in self.sources.items():
      a = args[where[1]]
      out[name] = int(a) if where[0] == "int" else int(a.shape[where[2]] if where[0] == "size" else a.stride()[where[2]])
    return out

  def var(self, symbol, shape_env):
    """The DEFINE_VAR of a symbol; a pinned symbol is its value, guarded."""
    name = str(symbol)
    if name in self.pinned:
      SizeContext.current().decide(UOp(Ops.CMPEQ, dtypes.bool, (size_var(name), UOp.const(dtypes.index, self.pinned[name]))))
      return self.pinned[name]
    if name not in self.vars:
      if name not in self.sources: raise NotImplementedError(f"size {name} is not an input's size")
      lo, hi = 0, MAX_VAR
      vr = shape_env.var_to_range.get(symbol) if shape_env is not None else None
      if vr is not None:
        try: lo = int(vr.lower)
        except Exception: pass
        try: hi = min(int(vr.upper), MAX_VAR)
        except Exception: pass  # unbounded (int_oo)
      # the variable's largest value is assumed near this call's (up to 256x, at least 2**16): numeric bounds of
      # index math over several variables then stay inside int64, so div/mod rules can use them. A larger size
      # fails SymbolicGraph.accepts and gets a symbolic compile of its own.
      hint = SizeContext.current().hints.get(name, 0)
      hi = min(hi, max(1 << 16, 1 << (hint.bit_length() + 8)))
      self.vars[name] = size_var(name, lo, hi)
    return self.vars[name]

  def to_size(self, s):
    """An int, or a SymInt as a Sym (or an int, if its expression is a constant); a SymFloat as a SymF."""
    if not isinstance(s, (torch.SymInt, torch.SymFloat)): return int(s)
    return _from_sympy(s.node.expr, lambda sym: self.var(sym, s.node.shape_env))


def to_size(s):
  """A size from a meta value: an int; a SymInt becomes a core.sym.Sym while a graph is lowered symbolically."""
  if isinstance(s, (torch.SymInt, torch.SymFloat)) and (sizes := SizeVars.active()) is not None: return sizes.to_size(s)
  return int(s)


def _from_sympy(expr, var_of):
  import sympy
  from torch.utils._sympy import functions as F
  if expr.is_Integer: return int(expr)
  if expr.is_Float or expr.is_Rational: return float(expr)
  if expr.is_Symbol:
    v = var_of(expr)
    return Sym(v) if isinstance(v, UOp) else v
  a = [_from_sympy(x, var_of) for x in expr.args]
  if isinstance(expr, sympy.Add):
    out = a[0]
    for x in a[1:]: out = out + x
    return out
  if isinstance(expr, sympy.Mul):
    out = a[0]
    for x in a[1:]: out = out * x
    return out
  if isinstance(expr, (F.FloorDiv, F.CleanDiv)): return a[0] // a[1]
  if isinstance(expr, (F.FloatTrueDiv, F.IntTrueDiv)): return a[0] / a[1]
  if isinstance(expr, F.ToFloat): return SymF(SymF.lift(a[0])) if isinstance(a[0], Sym) else float(a[0])
  if isinstance(expr, (F.Mod, F.PythonMod)): return a[0] % a[1]
  if isinstance(expr, F.ModularIndexing): return (a[0] // a[1]) % a[2]
  if isinstance(expr, F.CeilDiv): return (a[0] + a[1] - 1) // a[1]
  if isinstance(expr, (sympy.Max, sympy.Min, F.Max, F.Min)):
    out = a[0]
    for x in a[1:]: out = sym_extreme(Ops.MAX if isinstance(expr, (sympy.Max, F.Max)) else Ops.MIN, out, x)
    return out
  if isinstance(expr, (sympy.Pow, F.PowByNatural)) and isinstance(a[1], int) and a[1] >= 0:
    out = 1
    for _ in range(a[1]): out = out * a[0]
    return out
  raise NotImplementedError(f"size expression {expr}")
