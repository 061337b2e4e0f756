"""FFT primitives (_fft_r2c, _fft_c2c, _fft_c2r) as discrete Fourier transforms written as matmuls.

Each transformed dim is one reduction: the signal, with the dim moved last as (..., n, parts), times a
twiddle matrix T[n, in_parts, m, out_parts] summed over (n, in_parts). A complex multiply by
e^{i*phi} is the real 2x2 matrix [[cos, sin], [-sin, cos]], so one cosine table covers it:
T[j, a, k, b] = w_j * cos(phi_jk + (a - b) * pi/2). The angle is built exactly in integers from iota
(quarter turns of 2*pi/(4N), reduced mod 4N) and the cosine is taken per quadrant, so angles at
multiples of pi/2 give exact 0 and +-1. Tables are computed once per graph (realized), in float64, as
is the sum, so float32 transforms are at least as accurate as eager's pocketfft. Sizes are any
lengths; tables above MAX_TABLE elements fall back to ATen, as do half-precision transforms (eager
has none on the CPU).
"""
from __future__ import annotations
import math
import torch
from torch_uop.core.dtypes import dtypes, DType
from torch_uop.core.uop import Ops
from torch_uop.lowering.complex import CT, register_complex, part_dtype_of
from torch_uop.lowering.registry import Unsupported
from torch_uop.lowering.tensor import LT

aten = torch.ops.aten

MAX_TABLE = 1 << 22  # elements of one twiddle table (32 MiB in float64)
ACC = dtypes.float64


def _cos_quarter_turns(p: LT, n: int) -> LT:
  """cos(2*pi * p / (4n)) for integers 0 <= p < 4n, reduced to the first quadrant."""
  quadrant, rest = p.alu(Ops.IDIV, p.const_like(n)), p.alu(Ops.MOD, p.const_like(n))
  theta = rest.cast(ACC) * (2 * math.pi / (4 * n))
  c, s = theta.math("cos"), theta.math("sin")
  return quadrant.eq(0).where(c, quadrant.eq(1).where(-s, quadrant.eq(2).where(-c, s)))


def _table(n_in: int, in_parts: int, m: int, out_parts: int, period: int, sign: int, scale: float,
           hermitian_weights: bool = False) -> LT:
  """T[j, a, k, b] such that sum_{j, a} x[j, a] * T[j, a, k, b] is the DFT (sign -1) or its inverse (+1) of
  x, part b of output k (parts: 0 real, 1 imaginary). With hermitian_weights, input j stands for
  itself and its mirror period - j (the c2r sum over a one-sided spectrum): weight 2 except j = 0 and
  j = period/2."""
  if n_in * in_parts * m * out_parts > MAX_TABLE: raise Unsupported(f"DFT table of {n_in}x{m} is over the size limit")
  shape = (n_in, in_parts, m, out_parts)

  def idx(size, axis):
    s = [1, 1, 1, 1]
    s[axis] = size
    return LT.iota(size).reshape(tuple(s)).broadcast_to(shape)
  j, a, k, b = idx(n_in, 0), idx(in_parts, 1), idx(m, 2), idx(out_parts, 3)
  jk = (j * k).alu(Ops.MOD, j.const_like(period))
  # angle in quarter turns of 2*pi/(4*period): 4*sign*jk + (a - b)*period, kept non-negative before the mod
  p = (jk * (4 * sign) + (a - b) * period + 8 * period).alu(Ops.MOD, j.const_like(4 * period))
  t = _cos_quarter_turns(p, period)
  if hermitian_weights:
    single = j.eq(0) | (j * 2).eq(period)
    t = t * single.where(t.const_like(1.0), t.const_like(2.0))
  if scale != 1: t = t * scale
  return t.contiguous()


def _dft_along(x: LT, dim: int, in_parts: int, m: int, out_parts: int, period: int, sign: int, scale: float,
               hermitian_weights: bool = False) -> LT:
  """Transform dim `dim` of x (shape (*S, in_parts) for in_parts 2, or S for 1) into m outputs."""
  if in_parts == 1: x = x.unsqueeze(-1)
  nd = x.ndim - 1
  order = [d for d in range(nd) if d != dim] + [dim, nd]
  xt = x.permute(order).cast(ACC)
  *batch, n_in, _ = xt.shape
  table = _table(n_in, in_parts, m, out_parts, period, sign, scale, hermitian_weights)
  table = table.reshape((1,) * len(batch) + table.shape)
  # a zero twiddle is a term an FFT never computes: NaN or Inf there must not reach that output part
  prod = table.eq(0).where(0.0, xt.reshape((*batch, n_in, in_parts, 1, 1)) * table)
  y = prod.sum((len(batch), len(batch) + 1), keepdim=False)  # (*batch, m, out_parts)
  inverse = [order.index(d) for d in range(nd + 1)]
  y = y.permute(inverse)
  return y.reshape(y.shape[:-1]) if out_parts == 1 else y


def _scale(normalization: int, n: int) -> float:
  """ATen's fft_norm_mode: 0 none, 1 by 1/sqrt(n), 2 by 1/n."""
  if normalization == 0: return 1.0
  if normalization == 1: return 1.0 / math.sqrt(n)
  if normalization == 2: return 1.0 / n
  raise Unsupported(f"normalization mode {normalization}")


def _check(ctx, x, dims) -> DType:
  out_part = part_dtype_of(ctx.val)
  x_dtype = x.part_dtype if isinstance(x, CT) else x.dtype
  if x_dtype not in (dtypes.float32, dtypes.float64) or out_part not in (dtypes.float32, dtypes.float64):
    raise Unsupported("FFT of half-precision types (eager has none on the CPU)")
  if not dims: raise Unsupported("FFT over no dims")
  # eager's CPU FFT (MKL) rejects empty tensors: let it raise
  if math.prod(x.shape) == 0: raise Unsupported("FFT of an empty tensor (an error in eager)")
  return out_part


@register_complex(aten._fft_c2c.default)
def fft_c2c(ctx, x: CT, dim, normalization: int, forward: bool):
  out = _check(ctx, x, dim)
  y, sign = x.lt, -1 if forward else 1
  for d in dim:
    d %= x.ndim
    n = x.shape[d]
    y = _dft_along(y, d, 2, n, 2, n, sign, _scale(normalization, n))
  return CT(y.cast(out))


@register_complex(aten._fft_r2c.default)
def fft_r2c(ctx, x: LT, dim, normalization: int, onesided: bool):
  out = _check(ctx, x, dim)
  dims = [d % x.ndim for d in dim]
  n = x.shape[dims[-1]]
  y = _dft_along(x, dims[-1], 1, n // 2 + 1 if onesided else n, 2, n, -1, _scale(normalization, n))
  for d in dims[:-1]:
    n = x.shape[d]
    y = _dft_along(y, d, 2, n, 2, n, -1, _scale(normalization, n))
  return CT(y.cast(out))


@register_complex(aten._fft_c2r.default)
def fft_c2r(ctx, x: CT, dim, normalization: int, last_dim_size: int):
  out = _check(ctx, x, dim)
  dims = [d % x.ndim for d in dim]
  y = x.lt
  for d in dims[:-1]:
    n = x.shape[d]
    y = _dft_along(y, d, 2, n, 2, n, 1, _scale(normalization, n))
  n, last = last_dim_size, dims[-1]
  if n <= 0 or x.shape[last] != n // 2 + 1: raise Unsupported("c2r input is not the one-sided spectrum of its output")
  y = _dft_along(y, last, 2, n, 1, n, 1, _scale(normalization, n), hermitian_weights=True)
  return y.cast(out)
