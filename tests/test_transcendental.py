"""core/transcendental.py: float32 math functions as vectorizable arithmetic, over the whole float32 range.

Each function is compiled with torch.compile(backend="uop") and run on every binade (random mantissas, both
signs, subnormals included), the special values and the points where its algorithm switches. The worst error
is measured in float32 ulps at the float64 reference value (ulps of the denormal spacing below 2^-126) and
must stay within the bound core/transcendental.py documents; where the exact value is NaN, +-inf or +-0 the
output must be that, bit for bit as eager gives it. Finally no kernel may keep a call to a scalar math function.
"""
import math
import re
import pytest
import torch
import torch_uop.debug

INF, NAN = math.inf, math.nan
FLT_MAX, FLT_MIN, DENORM_MIN = 3.4028234663852886e38, 2.0 ** -126, 2.0 ** -149
SPECIAL = [0.0, -0.0, INF, -INF, NAN, DENORM_MIN, -DENORM_MIN, FLT_MIN, -FLT_MIN, 2.0 ** -127, FLT_MAX, -FLT_MAX, 1.0, -1.0]


def binades(per: int, lo: int = 0, hi: int = 254, seed: int = 0) -> torch.Tensor:
  """`per` random float32s in each binade with exponent field lo..hi (0: the denormals), both signs."""
  g = torch.Generator().manual_seed(seed)
  exponent = torch.arange(lo, hi + 1, dtype=torch.int32).repeat_interleave(per)
  mantissa = torch.randint(0, 1 << 23, (exponent.numel(),), generator=g, dtype=torch.int32)
  x = ((exponent << 23) | mantissa).view(torch.float32)
  return torch.cat([x, -x])


def around(points, ulps: int = 2) -> torch.Tensor:
  """float32 points and their neighbours up to `ulps` steps away."""
  p = torch.tensor(points, dtype=torch.float32)
  bits = p.view(torch.int32)
  return torch.cat([(bits + k).view(torch.float32) for k in range(-ulps, ulps + 1)])


def ulp_error(y: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
  """|y - ref| in float32 ulps at ref (float64)."""
  _, e = torch.frexp(ref.abs())
  ulp = torch.ldexp(torch.ones_like(ref), (e - 24).clamp(min=-149))
  return (y.double() - ref).abs() / ulp


def compare(fn, ref_fn, *xs, bound: float):
  """Run fn compiled and eager; assert the worst ulp error of the compiled one and its special values."""
  y = torch.compile(fn, backend="uop")(*xs)
  eager = fn(*xs)
  ref = ref_fn(*[x.double() for x in xs])
  in_range = ref.isfinite() & (ref.abs() <= FLT_MAX)
  err, eager_err = ulp_error(y, ref)[in_range], ulp_error(eager, ref)[in_range]
  worst = err.argmax()
  where = [x[in_range][worst].item() for x in xs]
  assert err.max() <= bound, f"{err.max():.3f} ulp at {where} (eager's worst: {eager_err.max():.3f} ulp)"
  # where the exact value is NaN, +-inf or +-0, the output is exactly that, as eager's is
  exact = ref.float()
  special = exact.isnan() | exact.isinf() | (exact == 0)
  for out in (y, eager):
    same = (out.isnan() & exact.isnan()) | ((out == exact) & (out.signbit() == exact.signbit()))
    bad = special & ~same
    assert not bad.any(), f"{[x[bad][:4].tolist() for x in xs]}: {out[bad][:4].tolist()}, exact {exact[bad][:4].tolist()}"
  assert torch.equal(y[special].isnan(), eager[special].isnan())


# function, extra points where it switches algorithm or changes behaviour, documented worst ulp error
UNARY = {
  "exp": (torch.exp, [88.72283935546875, 88.7228, -87.33654, -103.97208, -104.0, -150.0, 0.3465736], 1),
  "exp2": (torch.exp2, [128.0, 127.99999, -126.0, -149.0, -149.5, -150.0, 0.5], 1),
  "expm1": (torch.expm1, [88.72283935546875, 88.7, -17.328679, -17.5, -18.0, 0.3465736, -0.3465736, 1e-8, -1e-30], 1.5),
  "tanh": (torch.tanh, [0.625, -0.625, 9.0, 9.010913, 9.5, 44.4, 89.0, 1e-8, -1e-30], 1.5),
  "sigmoid": (torch.sigmoid, [88.72283935546875, -88.72283935546875, -103.9, -104.0, 17.0, -17.0, 1e-8], 2.5),
  "log": (torch.log, [1.0, 0.70710677, 1.4142135, 2.0 ** -126, 2.0 ** -149, 2.0, 0.5, 10.0], 1),
  "log2": (torch.log2, [1.0, 0.70710677, 1.4142135, 2.0 ** -126, 2.0 ** -149, 2.0, 0.5, 1024.0], 1.5),
  "log10": (torch.log10, [1.0, 0.70710677, 1.4142135, 10.0, 100.0, 1e-30, 2.0 ** -149], 1.5),
  "log1p": (torch.log1p, [-1.0, -0.99999994, -0.5, 1e-8, -1e-8, 2.0 ** -25, 0.41421357, -0.29289323, 1e30], 1),
  "atan": (torch.atan, [1.0, -1.0, 0.41421357, 2.4142137, 1e-30, 1e30, 16777216.0], 1.5),
  "erf": (torch.erf, [1.0, -1.0, 0.9999999, 3.9999, 4.0, 9.0, 1e-30], 2.5),
}


@pytest.mark.parametrize("name", list(UNARY))
def test_unary_whole_range(name):
  fn, points, bound = UNARY[name]
  x = torch.cat([binades(800), around(points + [-p for p in points]), torch.tensor(SPECIAL)])
  compare(fn, fn, x, bound=bound)


@pytest.mark.parametrize("name", ["sin", "cos"])
def test_sin_cos(name):
  """Every binade, both reductions by pi/2 (Cody-Waite below 2^36, 2/pi's bits above) and the seam between them,
  the nearest floats to multiples of pi/2 up to 2^30 * pi/2, and the largest floats."""
  fn = getattr(torch, name)
  multiples = (torch.cat([torch.arange(1, 4097), torch.randint(4097, 2 ** 30, (4000,))]).double() * (math.pi / 2)).tolist()
  seams = [2.0 ** 36, 2.0 ** 44, 2.0 ** 45, 2.0 ** 76, 2.0 ** 77, 16367173 * 2.0 ** 72, 3.4028232635611926e38]
  x = torch.cat([binades(800), around(multiples + [-m for m in multiples], 1), around(seams), torch.tensor(SPECIAL)])
  compare(fn, fn, x, bound=1.5)


def test_pow_whole_range():
  """powf: bases and exponents over every binade and all special pairs (C99: 1^y, x^0, (-1)^inf, negative bases
  to integer and non-integer powers, zeros and infinities of either sign), results near overflow and underflow."""
  specials = torch.tensor(SPECIAL + [0.5, -0.5, 2.0, -2.0, 3.0, -3.0, 2.5, 1e10, -1e10, 16777217.0])
  base, expo = torch.cat([binades(12, seed=1), specials]), torch.cat([binades(12, seed=2), specials])
  b, e = torch.meshgrid(base[::3], expo[::3], indexing="ij")
  near1 = 1 + (torch.rand(20000) - 0.5) * 1e-3
  x = torch.cat([b.flatten(), torch.rand(50000) * 4, near1, torch.full((400,), 2.0), -torch.rand(2000) * 3])
  y = torch.cat([e.flatten(), torch.randn(50000) * 30, torch.randn(20000) * 1e5,
                 torch.linspace(-151, 129, 400), torch.randint(-20, 20, (2000,)).float()])
  compare(torch.pow, torch.pow, x, y, bound=1)
  assert torch.compile(lambda t: t ** 1.5, backend="uop")(torch.tensor([-1.0, 4.0])).tolist()[1] == 8.0


def test_atan2_whole_range():
  values = torch.cat([binades(10, seed=3), torch.tensor(SPECIAL)])
  y, x = torch.meshgrid(values[::2], values[::2], indexing="ij")
  compare(torch.atan2, torch.atan2, y.flatten(), x.flatten(), bound=2)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_both_forms(approximate):
  """GELU decomposes to erf or tanh: both match eager and run as vectorizable arithmetic. (At +-inf the
  decomposition gives inf and NaN, eager's kernel NaN for both; above 2^127 eager's overflows: both are left out.)"""
  fn = lambda t: torch.nn.functional.gelu(t, approximate=approximate)
  x = torch.cat([torch.linspace(-12, 12, 100001), binades(50, 0, 252), torch.tensor([0.0, -0.0, NAN])])
  torch.testing.assert_close(torch.compile(fn, backend="uop")(x), fn(x), equal_nan=True)
  _assert_no_scalar_math(fn, x)


_SCALAR_MATH = re.compile(r"call [^@]*@(?!llvm\.(?:fabs|copysign|floor|ceil|trunc|roundeven|maximum|minimum|sqrt)\.)([\w.]+)")


def _assert_no_scalar_math(fn, *xs):
  sources = torch_uop.debug.compile_graph(fn, *xs).sources
  assert sources
  calls = {m for src in sources for m in _SCALAR_MATH.findall(src)}
  assert not calls, f"calls that stop the loop vectorizer: {calls}"


@pytest.mark.parametrize("fn", [
  torch.exp, torch.exp2, torch.expm1, torch.tanh, torch.sigmoid, torch.log, torch.log2, torch.log10, torch.log1p,
  torch.sin, torch.cos, torch.atan, torch.erf, lambda t: torch.atan2(t, t * 2), lambda t: torch.pow(t.abs(), t),
  lambda t: t ** 1.5, lambda t: torch.tanh(t) * torch.sigmoid(t) + torch.sqrt(torch.abs(t)) * 0.5,
  lambda t: torch.nn.functional.silu(t), lambda t: torch.nn.functional.softplus(t), lambda t: torch.rsqrt(t),
], ids=lambda f: getattr(f, "__name__", "lambda"))
def test_no_scalar_math_calls(fn):
  _assert_no_scalar_math(fn, torch.randn(1024))
