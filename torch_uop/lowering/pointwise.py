"""Elementwise lowerings: arithmetic, comparisons, logic, casts, math functions.

Every op goes through `elementwise`: torch's own promotion rules (`elementwise_dtypes`) pick the
computation and result dtypes, arguments are cast and broadcast, the op is built on LTs, and the
result is cast to the dtype in `meta["val"]`. Half types compute in float32, as eager does.
"""
from __future__ import annotations
import math
import torch
from torch._prims_common import elementwise_dtypes, ELEMENTWISE_TYPE_PROMOTION_KIND as KIND
from torch_uop.core.uop import Ops
from torch_uop.core.dtypes import dtypes, DType
from torch_uop.torch_dtypes import from_torch, to_torch
from torch_uop.lowering.registry import register, Unsupported, on_graph_device
from torch_uop.lowering.tensor import LT, compute_dtype
from torch_uop.core.sym import is_sym, SymF

aten = torch.ops.aten


def _fake(x):
  if isinstance(x, LT): return torch.empty((1,) * x.ndim, dtype=to_torch(x.dtype), device="meta")
  if is_sym(x): return 0  # a symbolic size promotes as the Python int it is
  if isinstance(x, SymF): return 0.0
  return x


def promote(kind, *args) -> tuple[DType, DType]:
  comp, res = elementwise_dtypes(*[_fake(a) for a in args if a is not None], type_promotion_kind=kind)
  return compute_dtype(from_torch(comp)), from_torch(res)


def lift(x, dtype: DType, shape: tuple) -> LT:
  if isinstance(x, LT): return x.cast(dtype).broadcast_to(shape)
  return LT.full(shape, x, dtype)


def elementwise(ctx, kind, fn, *args, out_dtype: DType | None = None) -> LT:
  """Promote, cast and broadcast args per torch's rules, apply fn on LTs, cast to eager's dtype."""
  comp, _ = promote(kind, *args)
  shape = ctx.shape
  xs = [lift(a, comp, shape) for a in args]
  return fn(*xs).cast(out_dtype or ctx.dtype)


DEFAULT, ALWAYS_BOOL, INT_TO_FLOAT, NO_OPMATH = KIND.DEFAULT, KIND.ALWAYS_BOOL, KIND.INT_TO_FLOAT, KIND.NO_OPMATH


@register(aten.add.Tensor, aten.add.Scalar)
def add(ctx, a, b, alpha=1):
  if alpha != 1:
    return elementwise(ctx, DEFAULT, lambda x, y: x + y * y.const_like(alpha), a, b)
  return elementwise(ctx, DEFAULT, lambda x, y: x + y, a, b)


@register(aten.sub.Tensor, aten.sub.Scalar, aten.rsub.Tensor, aten.rsub.Scalar)
def sub(ctx, a, b, alpha=1):
  if ctx.node.target in (aten.rsub.Tensor, aten.rsub.Scalar): a, b = b, a
  if ctx.dtype.is_bool: raise Unsupported("subtraction of bools is an error in eager")
  if alpha != 1: return elementwise(ctx, DEFAULT, lambda x, y: x - y * y.const_like(alpha), a, b)
  return elementwise(ctx, DEFAULT, lambda x, y: x - y, a, b)


@register(aten.mul.Tensor, aten.mul.Scalar)
def mul(ctx, a, b):
  if ctx.dtype.is_bool: return elementwise(ctx, DEFAULT, lambda x, y: x & y, a, b)
  # x * 1 is x, exactly, in every dtype: torch's addmm decomposition scales the product and the bias by 1, and where
  # the sum is read by several kernels (a residual stream), the bias times 1 became a kernel of its own
  if _is_one(b): return elementwise(ctx, DEFAULT, lambda x, y: x, a, b)
  if _is_one(a): return elementwise(ctx, DEFAULT, lambda x, y: y, a, b)
  return elementwise(ctx, DEFAULT, lambda x, y: x * y, a, b)


def _is_one(x) -> bool: return isinstance(x, (int, float)) and not isinstance(x, bool) and x == 1


try:  # prims.fma is defined by Inductor's prims module, which Dynamo has imported by the time a graph compiles
  import torch._inductor.inductor_prims  # noqa: F401

  @register(torch.ops.prims.fma.default)
  def fma(ctx, a, b, c):
    """(a * b) + c, as the prim's eager implementation computes it (Adam's foreach updates in compiled graphs)."""
    return elementwise(ctx, DEFAULT, lambda x, y, z: x * y + z, a, b, c)
except (ImportError, AttributeError):  # pragma: no cover  another torch without the prim: it falls back
  pass


@register(aten.div.Tensor, aten.div.Scalar, aten.div.Tensor_mode, aten.div.Scalar_mode, aten.true_divide.Tensor,
          aten.true_divide.Scalar)
def div(ctx, a, b, rounding_mode=None):
  if rounding_mode is None: return elementwise(ctx, INT_TO_FLOAT, lambda x, y: x / y, a, b)
  def rounded(x, y):
    if x.dtype.is_float:
      q = x / y
      return q.math("trunc") if rounding_mode == "trunc" else _float_floor_div(x, y)
    return _int_div(x, y, rounding_mode)
  return elementwise(ctx, DEFAULT, rounded, a, b)


def _float_floor_div(x: LT, y: LT) -> LT:
  """Python floor division on floats, as eager computes it (div_floor_floating_vec): from fmod, with
  the sign fixed up; division by zero gives the IEEE quotient."""
  basic = x / y
  mod = x.alu(Ops.MOD, y)
  # when the quotient overflows, fmod is no help: divide x itself
  overflow = basic.math("abs").eq(math.inf) & x.math("abs").ne(math.inf)
  div = overflow.where(x, x - mod) / y
  fix = (mod.ne(0)) & ((y < 0).ne(mod < 0))
  div = fix.where(div - 1, div)
  floored = div.math("floor")
  floored = ((div - floored) > 0.5).where(floored + 1, floored)
  zero_with_sign = LT.full(div.shape, 0.0, div.dtype).math("copysign", basic)
  out = div.ne(0).where(floored, zero_with_sign)
  return y.eq(0).where(basic, out)


def _int_div(x: LT, y: LT, mode: str) -> LT:
  q = x.alu(Ops.IDIV, y)
  if mode == "trunc" or x.dtype.is_unsigned: return q
  r = x.alu(Ops.MOD, y)
  adjust = r.ne(0) & ((r < 0).ne(y < 0))
  return adjust.where(q - 1, q)


def _unary(name, kind=INT_TO_FLOAT):
  def lower(ctx, a): return elementwise(ctx, kind, lambda x: x.math(name), a)
  return lower


for _name, _ops in {
  "exp": [aten.exp.default], "log": [aten.log.default], "sqrt": [aten.sqrt.default], "sin": [aten.sin.default],
  "cos": [aten.cos.default], "tanh": [aten.tanh.default], "erf": [aten.erf.default], "exp2": [aten.exp2.default],
  "log2": [aten.log2.default], "log10": [aten.log10.default], "tan": [aten.tan.default],
  "asin": [aten.asin.default], "acos": [aten.acos.default], "atan": [aten.atan.default],
  "sinh": [aten.sinh.default], "cosh": [aten.cosh.default], "asinh": [aten.asinh.default],
  "acosh": [aten.acosh.default], "atanh": [aten.atanh.default], "expm1": [aten.expm1.default],
  "log1p": [aten.log1p.default], "erfc": [aten.erfc.default], "lgamma": [aten.lgamma.default],
}.items():
  register(*_ops)(_unary(_name))


@register(aten.rsqrt.default)
def rsqrt(ctx, a): return elementwise(ctx, INT_TO_FLOAT, lambda x: x.math("sqrt").recip(), a)


@register(aten.reciprocal.default)
def reciprocal(ctx, a): return elementwise(ctx, INT_TO_FLOAT, lambda x: x.recip(), a)


@register(aten.sigmoid.default)
def sigmoid(ctx, a):
  def f(x):
    # e = exp(-|x|) never overflows: 1 / (1 + e) for x >= 0, e / (1 + e) below (down to the smallest denormal)
    e = (-x.math("abs")).exp()
    return (x < 0).where(e, 1.0) / (e + 1)
  return elementwise(ctx, INT_TO_FLOAT, f, a)


@register(aten.neg.default)
def neg(ctx, a):
  if ctx.dtype.is_bool: raise Unsupported("negation of bool is an error in eager")
  return elementwise(ctx, DEFAULT, lambda x: -x, a)


@register(aten.abs.default)
def abs_(ctx, a):
  if ctx.dtype.is_bool: return elementwise(ctx, DEFAULT, lambda x: x, a)
  return elementwise(ctx, DEFAULT, lambda x: x.math("abs") if x.dtype.is_float else (x < 0).where(-x, x), a)


@register(aten.sign.default, aten.sgn.default)
def sign(ctx, a):
  def f(x):
    if x.dtype.is_bool: return x
    # (0 < x) - (x < 0), as eager's sign kernel: NaN gives 0
    return (x > 0).cast(x.dtype) - (x < 0).cast(x.dtype)
  return elementwise(ctx, DEFAULT, f, a)


@register(aten.relu.default)
def relu(ctx, a):
  return elementwise(ctx, DEFAULT, lambda x: (x < 0).where(x.const_like(0), x) if not x.dtype.is_float else x.maximum(0), a)


@register(aten.floor.default, aten.ceil.default, aten.trunc.default, aten.round.default)
def rounding(ctx, a):
  name = ctx.node.target.overloadpacket.__name__
  return elementwise(ctx, DEFAULT, lambda x: x.math(name) if x.dtype.is_float else x, a)


@register(aten.round.decimals)
def round_decimals(ctx, a, decimals=0):
  """eager: nearbyint(x * 10**d) / 10**d, or nearbyint(x / 10**-d) * 10**-d for negative d."""
  scale = float(10 ** abs(decimals))
  def f(x):
    if not x.dtype.is_float: return x
    if decimals < 0: return (x / scale).math("round") * scale
    return (x * scale).math("round") / scale
  return elementwise(ctx, DEFAULT, f, a)


@register(aten.frac.default)
def frac(ctx, a): return elementwise(ctx, DEFAULT, lambda x: x - x.math("trunc"), a)


@register(aten.pow.Tensor_Tensor, aten.pow.Tensor_Scalar, aten.pow.Scalar)
def pow_(ctx, a, b):
  def f(x, y):
    if x.dtype.is_float: return x.math("pow", y)
    return _int_pow(x, y, b)
  if isinstance(b, (int, float)) and not isinstance(b, bool):
    if b == 2: return elementwise(ctx, DEFAULT, lambda x, y: x * x, a, b)
    # eager computes these exponents with sqrt/rsqrt kernels (float, double, bfloat16; not half), which
    # differ from pow at -0.0 and -inf
    if b in (0.5, -0.5) and ctx.dtype in (dtypes.float32, dtypes.float64, dtypes.bfloat16):
      return elementwise(ctx, DEFAULT, lambda x, y: x.sqrt() if b > 0 else x.sqrt().recip(), a, b)
  return elementwise(ctx, DEFAULT, f, a, b)


def _int_pow(x: LT, y: LT, b) -> LT:
  """Integer power as eager's powi: exponentiation by squaring (wrapping), and for a negative
  exponent 1 if x == 1, +-1 if x == -1, else 0."""
  if isinstance(b, int) and not isinstance(b, bool):
    if b < 0: raise Unsupported("integers to negative integer powers are an error in eager")
    out, base, e = x.const_like(1), x, b
    while e:
      if e & 1: out = out * base
      e >>= 1
      if e: base = base * base
    return out
  # a tensor exponent: square-and-multiply unrolled over every bit the exponent's dtype can hold
  bits = 8 * y.dtype.itemsize - (0 if y.dtype.is_unsigned else 1)
  out, base, e = x.const_like(1), x, y
  for i in range(bits):
    out = (e & 1).ne(0).where(out * base, out)
    if i + 1 < bits:
      e, base = e.alu(Ops.SHR, e.const_like(1)), base * base
  if y.dtype.is_unsigned: return out
  odd = (y & 1).ne(0)
  neg_result = x.eq(1).where(x.const_like(1), x.eq(-1).where(odd.where(x.const_like(-1), x.const_like(1)), x.const_like(0)))
  return (y < 0).where(neg_result, out)


@register(aten.remainder.Tensor, aten.remainder.Scalar, aten.remainder.Scalar_Tensor)
def remainder(ctx, a, b):
  """Python modulo: the remainder takes the divisor's sign."""
  def f(x, y):
    mod = x.alu(Ops.MOD, y)
    fix = mod.ne(0) & (mod < 0).ne(y < 0)
    return fix.where(mod + y, mod) if not x.dtype.is_unsigned else mod
  return elementwise(ctx, DEFAULT, f, a, b)


@register(aten.fmod.Tensor, aten.fmod.Scalar)
def fmod(ctx, a, b): return elementwise(ctx, DEFAULT, lambda x, y: x.alu(Ops.MOD, y), a, b)


@register(aten.atan2.default)
def atan2(ctx, a, b): return elementwise(ctx, INT_TO_FLOAT, lambda x, y: x.math("atan2", y), a, b)


@register(aten.hypot.default)
def hypot(ctx, a, b): return elementwise(ctx, DEFAULT, lambda x, y: x.math("hypot", y), a, b)


@register(aten.copysign.Tensor, aten.copysign.Scalar)
def copysign(ctx, a, b): return elementwise(ctx, INT_TO_FLOAT, lambda x, y: x.math("copysign", y), a, b)


@register(aten.maximum.default, aten.minimum.default, aten.fmax.default, aten.fmin.default)
def max_min(ctx, a, b):
  name = ctx.node.target.overloadpacket.__name__
  is_max = name in ("maximum", "fmax")
  def f(x, y):
    out = x.maximum(y) if is_max else x.minimum(y)
    if name in ("fmax", "fmin") and x.dtype.is_float:  # ignore NaN unless both are
      out = x.isnan().where(y, y.isnan().where(x, out))
    return out
  return elementwise(ctx, DEFAULT, f, a, b)


@register(aten.clamp.default, aten.clamp.Tensor)
def clamp(ctx, a, lo=None, hi=None):
  def f(x, *bounds):
    it = iter(bounds)
    out = x
    if lo is not None: out = out.maximum(next(it))
    if hi is not None: out = out.minimum(next(it))
    return out
  return elementwise(ctx, DEFAULT, f, a, *[v for v in (lo, hi) if v is not None])


def _compare(op):
  def lower(ctx, a, b):
    swap = op in ("gt", "ge")
    alu = {"lt": Ops.CMPLT, "le": Ops.CMPLE, "gt": Ops.CMPLT, "ge": Ops.CMPLE, "eq": Ops.CMPEQ, "ne": Ops.CMPNE}[op]
    return elementwise(ctx, ALWAYS_BOOL, lambda x, y: (y.alu(alu, x) if swap else x.alu(alu, y)), a, b)
  return lower


for _op in ("lt", "le", "gt", "ge", "eq", "ne"):
  _packet = getattr(aten, _op)
  register(_packet.Tensor, _packet.Scalar)(_compare(_op))


def _logical(fn):
  def lower(ctx, *args):
    return elementwise(ctx, ALWAYS_BOOL, lambda *xs: fn(*[x.cast(dtypes.bool) for x in xs]), *args)
  return lower


register(aten.logical_and.default)(_logical(lambda x, y: x & y))
register(aten.logical_or.default)(_logical(lambda x, y: x | y))
register(aten.logical_xor.default)(_logical(lambda x, y: x.ne(y)))
register(aten.logical_not.default)(_logical(lambda x: x.logical_not()))


@register(aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar)
def where(ctx, cond, a, b):
  comp, _ = promote(DEFAULT, a, b)
  shape = ctx.shape
  c = cond.cast(dtypes.bool).broadcast_to(shape)
  return c.where(lift(a, comp, shape), lift(b, comp, shape)).cast(ctx.dtype)


@register(aten._to_copy.default, aten.clone.default, aten.alias.default, aten.lift_fresh_copy.default,
          aten.convert_element_type.default if hasattr(aten, "convert_element_type") else aten.clone.default)
def to_copy(ctx, a, *args, **kwargs):
  if not on_graph_device(kwargs.get("device")): raise Unsupported("copy to another device")
  return a.cast(ctx.dtype)


@register(torch.ops.prims.convert_element_type.default)
def convert_element_type(ctx, a, dtype): return a.cast(ctx.dtype)


@register(aten.bitwise_and.Tensor, aten.bitwise_and.Scalar, aten.bitwise_or.Tensor, aten.bitwise_or.Scalar,
          aten.bitwise_xor.Tensor, aten.bitwise_xor.Scalar)
def bitwise(ctx, a, b):
  alu = {"bitwise_and": Ops.AND, "bitwise_or": Ops.OR, "bitwise_xor": Ops.XOR}[ctx.node.target.overloadpacket.__name__]
  return elementwise(ctx, DEFAULT, lambda x, y: x.alu(alu, y), a, b)


@register(aten.__lshift__.Tensor, aten.__lshift__.Scalar, aten.bitwise_left_shift.Tensor, aten.bitwise_left_shift.Tensor_Scalar,
          aten.bitwise_left_shift.Scalar_Tensor, aten.__rshift__.Tensor, aten.__rshift__.Scalar,
          aten.bitwise_right_shift.Tensor, aten.bitwise_right_shift.Tensor_Scalar, aten.bitwise_right_shift.Scalar_Tensor)
def shift(ctx, a, b):
  """Shifts as eager: a left shift by a negative or too large amount gives 0, a right shift by one
  fills with the sign bit (LLVM would give poison)."""
  left = "left" in ctx.node.target.overloadpacket.__name__ or "lshift" in ctx.node.target.overloadpacket.__name__
  def f(x, y):
    if not x.dtype.is_int: raise Unsupported("shift of a non-integer")
    bits = 8 * x.dtype.itemsize
    limit = bits if left else bits - (0 if x.dtype.is_unsigned else 1)
    bad = (y < 0) | (y >= limit) if not x.dtype.is_unsigned else (y >= limit)
    safe = bad.where(y.const_like(0), y)
    if left: return bad.where(x.const_like(0), x.alu(Ops.SHL, safe))
    return bad.where(x.alu(Ops.SHR, y.const_like(limit)) if limit < bits else x.const_like(0), x.alu(Ops.SHR, safe))
  return elementwise(ctx, DEFAULT, f, a, b)


@register(aten.bitwise_not.default)
def bitwise_not(ctx, a): return elementwise(ctx, DEFAULT, lambda x: x.logical_not(), a)


@register(aten.isnan.default)
def isnan(ctx, a): return elementwise(ctx, ALWAYS_BOOL, lambda x: x.isnan() if x.dtype.is_float else x.const_like(False, dtypes.bool), a)


@register(aten.signbit.default)
def signbit(ctx, a):
  def f(x):
    if x.dtype.is_float:
      return x.bitcast({4: dtypes.int32, 8: dtypes.int64}[x.dtype.itemsize]) < 0   # -0.0 and -NaN too
    if x.dtype.is_unsigned or x.dtype.is_bool: return x.const_like(False, dtypes.bool)
    return x < 0
  return elementwise(ctx, ALWAYS_BOOL, f, a)


@register(aten.isinf.default)
def isinf(ctx, a):
  return elementwise(ctx, ALWAYS_BOOL, lambda x: x.math("abs").eq(math.inf) if x.dtype.is_float else x.const_like(False, dtypes.bool), a)


@register(aten.angle.default)
def angle(ctx, a):
  """The argument of a real number: pi for negatives, 0 otherwise, NaN stays NaN."""
  def f(x):
    out = (x < 0).where(x.const_like(math.pi), x.const_like(0.0))
    return x.isnan().where(x, out) if x.dtype.is_float else out
  return elementwise(ctx, INT_TO_FLOAT, f, a)


def _int_of(dt: DType) -> DType: return {2: dtypes.int16, 4: dtypes.int32, 8: dtypes.int64}[dt.itemsize]


@register(aten.nextafter.default)
def nextafter(ctx, a, b):
  """The next representable value of the result dtype after a towards b: one step of a's bit pattern
  (half types step their own 16-bit patterns, as eager does)."""
  out = ctx.dtype
  if out not in (dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64): raise Unsupported(f"nextafter of {out}")
  def f(x, y):
    it = _int_of(out)
    bits = x.cast(out).bitcast(it)
    away = (x < y).eq(x > 0)                                   # moving away from zero grows the magnitude bits
    stepped = bits + away.where(bits.const_like(1), bits.const_like(-1))
    tiny = (x < y).where(bits.const_like(1), bits.const_like(it.min() + 1))   # +-smallest subnormal from +-0
    res = x.eq(0).where(tiny, stepped)
    res = x.eq(y).where(y.cast(out).bitcast(it), res)
    return (x.isnan() | y.isnan()).where((x + y).cast(out).bitcast(it), res).bitcast(out)   # no round trip of subnormals
  return elementwise(ctx, DEFAULT, f, a, b)


@register(aten.frexp.Tensor)
def frexp(ctx, a):
  """mantissa in [0.5, 1) (sign of x) and exponent with x = mantissa * 2**exponent, from the bits;
  subnormals are scaled by 2**64 first. Zero, inf and NaN give (x, 0)."""
  out_dt = ctx.dtype_of(0)
  x = a.cast(compute_dtype(out_dt))
  it = _int_of(x.dtype)
  mbits, bias = (23, 126) if x.dtype == dtypes.float32 else (52, 1022)
  emask = (1 << (8 * x.dtype.itemsize - 1 - mbits)) - 1
  sub = x.math("abs") < (2.0 ** (1 - bias))
  xs = sub.where(x * (2.0 ** 64), x)
  bits = xs.bitcast(it)
  efield = bits.alu(Ops.SHR, bits.const_like(mbits)) & emask
  e = efield - bias - sub.where(efield.const_like(64), efield.const_like(0))
  m = ((bits & ~(emask << mbits)) | (bias << mbits)).bitcast(x.dtype)
  special = x.eq(0) | x.isnan() | x.math("abs").eq(math.inf)
  return special.where(x, m).cast(out_dt), special.where(e.const_like(0), e).cast(dtypes.int32)


# ---------------- special functions, evaluated in float64 (series, asymptotic expansions, Newton steps)

def _poly(y: LT, coeffs) -> LT:
  """sum c_k y^k by Horner."""
  out = y.const_like(coeffs[-1])
  for c in reversed(coeffs[:-1]): out = out * y + c
  return out


def _bessel_i(x: LT, nu: int, scaled: bool) -> LT:
  """Modified Bessel I_nu (nu 0 or 1) of float64 x; scaled: times exp(-|x|). The power series for
  |x| <= 30 (70 terms reach float64 precision there), the asymptotic expansion beyond."""
  a = x.math("abs")
  small = a.minimum(30.0)
  y = small * small * 0.25
  coeffs = [1.0 / (math.factorial(k) * math.factorial(k + nu)) for k in range(70)]
  series = _poly(y, coeffs)
  if nu == 1: series = series * small * 0.5
  if scaled: series = series * (-small).exp()
  big = a.maximum(30.0)
  terms, t = [1.0], 1.0
  for k in range(1, 16):
    t *= -(4 * nu * nu - (2 * k - 1) ** 2) / (k * 8)
    terms.append(t)
  asym = _poly(big.recip(), terms) / (big * (2 * math.pi)).sqrt()
  if not scaled: asym = asym * big.exp()
  out = (a <= 30.0).where(series, asym)
  if nu == 1: out = (x < 0).where(-out, out)
  return x.isnan().where(x, out)


def _special(fn, kind=INT_TO_FLOAT):
  def lower(ctx, a):
    return elementwise(ctx, kind, lambda x: fn(x.cast(dtypes.float64)).cast(x.dtype), a)
  return lower


register(aten.i0.default, aten.special_modified_bessel_i0.default)(_special(lambda x: _bessel_i(x, 0, False)))
register(aten.special_i1.default, aten.special_modified_bessel_i1.default)(_special(lambda x: _bessel_i(x, 1, False)))
register(aten.special_i0e.default)(_special(lambda x: _bessel_i(x, 0, True)))
register(aten.special_i1e.default)(_special(lambda x: _bessel_i(x, 1, True)))


@register(aten.special_spherical_bessel_j0.default)
def spherical_bessel_j0(ctx, a):
  def f(x):
    x2 = x * x
    near0 = -(x2 / 6.0) + 1.0 + x2 * x2 / 120.0   # sin(x)/x near 0, where the quotient loses digits
    return (x.math("abs") < 1e-3).where(near0, x.math("sin") / x)
  return elementwise(ctx, INT_TO_FLOAT, lambda x: f(x.cast(dtypes.float64)).cast(x.dtype), a)


def _erfcinv_pos(z: LT) -> LT:
  """x >= 0 with erfc(x) = z for float64 z in (0, 1]: Newton steps on log(erfc(x)) - log(z), a concave
  function, from sqrt(-log z) (right of the root, as erfc(x) <= exp(-x^2)): they fall monotonically."""
  logz = z.log()
  x = (-logz).maximum(0.0).sqrt()
  for _ in range(12):
    e = x.math("erfc")
    step = (e.log() - logz) * e / ((-(x * x)).exp() * (-2.0 / math.sqrt(math.pi)))
    x = e.eq(0.0).where(x, (x - step).maximum(0.0))
  return x


def _erfinv_small(y: LT) -> LT:
  """erf(x) = y for |y| <= 0.5: Newton steps on erf from y sqrt(pi)/2 (monotone from below)."""
  x = y * (math.sqrt(math.pi) / 2)
  for _ in range(8):
    x = x - (x.math("erf") - y) / ((-(x * x)).exp() * (2.0 / math.sqrt(math.pi)))
  return x


def _erfinv(y: LT) -> LT:
  a = y.math("abs")
  x = (a <= 0.5).where(_erfinv_small(a.minimum(0.5)), _erfcinv_pos((-a + 1.0).maximum(1e-320).minimum(1.0)))
  x = a.eq(1.0).where(a.const_like(math.inf), x)
  x = (y < 0).where(-x, x)
  return ((a > 1.0) | y.isnan()).where(y.const_like(math.nan), x)


def _ndtri(p: LT) -> LT:
  """ndtri(p) = -sqrt(2) erfcinv(2p); erfcinv(z) = -erfcinv(2 - z) above 1 (2 - 2p exact there)."""
  z = p * 2.0
  upper = z > 1.0
  zz = upper.where((-p + 1.0) * 2.0, z)
  x = _erfcinv_pos(zz.maximum(1e-320).minimum(1.0)) * -math.sqrt(2.0)
  x = upper.where(-x, x)
  x = p.eq(0.0).where(p.const_like(-math.inf), p.eq(1.0).where(p.const_like(math.inf), x))
  return ((p < 0.0) | (p > 1.0) | p.isnan()).where(p.const_like(math.nan), x)


register(aten.erfinv.default)(_special(_erfinv))
register(aten.special_ndtri.default)(_special(_ndtri))


@register(aten.special_erfcx.default)
def erfcx(ctx, a):
  """exp(x^2) erfc(x); for x > 25 (erfc underflows) the asymptotic series 1/(x sqrt(pi)) (1 - 1/(2x^2) + ...)."""
  def f(x):
    direct = (x * x).exp() * x.math("erfc")
    big = x.maximum(25.0)
    r = (big * big).recip() * 0.5
    asym = _poly(r, [1.0, -1.0, 3.0, -15.0, 105.0, -945.0]) / (big * math.sqrt(math.pi))
    return (x > 25.0).where(asym, direct)
  return elementwise(ctx, INT_TO_FLOAT, lambda x: f(x.cast(dtypes.float64)).cast(x.dtype), a)


def _digamma_pos(x: LT) -> LT:
  """digamma of float64 x > 0: shift to x >= 10 (psi(x) = psi(x+1) - 1/x), then the asymptotic series."""
  r = x.const_like(0.0)
  for _ in range(10):
    small = x < 10.0
    r = small.where(r - x.recip(), r)
    x = small.where(x + 1.0, x)
  y = (x * x).recip()
  series = _poly(y, [0.0, 1 / 12, -1 / 120, 1 / 252, -1 / 240, 1 / 132, -691 / 32760, 1 / 12])
  return r + x.log() - x.recip() * 0.5 - series


def _digamma(x: LT) -> LT:
  """As eager: psi(0) = -inf (sign of -x), NaN at negative integers, reflection below 0."""
  neg = x < 0.0
  pos = _digamma_pos(neg.where(-x + 1.0, x).maximum(1e-300))
  refl = pos - LT.full(x.shape, math.pi, x.dtype) / (x * math.pi).math("tan")
  out = neg.where(refl, pos)
  out = (neg & x.eq(x.math("trunc"))).where(x.const_like(math.nan), out)
  return x.eq(0.0).where(LT.full(x.shape, math.inf, x.dtype).math("copysign", -x), out)


_ZETA_A = [12.0, -720.0, 30240.0, -1209600.0, 47900160.0, -1.8924375803183791606e9, 7.47242496e10,
           -2.950130727918164224e12, 1.1646782814350067249e14, -4.5979787224074726105e15,
           1.8152105401943546773e17, -7.1661652561756670113e18]


def _zeta(x: LT, q: LT) -> LT:
  """Hurwitz zeta(x, q) for float64, as cephes: 20 direct terms, then Euler-Maclaurin."""
  s = q.math("pow", -x)
  a = q
  b = s
  for _ in range(20):
    a = a + 1.0
    b = a.math("pow", -x)
    s = s + b
  w = a
  s = s + b * w / (x - 1.0) - b * 0.5
  fac, k = x.const_like(1.0), 0.0
  for c in _ZETA_A:
    fac = fac * (x + k)
    b = b / w
    s = s + fac * b / c
    k += 1.0
    fac = fac * (x + k)
    b = b / w
    k += 1.0
  qle0 = q <= 0.0
  s = (qle0 & q.eq(q.math("floor"))).where(x.const_like(math.inf), s)
  s = (qle0 & q.ne(q.math("floor")) & x.ne(x.math("floor"))).where(x.const_like(math.nan), s)
  s = (x < 1.0).where(x.const_like(math.nan), s)
  return x.eq(1.0).where(x.const_like(math.inf), s)


register(aten.digamma.default)(_special(_digamma))


@register(aten.special_zeta.default, aten.special_zeta.self_scalar, aten.special_zeta.other_scalar)
def zeta(ctx, a, b):
  return elementwise(ctx, INT_TO_FLOAT, lambda x, q: _zeta(x.cast(dtypes.float64), q.cast(dtypes.float64)).cast(x.dtype), a, b)


@register(aten.polygamma.default)
def polygamma(ctx, n, a):
  """psi^(n)(x) = (-1)^(n+1) n! zeta(n+1, x) for n >= 1; digamma for n = 0."""
  if n == 0: return _special(_digamma)(ctx, a)
  def f(x):
    x = x.cast(dtypes.float64)
    return _zeta(x.const_like(float(n + 1)), x) * float((-1) ** (n + 1) * math.factorial(n))
  return elementwise(ctx, INT_TO_FLOAT, lambda x: f(x).cast(x.dtype), a)
