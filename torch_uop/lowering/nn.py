"""Neural-network lowerings that decompositions leave whole: embedding (and its backward),
max and average pooling (and their backwards), adaptive pooling, scaled dot-product attention
(forward and backward), nearest-neighbour resizing (and its backward), and weight normalization's backward.

The gradients of gathers are written as gathers plus sums rather than scatters, so they stay ordinary,
race-free kernels: the embedding gradient sums each output row over the tokens equal to it, and
the max-pool gradient visits, for each input position, the few output windows that can hold it.
Attention with big score matrices runs by blocks of query rows, forward and backward, so that each block's
scores stay in the cache between the kernels that write and read them.
"""
from __future__ import annotations
import functools
import math
import operator
import numpy as np
import torch
from torch_uop.core.uop import Ops
from torch_uop.core.dtypes import dtypes
from torch_uop.lowering.registry import register, Unsupported
from torch_uop.lowering.tensor import LT, compute_dtype
from torch_uop.lowering.movement import concat, joined_in_groups
from torch_uop.core.sym import is_sym
from torch_uop.core.opt import VECTOR_UPCAST
from torch_uop.lowering.linalg import matmul

aten = torch.ops.aten


@register(aten.embedding.default)
def embedding(ctx, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
  ctx.check_index(indices, weight.shape[0], message="index out of range in self (index {value}, {size} rows)")
  out_shape = (*indices.shape, weight.shape[1])
  idx = indices.unsqueeze(-1).broadcast_to(out_shape)
  return weight.gather_nd((("idx", 0), len(out_shape) - 1), [idx])


EMBEDDING_GRAD_MAX_TOKENS = 2048  # up to this many indices the table's gradient is gathered from per-token sums


def _embedding_grad_by_token(g: LT, ids: LT, num_weights: int, padding_idx) -> LT:
  """The table's gradient without a pass over all tokens per table row: tokens with the same index sum their
  gradients ([N, N] compares, N x N x D adds), each row finds the first token with its index ([V, N] compares), and
  row v is that token's sum, or 0 (a gather over the table: one write of it)."""
  n, d = g.shape
  same = ids.reshape((n, 1, 1)).eq(ids.reshape((1, n, 1))).broadcast_to((n, n, d))
  per_token = same.where(g.reshape((1, n, d)).broadcast_to((n, n, d)), 0.0).sum((1,), keepdim=False)    # [N, D]
  rows = LT.iota(num_weights).reshape((num_weights, 1)).cast(ids.dtype)
  pos = LT.iota(n).reshape((1, n)).cast(ids.dtype).broadcast_to((num_weights, n))
  hit = ids.reshape((1, n)).eq(rows)                                                                   # [V, N]
  first = hit.where(pos, pos.const_like(n)).reduce(Ops.MIN, (1,), keepdim=True)                        # [V, 1]
  keep = first < n
  if padding_idx is not None and padding_idx >= 0: keep = keep & rows.ne(padding_idx)
  picked = per_token.gather(0, first.minimum(n - 1).broadcast_to((num_weights, d)))
  return keep.broadcast_to((num_weights, d)).where(picked, 0.0)


@register(aten.embedding_dense_backward.default)
def embedding_dense_backward(ctx, grad, indices, num_weights, padding_idx, scale_grad_by_freq):
  if scale_grad_by_freq: raise Unsupported("scale_grad_by_freq")
  d = grad.shape[-1]
  n = indices.numel()
  acc = compute_dtype(grad.dtype)
  # by token: N x N x D adds; by table row: V x N x D (the cheaper one: a token-type table has 2 rows)
  if not is_sym(n) and not is_sym(d) and n <= EMBEDDING_GRAD_MAX_TOKENS and n < num_weights:
    return _embedding_grad_by_token(grad.cast(acc).reshape((n, d)), indices.reshape((n,)), num_weights,
                                    padding_idx).cast(ctx.dtype)
  g = grad.cast(acc).reshape((n, 1, d))                   # [N, 1, D]
  ids = indices.reshape((n, 1, 1))                          # [N, 1, 1]
  rows = LT.iota(num_weights).reshape((1, num_weights, 1)).cast(ids.dtype)
  hit = ids.eq(rows)                                        # [N, V, 1]
  if padding_idx is not None and padding_idx >= 0: hit = hit & rows.ne(padding_idx)
  contrib = hit.broadcast_to((n, num_weights, d)).where(g.broadcast_to((n, num_weights, d)), 0.0)
  return contrib.sum((0,), keepdim=False).cast(ctx.dtype)


def _pool_geometry(size, kernel, stride, padding, dilation, ceil_mode):
  out = (size + 2 * padding - dilation * (kernel - 1) - 1 + (stride - 1 if ceil_mode else 0)) // stride + 1
  if ceil_mode and (out - 1) * stride >= size + padding: out -= 1
  return out


def _pool_args(x, kernel, stride, padding, dilation):
  nd = 2
  kernel = tuple(kernel) * (nd if len(kernel) == 1 else 1)
  stride = tuple(stride) if stride else kernel
  stride = stride * (nd if len(stride) == 1 else 1)
  padding = tuple(padding) * (nd if len(padding) == 1 else 1)
  dilation = tuple(dilation) * (nd if len(dilation) == 1 else 1)
  return kernel, stride, padding, dilation


@register(aten.max_pool2d_with_indices.default)
def max_pool2d_with_indices(ctx, x, kernel, stride=(), padding=(0,), dilation=(1,), ceil_mode=False):
  kernel, stride, padding, dilation = _pool_args(x, kernel, stride, padding, dilation)
  unbatched = x.ndim == 3
  if unbatched: x = x.unsqueeze(0)
  n, c, h, w = x.shape
  oh, ow = (_pool_geometry(s, k, st, p, d, ceil_mode) for s, k, st, p, d in zip((h, w), kernel, stride, padding, dilation))
  low = x.dtype.min()
  # pad enough on the right for ceil_mode windows; padding reads as -inf (never the max)
  need = [(o - 1) * st + d * (k - 1) + 1 for o, st, d, k in zip((oh, ow), stride, dilation, kernel)]
  pads = [(0, 0), (0, 0)] + [(p, max(0, nd_ - s - p)) for p, nd_, s in zip(padding, need, (h, w))]
  xp = x.pad(pads, low)
  # the padded input in a buffer of its own: a window over a padded view would index it with divisions and masks
  if xp is not x: xp = xp.contiguous()
  hp, wp = xp.shape[2:]
  kh, kw = kernel
  win = xp.as_strided((n, c, oh, ow, kh, kw), (c * hp * wp, hp * wp, stride[0] * wp, stride[1], dilation[0] * wp, dilation[1]))
  # reduced over (kh, kw) as two loops: merged into one, the window's index would need a division by kw
  m = win.reduce(Ops.MAX, (4, 5), True)
  hit = win.eq(m)
  if x.dtype.is_float: hit = hit | (win.isnan() & m.isnan())
  k_iota = LT.iota(kh * kw).reshape((1, 1, 1, 1, kh, kw)).broadcast_to(win.shape)
  k = hit.where(k_iota, k_iota.const_like(kh * kw)).reduce(Ops.MIN, (4, 5), False)   # [n, c, oh, ow]
  ki, kj = k.alu(Ops.IDIV, kw), k.alu(Ops.MOD, kw)
  rows = LT.iota(oh).reshape((1, 1, oh, 1)).broadcast_to(k.shape)
  cols = LT.iota(ow).reshape((1, 1, 1, ow)).broadcast_to(k.shape)
  hh = rows * stride[0] - padding[0] + ki * dilation[0]
  ww = cols * stride[1] - padding[1] + kj * dilation[1]
  idx = hh * w + ww
  vals = m.reshape((n, c, oh, ow))
  if unbatched: vals, idx = vals.reshape((c, oh, ow)), idx.reshape((c, oh, ow))
  return vals, idx


@register(aten.max_pool2d_with_indices_backward.default)
def max_pool2d_with_indices_backward(ctx, grad, x, kernel, stride, padding, dilation, ceil_mode, indices):
  kernel, stride, padding, dilation = _pool_args(x, kernel, stride, padding, dilation)
  unbatched = x.ndim == 3
  if unbatched: x, grad, indices = x.unsqueeze(0), grad.unsqueeze(0), indices.unsqueeze(0)
  n, c, h, w = x.shape
  oh, ow = grad.shape[2:]
  acc = compute_dtype(grad.dtype)
  shape = (n, c, h, w)
  rows = LT.iota(h).reshape((1, 1, h, 1)).broadcast_to(shape)
  cols = LT.iota(w).reshape((1, 1, 1, w)).broadcast_to(shape)
  flat = rows * w + cols
  total = None
  for j in range((kernel[0] - 1) * dilation[0] // stride[0] + 1):
    cand_h = (rows + padding[0]).alu(Ops.IDIV, stride[0]) - j
    for i in range((kernel[1] - 1) * dilation[1] // stride[1] + 1):
      cand_w = (cols + padding[1]).alu(Ops.IDIV, stride[1]) - i
      valid = (cand_h >= 0) & (cand_h < oh) & (cand_w >= 0) & (cand_w < ow)
      src = (0, 1, ("idx", 0), ("idx", 1))
      picked = indices.gather_nd(src, [cand_h, cand_w])
      g = grad.cast(acc).gather_nd(src, [cand_h, cand_w])
      term = (valid & picked.eq(flat)).where(g, 0.0)
      total = term if total is None else total + term
  out = total.cast(ctx.dtype)
  return out.reshape((c, h, w)) if unbatched else out


def _avg_pool_divisor(out_sp, size, kernel, stride, padding, count_include_pad, divisor_override) -> LT:
  """[oh, ow] divisor of each window, as eager: the window clipped to the padded input, or to the
  input itself without count_include_pad."""
  if divisor_override: return LT.full(out_sp, float(divisor_override), dtypes.float32)
  extents = []
  for d, (o, s, k, st, p) in enumerate(zip(out_sp, size, kernel, stride, padding)):
    start = LT.iota(o) * st - p
    end = (start + k).minimum(s + p)
    if count_include_pad: ext = end - start
    else: ext = end.minimum(s) - start.maximum(0)
    extents.append(ext.reshape(tuple(o if i == d else 1 for i in range(2))).broadcast_to(out_sp))
  return (extents[0] * extents[1]).cast(dtypes.float32)


def _divide(total: LT, div: LT) -> LT:
  """Window sum / divisor; integer pooling truncates toward zero, as eager's integer division."""
  return total / div if total.dtype.is_float else total.alu(Ops.IDIV, div)


@register(aten.avg_pool2d.default)
def avg_pool2d(ctx, x, kernel, stride=(), padding=(0,), ceil_mode=False, count_include_pad=True, divisor_override=None):
  kernel, stride, padding, _ = _pool_args(x, kernel, stride, padding, (1,))
  unbatched = x.ndim == 3
  if unbatched: x = x.unsqueeze(0)
  n, c, h, w = x.shape
  oh, ow = (_pool_geometry(s, k, st, p, 1, ceil_mode) for s, k, st, p in zip((h, w), kernel, stride, padding))
  acc = compute_dtype(x.dtype)
  need = [(o - 1) * st + k for o, st, k in zip((oh, ow), stride, kernel)]
  xp = x.cast(acc).pad([(0, 0), (0, 0)] + [(p, max(0, nd_ - s - p)) for p, nd_, s in zip(padding, need, (h, w))])
  hp, wp = xp.shape[2:]
  kh, kw = kernel
  win = xp.as_strided((n, c, oh, ow, kh, kw), (c * hp * wp, hp * wp, stride[0] * wp, stride[1], wp, 1))
  total = win.sum((4, 5), keepdim=False)
  div = _avg_pool_divisor((oh, ow), (h, w), kernel, stride, padding, count_include_pad, divisor_override)
  out = _divide(total, div.cast(acc).reshape((1, 1, oh, ow)).broadcast_to(total.shape)).cast(ctx.dtype)
  return out.reshape((c, oh, ow)) if unbatched else out


@register(aten.avg_pool2d_backward.default)
def avg_pool2d_backward(ctx, grad, x, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override):
  """Each input position sums grad/divisor over the few output windows that hold it (a gather, no scatter)."""
  kernel, stride, padding, _ = _pool_args(x, kernel, stride, padding, (1,))
  unbatched = x.ndim == 3
  if unbatched: x, grad = x.unsqueeze(0), grad.unsqueeze(0)
  n, c, h, w = x.shape
  oh, ow = grad.shape[2:]
  acc = compute_dtype(grad.dtype)
  div = _avg_pool_divisor((oh, ow), (h, w), kernel, stride, padding, count_include_pad, divisor_override).cast(acc)
  g = grad.cast(acc) / div.reshape((1, 1, oh, ow)).broadcast_to(grad.shape)
  shape = (n, c, h, w)
  rows = LT.iota(h).reshape((1, 1, h, 1)).broadcast_to(shape)
  cols = LT.iota(w).reshape((1, 1, 1, w)).broadcast_to(shape)
  total = None
  for j in range((kernel[0] - 1) // stride[0] + 1):
    cand_h = (rows + padding[0]).alu(Ops.IDIV, stride[0]) - j
    for i in range((kernel[1] - 1) // stride[1] + 1):
      cand_w = (cols + padding[1]).alu(Ops.IDIV, stride[1]) - i
      valid = (cand_h >= 0) & (cand_h < oh) & (cand_w >= 0) & (cand_w < ow)
      valid = valid & (rows < cand_h * stride[0] - padding[0] + kernel[0]) & (cols < cand_w * stride[1] - padding[1] + kernel[1])
      picked = g.gather_nd((0, 1, ("idx", 0), ("idx", 1)), [cand_h, cand_w])
      term = valid.where(picked, 0.0)
      total = term if total is None else total + term
  out = total.cast(ctx.dtype)
  return out.reshape((c, h, w)) if unbatched else out


@register(aten._weight_norm_interface_backward.default)
def weight_norm_interface_backward(ctx, grad_w, v, g, norms, dim):
  """w = g * v / |v|, the norm over every dim but `dim` (g and norms keep size 1 there): the gradients of g, the
  sum of grad_w * v over those dims / |v|, and of v, g / |v| * (grad_w - v * grad_g / |v|)."""
  acc = compute_dtype(grad_w.dtype)
  gw, v, g, norms = grad_w.cast(acc), v.cast(acc), g.cast(acc), norms.cast(acc)
  others = tuple(i for i in range(v.ndim) if i != dim % v.ndim)
  grad_g = (gw * v).sum(others, keepdim=True) / norms
  grad_v = g / norms * (gw - v * (grad_g / norms))
  return grad_v.cast(ctx.dtype_of(0)), grad_g.cast(ctx.dtype_of(1))


@register(aten._adaptive_avg_pool2d_backward.default)
def adaptive_avg_pool2d_backward(ctx, grad, x):
  """Output window o covers [o*S//O, ceil((o+1)*S/O)); each input position sums grad/area over the windows
  that cover it: two masked sums, one per spatial dim."""
  unbatched = x.ndim == 3
  if unbatched: x, grad = x.unsqueeze(0), grad.unsqueeze(0)
  n, c, h, w = x.shape
  oh, ow = grad.shape[2:]
  acc = compute_dtype(grad.dtype)

  def cover(size, out):  # [size, out] bool mask and [out] window lengths
    o = LT.iota(out)
    start, end = (o * size).alu(Ops.IDIV, out), ((o + 1) * size + out - 1).alu(Ops.IDIV, out)
    pos = LT.iota(size).reshape((size, 1)).broadcast_to((size, out))
    mask = (start.reshape((1, out)).broadcast_to((size, out)) <= pos) & (pos < end.reshape((1, out)).broadcast_to((size, out)))
    return mask, (end - start).cast(acc)

  mh, lh = cover(h, oh)
  mw, lw = cover(w, ow)
  area = lh.reshape((oh, 1)).broadcast_to((oh, ow)) * lw.reshape((1, ow)).broadcast_to((oh, ow))
  g = grad.cast(acc) / area.reshape((1, 1, oh, ow)).broadcast_to(grad.shape)
  t = mw.reshape((1, 1, 1, w, ow)).broadcast_to((n, c, oh, w, ow)).where(g.reshape((n, c, oh, 1, ow)).broadcast_to((n, c, oh, w, ow)), 0.0)
  t = t.sum((4,), keepdim=False)                                                                   # [n, c, oh, w]
  full = (n, c, h, oh, w)
  out = mh.reshape((1, 1, h, oh, 1)).broadcast_to(full).where(t.reshape((n, c, 1, oh, w)).broadcast_to(full), 0.0).sum((3,), keepdim=False)
  out = out.cast(ctx.dtype)
  return out.reshape((c, h, w)) if unbatched else out


def _attention_scores(q: LT, k: LT, attn_mask, is_causal: bool, scale, rows: tuple, cols: tuple) -> LT:
  """scale * q @ k^T with the mask applied, where q holds the query rows [rows) and k the keys [cols) of the whole
  attention (the mask is sliced to match; a causal mask compares the rows' and keys' true positions)."""
  *_, lq, d = q.shape
  lk = k.shape[-2]
  scale = scale if scale is not None else 1.0 / math.sqrt(d)
  s = matmul(q, k.transpose(-1, -2)) * scale
  if attn_mask is not None:
    for dim, (start, end) in ((-2, rows), (-1, cols)):
      if attn_mask.ndim >= -dim and attn_mask.shape[dim] != 1 and (start, end) != (0, attn_mask.shape[dim]):
        attn_mask = attn_mask.slice(dim, start, end)
    if attn_mask.dtype.is_bool: s = attn_mask.broadcast_to(s.shape).where(s, -math.inf)
    else: s = s + attn_mask.cast(s.dtype).broadcast_to(s.shape)
  if is_causal:
    qpos = LT.iota(lq).reshape((lq, 1)).broadcast_to((lq, lk)) + rows[0]
    kpos = LT.iota(lk).reshape((1, lk)).broadcast_to((lq, lk)) + cols[0]
    s = (kpos <= qpos).broadcast_to(s.shape).where(s, -math.inf)
  return s


# The attention scores of a block of query rows, all heads of the batch, take about this many bytes, so that the
# matmul that writes them, the softmax over them and the matmul that reads them run out of the cache instead of
# memory (UNet's 1024-token self-attention at 8 heads: 32 MiB of scores unblocked; 24 -> 11 ms on a Zen 3). The
# blocks are kernels of their own, in order.
ATTENTION_BLOCK_BYTES = 4 << 20
ATTENTION_BLOCK_MIN = 32  # fewer rows per block and the kernels' fixed costs outweigh what the cache saves


def _blocks(batch: tuple, length, across) -> list:
  """Even [start, end) ranges along an attention axis of `length` whose scores (`across` wide) take about
  ATTENTION_BLOCK_BYTES each; one range when the axis holds less than two such blocks or sizes are symbolic."""
  if any(map(is_sym, (*batch, length, across))): return [(0, length)]
  per_row = max(1, math.prod(batch) * across * 4)
  count = length // max(ATTENTION_BLOCK_MIN, ATTENTION_BLOCK_BYTES // per_row)
  if count < 2: return [(0, length)]
  size = -(-length // count)  # even blocks: no short one at the end
  return [(s, min(length, s + size)) for s in range(0, length, size)]


@register(aten._scaled_dot_product_flash_attention_for_cpu.default)
def sdpa_flash_cpu(ctx, q, k, v, dropout_p=0.0, is_causal=False, attn_mask=None, scale=None):
  """Attention forward: output and the row log-sum-exp its backward needs, by blocks of query rows (_blocks)."""
  if dropout_p: raise Unsupported("attention dropout")
  acc = compute_dtype(q.dtype)
  q, k, v = q.cast(acc), k.cast(acc), v.cast(acc)
  *batch, lq, _ = q.shape
  lk = k.shape[-2]
  outs, lses = [], []
  for rows in _blocks(tuple(batch), lq, lk):
    s = _attention_scores(q.slice(-2, *rows), k, attn_mask, is_causal, scale, rows, (0, lk))
    m = s.max((-1,), keepdim=True)
    m_safe = m.eq(-math.inf).where(0.0, m)           # rows with every score masked give 0, not NaN
    e = (-(s - m_safe.broadcast_to(s.shape)).math("abs")).exp()  # s - max <= 0: exp's cheaper form (as softmax's)
    total = e.sum((-1,), keepdim=True)
    divisor = total.eq(0.0).where(1.0, total)        # ... and probabilities 0 (eager's output there is 0)
    # normalized after the product, as eager's flash kernel does: lq x dv multiplies by the reciprocal (divisor >= 1)
    # in place of lq x lk divisions
    out = matmul(e, v)
    outs.append((out * divisor.recip().broadcast_to(out.shape)).cast(ctx.dtype_of(0)))
    lses.append((m_safe + total.log()).squeeze_dims((-1,)).cast(ctx.dtype_of(1)))
  return concat(outs, -2), concat(lses, -1)


# The attention backward's shares of dk and dv (one per block of query rows) are summed in groups of this many, each
# group's sum written out as soon as its shares exist, then the sums the same way: the scheduler runs each sum right
# after its last share and frees the shares (core/schedule.py _freeing_first_order). Summed after the last block, all
# of them were alive at once: the UNet's 4096-token attention at 64x64 latents has 128 blocks, whose shares held
# 512 MB (a training step's peak 742 MB, eager's 330).
SHARE_SUM_GROUP = 4


def _summed_as_they_come(parts: list) -> LT:
  """The sum of `parts` (in order), as a tree of sums of SHARE_SUM_GROUP, each but the last written out."""
  def total(group): return functools.reduce(operator.add, group)
  return total(joined_in_groups(parts, SHARE_SUM_GROUP, total))


@register(aten._scaled_dot_product_flash_attention_for_cpu_backward.default)
def sdpa_flash_cpu_backward(ctx, grad_out, q, k, v, out, logsumexp, dropout_p, is_causal, attn_mask=None, scale=None):
  """Attention backward from the saved output and row log-sum-exp (the flash-attention identities), in one pass over
  blocks of query rows (_blocks): each block's probabilities and score gradients are computed once and give that
  block's dq and its shares of dk and dv (sums over the query rows), which are added up after the last block. The
  scheduler runs each block's products right after its scores (core/schedule.py), while they are in the cache.
  (Before: dq by blocks of rows and dk, dv by blocks of keys, each recomputing its scores: UNet's 1024-token
  attention, forward + backward, 0.42-0.59x eager -> 0.91-0.96x on a Zen 3.)"""
  if dropout_p: raise Unsupported("attention dropout")
  acc = compute_dtype(q.dtype)
  q, k, v, o, do = (t.cast(acc) for t in (q, k, v, out, grad_out))
  *batch, lq, d = q.shape
  lk = k.shape[-2]
  scale = scale if scale is not None else 1.0 / math.sqrt(d)
  lse = logsumexp.cast(acc).unsqueeze(-1)                                 # [.., Lq, 1]
  lse = lse.eq(-math.inf).where(math.inf, lse)                            # a row masked whole: probabilities 0
  delta = (do * o).sum((-1,), keepdim=True)                               # [.., Lq, 1]
  keys_transposed = not is_sym(lk) and lk % VECTOR_UPCAST == 0

  def share(x, y):  # x^T @ y over the block's rows, as (y^T @ x)^T where the keys are laid out along the vectors
    return matmul(y.transpose(-1, -2), x) if keys_transposed else matmul(x.transpose(-1, -2), y)

  dq, dk_parts, dv_parts = [], [], []
  for rows in _blocks(tuple(batch), lq, lk):
    qb, dob = q.slice(-2, *rows), do.slice(-2, *rows)
    s = _attention_scores(qb, k, attn_mask, is_causal, scale, rows, (0, lk))
    p = (s - lse.slice(-2, *rows).broadcast_to(s.shape)).exp()          # exp(-inf) = 0 where masked
    dp = matmul(dob, v.transpose(-1, -2))
    ds = p * (dp - delta.slice(-2, *rows).broadcast_to(dp.shape)) * scale  # the scores' gradient times the scale
    dq.append(matmul(ds, k).cast(ctx.dtype_of(0)))
    # each block's share of dk and dv is a product of its own, summed in groups as they come (added in each product's
    # epilogue instead, the running sum's loads disturb LLVM's vectorization of the tile). Where the keys fill whole
    # vectors the shares are computed transposed (do^T p, q^T ds), SIMD along the keys, reading the block's
    # probabilities row-major where p^T @ do would read them down their columns or copy them transposed first
    dv_parts.append(share(p, dob))
    dk_parts.append(share(ds, qb))
  dk, dv = _summed_as_they_come(dk_parts), _summed_as_they_come(dv_parts)
  if keys_transposed: dk, dv = dk.transpose(-1, -2), dv.transpose(-1, -2)
  return concat(dq, -2), dk.cast(ctx.dtype_of(1)), dv.cast(ctx.dtype_of(2))


def _adaptive_mask(size: int, out: int) -> LT:
  """[size, out] bool: input position s lies in output window o = [o*S//O, ceil((o+1)*S/O))."""
  o = LT.iota(out)
  start, end = (o * size).alu(Ops.IDIV, out), ((o + 1) * size + out - 1).alu(Ops.IDIV, out)
  pos = LT.iota(size).reshape((size, 1)).broadcast_to((size, out))
  return (start.reshape((1, out)).broadcast_to((size, out)) <= pos) & (pos < end.reshape((1, out)).broadcast_to((size, out)))


def _windowed(cur: LT, axis: int, out: int):
  """cur [.., S, ..] -> ([.., S, O, ..] view of cur, [.., S, O, ..] window mask) along axis."""
  size = cur.shape[axis]
  full = cur.shape[:axis + 1] + (out,) + cur.shape[axis + 1:]
  xv = cur.unsqueeze(axis + 1).broadcast_to(full)
  mask = _adaptive_mask(size, out).reshape(tuple(size if d == axis else out if d == axis + 1 else 1 for d in range(len(full))))
  return xv, mask.broadcast_to(full)


@register(aten._adaptive_avg_pool3d.default, aten._adaptive_avg_pool2d.default)
def adaptive_avg_pool(ctx, x, output_size):
  """Adaptive average pooling is separable: average over each spatial dim's windows in turn."""
  k = len(output_size)
  acc = compute_dtype(x.dtype)
  cur = x.cast(acc)
  for i in range(k):
    axis = x.ndim - k + i
    xv, mask = _windowed(cur, axis, output_size[i])
    total = mask.where(xv, 0.0).sum((axis,), keepdim=False)
    count = mask.cast(acc).sum((axis,), keepdim=False)
    cur = total / count
  return cur.cast(ctx.dtype)


@register(aten.adaptive_max_pool2d.default, aten.adaptive_max_pool3d.default)
def adaptive_max_pool(ctx, x, output_size):
  """Separable max over each spatial dim's windows, last dim first, carrying the flat index of the
  first maximum (row-major, as eager scans the window)."""
  k = len(output_size)
  if x.numel() == 0: raise Unsupported("empty adaptive max pool")
  cur, flat = x, None
  stride = 1
  for i in reversed(range(k)):
    axis = x.ndim - k + i
    size = x.shape[axis]
    xv, mask = _windowed(cur, axis, output_size[i])
    low = -math.inf if x.dtype.is_float else x.dtype.min()
    m = mask.where(xv, low).reduce(Ops.MAX, (axis,), True)
    hit = mask & xv.eq(m.broadcast_to(xv.shape))
    pos = LT.iota_along(xv.shape, axis)
    sel = hit.where(pos, size).reduce(Ops.MIN, (axis,), False).minimum(size - 1)      # [.., O, ..]
    if flat is None: flat = sel
    else:
      inner = flat.gather_nd(tuple(("idx", 0) if d == axis else d for d in range(flat.ndim)), [sel])
      flat = sel * stride + inner
    stride *= size
    cur = m.squeeze_dims((axis,))
  return cur.cast(ctx.dtype_of(0)), flat.cast(ctx.dtype_of(1))


@register(aten.avg_pool3d.default)
def avg_pool3d(ctx, x, kernel, stride=(), padding=(0,), ceil_mode=False, count_include_pad=True, divisor_override=None):
  """Window sums over a strided view of the padded input, divided per window as eager does."""
  nd = 3
  kernel = tuple(kernel) * (nd if len(kernel) == 1 else 1)
  stride = tuple(stride) if stride else kernel
  stride = stride * (nd if len(stride) == 1 else 1)
  padding = tuple(padding) * (nd if len(padding) == 1 else 1)
  unbatched = x.ndim == 4
  if unbatched: x = x.unsqueeze(0)
  n, c, *size = x.shape
  out = [_pool_geometry(s, k, st, p, 1, ceil_mode) for s, k, st, p in zip(size, kernel, stride, padding)]
  acc = compute_dtype(x.dtype)
  need = [(o - 1) * st + k for o, st, k in zip(out, stride, kernel)]
  xp = x.cast(acc).pad([(0, 0), (0, 0)] + [(p, max(0, nd_ - s - p)) for p, nd_, s in zip(padding, need, size)])
  sp = xp.shape[2:]
  cstr = [sp[1] * sp[2], sp[2], 1]
  plane = math.prod(sp)
  win = xp.as_strided((n, c, *out, *kernel), (c * plane, plane, *[cs * st for cs, st in zip(cstr, stride)], *cstr))
  total = win.sum((5, 6, 7), keepdim=False)
  if divisor_override: div = LT.full(tuple(out), float(divisor_override), acc)
  else:
    div = None
    for d, (o, s, k, st, p) in enumerate(zip(out, size, kernel, stride, padding)):
      start = LT.iota(o) * st - p
      end = (start + k).minimum(s + p)
      ext = (end - start) if count_include_pad else (end.minimum(s) - start.maximum(0))
      ext = ext.cast(acc).reshape(tuple(o if i == d else 1 for i in range(nd))).broadcast_to(tuple(out))
      div = ext if div is None else div * ext
  res = _divide(total, div.reshape((1, 1, *out)).broadcast_to(total.shape)).cast(ctx.dtype)
  return res.reshape(ctx.shape) if unbatched else res


# ---- nearest-neighbour resize (F.interpolate(mode="nearest" / "nearest-exact")) and its gradient
# Output position o of a resized dim reads input position src(o), computed as eager's CPU kernel computes it (float32
# arithmetic, so the Python tables below and the kernels agree bit for bit). The usual integer factor (a UNet's or an
# FPN's 2x) is a broadcast view forward and a plain window sum backward; any other ratio is a gather forward and, for
# each input position, a masked sum over the few output positions that can read it backward: never a scatter, nor a
# scan of every output position per input position (what the decomposition's index_put with accumulate becomes),
# except per dim under symbolic sizes, where the window is not known when compiling.

def _static(*sizes) -> bool: return not any(map(is_sym, sizes))


def _given_scale(scale):
  """eager's compute_scales_value for a scale the op was given: 1/scale as float32; None where it uses in/out."""
  return np.float32(1.0 / scale) if scale is not None and scale > 0 else None


def _nearest_table(in_size: int, out_size: int, scale, exact: bool) -> list:
  """[src(o) for each output position o] of static sizes, exactly as eager's nearest_idx / nearest_exact_idx."""
  o = np.arange(out_size)
  if not exact and out_size == in_size: return o.tolist()
  if not exact and out_size == 2 * in_size: return (o >> 1).tolist()
  s = _given_scale(scale)
  if s is None: s = np.float32(in_size) / np.float32(out_size)
  t = np.float32((o + 0.5) * np.float64(s)) if exact else o.astype(np.float32) * s
  return np.minimum(np.floor(t).astype(np.int64), in_size - 1).tolist()


def _nearest_source(o: LT, in_size, out_size, scale, exact: bool) -> LT:
  """src(o) for an int64 LT of output positions, as the kernel computes it (matches `_nearest_table`); sizes may be
  symbolic (their comparisons below guard the graph)."""
  if not exact and out_size == in_size: return o
  if not exact and out_size == 2 * in_size: return o.alu(Ops.SHR, 1)
  f32 = dtypes.float32
  given = _given_scale(scale)
  if given is not None: s = LT.full(o.shape, float(given), f32)
  else: s = LT.full(o.shape, in_size, f32) / LT.full(o.shape, out_size, f32)
  t = ((o.cast(dtypes.float64) + 0.5) * s.cast(dtypes.float64)).cast(f32) if exact else o.cast(f32) * s
  return t.math("floor").cast(dtypes.int64).minimum(in_size - 1)


def _nearest_factor(in_size, out_size, scale, exact: bool) -> int | None:
  """r when src(o) = o // r for every o (out = r * in): the resize of this dim is a broadcast of each position r times.
  Checked on the whole table for static sizes; under symbolic ones only eager's own shortcuts (out = in, out = 2 in)."""
  if _static(in_size, out_size):
    table = _nearest_table(in_size, out_size, scale, exact)
    r, rem = divmod(out_size, in_size)
    return r if rem == 0 and all(v == o // r for o, v in enumerate(table)) else None
  if exact: return None
  return 1 if out_size == in_size else 2 if out_size == 2 * in_size else None


_SCALE_NAMES = {1: ("scales",), 2: ("scales_h", "scales_w"), 3: ("scales_d", "scales_h", "scales_w")}


def _scales(nd: int, scales: tuple, named: dict) -> list:
  """The per-dim scales of a call, given positionally or by name (None where not given)."""
  scales = tuple(scales) + tuple(named.get(k) for k in _SCALE_NAMES[nd][len(scales):])
  return (list(scales) + [None] * nd)[:nd]


def _upsample_nearest(ctx, x, output_size, *scales, nd: int, exact: bool = False, **named):
  """x resized along its last nd dims; `scales`: the .default overloads' per-dim scales, or the .vec overloads'
  one list of scale factors (their output size, given or not, is the node's)."""
  if ctx.node.target._overloadname == "vec":
    factors = named.pop("scale_factors", scales[0] if scales else None)
    scales = tuple(factors) if factors else ()
  scale_list = _scales(nd, scales, named)
  shape = ctx.shape
  if x.numel() == 0 or 0 in shape: return LT.full(shape, 0, ctx.dtype)
  lead = x.ndim - nd
  factors = [_nearest_factor(x.shape[lead + d], shape[lead + d], scale_list[d], exact) for d in range(nd)]
  if all(f is not None for f in factors):
    inner, broad = [], []
    for d, f in enumerate(factors): inner += [x.shape[lead + d], 1]; broad += [x.shape[lead + d], f]
    return x.reshape(x.shape[:lead] + tuple(inner)).expand(x.shape[:lead] + tuple(broad)).reshape(shape)
  indices = [_nearest_source(LT.iota_along(shape, lead + d), x.shape[lead + d], shape[lead + d], scale_list[d], exact)
             for d in range(nd)]
  return x.gather_nd(tuple(range(lead)) + tuple(("idx", d) for d in range(nd)), indices)


def _upsample_nearest_backward(ctx, grad, output_size, input_size, *scales, exact: bool = False, **named):
  """Each input position sums the gradient of the output positions that read it: a window sum over the factor's
  axes for integer factors, else one dim at a time (the mapping is separable) a masked sum over its readers."""
  nd = len(output_size)
  scale_list = _scales(nd, scales, named)
  in_shape = tuple(input_size)
  if 0 in in_shape or grad.numel() == 0: return LT.full(ctx.shape, 0, ctx.dtype)
  lead = len(in_shape) - nd
  g = grad.cast(compute_dtype(grad.dtype))   # half types accumulate in float32, as eager's kernel does
  factors = [_nearest_factor(in_shape[lead + d], grad.shape[lead + d], scale_list[d], exact) for d in range(nd)]
  if any(f not in (None, 1) for f in factors):   # the integer-factor dims at once: [.., i, r, ..] summed over the r's
    split, axes = list(g.shape[:lead]), []
    for d, f in enumerate(factors):
      if f is None: split.append(g.shape[lead + d]); continue
      split += [in_shape[lead + d], f]; axes.append(len(split) - 1)
    g = g.reshape(tuple(split)).sum(tuple(axes), keepdim=False)
  for d in range(nd):
    if factors[d] is None: g = _nearest_backward_dim(g, lead + d, in_shape[lead + d], scale_list[d], exact)
  return g.cast(ctx.dtype)


def _nearest_backward_dim(g: LT, axis: int, in_size, scale, exact: bool) -> LT:
  """g summed along axis into in_size positions, each over the output positions o with src(o) = it."""
  out_size = g.shape[axis]
  shape = g.shape[:axis] + (in_size,) + g.shape[axis + 1:]
  i = LT.iota_along(shape, axis)
  if not _static(in_size, out_size):   # every output position is a candidate: [.., in, out, ..] masked and summed
    full = shape[:axis + 1] + (out_size,) + shape[axis + 1:]
    o = LT.iota_along(full, axis + 1)
    hit = _nearest_source(o, in_size, out_size, scale, exact).eq(i.unsqueeze(axis + 1).broadcast_to(full))
    return hit.where(g.unsqueeze(axis).broadcast_to(full), 0.0).sum((axis + 1,), keepdim=False)
  readers: dict = {}
  for o, src in enumerate(_nearest_table(in_size, out_size, scale, exact)): readers.setdefault(src, []).append(o)
  # candidates base(i) + j, j < k, with base(i) = i * out // in + shift: shift and k are the least that cover every
  # reader of every input position (src is monotone, so each one's readers are consecutive)
  shift = min(os[0] - i * out_size // in_size for i, os in readers.items())
  k = max(os[-1] - (i * out_size // in_size + shift) + 1 for i, os in readers.items())
  base = (i * out_size).alu(Ops.IDIV, in_size) + shift
  total = None
  for j in range(k):
    o = base + j
    oc = o.maximum(0).minimum(out_size - 1)
    hit = (o >= 0) & (o < out_size) & _nearest_source(oc, in_size, out_size, scale, exact).eq(i)
    term = hit.where(g.gather_nd(tuple(("idx", 0) if a == axis else a for a in range(len(shape))), [oc]), 0.0)
    total = term if total is None else total + term
  return total


for _nd in (1, 2, 3):
  for _exact, _name in ((False, "upsample_nearest"), (True, "_upsample_nearest_exact")):
    _fwd, _bwd = getattr(aten, f"{_name}{_nd}d"), getattr(aten, f"{_name}{_nd}d_backward")
    register(_fwd.default, _fwd.vec)(functools.partial(_upsample_nearest, nd=_nd, exact=_exact))
    register(_bwd.default)(functools.partial(_upsample_nearest_backward, exact=_exact))
