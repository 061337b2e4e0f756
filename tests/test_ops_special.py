"""Special functions lowered in torch_uop/lowering/special.py, checked against eager.

Orthogonal polynomials with a tensor degree (their recurrences run on `LT.loop`, a kernel loop with
a per-element trip count), Bessel/Airy functions, the incomplete gamma functions and gcd/lcm: values
on wide grids (large |x|, zero, negatives, NaN/Inf, huge or non-finite degrees), several dtypes,
broadcasting, fusion into reductions, empty tensors; every case must run natively.
"""
from __future__ import annotations
import math
import pytest
import torch
import torch_uop
from helpers import check_against_eager, check_grads_against_eager

nan, inf = float("nan"), float("inf")

POLYNOMIALS = [f"chebyshev_polynomial_{k}" for k in "tuvw"] + [f"shifted_chebyshev_polynomial_{k}" for k in "tuvw"] + \
              ["hermite_polynomial_h", "hermite_polynomial_he", "laguerre_polynomial_l", "legendre_polynomial_p"]
BESSEL = ["bessel_j0", "bessel_j1", "bessel_y0", "bessel_y1", "modified_bessel_k0", "modified_bessel_k1",
          "scaled_modified_bessel_k0", "scaled_modified_bessel_k1", "airy_ai"]

# x at the polynomials' special points (+-1, 0, 1/2 for the shifted ones), inside and outside [-1, 1], huge, infinite
POLY_X = [-1e10, -3.0, -1.5, -1.0, -0.999, -0.7, -0.5, -1e-30, 0.0, 1e-30, 0.25, 0.5, 0.75, 0.999, 1.0, 1.0001, 2.0, 10.0, inf, -inf]
# degrees: negative, each branch threshold, Hermite's limits (128 / 512), large, fractional, non-finite, past int64
POLY_N = [-5.0, -1.0, 0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 20.0, 50.0, 127.0, 128.0, 129.0, 300.0,
          513.0, 1000.0, 2.5, nan, inf, -inf, 1e30]


def _grid(xs, ns, dtype):
  x = torch.tensor(xs, dtype=dtype)[:, None].expand(len(xs), len(ns)).contiguous()
  n = torch.tensor(ns, dtype=dtype)[None, :].expand(len(xs), len(ns)).contiguous()
  return x, n


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_orthogonal_polynomials(dtype):
  x, n = _grid(POLY_X, POLY_N, dtype)
  fn = lambda x, n: [getattr(torch.special, name)(x, n) for name in POLYNOMIALS]
  check_against_eager(fn, x, n)


def test_polynomials_promote_and_take_scalars():
  xi = torch.arange(-3, 4, dtype=torch.int32)
  ni = torch.tensor([0, 1, 2, 3, 9, 12, -1], dtype=torch.int64)
  check_against_eager(lambda x, n: torch.special.hermite_polynomial_he(x, n) + torch.special.chebyshev_polynomial_u(x, n), xi, ni)
  xb = torch.tensor([True, False, True])
  check_against_eager(lambda x, n: torch.special.legendre_polynomial_p(x, n), xb, torch.tensor([3.0, 4.0, 5.0]))
  xf = torch.linspace(-2, 2, 17, dtype=torch.float64)
  check_against_eager(lambda x: torch.special.chebyshev_polynomial_t(x, 11) * torch.special.laguerre_polynomial_l(0.5, x), xf)


def test_polynomial_loops_fuse_broadcast_and_reduce():
  """Per-element trip counts inside a reduction kernel (upcast / several loops per kernel), under broadcasting,
  with a long recurrence (n = 5000) and a result read through a broadcast view."""
  x = torch.linspace(-0.99, 0.99, 37, dtype=torch.float64)
  n = torch.tensor([0.0, 1.0, 3.0, 17.0, 64.0, 5000.0, 2.0, 9.0], dtype=torch.float64)
  check_against_eager(lambda x, n: torch.special.legendre_polynomial_p(x[:, None], n[None, :]).sum(-1), x, n)
  check_against_eager(lambda x, n: torch.special.laguerre_polynomial_l(x[:, None], n).exp().sum(0), x, n)
  def broadcast_back(x, n):
    p = torch.special.hermite_polynomial_h(x, n)
    return p[:, None] * p[None, :] + torch.special.legendre_polynomial_p(x, n).sum()
  check_against_eager(broadcast_back, x[:8].float(), n.float())
  m = check_against_eager(lambda x, n: torch.special.chebyshev_polynomial_w(x, n) * 2 + 1, x[:8], n)
  assert m["kernels_compiled"] <= 1


def test_polynomial_empty_and_batched():
  check_against_eager(lambda x, n: torch.special.chebyshev_polynomial_t(x, n), torch.empty(0, 3), torch.empty(0, 3))
  x = torch.rand(2, 3, 4) * 4 - 2
  n = torch.randint(0, 12, (3, 1)).float()
  check_against_eager(lambda x, n: torch.special.shifted_chebyshev_polynomial_v(x, n), x, n)


def _bessel_inputs(dtype):
  grid = torch.cat([torch.linspace(-30, 30, 601, dtype=torch.float64), torch.logspace(-30, 30, 121, dtype=torch.float64),
                    -torch.logspace(-30, 30, 121, dtype=torch.float64),
                    torch.tensor([0.0, -0.0, 1e-5, 0.99999e-5, 2.0, 2.09, -2.09, 5.0, 8.32, 103.892, 104.0, 1e38, -1e38,
                                  inf, -inf, nan, 1e300, -1e300], dtype=torch.float64)])
  return grid.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_bessel_and_airy(dtype):
  x = _bessel_inputs(dtype)
  check_against_eager(lambda x: [getattr(torch.special, name)(x) for name in BESSEL], x)


def test_bessel_integer_inputs_promote():
  check_against_eager(lambda x: [getattr(torch.special, name)(x) for name in BESSEL], torch.arange(-6, 7, dtype=torch.int32))


IGAMMA_VALUES = [0.0, 1e-30, 1e-5, 0.1, 0.5, 0.9, 1.0, 1.05, 1.1, 1.5, 2.0, 3.0, 5.0, 10.0, 19.0, 20.5, 25.0, 30.0, 50.0,
                 100.0, 150.0, 199.0, 201.0, 250.0, 1000.0, 1e4, 1e6, 1e10, inf, nan, -1.0, -inf]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_incomplete_gamma(dtype):
  """Every method region: boundaries, Temme's expansion (a ~ x, 20 < a < 200 and a > 200), the series,
  the series for Q, the continued fraction; plus random (a, x) in [0, 30)."""
  a, x = _grid(IGAMMA_VALUES, IGAMMA_VALUES, dtype)
  g = torch.Generator().manual_seed(0)
  a = torch.cat([a.flatten(), (torch.rand(2000, generator=g) * 30).to(dtype)])
  x = torch.cat([x.flatten(), (torch.rand(2000, generator=g) * 30).to(dtype)])
  tol = dict(rtol=1.6e-2, atol=1e-2) if dtype == torch.bfloat16 else {}
  check_against_eager(lambda a, x: [torch.igamma(a, x), torch.igammac(a, x)], a, x, **tol)


def test_igamma_gradient():
  a = torch.tensor([0.5, 2.0, 7.5, 30.0], dtype=torch.float64)
  x = torch.tensor([0.3, 1.7, 9.0, 29.0], dtype=torch.float64, requires_grad=True)
  check_grads_against_eager(lambda x: torch.igamma(a, x) + torch.igammac(a, x * 2), x)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64])
def test_gcd_lcm(dtype):
  info = torch.iinfo(dtype)
  vals = [info.min, info.min + 1, -1000, -12, -7, -1, 0, 1, 2, 6, 9, 12, 15, 35, 1000, 832040, 514229,
          7540113804746346429, 4660046610375530309, info.max, info.max - 1]   # consecutive Fibonacci numbers: Euclid's worst case
  # eager itself traps (SIGFPE) on INT_MIN / -1 inside lcm(INT_MIN, INT_MAX) for 32/64-bit: leave INT_MIN out there
  vals = sorted({v for v in vals if info.min <= v <= info.max and not (dtype.itemsize >= 4 and v == info.min)})
  a, b = _grid(vals, vals, dtype)
  check_against_eager(lambda a, b: [torch.gcd(a, b), torch.lcm(a, b)], a, b)


def test_gcd_int_min_does_not_trap():
  """gcd/lcm never divide INT_MIN by -1 (eager's lcm(INT_MIN, INT_MAX) traps; here a / -1 is -a)."""
  lo, hi = torch.iinfo(torch.int32).min, torch.iinfo(torch.int32).max
  a = torch.tensor([lo, lo, lo, 0, -1], dtype=torch.int32)
  b = torch.tensor([hi, 0, lo, lo, lo], dtype=torch.int32)
  torch._dynamo.reset()
  torch_uop.reset_metrics()
  g, l = torch.compile(lambda a, b: (torch.gcd(a, b), torch.lcm(a, b)), backend="uop")(a, b)
  assert torch_uop.metrics()["fallback_nodes_total"] == 0
  assert g.tolist() == [-1, lo, lo, lo, 1] == torch.gcd(a, b).tolist()
  assert l[1:].tolist() == torch.lcm(a[1:], b[1:]).tolist() and l[0].item() == lo
