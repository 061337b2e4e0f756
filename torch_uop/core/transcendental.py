"""Transcendental functions as plain arithmetic, so they vectorize.

LLVM lowers float32 math functions (`llvm.exp.f32`, `tanhf`, ...) to one scalar libm call per element,
which stops the loop vectorizer. This pattern matcher rewrites float32 `exp`, `exp2`, `expm1`, `tanh`,
`log`, `log2`, `log10`, `log1p`, `sin`, `cos`, `atan`, `atan2`, `pow` and `erf` into range reduction,
polynomials and exponent bits: the standard constructions (as in SLEEF, Cephes or musl), with coefficients
fitted for this file (float64 least squares at Chebyshev points, reweighted towards minimax, rounded to
float32 one coefficient at a time). exp rounds x/ln2 to q by adding a large constant, whose low mantissa bits then
hold q's exponent field (no float-to-int conversion), and scales by 2^q in two steps, or in one where the
argument is known to be <= 0 (sigmoid's e^-|x|, softmax's and attention's e^-|x - max|, erf's e^-x^2). tanh is
x + x^3 P(x^2) below 0.625 and 1 - 2 / (e^2|x| + 1) above, with the sign copied last. sin and cos reduce |x| by
pi/2 exactly at every size, in float64: Cody and Waite's subtraction below 2^36, Payne and Hanek's product
with the bits of 2/pi above. pow computes 2^(y log2|x|) in float64. Both vectorize all the same.

Each function takes the whole float32 range as C's libm does: NaN stays NaN; infinities, signed zeros,
subnormal inputs and results, overflow and underflow come out as in libm. Worst errors against the exact
value (tests/test_transcendental.py over every binade, and all floats of the main ranges): exp, exp2, log,
log1p and pow 1 ulp; expm1, tanh, log2, log10, atan, sin and cos 1.5; atan2 2; erf 2.5.
Only the CPU (LLVM) path uses this: codegen keeps GPU-style devices on their native math functions.

It also spells out casts to bfloat16 as eager's rounding on float32 bits (round to nearest even, NaN to
0x7FC0, from float32 whatever the source type), because LLVM may lower that fptrunc to an instruction
(vcvtneps2bf16) that flushes subnormals to zero.
"""
from __future__ import annotations
import math
import struct
from torch_uop.core.uop import UOp, Ops, UPat, PatternMatcher
from torch_uop.core.dtypes import dtypes

F32, F64, I32, I64 = dtypes.float32, dtypes.float64, dtypes.int32, dtypes.int64
INF, NAN = math.inf, math.nan


def _f(v) -> UOp: return UOp.const(F32, v)
def _d(v) -> UOp: return UOp.const(F64, v)
def _i(v) -> UOp: return UOp.const(I32, v)
def _bits(x: UOp) -> UOp: return UOp(Ops.BITCAST, I32 if x.dtype == F32 else I64, (x,))
def _float(bits: UOp) -> UOp: return UOp(Ops.BITCAST, F32 if bits.dtype == I32 else F64, (bits,))
def _abs(x: UOp) -> UOp: return x.math("abs")
def _isnan(x: UOp) -> UOp: return x.alu(Ops.CMPNE, x)
def _lt(a: UOp, b) -> UOp: return a.alu(Ops.CMPLT, a.operand(b))
def _eq(a: UOp, b) -> UOp: return a.alu(Ops.CMPEQ, a.operand(b))
def _div(a: UOp, b: UOp) -> UOp: return a.alu(Ops.FDIV, b)


def _poly(coeffs: tuple, t: UOp) -> UOp:
  """coeffs[0] + coeffs[1]*t + ... by Horner's rule, in t's dtype."""
  out = t.const_like(coeffs[-1])
  for c in reversed(coeffs[:-1]): out = out * t + t.const_like(c)
  return out


def _pow2i(q: UOp) -> UOp:
  """2**q for an int32 q in the normal exponent range, from its IEEE bits."""
  return _exponent_field(q + _i(127))


def _exponent_field(biased: UOp) -> UOp:
  """The float 2^(e - 127) for e in the low 8 bits of an int32 (the bits above shift out of the word)."""
  return _float(biased.alu(Ops.SHL, _i(23)))


# ---- exp, exp2, expm1
# e^r on [-ln2/2, ln2/2]: 1 + r + r^2 * P(r), P of degree 4 (within 0.03 ulp of e^r before rounding)
_EXP_POLY = (0.49999988079071045, 0.166665181517601, 0.04166964814066887, 0.008368944749236107, 0.0013745303731411695)
_LN2_HI, _LN2_LO = 0.693145751953125, 1.428606765330187e-06  # ln2 in two parts: q * _LN2_HI is exact for |q| < 2^8
_INV_LN2 = 1.4426950408889634


# t + (1.5 * 2^23 + bias) rounds t (|t| < 2^22) to an integer in the float's low mantissa bits, with `bias` added:
# those bits shifted into the exponent field give 2^(round(t) + bias - 127), with no conversion instruction and
# defined for any t, NaN included
def _rounded(t: UOp, bias: int) -> tuple[UOp, UOp]:
  """(round(t) as float32, round(t) + bias in the low bits of an int32), for |t| < 2^22."""
  rounder = _f(1.5 * 2 ** 23 + bias)
  big = t + rounder
  return big - rounder, _bits(big)


def _exp_reduced(x: UOp, base2: bool, bias: int = 127) -> tuple[UOp, UOp]:
  """e^x (2^x) = p * 2^q: (p on [sqrt(1/2), sqrt(2)], q + bias as _rounded gives it)."""
  qf, biased = _rounded(x if base2 else x * _f(_INV_LN2), bias)
  if base2: r = (x - qf) * _f(math.log(2))
  else: r = (x - qf * _f(_LN2_HI)) - qf * _f(_LN2_LO)
  return (r * r) * _poly(_EXP_POLY, r) + r + _f(1.0), biased


def exp_f32(x: UOp, base2: bool = False, nonpositive: bool = False) -> UOp:
  """`nonpositive`: x <= 0 or NaN (sigmoid's e^-|x|, softmax's e^(x - max)), so nothing overflows and 2^q needs
  one scaling step."""
  hi, lo = (128.0, -150.0) if base2 else (88.72283935546875, -104.0)
  underflows = _lt(x, lo)
  # where the result is 0 anyway, compute at x = 0: the scaling below would otherwise make subnormal intermediates,
  # which Intel CPUs handle in microcode at a hundred cycles or more each (a masked softmax's exp(-inf))
  xs = underflows.where(_f(0.0), x)
  if nonpositive:
    # q in [-150, 0]: p * 2^(q + 64) is exact and normal, and the product with 2^-64 rounds once, subnormals included
    p, biased = _exp_reduced(xs, base2, bias=127 + 64)
    out = p * _exponent_field(biased) * _f(2.0 ** -64)
  else:
    # q in [-150, 128]: two steps, 2^(e1 - 127) * 2^(e2 - 127) with e1 + e2 = q + 254 both in [52, 191], so results
    # down to the smallest denormal come out of one rounding
    p, biased = _exp_reduced(xs, base2)
    half = biased.alu(Ops.SHR, _i(1))
    out = p * _exponent_field(half + _i(64)) * _exponent_field(biased - half + _i(63))
    out = _lt(_f(hi), x).where(_f(INF), out)
  # NaN needs no test: it stays NaN through p, and both comparisons are false for it
  return underflows.where(_f(0.0), out)


# expm1(r) on [-ln2/2, ln2/2]: r + r^2 * (1/2 + r * P(r))
_EXPM1_POLY = (0.1666666567325592, 0.04166649281978607, 0.008333544246852398, 0.0013932327274233103,
               0.00019763332966249436)


def _expm1_core(x: UOp) -> UOp:
  """e^x - 1 for x <= 88.8 (not NaN), -1 below -17.5 (where it rounds to -1)."""
  xc = x.maximum(_f(-17.5))
  qf = (xc * _f(_INV_LN2)).math("round")
  r = (xc - qf * _f(_LN2_HI)) - qf * _f(_LN2_LO)
  p = r + r * (r * (_f(0.5) + r * _poly(_EXPM1_POLY, r)))
  # e^x - 1 = 2 * (u * (p + 1) - 1/2) with u = 2^(q-1): u stays normal for q up to 128, u - 1/2 is exact
  u = _pow2i(qf.cast(I32) - _i(1))
  scaled = (u * p + (u - _f(0.5))) * _f(2.0)
  return _eq(qf, 0.0).where(p, scaled)


def expm1_f32(x: UOp) -> UOp:
  xs = _isnan(x).where(_f(0.0), x).minimum(_f(88.8))
  out = _lt(x, 88.72283935546875).where(_expm1_core(xs), _f(INF))
  return (_isnan(x).alu(Ops.OR, _eq(x, 0.0))).where(x, out)  # NaN stays NaN, -0 stays -0


# ---- tanh
# tanh(x) = x + x * z * P(z), z = x^2, for |x| < 0.625
_TANH_POLY = (-0.3333333134651184, 0.13333220779895782, -0.05394818261265755, 0.02170693688094616,
              -0.008190169930458069, 0.0021528673823922873)


def tanh_f32(x: UOp) -> UOp:
  a = _abs(x)
  z = x * x
  small = x + x * (z * _poly(_TANH_POLY, z))
  # tanh(a) = 1 - 2 / (e^(2a) + 1) for a >= 0.625, where that fraction is below 0.45, so the subtraction loses no
  # precision; a >= 9.5 rounds to 1 (e^19 > 2^27)
  u = a.minimum(_f(9.5)) * _f(2.0)
  p, biased = _exp_reduced(u, base2=False)  # 1.25 <= u <= 19: 2^q is a normal number
  e = p * _exponent_field(biased)
  large = _f(1.0) - _div(_f(2.0), e + _f(1.0))
  # NaN compares false both ways: it takes small's NaN. The sign comes last, so tanh(-0) is -0 (small's sum is +0)
  return _lt(a, 0.625).alu(Ops.NOT).where(large, small).math("copysign", x)


# ---- log, log2, log10, log1p
# log(1 + f) = f - s * (f - R), s = f / (2 + f), z = s^2, R = z * P(z) (= 2 atanh(s) / s - 2)
_LOG_POLY = (0.6666677594184875, 0.39977580308914185, 0.29870930314064026)
_SQRT_HALF_BITS = 0x3F3504F3  # float32 bits of sqrt(1/2)
_LOG10_2_HI, _LOG10_2_LO = 0.30103302001953125, -3.024355464731343e-06
_INV_LN10 = 0.4342944819032518


def _log_reduce(x: UOp) -> tuple[UOp, UOp]:
  """x > 0 (finite, maybe subnormal) as 2^k * (1 + f), sqrt(1/2) <= 1 + f < sqrt(2): (k as float32, f)."""
  tiny = _lt(x, 2.0 ** -126)
  bits = _bits(tiny.where(x * _f(2.0 ** 25), x)) + _i(0x3F800000 - _SQRT_HALF_BITS)
  k = bits.alu(Ops.SHR, _i(23)) - tiny.where(_i(127 + 25), _i(127))
  m = _float(bits.alu(Ops.AND, _i(0x007FFFFF)) + _i(_SQRT_HALF_BITS))
  return k.cast(F32), m - _f(1.0)


def _log1p_tail(f: UOp) -> UOp:
  """log(1 + f) = f - tail, for |f| <= 0.415."""
  s = _div(f, f + _f(2.0))
  z = s * s
  return s * (f - z * _poly(_LOG_POLY, z))


def _times(f: UOp, tail: UOp, c: float) -> UOp:
  """(f - tail) * c, with c split in two float32 parts so the exact f keeps its precision."""
  hi = float(struct.unpack("f", struct.pack("f", c))[0])
  return f * _f(hi) + (f * _f(c - hi) - tail * _f(c))


def _log_specials(x: UOp, out: UOp) -> UOp:
  """log's values at x < 0 (NaN), 0 (-inf), +inf and NaN."""
  out = (_f(0.0).alu(Ops.CMPLE, x)).where(out, _f(NAN))
  out = _eq(x, 0.0).where(_f(-INF), out)
  out = _eq(x, INF).where(_f(INF), out)
  return _isnan(x).where(x, out)


def log_f32(x: UOp, base: str = "e") -> UOp:
  k, f = _log_reduce(x)
  tail = _log1p_tail(f)
  if base == "2": out = k + _times(f, tail, _INV_LN2)
  elif base == "10": out = k * _f(_LOG10_2_HI) + (k * _f(_LOG10_2_LO) + _times(f, tail, _INV_LN10))
  else: out = k * _f(_LN2_HI) + ((k * _f(_LN2_LO) - tail) + f)
  return _log_specials(x, out)


def log1p_f32(x: UOp) -> UOp:
  u = x + _f(1.0)
  k, f = _log_reduce(u)
  c = _div(x - (u - _f(1.0)), u)  # the rounding error of 1 + x, relative to u: log(1 + x) = log(u) + c
  out = k * _f(_LN2_HI) + (((k * _f(_LN2_LO) + c) - _log1p_tail(f)) + f)
  out = _eq(x, 0.0).where(x, out)  # -0 stays -0
  return _log_specials(u, out)


# ---- sin, cos
# pi/2 as four float64 parts of <= 17 significant bits (the last rounded): q * part is exact for q < 2^36
_PIO2_PARTS = (1.57080078125, -4.45445766672492e-06, 2.5633384304057927e-12, 5.721188726109832e-18)
_TWO_OVER_PI = 0.6366197723675814
# sin(r) = r + r * z * S(z), cos(r) = 1 - z/2 + z^2 * C(z), z = r^2, |r| <= pi/4
_SIN_POLY = (-0.1666666716337204, 0.008333379402756691, -0.00019853078993037343, 2.8328061034699203e-06)
_COS_POLY = (0.04166664555668831, -0.0013887309469282627, 2.4432336431345902e-05)


def _two_over_pi_bits(n: int) -> int:
  """floor(2/pi * 2^n), from Machin's pi/4 = 4 atan(1/5) - atan(1/239) in integer arithmetic."""
  guard = n + 32
  def atan_inv(k: int) -> int:  # atan(1/k) * 2^guard
    total, term, i = 0, (1 << guard) // k, 0
    while term:
      total += (-1) ** i * (term // (2 * i + 1))
      term //= k * k
      i += 1
    return total
  pi = 4 * (4 * atan_inv(5) - atan_inv(239))
  return (2 << (2 * guard)) // pi >> (guard - n)


# |x| >= 2^36 is M * 2^E (M the 24-bit integer mantissa, 13 <= E <= 104): x * 2/pi mod 4 (Payne and Hanek's
# reduction) from five 26-bit pieces of 2/pi starting at bit E0 - 1, for the largest E0 in _HUGE_E0 that is
# <= E. Each |x| * piece is exact in float64, and the bits of 2/pi above bit E - 1 only add multiples of 4.
_HUGE_E0, _PIECE_BITS, _PIECES = (13, 45, 77), 26, 5


def _two_over_pi_pieces() -> dict[int, tuple]:
  total = _HUGE_E0[-1] + _PIECE_BITS * _PIECES
  bits = _two_over_pi_bits(total)
  def piece(first_bit: int) -> float:  # bits first_bit .. first_bit + 25 of 2/pi (bit i weighs 2^-i)
    last = first_bit + _PIECE_BITS - 1
    return math.ldexp((bits >> (total - last)) & ((1 << _PIECE_BITS) - 1), -last)
  return {e0: tuple(piece(e0 - 1 + _PIECE_BITS * j) for j in range(_PIECES)) for e0 in _HUGE_E0}


_TWO_OVER_PI_PIECES = _two_over_pi_pieces()


def _mod4(t: UOp) -> UOp: return t - (t * _d(0.25)).math("floor") * _d(4.0)  # exact for float64 t >= 0


def _reduce_huge(a: UOp, ad: UOp) -> tuple[UOp, UOp]:
  """(r, q) with |x| = (q + 4k) * pi/2 + r for |x| = a >= 2^36 (ad: a in float64)."""
  exponent = _bits(a).alu(Ops.SHR, _i(23)) - _i(150)
  def piece(j: int) -> UOp:
    out = _d(_TWO_OVER_PI_PIECES[_HUGE_E0[0]][j])
    for e0 in _HUGE_E0[1:]: out = _lt(exponent, e0).where(out, _d(_TWO_OVER_PI_PIECES[e0][j]))
    return out
  terms = [ad * piece(j) for j in range(_PIECES)]
  top = _mod4(_mod4(terms[0]) + terms[1])  # exact: the sum spans at most 53 bits
  q = (top + terms[2]).math("round")  # terms[2] < 32, terms[3:] < 2^-20
  frac = (((top - q) + terms[2]) + terms[3]) + terms[4]
  return frac * _d(math.pi / 2), q


def sin_cos_f32(x: UOp, cosine: bool) -> UOp:
  # |x| = q * pi/2 + r in float64: below 2^36 by Cody and Waite's subtraction (exact there), above from 2/pi's bits
  a = _abs(x)
  ad = a.cast(F64)
  q = (ad * _d(_TWO_OVER_PI)).math("round")
  r = ad
  for part in _PIO2_PARTS: r = r - q * _d(part)
  r_huge, q_huge = _reduce_huge(a, ad)
  huge = _lt(a, 2.0 ** 36).alu(Ops.NOT)
  r, q = huge.where(r_huge, r), huge.where(q_huge, q)
  quadrant = _mod4(q).cast(I32) + _i(1 if cosine else 0)
  rf = r.cast(F32)
  z = rf * rf
  sin_r = rf + rf * (z * _poly(_SIN_POLY, z))
  half_z = z * _f(0.5)
  w = _f(1.0) - half_z
  cos_r = w + (((_f(1.0) - w) - half_z) + (z * z) * _poly(_COS_POLY, z))
  out = _eq(quadrant.alu(Ops.AND, _i(1)), 0).where(sin_r, cos_r)
  # quadrants 2 and 3 negate; sin is odd: the sign bits XOR in
  sign = quadrant.alu(Ops.SHL, _i(30)).alu(Ops.AND, _i(-0x80000000))
  if not cosine: sign = sign.alu(Ops.XOR, _bits(x).alu(Ops.AND, _i(-0x80000000)))
  out = _float(_bits(out).alu(Ops.XOR, sign))
  return _lt(a, INF).where(out, x - x)  # inf and NaN give NaN


# ---- atan, atan2
# atan(t) = t + t * z * P(z), z = t^2, 0 <= t <= 1
_ATAN_POLY = (-0.33333298563957214, 0.1999853402376175, -0.14264102280139923, 0.10951506346464157,
              -0.08401581645011902, 0.05792722851037979, -0.031148936599493027, 0.010899696499109268,
              -0.0017904058331623673)
_PIO2_HI, _PIO2_LO = 1.5707963705062866, -4.3711390001862426e-08
_PI_HI, _PI_LO = 3.1415927410125732, -8.742278000372485e-08


def _atan_unit(t: UOp) -> UOp:
  z = t * t
  return t + t * (z * _poly(_ATAN_POLY, z))


def atan_f32(x: UOp) -> UOp:
  a = _abs(x)
  inverted = _lt(_f(1.0), a)
  p = _atan_unit(inverted.where(a.alu(Ops.RECIP), a))
  out = inverted.where(_f(_PIO2_HI) + (_f(_PIO2_LO) - p), p)  # atan(a) = pi/2 - atan(1/a)
  return out.math("copysign", x)


def atan2_f32(y: UOp, x: UOp) -> UOp:
  ax, ay = _abs(x), _abs(y)
  # t = min/max in [0, 1]; equal magnitudes give 1 (both infinite: pi/4) or 0 (both zero)
  t = _eq(ax, ay).where(_eq(ax, 0.0).where(_f(0.0), _f(1.0)), _div(ax.minimum(ay), ax.maximum(ay)))
  p = _atan_unit(t)
  swapped, x_neg = _lt(ax, ay), _lt(_bits(x), 0)
  # angle = offset +- p: 0 + p, pi/2 - p (|y| > |x|), pi - p (x < 0), pi/2 + p (both)
  signed_p = swapped.alu(Ops.CMPNE, x_neg).where(-p, p)
  off_hi = swapped.where(_f(_PIO2_HI), x_neg.where(_f(_PI_HI), _f(0.0)))
  off_lo = swapped.where(_f(_PIO2_LO), x_neg.where(_f(_PI_LO), _f(0.0)))
  out = (off_hi + (off_lo + signed_p)).math("copysign", y)
  return (_isnan(x).alu(Ops.OR, _isnan(y))).where(x + y, out)


# ---- pow
# float64 log and exp2 for pow: log(1 + f) = f - s * (f - z * P(z)) as above, 2^f = 1 + f * E(f) for |f| <= 1/2
_LOG_POLY_F64 = (0.6666666666666877, 0.3999999999786516, 0.28571429179830243, 0.2222214237081034,
                 0.18187292779480843, 0.15189666604002527, 0.16448542208690334)
_EXP2_POLY_F64 = (0.6931471805482112, 0.24022650698110606, 0.05550410935268065, 0.009618128616114578,
                  0.0013333454859120345, 0.00015403825464135895, 1.5309156482899062e-05, 1.317893375175233e-06)
_SQRT_HALF_BITS_F64 = 0x3FE6A09E667F3BCD


def _log2_f64(ad: UOp) -> UOp:
  """log2 of a positive finite float64 (a float32 value, so never subnormal in float64)."""
  off = _bits(ad) - UOp.const(I64, _SQRT_HALF_BITS_F64)
  k = off.alu(Ops.SHR, UOp.const(I64, 52))
  m = _float(_bits(ad) - off.alu(Ops.AND, UOp.const(I64, -(1 << 52))))  # in [sqrt(1/2), sqrt(2))
  f = m - _d(1.0)
  s = _div(f, f + _d(2.0))
  z = s * s
  return k.cast(F64) + (f - s * (f - z * _poly(_LOG_POLY_F64, z))) * _d(_INV_LN2)


def _exp2_to_f32(e: UOp) -> UOp:
  """2^e (float64 e, maybe +-inf) rounded once to float32: overflow gives inf, underflow 0 or a denormal."""
  e = e.maximum(_d(-300.0)).minimum(_d(300.0))
  n = e.math("round")
  p = _d(1.0) + (e - n) * _poly(_EXP2_POLY_F64, e - n)
  scale = _float((n.cast(I64) + UOp.const(I64, 1023)).alu(Ops.SHL, UOp.const(I64, 52)))
  return (p * scale).cast(F32)


def pow_f32(x: UOp, y: UOp) -> UOp:
  """C's powf: |x|^y = 2^(y log2|x|) in float64, then the sign and special cases."""
  ax = _abs(x)
  lg = _eq(ax, 0.0).where(_d(-INF), _eq(ax, INF).where(_d(INF), _log2_f64(ax.cast(F64))))
  out = _exp2_to_f32(y.cast(F64) * lg)
  y_int = _eq(y.math("trunc"), y)
  half = y * _f(0.5)
  y_odd = y_int.alu(Ops.AND, half.math("trunc").alu(Ops.CMPNE, half))  # |y| >= 2^24 is even
  x_neg = _lt(_bits(x), 0)
  out = x_neg.alu(Ops.AND, y_odd).where(-out, out)
  # a negative finite base to a non-integer power is NaN (-0 and -inf are not: their powers are +-0 or +-inf)
  out = (_lt(x, 0.0).alu(Ops.AND, _lt(_f(-INF), x)).alu(Ops.AND, y_int.alu(Ops.NOT))).where(_f(NAN), out)
  out = (_isnan(x).alu(Ops.OR, _isnan(y))).where(x + y, out)
  out = (_eq(ax, 1.0).alu(Ops.AND, _eq(_abs(y), INF))).where(_f(1.0), out)  # (-1)^+-inf
  return (_eq(y, 0.0).alu(Ops.OR, _eq(x, 1.0))).where(_f(1.0), out)  # x^0 and 1^y are 1, even for NaN


# ---- erf
# Least-squares fits (float64, Chebyshev-spaced points, against math.erf / math.erfc), rounded to float32:
# erf(x) = x * P(x^2) for |x| < 1, and erf(x) = 1 - exp(-x^2) * Q(1/x) for 1 <= x < 4; above 4, erf is 1 in float32
_ERF_SMALL = (1.1283791065216064, -0.37612348794937134, 0.11280365288257599, -0.02671639621257782,
              0.00492328405380249, -0.0005654111737385392)
_ERFC_SCALED = (0.0002749496197793633, 0.5589596629142761, 0.042608775198459625, -0.47395461797714233,
                0.5022039413452148, -0.24921603500843048, 0.02991912141442299, 0.02565707080066204,
                -0.00886930339038372)


def erf_f32(x: UOp) -> UOp:
  a = x.alu(Ops.MAX, -x)  # |x| (NaN stays NaN)
  small = x * _poly(_ERF_SMALL, x * x)
  # (the tail is computed at |x| <= 4 only: beyond, where erf is 1, e^(-x^2) would be subnormal, and slow)
  ta = a.minimum(_f(4.0))
  tail = _f(1.0) - exp_f32(-(ta * ta), nonpositive=True) * _poly(_ERFC_SCALED, ta.alu(Ops.RECIP))
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


_UNARY_F32 = {
  "exp": exp_f32, "exp2": lambda x: exp_f32(x, base2=True), "expm1": expm1_f32, "tanh": tanh_f32,
  "log": log_f32, "log2": lambda x: log_f32(x, "2"), "log10": lambda x: log_f32(x, "10"), "log1p": log1p_f32,
  "sin": lambda x: sin_cos_f32(x, cosine=False), "cos": lambda x: sin_cos_f32(x, cosine=True),
  "atan": atan_f32, "erf": erf_f32,
}

transcendental = PatternMatcher([
  # sigmoid's e^-|x|
  (UPat(Ops.MATH, dtype=F32, arg="exp", src=(UPat(Ops.NEG, src=(UPat(Ops.MATH, arg="abs"),), name="x"),)),
   lambda x: exp_f32(x, nonpositive=True)),
  (UPat(Ops.CAST, dtype=dtypes.bfloat16, src=(UPat.var("x"),)),
   lambda x: cast_to_bfloat16(x) if x.dtype != dtypes.bfloat16 else None),
  *[(UPat(Ops.MATH, dtype=F32, arg=name, src=(UPat.var("x"),)), fn) for name, fn in _UNARY_F32.items()],
  (UPat(Ops.MATH, dtype=F32, arg="atan2", src=(UPat.var("y"), UPat.var("x"))), atan2_f32),
  (UPat(Ops.MATH, dtype=F32, arg="pow", src=(UPat.var("x"), UPat.var("y"))), pow_f32),
])
