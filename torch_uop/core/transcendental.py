"""Transcendental functions as plain arithmetic, so they vectorize.

LLVM lowers `llvm.exp.f32` to a scalar libm call per element, which stops the loop vectorizer. This
pattern matcher rewrites float32 `exp` (and `exp2`) into Cody-Waite range reduction, a degree-6
polynomial and an exponent built from integer bits — the standard construction (as in SLEEF's expf),
accurate to about 1 ulp like eager's vectorized kernels. Overflow gives inf, underflow 0 (with
gradual denormals), NaN stays NaN. float32 `erf` (GELU's) becomes two polynomial pieces and that exp,
within 2.3 ulp (1.1e-7) of the exact value. Other functions still go to libm.

It also spells out casts to bfloat16 as eager's rounding on float32 bits (round to nearest even, NaN to
0x7FC0, from float32 whatever the source type), because LLVM may lower that fptrunc to an instruction
(vcvtneps2bf16) that flushes subnormals to zero.
"""
from __future__ import annotations
import math
from torch_uop.core.uop import UOp, Ops, UPat, PatternMatcher
from torch_uop.core.dtypes import dtypes

F32, I32 = dtypes.float32, dtypes.int32

# e^r on [-ln2/2, ln2/2]: 1 + r + r^2 * P(r), minimax coefficients of P
_EXP_POLY = (1.98527617612853646278381e-4, 1.39304355252534151077271e-3, 8.33336077630519866943359e-3,
             4.16664853692054748535156e-2, 1.66666671633720397949219e-1, 0.5)
_LN2_HI, _LN2_LO = 0.693145751953125, 1.428606765330187045e-06


def _f(v) -> UOp: return UOp.const(F32, v)
def _i(v) -> UOp: return UOp.const(I32, v)


def _pow2i(q: UOp) -> UOp:
  """2**q for an int32 q in the normal exponent range, from its IEEE bits."""
  return UOp(Ops.BITCAST, F32, ((q + _i(127)).alu(Ops.SHL, _i(23)),))


def exp_f32(x: UOp, base2: bool = False) -> UOp:
  t = x if base2 else x * _f(1.0 / math.log(2))
  qf = t.math("round")
  if base2: r = (x - qf) * _f(math.log(2))
  else: r = (x - qf * _f(_LN2_HI)) - qf * _f(_LN2_LO)
  u = _f(_EXP_POLY[0])
  for c in _EXP_POLY[1:]: u = u * r + _f(c)
  p = (r * r) * u + r + _f(1.0)
  # scale by 2**q in two steps so results down to the smallest denormal stay exact
  q = qf.maximum(_f(-160.0)).minimum(_f(160.0)).cast(I32)
  q1 = q.alu(Ops.SHR, _i(1))
  out = p * _pow2i(q1) * _pow2i(q - q1)
  hi, lo = (128.0, -150.0) if base2 else (88.72283935546875, -104.0)
  out = (x.alu(Ops.CMPLT, _f(hi))).where(out, _f(math.inf))
  out = (x.alu(Ops.CMPLT, _f(lo))).where(_f(0.0), out)
  return x.alu(Ops.CMPNE, x).where(x, out)  # NaN in, NaN out


# Least-squares fits (float64, Chebyshev-spaced points, against math.erf / math.erfc), rounded to float32:
# erf(x) = x * P(x^2) for |x| < 1, and erf(x) = 1 - exp(-x^2) * Q(1/x) for 1 <= x < 4; above 4, erf is 1 in float32
_ERF_SMALL = (1.1283791065216064, -0.37612348794937134, 0.11280365288257599, -0.02671639621257782,
              0.00492328405380249, -0.0005654111737385392)
_ERFC_SCALED = (0.0002749496197793633, 0.5589596629142761, 0.042608775198459625, -0.47395461797714233,
                0.5022039413452148, -0.24921603500843048, 0.02991912141442299, 0.02565707080066204,
                -0.00886930339038372)


def _poly(coeffs: tuple, t: UOp) -> UOp:
  """coeffs[0] + coeffs[1]*t + ... by Horner's rule."""
  out = _f(coeffs[-1])
  for c in reversed(coeffs[:-1]): out = out * t + _f(c)
  return out


def erf_f32(x: UOp) -> UOp:
  a = x.alu(Ops.MAX, -x)  # |x| (NaN stays NaN)
  small = x * _poly(_ERF_SMALL, x * x)
  tail = _f(1.0) - exp_f32(-(a * a)) * _poly(_ERFC_SCALED, a.alu(Ops.RECIP))
  tail = (a.alu(Ops.CMPLT, _f(4.0))).where(tail, _f(1.0))
  signed = x.alu(Ops.CMPLT, _f(0.0)).where(-tail, tail)
  out = a.alu(Ops.CMPLT, _f(1.0)).where(small, signed)
  return x.alu(Ops.CMPNE, x).where(x, out)  # NaN in, NaN out


def cast_to_bfloat16(x: UOp) -> UOp:
  f = x if x.dtype == F32 else x.cast(F32)
  bits = UOp(Ops.BITCAST, I32, (f,))
  lsb = bits.alu(Ops.SHR, _i(16)).alu(Ops.AND, _i(1))
  rounded = (bits + _i(0x7FFF) + lsb).alu(Ops.SHR, _i(16))
  rounded = f.alu(Ops.CMPNE, f).where(_i(0x7FC0), rounded)
  return UOp(Ops.BITCAST, dtypes.bfloat16, (rounded.cast(dtypes.int16),))


transcendental = PatternMatcher([
  (UPat(Ops.CAST, dtype=dtypes.bfloat16, src=(UPat.var("x"),)),
   lambda x: cast_to_bfloat16(x) if x.dtype != dtypes.bfloat16 else None),
  (UPat(Ops.MATH, dtype=F32, arg="exp", src=(UPat.var("x"),)), lambda x: exp_f32(x)),
  (UPat(Ops.MATH, dtype=F32, arg="exp2", src=(UPat.var("x"),)), lambda x: exp_f32(x, base2=True)),
  (UPat(Ops.MATH, dtype=F32, arg="erf", src=(UPat.var("x"),)), lambda x: erf_f32(x)),
])
