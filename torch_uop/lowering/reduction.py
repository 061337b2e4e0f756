"""Reduction lowerings: sum, mean, prod, amax/amin, max/min with indices, var, argmax/argmin, any/all, softmax.

Reductions accumulate in the computation dtype eager uses (float32 for half types, int64 for
integer sums as `meta["val"]` says) and are cast to the result dtype at the end. Arg-reductions are
two reductions: the extreme value, then the first index that holds it (NaN counts as the extreme).
"""
from __future__ import annotations
import math
import torch
from torch_uop.core.uop import Ops
from torch_uop.core.dtypes import dtypes
from torch_uop.lowering.registry import register, Unsupported
from torch_uop.lowering.tensor import LT, compute_dtype

aten = torch.ops.aten


def _axes(x: LT, dims) -> tuple:
  if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0): return tuple(range(x.ndim))
  if isinstance(dims, int): dims = [dims]
  return tuple(d % max(x.ndim, 1) for d in dims) if x.ndim else ()


def _reduce(ctx, x: LT, op: Ops, dims, keepdim: bool) -> LT:
  acc = compute_dtype(ctx.dtype)
  return x.cast(acc).reduce(op, _axes(x, dims), keepdim).cast(ctx.dtype)


@register(aten.sum.dim_IntList, aten.sum.default)
def sum_(ctx, x, dims=None, keepdim=False, dtype=None):
  return _reduce(ctx, x, Ops.ADD, dims, keepdim)


@register(aten.prod.dim_int, aten.prod.default)
def prod(ctx, x, dim=None, keepdim=False, dtype=None):
  return _reduce(ctx, x, Ops.MUL, dim, keepdim)


@register(aten.mean.dim, aten.mean.default)
def mean(ctx, x, dims=None, keepdim=False, dtype=None):
  axes = _axes(x, dims)
  n = 1
  for a in axes: n *= x.shape[a]
  acc = compute_dtype(ctx.dtype)
  total = x.cast(acc).reduce(Ops.ADD, axes, keepdim)
  return (total / n).cast(ctx.dtype)   # as eager: sum (in float for half types), then divide; 0/0 is NaN (n may be symbolic)


def _empty_result(ctx, i: int = 0) -> LT:
  """An extreme-value reduction of an empty tensor: eager allows it only when the result is empty too."""
  if math.prod(ctx.shape_of(i)): raise Unsupported("reducing an empty dimension to its max/min is an error in eager")
  return LT.full(ctx.shape_of(i), 0, ctx.dtype_of(i))


@register(aten.amax.default, aten.amin.default)
def amax(ctx, x, dims=(), keepdim=False):
  op = Ops.MAX if ctx.node.target is aten.amax.default else Ops.MIN
  if x.numel() == 0: return _empty_result(ctx)
  return x.reduce(op, _axes(x, dims), keepdim)


@register(aten._softmax.default)
def softmax(ctx, x, dim, half_to_float=False):
  """max, exp(x - max), their sum, then each term times the sum's reciprocal, as eager's CPU kernel: the max's own
  term makes the sum at least 1 (or NaN), so the reciprocal is finite, and a multiply costs a fraction of a division."""
  if not x.dtype.is_float: raise Unsupported("softmax of a non-float tensor is an error in eager")
  if x.numel() == 0: return LT.full(ctx.shape_of(0), 0, ctx.dtype)
  axes = _axes(x, dim)
  xf = x.cast(compute_dtype(x.dtype))
  # x - max <= 0 (or NaN), written as -|x - max| so that exp knows it: no overflow test, one scaling step
  e = (-(xf - xf.max(axes).broadcast_to(xf.shape)).math("abs")).exp()
  return (e * e.sum(axes).recip().broadcast_to(e.shape)).cast(ctx.dtype)


@register(aten.max.default, aten.min.default)
def max_all(ctx, x):
  if x.numel() == 0: raise Unsupported("max of an empty tensor is an error in eager")
  return x.reduce(Ops.MAX if ctx.node.target is aten.max.default else Ops.MIN, _axes(x, None), False)


def arg_extreme(x: LT, dim: int | None, keepdim: bool, is_max: bool) -> tuple[LT, LT]:
  """(values, first index of the extreme) along dim; NaN is the extreme, as in eager."""
  if dim is None: x, dim = x.reshape((x.numel(),)), 0
  dim %= max(x.ndim, 1)
  if x.ndim == 0: return x, LT.full((), 0, dtypes.int64)
  m = x.reduce(Ops.MAX if is_max else Ops.MIN, (dim,), True)
  hit = x.eq(m)
  if x.dtype.is_float: hit = hit | (x.isnan() & m.isnan())
  n = x.shape[dim]
  iota = LT.iota_along(x.shape, dim)
  idx = hit.where(iota, iota.const_like(n)).reduce(Ops.MIN, (dim,), True)
  if not keepdim: m, idx = m.squeeze_dims((dim,)), idx.squeeze_dims((dim,))
  return m, idx


@register(aten.argmax.default, aten.argmin.default)
def argmax(ctx, x, dim=None, keepdim=False):
  if x.numel() == 0: return _empty_result(ctx)
  _, idx = arg_extreme(x, dim, keepdim, ctx.node.target is aten.argmax.default)
  if dim is None and keepdim: idx = idx.reshape(ctx.shape)
  return idx


@register(aten.max.dim, aten.min.dim)
def max_dim(ctx, x, dim, keepdim=False):
  if x.numel() == 0: return _empty_result(ctx, 0), _empty_result(ctx, 1)
  return arg_extreme(x, dim, keepdim, ctx.node.target is aten.max.dim)


@register(aten.var.correction, aten.var_mean.correction)
def var(ctx, x, dims=None, correction=None, keepdim=False):
  axes = _axes(x, dims)
  n = 1
  for a in axes: n *= x.shape[a]
  c = 1 if correction is None else correction
  acc = compute_dtype(x.dtype)
  xf = x.cast(acc)
  mean = xf.reduce(Ops.ADD, axes, True) * (1.0 / n)
  d = xf - mean
  denom = max(n - c, 0)
  v = (d * d).reduce(Ops.ADD, axes, keepdim) * (1.0 / denom if denom else float("inf"))
  if denom == 0: v = v * float("nan")  # 0/0 and x/0 are both NaN-producing in eager for var
  out_dt = ctx.dtype_of(0)
  v = v.cast(out_dt)
  if ctx.node.target is aten.var_mean.correction:
    m = mean if keepdim else mean.reshape(v.shape)
    return v, m.cast(ctx.dtype_of(1))
  return v


@register(aten.any.default, aten.any.dim, aten.any.dims, aten.all.default, aten.all.dim, aten.all.dims)
def any_all(ctx, x, dims=None, keepdim=False):
  is_any = ctx.node.target.overloadpacket is aten.any
  return x.cast(dtypes.bool).reduce(Ops.MAX if is_any else Ops.MIN, _axes(x, dims), keepdim).cast(ctx.dtype)


@register(aten.linalg_vector_norm.default)
def vector_norm(ctx, x, ord=2, dim=None, keepdim=False, dtype=None):
  """||x||_ord over dims, accumulated in float32 for half types."""
  axes = _axes(x, dim)
  acc = compute_dtype(ctx.dtype)
  a = x.cast(acc).math("abs")
  if ord == float("inf"): out = a.reduce(Ops.MAX, axes, keepdim)
  elif ord == float("-inf"): out = a.reduce(Ops.MIN, axes, keepdim)
  elif ord == 0: out = a.ne(0).cast(acc).reduce(Ops.ADD, axes, keepdim)
  elif ord == 1: out = a.reduce(Ops.ADD, axes, keepdim)
  elif ord == 2: out = (a * a).reduce(Ops.ADD, axes, keepdim).sqrt()
  else: out = a.math("pow", a.const_like(float(ord))).reduce(Ops.ADD, axes, keepdim).math("pow", float(1.0 / ord))
  return out.cast(ctx.dtype)


@register(aten.cumsum.default, aten.cumprod.default)
def cumulative(ctx, x, dim, dtype=None):
  """out[.., i, ..] = op over j <= i of x[.., j, ..]: a masked reduction over a new trailing axis."""
  is_sum = ctx.node.target is aten.cumsum.default
  if x.ndim == 0: return x.cast(ctx.dtype)
  dim %= x.ndim
  n = x.shape[dim]
  acc = compute_dtype(ctx.dtype)
  moved = x.cast(acc).transpose(dim, x.ndim - 1)                  # [.., n(j)] with dim last
  lead = moved.shape[:-1]
  src = moved.reshape((*lead, 1, n)).expand((*lead, n, n))         # [.., i, j]
  i = LT.iota(n).reshape((n, 1)).expand((n, n))
  j = LT.iota(n).reshape((1, n)).expand((n, n))
  keep = (j <= i).broadcast_to(src.shape)
  out = keep.where(src, src.const_like(0 if is_sum else 1)).reduce(Ops.ADD if is_sum else Ops.MUL, (x.ndim,), False)
  return out.transpose(dim, x.ndim - 1).cast(ctx.dtype)


def _prefix_mask(x: LT, dim: int):
  """x moved to [.., i, j] (dim last, then a new axis j) and the bool mask j <= i."""
  n = x.shape[dim]
  moved = x.transpose(dim, x.ndim - 1)
  lead = moved.shape[:-1]
  src = moved.reshape((*lead, 1, n)).expand((*lead, n, n))
  i = LT.iota(n).reshape((n, 1)).expand((n, n))
  j = LT.iota(n).reshape((1, n)).expand((n, n))
  return src, (j <= i).broadcast_to(src.shape), j.broadcast_to(src.shape)


@register(aten.cummax.default, aten.cummin.default)
def cummax(ctx, x, dim):
  """Running max/min and the last index that holds it (NaN wins and sticks, as in eager)."""
  is_max = ctx.node.target is aten.cummax.default
  if x.ndim == 0: return x, LT.full((), 0, dtypes.int64)
  dim %= x.ndim
  if x.numel() == 0: return LT.full(ctx.shape_of(0), 0, x.dtype), LT.full(ctx.shape_of(1), 0, dtypes.int64)
  acc = compute_dtype(x.dtype) if not x.dtype.is_bool else dtypes.int32
  src, keep, j = _prefix_mask(x.cast(acc), dim)
  low = acc.min() if is_max else acc.max()
  m = keep.where(src, src.const_like(low)).reduce(Ops.MAX if is_max else Ops.MIN, (x.ndim,), True)
  hit = keep & src.eq(m)
  if acc.is_float: hit = hit | (keep & src.isnan() & m.isnan())
  idx = hit.where(j, -1).reduce(Ops.MAX, (x.ndim,), False)
  vals = m.reshape(idx.shape)
  return vals.transpose(dim, x.ndim - 1).cast(x.dtype), idx.transpose(dim, x.ndim - 1)


@register(aten.logcumsumexp.default)
def logcumsumexp(ctx, x, dim):
  if x.ndim == 0: return x.cast(ctx.dtype)
  dim %= x.ndim
  if x.numel() == 0: return x.cast(ctx.dtype)
  acc = compute_dtype(ctx.dtype)
  src, keep, _ = _prefix_mask(x.cast(acc), dim)
  m = keep.where(src, -math.inf).reduce(Ops.MAX, (x.ndim,), True)
  m_safe = m.math("abs").eq(math.inf).where(0.0, m)
  e = keep.where((src - m_safe).exp(), 0.0).reduce(Ops.ADD, (x.ndim,), True)
  out = (e.log() + m_safe).reshape(src.shape[:-1])
  return out.transpose(dim, x.ndim - 1).cast(ctx.dtype)


def _sort_last(x: LT, descending: bool):
  """Stable sort along the last dim by rank counting: rank(i) = #{j ordered before i} (NaN is the
  largest, as in eager). Returns (sorted values, int64 indices)."""
  n = x.shape[-1]
  acc = compute_dtype(x.dtype) if not x.dtype.is_bool else dtypes.int32
  xs = x.cast(acc)
  lead = x.shape[:-1]
  full = (*lead, n, n)                                              # [.., i, j]
  a = xs.reshape((*lead, n, 1)).broadcast_to(full)
  b = xs.reshape((*lead, 1, n)).broadcast_to(full)
  before = (b > a) if descending else (b < a)
  same = b.eq(a)
  if acc.is_float:
    an, bn = a.isnan(), b.isnan()
    # NaN is the largest: first when descending, last when ascending
    before = (before | (bn & an.logical_not())) if descending else (before | (an & bn.logical_not()))
    same = same | (an & bn)
  i = LT.iota(n).reshape((n, 1)).broadcast_to(full)
  j = LT.iota(n).reshape((1, n)).broadcast_to(full)
  rank = (before | (same & (j < i))).cast(dtypes.int64).reduce(Ops.ADD, (len(lead) + 1,), False)   # [.., n(i)]
  # idx[k] = the i whose rank is k
  r = rank.reshape((*lead, 1, n)).broadcast_to(full)                 # [.., k, i]
  k = LT.iota(n).reshape((n, 1)).broadcast_to(full)
  idx = r.eq(k).where(j, 0).reduce(Ops.ADD, (len(lead) + 1,), False)
  return x.gather(x.ndim - 1, idx), idx


# rank counting is O(n^2) per row: longer rows fall back to eager's sort
MAX_SORT_LEN = 8192
# eager's unstable CPU sort (std::sort) is a plain insertion sort, hence stable, up to this many elements
UNSTABLE_IS_STABLE_LEN = 16


def sort_along(x: LT, dim: int, descending: bool, stable: bool = True, stable_upto: int = UNSTABLE_IS_STABLE_LEN):
  """Stable sort along dim. With stable=False eager's order of equal elements is its own
  (introsort) beyond `stable_upto` elements: integer, bool and half inputs, where ties are common,
  fall back then. topk and kthvalue (quickselect) order ties their own way from 2 elements on."""
  if x.ndim == 0: return x, LT.full((), 0, dtypes.int64)
  dim %= x.ndim
  if x.shape[dim] > MAX_SORT_LEN: raise Unsupported(f"sorting {x.shape[dim]} elements by rank counting (O(n^2))")
  if not stable and x.dtype not in (dtypes.float32, dtypes.float64) and x.shape[dim] > max(stable_upto, 1):
    raise Unsupported("unstable sort of integers, bools or half types (ties are common): eager's tie order")
  if x.numel() == 0 or x.shape[dim] == 1:
    return x, LT.full(x.shape, 0, dtypes.int64)
  moved = x.transpose(dim, x.ndim - 1)
  v, i = _sort_last(moved, descending)
  return v.transpose(dim, x.ndim - 1), i.transpose(dim, x.ndim - 1)


@register(aten.sort.default, aten.sort.stable)
def sort(ctx, x, *args, **kwargs):
  if ctx.node.target is aten.sort.stable:
    dim, descending = kwargs.get("dim", -1), kwargs.get("descending", False)
    return sort_along(x, dim, descending, bool(kwargs.get("stable")))
  dim = args[0] if args else kwargs.get("dim", -1)
  descending = args[1] if len(args) > 1 else kwargs.get("descending", False)
  return sort_along(x, dim, descending, False)


@register(aten.topk.default)
def topk(ctx, x, k, dim=-1, largest=True, sorted=True):
  if x.ndim == 0: return x, LT.full((), 0, dtypes.int64)
  dim %= x.ndim
  v, i = sort_along(x, dim, largest, False, stable_upto=1)
  return v.slice(dim, 0, k), i.slice(dim, 0, k)


@register(aten.kthvalue.default)
def kthvalue(ctx, x, k, dim=-1, keepdim=False):
  if x.ndim == 0: return x, LT.full((), 0, dtypes.int64)
  dim %= x.ndim
  v, i = sort_along(x, dim, False, False, stable_upto=1)
  v, i = v.slice(dim, k - 1, k), i.slice(dim, k - 1, k)
  if not keepdim: v, i = v.squeeze_dims((dim,)), i.squeeze_dims((dim,))
  return v, i


def _median(x: LT, dim: int, keepdim: bool, ignore_nan: bool):
  """The lower median along dim (NaN if any is NaN, unless ignore_nan: then of the non-NaN values)."""
  v, i = sort_along(x, dim, False)
  n = x.shape[dim]
  if ignore_nan and x.dtype.is_float:
    cnt = x.isnan().logical_not().cast(dtypes.int64).reduce(Ops.ADD, (dim,), True)
    pos = ((cnt - 1).maximum(0)).alu(Ops.IDIV, LT.full(cnt.shape, 2, dtypes.int64))
  else:
    pos = LT.full(tuple(1 if d == dim else s for d, s in enumerate(x.shape)), (n - 1) // 2, dtypes.int64)
    if x.dtype.is_float:  # a NaN sorts last: the median is the first NaN
      has_nan = x.isnan().reduce(Ops.MAX, (dim,), True)
      cnt = x.isnan().logical_not().cast(dtypes.int64).reduce(Ops.ADD, (dim,), True)
      pos = has_nan.where(cnt, pos)
  mv, mi = v.gather(dim, pos), i.gather(dim, pos)
  if not keepdim: mv, mi = mv.squeeze_dims((dim,)), mi.squeeze_dims((dim,))
  return mv, mi


@register(aten.median.dim, aten.nanmedian.dim)
def median_dim(ctx, x, dim=0, keepdim=False):
  if x.ndim == 0: return x, LT.full((), 0, dtypes.int64)
  if x.numel() == 0: raise Unsupported("median of an empty tensor")
  return _median(x, dim % x.ndim, keepdim, ctx.node.target is aten.nanmedian.dim)


@register(aten.median.default, aten.nanmedian.default)
def median_all(ctx, x):
  if x.numel() == 0: raise Unsupported("median of an empty tensor")
  v, _ = _median(x.reshape((x.numel(),)), 0, False, ctx.node.target is aten.nanmedian.default)
  return v


@register(aten.searchsorted.Tensor, aten.searchsorted.Scalar)
def searchsorted(ctx, seq, values, *, out_int32=False, right=False, side=None, sorter=None):
  """The insertion point of each value: the number of boundaries below it (<= it with right=True),
  counted as one reduction over the boundaries."""
  right = right or side == "right"
  if sorter is not None: seq = seq.gather(seq.ndim - 1, sorter)
  v = values if isinstance(values, LT) else LT.full((), values, seq.dtype)
  m = seq.shape[-1]
  acc = compute_dtype(seq.dtype)
  if seq.ndim == 1:
    full = (*v.shape, m)
    b = seq.cast(acc).reshape((1,) * v.ndim + (m,)).broadcast_to(full)
  else:
    full = (*v.shape, m)
    b = seq.cast(acc).reshape(seq.shape[:-1] + (1, m)).broadcast_to(full)
  vv = v.cast(acc).unsqueeze(v.ndim).broadcast_to(full)
  below = (b <= vv) if right else (b < vv)
  if acc.is_float and not right: below = below | (vv.isnan() & b.isnan().logical_not())
  if acc.is_float and right: below = below | vv.isnan()
  return below.cast(dtypes.int64).reduce(Ops.ADD, (v.ndim,), False).cast(ctx.dtype)


@register(aten.histc.default)
def histc(ctx, x, bins=100, min=0, max=0):
  """Counts per equal-width bin over [min, max] (the data's range when min == max)."""
  acc = compute_dtype(ctx.dtype)
  flat = x.cast(acc).reshape((x.numel(),))
  n = flat.shape[0]
  if n == 0: return LT.full((bins,), 0, ctx.dtype)
  if min == max:
    lo, hi = flat.reduce(Ops.MIN, (0,), True), flat.reduce(Ops.MAX, (0,), True)
    same = lo.eq(hi)
    lo, hi = same.where(lo - 1, lo), same.where(hi + 1, hi)
  else: lo, hi = LT.full((1,), float(min), acc), LT.full((1,), float(max), acc)
  lo, hi = lo.broadcast_to((n,)), hi.broadcast_to((n,))
  pos = ((flat - lo) * float(bins) / (hi - lo)).cast(dtypes.int64)
  pos = pos.eq(bins).where(pos.const_like(bins - 1), pos)
  inside = (flat >= lo) & (flat <= hi)
  pos = inside.where(pos, pos.const_like(-1))
  hit = pos.reshape((1, n)).broadcast_to((bins, n)).eq(LT.iota(bins).reshape((bins, 1)).broadcast_to((bins, n)))
  return hit.cast(acc).reduce(Ops.ADD, (1,), False).cast(ctx.dtype)
