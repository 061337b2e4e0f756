"""Op-by-op checks of the uop backend against eager PyTorch.

Every test compiles a small function with `torch.compile(backend="uop")`, runs it and compares with
eager through `check_against_eager` (values, dtypes and shapes via `torch.testing.assert_close`, and
no node may fall back to ATen) or `check_grads_against_eager` (input gradients as well).
Families: elementwise math and type promotion, reductions, movement, creation, matmul and
convolution, and the neural-network ops (softmax, norms, pooling, attention, losses).
"""
from __future__ import annotations
import pytest
import torch
import torch.nn.functional as F
import torch_uop
from helpers import check_against_eager, check_grads_against_eager

nan, inf = float("nan"), float("inf")

ALL_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64, torch.bool, torch.uint8]


def tol(dtype):
  """Tolerances for comparing a half-precision result computed in float32 (as eager does) with eager."""
  if dtype == torch.bfloat16: return dict(rtol=1.6e-2, atol=1e-2)
  if dtype == torch.float16: return dict(rtol=1e-3, atol=1e-3)
  return {}


def make(shape, dtype=torch.float32, low=-3.0, high=3.0):
  """Random values of any dtype; integers in [low, high), bools half true."""
  if dtype == torch.bool: return torch.rand(shape) > 0.5
  if dtype.is_floating_point: return (torch.rand(shape, dtype=torch.float64) * (high - low) + low).to(dtype)
  return torch.randint(int(low), int(high), shape).to(dtype)


def special_values(dtype=torch.float32):
  """Ordinary values mixed with NaN, +-Inf and signed zeros."""
  return torch.tensor([0.0, -0.0, 1.5, -2.5, nan, inf, -inf, 3.0, -1.0, 0.5, 7.0, -7.0], dtype=dtype)


# ============================================================================ elementwise

@pytest.mark.parametrize("op", ["add", "sub", "mul", "div"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int32, torch.int64, torch.float16, torch.bfloat16])
def test_arith(op, dtype):
  fn = getattr(torch, op)
  a = make((4, 5), dtype)
  b = make((4, 5), dtype, 1, 4) if not dtype.is_floating_point else make((4, 5), dtype, 0.5, 3.0)
  check_against_eager(fn, a, b, **tol(dtype))


def test_add_sub_alpha():
  a, b = make((3, 4)), make((3, 4))
  check_against_eager(lambda x, y: torch.add(x, y, alpha=2.5) - torch.sub(y, x, alpha=-3), a, b)
  check_against_eager(lambda x, y: torch.add(x, y, alpha=3), make((3, 4), torch.int64), make((3, 4), torch.int64))


def test_rsub():
  check_against_eager(lambda x: 1.5 - x, make((3, 4)))
  check_against_eager(lambda x: torch.rsub(x, 2), make((3, 4), torch.int32))


@pytest.mark.parametrize("mode", ["floor", "trunc"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
def test_div_rounding_float(mode, dtype):
  a = torch.tensor([7.0, -7.0, 7.0, -7.0, 5.5, -5.5, 0.0, -0.0, 1.0, -1.0, 3.0, 2.5], dtype=dtype)
  b = torch.tensor([2.0, 2.0, -2.0, -2.0, 0.5, 1.5, 3.0, 3.0, 0.0, 0.0, -0.0, -1.0], dtype=dtype)
  check_against_eager(lambda x, y: torch.div(x, y, rounding_mode=mode), a, b, **tol(dtype))
  check_against_eager(lambda x: torch.div(x, -0.75, rounding_mode=mode), make((5, 7), dtype), **tol(dtype))


@pytest.mark.parametrize("mode", ["floor", "trunc"])
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint8])
def test_div_rounding_int(mode, dtype):
  if dtype == torch.uint8:
    a, b = torch.tensor([7, 200, 0, 255, 13], dtype=dtype), torch.tensor([2, 3, 5, 7, 13], dtype=dtype)
  else:
    a = torch.tensor([7, -7, 7, -7, 0, 6, -6, 1, -1, 100], dtype=dtype)
    b = torch.tensor([2, 2, -2, -2, 3, 3, 3, -5, 5, -7], dtype=dtype)
  check_against_eager(lambda x, y: torch.div(x, y, rounding_mode=mode), a, b)
  check_against_eager(lambda x: torch.div(x, 3, rounding_mode=mode), a)
  if dtype != torch.uint8: check_against_eager(lambda x: torch.div(x, -3, rounding_mode=mode), a)
  check_against_eager(lambda x, y: x // y, a, b)


def test_int_true_div():
  a, b = make((4, 5), torch.int64), make((4, 5), torch.int64, 1, 5)
  check_against_eager(lambda x, y: x / y, a, b)
  check_against_eager(lambda x: x / 4, a)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_div_by_zero_float(dtype):
  a = torch.tensor([1.0, -1.0, 0.0, nan, inf, -2.0], dtype=dtype)
  b = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, -0.0], dtype=dtype)
  check_against_eager(lambda x, y: x / y, a, b)
  check_against_eager(lambda x: x / 0.0, a)
  check_against_eager(lambda x, y: torch.div(x, y, rounding_mode="floor"), a, b)
  check_against_eager(lambda x, y: torch.div(x, y, rounding_mode="trunc"), a, b)


def test_remainder_fmod():
  a = torch.tensor([7.0, -7.0, 7.0, -7.0, 5.5, -0.5, 0.0])
  b = torch.tensor([2.0, 2.0, -2.0, -2.0, 1.5, 3.0, 2.0])
  check_against_eager(torch.remainder, a, b)
  check_against_eager(torch.fmod, a, b)
  ai, bi = torch.tensor([7, -7, 7, -7, 0, 9]), torch.tensor([2, 2, -2, -2, 3, 4])
  check_against_eager(torch.remainder, ai, bi)
  check_against_eager(torch.fmod, ai, bi)


CMP_OPS = ["lt", "le", "gt", "ge", "eq", "ne"]


@pytest.mark.parametrize("op", CMP_OPS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.uint8, torch.bool, torch.float16])
def test_compare_tensor(op, dtype):
  fn = getattr(torch, op)
  a, b = make((6, 4), dtype, 0, 4), make((6, 4), dtype, 0, 4)
  a[0] = b[0]  # some ties
  check_against_eager(fn, a, b)


@pytest.mark.parametrize("op", CMP_OPS)
def test_compare_scalar_and_nan(op):
  fn = getattr(torch, op)
  x = special_values()
  check_against_eager(lambda t: fn(t, 1.5), x)
  check_against_eager(lambda t: fn(t, 0), x)
  check_against_eager(lambda t: fn(t, 2), make((3, 5), torch.int32))
  check_against_eager(lambda t: fn(t, 1.5), make((3, 5), torch.int32))   # int tensor vs float scalar
  check_against_eager(lambda t: fn(t, -1), make((3, 5), torch.uint8, 0, 5))
  check_against_eager(fn, x, x.flip(0))                                 # NaN on either side


def test_compare_broadcast_and_mixed_dtypes():
  check_against_eager(lambda a, b: a < b, make((4, 1, 3)), make((5, 1)))
  check_against_eager(lambda a, b: a >= b, make((3, 4), torch.int32), make((4,), torch.float64))
  check_against_eager(lambda a, b: a == b, make((3, 4), torch.int64, 0, 3), make((3, 4), torch.uint8, 0, 3))


@pytest.mark.parametrize("op", ["logical_and", "logical_or", "logical_xor"])
@pytest.mark.parametrize("dtypes", [(torch.bool, torch.bool), (torch.float32, torch.int64), (torch.uint8, torch.bool)])
def test_logical_binary(op, dtypes):
  fn = getattr(torch, op)
  a, b = make((5, 6), dtypes[0], -1, 2), make((5, 6), dtypes[1], -1, 2)
  check_against_eager(fn, a, b)


@pytest.mark.parametrize("dtype", [torch.bool, torch.float32, torch.int32])
def test_logical_not(dtype):
  x = make((5, 6), dtype, -1, 2)
  if dtype.is_floating_point: x[0, :3] = torch.tensor([nan, 0.0, -0.0])
  check_against_eager(torch.logical_not, x)


def test_bool_operators():
  a, b = make((4, 5), torch.bool), make((4, 5), torch.bool)
  check_against_eager(lambda x, y: (x & y) | (~x ^ y), a, b)
  check_against_eager(lambda x, y: (x & 6) | (y ^ 3), make((4, 5), torch.int64, -8, 8), make((4, 5), torch.int64, -8, 8))
  check_against_eager(lambda x: ~x, make((4, 5), torch.int32, -8, 8))


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8])
def test_shifts(dtype):
  lo = 0 if dtype == torch.uint8 else -100
  x = make((12,), dtype, lo, 100)
  bits = 8 * x.element_size()
  s = torch.tensor([0, 1, 3, bits - 1, bits, bits + 5, 2, 7, 1, 0, 4, 5]).to(dtype)
  if dtype != torch.uint8: s[-1] = -2                  # negative shift amounts give 0 / the sign
  check_against_eager(lambda a, b: (a << b, a >> b), x, s)
  check_against_eager(lambda a: (a << 3, a >> 2, a >> bits + 1), x)


def test_where():
  c = make((4, 5), torch.bool)
  a, b = make((4, 5)), make((1, 5), torch.float64)
  check_against_eager(torch.where, c, a, b)
  check_against_eager(lambda c, a: torch.where(c, a, 0.5), c, a)
  check_against_eager(lambda c, a: torch.where(c, 2, a), c, make((4, 5), torch.int32))
  check_against_eager(lambda c, a: torch.where(c, a, 2.5), c, make((4, 5), torch.int32))    # int tensor, float scalar -> float32
  check_against_eager(lambda c, a: torch.where(c, a, -1), c, make((4, 5), torch.float16))
  check_against_eager(lambda c: torch.where(c, 1.0, 0.0), c)
  check_against_eager(lambda x: torch.where(x > 0, x, x * 0.1), a)
  check_against_eager(lambda c, a: torch.where(c, a, torch.tensor(3.0)), make((3, 1), torch.bool), make((1, 5)))


CAST_VALUES = torch.tensor([0.0, 1.0, -1.0, 2.75, -2.75, 100.5, 0.25, 127.0, -0.0, 3.5, 0.5, -0.5])


@pytest.mark.parametrize("src", ALL_DTYPES)
def test_cast(src):
  """src -> every dtype, one graph per source."""
  def fn(t):
    # negative float -> uint8 is undefined behaviour: cast |t| there
    return tuple((t.abs() if dst == torch.uint8 and src.is_floating_point else t).to(dst) for dst in ALL_DTYPES)
  check_against_eager(fn, CAST_VALUES.to(src))


def test_cast_special_float():
  x = special_values()
  for dst in (torch.float64, torch.float16, torch.bfloat16, torch.bool):
    check_against_eager(lambda t: t.to(dst), x)
  check_against_eager(lambda t: t.to(torch.float32), special_values(torch.float64))
  check_against_eager(lambda t: (t * 1e10).to(torch.float16), make((8,)))   # overflows to inf
  check_against_eager(lambda t: t.to(torch.int64) + 1, make((3, 4), torch.int32))  # widening keeps sign
  check_against_eager(lambda t: t.to(torch.int64), torch.tensor([0, 200, 255], dtype=torch.uint8))  # no sign extension


@pytest.mark.parametrize("src", [torch.float32, torch.float64, torch.float16, torch.int64])
def test_cast_to_bfloat16_rounds_bits_like_eager(src):
  # subnormals survive (a hardware bf16 convert flushes them), ties round to even, doubles go through float32
  x = torch.tensor([9.18e-41, 1e-39, -2e-40, 3e-38, 1.00390625, 1.01171875, -1.00390625, 3.4e38, 1e39, 0.0, -0.0])
  x = x.to(src) if src.is_floating_point else (x * 1e6).clamp(-1e9, 1e9).to(src)
  fn = lambda t: (t * 1).to(torch.bfloat16)
  actual = torch.compile(fn, backend="uop")(x)
  assert torch.equal(actual.view(torch.int16), fn(x).view(torch.int16))


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.float16])
def test_clamp(dtype):
  x = make((5, 6), dtype, -5, 5)
  check_against_eager(lambda t: torch.clamp(t, min=-1), x, **tol(dtype))
  check_against_eager(lambda t: torch.clamp(t, max=2), x, **tol(dtype))
  check_against_eager(lambda t: torch.clamp(t, -2, 3), x, **tol(dtype))
  check_against_eager(lambda t: t.clamp_min(0.5), x, **tol(dtype))   # int -> float promotion
  check_against_eager(lambda t: t.clamp_max(1), x, **tol(dtype))


def test_clamp_tensor_bounds_and_nan():
  x, lo, hi = make((5, 6)), make((5, 6), low=-3, high=0), make((6,), low=0, high=3)
  check_against_eager(lambda t, a, b: torch.clamp(t, a, b), x, lo, hi)
  check_against_eager(lambda t, a: torch.clamp(t, min=a), x, lo)
  check_against_eager(lambda t, b: torch.clamp(t, max=b), x, hi)
  check_against_eager(lambda t: torch.clamp(t, -1.0, 1.0), special_values())  # NaN passes through
  check_against_eager(lambda t: torch.clamp(t, 2.0, -1.0), x)                   # min > max: max wins
  check_against_eager(lambda t: torch.clamp(t, min=nan), x)                     # a NaN bound propagates
  check_against_eager(lambda t, a: torch.clamp(t, min=a), make((5, 6), torch.int32, -3, 3), make((6,), torch.int64, -1, 1))


def test_pow():
  x = make((4, 5), low=0.1, high=3)
  check_against_eager(lambda t: t ** 2, x)
  check_against_eager(lambda t: t ** 3, make((4, 5)))
  check_against_eager(lambda t: t ** 0.5, x)
  check_against_eager(lambda t: t ** -1.5, x)
  check_against_eager(lambda t: t ** 0, make((4, 5)))
  check_against_eager(lambda t, e: t ** e, x, make((4, 5), low=-2, high=2))
  check_against_eager(lambda t, e: t ** e, make((4, 5)), torch.tensor([0.0, 1.0, 2.0, 3.0, -1.0]))  # negative base, int exponent
  check_against_eager(lambda e: 2.0 ** e, make((4, 5)))
  for e in (2.5, 0.5, -0.5, 2, 3, -1, -2, 0, 1.0 / 3):
    for dt in (torch.float32, torch.float16, torch.bfloat16):
      check_against_eager(lambda t: torch.pow(t, e), special_values(dt), **tol(dt))


def test_pow_int():
  x = make((4, 5), torch.int64, -4, 5)
  check_against_eager(lambda t: t ** 3, x)
  check_against_eager(lambda t: t ** 0, x)
  check_against_eager(lambda t: t ** 2, make((4, 5), torch.int32))
  check_against_eager(lambda t: torch.pow(t, 7), make((4, 5), torch.int64, -3, 4))
  check_against_eager(lambda t: t ** 2.0, x)             # int tensor ** float scalar -> float32
  check_against_eager(lambda t: 3 ** t, make((4, 5), torch.int64, 0, 6))
  check_against_eager(lambda t, e: t ** e, x, make((4, 5), torch.int64, 0, 5))


UNARY_FNS = {
  "exp": torch.exp, "log": torch.log, "sqrt": torch.sqrt, "rsqrt": torch.rsqrt, "sin": torch.sin, "cos": torch.cos,
  "tanh": torch.tanh, "sigmoid": torch.sigmoid, "erf": torch.erf, "abs": torch.abs, "neg": torch.neg,
  "sign": torch.sign, "floor": torch.floor, "ceil": torch.ceil, "round": torch.round, "trunc": torch.trunc,
  "relu": torch.relu, "reciprocal": torch.reciprocal, "exp2": torch.exp2, "log2": torch.log2, "expm1": torch.expm1,
  "log1p": torch.log1p, "sinh": torch.sinh, "atan": torch.atan, "frac": torch.frac, "square": torch.square,
}


@pytest.mark.parametrize("name", list(UNARY_FNS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_unary_float(name, dtype):
  fn = UNARY_FNS[name]
  positive = name in ("log", "sqrt", "rsqrt", "log2")
  x = make((63,), dtype, 0.05 if positive else -4, 4)
  x = torch.cat([x, special_values(dtype)])     # NaN, +-inf, signed zeros too
  check_against_eager(fn, x, **tol(dtype))


INT_UNARY = ["exp", "sqrt", "sin", "sigmoid", "abs", "neg", "sign", "floor", "round", "relu", "reciprocal", "tanh", "square", "erf"]
BOOL_ERRORS = ("neg", "relu", "square", "abs", "floor", "round")   # an error in eager for bool inputs


@pytest.mark.parametrize("name,dtype", [(n, dt) for n in INT_UNARY for dt in (torch.int32, torch.int64, torch.uint8, torch.bool)
                                        if not (dt == torch.bool and n in BOOL_ERRORS)])
def test_unary_int(name, dtype):
  x = make((4, 6), dtype, 0 if dtype == torch.uint8 else -5, 6)
  check_against_eager(UNARY_FNS[name], x)


def test_round_half_even_and_decimals():
  x = torch.tensor([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 0.49999997, 1e20, -3.5])
  check_against_eager(torch.round, x)
  check_against_eager(lambda t: torch.round(t, decimals=2), make((4, 5)))


@pytest.mark.parametrize("op", ["maximum", "minimum", "fmax", "fmin"])
def test_maximum_minimum_nan(op):
  fn = getattr(torch, op)
  a = torch.tensor([1.0, nan, 3.0, nan, -inf, 0.0, -0.0, 2.0])
  b = torch.tensor([2.0, 1.0, nan, nan, 5.0, -0.0, 0.0, inf])
  check_against_eager(fn, a, b)
  check_against_eager(fn, make((3, 4)), make((4,)))
  check_against_eager(fn, make((3, 4), torch.int32), make((3, 4), torch.int64))
  check_against_eager(fn, make((3, 4), torch.float16), make((3, 4), torch.float32))


def test_relu_nan():
  check_against_eager(torch.relu, special_values())
  check_against_eager(F.relu6, special_values())
  check_against_eager(lambda x: F.leaky_relu(x, 0.1), special_values())


@pytest.mark.parametrize("shapes", [((4, 5), (5,)), ((3, 1, 5), (4, 1)), ((1,), (2, 3, 4)), ((2, 1, 3, 1), (1, 4, 1, 5)),
                                    ((), (3, 4)), ((3, 4), ())])
def test_broadcast(shapes):
  a, b = make(shapes[0]), make(shapes[1])
  check_against_eager(lambda x, y: x * y + x - y / 2, a, b)


def test_zero_dim():
  a, b = torch.tensor(2.5), torch.tensor(-1.5)
  check_against_eager(lambda x, y: x * y + torch.exp(x), a, b)
  check_against_eager(lambda x, y: x + y, torch.tensor(3), torch.tensor(4))
  check_against_eager(lambda x, y: x * y, make((3, 4), torch.int32), torch.tensor(2.5))   # 0-dim float promotes int
  check_against_eager(lambda x, y: x + y, make((3, 4), torch.float16), torch.tensor(2.5, dtype=torch.float64), **tol(torch.float16))
  check_against_eager(lambda x, y: x + y, make((3, 4), torch.int32), torch.tensor(7))    # 0-dim int64 does not widen
  check_against_eager(lambda x: x.sum() * 2 - 1, a)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint8, torch.bool])
def test_python_scalars_with_int_tensors(dtype):
  x = make((3, 4), dtype, 0, 5)
  check_against_eager(lambda t: t * 2.5, x)          # -> float32
  check_against_eager(lambda t: t + 1.0, x)
  check_against_eager(lambda t: t / 2, x)             # true division -> float32
  check_against_eager(lambda t: t * 3, x)             # stays the tensor's dtype (bool -> int64)
  check_against_eager(lambda t: t + True, x)
  if dtype != torch.bool: check_against_eager(lambda t: 7 - t, x)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_python_scalars_with_float_tensors(dtype):
  x = make((3, 4), dtype)
  check_against_eager(lambda t: t * 2.5 + 1, x, **tol(dtype))
  check_against_eager(lambda t: t * 1e-3 + 3, x, **tol(dtype))


def test_mixed_tensor_promotion():
  check_against_eager(lambda a, b: a + b, make((3, 4), torch.int32), make((3, 4), torch.float16))
  check_against_eager(lambda a, b: a * b, make((3, 4), torch.uint8), make((3, 4), torch.int32))
  check_against_eager(lambda a, b: a + b, make((3, 4), torch.float16), make((3, 4), torch.bfloat16), **tol(torch.bfloat16))
  check_against_eager(lambda a, b: a - b, make((3, 4), torch.float32), make((3, 4), torch.float64))
  check_against_eager(lambda a, b: a + b, make((3, 4), torch.bool), make((3, 4), torch.uint8))


def test_nan_inf_arithmetic():
  x, y = special_values(), special_values().flip(0)
  check_against_eager(lambda a, b: (a + b, a - b, a * b, a / b), x, y)
  check_against_eager(lambda a: (a * 0, a - a, torch.exp(a), torch.log(a), torch.sqrt(a)), x)
  check_against_eager(lambda a: (torch.isnan(a), torch.isinf(a), torch.isfinite(a), torch.nan_to_num(a)), x)


def test_sign_signbit_copysign():
  x = special_values()
  check_against_eager(torch.sign, x)
  check_against_eager(torch.sgn, x)
  check_against_eager(torch.signbit, x)
  check_against_eager(torch.copysign, x, x.flip(0))
  check_against_eager(torch.sign, make((3, 4), torch.int64))


def test_lerp_addcmul_misc():
  a, b, c = make((3, 4)), make((3, 4)), make((3, 4))
  check_against_eager(lambda x, y: torch.lerp(x, y, 0.3), a, b)
  check_against_eager(lambda x, y, z: torch.addcmul(x, y, z, value=0.5), a, b, c)
  check_against_eager(lambda x, y, z: torch.addcdiv(x, y, z.abs() + 1, value=-2), a, b, c)
  check_against_eager(lambda x: F.silu(x) + F.softplus(x) + F.hardtanh(x) + F.elu(x) + F.hardswish(x), a)
  check_against_eager(lambda x: torch.atan2(x, c), a)
  check_against_eager(lambda x: torch.hypot(x, c), a)


def test_empty_tensors():
  x = make((0, 4))
  check_against_eager(lambda t: (t * 2 + 1, t.sum(0), t.sum(1), t.sum(), t.mean(1), t.amax(1), t.prod(0), t.any(0), t.all()), x)
  check_against_eager(lambda t, y: (torch.cat([t, y]), t.t() @ t, (t @ y.t()).exp()), x, make((2, 4)))
  check_against_eager(lambda t: (t.reshape(2, 0, 2), t[:, 1:3], t.expand(3, 0, 4) + 0), x)
  check_against_eager(lambda t: (t.argmax(1), tuple(t.min(1)), F.softmax(t, 1)), x)


def test_int_overflow_wraps():
  # int64 products wrap as in eager; value-range reasoning must not assume they cannot
  x = torch.tensor([3037000500, -3037000500, 5, 1 << 62, -(1 << 62)])
  check_against_eager(lambda t: (t * t, t * t < 0, (t * 4) // 4), x)
  check_against_eager(lambda t: (t * t, t + 2147483647), torch.tensor([65536, -65536, 3], dtype=torch.int32))
  check_against_eager(lambda t: t * 200, torch.tensor([1, 2, 3], dtype=torch.uint8))
  # an index-derived value whose exact range lies past the dtype's: it wraps, so the compare is not constant
  check_against_eager(lambda t: (torch.arange(100, dtype=torch.uint8) + 200 < 100) & t, torch.ones(100, dtype=torch.bool))


# ============================================================================ reductions

REDUCE_DIMS = [None, 0, 1, -1, (0, 2), (1, 2), (0, 1, 2)]
REDUCE_CASES = [(op, dims, keepdim) for op in ("sum", "mean", "amax", "amin", "prod") for dims in REDUCE_DIMS
                for keepdim in (False, True)
                if not (op == "prod" and not isinstance(dims, int) and dims is not None)   # prod takes one dim
                and not (dims is None and keepdim and op in ("sum", "mean", "prod"))]         # no keepdim without a dim


@pytest.mark.parametrize("op,dims,keepdim", REDUCE_CASES)
def test_reduce(op, dims, keepdim):
  x = make((3, 4, 5), low=0.5, high=1.5) if op == "prod" else make((3, 4, 5))
  fn = getattr(torch, op)
  if dims is None and op in ("amax", "amin"): check_against_eager(lambda t: fn(t, dim=(), keepdim=keepdim), x)
  elif dims is None: check_against_eager(fn, x)
  else: check_against_eager(lambda t: fn(t, dims, keepdim=keepdim), x)


@pytest.mark.parametrize("op,dtype", [(op, dt) for op in ("sum", "prod", "amax", "amin", "mean")
                                      for dt in (torch.int32, torch.int64, torch.uint8, torch.bool, torch.float16, torch.bfloat16, torch.float64)
                                      if op != "mean" or dt.is_floating_point])     # mean of integers is an error in eager
def test_reduce_dtypes(op, dtype):
  x = make((6, 33), dtype, 0 if dtype == torch.uint8 else -3, 4)
  if op == "prod": x = make((6, 5), dtype, 1, 3) if not dtype.is_floating_point else make((6, 5), dtype, 0.6, 1.4)
  fn = getattr(torch, op)
  t = tol(dtype) if dtype not in (torch.float16, torch.bfloat16) else dict(rtol=2e-2, atol=5e-2)
  check_against_eager(lambda v: (fn(v, 1), fn(v, 0, keepdim=True)), x, **t)
  if op in ("sum", "prod", "mean"): check_against_eager(fn, x, **t)   # full reduction; int/bool sum -> int64


def test_sum_dtype_arg_and_bool():
  x = make((5, 7), torch.bool)
  check_against_eager(lambda t: (t.sum(), t.sum(1), t.sum(0, keepdim=True)), x)
  check_against_eager(lambda t: t.sum(1, dtype=torch.float64), make((5, 7)))
  check_against_eager(lambda t: t.sum(dtype=torch.int32), make((5, 7), torch.int64))
  check_against_eager(lambda t: (t.float().mean(), t.mean(dtype=torch.float32), t.mean(1, dtype=torch.float64)), make((5, 7), torch.int64))


def test_reduce_nan_inf():
  x = torch.tensor([[1.0, nan, 3.0], [inf, 2.0, -inf], [-1.0, -2.0, 0.5], [inf, inf, 1.0]])
  check_against_eager(lambda t: (t.sum(1), t.amax(1), t.amin(0), t.mean(0), t.prod(1)), x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_long_max_min_propagate_nan(dtype):
  # float max/min reductions run as maxnum/minnum (which LLVM vectorizes) plus a NaN flag: a NaN anywhere in a
  # long row (vector body or remainder) must still come out, and -inf/inf rows stay right
  x = make((6, 1001), dtype)
  x[0, 3], x[1, 500], x[2, 1000], x[3, :] = nan, nan, nan, -inf
  x[4, 10] = inf
  check_against_eager(lambda t: (t.amax(1), t.amin(1), t.max(1).values, torch.softmax(t, 1)), x)


@pytest.mark.parametrize("correction", [0, 1])
@pytest.mark.parametrize("dims", [None, 1, (0, 2)])
@pytest.mark.parametrize("keepdim", [False, True])
def test_var_std(correction, dims, keepdim):
  x = make((4, 5, 6)) * 3 + 10
  check_against_eager(lambda t: torch.var(t, dims, correction=correction, keepdim=keepdim), x)
  check_against_eager(lambda t: torch.std(t, dims, correction=correction, keepdim=keepdim), x)


@pytest.mark.filterwarnings("ignore:var\\(\\)")
def test_var_mean_and_half():
  x = make((4, 16))
  check_against_eager(lambda t: torch.var_mean(t, 1, correction=0), x)
  check_against_eager(lambda t: torch.var(t, 1), x.to(torch.float16), rtol=1e-2, atol=1e-2)
  check_against_eager(lambda t: torch.var(t, 1, correction=1), make((3, 1)))  # one element: NaN


@pytest.mark.parametrize("op", ["argmax", "argmin"])
@pytest.mark.parametrize("dim", [None, 0, 1, -1])
@pytest.mark.parametrize("keepdim", [False, True])
def test_argmax_argmin(op, dim, keepdim):
  fn = getattr(torch, op)
  x = make((5, 6, 7), torch.int64, 0, 3).float()   # many ties: the first index wins
  check_against_eager(lambda t: fn(t, dim, keepdim=keepdim), x)


@pytest.mark.parametrize("op", ["argmax", "argmin"])
def test_argmax_nan_and_dtypes(op):
  fn = getattr(torch, op)
  x = torch.tensor([[1.0, nan, 3.0, nan], [2.0, 2.0, 1.0, 1.0], [-inf, inf, inf, -inf], [0.0, -0.0, 0.0, -1.0]])
  check_against_eager(lambda t: (fn(t, 1), fn(t, 0), fn(t)), x)
  check_against_eager(lambda t: (fn(t, 1), fn(t)), make((4, 9), torch.int32, 0, 3))
  check_against_eager(lambda t: fn(t, 1), make((4, 9), torch.uint8, 0, 3))
  check_against_eager(lambda t: fn(t, 1), make((4, 9), torch.float16))
  check_against_eager(lambda t: fn(t), torch.tensor(3.0))


@pytest.mark.parametrize("op", ["max", "min"])
@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("keepdim", [False, True])
def test_max_min_dim(op, dim, keepdim):
  fn = getattr(torch, op)
  x = make((4, 5, 6), torch.int64, 0, 4).float()
  x[1, 2, 3] = nan
  check_against_eager(lambda t: tuple(fn(t, dim, keepdim=keepdim)), x)


def test_max_min_full_and_binary():
  x = make((4, 5))
  check_against_eager(lambda t: (t.max(), t.min()), x)
  check_against_eager(lambda t: (t.max(), t.min()), special_values())
  check_against_eager(lambda t: tuple(t.max(1)) + tuple(t.min(0)), make((4, 5), torch.int32))
  check_against_eager(lambda a, b: torch.max(a, b), x, make((5,)))


@pytest.mark.parametrize("op", ["any", "all"])
@pytest.mark.parametrize("dtype", [torch.bool, torch.float32, torch.int64, torch.uint8])
def test_any_all(op, dtype):
  fn = getattr(torch, op)
  x = make((4, 6, 3), dtype, 0, 2)
  x2 = torch.ones((4, 6, 3), dtype=dtype)
  check_against_eager(lambda t: (fn(t), fn(t, 1), fn(t, -1, keepdim=True), fn(t, (0, 2))), x)
  check_against_eager(lambda t: (fn(t), fn(t, 0)), x2)
  if dtype.is_floating_point: check_against_eager(lambda t: (fn(t), fn(t, 0)), special_values())


def test_reduce_non_contiguous_and_large():
  x = make((16, 12)).t()
  check_against_eager(lambda t: (t.sum(0), t.sum(1), t.amax(1), t.argmax(0)), x)
  check_against_eager(lambda t: t.sum(), make((1000, 37)), rtol=1e-4, atol=1e-4)
  check_against_eager(lambda t: t[:, ::2].mean(1), make((9, 10)))


def test_reduce_zero_dim_and_size_one():
  check_against_eager(lambda t: (t.sum(), t.amax(), t.mean(), t.argmax()), torch.tensor(2.5))
  check_against_eager(lambda t: (t.sum(1), t.amax(1, keepdim=True), t.argmax(1)), make((5, 1)))


def test_reduce_fused_with_elementwise():
  x, y = make((6, 7)), make((6, 7))
  check_against_eager(lambda a, b: ((a * b).sum(1) + 1).exp(), x, y)
  check_against_eager(lambda a: a - a.mean(1, keepdim=True), x)
  check_against_eager(lambda a: (a / a.sum(0), a.amax(1) - a.amin(1)), x.abs() + 1)


def test_cumsum_logsumexp_norm():
  x = make((4, 6))
  check_against_eager(lambda t: torch.logsumexp(t, 1), x)
  check_against_eager(lambda t: (torch.linalg.vector_norm(t, dim=1), t.norm(), F.normalize(t, dim=1)), x)
  check_against_eager(lambda t: torch.cumsum(t, 1), x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32, torch.bool, torch.float16])
def test_cumsum_cumprod(dtype):
  x = make((3, 5, 4), dtype, 0 if dtype == torch.bool else -2, 3)
  check_against_eager(lambda t: (torch.cumsum(t, 1), torch.cumsum(t, -1), torch.cumsum(t, 0)), x, **tol(dtype))
  check_against_eager(lambda t: torch.cumprod(t, 1), x, **tol(dtype))


# ============================================================================ movement

def test_view_reshape():
  x = make((2, 3, 4))
  check_against_eager(lambda t: (t.view(6, 4) * 2, t.reshape(-1), t.reshape(4, 3, 2) + 1, t.view(2, 12).t()), x)
  check_against_eager(lambda t: t.t().reshape(12, 2) * 1, make((2, 12)))        # reshape of a transpose copies
  check_against_eager(lambda t: t.reshape(()) + 1, torch.tensor([3.0]))
  check_against_eager(lambda t: t.flatten(1) + t.unflatten(2, (2, 2)).flatten(1), x)


@pytest.mark.parametrize("order", [(1, 0, 2), (2, 0, 1), (2, 1, 0), (0, 2, 1)])
def test_permute(order):
  check_against_eager(lambda t: t.permute(order) * 1.5, make((2, 3, 4)))


def test_transpose_expand():
  x = make((3, 1, 4))
  check_against_eager(lambda t: (t.transpose(0, 2) + 1, t.transpose(-1, -3).contiguous(), t.mT + 0, t.permute(2, 1, 0) + 0), x)
  check_against_eager(lambda t: (t.expand(3, 5, 4) * 2, t.expand(2, 3, 6, 4) + 0), x)
  check_against_eager(lambda t: t.expand_as(torch.empty(3, 2, 4)) - 1, x)
  check_against_eager(lambda t: torch.broadcast_to(t, (2, 4, 3)) + 0, make((4, 1)))


@pytest.mark.parametrize("index", [
  (slice(1, None),), (slice(None, None, 2),), (slice(1, -1, 3),), (slice(-3, None),), (Ellipsis, slice(None, -2)),
  (slice(None), slice(2, 9, 2)), (1,), (-1, slice(1, 4)), (slice(None), -2), (Ellipsis, 0), (None, 2, None),
  (slice(None), None, slice(1, 3)), (slice(5, 100),), (slice(-100, 2),), (slice(3, 3),),
])
def test_slicing(index):
  check_against_eager(lambda t: t[index] * 2, make((6, 10, 3)))


def test_select_narrow_unbind():
  x = make((4, 5, 6))
  check_against_eager(lambda t: (t.select(1, 2) + 0, t.select(-1, -1) + 0, t[2, 3] + 0, t[-1, -1, -1] + 0), x)
  check_against_eager(lambda t: (t.narrow(2, 1, 3) + 0, t.narrow(0, 2, 2) + 0), x)
  check_against_eager(lambda t: tuple(u * 1 for u in t.unbind(1)), x)
  check_against_eager(lambda t: tuple(u * 1 for u in torch.unbind(t, -1)), x)


def test_squeeze_unsqueeze():
  x = make((3, 1, 4, 1))
  check_against_eager(lambda t: (t.squeeze() + 0, t.squeeze(1) + 0, t.squeeze(-1) + 0, t.squeeze((1, 3)) + 0,
                                 t.squeeze(0) + 0), x)
  check_against_eager(lambda t: (t.unsqueeze(0) + 0, t.unsqueeze(-1) + 0, t.unsqueeze(2) + 0, t[None, :, None] + 0), make((3, 4)))


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_cat(dim):
  a, b, c = make((2, 3, 4)), make((2, 3, 4)), make((2, 3, 4))
  check_against_eager(lambda x, y, z: torch.cat([x, y, z], dim), a, b, c)
  check_against_eager(lambda x, y: torch.cat([x * 2, y.exp(), x], dim) + 1, a, b)


def test_cat_mixed():
  a, b = make((2, 3)), make((4, 3))
  check_against_eager(lambda x, y: torch.cat([x, y]), a, b)                              # different sizes
  check_against_eager(lambda x, y: torch.cat([x, y], 1), make((3, 1)), make((3, 5)))
  check_against_eager(lambda x, y: torch.cat([x, y]), make((2, 3), torch.int32), make((1, 3)))  # promotion
  check_against_eager(lambda x, y: torch.cat([x, y], 1), make((3, 2), torch.bool), make((3, 2), torch.bool))
  check_against_eager(lambda x, y: torch.cat([x.t(), y], 0), make((3, 2)), make((4, 3)))      # non-contiguous
  check_against_eager(lambda x: torch.cat([x]) + 0, a)
  check_against_eager(lambda x, y: (torch.stack([x, y]), torch.stack([x, y], -1), torch.hstack([x, y])), a, make((2, 3)))


@pytest.mark.parametrize("pad,value", [((1, 2), 0.0), ((1, 1, 2, 0), 0.0), ((2, 1, 1, 3), -1.5), ((-1, 2), 0.0),
                                       ((-1, -2, 1, -1), 3.0), ((0, 0, 0, 0, 1, 1), 7.0), ((1, -2), 2.0)])
def test_constant_pad(pad, value):
  check_against_eager(lambda t: F.pad(t, pad, value=value) * 2, make((2, 4, 5)))


def test_constant_pad_dtypes():
  check_against_eager(lambda t: F.pad(t, (1, 2), value=5), make((3, 4), torch.int64))
  check_against_eager(lambda t: F.pad(t, (2, 1, 1, 0)), make((3, 4), torch.float16))
  check_against_eager(lambda t: F.pad(t, (1, 1), value=True), make((3, 4), torch.bool))
  check_against_eager(lambda t: F.pad(t, (1, 1), value=nan), make((3, 4)))


def test_reflect_replicate_pad():
  x = make((1, 2, 5, 6))
  check_against_eager(lambda t: F.pad(t, (2, 1, 1, 2), mode="reflect"), x)
  check_against_eager(lambda t: F.pad(t, (2, 1, 1, 2), mode="replicate"), x)
  check_against_eager(lambda t: F.pad(t, (2, 1, 1, 2), mode="circular"), x)


@pytest.mark.parametrize("dims", [(0,), (1,), (-1,), (0, 2), (0, 1, 2)])
def test_flip(dims):
  check_against_eager(lambda t: t.flip(dims) + 0, make((3, 4, 5)))


def test_flip_roll_rot():
  x = make((4, 5))
  check_against_eager(lambda t: (torch.fliplr(t) + 0, torch.flipud(t) + 0, t.t().flip(0) * 1), x)
  check_against_eager(lambda t: (torch.roll(t, 2, 1), torch.roll(t, (-1, 3), (0, 1)), torch.rot90(t)), x)


def test_split_chunk():
  x = make((7, 6))
  check_against_eager(lambda t: tuple(u * 1 for u in t.split(3)), x)
  check_against_eager(lambda t: tuple(u * 1 for u in t.split([1, 2, 3], dim=1)), x)
  check_against_eager(lambda t: tuple(u * 1 for u in t.chunk(3, 1)), x)
  check_against_eager(lambda t: tuple(u * 1 for u in t.chunk(4, 0)), x)
  check_against_eager(lambda t: tuple(u * 1 for u in torch.tensor_split(t, 3, 1)), x)


@pytest.mark.parametrize("layout", ["transposed", "sliced", "stepped", "expanded", "permuted", "offset"])
def test_non_contiguous_inputs(layout):
  base = make((6, 8, 5))
  x = {"transposed": base.transpose(0, 2), "sliced": base[1:5, 2:7], "stepped": base[::2, ::3, 1::2],
       "expanded": make((1, 8, 1)).expand(6, 8, 5), "permuted": base.permute(2, 0, 1),
       "offset": base[3]}[layout]
  assert not x.is_contiguous() or layout == "offset"
  check_against_eager(lambda t: (t * 2 + 1, t.sum(-1), t.reshape(-1)[:7] + 0, t.exp().amax(0)), x)
  check_against_eager(lambda a, b: a * b, x, x.clone())


def test_non_contiguous_input_identity_and_view_outputs():
  x = make((4, 6)).t()
  check_against_eager(lambda t: t.clone(), x)
  check_against_eager(lambda t: t.contiguous(), x)
  check_against_eager(lambda t: (t + 1)[1:, ::2], x)


def test_gather_index_select():
  x = make((5, 6))
  idx = torch.randint(0, 6, (5, 3))
  check_against_eager(lambda t, i: torch.gather(t, 1, i), x, idx)
  check_against_eager(lambda t, i: torch.index_select(t, 0, i), x, torch.tensor([4, 0, 2, 2]))
  check_against_eager(lambda t, i: t[i], x, torch.tensor([-1, 0, 3]))
  check_against_eager(lambda t, m: torch.masked_fill(t, m, -1.0), x, make((5, 6), torch.bool))
  check_against_eager(lambda t: torch.tril(t) + torch.triu(t, 1) * 2, x)


def test_scatter():
  x = make((4, 6))
  idx = torch.tensor([[0, 5, 2], [1, 1, 3], [4, 0, 0], [5, 2, 1]])           # distinct per row along dim 1
  src = make((4, 3))
  check_against_eager(lambda t, i: torch.scatter(t, 1, i, -2.5), x, idx)
  check_against_eager(lambda t, i, s: torch.scatter(t, 1, i, s), x, idx, src)
  check_against_eager(lambda t, i, s: torch.scatter(t, 0, i[:3, :2] % 4, s), x, idx, src)   # smaller index, dim 0
  check_against_eager(lambda t, i, s: torch.scatter_add(t, 1, i, s), x, idx, src)
  check_against_eager(lambda t, i, s: torch.scatter_add(t, 0, i % 4, s), x, idx, src)       # repeated targets add up
  check_against_eager(lambda t, i: torch.scatter(t, 1, i, 7), make((4, 6), torch.int64), idx)
  # one_hot checks its classes with _assert_async: a run-time check of the compiled graph (tests/test_data_checks.py)
  check_against_eager(lambda i: F.one_hot(i, 6), idx)


@pytest.mark.parametrize("case", ["one", "two_adjacent", "split", "broadcast", "negative", "middle", "int32", "scalar_index"])
def test_advanced_indexing(case):
  x = make((4, 5, 6))
  i = {"one": lambda t: t[torch.tensor([3, 0, 1])],
       "two_adjacent": lambda t: t[:, torch.tensor([4, 0]), torch.tensor([1, 5])],
       "split": lambda t: t[torch.tensor([[0, 1], [2, 3]]), :, torch.tensor([5, 0])],    # index dims lead
       "broadcast": lambda t: t[torch.tensor([[0], [3]]), torch.tensor([1, 2, 4])],
       "negative": lambda t: t[..., torch.tensor([-1, -6, 2])],
       "middle": lambda t: t[1:3, torch.tensor([0, 0, 4])],
       "int32": lambda t: t[torch.tensor([2, 1], dtype=torch.int32)],
       "scalar_index": lambda t: t[torch.tensor(2), :, torch.tensor([1, 3])]}[case]
  check_against_eager(i, x)


# ============================================================================ creation

@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool, torch.float16, torch.int32, torch.float64])
def test_full_zeros_ones(dtype):
  x = make((3, 4))
  check_against_eager(lambda t: (torch.full((2, 3), 7, dtype=dtype), torch.zeros(4, dtype=dtype), torch.ones(2, 1, 3, dtype=dtype)), x)
  check_against_eager(lambda t: (torch.zeros_like(t, dtype=dtype), torch.ones_like(t, dtype=dtype),
                                 torch.full_like(t, 3, dtype=dtype), t.new_zeros(2, 2, dtype=dtype)), x)


def test_creation_mixed_with_inputs():
  x = make((3, 4))
  check_against_eager(lambda t: t + torch.ones(4) * 2 - torch.zeros_like(t), x)
  check_against_eager(lambda t: (torch.full((3, 4), -1.5) * t, torch.full((), 2.0) + t, t.new_full((4,), 5)), x)
  check_against_eager(lambda t: torch.ones_like(t, dtype=torch.int64) + t.to(torch.int64), make((3, 4), torch.int32))
  check_against_eager(lambda t: (torch.empty(3, 4).fill_(2.5), torch.zeros(2, 3).fill_(1) + 1), x)
  check_against_eager(lambda t: (torch.full((2,), nan), torch.full((2,), -inf), torch.full((2,), True)), x)
  check_against_eager(lambda t: (torch.ones(0, 3), torch.zeros(2, 0) + 1), x)


@pytest.mark.parametrize("args,kwargs", [((5,), {}), ((2, 9), {}), ((1, 10, 3), {}), ((10, 0, -3), {}),
                                         ((0.0, 1.0, 0.1), {}), ((-1.5, 2.5, 0.5), {}), ((5,), {"dtype": torch.float32}),
                                         ((3, 11, 2), {"dtype": torch.float64}), ((0, 1, 0.25), {"dtype": torch.float16}),
                                         ((2.0, -3.0, -0.7), {}), ((0, 20, 3), {"dtype": torch.int32}), ((7,), {"dtype": torch.uint8})])
def test_arange(args, kwargs):
  check_against_eager(lambda t: (torch.arange(*args, **kwargs), t), make((2,)), rtol=0, atol=0)   # bit-exact


def test_arange_used_in_math():
  x = make((4, 6))
  check_against_eager(lambda t: t * torch.arange(6) + torch.arange(4).unsqueeze(1), x)
  check_against_eager(lambda t: torch.where(torch.arange(6) % 2 == 0, t, -t), x)
  check_against_eager(lambda t: torch.linspace(-1, 1, 6) * t, x)


def test_tensor_scalars_and_scalar_tensor():
  x = make((3, 4))
  check_against_eager(lambda t: t * torch.tensor(2.5) + torch.tensor(1), x)
  check_against_eager(lambda t: t + torch.tensor(3), make((3, 4), torch.int32))              # 0-dim int64 does not widen
  check_against_eager(lambda t: t * torch.tensor(2.0, dtype=torch.float64), x)              # 0-dim float64 does not widen
  check_against_eager(lambda t: (torch.scalar_tensor(3.5), torch.scalar_tensor(2, dtype=torch.int64) * t.sum()), x)
  check_against_eager(lambda t: torch.tensor(True) & (t > 0), x)
  check_against_eager(lambda t: t + torch.tensor([1.0, 2.0, 3.0, 4.0]), x)                   # a constant tensor
  check_against_eager(lambda t: t[torch.tensor([0, 2])] * torch.tensor([[1], [2]], dtype=torch.int32), x)


def test_constant_outputs_are_fresh():
  fn = torch.compile(lambda t: (torch.tensor([1.0, 2.0, 3.0]), torch.zeros(3), t + 1), backend="uop")
  a, b, _ = fn(make((3,)))
  a.add_(10); b.add_(10)
  a2, b2, _ = fn(make((3,)))
  torch.testing.assert_close(a2, torch.tensor([1.0, 2.0, 3.0]))
  torch.testing.assert_close(b2, torch.zeros(3))


def test_eye_tril_mask():
  check_against_eager(lambda t: (torch.eye(4) * t, torch.ones(4, 4).tril().bool() & (t > 0)), make((4, 4)))


# ============================================================================ matmul and convolution

MM_TOL = dict(rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_mm_bmm(dtype):
  t = MM_TOL if dtype in (torch.float32, torch.float64) else dict(rtol=2e-2, atol=2e-2)
  check_against_eager(torch.mm, make((5, 7), dtype), make((7, 3), dtype), **t)
  check_against_eager(torch.bmm, make((2, 5, 7), dtype), make((2, 7, 4), dtype), **t)


def test_mm_layouts_and_sizes():
  a, b = make((6, 8)), make((8, 5))
  check_against_eager(lambda x, y: x @ y, a.t().contiguous().t(), b.t().contiguous().t(), **MM_TOL)   # column-major inputs
  check_against_eager(lambda x, y: x.t() @ y.t(), make((8, 6)), make((5, 8)), **MM_TOL)
  check_against_eager(lambda x, y: x @ y, make((1, 1)), make((1, 1)))
  check_against_eager(lambda x, y: x @ y, make((33, 65)), make((65, 17)), **MM_TOL)
  check_against_eager(lambda x, y: x @ y, make((4, 6), torch.int64), make((6, 3), torch.int64))
  check_against_eager(lambda x, y: (x @ y).relu().sum(0), a, b, **MM_TOL)


@pytest.mark.parametrize("shapes", [((3,), (3,)), ((4, 3), (3,)), ((3,), (3, 5)), ((2, 4, 3), (3, 5)), ((4, 3), (2, 3, 5)),
                                    ((2, 1, 4, 3), (3, 3, 5)), ((5, 1, 2, 3), (4, 3, 2)), ((2, 3, 4), (4,))])
def test_matmul_broadcast(shapes):
  check_against_eager(torch.matmul, make(shapes[0]), make(shapes[1]), **MM_TOL)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("in_shape", [(5, 7), (2, 3, 7), (7,)])
def test_linear(bias, in_shape):
  w, b = make((4, 7)), make((4,)) if bias else None
  check_against_eager(lambda x, w, b: F.linear(x, w, b), make(in_shape), w, b, **MM_TOL)


def test_addmm_baddbmm():
  check_against_eager(lambda b, x, y: torch.addmm(b, x, y, beta=0.5, alpha=2.0), make((3,)), make((2, 4)), make((4, 3)), **MM_TOL)
  check_against_eager(lambda b, x, y: torch.addmm(b, x, y), make((2, 3)), make((2, 4)), make((4, 3)), **MM_TOL)
  check_against_eager(lambda b, x, y: torch.baddbmm(b, x, y, alpha=0.5), make((2, 3, 3)), make((2, 3, 4)), make((2, 4, 3)), **MM_TOL)
  check_against_eager(lambda x, y: torch.einsum("bij,bjk->bik", x, y), make((2, 3, 4)), make((2, 4, 5)), **MM_TOL)
  check_against_eager(lambda x, y: torch.outer(x, y) + torch.dot(x, x), make((4,)), make((5,)), **MM_TOL)


CONV2D_CASES = {
  "basic": dict(x=(2, 3, 8, 8), w=(4, 3, 3, 3), kw={}),
  "stride": dict(x=(1, 3, 9, 8), w=(4, 3, 3, 3), kw=dict(stride=2)),
  "stride_hw": dict(x=(1, 2, 9, 8), w=(3, 2, 2, 3), kw=dict(stride=(2, 1))),
  "padding": dict(x=(2, 3, 7, 7), w=(4, 3, 3, 3), kw=dict(padding=1)),
  "padding_hw": dict(x=(1, 3, 7, 6), w=(2, 3, 3, 5), kw=dict(padding=(0, 2))),
  "padding_same": dict(x=(1, 2, 6, 6), w=(3, 2, 3, 3), kw=dict(padding="same")),
  "dilation": dict(x=(1, 2, 10, 10), w=(3, 2, 3, 3), kw=dict(dilation=2)),
  "dilation_stride_pad": dict(x=(2, 2, 11, 9), w=(3, 2, 3, 2), kw=dict(dilation=(2, 1), stride=(2, 3), padding=(1, 2))),
  "groups": dict(x=(2, 4, 6, 6), w=(6, 2, 3, 3), kw=dict(groups=2)),
  "depthwise": dict(x=(2, 4, 7, 7), w=(4, 1, 3, 3), kw=dict(groups=4, padding=1)),
  "depthwise_multiplier": dict(x=(1, 3, 6, 6), w=(6, 1, 3, 3), kw=dict(groups=3, stride=2)),
  "pointwise": dict(x=(2, 5, 4, 4), w=(3, 5, 1, 1), kw={}),
  "unbatched": dict(x=(3, 6, 6), w=(2, 3, 3, 3), kw=dict(padding=1)),
}


@pytest.mark.parametrize("case", list(CONV2D_CASES))
@pytest.mark.parametrize("bias", [True, False])
def test_conv2d(case, bias):
  c = CONV2D_CASES[case]
  w = make(c["w"])
  b = make((c["w"][0],)) if bias else None
  check_against_eager(lambda x, w, b: F.conv2d(x, w, b, **c["kw"]), make(c["x"]), w, b, **MM_TOL)


def test_conv2d_dtypes_and_layouts():
  x, w = make((1, 3, 6, 6)), make((4, 3, 3, 3))
  check_against_eager(lambda x, w: F.conv2d(x, w), x.to(torch.float64), w.to(torch.float64))
  check_against_eager(lambda x, w: F.conv2d(x, w, padding=1), x.half(), w.half(), rtol=1e-2, atol=1e-2)
  check_against_eager(lambda x, w: F.conv2d(x, w), x.to(memory_format=torch.channels_last), w, **MM_TOL)
  check_against_eager(lambda x, w: F.conv2d(x, w), make((1, 6, 8, 3)).permute(0, 3, 1, 2), w, **MM_TOL)


@pytest.mark.parametrize("kw", [{}, dict(stride=2), dict(padding=2, dilation=2), dict(groups=2, padding=1), dict(stride=3, padding=1)])
def test_conv1d(kw):
  check_against_eager(lambda x, w, b: F.conv1d(x, w, b, **kw), make((2, 4, 13)), make((6, 4 // kw.get("groups", 1), 3)),
                      make((6,)), **MM_TOL)


@pytest.mark.parametrize("kw", [{}, dict(stride=2), dict(stride=2, padding=1, output_padding=1), dict(padding=1),
                                dict(stride=(2, 1), dilation=2), dict(groups=2, stride=2), dict(stride=3, output_padding=(2, 1))])
def test_conv_transpose2d(kw):
  g = kw.get("groups", 1)
  check_against_eager(lambda x, w, b: F.conv_transpose2d(x, w, b, **kw), make((2, 4, 5, 4)), make((4, 6 // g, 3, 3)),
                      make((6,)), **MM_TOL)


def test_conv_transpose1d_and_conv3d():
  check_against_eager(lambda x, w: F.conv_transpose1d(x, w, stride=2, padding=1), make((2, 3, 7)), make((3, 4, 3)), **MM_TOL)
  check_against_eager(lambda x, w: F.conv3d(x, w, padding=1), make((1, 2, 4, 5, 5)), make((3, 2, 3, 3, 3)), **MM_TOL)


GRAD_TOL = dict(rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kw", [{}, dict(stride=2, padding=1), dict(dilation=2), dict(groups=2, padding=1), dict(stride=(2, 3)),
                                dict(groups=4, padding=1)])
def test_conv2d_grad(kw):
  g = kw.get("groups", 1)
  x = make((2, 4, 8, 7)).requires_grad_()
  w = make((4, 4 // g, 3, 3)).requires_grad_()
  b = make((4,)).requires_grad_()
  check_grads_against_eager(lambda x, w, b: F.conv2d(x, w, b, **kw), x, w, b, **GRAD_TOL)


def test_conv2d_grad_no_bias_and_weight_only():
  w = make((3, 2, 3, 3)).requires_grad_()
  check_grads_against_eager(lambda x, w: F.conv2d(x, w, padding=1).relu().sum(), make((2, 2, 5, 5)).requires_grad_(), w, **GRAD_TOL)
  check_grads_against_eager(lambda x, w: F.conv2d(x, w, stride=2), make((1, 2, 7, 7)), w, **GRAD_TOL)
  check_grads_against_eager(lambda x, w: F.conv1d(x, w, padding=1), make((2, 2, 9)).requires_grad_(),
                            make((3, 2, 3)).requires_grad_(), **GRAD_TOL)


@pytest.mark.parametrize("kw", [{}, dict(stride=2, padding=1), dict(stride=3), dict(dilation=2, padding=2),
                                dict(groups=4, padding=1), dict(groups=32, padding=1)])
@pytest.mark.parametrize("length", [9, 700])
def test_conv1d_grad(kw, length):
  """A 1-D convolution runs as a single-row 2-D one: at the channel counts and lengths where the 2-D paths take it
  (over padded rows, phases, im2col) and below them, forward and both gradients match eager."""
  g = kw.get("groups", 1)
  x = make((2, 32, length)).requires_grad_()
  w = make((16 if g < 32 else 32, 32 // g, 3)).requires_grad_()
  b = make((w.shape[0],)).requires_grad_()
  check_grads_against_eager(lambda x, w, b: F.conv1d(x, w, b, **kw), x, w, b, **GRAD_TOL)


@pytest.mark.parametrize("kw", [dict(stride=2, padding=1), dict(stride=2, output_padding=1), dict(groups=2)])
def test_conv_transpose1d_grad(kw):
  x = make((2, 8, 300)).requires_grad_()
  w = make((8, 12 // kw.get("groups", 1), 4)).requires_grad_()
  check_grads_against_eager(lambda x, w: F.conv_transpose1d(x, w, **kw), x, w, **GRAD_TOL)


@pytest.mark.parametrize("kw", [dict(padding=1), dict(stride=2, padding=1), dict(stride=(1, 2, 2), padding=(1, 3, 3)),
                                dict(stride=(2, 1, 2), dilation=(2, 1, 1), padding=(2, 1, 0)), dict(groups=4, padding=1),
                                dict(groups=16, padding=(0, 1, 1))])
def test_conv3d_grad(kw):
  """A 3-D convolution runs as a 2-D one over its depth taps as channels, its input gradient folded back onto the
  depth planes: at channel counts and sizes where the 2-D paths (rows, phases, im2col) take it, with strides,
  dilation and padding in depth, and groups, forward and both gradients match eager."""
  g = kw.get("groups", 1)
  stem = kw.get("padding") == (1, 3, 3)  # a video model's stem: 3 channels, 3x7x7 taps
  x = make((2, 3 if stem else 16, 6, 20, 18)).requires_grad_()
  w = make((16, x.shape[1] // g, *((3, 7, 7) if stem else (3, 3, 3)))).requires_grad_()
  b = make((16,)).requires_grad_()
  # the stem sums 441 products per output (values around 20): float32 rounding reaches 1e-4 there
  check_grads_against_eager(lambda x, w, b: F.conv3d(x, w, b, **kw), x, w, b, **(dict(rtol=1e-4, atol=1e-3) if stem else GRAD_TOL))


@pytest.mark.parametrize("size,kw", [((16, 17), dict(padding=24, dilation=24)), ((16, 16), dict(padding=12, dilation=12)),
                                     ((6, 7), dict(padding=(4, 1), dilation=(5, 1))), ((4, 9), dict(stride=2, padding=5, dilation=5)),
                                     ((9, 10), dict(stride=2, padding=(8, 1), dilation=(7, 1)))])
def test_dilated_conv_grad(size, kw):
  """Dilated convolutions whose edge taps read only padding (DeepLab's ASPP rates over a small map: the kernel is cut
  to the taps that read the input, the input cropped where they stop short of it) and whose padded rows are much
  wider than the output (an im2col GEMM instead): forward and both gradients match eager."""
  x = make((2, 16, *size)).requires_grad_()
  w = make((8, 16, 3, 3)).requires_grad_()
  b = make((8,)).requires_grad_()
  check_grads_against_eager(lambda x, w, b: F.conv2d(x, w, b, **kw), x, w, b, **GRAD_TOL)


@pytest.mark.parametrize("mode,size", [("bilinear", (40, 36)), ("bicubic", (13, 24)), ("bilinear", (5, 3))])
def test_resize_grad(mode, size):
  """A bilinear (bicubic) resize's gradient is index_put with accumulation over a row and a column index, [H, 1] and
  [W], summed one dim at a time (movement._index_add_by_dim): it matches eager, upsampling and downsampling."""
  x = make((2, 6, 9, 8)).requires_grad_()
  check_grads_against_eager(lambda x: F.interpolate(x, size=size, mode=mode, align_corners=False), x, **GRAD_TOL)


def test_index_put_accumulate_outer_product_indices():
  """x[:, rows, cols] += v with rows [R, 1] and cols [C] (negative and repeated entries among them) sums each
  entry once per time it is named, as eager does; a third index over another axis, [1, 1, D], too."""
  x = make((3, 7, 6, 5))
  rows = torch.tensor([[0], [6], [-1], [2], [2]])
  cols = torch.tensor([5, 0, 0, -3])
  v = make((3, 5, 4, 5))
  check_against_eager(lambda x, v: torch.ops.aten.index_put(x, [None, rows, cols], v, True), x, v, rtol=1e-5, atol=1e-5)
  deep = torch.tensor([[[4, -5, 4]]])
  v3 = make((5, 4, 3))
  check_against_eager(lambda x, v: torch.index_put(x, (torch.tensor([1, 1, 2, 0, -1]).reshape(5, 1, 1),
                                                      cols.reshape(1, 4, 1), deep), v, accumulate=True), x[0], v3,
                      rtol=1e-5, atol=1e-5)


def test_grouped_wide_kernel_conv1d_grad():
  """wav2vec2's positional convolution (a grouped 1-D one whose kernel is longer than the sequence, padded by half of
  it): an im2col GEMM per group over the taps that read the input; forward and both gradients match eager."""
  x = make((2, 64, 20)).requires_grad_()
  w = make((64, 16, 32)).requires_grad_()
  b = make((64,)).requires_grad_()
  check_grads_against_eager(lambda x, w, b: F.conv1d(x, w, b, padding=16, groups=4), x, w, b, **GRAD_TOL)


@pytest.mark.parametrize("dim", [0, 2, -1])
def test_weight_norm_grad(dim):
  """torch.nn.utils.weight_norm's op (w = g * v / |v|, the norm over every dim but `dim`, as in wav2vec2's positional
  convolution): its backward is lowered, no fallback; the gradients of v and g match eager."""
  v = make((12, 8, 5)).requires_grad_()
  g = make((12, 1, 1) if dim == 0 else (1, 1, 5)).requires_grad_()
  x = make((2, 8, 20))
  check_grads_against_eager(lambda v, g, x: F.conv1d(x, torch._weight_norm(v, g, dim), padding=2), v, g, x, **GRAD_TOL)


@pytest.mark.parametrize("fn,x_shape,w_shape,stride", [
  (F.conv_transpose1d, (2, 16, 9), (16, 8, 4), 4),
  (F.conv_transpose2d, (2, 16, 5, 7), (16, 8, 2, 3), (2, 3)),          # a UNet's 2x2 upsampling, a rectangular one
  (F.conv_transpose3d, (1, 16, 3, 4, 5), (16, 8, 2, 2, 2), 2)])
def test_patch_conv_transpose_grad(fn, x_shape, w_shape, stride):
  """A transposed convolution whose kernel equals its stride (no padding) is one GEMM with its blocks put in place
  (linalg._patch_conv_transpose): forward, with a bias, and both gradients match eager."""
  x, w, b = make(x_shape).requires_grad_(), make(w_shape).requires_grad_(), make((w_shape[1],)).requires_grad_()
  check_grads_against_eager(lambda x, w, b: fn(x, w, b, stride=stride), x, w, b, **GRAD_TOL)


@pytest.mark.parametrize("fn,w_shape,kw", [
  (F.conv_transpose2d, (16, 8, 4, 4), dict(stride=2, padding=1)),                        # a DCGAN generator's upsampling
  (F.conv_transpose2d, (16, 4, 3, 3), dict(stride=(2, 3), padding=(1, 0), output_padding=(1, 2), groups=2)),
  (F.conv_transpose3d, (16, 8, 3, 3, 3), dict(stride=(2, 1, 1), padding=1)),
  (F.conv_transpose3d, (16, 8, 3, 1, 1), dict(stride=(3, 1, 1), padding=(1, 0, 0), output_padding=(2, 0, 0)))])
def test_strided_conv_transpose_by_phases_grad(fn, w_shape, kw):
  """A strided transposed convolution is the input gradient of the convolution it transposes, computed phase by phase
  (3-D: over the depth taps, folded back): forward and both gradients match eager."""
  x = make((2, 16, *((3,) if fn is F.conv_transpose3d else ()), 6, 7)).requires_grad_()
  w = make(w_shape).requires_grad_()
  check_grads_against_eager(lambda x, w: fn(x, w, **kw), x, w, **GRAD_TOL)


@pytest.mark.parametrize("kw", [dict(stride=2, padding=1), dict(stride=(1, 2, 2), output_padding=(0, 1, 1))])
def test_conv_transpose3d_grad(kw):
  x = make((1, 16, 4, 9, 9)).requires_grad_()
  w = make((16, 8, 3, 3, 3)).requires_grad_()
  check_grads_against_eager(lambda x, w: F.conv_transpose3d(x, w, **kw), x, w, **GRAD_TOL)


@pytest.mark.parametrize("in_shape", [(5, 7), (2, 3, 7)])
@pytest.mark.parametrize("bias", [True, False])
def test_linear_grad(in_shape, bias):
  x, w = make(in_shape).requires_grad_(), make((4, 7)).requires_grad_()
  b = make((4,)).requires_grad_() if bias else None
  check_grads_against_eager(lambda x, w, b: F.linear(x, w, b), x, w, b, **GRAD_TOL)
  check_grads_against_eager(lambda x, y: (x @ y).tanh(), make((2, 3, 5)).requires_grad_(), make((5, 4)).requires_grad_(), **GRAD_TOL)


# ============================================================================ neural-network ops

@pytest.mark.parametrize("fn", [F.softmax, F.log_softmax])
@pytest.mark.parametrize("dim", [-1, 0, 1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_softmax(fn, dim, dtype):
  x = make((4, 6, 5), dtype, -5, 5)
  t = tol(dtype) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
  check_against_eager(lambda v: fn(v, dim), x, **t)


def test_softmax_special_and_dtype_arg():
  x = torch.tensor([[1.0, 2.0, 3.0], [-inf, 0.0, 1.0], [1000.0, 1000.0, -1000.0], [-inf, -inf, 0.0]])
  check_against_eager(lambda v: (F.softmax(v, -1), F.log_softmax(v, -1)), x)
  check_against_eager(lambda v: F.softmax(v, 1, dtype=torch.float64), make((3, 4)))
  check_against_eager(lambda v: F.softmax(v.t(), 0), make((3, 4)))


def test_softmax_grad():
  check_grads_against_eager(lambda v: F.softmax(v, -1), make((3, 5)).requires_grad_())
  check_grads_against_eager(lambda v: F.log_softmax(v, 0), make((3, 5)).requires_grad_())


def test_embedding():
  w = make((10, 4))
  idx = torch.tensor([[1, 2, 9], [0, 0, 5]])
  check_against_eager(F.embedding, idx, w)
  check_against_eager(lambda i, w: F.embedding(i, w, padding_idx=0) * 2, idx, w)
  check_against_eager(F.embedding, torch.tensor(3), w)
  check_against_eager(F.embedding, torch.tensor([4, 4, 1], dtype=torch.int32), w)


def test_embedding_grad():
  w = make((10, 4)).requires_grad_()
  idx = torch.tensor([[1, 2, 9], [0, 1, 1]])
  check_grads_against_eager(lambda w: F.embedding(idx, w), w)
  check_grads_against_eager(lambda w: F.embedding(idx, w, padding_idx=1), w)


@pytest.mark.parametrize("shape,normalized", [((4, 8), (8,)), ((2, 3, 8), (8,)), ((2, 3, 4, 5), (4, 5))])
@pytest.mark.parametrize("affine", [True, False])
def test_layer_norm(shape, normalized, affine):
  w, b = (make(normalized), make(normalized)) if affine else (None, None)
  check_against_eager(lambda x, w, b: F.layer_norm(x, normalized, w, b, eps=1e-5), make(shape) * 3 + 1, w, b, rtol=1e-4, atol=1e-4)


def test_layer_norm_half_and_grad():
  check_against_eager(lambda x: F.layer_norm(x, (16,)), make((3, 16), torch.float16), rtol=1e-2, atol=1e-2)
  check_against_eager(lambda x: F.layer_norm(x, (16,)), make((3, 16), torch.bfloat16), rtol=2e-2, atol=2e-2)
  x, w, b = make((3, 8)).requires_grad_(), make((8,)).requires_grad_(), make((8,)).requires_grad_()
  check_grads_against_eager(lambda x, w, b: F.layer_norm(x, (8,), w, b), x, w, b, rtol=1e-4, atol=1e-4)
  check_against_eager(lambda x, w: F.rms_norm(x, (8,), w, eps=1e-6), make((3, 8)), make((8,)), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shape", [(4, 3), (2, 3, 5), (2, 3, 4, 4)])
@pytest.mark.parametrize("affine", [True, False])
def test_batch_norm_eval(shape, affine):
  c = shape[1]
  mean, var = make((c,)), make((c,), low=0.5, high=2.0)
  w, b = (make((c,)), make((c,))) if affine else (None, None)
  check_against_eager(lambda x, m, v, w, b: F.batch_norm(x, m, v, w, b, training=False, eps=1e-3), make(shape), mean, var, w, b,
                      rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shape", [(8, 3), (2, 3, 4, 4)])
def test_batch_norm_train_functional(shape):
  c = shape[1]
  def fn(x, rm, rv, w, b):
    rm, rv = rm.clone(), rv.clone()
    out = F.batch_norm(x, rm, rv, w, b, training=True, momentum=0.2, eps=1e-5)
    return out, rm, rv          # the updated running statistics are outputs too
  check_against_eager(fn, make(shape) * 2 + 1, make((c,)), make((c,), low=0.5, high=2), make((c,)), make((c,)), rtol=1e-4, atol=1e-4)
  check_against_eager(lambda x: F.batch_norm(x, None, None, training=True), make(shape), rtol=1e-4, atol=1e-4)


def test_batch_norm_train_updates_running_stats_in_place():
  def fn(x, rm, rv): return F.batch_norm(x, rm, rv, training=True, momentum=0.3)
  x, rm, rv = make((4, 3, 2, 2)), make((3,)), make((3,), low=0.5, high=2)
  rm_ref, rv_ref = rm.clone(), rv.clone()
  expected = fn(x, rm_ref, rv_ref)
  actual = torch.compile(fn, backend="uop")(x, rm, rv)
  torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-4)
  torch.testing.assert_close(rm, rm_ref)
  torch.testing.assert_close(rv, rv_ref)
  assert torch_uop.metrics()["fallback_nodes_total"] == 0


def test_batch_norm_module_train_and_grad():
  bn = torch.nn.BatchNorm2d(3)
  x = make((2, 3, 4, 4)).requires_grad_()
  check_grads_against_eager(lambda x: F.batch_norm(x, None, None, bn.weight, bn.bias, training=True), x, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64])
def test_gelu(approximate, dtype):
  x = make((5, 7), dtype, -5, 5)
  check_against_eager(lambda t: F.gelu(t, approximate=approximate), x, **tol(dtype))


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_grad_and_special(approximate):
  check_grads_against_eager(lambda t: F.gelu(t, approximate=approximate), make((4, 5)).requires_grad_())
  # eager's vectorized erf makes gelu(+inf) NaN (its scalar path gives inf): leave +inf out
  check_against_eager(lambda t: F.gelu(t, approximate=approximate), special_values()[special_values() != inf])


MAXPOOL_CASES = {
  "k2": dict(kernel_size=2),
  "k3s1": dict(kernel_size=3, stride=1),
  "k3s2p1": dict(kernel_size=3, stride=2, padding=1),
  "k2_ceil": dict(kernel_size=2, ceil_mode=True),
  "k3s2_ceil_pad": dict(kernel_size=3, stride=2, padding=1, ceil_mode=True),
  "dilation": dict(kernel_size=2, stride=1, dilation=2),
  "dilation_pad_ceil": dict(kernel_size=3, stride=2, padding=1, dilation=2, ceil_mode=True),
  "rect": dict(kernel_size=(2, 3), stride=(1, 2), padding=(1, 1)),
}


@pytest.mark.parametrize("case", list(MAXPOOL_CASES))
def test_max_pool2d(case):
  kw = MAXPOOL_CASES[case]
  x = make((2, 3, 9, 8))
  check_against_eager(lambda t: F.max_pool2d(t, **kw), x)
  check_against_eager(lambda t: F.max_pool2d(t, return_indices=True, **kw), make((3, 7, 10), torch.int64, 0, 5).float())


def test_max_pool2d_special_and_grad():
  x = make((1, 2, 6, 6))
  x[0, 0, 1, 1] = nan
  x[0, 1, :2, :2] = -inf
  check_against_eager(lambda t: F.max_pool2d(t, 2, return_indices=True), x)
  check_against_eager(lambda t: F.max_pool2d(t, 3, 2, 1), make((1, 2, 7, 7), torch.float16))
  check_grads_against_eager(lambda t: F.max_pool2d(t, 3, 2, 1, ceil_mode=True), make((2, 2, 8, 7)).requires_grad_())
  check_grads_against_eager(lambda t: F.max_pool2d(t, 2), make((1, 2, 4, 4), torch.int64, 0, 3).float().requires_grad_())  # ties


@pytest.mark.parametrize("out", [1, 2, (3, 2), (4, 4), (5, 3), (None, 2)])
def test_adaptive_avg_pool2d(out):
  check_against_eager(lambda t: F.adaptive_avg_pool2d(t, out), make((2, 3, 8, 6)), rtol=1e-5, atol=1e-5)
  check_against_eager(lambda t: F.adaptive_avg_pool2d(t, out), make((3, 7, 9)), rtol=1e-5, atol=1e-5)


def test_avg_pool_and_adaptive_grad():
  check_against_eager(lambda t: F.avg_pool2d(t, 3, 2, 1), make((1, 2, 7, 7)), rtol=1e-5, atol=1e-5)
  check_against_eager(lambda t: F.avg_pool2d(t, 2, ceil_mode=True, count_include_pad=False), make((1, 2, 7, 7)), rtol=1e-5, atol=1e-5)
  check_against_eager(lambda t: F.avg_pool2d(t, (3, 2), (2, 3), (1, 1), ceil_mode=True), make((2, 9, 8)), rtol=1e-5, atol=1e-5)
  check_against_eager(lambda t: F.avg_pool2d(t, 3, 1, 1, divisor_override=4), make((1, 2, 5, 5)), rtol=1e-5, atol=1e-5)
  for kw in (dict(kernel_size=3, stride=2, padding=1), dict(kernel_size=2, ceil_mode=True, count_include_pad=False),
             dict(kernel_size=(3, 2), stride=(1, 2), padding=(1, 0), ceil_mode=True)):
    check_grads_against_eager(lambda t: F.avg_pool2d(t, **kw), make((2, 2, 7, 6)).requires_grad_())
  check_grads_against_eager(lambda t: F.adaptive_avg_pool2d(t, 1), make((2, 3, 4, 4)).requires_grad_())
  check_grads_against_eager(lambda t: F.adaptive_avg_pool2d(t, 3), make((1, 2, 7, 5)).requires_grad_())
  check_grads_against_eager(lambda t: F.adaptive_avg_pool2d(t, (4, 2)), make((3, 6, 7)).requires_grad_())


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", [(2, 3, 5, 8), (1, 2, 7, 4), (4, 6, 16)])
def test_sdpa(causal, shape):
  q, k, v = make(shape), make(shape), make(shape)
  check_against_eager(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal), q, k, v, rtol=1e-4, atol=1e-4)


def test_sdpa_mask_scale_cross_and_grad():
  q, k, v = make((2, 2, 4, 8)), make((2, 2, 6, 8)), make((2, 2, 6, 8))
  mask = make((4, 6), torch.bool)
  mask[:, 0] = True
  check_against_eager(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, scale=0.3), q, k, v, rtol=1e-4, atol=1e-4)
  check_against_eager(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m), q, k, v, mask, rtol=1e-4, atol=1e-4)
  check_against_eager(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m), q, k, v, make((4, 6)), rtol=1e-4, atol=1e-4)
  for causal in (False, True):
    qg, kg, vg = (make((1, 2, 5, 4)).requires_grad_() for _ in range(3))
    check_grads_against_eager(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal), qg, kg, vg,
                              rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kw", [{}, dict(reduction="sum"), dict(reduction="none"), dict(ignore_index=2), dict(label_smoothing=0.1),
                                dict(weight=True)])
def test_cross_entropy(kw):
  kw = dict(kw)
  if kw.pop("weight", False): kw["weight"] = make((5,), low=0.5, high=2)
  logits, target = make((6, 5)), torch.tensor([0, 2, 4, 1, 2, 3])
  check_against_eager(lambda x, t: F.cross_entropy(x, t, **kw), logits, target, rtol=1e-5, atol=1e-5)
  check_grads_against_eager(lambda x: F.cross_entropy(x, target, **kw), logits.clone().requires_grad_())


def test_cross_entropy_nd_and_probs():
  logits, target = make((2, 5, 3, 4)), torch.randint(0, 5, (2, 3, 4))
  check_against_eager(F.cross_entropy, logits, target, rtol=1e-5, atol=1e-5)
  check_grads_against_eager(lambda x: F.cross_entropy(x, target), logits.clone().requires_grad_())
  probs = F.softmax(make((4, 5)), -1)
  check_grads_against_eager(lambda x: F.cross_entropy(x, probs), make((4, 5)).requires_grad_())
  check_grads_against_eager(lambda x: F.nll_loss(F.log_softmax(x, 1), torch.tensor([1, 0, 3, 4])), make((4, 5)).requires_grad_())


def test_other_losses_and_activations():
  x, y = make((4, 5)), make((4, 5))
  check_against_eager(lambda a, b: (F.mse_loss(a, b), F.l1_loss(a, b), F.smooth_l1_loss(a, b), F.huber_loss(a, b)), x, y)
  check_against_eager(lambda a, b: F.binary_cross_entropy_with_logits(a, (b > 0).float()), x, y)
  check_grads_against_eager(lambda a: F.mse_loss(a, y) + F.silu(a).mean(), x.clone().requires_grad_())
  check_against_eager(lambda a: (F.softplus(a), F.mish(a), F.logsigmoid(a), F.hardsigmoid(a), F.selu(a), F.celu(a)), x)


@pytest.mark.parametrize("case", ["rows", "rows_scalar_value", "accumulate_repeats", "two_indices", "split_indices", "mask", "mask_accumulate"])
def test_index_put(case):
  x = make((5, 4, 3))
  fns = {
    "rows": lambda t, v: t.index_put((torch.tensor([0, 3, -1]),), v[:3]),
    "rows_scalar_value": lambda t, v: t.index_put((torch.tensor([1, 2]),), torch.tensor(9.0)),
    "accumulate_repeats": lambda t, v: t.index_put((torch.tensor([1, 1, 4, 1]),), v[:4], accumulate=True),
    "two_indices": lambda t, v: t.index_put((torch.tensor([0, 2]), torch.tensor([3, 1])), v[0, :2]),
    "split_indices": lambda t, v: torch.ops.aten.index_put(t, [torch.tensor([4, 0]), None, torch.tensor([2, 0])], v[:2, :, 0], True),
    "mask": lambda t, v: t.masked_fill(t > 0, 0.5) + t.index_put((t < -1,), torch.tensor(-9.0)),
    "mask_accumulate": lambda t, v: t.index_put((t[:, :, 0] > 0,), torch.tensor(1.5), accumulate=True),
  }
  check_against_eager(fns[case], x, make((5, 4, 3)))


def test_indexing_assignment_and_grad():
  def setitem(t, v):
    t = t.clone()
    t[torch.tensor([2, 0])] = v
    t[t > 2] = 0.0
    return t
  check_against_eager(setitem, make((4, 3)), make((2, 3)))
  idx = torch.tensor([3, 0, 3, 1])
  check_grads_against_eager(lambda t: t[idx] * 2, make((5, 3)).requires_grad_())
  check_grads_against_eager(lambda t: t[:, idx].sum(1), make((2, 5)).requires_grad_())
  check_grads_against_eager(lambda t: torch.gather(t, 1, idx.repeat(3, 1)), make((3, 5)).requires_grad_())


@pytest.mark.parametrize("kw", [dict(stride=2), dict(stride=2, padding=1, output_padding=1), dict(groups=2, dilation=2),
                                dict(stride=(3, 2), padding=(1, 0), output_padding=(2, 1))])
def test_conv_transpose2d_grad(kw):
  g = kw.get("groups", 1)
  x, w, b = make((2, 4, 4, 3)).requires_grad_(), make((4, 6 // g, 3, 3)).requires_grad_(), make((6,)).requires_grad_()
  check_grads_against_eager(lambda x, w, b: F.conv_transpose2d(x, w, b, **kw), x, w, b, **GRAD_TOL)


# ============================================================================ gradients across the families

def _r(*shape): return make(shape).requires_grad_()


GRAD_CASES = {
  "elementwise": (lambda x: x.sigmoid() * x.tanh() + x.exp() * 0.1 + x.abs() + x.clamp(-0.5, 0.5) + torch.where(x > 0, x * 2, x * 3), (3, 4)),
  "pow_log_trig": (lambda x: (x.abs() + 0.1).sqrt() + x ** 3 + (x.abs() + 1) ** 0.7 + (x.abs() + 1).log() + x.sin() + torch.erf(x), (3, 4)),
  "reductions": (lambda x: x.sum(1) + x.mean(1) + x.amax(1) + x.var(1) + x.std(1, correction=0) + x.max(1)[0] + x.prod(1), (3, 4)),
  "logsumexp_norm_cumsum": (lambda x: torch.logsumexp(x, 1) + x.norm(dim=1) + x.cumsum(1).sum(1), (3, 4)),
  "slicing": (lambda x: x[::2, 1::3] * 2 + x[1::2, -2:] + x[-1, 2:4], (6, 7)),
  "cat_pad_flip": (lambda x: F.pad(torch.cat([x, x[:, :2] * 3], 1), (1, 2, 0, 1), value=0.5).flip(0), (3, 4)),
  "expand_permute_reshape": (lambda x: (x.expand(2, 3, 4).permute(2, 0, 1) * torch.arange(3.0)).sum(0) + x.t().reshape(2, 6)[:, :3], (3, 4)),
  "split_unbind_stack": (lambda x: torch.stack([t.sum(0) * i for i, t in enumerate(x.split(2, 1))]).sum(0) + x.unbind(0)[1][:2], (3, 6)),
  "index_roll": (lambda x: x[torch.tensor([2, 0, 2])].exp() + torch.roll(x, 1, 1), (3, 4)),
  "max_ties": (lambda x: x.round().amax(1) + x.round().max(0)[0].sum(), (3, 4)),
  "layer_norm_gelu": (lambda x: F.gelu(F.layer_norm(x, (4,))), (3, 4)),
  "unfold_masked_fill": (lambda x: x.unfold(1, 3, 2).sum(-1) + x.masked_fill(x > 0.5, 0.0)[:, :4].sum(1, keepdim=True), (3, 9)),
}


@pytest.mark.parametrize("case", list(GRAD_CASES))
def test_grads(case):
  fn, shape = GRAD_CASES[case]
  check_grads_against_eager(fn, _r(*shape), rtol=1e-4, atol=1e-4)
