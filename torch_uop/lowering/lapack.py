"""LAPACK-style linear algebra as generated kernels: LU with partial pivoting, Cholesky, LDL^T with
Bunch-Kaufman pivoting, triangular solves, and what torch builds on them (solve, inverse,
determinants, lu_solve/unpack, cholesky_solve/inverse, ldl_solve).

These algorithms are sequential over the matrix size n: step j reads what step j-1 wrote. Each is
unrolled here at the tensor level into n steps of whole-matrix LT expressions (masks pick the rows
and columns a step touches), batched over the leading dims. Every step ends in a realized buffer, and
reads the previous one only through broadcasts and gathers of that buffer (never of an expression),
so the scheduler makes one kernel per step: a Cholesky column; an LU step's rank-1 update, after its
pivot search (one reduction in float32, two in float64); SOLVE_BLOCK rows of a triangular solve; an
LDL position after its two searches.
Sizes above MAX_N fall back, to bound compile time (about 3 s and 50 kernels for a 16x16 solve).

Results follow LAPACK as torch returns them: pivots 1-based int32, the first maximum |value| as
pivot (NaN never wins, as in idamax), multipliers scaled by the pivot's reciprocal, `info` = the
first zero pivot (LU) or the first leading minor that is not positive (Cholesky, which then leaves
the rest of the matrix as LAPACK leaves it). Where eager factors A^T instead of A (det and slogdet of
a contiguous A), so do these lowerings, since the LU and pivots they return feed the backward.
Errors eager raises on the data (singular input to linalg.inv, bad pivots) are raised by host
checks (`ctx.host_call`) that read the small info/pivot tensors between kernels.
"""
from __future__ import annotations
import torch
from torch_uop.core.uop import Ops
from torch_uop.core.dtypes import dtypes
from torch_uop.torch_dtypes import to_torch
from torch_uop.lowering.registry import register, Unsupported
from torch_uop.lowering.tensor import LT, broadcast_shapes
from torch_uop.lowering.linalg import matmul

aten = torch.ops.aten

# the largest matrix size lowered (unrolled steps, so compile time grows with n); larger ones fall back
MAX_N = 16


def _check_size(*ns: int) -> None:
  if max(ns, default=0) > MAX_N: raise Unsupported(f"matrix size {max(ns)} > {MAX_N}: too many unrolled steps")


def _float(x: LT) -> None:
  if not x.dtype.is_float or x.dtype.itemsize < 4: raise Unsupported(f"{x.dtype} (eager supports float32/float64)")


def _rows(m: int, nd: int) -> LT:
  """Row index as a [1.., m, 1] int64 tensor of rank nd."""
  return LT.iota(m).reshape((1,) * (nd - 2) + (m, 1))


def _cols(n: int, nd: int) -> LT:
  return LT.iota(n).reshape((1,) * (nd - 2) + (1, n))


def _entry(x: LT, i: int, j: int) -> LT:
  """x[..., i:i+1, j:j+1]"""
  return x.slice(-2, i, i + 1).slice(-1, j, j + 1)


def _mT(x: LT) -> LT: return x.transpose(-1, -2)


def _eye(n: int, dtype) -> LT:
  return _rows(n, 2).eq(_cols(n, 2)).cast(dtype)


def _tiny(dtype) -> float: return float(torch.finfo(to_torch(dtype)).tiny)


def _is_contiguous(node_arg) -> bool:
  val = node_arg.meta.get("val") if isinstance(node_arg, torch.fx.Node) else None
  return val is not None and val.is_contiguous()


def _used_outputs(ctx) -> set:
  """Indices of a multi-output node's results that some node reads."""
  used = set()
  for user in ctx.node.users:
    if getattr(user.target, "__name__", None) == "getitem": used.add(user.args[1])
    else: return set(range(len(ctx.vals)))
  return used


# ---------------------------------------------------------------------------------------------- LU

class Pivot:
  """The row one LU step swaps with (0-based), built at any shape that has the batch dims first from a
  small realized leaf (a reduction or a slice of ipiv), so that broadcasting it costs no kernel."""

  def __init__(self, leaf: LT, finish): self.leaf, self.finish = leaf, finish

  def at(self, shape) -> LT: return self.finish(self.leaf.broadcast_to(tuple(shape)), tuple(shape))


class Factorization:
  """The result of `lu_factor`: packed L\\U (unit L below the diagonal), the Pivot of each step, info
  ([*b, 1, 1] int32) and the extra columns carried along."""

  def __init__(self, lu: LT, pivots: list, info: LT, rhs: LT | None):
    self.lu, self.pivots, self.info, self.rhs = lu, pivots, info, rhs

  def pivots_tensor(self) -> LT:
    """LAPACK's ipiv: [*b, k] int32, 1-based."""
    shape = self.lu.shape[:-2] + (len(self.pivots),)
    pos = LT.iota(shape[-1]).reshape((1,) * (len(shape) - 1) + (shape[-1],))
    out = LT.full(shape, 0, dtypes.int32)
    for j, p in enumerate(self.pivots): out = pos.eq(j).where((p.at(shape) + 1).cast(dtypes.int32), out)
    return out


def _pick(x: LT, r: LT, c: LT) -> LT:
  """x[..., r, c] for index tensors r, c of the result's shape (which has x's batch dims)."""
  return x.gather_nd(tuple(range(x.ndim - 2)) + (("idx", 0), ("idx", 1)), [r, c])


def _pivot_search(x: LT, j: int, start: int | None = None) -> Pivot:
  """The first row p >= start (default j) with the largest |x[p, j]|. NaN never wins, unless it is
  x[start, j] itself (as idamax, which starts from the first entry and only moves on a strictly larger one)."""
  start = j if start is None else start
  m, ax = x.shape[-2], x.ndim - 2
  rows = _rows(m, x.ndim)
  mag = x.slice(-1, j, j + 1).math("abs")
  ok = (rows >= start) & mag.isnan().logical_not()
  first_nan = _entry(x, start, j)
  if x.dtype == dtypes.float32:
    # one reduction: |v|'s bits (ordered as the values, v >= 0) above the row, reversed so ties go to the first
    assert m <= 64
    key = ok.where(mag.bitcast(dtypes.int32).cast(dtypes.int64) * 64 - rows + 63, -1).max((ax,))
    def finish(k, shape):
      return first_nan.broadcast_to(shape).isnan().where(start, (k < 0).where(start, k.alu(Ops.AND, 63) * -1 + 63))
    return Pivot(key, finish)
  cand = ok.where(mag, -1.0)
  p = (ok & cand.eq(cand.max((ax,)))).where(rows, m).reduce(Ops.MIN, (ax,))
  def finish(p, shape): return (first_nan.broadcast_to(shape).isnan() | p.eq(m)).where(start, p)
  return Pivot(p, finish)


def lu_factor(a: LT, rhs: LT | None = None) -> Factorization:
  """Right-looking LU with partial pivoting of a [*b, m, n]: step j picks the pivot row p, swaps rows j
  and p (across all columns, as LAPACK does), stores the multipliers a[i, j] / a[j, j] below the
  diagonal and subtracts their outer product with row j from the trailing matrix. `rhs` [*b, m, r] is
  carried along as extra columns (Gaussian elimination of A X = rhs).
  Each step is one whole-matrix kernel after the pivot search; everything it reads at another
  position (row p, row j, column j) is a broadcast or gather of the previous step's buffer, never of
  an expression, so the scheduler has nothing to realize in between."""
  *batch, m, n = a.shape
  nd = a.ndim
  x = a if rhs is None else a.pad([(0, 0)] * (nd - 1) + [(0, rhs.shape[-1])]) + \
      rhs.pad([(0, 0)] * (nd - 1) + [(n, 0)])
  full = x.shape
  small = tuple(batch) + (1, 1)
  rows, cols = _rows(m, nd).broadcast_to(full), _cols(full[-1], nd).broadcast_to(full)
  info = LT.full(small, 0, dtypes.int32)
  tiny = _tiny(a.dtype)
  pivots = []
  for j in range(min(m, n)):
    pivot = _pivot_search(x, j)
    pivots.append(pivot)
    pf, jf = pivot.at(full), LT.full(full, j, dtypes.int64)
    row_p = x.gather_nd(tuple(range(nd - 2)) + (("idx", 0), nd - 1), [pf])     # x[p, c]: the new row j
    piv = _pick(x, pf, jf)                                                      # x[p, j]
    swapped = rows.eq(j).where(row_p, rows.eq(pf).where(x.slice(-2, j, j + 1).broadcast_to(full), x))
    col = rows.eq(j).where(piv, rows.eq(pf).where(_entry(x, j, j).broadcast_to(full), x.slice(-1, j, j + 1).broadcast_to(full)))
    mult = ((piv >= tiny) | (piv <= -tiny)).where(col * piv.recip(), col / piv)   # OpenBLAS scales by 1/pivot
    mult = piv.ne(0).where(mult, col)
    below = rows > j
    x = (below & (cols > j)).where(swapped - mult * row_p, (below & cols.eq(j)).where(mult, swapped)).contiguous()
    info = (info.eq(0) & _entry(x, j, j).eq(0)).where(j + 1, info)
  lu = x.slice(-1, 0, n)
  return Factorization(lu, pivots, info, None if rhs is None else x.slice(-1, n, full[-1]))


def _ipiv_steps(ipiv: LT) -> list:
  """LAPACK ipiv [*b, k] (1-based) -> the Pivot of each step."""
  batch, k = ipiv.shape[:-1], ipiv.shape[-1]
  return [Pivot(ipiv.slice(-1, j, j + 1).reshape(batch + (1, 1)), lambda p, shape: p.cast(dtypes.int64) - 1)
          for j in range(k)]


def _row_origin(steps: list, shape: tuple, inverse: bool = False) -> LT:
  """Row swaps j <-> steps[j] applied in order to the rows of a [*b, m, r] matrix: the row that ends at
  each position (at `shape`); with inverse, where each row ends. An O(k) select chain per element."""
  pos = _rows(shape[-2], len(shape)).broadcast_to(shape)
  order = range(len(steps)) if inverse else reversed(range(len(steps)))
  for j in order:
    p = steps[j].at(shape)
    pos = pos.eq(j).where(p, pos.eq(p).where(j, pos))
  return pos


def _gather_rows(x: LT, rows: LT) -> LT:
  """x[..., rows[i, c], c] for an index of x's shape."""
  return x.gather_nd(tuple(range(x.ndim - 2)) + (("idx", 0), x.ndim - 1), [rows])


# -------------------------------------------------------------------------------- triangular solve

# rows of X a triangular-solve kernel fixes at once (each element recomputes them: O(BLOCK^2) work)
SOLVE_BLOCK = 8


def solve_triangular(t: LT, b: LT, upper: bool, unit: bool = False) -> LT:
  """T X = B for triangular T [*b, n, n] (only its triangle is read) and B [*b, n, r], by substitution in
  the order LAPACK's trsm uses: row j of X is B[j] minus the rows fixed before it, times 1/T[j, j] (as
  OpenBLAS does), and each fixed row is subtracted from the rows still open, one after another. One
  kernel fixes SOLVE_BLOCK rows: every element recomputes them from the previous buffer."""
  n, nd, full = t.shape[-1], b.ndim, b.shape
  rows = _rows(n, nd).broadcast_to(full)
  order = list(reversed(range(n)) if upper else range(n))
  x = b
  for start in range(0, n, SOLVE_BLOCK):
    block = order[start:start + SOLVE_BLOCK]
    fixed = {}
    for j in block:
      v = x.slice(-2, j, j + 1).broadcast_to(full)
      for k in fixed: v = v - _entry(t, j, k).broadcast_to(full) * fixed[k]
      if not unit: v = v * _entry(t, j, j).broadcast_to(full).recip()
      fixed[j] = v
    new = x
    for j, v in fixed.items():
      open_rows = rows < j if upper else rows > j
      new = open_rows.where(new - t.slice(-1, j, j + 1).broadcast_to(full) * v, new)
    for j, v in fixed.items(): new = rows.eq(j).where(v, new)
    x = new.contiguous()
  return x


def _broadcast_batch(a: LT, b: LT) -> tuple[LT, LT]:
  batch = broadcast_shapes(a.shape[:-2], b.shape[:-2])
  return a.broadcast_to(batch + a.shape[-2:]), b.broadcast_to(batch + b.shape[-2:])


def lu_solve(lu: LT, steps: list, b: LT, adjoint: bool = False) -> LT:
  """A X = B (or A^T X = B) for A = P L U given as packed LU and its row swaps."""
  lu, b = _broadcast_batch(lu, b)
  if not adjoint:   # X = U^-1 L^-1 P^T B
    y = _gather_rows(b, _row_origin(steps, b.shape))
    return solve_triangular(lu, solve_triangular(lu, y, upper=False, unit=True), upper=True)
  # A^T = U^T L^T P^T: X = P L^-T U^-T B
  y = solve_triangular(_mT(lu), solve_triangular(_mT(lu), b, upper=False), upper=True, unit=True)
  return _gather_rows(y, _row_origin(steps, y.shape, inverse=True))


# ------------------------------------------------------------------------------------ host checks

class _LinalgErrorCheck:
  """Host step: raise eager's error when info != 0 (torch's own checker writes the message), else hand
  back the first argument (the effect token of a `with_effects` node, or a result to guard)."""

  def __init__(self, api_name: str, is_matrix: bool): self.api_name, self.is_matrix = api_name, is_matrix

  def __call__(self, passed, info):
    if bool(info.ne(0).any()): aten._linalg_check_errors(info, self.api_name, is_matrix=self.is_matrix)  # raises
    return passed


class _PivotCheck:
  """Raise eager's error for LAPACK pivots out of range (1..m; |.| for ldl); hand the pivots through."""

  def __init__(self, m: int, op: str): self.m, self.op = m, op

  def __call__(self, ipiv):
    if self.op == "ldl_solve":
      if bool((ipiv.abs() < 1).any()):
        raise RuntimeError("Pivots given to ldl_solve must all satisfy |pivot| >= 1. "
                           "Did you properly pass the result of ldl_factor?")
      if bool((ipiv.abs() > self.m).any()):
        raise RuntimeError("Pivots given to ldl_solve must all satisfy |pivot| <= LD.size(-2). "
                           "Did you properly pass the result of ldl_factor?")
    elif self.op == "lu_unpack":
      if bool(((ipiv < 1) | (ipiv > self.m)).any()):
        raise RuntimeError("pivots passed to lu_unpack must be between 1 and LU.size(-2) inclusive."
                           "Did you properly pass the result of lu_factor?")
    else:
      if bool((ipiv < 1).any()):
        raise RuntimeError("Pivots given to lu_solve must all be greater or equal to 1. "
                           "Did you properly pass the result of lu_factor?")
      if bool((ipiv > self.m).any()):
        raise RuntimeError("Pivots given to lu_solve must all be smaller or equal to LU.size(-2). "
                           "Did you properly pass the result of lu_factor?")
    return ipiv


def _checked_pivots(ctx, ipiv: LT, m: int, op: str) -> LT:
  if ipiv.numel() == 0: return ipiv
  return ctx.host_call(_PivotCheck(m, op), [ipiv], [(ipiv.shape, ipiv.dtype)])[0]


@register(torch.ops.higher_order.with_effects)
def with_effects(ctx, token, op, *args, **kwargs):
  if op is not aten._linalg_check_errors.default: raise Unsupported(f"with_effects of {op}")
  info, api_name = args
  check = _LinalgErrorCheck(api_name, kwargs.get("is_matrix", True))
  return (ctx.host_call(check, [token, info], [(token.shape, token.dtype)])[0], None)


# -------------------------------------------------------------------------------------- lowerings

def _empty_outputs(ctx) -> tuple:
  return tuple(None if v is None else LT.full(tuple(v.shape), 0, ctx.dtype_of(i)) for i, v in enumerate(ctx.vals))


def _info_out(info: LT) -> LT: return info.reshape(info.shape[:-2])


@register(aten.linalg_lu_factor_ex.default)
def linalg_lu_factor_ex(ctx, a, pivot=True, check_errors=False):
  if not pivot or check_errors: raise Unsupported("LU without pivoting / with check_errors")
  _float(a)
  _check_size(*a.shape[-2:])
  if a.numel() == 0: return _empty_outputs(ctx)
  f = lu_factor(a)
  return f.lu, f.pivots_tensor(), _info_out(f.info)


def _unpack(lu: LT, steps: list, m: int, n: int) -> tuple[LT, LT, LT]:
  """(P, L, U) with A = P L U from packed LU [*b, m, n] and its row swaps."""
  k, nd = min(m, n), lu.ndim
  pshape = lu.shape[:-2] + (m, m)
  origin = _mT(_row_origin(steps, pshape))                            # origin[r, c] = the row that ends at c
  p = origin.eq(_rows(m, nd)).cast(lu.dtype)                          # P[r, c] = (origin[c] == r)
  lk = lu.slice(-1, 0, k)
  rows, cols = _rows(m, nd), _cols(k, nd)
  l = (rows > cols).where(lk, rows.eq(cols).cast(lu.dtype))
  uk = lu.slice(-2, 0, k)
  u = (_rows(k, nd) <= _cols(n, nd)).where(uk, 0.0)
  return p, l, u


@register(aten.lu_unpack.default)
def lu_unpack(ctx, lu, ipiv, unpack_data=True, unpack_pivots=True):
  _float(lu)
  m, n = lu.shape[-2:]
  _check_size(m, n)
  if lu.numel() == 0 or ipiv.numel() == 0: return _empty_outputs(ctx)
  if unpack_pivots: ipiv = _checked_pivots(ctx, ipiv, m, "lu_unpack")
  steps = _ipiv_steps(ipiv) if unpack_pivots else []
  p, l, u = _unpack(lu, steps, m, n)
  p = p.broadcast_to(ctx.shape_of(0)) if unpack_pivots else LT.full(ctx.shape_of(0), 0, ctx.dtype_of(0))
  if not unpack_data: l, u = LT.full(ctx.shape_of(1), 0, ctx.dtype_of(1)), LT.full(ctx.shape_of(2), 0, ctx.dtype_of(2))
  return p, l, u


@register(aten.linalg_lu.default)
def linalg_lu(ctx, a, pivot=True):
  if not pivot: raise Unsupported("LU without pivoting")
  _float(a)
  m, n = a.shape[-2:]
  _check_size(m, n)
  if a.numel() == 0: return _empty_outputs(ctx)
  f = lu_factor(a)
  return _unpack(f.lu, f.pivots, m, n)


@register(aten.linalg_lu_solve.default)
def linalg_lu_solve(ctx, lu, ipiv, b, left=True, adjoint=False):
  _float(lu)
  _check_size(lu.shape[-1])
  if lu.numel() == 0 or b.numel() == 0: return LT.full(ctx.shape, 0, ctx.dtype)
  steps = _ipiv_steps(_checked_pivots(ctx, ipiv, lu.shape[-2], "lu_solve"))
  if left: return lu_solve(lu, steps, b, adjoint).broadcast_to(ctx.shape)
  # X A = B  <=>  A^T X^T = B^T
  return _mT(lu_solve(lu, steps, _mT(b), not adjoint)).broadcast_to(ctx.shape)


def _solve_augmented(a: LT, b: LT) -> tuple[LT, LT]:
  """A X = B by Gaussian elimination of [A | B] and back substitution; (X, info)."""
  a, b = _broadcast_batch(a, b)
  f = lu_factor(a, b)
  return solve_triangular(f.lu, f.rhs, upper=True), f.info


@register(aten._linalg_solve_ex.default)
def linalg_solve_ex(ctx, a, b, left=True, check_errors=False):
  if check_errors: raise Unsupported("check_errors")
  _float(a)
  _check_size(a.shape[-1])
  if a.numel() == 0: return _empty_outputs(ctx)
  vector = b.ndim == 1 or (b.ndim == a.ndim - 1 and b.shape == a.shape[:-1])
  bm = b.unsqueeze(-1) if vector else b
  lu = ipiv = None
  if _used_outputs(ctx) & {1, 2} or b.numel() == 0:
    # the factorization of A is an output too (for the backward): solve with it, as eager does
    f = lu_factor(a)
    lu, ipiv, info = f.lu, f.pivots_tensor(), f.info
    if b.numel() == 0: x = LT.full(ctx.shape_of(0), 0, ctx.dtype_of(0))
    else: x = lu_solve(f.lu, f.pivots, bm) if left else _mT(lu_solve(f.lu, f.pivots, _mT(bm), adjoint=True))
  else:
    x, info = _solve_augmented(a, bm) if left else _solve_augmented(_mT(a), _mT(bm))
    if not left: x = _mT(x)
  if vector and x.shape != ctx.shape_of(0): x = x.squeeze_dims((-1,))
  # info is of A broadcast against B's batch dims: A's own are the first entries along those dims
  info, want = _info_out(info), ctx.shape_of(3)
  extra = info.ndim - len(want)
  info = info.shrink([(0, 1)] * extra + [(0, s) for s in want]).reshape(want)
  return x.broadcast_to(ctx.shape_of(0)), lu, ipiv, info


@register(aten.linalg_inv_ex.default)
def linalg_inv_ex(ctx, a, check_errors=False):
  if check_errors: raise Unsupported("check_errors")
  _float(a)
  n = a.shape[-1]
  _check_size(n)
  if a.numel() == 0: return _empty_outputs(ctx)
  x, info = _solve_augmented(a, _eye(n, a.dtype).broadcast_to(a.shape))
  return x, _info_out(info)


def _det_factor(ctx, a: LT) -> Factorization:
  """LU of A, or of A^T where eager takes it (contiguous A: det(A^T) = det(A))."""
  _float(a)
  _check_size(a.shape[-1])
  return lu_factor(_mT(a) if _is_contiguous(ctx.node.args[0]) else a)


def _diag_gather(x: LT) -> LT:
  n, nd = x.shape[-1], x.ndim
  idx = LT.iota(n).reshape((1,) * (nd - 2) + (n,)).broadcast_to(x.shape[:-2] + (n,))
  return x.gather_nd(tuple(range(nd - 2)) + (nd - 2, ("idx", 0)), [idx])


def _perm_sign(steps: list, shape: tuple, dtype) -> LT:
  """(-1)^(number of actual row swaps), at shape"""
  sign = LT.full(shape, 1.0, dtype)
  for j, p in enumerate(steps): sign = p.at(shape).ne(j).where(sign * -1.0, sign)
  return sign


@register(aten._linalg_det.default)
def linalg_det(ctx, a):
  if a.numel() == 0: return (LT.full(ctx.shape_of(0), 1.0, ctx.dtype_of(0)),) + _empty_outputs(ctx)[1:]
  f = _det_factor(ctx, a)
  batch = a.shape[:-2]
  diag = _diag_gather(f.lu)
  det = diag.reduce(Ops.MUL, (diag.ndim - 1,), keepdim=False) * _perm_sign(f.pivots, batch, a.dtype)
  return det, f.lu, f.pivots_tensor()


@register(aten._linalg_slogdet.default)
def linalg_slogdet(ctx, a):
  if a.numel() == 0:
    return (LT.full(ctx.shape_of(0), 1.0, ctx.dtype_of(0)), LT.full(ctx.shape_of(1), 0.0, ctx.dtype_of(1))) + \
           _empty_outputs(ctx)[2:]
  f = _det_factor(ctx, a)
  batch = a.shape[:-2]
  diag = _diag_gather(f.lu)
  last = diag.ndim - 1
  signs = (diag > 0).where(1.0, (diag < 0).where(-1.0, diag.const_like(0.0)))
  sign = signs.reduce(Ops.MUL, (last,), keepdim=False) * _perm_sign(f.pivots, batch, a.dtype)
  logabs = diag.math("abs").log().sum((last,), keepdim=False)
  return sign, logabs, f.lu, f.pivots_tensor()


# -------------------------------------------------------------------------------------- Cholesky

def cholesky(a: LT) -> tuple[LT, LT]:
  """Lower Cholesky factor of a [*b, n, n] from its lower triangle, and info ([*b, 1, 1] int32). Right-
  looking: step j takes the square root of the pivot, scales column j below it by its reciprocal and
  subtracts the column's outer product from the trailing matrix. On a pivot that is not positive (or
  NaN) LAPACK stops: that pivot stays as computed, the columns from there on keep A's values."""
  n, nd = a.shape[-1], a.ndim
  rows, cols = _rows(n, nd), _cols(n, nd)
  x = (rows >= cols).where(a, _mT(a))          # A symmetric from its lower triangle
  info = LT.full(a.shape[:-2] + (1, 1), 0, dtypes.int32)
  failed = LT.full(a.shape[:-2] + (1, 1), 0.0, a.dtype)   # the pivot value that failed
  full = x.shape
  rows, cols = rows.broadcast_to(full), cols.broadcast_to(full)
  for j in range(n):
    d = _entry(x, j, j)
    fails_here = info.eq(0) & (d > 0).logical_not()
    info, failed = fails_here.where(j + 1, info), fails_here.where(d, failed)
    s = d.broadcast_to(full).sqrt()
    col = x.slice(-1, j, j + 1).broadcast_to(full) * s.recip()         # l[r, j], the new column j
    col_t = _mT(x.slice(-1, j, j + 1)).broadcast_to(full) * s.recip()  # l[c, j]
    below = rows > j
    new = (below & (cols > j)).where(x - col * col_t, (below & cols.eq(j)).where(col, x))
    x = (rows.eq(j) & cols.eq(j)).where(s, new).contiguous()
  # after a failure at column f = info - 1: its pivot is the value that failed, the rest is A's
  f = info.eq(0).where(n, info - 1).cast(dtypes.int64)
  out = (cols < f).where(x, a)
  out = (rows.eq(f) & cols.eq(f)).where(failed, out)
  return (rows >= cols).where(out, 0.0), info


@register(aten.linalg_cholesky_ex.default)
def linalg_cholesky_ex(ctx, a, upper=False, check_errors=False):
  if check_errors: raise Unsupported("check_errors")
  _float(a)
  _check_size(a.shape[-1])
  if a.numel() == 0: return _empty_outputs(ctx)
  l, info = cholesky(_mT(a) if upper else a)
  return (_mT(l) if upper else l), _info_out(info)


@register(aten.cholesky.default)
def cholesky_(ctx, a, upper=False):
  _float(a)
  _check_size(a.shape[-1])
  if a.numel() == 0: return LT.full(ctx.shape, 0, ctx.dtype)
  l, info = cholesky(_mT(a) if upper else a)
  out = _mT(l) if upper else l
  # torch.cholesky checks info itself (no with_effects node in the graph): guard the result with the check
  return ctx.host_call(_LinalgErrorCheck("cholesky", a.ndim == 2), [out, _info_out(info)], [(out.shape, out.dtype)])[0]


@register(aten.cholesky_solve.default)
def cholesky_solve(ctx, b, l, upper=False):
  _float(l)
  _check_size(l.shape[-1])
  if ctx.val.numel() == 0: return LT.full(ctx.shape, 0, ctx.dtype)
  l, b = _broadcast_batch(l, b)
  if upper: l = _mT(l)      # A = U^T U = L L^T with L = U^T
  return solve_triangular(_mT(l), solve_triangular(l, b, upper=False), upper=True)


@register(aten.cholesky_inverse.default)
def cholesky_inverse(ctx, l, upper=False):
  _float(l)
  n = l.shape[-1]
  _check_size(n)
  if l.numel() == 0: return LT.full(ctx.shape, 0, ctx.dtype)
  eye = _eye(n, l.dtype).broadcast_to(l.shape)
  if upper:   # A = U^T U: A^-1 = U^-1 U^-T
    ui = solve_triangular(l, eye, upper=True)
    return matmul(ui, _mT(ui))
  li = solve_triangular(l, eye, upper=False)  # A = L L^T: A^-1 = L^-T L^-1
  return matmul(_mT(li), li)


@register(aten.linalg_solve_triangular.default)
def linalg_solve_triangular(ctx, a, b, upper, left=True, unitriangular=False):
  _float(a)
  _check_size(a.shape[-1])
  if ctx.val.numel() == 0: return LT.full(ctx.shape, 0, ctx.dtype)
  a, b = _broadcast_batch(a, b)
  if left: return solve_triangular(a, b, upper, unitriangular)
  return _mT(solve_triangular(_mT(a), _mT(b), not upper, unitriangular))    # X A = B <=> A^T X^T = B^T


@register(aten.triangular_solve.default)
def triangular_solve(ctx, b, a, upper=True, transpose=False, unitriangular=False):
  _float(a)
  _check_size(a.shape[-1])
  if ctx.val[0].numel() == 0: return _empty_outputs(ctx)
  a, b = _broadcast_batch(a, b)
  t, up = (_mT(a), not upper) if transpose else (a, upper)
  return solve_triangular(t, b, up, unitriangular), a


# ----------------------------------------------------------------------------------- LDL^T (sytrf)

LDL_ALPHA = (1 + 17 ** 0.5) / 8   # Bunch-Kaufman's growth bound


def _sym(x: LT, r: LT, c: LT) -> LT:
  """x[r, c] of the symmetric matrix stored in x's lower triangle."""
  return _pick(x, r.maximum(c), r.minimum(c))


def ldl_factor(a: LT) -> tuple[LT, LT, LT]:
  """A = L D L^T with Bunch-Kaufman pivoting as LAPACK's unblocked sytf2 (lower) does it, from A's lower
  triangle: (LD, pivots [*b, n] int32, info [*b, 1, 1] int32). Position k takes a 1x1 pivot (maybe after
  a symmetric interchange) or a 2x2 pivot over columns k, k+1; then position k+1 is skipped. The choice
  differs per batch element, so each position computes both updates and selects with masks."""
  n, nd = a.shape[-1], a.ndim
  full, small = a.shape, a.shape[:-2] + (1, 1)
  rows, cols = _rows(n, nd).broadcast_to(full), _cols(n, nd).broadcast_to(full)
  x = a
  skip = LT.full(small, False, dtypes.bool)       # this position is the second column of a 2x2 pivot
  info = LT.full(small, 0, dtypes.int32)
  decides = []     # per position: its decisions, at any shape
  for k in range(n):
    imax = _pivot_search(x, k, k + 1) if k + 1 < n else None
    if imax is not None:
      # the largest off-diagonal |entry| in row/column imax of the trailing matrix (NaN skipped)
      rshape = a.shape[:-2] + (1, n)
      t, im = _cols(n, nd).broadcast_to(rshape), imax.at(rshape)
      v = _sym(x, im, t).math("abs")
      best = ((t >= k) & t.ne(im) & v.isnan().logical_not()).where(v, -1.0).max((nd - 1,))

    def decide(shape, skip=skip, imax=imax, best=best if imax is not None else None, x=x, k=k):
      """(active, zero column, 2x2 pivot, kp, kk) at shape"""
      const = lambda v: LT.full(shape, v, dtypes.int64)
      absakk = _entry(x, k, k).broadcast_to(shape).math("abs")
      if imax is None: im, colmax, rowmax = const(k), absakk.const_like(0.0), absakk.const_like(0.0)
      else:
        im = imax.at(shape)
        colmax = _pick(x, im, const(k)).math("abs")
        rowmax = best.broadcast_to(shape)
        rowmax = (rowmax < 0).where(float("nan"), rowmax)
      active = skip.broadcast_to(shape).logical_not()
      zero = absakk.maximum(colmax).eq(0) | absakk.isnan()
      keep = zero | (absakk >= colmax * LDL_ALPHA) | (absakk >= colmax * LDL_ALPHA * (colmax / rowmax))
      two = active & keep.logical_not() & (_pick(x, im, im).math("abs") >= rowmax * LDL_ALPHA).logical_not()
      kp = keep.where(const(k), im)
      kk = two.where(const(k + 1), const(k))
      return active, zero, two, kp, kk

    active, zero, two, kp, kk = decide(small)
    info = (info.eq(0) & active & zero).where(k + 1, info)
    next_skip = two

    decides.append(decide)

    # the update, at full shape
    active, zero, two, kp, kk = decide(full)
    moves = active & zero.logical_not()
    tau = lambda v: (moves & v.eq(kk)).where(kp, (moves & v.eq(kp)).where(kk, v))
    y = lambda r, c: _sym(x, tau(r), tau(c))                  # the trailing matrix after the interchange
    K, K1 = LT.full(full, k, dtypes.int64), LT.full(full, min(k + 1, n - 1), dtypes.int64)
    y_rc, y_rk, y_ck, y_kk = y(rows, cols), y(rows, K), y(cols, K), y(K, K)
    # 1x1: column k scaled by 1/d, trailing minus d^-1 x x^T (as dsyr: a + x_i * (-d^-1 x_j))
    d11 = y_kk.recip()
    one = (rows.eq(k) & cols.eq(k)).where(y_kk, (cols.eq(k)).where(y_rk * d11, y_rc + y_rk * ((d11 * -1.0) * y_ck)))
    # 2x2 over columns k, k+1
    y_rk1, y_ck1 = y(rows, K1), y(cols, K1)
    d21 = y(K1, K)
    e11, e22 = y(K1, K1) / d21, y_kk / d21
    d21 = (e11 * e22 - 1.0).recip() / d21
    w = lambda j_k, j_k1: d21 * (e11 * j_k - j_k1)             # wk of row j
    w1 = lambda j_k, j_k1: d21 * (e22 * j_k1 - j_k)            # wkp1 of row j
    pair = (rows <= k + 1) & (cols <= k + 1)
    two_val = pair.where(y_rc, cols.eq(k).where(w(y_rk, y_rk1), cols.eq(k + 1).where(
      w1(y_rk, y_rk1), y_rc - (y_rk * w(y_ck, y_ck1) + y_rk1 * w1(y_ck, y_ck1)))))
    trailing = (rows >= k) & (cols >= k) & (rows >= cols)
    x = (trailing & moves).where(two.where(two_val, one), x).contiguous()
    skip = next_skip
  ld = (rows >= cols).where(x, 0.0)
  shape = a.shape[:-2] + (1, n)
  pos = _cols(n, nd)
  piv = LT.full(shape, 0, dtypes.int64)
  for k, decide in enumerate(decides):
    active, _, _, _, _ = decide(shape)
    code = _ipiv_code(decide, shape)    # a skipped position repeats the 2x2 code of the one before
    piv = pos.eq(k).where(active.where(code, _ipiv_code(decides[k - 1], shape)) if k else code, piv)
  return ld, piv.cast(dtypes.int32).reshape(a.shape[:-2] + (n,)), info


def _ipiv_code(decide, shape) -> LT:
  """LAPACK's ipiv entry of a position: kp + 1, or -(kp + 1) for both columns of a 2x2 pivot."""
  _, _, two, kp, _ = decide(shape)
  return two.where((kp + 1) * -1, kp + 1)


@register(aten.linalg_ldl_factor_ex.default)
def linalg_ldl_factor_ex(ctx, a, hermitian=False, check_errors=False):
  if check_errors: raise Unsupported("check_errors")
  _float(a)
  _check_size(a.shape[-1])
  if a.numel() == 0: return _empty_outputs(ctx)
  ld, piv, info = ldl_factor(a)
  return ld, piv, _info_out(info)


def ldl_solve(ld: LT, ipiv: LT, b: LT) -> LT:
  """A X = B from sytrf's lower factorization (LD, ipiv), as LAPACK's sytrs: L D Y = B forward, then
  L^T X = Y backward, with ipiv's interchanges where sytrs makes them. Which positions pair into 2x2
  blocks follows from ipiv's signs, scanned from the top; each position is one kernel."""
  ld, b = _broadcast_batch(ld, b)
  ipiv = ipiv.broadcast_to(ld.shape[:-1])
  n, nd, full = ld.shape[-1], b.ndim, b.shape
  rows = _rows(n, nd).broadcast_to(full)
  code = [ipiv.slice(-1, k, k + 1).reshape(ld.shape[:-2] + (1, 1)).broadcast_to(full).cast(dtypes.int64) for k in range(n)]
  first = []                 # position k starts a 2x2 block (k, k+1)
  for k in range(n):
    second = first[k - 1] if k else LT.full(full, False, dtypes.bool)
    first.append(second.logical_not() & (code[k] < 0))
  row = lambda x, r: x.slice(-2, r, r + 1).broadcast_to(full)
  ent = lambda r, c: _entry(ld, r, c).broadcast_to(full)
  swap = lambda x, i, kp, on: x.gather_nd(tuple(range(nd - 2)) + (("idx", 0), nd - 1),
                                          [(on & rows.eq(i)).where(kp, (on & rows.eq(kp)).where(i, rows))])
  x = b
  for k in range(n):   # L D Y = B
    second = first[k - 1] if k else LT.full(full, False, dtypes.bool)
    one, two = second.logical_not() & first[k].logical_not(), first[k]
    kp = (code[k] < 0).where(code[k] * -1, code[k]) - 1
    k1 = min(k + 1, n - 1)
    s = swap(x, k, kp, one)
    s = swap(s, k1, kp, two) if k + 1 < n else s
    bk, bk1 = row(s, k), row(s, k1)
    # 1x1: rows below minus L[r, k] y_k, then y_k / d
    new1 = rows.eq(k).where(bk * ent(k, k).recip(), (rows > k).where(s - _col(ld, k, full) * bk, s))
    # 2x2: rows below k+1 minus both columns, then the 2x2 block solved as sytrs does
    below = (rows > k1).where(s - _col(ld, k, full) * bk - _col(ld, k1, full) * bk1, s)
    akm1k = ent(k1, k)
    akm1, ak = ent(k, k) / akm1k, ent(k1, k1) / akm1k
    denom = akm1 * ak - 1.0
    bkm1, bkk = bk / akm1k, bk1 / akm1k
    new2 = rows.eq(k).where((ak * bkm1 - bkk) / denom, rows.eq(k1).where((akm1 * bkk - bkm1) / denom, below))
    x = one.where(new1, two.where(new2, s)).contiguous()
  for k in reversed(range(n)):   # L^T X = Y
    second = first[k - 1] if k else LT.full(full, False, dtypes.bool)
    one, two = second.logical_not() & first[k].logical_not(), second
    km1 = max(k - 1, 0)
    dot_k, dot_km1 = None, None
    for r in range(k + 1, n):   # as gemv: the dot product first, then subtracted
      term_k, term_km1 = ent(r, k) * row(x, r), ent(r, km1) * row(x, r)
      dot_k = term_k if dot_k is None else dot_k + term_k
      dot_km1 = term_km1 if dot_km1 is None else dot_km1 + term_km1
    upd = x if dot_k is None else ((one | two) & rows.eq(k)).where(x - dot_k, (two & rows.eq(km1)).where(x - dot_km1, x))
    kp = (code[k] < 0).where(code[k] * -1, code[k]) - 1
    x = swap(upd, k, kp, one | two).contiguous()
  return x


def _col(x: LT, c: int, full: tuple) -> LT:
  """x[..., :, c] broadcast to full"""
  return x.slice(-1, c, c + 1).broadcast_to(full)


@register(aten.linalg_ldl_solve.default)
def linalg_ldl_solve(ctx, ld, ipiv, b, hermitian=False):
  _float(ld)
  _check_size(ld.shape[-1])
  if ctx.val.numel() == 0: return LT.full(ctx.shape, 0, ctx.dtype)
  return ldl_solve(ld, _checked_pivots(ctx, ipiv, ld.shape[-2], "ldl_solve"), b).broadcast_to(ctx.shape)
