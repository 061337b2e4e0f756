"""`LT`, the tensor-level builder lowerings write with.

An LT wraps one tensor-level UOp and knows its shape and dtype. Movement methods compose
ShapeTrackers (a view of a view is one VIEW node), elementwise methods broadcast and build ALU
nodes, `reduce` builds REDUCE_AXIS. Lowerings receive LTs for tensor arguments and return LTs;
they never see kernels or loops. Half types are computed in float32 (`compute_dtype`), as eager
does on the CPU.
"""
from __future__ import annotations
import itertools
import math
from torch_uop.core.uop import UOp, Ops, STAGED, TensorLoopVar
from torch_uop.core.dtypes import DType, dtypes
from torch_uop.core.shapetracker import ShapeTracker
from torch_uop.core.sym import is_sym, hint, known_equal
from torch_uop.core.codegen import reduce_identity


# a reduction of at least SPLIT_REDUCE_MIN elements into fewer than SPLIT_REDUCE_MAX_OUTPUTS results is done in two
# steps, so that its first step has outputs to share among threads (see LT._split_reduce)
SPLIT_REDUCE_MIN = 1 << 18
SPLIT_REDUCE_MAX_OUTPUTS = 16
SPLIT_REDUCE_PARTS = 64


def _size(s):
  """A size or offset argument as an int, or as itself when it is a symbolic size (core/sym.py)."""
  return s if is_sym(s) else int(s)


def compute_dtype(dt: DType) -> DType:
  return dtypes.float32 if dt in (dtypes.float16, dtypes.bfloat16) else dt


def broadcast_shapes(*shapes) -> tuple:
  nd = max(len(s) for s in shapes)
  out = []
  for dims in zip(*[(1,) * (nd - len(s)) + tuple(s) for s in shapes]):
    sizes = {d for d in dims if d != 1}
    if len(sizes) > 1: raise ValueError(f"shapes {shapes} do not broadcast")
    out.append(sizes.pop() if sizes else 1)
  return tuple(out)


_loop_tags = itertools.count()


class LT:
  __slots__ = ("uop",)

  def __init__(self, uop: UOp): self.uop = uop

  @property
  def shape(self) -> tuple: return self.uop.shape
  @property
  def dtype(self) -> DType: return self.uop.dtype
  @property
  def ndim(self) -> int: return len(self.shape)
  def numel(self) -> int: return math.prod(self.shape)
  def __repr__(self): return f"LT({self.shape}, {self.dtype})"

  # ---------------- creation
  @staticmethod
  def full(shape, value, dtype: DType) -> LT:
    c = LT(UOp.const(dtype, value))
    return c.reshape((1,) * len(shape)).expand(tuple(shape)) if shape else c

  def const_like(self, value, dtype: DType | None = None) -> LT: return LT.full(self.shape, value, dtype or self.dtype)

  # ---------------- movement
  def map_view(self, fn) -> LT:
    if self.uop.op is Ops.VIEW: base, st = self.uop.src[0], self.uop.arg
    else: base, st = self.uop, ShapeTracker.from_shape(self.shape)
    new = fn(st)
    if base.op is not Ops.CONST and new.is_contiguous and known_equal(new.shape, base.shape): return LT(base)
    return LT(UOp(Ops.VIEW, self.dtype, (base,), new))

  def reshape(self, shape) -> LT:
    shape = tuple(map(_size, shape))
    if -1 in shape:
      known = math.prod(s for s in shape if s != -1)
      shape = tuple(self.numel() // known if s == -1 else s for s in shape)
    if math.prod(shape) != self.numel(): raise ValueError(f"cannot reshape {self.shape} to {shape}")
    if known_equal(shape, self.shape): return self
    return self.map_view(lambda st: st.reshape(shape))

  def permute(self, order) -> LT:
    order = tuple(o % self.ndim for o in order) if self.ndim else ()
    if order == tuple(range(self.ndim)): return self
    return self.map_view(lambda st: st.permute(order))

  def expand(self, shape) -> LT:
    shape = tuple(shape)
    if len(shape) > self.ndim: return self.reshape((1,) * (len(shape) - self.ndim) + self.shape).expand(shape)
    shape = tuple(s if n == -1 else n for s, n in zip(self.shape, shape))
    if known_equal(shape, self.shape): return self
    return self.map_view(lambda st: st.expand(shape))

  def shrink(self, bounds) -> LT:
    bounds = tuple((_size(a), _size(b)) for a, b in bounds)
    if all(a == 0 and b == s for (a, b), s in zip(bounds, self.shape)): return self
    return self.map_view(lambda st: st.shrink(bounds))

  def pad(self, pads, value=0) -> LT:
    """pads: ((before, after), ...) per dim; negative entries crop."""
    pads = tuple((_size(a), _size(b)) for a, b in pads)
    crop = tuple((max(0, -a), s - max(0, -b)) for (a, b), s in zip(pads, self.shape))
    x = self.shrink(crop)
    pos = tuple((max(0, a), max(0, b)) for a, b in pads)
    if all(a == 0 and b == 0 for a, b in pos): return x
    padded = x.map_view(lambda st: st.pad(pos))
    if value == 0: return padded
    # pad value v: pad with 0 and add v where the mask is off
    inside = LT.full(x.shape, True, dtypes.bool).map_view(lambda st: st.pad(pos))
    return inside.where(padded, padded.const_like(value))

  def flip(self, dims) -> LT:
    dims = tuple(d % self.ndim for d in dims)
    if not dims: return self
    return self.map_view(lambda st: st.flip(dims))

  def slice(self, dim: int, start: int, end: int, step: int = 1) -> LT:
    dim %= self.ndim
    bounds = [(0, s) for s in self.shape]
    bounds[dim] = (start, max(start, end))
    x = self.shrink(bounds)
    if step == 1: return x
    steps = [1] * self.ndim
    steps[dim] = step
    return x.map_view(lambda st: st.stride_step(tuple(steps)))

  def as_strided(self, shape, strides, offset=0) -> LT:
    """A raw strided window over this tensor's contiguous element order."""
    return self.map_view(lambda st: st.as_strided(tuple(shape), tuple(strides), offset))

  def squeeze_dims(self, dims) -> LT:
    dims = {d % self.ndim for d in dims} if self.ndim else set()
    return self.reshape(tuple(s for i, s in enumerate(self.shape) if not (i in dims and s == 1)))

  def unsqueeze(self, dim: int) -> LT:
    dim = dim % (self.ndim + 1)
    return self.reshape(self.shape[:dim] + (1,) + self.shape[dim:])

  def transpose(self, a: int, b: int) -> LT:
    order = list(range(self.ndim))
    order[a], order[b] = order[b], order[a]
    return self.permute(order)

  def broadcast_to(self, shape) -> LT:
    shape = tuple(shape)
    if known_equal(self.shape, shape): return self
    x = self.reshape((1,) * (len(shape) - self.ndim) + self.shape) if len(shape) > self.ndim else self
    return x.expand(shape)

  # ---------------- elementwise
  def cast(self, dtype: DType) -> LT:
    if dtype == self.dtype: return self
    halfs = (dtypes.float16, dtypes.bfloat16)
    if dtype in halfs and self.dtype in (dtypes.float64, *halfs):
      # eager converts double and the other half type through float (c10::Half(float)); LLVM has no
      # half <-> bfloat cast, and fptrunc double -> half is a libcall (__truncdfhf2) the JIT cannot resolve
      return self.cast(dtypes.float32).cast(dtype)
    return LT(UOp(Ops.CAST, dtype, (self.uop,)))

  def bitcast(self, dtype: DType) -> LT: return LT(UOp(Ops.BITCAST, dtype, (self.uop,)))

  def operand(self, x) -> LT:
    """x as the other operand of an op on this tensor: itself if an LT, else a constant tensor of this shape and dtype."""
    return x if isinstance(x, LT) else LT.full(self.shape, x, self.dtype)

  def alu(self, op: Ops, *others, arg=None, dtype: DType | None = None) -> LT:
    xs = [self] + [self.operand(o) for o in others]
    shape = broadcast_shapes(*[x.shape for x in xs])
    xs = [x.broadcast_to(shape) for x in xs]
    if dtype is None: dtype = dtypes.bool if op in (Ops.CMPLT, Ops.CMPLE, Ops.CMPEQ, Ops.CMPNE) else self.dtype
    return LT(UOp(op, dtype, tuple(x.uop for x in xs), arg))

  def __add__(self, x): return self.alu(Ops.ADD, x)
  def __sub__(self, x): return self.alu(Ops.SUB, x)
  def __mul__(self, x): return self.alu(Ops.MUL, x)
  def __truediv__(self, x): return self.alu(Ops.FDIV, x)
  def __neg__(self): return self.alu(Ops.NEG)
  def __lt__(self, x): return self.alu(Ops.CMPLT, x)
  def __le__(self, x): return self.alu(Ops.CMPLE, x)
  def __gt__(self, x): return self.operand(x).alu(Ops.CMPLT, self)
  def __ge__(self, x): return self.operand(x).alu(Ops.CMPLE, self)
  def eq(self, x): return self.alu(Ops.CMPEQ, x)
  def ne(self, x): return self.alu(Ops.CMPNE, x)
  def __and__(self, x): return self.alu(Ops.AND, x)
  def __or__(self, x): return self.alu(Ops.OR, x)
  def __xor__(self, x): return self.alu(Ops.XOR, x)
  def logical_not(self): return self.alu(Ops.NOT)
  def recip(self): return self.alu(Ops.RECIP)
  def maximum(self, x): return self.alu(Ops.MAX, x)
  def minimum(self, x): return self.alu(Ops.MIN, x)
  def math(self, name: str, *others) -> LT: return self.alu(Ops.MATH, *others, arg=name)
  def exp(self): return self.math("exp")
  def log(self): return self.math("log")
  def sqrt(self): return self.math("sqrt")
  def isnan(self): return self.ne(self)

  def where(self, a, b) -> LT:
    """self is a bool condition."""
    a_lt = a if isinstance(a, LT) else None
    b_lt = b if isinstance(b, LT) else None
    ref = a_lt or b_lt
    assert ref is not None, "where needs at least one tensor branch"
    a_lt = a_lt or ref.operand(a)
    b_lt = b_lt or ref.operand(b)
    shape = broadcast_shapes(self.shape, a_lt.shape, b_lt.shape)
    c, a2, b2 = (x.broadcast_to(shape) for x in (self, a_lt, b_lt))
    return LT(UOp(Ops.WHERE, a2.dtype, (c.uop, a2.uop, b2.uop)))

  # ---------------- reductions
  def reduce(self, op: Ops, axes, keepdim: bool = True) -> LT:
    requested = tuple(sorted({a % self.ndim for a in axes})) if self.ndim else ()
    real = tuple(a for a in requested if self.shape[a] != 1)
    out = (self._split_reduce(op, real) or LT(UOp(Ops.REDUCE_AXIS, self.dtype, (self.uop,), (op, real)))) if real else self
    if self.numel() == 0 and real:  # reducing an empty tensor gives the identity
      out = LT.full(out.shape, reduce_identity(op, self.dtype), self.dtype)
    if keepdim: return out
    return out.reshape(tuple(s for i, s in enumerate(self.shape) if i not in requested))

  def _split_reduce(self, op: Ops, axes: tuple) -> LT | None:
    """A big reduction with few outputs (x.sum()) as two: SPLIT_REDUCE_PARTS partial results per output, realized
    by a kernel whose output loop threads can share, then a small reduction over them. None when not worth it."""
    kept = [a for a in range(self.ndim) if a not in axes]
    n_out, n_red = math.prod(self.shape[a] for a in kept), math.prod(self.shape[a] for a in axes)
    parts = SPLIT_REDUCE_PARTS
    # (whether it is worth it is judged on this call's sizes; that it is exact, n_red % parts == 0, is guarded)
    if hint(n_out) >= SPLIT_REDUCE_MAX_OUTPUTS or hint(n_red) < SPLIT_REDUCE_MIN or op not in (Ops.ADD, Ops.MAX, Ops.MIN) \
       or n_red % parts: return None
    flat = self.permute((*kept, *axes)).reshape((n_out, parts, n_red // parts))
    partial = LT(UOp(Ops.REDUCE_AXIS, self.dtype, (flat.uop,), (op, (2,))))          # [n_out, parts, 1]
    total = LT(UOp(Ops.REDUCE_AXIS, self.dtype, (partial.uop,), (op, (1,))))       # [n_out, 1, 1]
    return total.reshape(tuple(1 if a in axes else n for a, n in enumerate(self.shape)))

  def sum(self, axes, keepdim=True): return self.reduce(Ops.ADD, axes, keepdim)
  def max(self, axes, keepdim=True): return self.reduce(Ops.MAX, axes, keepdim)

  # ---------------- loops
  @staticmethod
  def loop(count: LT, init: list, step, keep_going=None) -> list:
    """A per-element loop with loop-carried state, for recurrences whose trip count is data:
    `state = init; for k in range(count): if not keep_going(state): break; state = step(k, state)`.
    count: an integer LT; init: LTs; step(k, state) -> new state and keep_going(state) -> bool LT work
    elementwise on LTs of the common shape (k is int64). Returns the final state. The placeholders k and
    state must only be combined elementwise (no views, reductions or gathers of them)."""
    shape = broadcast_shapes(count.shape, *[s.shape for s in init])
    tag = next(_loop_tags)
    k = LT(UOp(Ops.LOOP_VAR, dtypes.int64, (), TensorLoopVar(tag, -1, shape)))
    state = [LT(UOp(Ops.LOOP_VAR, s.dtype, (), TensorLoopVar(tag, i, shape))) for i, s in enumerate(init)]
    nxt = [n.cast(s.dtype).broadcast_to(shape) for n, s in zip(step(k, state), init)]
    go = LT.full(shape, True, dtypes.bool) if keep_going is None else keep_going(state).broadcast_to(shape)
    src = (count.cast(dtypes.int64).maximum(0).broadcast_to(shape).uop, go.uop,
           *[s.broadcast_to(shape).uop for s in init], *[n.uop for n in nxt])
    return [LT(UOp(Ops.LOOP, s.dtype, src, (tag, i))) for i, s in enumerate(init)]

  def contiguous(self) -> LT:
    # a buffer already written out for this graph, read in order, needs no second copy (a 3-D convolution's taps
    # written out, then padded by no pixels for the 2-D path's own copy)
    u = self.uop
    if u.op is Ops.VIEW and u.arg.is_contiguous: u = u.src[0]
    if u.op is Ops.CONTIGUOUS and u.arg != STAGED: return self
    return LT(UOp(Ops.CONTIGUOUS, self.dtype, (self.uop,)))

  def staged(self) -> LT:
    """A contiguous copy made inside the kernel that reads it, never in memory of its own: for each index of dim 0
    the kernel reads, it copies that slab (the other dims) into a local array and reads it there (core/codegen.py).
    Where the reader cannot (a GPU-style device, a gated read) it reads the source itself."""
    return LT(UOp(Ops.CONTIGUOUS, self.dtype, (self.uop,), STAGED))

  @staticmethod
  def iota(n: int, dtype: DType = dtypes.int64) -> LT:
    """[0, 1, ..., n-1]"""
    return LT(UOp(Ops.IOTA, dtype, (), n))

  @staticmethod
  def iota_along(shape: tuple, axis: int, dtype: DType = dtypes.int64) -> LT:
    """Each position's index along `axis`, over a tensor of `shape`."""
    axis %= len(shape)
    n = shape[axis]
    return LT.iota(n, dtype).reshape(tuple(n if d == axis else 1 for d in range(len(shape)))).broadcast_to(tuple(shape))

  def gather_nd(self, sources: tuple, indices: list) -> LT:
    """Data-dependent read. `indices` are LTs of the output's shape; `sources` has one entry per dim of
    self: an int j (use output index j) or ('idx', k) (use the value of indices[k]). Negative index
    values wrap once, as in eager; out-of-range values are clamped, never read out of bounds."""
    assert len(sources) == self.ndim and indices
    shape = indices[0].shape
    assert all(i.shape == shape for i in indices)
    return LT(UOp(Ops.GATHER, self.dtype, (self.uop, *[i.uop for i in indices]), tuple(sources)))

  def gather(self, dim: int, index: LT) -> LT:
    """torch.gather: out[i] = self[i with i[dim] := index[i]]; index has out's shape."""
    dim %= self.ndim
    return self.gather_nd(tuple(("idx", 0) if d == dim else d for d in range(self.ndim)), [index])
