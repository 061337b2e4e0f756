"""Assorted lowerings: _trilinear (bilinear), tril/triu_indices, nonzero_static, mode, segment_reduce,
as_strided_scatter, grid_sampler_3d, embedding_bag and embedding_renorm, histogram/histogramdd, the
chunked linear_cross_entropy custom ops, and the antialiased bilinear resize.

Each is written with counting or masked reductions over an extra axis (no scatters, no data-dependent
shapes): the k-th nonzero is found by counting prefix sums, a value's bin by counting the edges below it,
a bag's or segment's members by comparing positions with its bounds. These grids are O(n * m), so inputs
past MAX_COUNT_GRID fall back; so do cases whose eager result depends on its algorithm's own tie order.
"""
from __future__ import annotations
import math
import torch
from torch_uop.core.uop import Ops
from torch_uop.core.dtypes import dtypes
from torch_uop.lowering.registry import register, Unsupported
from torch_uop.lowering.tensor import LT, compute_dtype
from torch_uop.lowering.linalg import matmul

aten = torch.ops.aten

# the largest [a, b] counting grid a lowering here builds; beyond it the node falls back
MAX_COUNT_GRID = 1 << 24


def _grid_ok(*sizes) -> None:
  if math.prod(sizes) > MAX_COUNT_GRID: raise Unsupported(f"counting grid {sizes} too large")


@register(aten._trilinear.default)
def trilinear(ctx, i1, i2, i3, expand1, expand2, expand3, sumdim, unroll_dim=1):
  """Each input unsqueezed at its expand dims, the three multiplied, summed over sumdim."""
  acc = compute_dtype(ctx.dtype)
  def expanded(x, dims):
    for d in sorted(dims): x = x.unsqueeze(d)
    return x.cast(acc)
  a, b, c = expanded(i1, expand1), expanded(i2, expand2), expanded(i3, expand3)
  prod = a * b * c
  if not sumdim: return prod.cast(ctx.dtype)
  return prod.sum(tuple(sumdim), keepdim=False).cast(ctx.dtype)


@register(aten.tril_indices.default, aten.triu_indices.default)
def tri_indices(ctx, row, col, offset=0, **kwargs):
  """[2, N] coordinates of the lower (upper) triangle in row-major order. Row r holds the columns
  [start(r), start(r) + count(r)); entry k lies in the row r = #{rows that end at or before k}."""
  lower = ctx.node.target is aten.tril_indices.default
  n = ctx.shape[1]
  if n == 0 or row == 0: return LT.full(ctx.shape, 0, ctx.dtype)
  _grid_ok(row, row)
  _grid_ok(n, row)
  r = LT.iota(row)
  start = LT.full((row,), 0, dtypes.int64) if lower else (r + offset).maximum(0).minimum(col)
  end = (r + offset + 1).maximum(0).minimum(col) if lower else LT.full((row,), col, dtypes.int64)
  count = end - start                                                           # [row]
  jj = LT.iota(row).reshape((1, row)).broadcast_to((row, row))
  ii = LT.iota(row).reshape((row, 1)).broadcast_to((row, row))
  row_end = (jj <= ii).where(count.reshape((1, row)).broadcast_to((row, row)), 0).sum((1,), keepdim=False)   # [row] inclusive prefix
  k = LT.iota(n).reshape((n, 1)).broadcast_to((n, row))
  done = row_end.reshape((1, row)).broadcast_to((n, row)) <= k                  # rows wholly before entry k
  rows = done.cast(dtypes.int64).sum((1,), keepdim=False)                       # [n]
  before = done.where(count.reshape((1, row)).broadcast_to((n, row)), 0).sum((1,), keepdim=False)
  row_start = (rows + offset).maximum(0) if not lower else rows.const_like(0)
  cols = LT.iota(n) - before + row_start
  which = LT.iota(2).reshape((2, 1)).broadcast_to((2, n))
  out = which.eq(0).where(rows.reshape((1, n)).broadcast_to((2, n)), cols.reshape((1, n)).broadcast_to((2, n)))
  return out.cast(ctx.dtype)


@register(aten.nonzero_static.default)
def nonzero_static(ctx, x, *, size, fill_value=-1):
  """The first `size` nonzero coordinates in row-major order, rows past the count filled with fill_value.
  The flat position of the k-th nonzero is the number of elements whose inclusive nonzero count is <= k."""
  shape = ctx.shape
  if math.prod(shape) == 0: return LT.full(shape, 0, ctx.dtype)
  n = x.numel()
  if n == 0: return LT.full(shape, fill_value, ctx.dtype)
  _grid_ok(n, n)
  _grid_ok(size, n)
  nz = x.reshape((n,)).ne(0).cast(dtypes.int64)
  jj = LT.iota(n).reshape((1, n)).broadcast_to((n, n))
  ii = LT.iota(n).reshape((n, 1)).broadcast_to((n, n))
  seen = (jj <= ii).where(nz.reshape((1, n)).broadcast_to((n, n)), 0).sum((1,), keepdim=False)         # [n]
  k = LT.iota(size).reshape((size, 1)).broadcast_to((size, n))
  pos = (seen.reshape((1, n)).broadcast_to((size, n)) <= k).cast(dtypes.int64).sum((1,), keepdim=False)   # [size]
  valid = pos < n
  dims = x.shape
  cols = []
  for d in range(len(dims)):
    inner = math.prod(dims[d + 1:])
    coord = pos.alu(Ops.IDIV, pos.const_like(inner)).alu(Ops.MOD, pos.const_like(dims[d]))
    cols.append(valid.where(coord, pos.const_like(fill_value)).reshape((size, 1)))
  which = LT.iota(len(dims)).reshape((1, len(dims))).broadcast_to(shape)
  out = cols[-1].broadcast_to(shape)
  for d in reversed(range(len(dims) - 1)): out = which.eq(d).where(cols[d].broadcast_to(shape), out)
  return out.cast(ctx.dtype)


# eager's CPU mode sorts (value, index) pairs with std::sort: up to 16 elements that is an insertion
# sort, stable for a strict order; with NaNs (no strict order) or longer rows its order is its own
MODE_MAX_LEN = 16


@register(aten.mode.default)
def mode(ctx, x, dim=-1, keepdim=False):
  """The smallest of the most frequent values along dim and the last index holding it (eager's scan of
  the stably sorted row). Floats fall back: a NaN anywhere changes eager's sort order."""
  if x.ndim == 0: return x, LT.full((), 0, dtypes.int64)
  dim %= x.ndim
  n = x.shape[dim]
  if x.dtype.is_float: raise Unsupported("mode of floats: eager's order with NaNs is its sort's own")
  if n > MODE_MAX_LEN: raise Unsupported(f"mode over {n} > {MODE_MAX_LEN} elements: eager's tie order is introsort's")
  if x.numel() == 0: return LT.full(ctx.shape_of(0), 0, ctx.dtype_of(0)), LT.full(ctx.shape_of(1), 0, dtypes.int64)
  acc = dtypes.int32 if x.dtype.is_bool else x.dtype
  v = x.cast(acc).transpose(dim, x.ndim - 1)                        # [.., n]
  lead = v.shape[:-1]
  full = (*lead, n, n)                                              # [.., i, j]
  a = v.reshape((*lead, n, 1)).broadcast_to(full)
  b = v.reshape((*lead, 1, n)).broadcast_to(full)
  count = a.eq(b).cast(dtypes.int64).sum((len(lead) + 1,), keepdim=False)        # [.., n]
  best = count.max((len(lead),), keepdim=True)
  cand = count.eq(best.broadcast_to(count.shape))
  smallest = cand.where(v, acc.max()).reduce(Ops.MIN, (len(lead),), True)
  hit = cand & v.eq(smallest.broadcast_to(v.shape))
  idx = hit.where(LT.iota(n).reshape((1,) * len(lead) + (n,)).broadcast_to(v.shape), -1).max((len(lead),), keepdim=True)
  vals, idx = smallest.cast(x.dtype).transpose(dim, x.ndim - 1), idx.transpose(dim, x.ndim - 1)
  if not keepdim: vals, idx = vals.squeeze_dims((dim,)), idx.squeeze_dims((dim,))
  return vals, idx


@register(aten.segment_reduce.default)
def segment_reduce(ctx, data, reduce, *, lengths=None, indices=None, offsets=None, axis=0, unsafe=False, initial=None):
  """Reduce each segment [start, end) of data along axis, segments given by lengths or offsets (batched
  over the leading dims of data before axis). An empty segment gives `initial`, or the reduction's
  identity (NaN for mean). Lengths that do not cover the data are not checked (eager raises)."""
  if indices is not None or (lengths is None) == (offsets is None): raise Unsupported("segment_reduce by indices")
  axis %= data.ndim
  acc = compute_dtype(ctx.dtype)
  if lengths is not None:
    s = lengths.shape[-1]
    ln = lengths.cast(dtypes.int64)
    tri = (LT.iota(s).reshape((1, s)).broadcast_to((s, s)) <= LT.iota(s).reshape((s, 1)).broadcast_to((s, s)))
    ends = tri.reshape((1,) * (ln.ndim - 1) + (s, s)).broadcast_to((*ln.shape[:-1], s, s)).where(
      ln.unsqueeze(-2).broadcast_to((*ln.shape[:-1], s, s)), 0).sum((-1,), keepdim=False)
    starts = ends - ln
  else:
    s = offsets.shape[-1] - 1
    off = offsets.cast(dtypes.int64)
    starts, ends = off.slice(-1, 0, s), off.slice(-1, 1, s + 1)
  n = data.shape[axis]
  lead, rest = data.shape[:axis], data.shape[axis + 1:]
  if tuple(starts.shape[:-1]) != tuple(lead): raise Unsupported("segment lengths batched differently from data")
  _grid_ok(math.prod(lead), s, n, math.prod(rest))
  full = (*lead, s, n, *rest)
  def seg(t): return t.reshape((*lead, s, 1) + (1,) * len(rest)).broadcast_to(full)
  pos = LT.iota(n).reshape((1,) * len(lead) + (1, n) + (1,) * len(rest)).broadcast_to(full)
  inside = (seg(starts) <= pos) & (pos < seg(ends))
  x = data.cast(acc).unsqueeze(axis).broadcast_to(full)
  count = (ends - starts).cast(acc).reshape((*lead, s) + (1,) * len(rest)).broadcast_to(ctx.shape)
  if reduce in ("sum", "mean"): out = inside.where(x, 0.0).sum((axis + 1,), keepdim=False)
  elif reduce == "prod": out = inside.where(x, 1.0).reduce(Ops.MUL, (axis + 1,), False)
  elif reduce in ("max", "min"):
    op, empty = (Ops.MAX, -math.inf) if reduce == "max" else (Ops.MIN, math.inf)
    out = inside.where(x, empty).reduce(op, (axis + 1,), False)
    has_nan = (inside & x.isnan()).reduce(Ops.MAX, (axis + 1,), False)     # NaN wins, as eager's scan
    out = has_nan.where(out.const_like(math.nan), out)
  else: raise Unsupported(f"segment_reduce {reduce}")
  if initial is not None:
    init = out.const_like(float(initial))
    if reduce in ("sum", "mean"): out = out + init
    elif reduce == "prod": out = out * init
    else:
      nan = out.isnan()
      out = nan.where(out, out.maximum(init) if reduce == "max" else out.minimum(init))
  if reduce == "mean":
    empty_val = out.const_like(float(initial) if initial is not None else math.nan)
    out = count.eq(0).where(empty_val, out / count)
  return out.cast(ctx.dtype)


@register(aten.as_strided_scatter.default)
def as_strided_scatter(ctx, x, src, size, stride, storage_offset=None):
  """A copy of x (contiguous, storage offset 0, as eager's clone) with the strided window replaced by src.
  Each output element takes the src element that lands on it, found by matching window offsets; the
  window is known at compile time, so overlapping or out-of-range windows fall back."""
  val = ctx.node.args[0].meta.get("val")
  if not isinstance(val, torch.Tensor) or not val.is_contiguous(): raise Unsupported("as_strided_scatter into a non-contiguous input")
  size, stride, off = tuple(size), tuple(stride), storage_offset or 0
  n, m = x.numel(), math.prod(size)
  out = x.cast(ctx.dtype)
  if m == 0 or n == 0: return out
  _grid_ok(n, m)
  offsets = [off]
  for s, st in zip(size, stride): offsets = [o + i * st for o in offsets for i in range(s)]
  if len(set(offsets)) != m or min(offsets) < 0 or max(offsets) >= n: raise Unsupported("overlapping or out-of-range window")
  j = LT.iota(m)
  where_j = j.const_like(off)
  for d, (s, st) in enumerate(zip(size, stride)):
    inner = math.prod(size[d + 1:])
    where_j = where_j + j.alu(Ops.IDIV, j.const_like(inner)).alu(Ops.MOD, j.const_like(s)) * st
  hit = where_j.reshape((1, m)).broadcast_to((n, m)).eq(LT.iota(n).reshape((n, 1)).broadcast_to((n, m)))
  pick = hit.where(LT.iota(m).reshape((1, m)).broadcast_to((n, m)), -1).max((1,), keepdim=False)   # [n]
  taken = src.cast(ctx.dtype).reshape((m,)).gather(0, pick.maximum(0))
  return (pick >= 0).where(taken, out.reshape((n,))).reshape(ctx.shape)


def _grid_source_index(coord: LT, size: int, padding_mode: int, align_corners: bool) -> LT:
  """A normalized grid coordinate in [-1, 1] -> a pixel coordinate, with border or reflection padding."""
  mul = (size - 1) / 2 if align_corners else size / 2
  c = coord * mul + (size - 1) / 2
  if padding_mode == 0: return c
  if padding_mode == 2:
    lo2, hi2 = (0, 2 * (size - 1)) if align_corners else (-1, 2 * size - 1)
    if lo2 == hi2: c = c.const_like(0.0)
    else:
      lo, span = lo2 / 2, (hi2 - lo2) / 2
      d = (c - lo).math("abs")
      extra = d.math("fmod", d.const_like(span))
      flips = (d / span).math("floor")
      even = flips.math("fmod", flips.const_like(2.0)).eq(0)
      c = even.where(extra + lo, (extra * -1.0) + (span + lo))
  return c.maximum(0.0).minimum(float(size - 1))


@register(aten.grid_sampler_3d.default)
def grid_sampler_3d(ctx, x, grid, interpolation_mode, padding_mode, align_corners):
  """Trilinear or nearest sampling of x [N, C, D, H, W] at grid [N, Do, Ho, Wo, (x, y, z)]: a gather of the
  8 (or 1) surrounding voxels, out-of-range corners contributing zero."""
  if interpolation_mode not in (0, 1) or padding_mode not in (0, 1, 2): raise Unsupported("grid_sampler_3d mode")
  n, c, d, h, w = x.shape
  _, od, oh, ow, _ = grid.shape
  out_shape = (n, c, od, oh, ow)
  if math.prod(out_shape) == 0: return LT.full(out_shape, 0, ctx.dtype)
  acc = compute_dtype(ctx.dtype)
  g = grid.cast(acc)
  coords = [_grid_source_index(g.slice(4, k, k + 1).reshape((n, 1, od, oh, ow)), size, padding_mode, align_corners)
            for k, size in enumerate((w, h, d))]                                           # ix, iy, iz
  src = x.cast(acc)

  def corner(ix, iy, iz):
    inside = None
    for i, size in zip((ix, iy, iz), (w, h, d)):
      ok = (i >= 0) & (i < size)
      inside = ok if inside is None else inside & ok
    idx = [i.cast(dtypes.int64).broadcast_to(out_shape) for i in (iz, iy, ix)]
    v = src.gather_nd((0, 1, ("idx", 0), ("idx", 1), ("idx", 2)), idx)
    return inside.broadcast_to(out_shape), v

  if interpolation_mode == 1:
    inside, v = corner(*[i.math("round") for i in coords])
    return inside.where(v, 0.0).cast(ctx.dtype)
  lo = [i.math("floor") for i in coords]
  total = None
  for dz in (0, 1):          # eager's order: top (z) then bottom; north (y) then south; west (x) then east
    for dy in (0, 1):
      for dx in (0, 1):
        cx, cy, cz = lo[0] + dx, lo[1] + dy, lo[2] + dz
        wgt = None
        for i, corner_i, dd in zip(coords, (cx, cy, cz), (dx, dy, dz)):
          f = (i - (corner_i - 1)) if dd else ((corner_i + 1) - i)      # distance weight along one axis
          wgt = f if wgt is None else wgt * f
        inside, v = corner(cx, cy, cz)
        term = inside.where(v * wgt.broadcast_to(out_shape), 0.0)
        total = term if total is None else total + term
  return total.cast(ctx.dtype)


def _only_first_output_used(node) -> bool:
  import operator
  return all(u.target is operator.getitem and u.args[1] == 0 for u in node.users)


def _check_offsets(ctx, off: LT, n: int) -> None:
  """Eager's errors for embedding_bag offsets that do not cut the n indices into bags."""
  k = off.shape[0]
  ctx.check(off.slice(0, 0, 1), "RuntimeError", "offsets[0] has to be 0, i.e., the first sequence in the mini-batch has "
            "to start from position 0. However, got {value}", ok=0)
  ctx.check(off.slice(0, k - 1, k) > n, "RuntimeError", f"offsets[-1] can not be greater than input's length {n}")
  ctx.check_all(off.slice(0, 1, k) >= off.slice(0, 0, k - 1), "RuntimeError",
                "offsets must be non-decreasing (a bag cannot end before it starts)")


@register(aten._embedding_bag_forward_only.default, aten._embedding_bag.default)
def embedding_bag(ctx, weight, indices, offsets, scale_grad_by_freq=False, mode=0, sparse=False,
                  per_sample_weights=None, include_last_offset=False, padding_idx=-1):
  """Bags of embedding rows reduced by sum (optionally weighted per sample), mean or max, as masked
  reductions over a [bags, indices, dim] grid. Bag b holds indices [offsets[b], offsets[b+1]) (the last one
  up to the end; with include_last_offset the sum stops at the last offset while mean's count and max
  run to the end, as eager). Eager's auxiliary outputs (offset2bag, bag sizes, max indices) follow
  mode-specific rules of its kernels: only graphs that do not read them are lowered."""
  if not _only_first_output_used(ctx.node): raise Unsupported("embedding_bag auxiliary outputs are read")
  if mode not in (0, 1, 2) or (per_sample_weights is not None and mode != 0): raise Unsupported(f"embedding_bag mode {mode}")
  out_shape = ctx.shape_of(0)
  aux = [LT.full(ctx.shape_of(k), 0, ctx.dtype_of(k)) for k in (1, 2, 3)]
  b, dim = out_shape
  n = indices.numel()
  if b * dim == 0 or n == 0: return (LT.full(out_shape, 0, ctx.dtype_of(0)), *aux)
  _grid_ok(b, n, dim)
  ctx.check_index(indices, weight.shape[0], error="RuntimeError",
                  message="an index takes value {value} which is not in the valid range [0, {size})")
  acc = compute_dtype(ctx.dtype_of(0))
  idx = indices.reshape((n,)).cast(dtypes.int64)
  rows = weight.cast(acc).gather_nd((("idx", 0), 1), [idx.reshape((n, 1)).broadcast_to((n, dim))])       # [n, dim]
  off = offsets.reshape((offsets.numel(),)).cast(dtypes.int64)
  _check_offsets(ctx, off, n)
  starts = off.slice(0, 0, b)
  to_end = off.slice(0, 1, b).pad(((0, 1),), n)                      # the last bag runs to the end
  ends = off.slice(0, 1, b + 1) if include_last_offset else to_end
  pos = LT.iota(n).reshape((1, n)).broadcast_to((b, n))
  keep = idx.ne(padding_idx).reshape((1, n)).broadcast_to((b, n)) if padding_idx is not None and padding_idx >= 0 \
    else LT.full((b, n), True, dtypes.bool)
  def member(end): return (starts.reshape((b, 1)).broadcast_to((b, n)) <= pos) & (pos < end.reshape((b, 1)).broadcast_to((b, n))) & keep
  grid = (b, n, dim)
  vals = rows.reshape((1, n, dim)).broadcast_to(grid)
  if mode in (0, 1):
    if per_sample_weights is not None: vals = vals * per_sample_weights.cast(acc).reshape((1, n, 1)).broadcast_to(grid)
    total = member(ends).reshape((b, n, 1)).broadcast_to(grid).where(vals, 0.0).sum((1,), keepdim=False)
    if mode == 1:
      count = member(to_end).cast(acc).sum((1,), keepdim=False).reshape((b, 1)).broadcast_to(out_shape)
      total = count.eq(0).where(0.0, total / count)
    return (total.cast(ctx.dtype_of(0)), *aux)
  # max: eager scans keeping the first value and replacing it only by a greater one, so a NaN first
  # value sticks and later NaNs are skipped
  mem = member(to_end)
  first = mem.where(pos, n).reduce(Ops.MIN, (1,), False)                                      # [b]
  first_val = rows.gather_nd((("idx", 0), 1), [first.minimum(n - 1).reshape((b, 1)).broadcast_to(out_shape)])
  m3 = mem.reshape((b, n, 1)).broadcast_to(grid)
  best = (m3 & vals.isnan().logical_not()).where(vals, -math.inf).reduce(Ops.MAX, (1,), False)
  res = first_val.isnan().where(first_val, best)
  res = (first < n).reshape((b, 1)).broadcast_to(out_shape).where(res, 0.0)
  return (res.cast(ctx.dtype_of(0)), *aux)


@register(aten.embedding_renorm.default)
def embedding_renorm(ctx, weight, indices, max_norm, norm_type):
  """Rows of weight named in indices whose p-norm exceeds max_norm are scaled by max_norm / (norm + 1e-7).
  As eager: the norm is rounded to weight's dtype, the scale computed in double and applied as a scalar
  of the computation dtype."""
  v, dim = weight.shape
  n = indices.numel()
  if v * dim == 0 or n == 0: return weight
  _grid_ok(v, n)
  acc = compute_dtype(weight.dtype)
  used = indices.reshape((1, n)).cast(dtypes.int64).broadcast_to((v, n)).eq(LT.iota(v).reshape((v, 1)).broadcast_to((v, n)))
  used = used.reduce(Ops.MAX, (1,), False)                                                       # [v]
  a = weight.cast(acc).math("abs")
  p = float(norm_type)
  if p == math.inf: norm = a.reduce(Ops.MAX, (1,), False)
  elif p == 1: norm = a.sum((1,), keepdim=False)
  elif p == 2: norm = (a * a).sum((1,), keepdim=False).sqrt()
  else: norm = a.math("pow", a.const_like(p)).sum((1,), keepdim=False).math("pow", 1.0 / p)
  norm = norm.cast(weight.dtype).cast(dtypes.float64)
  scale = norm.const_like(float(max_norm)) / (norm + 1e-7)
  scale = (used & (norm > float(max_norm))).where(scale, 1.0).cast(acc)
  return (weight.cast(acc) * scale.reshape((v, 1)).broadcast_to((v, dim))).cast(weight.dtype)


def _linspace_edges(lo: LT, hi: LT, bins: int) -> LT:
  """bins + 1 edges from lo to hi as eager's linspace: step = (hi - lo) / bins in the edges' dtype, the
  first half lo + step * i, the second half hi - step * (bins - i), each with one rounding (eager's fused
  multiply-add; float32 edges are formed in float64, where the product is exact)."""
  dt = lo.dtype
  step = (hi - lo) / float(bins)
  wide = dtypes.float64
  i = LT.iota(bins + 1).cast(wide)
  s, e, st = (t.cast(wide).reshape((1,)).broadcast_to((bins + 1,)) for t in (lo, hi, step))
  first, second = s + st * i, e - st * (i * -1.0 + float(bins))
  return (LT.iota(bins + 1) < (bins + 1) // 2).where(first, second).cast(dt)


def _outer_edges(col: LT, rng) -> tuple[LT, LT]:
  """The outermost edges of one dim: the given range, or the data's min and max; an empty range is
  widened by 0.5 each way."""
  dt = col.dtype
  if rng is not None:
    lo, hi = float(rng[0]), float(rng[1])
    if lo == hi: lo, hi = lo - 0.5, hi + 0.5
    return LT.full((), lo, dt), LT.full((), hi, dt)
  if col.numel() == 0: return LT.full((), 0.0, dt), LT.full((), 1.0, dt)    # numpy's range for no data
  lo, hi = col.reduce(Ops.MIN, (0,), False), col.reduce(Ops.MAX, (0,), False)
  same = lo.eq(hi)
  return same.where(lo - 0.5, lo), same.where(hi + 0.5, hi)


def _histogram_dd(x: LT, edges: list, weight, density: bool, out_dtype) -> LT:
  """Counts (or weight sums) of the rows of x [N, D] in the grid of bins given by edges[d] [b_d + 1].
  An element's bin is the number of edges <= it, less one; the last bin holds its right edge."""
  n, d = x.shape
  bins = [e.shape[0] - 1 for e in edges]
  total = math.prod(bins)
  if total == 0: return LT.full(tuple(bins), 0, out_dtype)
  hist = LT.full(tuple(bins), 0.0, x.dtype) if n == 0 else _bin_counts(x, edges, bins, weight)
  if density:
    widths = None
    for k, (e, b) in enumerate(zip(edges, bins)):
      wk = (e.slice(0, 1, b + 1) - e.slice(0, 0, b)).reshape(tuple(b if j == k else 1 for j in range(d))).broadcast_to(tuple(bins))
      widths = wk if widths is None else widths * wk
    s = hist.sum(tuple(range(d)), keepdim=True).broadcast_to(tuple(bins))
    hist = hist / (s * widths)
  return hist.cast(out_dtype)


def _bin_counts(x: LT, edges: list, bins: list, weight) -> LT:
  n = x.shape[0]
  total = math.prod(bins)
  for b in bins: _grid_ok(n, b + 1)
  _grid_ok(total, n)
  flat, inside = None, None
  for k, (e, b) in enumerate(zip(edges, bins)):
    v = x.slice(1, k, k + 1).reshape((n,))
    le = e.reshape((1, b + 1)).broadcast_to((n, b + 1)) <= v.reshape((n, 1)).broadcast_to((n, b + 1))
    pos = (le.cast(dtypes.int64).sum((1,), keepdim=False) - 1).minimum(b - 1)
    ok = (v >= e.slice(0, 0, 1).reshape(()).broadcast_to((n,))) & (v <= e.slice(0, b, b + 1).reshape(()).broadcast_to((n,)))
    inside = ok if inside is None else inside & ok
    flat = pos if flat is None else flat * b + pos
  flat = inside.where(flat, -1)
  w = weight.cast(x.dtype).reshape((n,)) if weight is not None else LT.full((n,), 1.0, x.dtype)
  hit = flat.reshape((1, n)).broadcast_to((total, n)).eq(LT.iota(total).reshape((total, 1)).broadcast_to((total, n)))
  return hit.where(w.reshape((1, n)).broadcast_to((total, n)), 0.0).sum((1,), keepdim=False).reshape(tuple(bins))


def _float_input(x: LT) -> None:
  if x.dtype not in (dtypes.float32, dtypes.float64): raise Unsupported(f"histogram of {x.dtype}")


@register(aten.histogram.bin_ct)
def histogram_bin_ct(ctx, x, bins=100, *, range=None, weight=None, density=False):
  _float_input(x)
  flat = x.reshape((x.numel(),))
  edges = _linspace_edges(*_outer_edges(flat, range), bins)
  return _histogram_dd(flat.reshape((flat.numel(), 1)), [edges], weight, density, ctx.dtype_of(0)), edges


@register(aten.histogram.bins_tensor)
def histogram_bins_tensor(ctx, x, bins, *, weight=None, density=False):
  _float_input(x)
  flat = x.reshape((x.numel(),))
  edges = bins.cast(x.dtype)
  return _histogram_dd(flat.reshape((flat.numel(), 1)), [edges], weight, density, ctx.dtype_of(0)), edges


def _dd_rows(x: LT) -> LT:
  d = x.shape[-1]
  return x.reshape((x.numel() // d if d else 0, d))


def _dd_edges(x: LT, bins, rng) -> list:
  rows = _dd_rows(x)
  return [_linspace_edges(*_outer_edges(rows.slice(1, k, k + 1).reshape((rows.shape[0],)),
                                        None if rng is None else rng[2 * k: 2 * k + 2]), b) for k, b in enumerate(bins)]


@register(aten._histogramdd_bin_edges.default)
def histogramdd_bin_edges(ctx, x, bins, *, range=None, weight=None, density=False):
  _float_input(x)
  return _dd_edges(x, bins, range)


@register(aten._histogramdd_from_bin_cts.default)
def histogramdd_from_bin_cts(ctx, x, bins, *, range=None, weight=None, density=False):
  _float_input(x)
  return _histogram_dd(_dd_rows(x), _dd_edges(x, bins, range), weight, density, ctx.dtype)


@register(aten._histogramdd_from_bin_tensors.default)
def histogramdd_from_bin_tensors(ctx, x, bins, *, weight=None, density=False):
  _float_input(x)
  return _histogram_dd(_dd_rows(x), [b.cast(x.dtype) for b in bins], weight, density, ctx.dtype)


def _linear_ce_parts(x, lw, target, lb, w, ignore_index):
  """Per-sample pieces of cross entropy over logits = x @ lw^T (+ lb), in float32 or wider:
  (logits [N, C], softmax [N, C], one-hot of the target [N, C], per-sample weight [N] (0 if ignored), nll [N])."""
  acc = compute_dtype(x.dtype)
  n, c = x.shape[0], lw.shape[0]
  logits = matmul(x.cast(acc), lw.cast(acc).transpose(0, 1))
  if lb is not None: logits = logits + lb.cast(acc).reshape((1, c)).broadcast_to((n, c))
  m = logits.max((1,), keepdim=True).broadcast_to((n, c))
  e = (logits - m).exp()
  total = e.sum((1,), keepdim=True).broadcast_to((n, c))
  lse = (total.log() + m).slice(1, 0, 1).reshape((n,))
  onehot = target.reshape((n, 1)).cast(dtypes.int64).broadcast_to((n, c)).eq(LT.iota(c).reshape((1, c)).broadcast_to((n, c)))
  picked = onehot.where(logits, 0.0).sum((1,), keepdim=False)
  valid = target.reshape((n,)).cast(dtypes.int64).ne(ignore_index)
  wt = onehot.where(w.cast(acc).reshape((1, c)).broadcast_to((n, c)), 0.0).sum((1,), keepdim=False) if w is not None \
    else LT.full((n,), 1.0, acc)
  wt = valid.where(wt, 0.0)
  return logits, e / total, onehot, wt, lse - picked


def _register_linear_ce():
  try:
    import torch.nn.modules.linear_cross_entropy  # noqa: F401  defines the torch_nn custom ops
    chunked = torch.ops.torch_nn._linear_cross_entropy_batch_chunked.default
    no_red = torch.ops.torch_nn._linear_cross_entropy_batch_chunked_no_reduction.default
  except (ImportError, AttributeError, RuntimeError): return   # this torch has no chunked linear_cross_entropy

  @register(chunked)
  def linear_cross_entropy_chunked(ctx, x, lw, target, lb, w, reduction, ignore_index, label_smoothing, batch_chunk_size,
                                   acc_policy, acc_dtype, allow_retain_graph, grad_x, grad_lw, grad_lb):
    """Mean or sum cross entropy of a linear layer's logits, and (when asked) the gradients its backward
    scales: d loss / d logits = (softmax - one_hot) * w[target] / denominator."""
    if label_smoothing or reduction not in ("mean", "sum") or x.ndim != 2 or lw.ndim != 2:
      raise Unsupported("linear_cross_entropy variant")
    _, p, onehot, wt, nll = _linear_ce_parts(x, lw, target, lb, w, ignore_index)
    total = (wt * nll).sum((0,), keepdim=False)
    denom = wt.sum((0,), keepdim=False) if reduction == "mean" else LT.full((), 1.0, total.dtype)
    loss = (total / denom).cast(ctx.dtype_of(0))
    n, c = p.shape
    g = (p - onehot.cast(p.dtype)) * (wt / denom.reshape((1,)).broadcast_to((n,))).reshape((n, 1)).broadcast_to((n, c))
    outs = [loss]
    for k, wanted, make in ((1, grad_x, lambda: matmul(g, lw.cast(g.dtype))),
                            (2, grad_lw, lambda: matmul(g.transpose(0, 1), x.cast(g.dtype))),
                            (3, grad_lb, lambda: g.sum((0,), keepdim=False))):
      outs.append(make().cast(ctx.dtype_of(k)) if wanted else LT.full(ctx.shape_of(k), 0, ctx.dtype_of(k)))
    return tuple(outs)

  @register(no_red)
  def linear_cross_entropy_chunked_none(ctx, x, lw, target, lb, w, ignore_index, batch_chunk_size, acc_policy, acc_dtype):
    """Per-sample cross entropy of a linear layer's logits (0 where the target is ignored)."""
    if x.ndim != 2 or lw.ndim != 2: raise Unsupported("linear_cross_entropy variant")
    _, _, _, wt, nll = _linear_ce_parts(x, lw, target, lb, w, ignore_index)
    return (wt * nll).cast(ctx.dtype)


_register_linear_ce()


def _aa_weights(in_size: int, out_size: int, align_corners: bool, scale_opt, dt) -> LT:
  """[out, in] antialiased linear (triangle filter) weights of eager's separable resize: the filter is
  widened by the scale when downsampling, and each row is normalized to sum to 1."""
  import numpy as np
  ft = np.float32 if dt == dtypes.float32 else np.float64
  if align_corners: scale = ft(in_size - 1) / ft(out_size - 1) if out_size > 1 else ft(0)
  elif scale_opt is not None and scale_opt > 0: scale = ft(1.0 / scale_opt)
  else: scale = ft(in_size) / ft(out_size)
  support = ft(scale) if scale >= 1.0 else ft(1.0)          # interp_size (2) / 2, times the scale when downsampling
  invscale = ft(1.0) / scale if scale >= 1.0 else ft(1.0)
  o = LT.iota(out_size).cast(dt)
  center = (o + 0.5) * float(scale)
  xmin = (center - float(support) + 0.5).cast(dtypes.int64).maximum(0)
  xmax = (center + float(support) + 0.5).cast(dtypes.int64).minimum(in_size)
  grid = (out_size, in_size)
  j = LT.iota(in_size).reshape((1, in_size)).broadcast_to(grid)
  inside = (xmin.reshape((out_size, 1)).broadcast_to(grid) <= j) & (j < xmax.reshape((out_size, 1)).broadcast_to(grid))
  t = ((j.cast(dt) - center.reshape((out_size, 1)).broadcast_to(grid)) + 0.5) * float(invscale)
  w = inside.where((t.math("abs") * -1.0 + 1.0).maximum(0.0), 0.0)
  total = w.sum((1,), keepdim=True).broadcast_to(grid)
  return total.ne(0).where(w / total, w)


def _aa_resize_dim(x: LT, axis: int, out_size: int, align_corners: bool, scale_opt) -> LT:
  n = x.shape[axis]
  if n == out_size: return x                                 # eager skips a dim whose size does not change
  _grid_ok(x.numel(), out_size)
  w = _aa_weights(n, out_size, align_corners, scale_opt, x.dtype)                       # [out, in]
  moved = x.transpose(axis, x.ndim - 1)                                                # [.., in]
  lead = moved.shape[:-1]
  full = (*lead, out_size, n)
  prod = moved.reshape((*lead, 1, n)).broadcast_to(full) * w.reshape((1,) * len(lead) + (out_size, n)).broadcast_to(full)
  return prod.sum((len(lead) + 1,), keepdim=False).transpose(axis, x.ndim - 1)


@register(aten._upsample_bilinear2d_aa.default, aten._upsample_bilinear2d_aa.vec)
def upsample_bilinear2d_aa(ctx, x, output_size, align_corners, *scales):
  """Antialiased bilinear resize of the last two dims, width first then height, as eager's separable kernel."""
  if x.dtype not in (dtypes.float32, dtypes.float64): raise Unsupported(f"antialiased resize of {x.dtype}")
  if ctx.node.target is aten._upsample_bilinear2d_aa.vec:
    factors = scales[0] if scales else None
    sh, sw = (factors[0], factors[1]) if factors else (None, None)
  else: sh, sw = (list(scales) + [None, None])[:2]
  oh, ow = ctx.shape[-2:]
  if 0 in ctx.shape or x.numel() == 0: return LT.full(ctx.shape, 0, ctx.dtype)
  out = _aa_resize_dim(x, x.ndim - 1, ow, align_corners, sw)
  return _aa_resize_dim(out, x.ndim - 2, oh, align_corners, sh).cast(ctx.dtype)


@register(aten._assert_async.msg, aten._assert_async.default)
def assert_async(ctx, cond, msg="Expected Tensor with single nonzero value, but got zero"):
  """A graph's own data assert (one_hot's class range, torch._assert_async): eager's RuntimeError when cond is 0."""
  ctx.check_all(cond.ne(0), "RuntimeError", msg.replace("{", "{{").replace("}", "}}"), name_op=False)
  return None
