"""Orthogonal factorizations and spectral linear algebra, unrolled at the tensor level.

QR is Householder QR with LAPACK's conventions (geqrf's `v[0] = 1`, `beta = -sign(alpha) * norm`,
`tau = 0` when the column below the diagonal is zero), so Q and R come out with LAPACK's signs.
`householder_product` and `ormqr` apply the stored reflectors one at a time.

Singular values come from one-sided (Hestenes) Jacobi: the columns of `[A; I]` are rotated in pairs
until the top block's columns are orthogonal; their norms are the singular values and the bottom
block is V. The pairs of a step are a round of the circle-method tournament on the N columns, so
one sweep is `N - 1` steps, each two kernels (the rotation tangents, then the rotated columns). The
sweep count is fixed per dtype and size, with a margin over what random, graded and clustered
spectra need. Eigenvalues of a symmetric matrix are the singular values of `A + cI` (c = the
inf-norm, which makes it positive semidefinite), minus c. Every input is first divided by a power
of two near its largest entry (exact), so no sum of squares overflows or underflows.

Singular and eigen vectors have a sign freedom whose LAPACK choice cannot be reproduced, so
`_linalg_svd` / `_linalg_eigh` are native only when no graph user reads the vectors; `linalg_pinv`
(invariant to the signs) is lowered whole. Sizes above MAX_JACOBI_N / MAX_QR_K fall back (compile
time). Non-finite inputs to svd/eigh/pinv, where eager raises, give NaN here.
"""
from __future__ import annotations
import math
import torch
from torch_uop.core.dtypes import dtypes
from torch_uop.core.uop import Ops
from torch_uop.lowering.registry import register, Unsupported
from torch_uop.lowering.tensor import LT

aten = torch.ops.aten

MAX_QR_K = 16          # reflectors per factorization (3 kernels each, and 2-3 more to form Q)
MAX_JACOBI_N = 8       # min(m, n) for the Jacobi sweeps (2 kernels per step, N - 1 steps per sweep)


def _check_real(*xs):
  for x in xs:
    if x is not None and x.dtype not in (dtypes.float32, dtypes.float64): raise Unsupported(f"dtype {x.dtype}")


def _index(n: int, axis: int, ndim: int) -> LT:
  """iota(n) shaped to broadcast along `axis` of an ndim-d tensor."""
  shape = [1] * ndim
  shape[axis] = n
  return LT.iota(n).reshape(tuple(shape))


def _eye(rows: int, cols: int, dtype) -> LT:
  return _index(rows, 0, 2).eq(_index(cols, 1, 2)).where(LT.full((rows, cols), 1, dtype), 0)


def _cat(xs: list, dim: int) -> LT:
  dim %= xs[0].ndim
  total, offset, out = sum(x.shape[dim] for x in xs), 0, None
  for x in xs:
    pads = [(0, 0)] * x.ndim
    pads[dim] = (offset, total - offset - x.shape[dim])
    piece = x.pad(pads)
    out = piece if out is None else out + piece
    offset += x.shape[dim]
  return out


def _col(x: LT, j: int) -> LT: return x.slice(-1, j, j + 1)


def _power_of_two_scale(a: LT) -> LT:
  """2^e of the largest finite |entry| per matrix (*b, 1, 1), 1 for a zero matrix. Dividing by it is exact and keeps
  the squares the algorithms sum far from overflow and underflow, as LAPACK's scaled norms do."""
  mag = a.math("abs")
  big = (mag < math.inf).where(mag, 0).max((-2, -1))     # NaN and Inf left out: they spread as they would
  ints, mask = (dtypes.int32, 0x7F800000) if a.dtype == dtypes.float32 else (dtypes.int64, 0x7FF0000000000000)
  scale = (big.bitcast(ints) & LT.full(big.shape, mask, ints)).bitcast(a.dtype)
  return (big.eq(0) | scale.eq(0)).where(1.0, scale).contiguous()


# ---------------------------------------------------------------- Householder QR

def _reflector(a: LT, j: int):
  """LAPACK's larfg for column j of a (*b, m, n), from row j down: (v, tau, beta), each at a's full shape
  (computed per element from a and one realized reduction, so no scalar gets a kernel of its own)."""
  full, row = a.shape, _index(a.shape[-2], -2, a.ndim)
  x = _col(a, j)
  below = row > j
  xnorm2 = below.where(x * x, 0).sum((-2,)).contiguous().broadcast_to(full)
  alpha, x = x.slice(-2, j, j + 1).broadcast_to(full), x.broadcast_to(full)
  norm = (alpha * alpha + xnorm2).sqrt()
  plain = xnorm2.eq(0)                                   # nothing to annihilate: H = I, beta = alpha
  beta = plain.where(alpha, (alpha < 0).where(norm, -norm))
  tau = plain.where(0, (beta - alpha) / beta)
  scale = plain.where(0, (alpha - beta).recip())
  v = row.eq(j).where(x.const_like(1), below.where(x * scale, 0))
  return v, tau, beta


def _geqrf(a: LT):
  """(*b, m, n) -> (packed R and reflectors, [tau_j (*b, 1, 1)]); three kernels per reflector."""
  m, n = a.shape[-2:]
  k = min(m, n)
  if k > MAX_QR_K: raise Unsupported(f"QR with {k} reflectors")
  row, col = _index(m, -2, a.ndim), _index(n, -1, a.ndim)
  scale = _power_of_two_scale(a)
  a = a / scale                    # exact: v and tau do not change, R is scaled back below
  taus = []
  for j in range(k):
    v, tau, beta = _reflector(a, j)
    w = (v * a).sum((-2,))                               # (*b, 1, n)
    updated = a - tau * v * w
    packed = row.eq(j).where(beta, (row > j).where(v, a))
    taus.append(tau.slice(-2, 0, 1).slice(-1, 0, 1))
    # like LAPACK, touch only a[j:, j+1:] (so a NaN spreads no further than there)
    a = ((col > j) & (row >= j)).where(updated, col.eq(j).where(packed, a)).contiguous()
  return (row <= col).where(a * scale, a).contiguous(), taus


def _reflector_vector(vs: LT, j: int) -> LT:
  """The j-th stored reflector (*b, m, 1) of a packed (*b, m, k) matrix: 1 at row j, zeros above."""
  x = _col(vs, j)
  row = _index(x.shape[-2], -2, x.ndim)
  return row.eq(j).where(x.const_like(1), (row > j).where(x, 0))


def _apply_reflectors(vs: LT, taus: list, c: LT, left: bool, transpose: bool, from_identity: bool = False) -> LT:
  """Q @ c, Q^T @ c, c @ Q or c @ Q^T for Q = H_0 H_1 ... H_{k-1}, H_j = I - tau_j v_j v_j^T.
  As LAPACK, H_j touches only the rows (columns, on the right) from j on, and when c starts as the identity
  (forming Q) only the columns from j on: the others are exactly unchanged, so a NaN spreads as in LAPACK."""
  order = range(len(taus))
  if left != transpose: order = reversed(order)       # Q c and c Q^T apply the last reflector first
  row, col = _index(c.shape[-2], -2, c.ndim), _index(c.shape[-1], -1, c.ndim)
  for j in order:
    v = _reflector_vector(vs, j)
    if left:
      updated = c - taus[j] * v * (v * c).sum((-2,))
      touched = (row >= j) & (col >= j) if from_identity else row >= j
    else:
      vr = v.transpose(-1, -2)
      updated = c - taus[j] * (c * vr).sum((-1,)) * vr
      touched = col >= j
    c = touched.where(updated, c).contiguous()
  return c


def _tau_list(tau: LT) -> list:
  return [tau.slice(-1, j, j + 1).unsqueeze(-1) for j in range(tau.shape[-1])]


def _batch_eye(batch, rows, cols, dtype) -> LT:
  return _eye(rows, cols, dtype).broadcast_to((*batch, rows, cols))


@register(aten.geqrf.default)
def geqrf(ctx, a):
  _check_real(a)
  packed, taus = _geqrf(a)
  if not taus: return packed, LT.full(ctx.shape_of(1), 0, ctx.dtype_of(1))
  return packed, _cat(taus, -1).reshape(ctx.shape_of(1))


@register(aten.linalg_qr.default)
def linalg_qr(ctx, a, mode="reduced"):
  _check_real(a)
  m, n = a.shape[-2:]
  k = min(m, n)
  packed, taus = _geqrf(a)
  row, col = _index(m, -2, a.ndim), _index(n, -1, a.ndim)
  r = (row <= col).where(packed, 0)
  r_rows = m if mode == "complete" else k
  r = r.slice(-2, 0, r_rows)
  if mode == "r": return LT.full(ctx.shape_of(0), 0, ctx.dtype_of(0)), r
  q_cols = m if mode == "complete" else k
  q = _apply_reflectors(packed, taus, _batch_eye(a.shape[:-2], m, q_cols, a.dtype), left=True, transpose=False,
                        from_identity=True)
  return q, r


@register(aten.linalg_householder_product.default)
def householder_product(ctx, vs, tau):
  _check_real(vs, tau)
  m, n = vs.shape[-2:]
  if tau.shape[-1] > MAX_QR_K: raise Unsupported("too many reflectors")
  return _apply_reflectors(vs, _tau_list(tau), _batch_eye(ctx.shape[:-2], m, n, vs.dtype), left=True, transpose=False,
                           from_identity=True)


@register(aten.ormqr.default)
def ormqr(ctx, vs, tau, c, left=True, transpose=False):
  _check_real(vs, tau, c)
  if tau.shape[-1] > MAX_QR_K: raise Unsupported("too many reflectors")
  return _apply_reflectors(vs, _tau_list(tau), c, left, transpose)


# ---------------------------------------------------------------- one-sided Jacobi

def _sweeps(n_slots: int, dtype) -> int:
  # measured need (random, graded, clustered spectra): f32 <= 5 sweeps at n=16, f64 <= 6; margin of 3
  return math.ceil(math.log2(max(n_slots, 2))) + (4 if dtype == dtypes.float32 else 5)


def _partners(n_slots: int, rnd: int) -> LT:
  """Round `rnd` of the circle-method tournament on n_slots (even) players: each slot's partner (int64, (n_slots,)).
  Player L = n_slots - 1 sits still; the others pair as s + u = rnd (mod L), the one left over with L."""
  last = n_slots - 1
  s = LT.iota(n_slots)
  u = (s.const_like(rnd + last) - s).alu(Ops.MOD, last)
  alone = (rnd * ((last + 1) // 2)) % last if last > 1 else 0  # s with 2s = rnd (mod L)
  return s.eq(last).where(s.const_like(alone), u.eq(s).where(s.const_like(last), u))


def _jacobi_step(w: LT, m: int, rnd: int) -> LT:
  """Rotate every slot pair of w (*b, R, N), as round `rnd` pairs them, so that the top m rows of each pair
  are orthogonal. Each slot computes its pair's rotation itself (seen from its side: t flips sign), so the
  step is two kernels: the tangents (three fused reductions), then the rotation of every row."""
  n_slots = w.shape[-1]
  partner_of = _partners(n_slots, rnd)
  partner = w.gather(-1, partner_of.broadcast_to(w.shape))
  top, ptop = w.slice(-2, 0, m), partner.slice(-2, 0, m)
  a_s, a_u, gamma = (top * top).sum((-2,)), (ptop * ptop).sum((-2,)), (top * ptop).sum((-2,))   # (*b, 1, N)
  zeta = (a_u - a_s) / (gamma * 2)
  first = LT.iota(n_slots) < partner_of
  sign = (zeta < 0).where(-1.0, (zeta > 0).where(1.0, first.where(1.0, zeta.const_like(-1.0))))
  t = sign / (zeta.math("abs") + (zeta * zeta + 1).sqrt())   # zeta = +-inf or overflowing gives t = 0: no rotation
  t = gamma.eq(0).where(0, t).contiguous().broadcast_to(w.shape)
  c = (t * t + 1).sqrt().recip()   # per element of the rotation kernel: one kernel fewer than a broadcast c
  return (c * (w - t * partner)).contiguous()


def _hestenes(a: LT):
  """a (*b, m, n), n <= m -> (w = U * sigma (*b, m, N), v (*b, N, N), sigma (*b, N), pad slot or None).
  N = n rounded up to even; the padding column (slot n) is zero and never rotated."""
  *batch, m, n = a.shape
  if n > MAX_JACOBI_N: raise Unsupported(f"Jacobi SVD of size {n}")
  n_slots = n + n % 2
  lead = [(0, 0)] * len(batch)
  w = a.pad(lead + [(0, n_slots), (0, n_slots - n)]) + _batch_eye(batch, n_slots, n_slots, a.dtype).pad(lead + [(m, 0), (0, 0)])
  for step in range(_sweeps(n_slots, a.dtype) * (n_slots - 1)): w = _jacobi_step(w, m, step % (n_slots - 1))
  top = w.slice(-2, 0, m)
  sigma = (top * top).sum((-2,), keepdim=False).sqrt()
  return top, w.slice(-2, m, m + n_slots), sigma, (n if n_slots != n else None)


def _sorted(x: LT, descending: bool) -> LT:
  """Sort the last axis (small) by ranks: out[k] = the x_i with rank k; ties keep index order."""
  n = x.shape[-1]
  xi, xj = x.unsqueeze(-1), x.unsqueeze(-2)                   # (*b, n, 1) vs (*b, 1, n)
  i, j = _index(n, -2, x.ndim + 1), _index(n, -1, x.ndim + 1)
  before = (xj > xi) if descending else (xj < xi)
  rank = (before | (xj.eq(xi) & (j < i))).cast(dtypes.int64).sum((-1,))   # (*b, n, 1)
  return rank.eq(j).where(xi, 0).sum((-2,), keepdim=False)                 # (*b, n)


def _mask_slot(x: LT, slot, value) -> LT:
  if slot is None: return x
  return _index(x.shape[-1], -1, x.ndim).eq(slot).where(value, x)


def _non_finite_to_nan(a: LT, out: LT) -> LT:
  """Eager raises on non-finite input; the compiled graph cannot, so it answers NaN."""
  bad = (a - a).ne(0).cast(dtypes.int64).sum((-2, -1))        # inf - inf and NaN are NaN
  while bad.ndim > out.ndim: bad = bad.squeeze_dims((-1,))
  while bad.ndim < out.ndim: bad = bad.unsqueeze(-1)
  return bad.ne(0).where(math.nan, out)


def _svdvals(a: LT) -> LT:
  if a.shape[-2] < a.shape[-1]: a = a.transpose(-1, -2)
  k = a.shape[-1]
  scale = _power_of_two_scale(a)
  _, _, sigma, pad = _hestenes(a / scale)
  return _sorted(_mask_slot(sigma, pad, -1.0), descending=True).slice(-1, 0, k) * scale.squeeze_dims((-1,))


def _eigvalsh(a: LT, uplo: str) -> LT:
  scale = _power_of_two_scale(a)
  s = _symmetric_from(a / scale, uplo)
  n = s.shape[-1]
  shift = s.math("abs").sum((-1,)).max((-2,))                    # (*b, 1, 1) inf-norm >= spectral radius
  b = s + _eye(n, n, s.dtype) * shift
  _, _, sigma, pad = _hestenes(b)
  vals = sigma - shift.squeeze_dims((-1,))
  return _sorted(_mask_slot(vals, pad, math.inf), descending=False).slice(-1, 0, n) * scale.squeeze_dims((-1,))


def _symmetric_from(a: LT, uplo: str) -> LT:
  n = a.shape[-1]
  row, col = _index(n, -2, a.ndim), _index(n, -1, a.ndim)
  tri = (row >= col) if uplo.upper() == "L" else (row <= col)
  return tri.where(a, a.transpose(-1, -2))


def _only_output_used(ctx, index: int) -> bool:
  import operator
  return all(u.target is operator.getitem and u.args[1] == index for u in ctx.node.users)


@register(aten._linalg_svd.default)
def linalg_svd(ctx, a, full_matrices=False, compute_uv=True, driver=None):
  _check_real(a)
  if compute_uv and not _only_output_used(ctx, 1): raise Unsupported("singular vectors: LAPACK's signs are not reproducible")
  empty = [LT.full(ctx.shape_of(i), 0, ctx.dtype_of(i)) for i in range(3)]
  if a.numel() == 0: return tuple(empty)
  return empty[0], _non_finite_to_nan(a, _svdvals(a)), empty[2]


@register(aten._linalg_eigh.default)
def linalg_eigh(ctx, a, uplo="L", compute_v=True):
  _check_real(a)
  if compute_v and not _only_output_used(ctx, 0): raise Unsupported("eigenvectors: LAPACK's signs are not reproducible")
  empty = [LT.full(ctx.shape_of(i), 0, ctx.dtype_of(i)) for i in range(2)]
  if a.numel() == 0: return tuple(empty)
  return _non_finite_to_nan(a, _eigvalsh(a, uplo)), empty[1]


@register(aten.linalg_pinv.atol_rtol_tensor, aten.linalg_pinv.atol_rtol_float)
def linalg_pinv(ctx, a, atol=None, rtol=None, hermitian=False):
  """pinv(A) = sum over singular triplets with sigma > max(atol, rtol * sigma_max) of v u^T / sigma; with
  hermitian the same from the symmetric matrix eigh would read (the lower triangle)."""
  _check_real(a)
  if a.numel() == 0: return LT.full(ctx.shape, 0, ctx.dtype)
  if hermitian: a = _symmetric_from(a, "L")
  wide = a.shape[-2] < a.shape[-1]
  if wide: a = a.transpose(-1, -2)
  m, n = a.shape[-2:]
  scale = _power_of_two_scale(a)                                # pinv(a) = pinv(a / scale) / scale
  w, v, sigma, _ = _hestenes(a / scale)                         # w = U sigma: pinv = V diag(1/sigma^2) w^T
  eps = 1.1920928955078125e-07 if a.dtype == dtypes.float32 else 2.220446049250313e-16
  default_rtol = eps * max(m, n)
  batch = sigma.shape[:-1]
  def as_batch(t) -> LT:
    t = t if isinstance(t, LT) else LT.full((), float(t), a.dtype)
    return t.cast(a.dtype).broadcast_to(batch).unsqueeze(-1)
  zero = LT.full((*batch, 1), 0, a.dtype)
  atol_b = as_batch(atol) if atol is not None else zero
  if rtol is not None: rtol_b = as_batch(rtol)
  elif atol is not None: rtol_b = (atol_b > 0).where(0, zero.const_like(default_rtol))
  else: rtol_b = zero.const_like(default_rtol)
  true_sigma = sigma * scale.squeeze_dims((-1,))
  tol = atol_b.maximum(rtol_b * true_sigma.max((-1,)))
  inv_sq = (true_sigma > tol).where((sigma * sigma).recip(), 0)   # (*b, N)
  vs = v * inv_sq.unsqueeze(-2)                                  # (*b, N, N)
  full = (*batch, n, m, v.shape[-1])
  out = (vs.slice(-2, 0, n).unsqueeze(-2).broadcast_to(full) * w.unsqueeze(-3).broadcast_to(full)).sum((-1,), keepdim=False)
  out = out / scale
  if wide: out = out.transpose(-1, -2)
  return _non_finite_to_nan(a, out).cast(ctx.dtype)
