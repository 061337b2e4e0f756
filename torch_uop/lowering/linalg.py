"""Matmul and convolution lowerings, as generated kernels (no ATen calls).

A matmul is a broadcast multiply reduced over K: `a[M,1,K] * b[1,N,K]`, summed over the last axis (b copied
into panels or along N where that gives the register tiles a better SIMD axis).
A 2-D convolution is, by the first that applies: one GEMM over patches (kernel = stride, no padding); an im2col
GEMM (a dense strided one whose phases would add more than PHASE_MAX_WASTE taps); a stride-1 convolution over
padded rows (strided ones over their s*s phases). A 1-D convolution is a 2-D one over a single row; a 3-D one is a
2-D one over N*OD images whose channels are the input's channels times the depth taps (each output depth's input
planes written out side by side), so both take those paths, in forward and backward. Otherwise (symbolic sizes,
few channels) it is the window view: the padded input seen as `[N, G, 1, Cg, *out, *kernel]` through `as_strided`
(no copy) times the weight `[1, G, Og, Cg, 1.., *kernel]`, summed over `(Cg, *kernel)`. The input gradient of a
strided 2-D convolution is a stride-1 convolution per phase, a 3-D one's the 2-D one's summed back onto the depth
planes; otherwise a convolution of the zero-stuffed input with the flipped, transposed weight. A transposed
convolution is one GEMM where its kernel equals its stride (no padding), the input gradient above where it is
strided (no dilation), else that zero-stuffed convolution. The weight gradient reduces over padded rows or im2col rows, or the window view times the
output gradient, summed over batch and output positions.
"""
from __future__ import annotations
import math
from typing import NamedTuple
import torch
from torch_uop.core.uop import Ops
from torch_uop.lowering.registry import register, Unsupported
from torch_uop.lowering.scope import graph_scope
from torch_uop.lowering.tensor import LT, compute_dtype
from torch_uop.core.sym import is_sym
from torch_uop.core.opt import VECTOR_UPCAST, SWEEP_CACHE_BYTES
from torch_uop.lowering.movement import cat

aten = torch.ops.aten


def _indexable(x: LT) -> LT:
  """x, or a copy of it where reading it needs divisions (a reshape of a permuted tensor, such as attention's heads
  merged back into a row): the GEMM would otherwise divide in its inner loop, and the copy is one pass over x."""
  return x.contiguous() if x.uop.op is Ops.VIEW and len(x.uop.arg.views) > 1 else x


SHORT_REDUCE = 128  # a GEMM reducing over fewer elements than this gets its SIMD along N, not along K
PAD_N_MIN = 4 * VECTOR_UPCAST  # ... over N padded to whole vectors where N is at least this (the padding costs < 25%)


def _column_major(x: LT) -> bool:
  """Whether x [.., R, C] is a view read contiguously down its columns (strides [.., 1, s]): a b read along K
  (attention's k.transpose(-1, -2), nn.Linear's W.T), or an a read along M (a weight gradient's dh.t())."""
  if x.uop.op is not Ops.VIEW or len(x.uop.arg.views) != 1: return False
  strides = x.uop.arg.views[0].strides
  return strides[-2] == 1 and strides[-1] != 1


def matmul(a: LT, b: LT) -> LT:
  """Batched matmul over the last two dims; batch dims must already match."""
  a, b = _indexable(a), _indexable(b)
  if _copies_transposed_a(a, b): a = a.contiguous()
  *batch, m, k = a.shape
  n = b.shape[-1]
  acc = compute_dtype(a.dtype)
  if _packs(a, b): return _panel_matmul(a.cast(acc), b.cast(acc))
  # with a short K (attention scores at head size 16 to 64), SIMD along K would spend more on each output's horizontal
  # sum than on its products: b laid out along N (one pass over it, N x K elements) gives SIMD along N instead. The
  # optimizer puts no SIMD on an axis with a partial last vector, so the copy pads N to whole vectors (ViT's 197
  # tokens: 208) and the result drops the padding columns.
  if not any(map(is_sym, (k, n))) and k < SHORT_REDUCE and _column_major(b):
    if n % VECTOR_UPCAST == 0: b = b.contiguous()
    elif n >= PAD_N_MIN:
      padded = b.pad([(0, 0)] * (b.ndim - 1) + [(0, -n % VECTOR_UPCAST)]).contiguous()
      return matmul(a, padded).shrink([(0, d) for d in (*batch, m)] + [(0, n)])
  a3 = a.cast(acc).reshape((*batch, m, 1, k)).expand((*batch, m, n, k))
  b3 = b.cast(acc).transpose(-1, -2).reshape((*batch, 1, n, k)).expand((*batch, m, n, k))
  return (a3 * b3).sum((len(batch) + 2,), keepdim=False)


PANEL = 2 * VECTOR_UPCAST   # columns of b per packed panel: a whole register tile's width (core/opt.py)
PACK_MIN_BYTES = 4 << 20    # a W.T (read along K) this big is packed on a CPU with 32 registers, and any b on a GPU
PACK_MIN_ROWS = 64          # enough rows that each panel is reused by several tiles (the copy costs one pass over b)
SHORT_REDUCE_PER_ROW = 6   # x @ W.T with 16 vector registers: packed where K is at most this many times the rows (below)
PACK_SHORT_K = 640          # x @ W.T with 32 vector registers: packed where K is at most this, whatever W's size (below)


def _packs(a: LT, b: LT) -> bool:
  """Whether x @ b reads a big b [K, N] through packed panels. Laid out along N, a register tile walks b down a
  column strip of PANEL floats, one row of K at a time; when b's rows are far apart, the strip's lines collide in the
  cache's sets (a row of 3072 floats is 12 KiB: every row maps to the same few sets), so the strip is fetched again
  from memory for every tile of rows. Packed, each strip is K x PANEL contiguous floats and stays in L2. On a CPU
  with 16 vector registers (AVX2) a b laid out along N is packed from SWEEP_CACHE_BYTES (past L2 its strip is
  fetched from L3 for every tile of rows: BERT-512's weight gradients dh.t() @ x, x 512 x 768, 19 -> 13.4 ms). With
  32 registers too (b of 1-4 MiB, 2 threads of an AVX-512 Xeon, GFLOP/s as it lies / packed: dh.t() @ x with x
  512 x 768 212 / 272, 128 x 3072 274 / 323; GPT-2's x @ W at 128 x 768 x 768 310 / 320).

  Laid out along K (x @ W.T), the panels replace SIMD along K for the same N-wide vector tiles, at the cost of a
  transposing copy of W (one pass, renderer/transpose.py). With 16 vector registers the K-SIMD tile is 3x3: each
  output ends in a horizontal sum and a scalar epilogue, a cost per output that a short K does not amortize, and the
  tile sweeps x once per 3 columns of W where a panel tile sweeps it once per PANEL. There, from PACK_MIN_ROWS rows,
  W is packed where it fits L2 (the copy is cheap), where K is at most SHORT_REDUCE_PER_ROW times the rows, or where x
  is past L2. Hot caches, one process, K-SIMD / packed ms on a Zen 3: DeiT-tiny's fc1 197 x 192 x 768 0.50 / 0.38,
  ViT-base's 197 x 768 x 768 1.62 / 1.42, BERT's 128 x 768 x 768 1.01 / 0.91 and 128 x 3072 x 768 4.94 / 4.78;
  where none holds the copy costs more than it saves: 64 x 768 x 768 0.47 / 0.50, Qwen2's 128 x 896 x 4864 8.1 /
  8.7. With 32 registers (4x4 K-SIMD tiles) W is packed where K is at most PACK_SHORT_K, and from PACK_MIN_BYTES.
  Hot caches, two threads of a Zen 4, GFLOP/s K-SIMD / packed: 256 x 128 x 512 139 / 212, DeiT-tiny's fc1 197 x 192 x
  768 170 / 220, 128 x 256 x 1024 181 / 216, 64 x 256 x 1024 174 / 204, 196 x 384 x 1536 196 / 213, 197 x 512 x 512
  200 / 218, SmolLM's 128 x 576 x 576 195 / 208 and 128 x 576 x 1536 206 / 216. A K-SIMD tile ends each output in a
  horizontal sum, which a longer K amortizes: from K = 768 on the two are about even and packing sometimes loses
  (128 x 768 x 768 214 / 219, 512 x 768 x 768 208 / 226, but 197 x 768 x 3072 210 / 207, 64 x 768 x 768 212 / 208,
  128 x 1024 x 1024 211 / 211, 128 x 3072 x 768 207 / 205)."""
  *batch, m, k = a.shape
  n = b.shape[-1]
  if batch or any(map(is_sym, (m, k, n))) or n % PANEL or m < PACK_MIN_ROWS or k < SHORT_REDUCE: return False
  vectors = graph_scope().vectors
  size = b.dtype.itemsize
  if vectors is None: return k * n * size >= PACK_MIN_BYTES  # a GPU
  along_k = _column_major(b)
  if along_k and vectors.registers < 32:
    return k * n * size <= SWEEP_CACHE_BYTES or k <= SHORT_REDUCE_PER_ROW * m or m * k * size > SWEEP_CACHE_BYTES
  if along_k and k <= PACK_SHORT_K: return True
  return k * n * size >= (PACK_MIN_BYTES if along_k else SWEEP_CACHE_BYTES)


TRANSPOSED_A_MIN_COLUMNS = 4 * VECTOR_UPCAST  # enough column tiles that each row strip of a is read several times


def _copies_transposed_a(a: LT, b: LT) -> bool:
  """Whether a [M, K] read down its columns (a weight gradient's dh.t() @ x) is first copied row-major. A register
  tile reads a strip of a few rows of a along K; transposed, that strip is K cache lines M floats apart, which fall
  into the same few cache sets (M = 3072: 12 KiB apart, one set of L1 and 32 of L2), so each column tile fetches the
  strip from memory again (3072 x 512 x 768: 37 ms as it lies, 19 ms over a row-major copy, on a Zen 3). The
  transposing copy is one pass over a at vector speed (core/opt.py's transpose tiles)."""
  *_, m, k = a.shape
  n = b.shape[-1]
  if graph_scope().vectors is None or any(map(is_sym, (m, k, n))) or not _column_major(a): return False  # a CPU's caches
  return m >= PACK_MIN_ROWS and k >= SHORT_REDUCE and n >= TRANSPOSED_A_MIN_COLUMNS


def _panel_matmul(a: LT, b: LT) -> LT:
  """a [M, K] @ b [K, N] over b packed as [N / PANEL, K, PANEL]. On a CPU, where a panel fits the CPU's
  VectorUnit.stage_bytes, the GEMM kernel packs each panel itself into a local array before its tiles of rows read it
  (LT.staged): b is read once, from where it lies, and no copy of it is in memory. Otherwise (and for the prologue of frozen weights) the
  packed copy is a buffer of its own."""
  m, k = a.shape
  n = b.shape[-1]
  panels = b.reshape((k, n // PANEL, PANEL)).permute((1, 0, 2))                           # [N/P, K, P]
  vectors = graph_scope().vectors
  staged = vectors is not None and k * PANEL * b.dtype.itemsize <= vectors.stage_bytes
  panels = panels.staged() if staged else panels.contiguous()
  full = (m, n // PANEL, PANEL, k)
  a4 = a.reshape((m, 1, 1, k)).expand(full)
  b4 = panels.permute((0, 2, 1)).reshape((1, n // PANEL, PANEL, k)).expand(full)
  return (a4 * b4).sum((3,), keepdim=False).reshape((m, n))


@register(aten.mm.default, aten.bmm.default)
def mm(ctx, a, b): return matmul(a, b).cast(ctx.dtype)


@register(aten.addmm.default)
def addmm(ctx, bias, a, b, beta=1, alpha=1):
  out = matmul(a, b)
  if alpha != 1: out = out * alpha
  if beta != 0:
    bb = bias.cast(out.dtype).broadcast_to(out.shape)
    out = out + (bb * beta if beta != 1 else bb)
  return out.cast(ctx.dtype)


def _windows(x: LT, groups: int, kernel: tuple, stride: tuple, dilation: tuple, out_sp: tuple) -> LT:
  """x: [N, C, *spatial] (already padded) -> [N, G, Cg, *out, *kernel] window view."""
  n, c, *sp = x.shape
  cg = c // groups
  cstr = [1] * len(sp)
  for i in range(len(sp) - 2, -1, -1): cstr[i] = cstr[i + 1] * sp[i + 1]
  plane = math.prod(sp)
  shape = (n, groups, cg, *out_sp, *kernel)
  strides = (c * plane, cg * plane, plane, *[cs * s for cs, s in zip(cstr, stride)], *[cs * d for cs, d in zip(cstr, dilation)])
  return x.as_strided(shape, strides)


def _one_row(t: LT) -> LT:
  """A 1-D convolution's [N, C, L] tensor (input, weight or gradient) as a 2-D one's of a single row: [N, C, 1, L]."""
  return t.reshape((t.shape[0], t.shape[1], 1, t.shape[2]))


def _without_row(t: LT | None) -> LT | None:
  """The single-row 2-D result ([N, C, 1, L]) of a 1-D convolution as the 1-D one's [N, C, L] (None stays None)."""
  return None if t is None else t.reshape((t.shape[0], t.shape[1], t.shape[3]))


def _one_row_params(stride, padding, dilation, output_padding=(0,)) -> tuple:
  """A 1-D convolution's stride, padding, dilation and output padding (one value each) as those of a single-row 2-D
  convolution: the row axis has stride 1, no padding, dilation 1, no output padding."""
  return tuple((neutral, *v) for neutral, v in zip((1, 0, 1, 0), (stride, padding, dilation, output_padding)))


def _depth_as_channels(x: LT, kd: int, sd: int, pd: int, dd: int) -> tuple[LT, int]:
  """A 3-D convolution's input [N, C, D, H, W] as the input of a 2-D one, [N*OD, C*kd, H, W], and OD: image
  (n, t) holds as channel (c, a) the plane that output depth t reads with depth tap a, t*sd + a*dd - pd of channel
  c (zeros past the ends). The 2-D convolution of that with the weight [O, Cg*kd, kh, kw] (its depth taps as
  channels, _depth_taps_as_channels) is the 3-D one, each group's channels still side by side: so 3-D convolutions
  take the 2-D paths (GEMMs over rows, phases, im2col) at the cost of writing the kd-fold input out (its copy loops
  over [N, OD, C, kd, H, W] with affine indices, no masks or divisions, so it runs at copy speed)."""
  n, c, d, h, wd = x.shape
  od = (d + 2 * pd - dd * (kd - 1) - 1) // sd + 1
  if od <= 0: raise Unsupported("empty convolution output")
  if pd: x = x.pad([(0, 0), (0, 0), (pd, pd), (0, 0), (0, 0)]).contiguous()
  dp, plane = d + 2 * pd, h * wd
  taps = x.as_strided((n, od, c, kd, h, wd), (c * dp * plane, sd * plane, dp * plane, dd * plane, wd, 1))
  return taps.contiguous().reshape((n * od, c * kd, h, wd)), od


def _depth_taps_as_channels(w: LT) -> LT:
  """A 3-D weight [O, Cg, kd, kh, kw] as the 2-D one over _depth_as_channels's input: [O, Cg*kd, kh, kw]."""
  o, cg, kd, kh, kw = w.shape
  return w.reshape((o, cg * kd, kh, kw))


def _depth_from_batch(t: LT, n: int, od: int) -> LT:
  """A result over the N*OD images of _depth_as_channels, [N*OD, C, H, W], as the 3-D [N, C, OD, H, W]."""
  return t.reshape((n, od, *t.shape[1:])).permute((0, 2, 1, 3, 4))


def _depth_to_batch(t: LT) -> LT:
  """A 3-D convolution's output (or its gradient) [N, O, OD, OH, OW] as the 2-D one's over _depth_as_channels's
  images, [N*OD, O, OH, OW]: the inverse of _depth_from_batch."""
  n, o, od, oh, ow = t.shape
  return t.permute((0, 2, 1, 3, 4)).reshape((n * od, o, oh, ow))


def _depth_fold(t: LT, n: int, d: int, kd: int, sd: int, pd: int, dd: int) -> LT:
  """The gradient of _depth_as_channels: t [N*OD, C*kd, H, W] summed back onto the planes its channels came from,
  [N, C, D, H, W]: channel (c, a) of image (n, t) adds to plane t*sd + a*dd - pd of channel c."""
  nod, ckd, h, wd = t.shape
  od, c = nod // n, ckd // kd
  span = (od - 1) * sd + 1
  dp = d + 2 * pd
  taps = t.reshape((n, od, c, kd, h, wd))
  out = None
  for a in range(kd):
    plane = taps.shrink(((0, n), (0, od), (0, c), (a, a + 1), (0, h), (0, wd))).reshape((n, od, c, h, wd)).permute((0, 2, 1, 3, 4))
    if sd > 1:  # plane t lands at t*sd: sd - 1 zero planes between
      plane = plane.reshape((n, c, od, 1, h, wd)).pad([(0, 0), (0, 0), (0, 0), (0, sd - 1), (0, 0), (0, 0)])
      plane = plane.reshape((n, c, od * sd, h, wd)).shrink(((0, n), (0, c), (0, span), (0, h), (0, wd)))
    plane = plane.pad([(0, 0), (0, 0), (a * dd, dp - a * dd - span), (0, 0), (0, 0)])
    out = plane if out is None else out + plane
  return out.shrink(((0, n), (0, c), (pd, pd + d), (0, h), (0, wd)))


class LiveTaps(NamedTuple):
  """The kernel taps of a 2-D convolution that read the input: taps[i] = (first, end) along spatial dim i; the input
  padded by in_pads[i] = (before, after) (negative: cropped) to line up with them; padding: what the convolution
  over the cut kernel and that input takes ((0, 0) where the input is padded explicitly)."""
  taps: tuple
  in_pads: tuple
  padding: tuple


def _live_taps(size: tuple, kernel: tuple, stride: tuple, padding: tuple, dilation: tuple) -> LiveTaps | None:
  """The taps that read at least one input pixel for some output position, where the kernel's edge taps read only
  padding (a dilated 3x3 of rate 24 over a 16x16 map, DeepLab's ASPP: its centre tap alone reads the map); None
  where every tap reads the input (or none does: the output is the bias, left to the general path)."""
  taps, pads = [], []
  for s, k, st, p, d in zip(size, kernel, stride, padding, dilation):
    o = (s + 2 * p - d * (k - 1) - 1) // st + 1
    if o <= 0: return None
    # tap j reads i*st + j*d - p at output i: live if the first of those at or past 0 is below s
    live = [j for j in range(k) if (i0 := max(0, -(-(p - j * d) // st))) < o and i0 * st + j * d - p < s]
    if not live: return None
    first, end = live[0], live[-1] + 1
    # the input as the cut kernel reads it: padded (negative: cropped) so the first output's first live tap reads
    # its start and the last output's last live tap its end
    pads.append((p - first * d, (o - 1) * st + (end - 1) * d - p - (s - 1)))
    taps.append((first, end))
  if all(t == (0, k) for t, k in zip(taps, kernel)): return None
  if all(b == a >= 0 for b, a in pads): return LiveTaps(tuple(taps), ((0, 0),) * len(size), tuple(b for b, _ in pads))
  return LiveTaps(tuple(taps), tuple(pads), (0,) * len(size))


def _cut_to_live_taps(x: LT, w: LT, live: LiveTaps) -> tuple[LT, LT]:
  """(x, w) of the convolution over live's taps: the kernel cut, the input padded or cropped to match (written out,
  so the convolution reads it through affine indices)."""
  w = w.shrink(((0, w.shape[0]), (0, w.shape[1]), *live.taps))
  if any(b or a for b, a in live.in_pads): x = x.pad([(0, 0), (0, 0), *live.in_pads]).contiguous()
  return x, w


def _per_dim(nd: int, *params) -> tuple:
  """Convolution parameters (stride, padding, ...) as tuples of one value per spatial dim (a single value repeated)."""
  return tuple(tuple(v) * (nd if len(v) == 1 else 1) for v in params)


def conv(x: LT, w: LT, stride, padding, dilation, groups: int) -> LT:
  """Direct convolution: x [N, C, *sp], w [O, C/groups, *k] -> [N, O, *out] in the accumulation dtype."""
  nd = x.ndim - 2
  n, c, *sp = x.shape
  o, cg, *k = w.shape
  acc = compute_dtype(x.dtype)
  stride, padding, dilation = _per_dim(nd, stride, padding, dilation)
  if nd == 1:  # a 1-D convolution is a 2-D one over a single row, so the 2-D paths below apply to it
    return _without_row(conv(_one_row(x), _one_row(w), *_one_row_params(stride, padding, dilation)[:3], groups))
  if nd == 3 and not any(map(is_sym, x.shape)):  # a 3-D one is a 2-D one over its depth taps (_depth_as_channels)
    xc, od = _depth_as_channels(x, k[0], stride[0], padding[0], dilation[0])
    out = conv(xc, _depth_taps_as_channels(w), stride[1:], padding[1:], dilation[1:], groups)   # [N*OD, O, OH, OW]
    return _depth_from_batch(out, n, od)
  if nd == 2 and not any(map(is_sym, x.shape)):
    live = _live_taps(tuple(sp), tuple(k), stride, padding, dilation)
    if live is not None:  # the kernel's edge taps read only padding: the convolution over the others is the same
      return conv(*_cut_to_live_taps(x, w, live), stride, live.padding, dilation, groups)
    xa, wa = x.cast(acc), w.cast(acc)
    out = _patch_conv(xa, wa, stride, padding, dilation, groups)
    if out is None: out = _im2col_conv(xa, wa, stride, padding, dilation, groups)
    if out is None: out = _conv2d_over_rows(xa, wa, stride, padding, dilation, groups)
    if out is not None: return out
  x = _padded(x.cast(acc), padding)
  sp_pad = x.shape[2:]
  out_sp = tuple((s - d * (kk - 1) - 1) // st + 1 for s, d, kk, st in zip(sp_pad, dilation, k, stride))
  if any(s <= 0 for s in out_sp): raise Unsupported("empty convolution output")
  og = o // groups
  win = _windows(x, groups, tuple(k), stride, dilation, out_sp)                  # [N, G, Cg, *out, *k]
  win = win.reshape((n, groups, 1, cg, *out_sp, *k))
  wv = w.cast(acc).reshape((1, groups, og, cg, *([1] * nd), *k))
  full = (n, groups, og, cg, *out_sp, *k)
  prod_ = win.expand(full) * wv.expand(full)
  axes = (3, *range(4 + nd, 4 + 2 * nd))
  return prod_.sum(axes, keepdim=False).reshape((n, o, *out_sp))


PATCH_GEMM_MIN_TAPS = 16  # a patch embedding reduces over at least this many taps (channels x kernel size)


def _patch_conv(x: LT, w: LT, stride: tuple, padding: tuple, dilation: tuple, groups: int) -> LT | None:
  """A convolution whose kernel equals its stride, with no padding or dilation (ViT's 16x16 patch embedding,
  ConvNeXt's 4x4 stem): the patches do not overlap, so it is one GEMM, [N*OH*OW, C*kh*kw] @ [C*kh*kw, O], over
  the input cut into patches (one pass over it), instead of s*s phases of a strided convolution. None otherwise."""
  n, c, h, wd = x.shape
  o, cg, kh, kw = w.shape
  if groups != 1 or (kh, kw) != tuple(stride) or any(padding) or any(d != 1 for d in dilation) or kh * kw == 1:
    return None
  if c * kh * kw < PATCH_GEMM_MIN_TAPS: return None
  oh, ow = (h - kh) // kh + 1, (wd - kw) // kw + 1
  if oh <= 0 or ow <= 0: return None
  patches = x.shrink(((0, n), (0, c), (0, oh * kh), (0, ow * kw))).reshape((n, c, oh, kh, ow, kw))
  rows = patches.permute((0, 2, 4, 1, 3, 5)).contiguous().reshape((n * oh * ow, c * kh * kw))
  out = matmul(rows, w.reshape((o, c * kh * kw)).transpose(0, 1))                      # [N*OH*OW, O]
  return out.reshape((n, oh, ow, o)).permute((0, 3, 1, 2))


def _phase_taps(kernel: tuple, stride: tuple) -> int:
  """Taps per input channel of a strided 2-D convolution run over its s*s phases (a 1x1 kernel reads one phase)."""
  (kh, kw), (sh, sw) = kernel, stride
  return 1 if (kh, kw) == (1, 1) else -(-kh // sh) * sh * -(-kw // sw) * sw


def _im2col_conv(x: LT, w: LT, stride: tuple, padding: tuple, dilation: tuple, groups: int) -> LT | None:
  """A convolution that the padded-rows kernel would run with more than PHASE_MAX_WASTE times its work, as one GEMM
  per image and group over its windows written out as columns (im2col): out[o, p] = sum over t of w[o, t] *
  cols[p, t], both contiguous along the taps t and the result already in NCHW order. That is a dense strided one
  whose phases add taps (3x3 at stride 2: 16 for 9, ResNet's downsampling 3x3s) or that is dilated (no phases), and
  a stride-1 one whose padded rows are much wider than its output's (a dilated 3x3 of rate 12 over a 16x16 map,
  DeepLab's ASPP: 40 columns computed for 16; wav2vec2's grouped positional convolution, 128 taps over 49 frames:
  177 for 50), grouped ones included where each group has WGRAD_GEMM_MIN_ROWS output channels. None otherwise
  (fewer than WGRAD_GEMM_MIN_TAPS taps per group, a grouped strided one: its phases)."""
  n, c, h, wd = x.shape
  o, cg, kh, kw = w.shape
  taps, og = cg * kh * kw, o // groups
  if taps < WGRAD_GEMM_MIN_TAPS or (groups != 1 and og < WGRAD_GEMM_MIN_ROWS): return None
  oh, ow = ((s + 2 * p - d * (k - 1) - 1) // st + 1 for s, p, d, k, st in zip((h, wd), padding, dilation, (kh, kw), stride))
  if oh <= 0 or ow <= 0: return None
  if stride == (1, 1):
    if wd + 2 * padding[1] <= PHASE_MAX_WASTE * ow: return None
  elif groups != 1 or dilation == (1, 1) and _phase_taps((kh, kw), stride) <= PHASE_MAX_WASTE * kh * kw: return None
  win = _windows(_padded(x, padding), groups, (kh, kw), stride, dilation, (oh, ow))   # [N, G, Cg, OH, OW, kh, kw]
  # (copied with the pixel and tap axes apart: the copy's loops then index without divisions)
  cols = win.permute((0, 1, 3, 4, 2, 5, 6)).contiguous().reshape((n, groups, oh * ow, taps))
  out = matmul(w.reshape((1, groups, og, taps)).expand((n, groups, og, taps)), cols.transpose(2, 3))  # [N, G, Og, P]
  return out.reshape((n, o, oh, ow))


ROW_CONV_MIN_CHANNELS = 8  # input channels per group below which a convolution stays a direct window reduction
WGRAD_GEMM_MIN_ROWS = 8    # a weight gradient is a GEMM over im2col rows from this many output channels per group ...
WGRAD_GEMM_MIN_TAPS = 32   # ... and this many taps (input channels per group x kernel size)
WGRAD_ROWS_MIN_PIXELS = 512  # ... unless it reduces over padded rows, with no im2col copy: from this many row positions
PHASE_MAX_WASTE = 1.5  # a strided convolution (forward, weight gradient) runs over its s*s phases where their kernels
                       # (ceil(k/s)^2 taps each) add at most this factor to the taps; otherwise it is an im2col GEMM;
                       # so is a stride-1 one whose padded rows are wider than this factor times its output's
ROW_VECTOR = 16  # the vector width the row-major convolution rounds its flattened output up to


def _conv2d_over_rows(x: LT, w: LT, stride: tuple, padding: tuple, dilation: tuple, groups: int) -> LT | None:
  """A 2-D convolution as a stride-1 one over padded rows (_row_major_conv), or None where that does not fit.
  A strided convolution becomes a stride-1 one first: a 1x1 kernel reads every s-th pixel; a larger one reads the
  input split into its s*s phases (space to depth: channel (c, py, px) is pixel (s*i + py, s*j + px) of channel c)
  with the kernel split the same way (ky = s*a + py, zero where that is past the kernel's edge)."""
  n, c, h, wd = x.shape
  o, cg, kh, kw = w.shape
  depthwise = cg == 1
  out_h = (h + 2 * padding[0] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
  out_w = (wd + 2 * padding[1] - dilation[1] * (kw - 1) - 1) // stride[1] + 1
  if stride != (1, 1):
    if dilation != (1, 1): return None
    x, (ah, aw) = _space_to_depth(x, (kh, kw), stride, padding, (out_h, out_w))
    if (ah, aw) != (kh, kw):
      (sh, sw) = stride
      w = w.pad([(0, 0), (0, 0), (0, ah * sh - kh), (0, aw * sw - kw)]).reshape((o, cg, ah, sh, aw, sw))
      w = w.permute((0, 1, 3, 5, 2, 4)).reshape((o, cg * sh * sw, ah, aw)).contiguous()
    padding = (0, 0)
  # a depthwise one fits too (one input channel per group, or its s*s phases): its SIMD axis is still the pixels
  if x.shape[1] // groups < ROW_CONV_MIN_CHANNELS and not depthwise: return None
  out = _row_major_conv(x, w, padding, dilation, groups)
  if out is None or out.shape[2] < out_h or out.shape[3] < out_w: return None
  return out.shrink([(0, n), (0, o), (0, out_h), (0, out_w)])


def _space_to_depth(x: LT, kernel: tuple, stride: tuple, padding: tuple, out_sp: tuple) -> tuple:
  """A strided 2-D convolution's input as that of a stride-1 one with no padding, and the kernel size that one has.
  A 1x1 kernel reads every s-th pixel; a larger one reads the input split into its s*s phases: channel
  (c, py, px) is padded pixel (s*i + py, s*j + px) of channel c, and tap (ky, kx) = (s*a + py, s*b + px) of the
  kernel is tap (a, b) of phase channel (c, py, px) in a ceil(k/s)-sized one."""
  n, c = x.shape[:2]
  (kh, kw), (sh, sw), (ph, pw) = kernel, stride, padding
  x = x.pad([(0, 0), (0, 0), (ph, ph), (pw, pw)])
  if (kh, kw) == (1, 1): return x.slice(2, 0, x.shape[2], sh).slice(3, 0, x.shape[3], sw), (1, 1)
  ah, aw = -(-kh // sh), -(-kw // sw)                       # the kernel's extent in each phase plane
  hq, wq = max(-(-x.shape[2] // sh), out_sp[0] + ah - 1), max(-(-x.shape[3] // sw), out_sp[1] + aw - 1)
  # padded into a buffer of its own, so the phase view is one strided window (a split of a padded view's dims
  # would index it with divisions)
  x = x.pad([(0, 0), (0, 0), (0, hq * sh - x.shape[2]), (0, wq * sw - x.shape[3])]).contiguous()
  plane, pitch = hq * sh * wq * sw, wq * sw
  return x.as_strided((n, c, sh, sw, hq, wq), (c * plane, plane, pitch, 1, sh * pitch, sw)).reshape((n, c * sh * sw, hq, wq)), (ah, aw)


def _row_major_conv(x: LT, w: LT, padding, dilation, groups: int) -> LT | None:
  """A stride-1 2-D convolution computed over padded rows: output position q = y * Wp + x (Wp the padded input
  width) reads the padded input at q + ky*dh*Wp + kx*dw, so along q every load is contiguous and the kernel is a
  GEMM with a SIMD axis over pixels (x @ w form: weights broadcast, 8 output channels per register tile). The
  Wp - OW columns past each row's end are computed and dropped (the result is read through a strided view), and q
  is rounded up to a multiple of ROW_VECTOR over zero rows below the padded input. Both the padded input and the
  result are plain 4-D buffers, so neither the copy in nor the reads out need a division."""
  n, c, h, wd = x.shape
  o, cg, kh, kw = w.shape
  (ph, pw), (dh, dw) = padding, dilation
  hp, wp = h + 2 * ph, wd + 2 * pw
  oh, ow = hp - dh * (kh - 1), wp - dw * (kw - 1)
  if oh <= 0 or ow <= 0: return None
  q = -(-oh * wp // ROW_VECTOR) * ROW_VECTOR
  reach = (kh - 1) * dh * wp + (kw - 1) * dw      # how far past q a window reads
  rows = max(hp, -(-(q + reach) // wp))           # padded rows, with zero rows below for the last vector
  xp = x.pad([(0, 0), (0, 0), (ph, ph + rows - hp), (pw, pw)]).contiguous()
  plane, og = rows * wp, o // groups
  win = xp.as_strided((n, groups, 1, cg, q, kh, kw), (c * plane, cg * plane, 0, plane, 1, dh * wp, dw))
  wv = w.reshape((1, groups, og, cg, 1, kh, kw))
  full = (n, groups, og, cg, q, kh, kw)
  out = (win.expand(full) * wv.expand(full)).sum((3, 5, 6), keepdim=False)   # [n, groups, og, q]
  return out.as_strided((n, o, oh, ow), (o * q, q, wp, 1))


def _padded(x: LT, padding) -> LT:
  """x with its spatial dims zero-padded, written to its own buffer: the convolution then reads it through affine
  indices with no bounds masks, which its kernel can vectorize (a pass over the input, against k^2*O reads)."""
  if not any(padding): return x
  return x.pad([(0, 0), (0, 0)] + [(p, p) for p in padding]).contiguous()


def _zero_stuff(x: LT, stride) -> LT:
  """Insert stride-1 zeros between elements along each spatial dim: [.., s] -> [.., (s-1)*stride+1]."""
  if all(s == 1 for s in stride): return x
  n, c, *sp = x.shape
  shape = [n, c]
  for s in sp: shape += [s, 1]
  y = x.reshape(tuple(shape))
  pads = [(0, 0), (0, 0)]
  for st in stride: pads += [(0, 0), (0, st - 1)]
  y = y.pad(pads)
  y = y.reshape((n, c, *[s * st for s, st in zip(sp, stride)]))
  return y.shrink([(0, n), (0, c)] + [(0, (s - 1) * st + 1) for s, st in zip(sp, stride)])


def _patch_conv_transpose(x: LT, w: LT) -> LT:
  """A transposed convolution whose kernel equals its stride, with no padding (a UNet's 2x2 or 2x2x2 upsampling
  at stride 2): each input pixel writes its own k-sized block, out[n, o, s*i + a] = sum over c of x[n, c, i] *
  w[c, o, a], so it is one GEMM, [N*pixels, C] @ [C, O*taps], its result's blocks put in place by a view, instead
  of a convolution over the input with s - 1 zeros stuffed between pixels (s^nd times the products)."""
  n, c, *sp = x.shape
  _, o, *k = w.shape
  nd, taps = len(sp), math.prod(k)
  rows = x.permute((0, *range(2, 2 + nd), 1)).reshape((n * math.prod(sp), c))
  out = matmul(rows, w.reshape((c, o * taps)))                                          # [N*pixels, O*taps]
  out = out.reshape((n, *sp, o, *k))
  order = (0, nd + 1, *[a for i in range(nd) for a in (1 + i, nd + 2 + i)])            # [N, O, S1, k1, S2, k2, ..]
  return out.permute(order).reshape((n, o, *[si * ki for si, ki in zip(sp, k)]))


def conv_transpose(x: LT, w: LT, stride, padding, dilation, output_padding, groups: int) -> LT:
  """x [N, Cin, *sp], w [Cin, Cout/groups, *k] -> [N, Cout, *out]: one GEMM where the kernel equals the stride
  (_patch_conv_transpose), the strided convolution's input gradient where that applies, else a convolution of the
  zero-stuffed, padded input with the flipped weight."""
  nd = x.ndim - 2
  cin, cog, *k = w.shape
  cig = cin // groups
  stride, padding, dilation, output_padding = _per_dim(nd, stride, padding, dilation, output_padding)
  if groups == 1 and tuple(k) == stride and not any(padding) and not any(output_padding) and all(d == 1 for d in dilation) \
     and not any(map(is_sym, x.shape)):
    return _patch_conv_transpose(x.cast(compute_dtype(x.dtype)), w.cast(compute_dtype(x.dtype)))
  if nd in (2, 3) and any(st > 1 for st in stride) and all(d == 1 for d in dilation) and not any(map(is_sym, x.shape)):
    # it is the input gradient of the strided convolution it transposes: computed phase by phase (_conv_input_grad),
    # not over the input with s - 1 zeros stuffed between pixels
    size = tuple((i - 1) * st - 2 * p + kk + op for i, st, p, kk, op in zip(x.shape[2:], stride, padding, k, output_padding))
    acc = compute_dtype(x.dtype)
    return _conv_input_grad(x.cast(acc), w.cast(acc), size, stride, padding, dilation, groups)
  y = _zero_stuff(x.cast(compute_dtype(x.dtype)), stride)
  pads = [(0, 0), (0, 0)]
  for kk, d, p, op in zip(k, dilation, padding, output_padding):
    edge = d * (kk - 1) - p
    pads.append((edge, edge + op))
  # realized, like _padded: the zero-stuffing's div/mod and the padding's masks stay out of the convolution's loop
  y = y.pad(pads).contiguous() if any(p != (0, 0) for p in pads) or any(st > 1 for st in stride) else y
  # weight [G, Cig, Cog, *k] -> [G, Cog, Cig, *k] flipped -> [G*Cog, Cig, *k]
  wt = w.reshape((groups, cig, cog, *k)).transpose(1, 2).flip(tuple(range(3, 3 + nd))).reshape((groups * cog, cig, *k))
  return conv(y, wt, (1,) * nd, (0,) * nd, dilation, groups)


@register(aten.convolution.default)
def convolution(ctx, x, w, bias, stride, padding, dilation, transposed, output_padding, groups):
  if transposed: out = conv_transpose(x, w, stride, padding, dilation, output_padding, groups)
  else: out = conv(x, w, stride, padding, dilation, groups)
  if bias is not None: out = out + bias.cast(out.dtype).reshape((1, -1) + (1,) * (out.ndim - 2))
  if out.shape != ctx.shape: raise Unsupported(f"convolution shape {out.shape} != {ctx.shape}")
  return out.cast(ctx.dtype)


def _conv_weight_grad(x: LT, g: LT, kernel: tuple, stride, padding, dilation, groups: int) -> LT:
  """d(conv(x, w))/dw for the output gradient g: the window view of x times g, summed over batch and
  output positions. x [N, C, *sp], g [N, O, *out] -> [O, C/groups, *kernel] in the accumulation dtype.
  A 2-D one reduces over padded rows (_weight_grad_over_rows) where it can. Otherwise, unless the groups are small
  (depthwise), the windows are first written out as rows (im2col: [N, G, pixels, Cg * kernel], zero-padded to whole
  vectors), so the reduction over pixels is a GEMM whose SIMD axis runs along those rows (g's values broadcast,
  8 output channels per register tile)."""
  nd = x.ndim - 2
  if nd == 3 and not any(map(is_sym, (*x.shape, *g.shape))):  # the 2-D one over the depth taps as channels
    o, kd = g.shape[1], kernel[0]
    xc, _ = _depth_as_channels(x, kd, stride[0], padding[0], dilation[0])
    g2 = _indexable(_depth_to_batch(g))
    dw = _conv_weight_grad(xc, g2, tuple(kernel[1:]), stride[1:], padding[1:], dilation[1:], groups)
    return dw.reshape((o, x.shape[1] // groups, *kernel))
  n, c, *_ = x.shape
  o = g.shape[1]
  cg, og = c // groups, o // groups
  out_sp = tuple(g.shape[2:])
  pixels, taps = math.prod(out_sp), cg * math.prod(kernel)
  im2col = og >= WGRAD_GEMM_MIN_ROWS and taps >= WGRAD_GEMM_MIN_TAPS and not any(map(is_sym, x.shape))
  # over rows unless there are too few of them for its long reduction to beat an im2col GEMM; always better than
  # the direct window reduction (one loop over q, not one per output row, each with its own horizontal sum)
  over_rows = _weight_grad_over_rows(x, g, kernel, stride, padding, dilation, groups, WGRAD_ROWS_MIN_PIXELS if im2col else 0)
  if over_rows is not None: return over_rows
  xp = _padded(x, padding)
  win = _windows(xp, groups, tuple(kernel), stride, dilation, out_sp)               # [N, G, Cg, *out, *k]
  if im2col:
    order = (0, 1, *range(3, 3 + nd), 2, *range(3 + nd, 3 + 2 * nd))
    wide = -(-taps // ROW_VECTOR) * ROW_VECTOR   # rows padded with zeros to whole vectors
    if wide == taps:  # copied with the pixel and tap axes apart: the copy's loops index without divisions
      cols = win.permute(order).contiguous().reshape((n, groups, 1, pixels, taps))   # [N, G, 1, P, Cg*k]
    else:
      cols = win.permute(order).reshape((n, groups, 1, pixels, taps)).pad([(0, 0)] * 4 + [(0, wide - taps)]).contiguous()
    gv = g.reshape((n, groups, og, pixels, 1))
    full = (n, groups, og, pixels, wide)
    dw = (cols.expand(full) * gv.expand(full)).sum((0, 3), keepdim=False).contiguous()   # [G, Og, wide]
    return dw.shrink([(0, groups), (0, og), (0, taps)]).reshape((o, cg, *kernel))
  win = win.reshape((n, groups, 1, cg, *out_sp, *kernel))
  gv = g.reshape((n, groups, og, 1, *out_sp, *([1] * nd)))
  full = (n, groups, og, cg, *out_sp, *kernel)
  axes = (0, *range(4, 4 + nd))
  return (win.expand(full) * gv.expand(full)).sum(axes, keepdim=False).reshape((o, cg, *kernel))


def _weight_grad_over_rows(x: LT, g: LT, kernel: tuple, stride, padding, dilation, groups: int, min_pixels: int) -> LT | None:
  """The weight gradient of a stride-1 2-D convolution over padded rows, with no im2col copy: output position
  q = y * Wp + x (Wp the padded input width) reads the padded input at q + ky*dh*Wp + kx*dw, so with g written
  out in the same row layout (zeros in the Wp - OW columns past each row's end), dw[o, c, ky, kx] is
  sum over q of g[o, q] * x[c, q + ky*dh*Wp + kx*dw]: a reduction along which both operands are contiguous.
  A strided one is that of the stride-1 convolution over the input split by _space_to_depth, its phase taps put
  back in place. None where this does not apply (not 2-D, strided and dilated, symbolic sizes, fewer than
  min_pixels row positions, phases that multiply the taps by more than PHASE_MAX_WASTE: 3x3 at
  stride 2 would compute 16 for 9)."""
  if x.ndim != 4 or any(map(is_sym, x.shape)) or any(map(is_sym, g.shape)): return None
  if tuple(stride) != (1, 1):
    (kh, kw), (sh, sw) = kernel, stride
    if tuple(dilation) != (1, 1) or _phase_taps((kh, kw), (sh, sw)) > PHASE_MAX_WASTE * kh * kw: return None
    xq, (ah, aw) = _space_to_depth(x, kernel, stride, padding, g.shape[2:])
    dwq = _weight_grad_over_rows(xq.contiguous(), g, (ah, aw), (1, 1), (0, 0), (1, 1), groups, min_pixels)
    if dwq is None or (kh, kw) == (1, 1): return dwq
    o, cgq = dwq.shape[:2]                     # [O, Cg*sh*sw, ah, aw] -> [O, Cg, ah*sh, aw*sw], cut to the kernel
    dw = dwq.reshape((o, cgq // (sh * sw), sh, sw, ah, aw)).permute((0, 1, 4, 2, 5, 3)).reshape((o, cgq // (sh * sw), ah * sh, aw * sw))
    return dw.shrink([(0, o), (0, cgq // (sh * sw)), (0, kh), (0, kw)])
  n, c, h, wd = x.shape
  o, (gh, gw) = g.shape[1], g.shape[2:]
  kh, kw = kernel
  (ph, pw), (dh, dw) = padding, dilation
  hp, wp = h + 2 * ph, wd + 2 * pw
  if n * gh * wp < min_pixels: return None
  q = -(-gh * wp // ROW_VECTOR) * ROW_VECTOR
  reach = (kh - 1) * dh * wp + (kw - 1) * dw
  rows = max(hp, -(-(q + reach) // wp))
  xp, gp = x, g.reshape((n, o, gh * gw))
  if (ph, pw, rows) != (0, 0, hp): xp = x.pad([(0, 0), (0, 0), (ph, ph + rows - hp), (pw, pw)]).contiguous()
  if (wp, q) != (gw, gh * gw):  # g in the same row layout, zeros past each row's end and in rows below the last
    gr = -(-q // wp)
    gp = g.pad([(0, 0), (0, 0), (0, gr - gh), (0, wp - gw)]).contiguous().reshape((n, o, gr * wp)).shrink(((0, n), (0, o), (0, q)))
  cg, og, plane = c // groups, o // groups, rows * wp
  win = xp.as_strided((n, groups, 1, cg, kh, kw, q), (c * plane, cg * plane, 0, plane, dh * wp, dw, 1))
  gv = gp.reshape((n, groups, og, 1, 1, 1, q))
  full = (n, groups, og, cg, kh, kw, q)
  return (win.expand(full) * gv.expand(full)).sum((0, 6), keepdim=False).reshape((o, cg, kh, kw))


def _strided_input_grad(g: LT, w: LT, size: tuple, stride: tuple, padding: tuple, dilation: tuple, groups: int) -> LT | None:
  """The input gradient of a strided 2-D convolution, phase by phase instead of over a zero-stuffed gradient (which
  multiplies s*s - 1 zeros for every product that counts). Input pixel X = s*t + r - p sums g[t - b] * w[s*b + r]
  over b, so each phase r is a stride-1 convolution of g (padded by B - 1 = ceil(k/s) - 1 in front) with the
  flipped sub-kernel w[s*(B-1-b) + r]: one convolution with C*s*s output channels (c, ry, rx), then interleaved
  (C*k*k of them where k < s: the other phases are zeros). None where this does not apply (1-D/3-D, dilation, stride 1)."""
  if g.ndim != 4 or stride == (1, 1) or dilation != (1, 1) or any(map(is_sym, g.shape)): return None
  n, o, gh, gw = g.shape
  _, cg, kh, kw = w.shape
  (sh, sw), (ph, pw) = stride, padding
  bh, bw = -(-kh // sh), -(-kw // sw)
  th, tw = -(-(size[0] + ph) // sh), -(-(size[1] + pw) // sw)       # phase rows/columns the input needs
  og = o // groups
  # a kernel smaller than its stride (a 1x1 downsample) touches only phases r < k: the others are zero, not computed
  rh, rw = min(sh, kh), min(sw, kw)
  wq = w.pad([(0, 0), (0, 0), (0, bh * rh - kh), (0, bw * rw - kw)]).reshape((groups, og, cg, bh, rh, bw, rw))
  wq = wq.flip((3, 5)).permute((0, 2, 4, 6, 1, 3, 5)).reshape((groups * cg * rh * rw, og, bh, bw)).contiguous()
  gp = g.pad([(0, 0), (0, 0), (bh - 1, max(0, th - gh)), (bw - 1, max(0, tw - gw))])
  phases = conv(gp, wq, (1, 1), (0, 0), (1, 1), groups)                # [N, C*rh*rw, >= th, >= tw]
  ph_h, ph_w = phases.shape[2:]
  c = groups * cg
  phases = phases.reshape((n, c, rh, rw, ph_h, ph_w))
  if (rh, rw) != (sh, sw): phases = phases.pad([(0, 0), (0, 0), (0, sh - rh), (0, sw - rw), (0, 0), (0, 0)])
  full = phases.permute((0, 1, 4, 2, 5, 3)).reshape((n, c, ph_h * sh, ph_w * sw))
  return full.shrink([(0, n), (0, c), (ph, ph + size[0]), (pw, pw + size[1])])


def _conv_input_grad(g: LT, w: LT, size: tuple, stride: tuple, padding: tuple, dilation: tuple, groups: int) -> LT:
  """d(conv(x, w))/dx for the output gradient g: [N, C, *size]. A 3-D one is the 2-D input gradient over the depth
  taps (_depth_as_channels), folded back onto the depth planes; a strided 2-D one runs phase by phase
  (_strided_input_grad); otherwise it is the transposed convolution of g, output_padding recovering the rows the
  stride dropped."""
  if g.ndim == 5 and not any(map(is_sym, (*g.shape, *size))):
    n, _, od = g.shape[:3]
    dxc = _conv_input_grad(_depth_to_batch(g), _depth_taps_as_channels(w), size[1:], stride[1:], padding[1:],
                           dilation[1:], groups)                                   # [N*OD, C*kd, H, W]
    return _depth_fold(dxc, n, size[0], w.shape[2], stride[0], padding[0], dilation[0])
  dx = _strided_input_grad(g, w, size, stride, padding, dilation, groups)
  if dx is not None: return dx
  k = w.shape[2:]
  out_pad = tuple(s + 2 * p - d * (kk - 1) - 1 - (o - 1) * st
                  for s, p, d, kk, o, st in zip(size, padding, dilation, k, g.shape[2:], stride))
  return conv_transpose(g, w, stride, padding, dilation, out_pad, groups)


@register(aten.convolution_backward.default)
def convolution_backward(ctx, grad, x, w, bias_sizes, stride, padding, dilation, transposed, output_padding, groups,
                         output_mask):
  if x.ndim == 3 and w.ndim == 3:  # 1-D: the gradients of the single-row 2-D convolution it is (conv above)
    stride, padding, dilation, output_padding = _one_row_params(stride, padding, dilation, output_padding)
    dx, dw, db = convolution_backward(ctx, _one_row(grad), _one_row(x), _one_row(w), bias_sizes, stride, padding,
                                      dilation, transposed, output_padding, groups, output_mask)
    return _without_row(dx), _without_row(dw), db
  nd = x.ndim - 2
  acc = compute_dtype(x.dtype)
  g = grad.cast(acc)
  k = tuple(w.shape[2:])
  grad_input = grad_weight = grad_bias = None
  live = None if transposed or nd != 2 or any(map(is_sym, x.shape)) else \
    _live_taps(tuple(x.shape[2:]), k, tuple(stride), tuple(padding), tuple(dilation))
  if live is not None:  # the gradients of the convolution over the live taps (conv above), put back in place
    xl, wl = _cut_to_live_taps(x, w, live)
    dx, dw, db = convolution_backward(ctx, grad, xl, wl, bias_sizes, stride, live.padding, dilation, False,
                                      output_padding, groups, output_mask)
    if dx is not None: dx = dx.pad([(0, 0), (0, 0), *((-b, -a) for b, a in live.in_pads)])
    if dw is not None: dw = dw.pad([(0, 0), (0, 0), *((first, kk - end) for (first, end), kk in zip(live.taps, k))])
    return dx, dw, db
  if transposed:
    # y = conv_transpose(x, w): dx is the plain convolution of dy with w, and dw the weight gradient of
    # that convolution with the roles of input and output gradient swapped
    if output_mask[0]: grad_input = conv(g, w, stride, padding, dilation, groups).cast(ctx.dtype_of(0))
    if output_mask[1]:
      grad_weight = _conv_weight_grad(g, x.cast(acc), k, stride, padding, dilation, groups).cast(ctx.dtype_of(1))
  else:
    if output_mask[0]:
      grad_input = _conv_input_grad(g, w.cast(acc), tuple(x.shape[2:]), tuple(stride), tuple(padding), tuple(dilation),
                                    groups).cast(ctx.dtype_of(0))
    if output_mask[1]:
      grad_weight = _conv_weight_grad(x.cast(acc), g, k, stride, padding, dilation, groups).cast(ctx.dtype_of(1))
  if output_mask[2]:
    grad_bias = g.sum((0, *range(2, 2 + nd)), keepdim=False).cast(ctx.dtype_of(2))
  return grad_input, grad_weight, grad_bias


@register(aten.addbmm.default)
def addbmm(ctx, x, b1, b2, beta=1, alpha=1):
  out = matmul(b1, b2).sum((0,), keepdim=False)
  if alpha != 1: out = out * alpha
  if beta != 0:
    xx = x.cast(out.dtype).broadcast_to(out.shape)
    out = out + (xx * beta if beta != 1 else xx)
  return out.cast(ctx.dtype)


def _pnorm(d: LT, p, axis: int) -> LT:
  a = d.math("abs")
  if p == 0: return a.ne(0).cast(a.dtype).sum((axis,), keepdim=False)
  if p == float("inf"): return a.max((axis,), keepdim=False)
  if p == 1: return a.sum((axis,), keepdim=False)
  if p == 2: return (a * a).sum((axis,), keepdim=False).sqrt()
  return a.math("pow", a.const_like(float(p))).sum((axis,), keepdim=False).math("pow", float(1.0 / p))


@register(aten._cdist_forward.default)
def cdist(ctx, x1, x2, p, compute_mode=None):
  """[.., P, M] x [.., R, M] -> [.., P, R] p-norm distances of every pair."""
  acc = compute_dtype(ctx.dtype)
  *batch, pn, m = x1.shape
  r = x2.shape[-2]
  batch = tuple(ctx.shape[:-2])
  full = (*batch, pn, r, m)
  a = x1.cast(acc).reshape((*x1.shape[:-2], pn, 1, m)).broadcast_to(full)
  b = x2.cast(acc).reshape((*x2.shape[:-2], 1, r, m)).broadcast_to(full)
  return _pnorm(a - b, p, len(full) - 1).cast(ctx.dtype)


@register(aten._pdist_forward.default)
def pdist(ctx, x, p=2):
  """[N, M] -> the distances of the pairs i < j, in row-major order."""
  n, m = x.shape
  if n < 2: return LT.full(ctx.shape, 0, ctx.dtype)
  acc = compute_dtype(ctx.dtype)
  xa = x.cast(acc)
  d = _pnorm(xa.reshape((n, 1, m)).broadcast_to((n, n, m)) - xa.reshape((1, n, m)).broadcast_to((n, n, m)), p, 2)
  return cat(ctx, [d.slice(0, i, i + 1).slice(1, i + 1, n).reshape((n - i - 1,)) for i in range(n - 1)], 0).cast(ctx.dtype)
