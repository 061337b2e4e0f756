"""The UOp IR: `Ops`, immutable hash-consed `UOp` nodes, and the one rewrite engine.

A UOp is `(op, dtype, src, arg)`. Two UOps built from equal parts are the same Python object, so
graphs share structure and identity comparison is equality. The same node type serves three levels:
the tensor graph built by lowering (BUFFER, VIEW, REDUCE_AXIS, ...), the kernel graph built by
codegen (DEFINE_GLOBAL, RANGE, LOAD, STORE, REDUCE, ...) and the linear program the renderers read.

`UPat` describes a shape of graph, `PatternMatcher` maps patterns to rewrite functions, and
`graph_rewrite` applies a matcher bottom-up until nothing changes. The index-math simplifier (core/symbolic.py)
and the math-function rewrites (core/transcendental.py) are written with these; building a kernel
(core/codegen.py), linearizing it and rendering it walk the graph in code of their own, and `substitute` replaces
given nodes. Nothing here knows about torch.
"""
from __future__ import annotations
import enum
import math
import struct
import functools
import weakref
from typing import Any, Callable, Iterable, NamedTuple
from torch_uop.core.dtypes import DType, dtypes, cast_python_value


class Ops(enum.Enum):
  __hash__ = object.__hash__  # members are singletons: identity hashing, in C (Enum's own hashes the name in Python)
  # tensor level
  BUFFER = enum.auto()        # a flat buffer; arg=(slot, numel), or (slot, numel, result index) for an output of src[0], a FALLBACK
  VIEW = enum.auto()          # movement op; arg=ShapeTracker mapping its shape onto src's flat index
  REDUCE_AXIS = enum.auto()   # arg=(reduce op, axes)
  GATHER = enum.auto()        # data-dependent read; src=(x, *index tensors), arg=per-x-dim source (see LT.gather_nd)
  IOTA = enum.auto()          # 1-d tensor whose value is its index; arg=length
  CONTIGUOUS = enum.auto()    # force the source to be realized into its own buffer; arg=STAGED: not realized, but
                              # copied slab by slab into a kernel-local array by the kernel that reads it (codegen)
  # per-element loop with loop-carried state (LT.loop): LOOP_VAR is a placeholder for the state (arg=TensorLoopVar);
  # LOOP src=(count, keep_going, *init, *next), arg=(tag, i): state i after the loop. At kernel level LOOP
  # src=(counter RANGE, keep_going, *init, *next), arg=(loop id, i), and LOOP_VAR arg=KernelLoopVar.
  LOOP = enum.auto()
  LOOP_VAR = enum.auto()
  # kernel level
  DEFINE_GLOBAL = enum.auto()  # kernel argument pointer; arg=slot
  DEFINE_LOCAL = enum.auto()   # scratch array private to one kernel call (CPU: on its stack); arg=(id, elements)
  AFTER = enum.auto()          # src=(DEFINE_LOCAL, *u): that array, read only once every u is computed (an ordering edge)
  RANGE = enum.auto()          # loop variable; src=(size,), arg=RangeArg(axis, AxisKind, group)
  LOAD = enum.auto()           # src=(buffer, index[, valid])
  STORE = enum.auto()          # src=(buffer, index, value)
  REDUCE = enum.auto()         # src=(value, *ranges), arg=reduce op
  SINK = enum.auto()           # groups stores
  FALLBACK = enum.auto()       # an ATen op run by torch between kernels; arg=FallbackOp, src=its tensor inputs
  # linear program only
  DEFINE_ACC = enum.auto()     # accumulator of a REDUCE, src=(reduce,); or loop state, src=(LOOP_VAR, initial value)
  ASSIGN = enum.auto()         # acc = reduce_op(acc, value), src=(acc, value); arg None: acc = value
  ENDRANGE = enum.auto()       # closes the loop of src[0]
  BREAK_UNLESS = enum.auto()   # src=(cond, RANGE): leave that loop when cond is false
  # leaves
  CONST = enum.auto()
  DEFINE_VAR = enum.auto()     # a symbolic size (core/sym.py), an index value fixed per call; arg=(name, lo, hi)
  # elementwise
  CAST = enum.auto()
  BITCAST = enum.auto()
  NEG = enum.auto(); RECIP = enum.auto(); NOT = enum.auto()
  MATH = enum.auto()           # named libm/intrinsic function; arg=name ('exp', 'sin', 'pow', ...)
  ADD = enum.auto(); SUB = enum.auto(); MUL = enum.auto(); FDIV = enum.auto()
  IDIV = enum.auto(); MOD = enum.auto()   # C semantics: truncating division and its remainder
  MAX = enum.auto(); MIN = enum.auto()    # NaN-propagating on floats
  CMPLT = enum.auto(); CMPLE = enum.auto(); CMPEQ = enum.auto(); CMPNE = enum.auto()
  AND = enum.auto(); OR = enum.auto(); XOR = enum.auto(); SHL = enum.auto(); SHR = enum.auto()
  WHERE = enum.auto()


class AxisKind(str, enum.Enum):
  """What a RANGE loops over (RangeArg.kind). A str, equal to and hashed as its value, so a kind
  compares and hash-conses like the string it stands for."""
  GLOBAL = "global"                # an output axis
  SPLIT = "split"                  # the output axis the CPU threads divide (the kernel takes its bounds as arguments)
  REDUCE = "reduce"                # a reduction
  REDUCE_SERIAL = "reduce_serial"  # a reduction kept scalar: SIMD runs along an output axis instead
  STAGE = "stage"                  # a loop copying a staged slab into a local array (codegen._Evaluator._staged)
  LOOP = "loop"                    # an LT.loop's counter, whose trip count is data
  VECTOR = "vector"                # the stand-in for a SIMD lane: no loop runs it (codegen.vector_lane)
  LANE = "lane"                    # a register tile's stand-in position while its vector form is checked (codegen._lane_tile)
  LIMITED = "limited"              # a range narrowed to [lo, hi) by the simplifier (symbolic; arg a LimitedRange)

  def __repr__(self): return repr(self.value)
  def __str__(self): return self.value


# the loop-nest order of RANGE kinds (RangeArg.order): output loops outermost, a row reduction's own loops last
_KIND_ORDER = {AxisKind.GLOBAL: 0, AxisKind.SPLIT: 0, AxisKind.REDUCE: 1, AxisKind.REDUCE_SERIAL: 1, AxisKind.LOOP: 2,
               AxisKind.STAGE: 3, AxisKind.LANE: 4, AxisKind.VECTOR: 5}
_ROW_REDUCE_ORDER = 6


class RangeArg(NamedTuple):
  """RANGE's arg. `kind` says what the loop runs over and `axis` which one: the output axis (GLOBAL, SPLIT), the
  reduced axis of the input (REDUCE, REDUCE_SERIAL), the slab dimension (STAGE), the tile position (LANE), the
  LT.loop's number (LOOP), 0 for the SIMD lane (VECTOR). `group` tells apart loops of one kind over the same axis in
  one kernel: which row reduction (a REDUCE in loops of its own, schedule.KernelItem.row_reduces) or which staged copy
  (STAGE) a loop belongs to; None for the rest."""
  axis: int
  kind: AxisKind
  group: int | None = None

  def __repr__(self): return f"{self.kind.name}({self.axis}" + ("" if self.group is None else f", group {self.group}") + ")"

  @property
  def row_reduce(self) -> bool: return self.kind == AxisKind.REDUCE and self.group is not None

  @property
  def order(self) -> tuple:
    """A sort key: kinds in loop-nest order (outputs, reductions, LT.loop counters, staged copies, tile positions,
    the SIMD lane, row reductions' loops), then group, then axis."""
    return (_ROW_REDUCE_ORDER if self.row_reduce else _KIND_ORDER[self.kind], self.group or 0, self.axis)


class LimitedRange(NamedTuple):
  """A LIMITED RANGE's arg (symbolic.py, while it simplifies under a mask): the range it stands for, narrowed to start
  at `lo`."""
  of: RangeArg
  kind: AxisKind
  lo: Any


UNARY = {Ops.NEG, Ops.RECIP, Ops.NOT, Ops.CAST, Ops.BITCAST}
BINARY = {Ops.ADD, Ops.SUB, Ops.MUL, Ops.FDIV, Ops.IDIV, Ops.MOD, Ops.MAX, Ops.MIN, Ops.CMPLT, Ops.CMPLE,
          Ops.CMPEQ, Ops.CMPNE, Ops.AND, Ops.OR, Ops.XOR, Ops.SHL, Ops.SHR}
COMPARISON = {Ops.CMPLT, Ops.CMPLE, Ops.CMPEQ, Ops.CMPNE}
COMMUTATIVE = {Ops.ADD, Ops.MUL, Ops.MAX, Ops.MIN, Ops.CMPEQ, Ops.CMPNE, Ops.AND, Ops.OR, Ops.XOR}
ELEMENTWISE = UNARY | BINARY | {Ops.WHERE, Ops.MATH}


class TensorLoopVar(NamedTuple):
  """LOOP_VAR's arg in the tensor graph (LT.loop): which loop, which state value (-1: the step counter), its shape."""
  tag: Any
  index: int
  shape: tuple


class KernelLoopVar(NamedTuple):
  """LOOP_VAR's arg in a kernel (codegen): the kernel loop's id and the state value (-1: the counter)."""
  loop: int
  index: int


STAGED = "staged"  # CONTIGUOUS's arg for a copy staged inside its reader (a GEMM's weight panel, lowering/linalg.py)


def const_key(arg):
  # -0.0 == 0.0 and True == 1 in Python; constants must still stay distinct
  if isinstance(arg, float): return ('f', struct.pack('<d', arg))
  return (type(arg).__name__, arg)


_symbolic_types: tuple = ()  # (core.sym.Sym,), set when that module loads


# every live UOp, by (op, dtype, ids of its sources, arg): equal nodes are one object. A plain dict of weak references
# (each removing its own entry when its node dies) rather than a WeakValueDictionary, whose lookup is Python code:
# node construction is the compiler's hottest path.
_live: dict = {}


# integer constants by (dtype, value), held: index math builds the same few constants hundreds of thousands of times
# per model (ints only: 1 == 1.0 == True and 0.0 == -0.0 would share a key)
_int_consts: dict = {}
_INT_CONSTS_LIMIT = 1 << 14


def _forget(ref, key) -> None:
  if _live.get(key) is ref: del _live[key]


class _UOpMeta(type):
  def __call__(cls, op: Ops, dtype: DType = dtypes.void, src: tuple = (), arg: Any = None):
    key = (op, dtype, tuple(map(id, src)), const_key(arg) if op is Ops.CONST else arg)
    ref = _live.get(key)
    if ref is not None and (hit := ref()) is not None: return hit
    node = super().__call__(op, dtype, src, arg)
    _live[key] = weakref.ref(node, functools.partial(_forget, key=key))
    return node


class UOp(metaclass=_UOpMeta):
  __slots__ = ("op", "dtype", "src", "arg", "_props", "__weakref__")

  def __init__(self, op: Ops, dtype: DType = dtypes.void, src: tuple = (), arg: Any = None):
    self.op, self.dtype, self.src, self.arg = op, dtype, tuple(src), arg
    self._props: dict = {}

  def __reduce__(self): return UOp, (self.op, self.dtype, self.src, self.arg)
  def __repr__(self): return pretty(self)

  def replace(self, **kw) -> UOp:
    return UOp(kw.get("op", self.op), kw.get("dtype", self.dtype), kw.get("src", self.src), kw.get("arg", self.arg))

  # ---- constructors
  @staticmethod
  def const(dtype: DType, value) -> UOp:
    if type(value) is int and (hit := _int_consts.get((dtype, value))) is not None: return hit
    # a symbolic size (core/sym.py) is its expression, computed by the kernel
    if _symbolic_types and isinstance(value, _symbolic_types): return value.uop.cast(dtype)
    node = UOp(Ops.CONST, dtype, (), cast_python_value(value, dtype))
    if type(value) is int:
      if len(_int_consts) > _INT_CONSTS_LIMIT: _int_consts.clear()
      _int_consts[(dtype, value)] = node
    return node
  def const_like(self, value) -> UOp: return UOp.const(self.dtype, value)
  def alu(self, op: Ops, *others: UOp, arg=None) -> UOp:
    out_dtype = dtypes.bool if op in COMPARISON else self.dtype
    return UOp(op, out_dtype, (self, *others), arg)
  def cast(self, dtype: DType) -> UOp: return self if dtype == self.dtype else UOp(Ops.CAST, dtype, (self,))
  def where(self, a: UOp, b: UOp) -> UOp: return UOp(Ops.WHERE, a.dtype, (self, a, b))
  def math(self, name: str, *others: UOp) -> UOp: return UOp(Ops.MATH, self.dtype, (self, *others), name)

  def operand(self, x) -> UOp:
    """x as the other operand of an op on this node: itself if a UOp, else a constant of this node's dtype."""
    return x if isinstance(x, UOp) else UOp.const(self.dtype, x)
  def __add__(self, x): return self.alu(Ops.ADD, self.operand(x))
  def __radd__(self, x): return self.operand(x).alu(Ops.ADD, self)
  def __sub__(self, x): return self.alu(Ops.SUB, self.operand(x))
  def __rsub__(self, x): return self.operand(x).alu(Ops.SUB, self)
  def __mul__(self, x): return self.alu(Ops.MUL, self.operand(x))
  def __rmul__(self, x): return self.operand(x).alu(Ops.MUL, self)
  def __floordiv__(self, x): return self.alu(Ops.IDIV, self.operand(x))  # only used on non-negative indices
  def __mod__(self, x): return self.alu(Ops.MOD, self.operand(x))
  def __neg__(self): return UOp(Ops.NEG, self.dtype, (self,))
  def __lt__(self, x): return self.alu(Ops.CMPLT, self.operand(x))
  def __le__(self, x): return self.alu(Ops.CMPLE, self.operand(x))
  def __and__(self, x): return self.alu(Ops.AND, self.operand(x))
  def __or__(self, x): return self.alu(Ops.OR, self.operand(x))
  def ne(self, x): return self.alu(Ops.CMPNE, self.operand(x))
  def eq(self, x): return self.alu(Ops.CMPEQ, self.operand(x))
  def maximum(self, x): return self.alu(Ops.MAX, self.operand(x))
  def minimum(self, x): return self.alu(Ops.MIN, self.operand(x))
  __hash__ = object.__hash__
  __eq__ = object.__eq__

  # ---- graph helpers
  def toposort(self) -> list[UOp]: return toposort([self])

  @property
  def vmin(self): return self._bounds()[0]
  @property
  def vmax(self): return self._bounds()[1]

  def _bounds(self):
    if "bounds" not in self._props:
      from torch_uop.core.symbolic import bounds
      self._props["bounds"] = bounds(self)
    return self._props["bounds"]

  @property
  def shape(self) -> tuple:
    """Shape of a tensor-level node."""
    if "shape" not in self._props: self._props["shape"] = _tensor_shape(self)
    return self._props["shape"]


def _tensor_shape(u: UOp) -> tuple:
  if u.op is Ops.BUFFER: return (u.arg[1],)
  if u.op is Ops.VIEW: return u.arg.shape
  if u.op in (Ops.CONST, Ops.DEFINE_VAR): return ()
  if u.op is Ops.REDUCE_AXIS:
    return tuple(1 if i in u.arg[1] else s for i, s in enumerate(u.src[0].shape))
  if u.op is Ops.GATHER: return u.src[1].shape
  if u.op is Ops.IOTA: return (u.arg,)
  if u.op is Ops.LOOP_VAR: return u.arg.shape
  return u.src[-1].shape if u.op is Ops.WHERE else u.src[0].shape


def substitute(u: UOp, mapping: dict, cache: dict | None = None) -> UOp:
  """u with every node in `mapping` replaced by its value (sources rebuilt above them; nothing simplified)."""
  cache = {} if cache is None else cache
  if u in mapping: return mapping[u]
  if u not in cache: cache[u] = u.replace(src=tuple(substitute(s, mapping, cache) for s in u.src)) if u.src else u
  return cache[u]


def toposort(roots: Iterable[UOp]) -> list[UOp]:
  order, seen = [], set()
  for root in roots:
    stack = [(root, False)]
    while stack:
      node, expanded = stack.pop()
      if node in seen: continue
      if expanded:
        seen.add(node); order.append(node); continue
      stack.append((node, True))
      for s in reversed(node.src):
        if s not in seen: stack.append((s, False))
  return order


def _fmt_arg(arg) -> str:
  # enum members print by name only: their numeric values shift whenever an op is added
  if isinstance(arg, enum.Enum): return f"{type(arg).__name__}.{arg.name}"
  if isinstance(arg, RangeArg): return repr(arg)
  if isinstance(arg, tuple): return "(" + ", ".join(map(_fmt_arg, arg)) + ("," if len(arg) == 1 else "") + ")"
  return repr(arg)


def pretty(u: UOp, limit: int = 400) -> str:
  """Render a UOp graph as numbered lines, sharing repeated nodes."""
  names, lines = {}, []
  for i, n in enumerate(toposort([u])):
    names[n] = f"%{i}"
    srcs = ", ".join(names[s] for s in n.src)
    arg = "" if n.arg is None else f" {_fmt_arg(n.arg)}"
    lines.append(f"%{i} = {n.op.name}:{n.dtype.name}({srcs}){arg}")
    if len(lines) > limit: lines.append("..."); break
  return "\n".join(lines)


# ---------------------------------------------------------------- patterns

class UPat:
  """A pattern over UOps. `name` binds the matched node; `src` matches sources in order
  (a list means: try every permutation, for commutative ops); `arg`/`dtype` must be equal."""
  __slots__ = ("ops", "dtype", "src", "arg", "name", "allow_any_len", "orders")

  def __init__(self, op=None, dtype=None, src=None, arg=None, name: str | None = None, allow_any_len=False):
    self.ops = None if op is None else (frozenset(op) if isinstance(op, (set, tuple, list)) else frozenset((op,)))
    self.dtype = None if dtype is None else (tuple(dtype) if isinstance(dtype, (set, tuple, list)) else (dtype,))
    self.src, self.arg, self.name, self.allow_any_len = src, arg, name, allow_any_len
    # the source patterns in each order to try (every permutation of a list, for commutative ops)
    self.orders = None if src is None else _permutations(src) if isinstance(src, list) else [tuple(src)]

  @staticmethod
  def var(name: str | None = None, dtype=None) -> UPat: return UPat(name=name, dtype=dtype)
  @staticmethod
  def cvar(name: str | None = None, dtype=None) -> UPat: return UPat(Ops.CONST, dtype, name=name)

  def match(self, u: UOp, binds: dict) -> list[dict]:
    if self.ops is not None and u.op not in self.ops: return []
    if self.dtype is not None and u.dtype not in self.dtype: return []
    if self.arg is not None and u.arg != self.arg: return []
    if self.name is not None:
      if self.name in binds and binds[self.name] is not u: return []
      binds = {**binds, self.name: u}
    if self.orders is None: return [binds]
    results = []
    for pats in self.orders:
      if len(pats) != len(u.src) and not (self.allow_any_len and len(u.src) >= len(pats)): continue
      partial = [binds]
      for p, s in zip(pats, u.src):
        partial = [b2 for b in partial for b2 in p.match(s, b)]
        if not partial: break
      results.extend(partial)
    return results

  # builder sugar so rules read like the expressions they match
  def _b(self, op, *others): return UPat(op, src=[self, *others] if op in COMMUTATIVE else (self, *others))
  def __add__(self, x): return self._b(Ops.ADD, x)
  def __mul__(self, x): return self._b(Ops.MUL, x)
  def __floordiv__(self, x): return self._b(Ops.IDIV, x)
  def __mod__(self, x): return self._b(Ops.MOD, x)


def _op_only(pat: UPat) -> bool: return pat.dtype is None and pat.arg is None and pat.orders is None


def _permutations(pats: list) -> list[tuple]:
  if len(pats) == 2: return [tuple(pats), (pats[1], pats[0])]
  import itertools
  return list(itertools.permutations(pats))


class PatternMatcher:
  """An ordered list of (UPat, fn(**binds) -> UOp | None), fn(ctx, **binds) where a ctx is given. A node is tried
  against the rules whose root pattern takes its op (or any op), in list order; the first rule whose function returns
  a UOp wins (`rewrite`; `translate` takes any result that is not None). Rules are indexed by their root op for speed."""

  def __init__(self, rules: list[tuple[UPat, Callable]]):
    self.rules = rules
    # per root op, the rules that take it, in list order (a rule for any op keeps its place among them), each with
    # whether its pattern checks nothing past the op (then it binds the node to its name without matching); an op
    # no rule names gets only the rules for any op
    ops = {op for pat, _ in rules if pat.ops is not None for op in pat.ops}
    self._rules_for = {op: [(pat, fn, _op_only(pat)) for pat, fn in rules if pat.ops is None or op in pat.ops] for op in ops}
    self._any_op = [(pat, fn, _op_only(pat)) for pat, fn in rules if pat.ops is None]

  def __add__(self, other: PatternMatcher) -> PatternMatcher: return PatternMatcher(self.rules + other.rules)

  def may_rewrite(self, nodes) -> bool:
    """Whether some rule's root op is the op of one of `nodes` (a graph with none is left as it is by graph_rewrite)."""
    return bool(self._any_op) or any(u.op in self._rules_for for u in nodes)

  def rewrite(self, u: UOp, ctx=None) -> UOp | None:
    """The first rule's new node for u (None: no rule rewrites it; a rule returning u itself does not count)."""
    return self._first(u, ctx, u)

  def translate(self, u: UOp, ctx=None):
    """The first rule's result for u that is not None, whatever it is (u itself, a string): for passes that translate
    each node into something else (codegen's kernel building, the renderers) rather than rewrite a graph."""
    return self._first(u, ctx, None)

  def _first(self, u: UOp, ctx, unchanged):
    for pat, fn, op_only in self._rules_for.get(u.op, self._any_op):
      for binds in (({pat.name: u} if pat.name else {},) if op_only else pat.match(u, {})):
        out = fn(ctx, **binds) if ctx is not None else fn(**binds)
        if out is not None and out is not unchanged: return out
    return None


def graph_rewrite(root: UOp, pm: PatternMatcher, ctx=None, memo: dict | None = None) -> UOp:
  """Rewrite bottom-up to a fixed point: sources first, then the node, again until stable.
  `memo` (node -> rewritten node) may be shared between calls with the same matcher and no ctx, so
  subgraphs already rewritten are not walked again (UOps are immutable, so the results stay valid)."""
  done: dict[UOp, UOp] = {} if memo is None else memo

  def visit(n: UOp) -> UOp:
    stack = [(n, False)]
    while stack:
      node, ready = stack.pop()
      if node in done: continue
      if not ready:
        stack.append((node, True))
        stack.extend((s, False) for s in node.src if s not in done)
        continue
      new = node
      if node.src and any(done[s] is not s for s in node.src): new = node.replace(src=tuple(done[s] for s in node.src))
      seen = 0
      while (nxt := pm.rewrite(new, ctx)) is not None:
        seen += 1
        if seen > 1000: raise RuntimeError(f"graph_rewrite did not converge on {new.op}")
        if nxt.src:
          # the rewrite may have built new sources, or reused ones rewritten earlier: bring them all to their fixed point
          nxt = nxt.replace(src=tuple(visit(s) for s in nxt.src))
        new = nxt
      done[node] = new
      done.setdefault(new, new)
    return done[n]

  return visit(root)
