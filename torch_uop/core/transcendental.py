"""Transcendental functions as plain arithmetic, so they vectorize.

LLVM lowers `llvm.exp.f32` to a scalar libm call per element, which stops the loop vectorizer. This
pattern matcher rewrites float32 `exp` (and `exp2`) into Cody-Waite range reduction, a degree-6
polynomial and an exponent built from integer bits — the standard construction (as in SLEEF's expf),
accurate to about 1 ulp like eager's vectorized kernels. Overflow gives inf, underflow 0 (with
gradual denormals), NaN stays NaN. Other functions still go to libm.

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
])
