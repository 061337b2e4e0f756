"""Random ops under torch.compile(backend="uop"): torch's RNG semantics, not eager's bit stream.

Each op must run natively and give eager's shape and dtype; its samples must follow the distribution
(mean/variance within a few standard errors on ~1e5 samples, bounds, keep rates and scaling); a
compiled call must be reproduced by torch.manual_seed and differ from the next call. Ops whose values
are not random given their random inputs (fractional max pooling with explicit samples, rrelu in eval
mode) are compared with eager exactly. Dropout in training: gradients are zero exactly where the output
was dropped.
"""
from __future__ import annotations
import math
import pytest
import torch
import torch.nn.functional as F
import torch_uop
from helpers import check_against_eager, fresh_compiled, assert_ran_natively

N = 100_000
FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]


def run_checked(fn, *args):
  """Compiled fn(*args) twice under one seed and once more: reproducible, fresh on the next call, and
  eager's shapes and dtypes. Returns the first result."""
  c = fresh_compiled(fn)
  torch.manual_seed(123)
  first = c(*args)
  torch.manual_seed(123)
  again = c(*args)
  later = c(*args)
  assert_ran_natively()
  torch.manual_seed(123)
  expected = fn(*args)
  outs = first if isinstance(first, tuple) else (first,)
  for a, b, c_, e in zip(outs, again if isinstance(again, tuple) else (again,), later if isinstance(later, tuple) else (later,),
                         expected if isinstance(expected, tuple) else (expected,)):
    assert a.shape == e.shape and a.dtype == e.dtype, f"{a.shape} {a.dtype} vs eager {e.shape} {e.dtype}"
    torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)
    if a.numel() > 100 and a.dtype != torch.bool: assert not torch.equal(a, c_), "two calls gave the same numbers"
  return first


def check_moments(x: torch.Tensor, mean: float, var: float, sigmas: float = 5.0):
  x = x.double().flatten()
  n = x.numel()
  assert abs(float(x.mean()) - mean) < sigmas * math.sqrt(var / n) + 1e-9, f"mean {float(x.mean())} vs {mean}"
  # the standard error of a sample variance is about var * sqrt(2 / n) for light tails; allow a margin
  assert abs(float(x.var()) - var) < sigmas * 2 * var * math.sqrt(2 / n), f"var {float(x.var())} vs {var}"


# ============================================================================ creation

@pytest.mark.parametrize("dtype", FLOATS)
def test_rand(dtype):
  x = run_checked(lambda: torch.rand(200, 500, dtype=dtype))
  assert float(x.min()) >= 0 and float(x.max()) < 1
  check_moments(x, 0.5, 1 / 12)


@pytest.mark.parametrize("dtype", FLOATS)
def test_randn(dtype):
  x = run_checked(lambda: torch.randn(N, dtype=dtype))
  check_moments(x, 0.0, 1.0)
  tail = float((x.double().abs() > 3).double().mean())   # 0.0027 for a normal
  assert 0.002 < tail < 0.0035


def test_like_variants():
  base = torch.zeros(100, 1000, dtype=torch.float64)
  u, z, k = run_checked(lambda t: (torch.rand_like(t), torch.randn_like(t, dtype=torch.float32), torch.randint_like(t, 3, 8)), base)
  check_moments(u, 0.5, 1 / 12)
  check_moments(z, 0.0, 1.0)
  assert k.dtype == torch.float64 and float(k.min()) == 3 and float(k.max()) == 7
  # three nodes of one graph read different streams
  assert abs(float(torch.corrcoef(torch.stack([u.flatten(), z.double().flatten()]))[0, 1])) < 0.02


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.float32, torch.uint8])
def test_randint(dtype):
  x = run_checked(lambda: torch.randint(-3, 7, (N,), dtype=dtype) if dtype != torch.uint8 else torch.randint(0, 10, (N,), dtype=dtype))
  lo, hi = (-3, 7) if dtype != torch.uint8 else (0, 10)
  assert int(x.min()) == lo and int(x.max()) == hi - 1
  counts = torch.bincount((x.long() - lo).flatten(), minlength=hi - lo).double()
  assert float((counts / N - 0.1).abs().max()) < 0.006
  y = run_checked(lambda: torch.randint(2 ** 40, (1000,)))
  assert int(y.min()) >= 0 and int(y.max()) < 2 ** 40 and int(y.max()) > 2 ** 39


def test_empty_and_scalar():
  x, y, z = run_checked(lambda: (torch.rand(0, 3), torch.randn(()), torch.randint(5, (4, 0))))
  assert x.shape == (0, 3) and y.shape == () and z.shape == (4, 0)


# ============================================================================ distributions

@pytest.mark.parametrize("dtype", FLOATS)
def test_uniform_normal_inplace(dtype):
  base = torch.empty(N, dtype=dtype)
  u, z = run_checked(lambda t: (t.clone().uniform_(-2, 3), t.clone().normal_(1.5, 2.0)), base)
  assert float(u.min()) >= -2 and float(u.max()) <= 3
  check_moments(u, 0.5, 25 / 12)
  check_moments(z, 1.5, 4.0)


def test_normal_overloads():
  mean = torch.linspace(-2, 2, N)
  std = torch.full((N,), 0.5)
  tt, tf, ft, ff = run_checked(lambda m, s: (torch.normal(m, s), torch.normal(m, 2.0), torch.normal(3.0, s), torch.normal(-1.0, 3.0, (N,))), mean, std)
  check_moments(tt - mean, 0.0, 0.25)
  check_moments(tf - mean, 0.0, 4.0)
  check_moments(ft, 3.0, 0.25)
  check_moments(ff, -1.0, 9.0)
  b = run_checked(lambda m: torch.normal(m, torch.ones(3, 1, 1)), torch.zeros(1, 200, 200))   # broadcast mean and std
  assert b.shape == (3, 200, 200)
  check_moments(b, 0.0, 1.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_exponential_log_normal_cauchy(dtype):
  base = torch.empty(N, dtype=dtype)
  e, ln, c = run_checked(lambda t: (t.clone().exponential_(2.0), t.clone().log_normal_(0.5, 0.25), t.clone().cauchy_(1.0, 2.0)), base)
  assert float(e.min()) > 0 and bool(torch.isfinite(e).all())
  check_moments(e, 0.5, 0.25, sigmas=6)
  assert float(ln.min()) > 0
  check_moments(ln.double().log(), 0.5, 0.0625)
  q = torch.quantile(c.double(), torch.tensor([0.25, 0.5, 0.75], dtype=torch.float64))  # median 1, quartiles 1 -+ 2
  torch.testing.assert_close(q, torch.tensor([-1.0, 1.0, 3.0], dtype=torch.float64), atol=0.1, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_geometric(dtype):
  g = run_checked(lambda t: t.clone().geometric_(0.25), torch.empty(N, dtype=dtype))
  assert float(g.min()) == 1 and bool((g == g.round()).all())
  check_moments(g, 4.0, 0.75 / 0.0625, sigmas=6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_bernoulli(dtype):
  p = torch.linspace(0, 1, N).to(dtype)   # (linspace in float16 itself gives only 0s and 1s)
  a, b, c = run_checked(lambda p: (torch.bernoulli(p), torch.empty_like(p).bernoulli_(0.3), torch.bernoulli(p, 0.7)), p)
  assert set(a.unique().tolist()) <= {0.0, 1.0}
  assert float(a[0]) == 0 and float(a[-1]) == 1           # p = 0 and p = 1 are certain
  m = float(p.double().mean())
  check_moments(a, m, m * (1 - m))
  check_moments(b, 0.3, 0.21)
  check_moments(c, 0.7, 0.21)


# ============================================================================ nn

@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_dropout_scaling(dtype):
  x = torch.randn(N, dtype=dtype)
  out = run_checked(lambda x: F.dropout(x, 0.3, training=True), x)
  kept = out != 0
  check_moments(kept.double(), 0.7, 0.21)
  torch.testing.assert_close(out[kept], (x[kept].double() / 0.7).to(dtype))
  torch.testing.assert_close(fresh_compiled(lambda x: F.dropout(x, 0.3, training=False))(x), x)
  assert float(fresh_compiled(lambda x: F.dropout(x, 1.0, training=True))(x).abs().sum()) == 0
  assert_ran_natively()


def test_feature_and_alpha_dropout():
  x = torch.randn(400, 250, 2, 2) + 10
  d2, d3, a, fa = run_checked(lambda x: (F.dropout2d(x, 0.4, True), F.dropout3d(x.unsqueeze(2), 0.4, True),
                                        F.alpha_dropout(x, 0.2, True), F.feature_alpha_dropout(x, 0.2, True)), x)
  channel_kept = d2.flatten(2).ne(0)
  assert bool((channel_kept.all(2) | ~channel_kept.any(2)).all()), "dropout2d drops whole channels"
  check_moments(channel_kept.all(2).double(), 0.6, 0.24)
  torch.testing.assert_close(d2[d2 != 0], (x[d2 != 0] / 0.6))
  assert d3.shape == (400, 250, 1, 2, 2)
  # alpha dropout: a dropped element becomes one value, so about 20% share it
  vals, counts = a.flatten().unique(return_counts=True)
  assert abs(float(counts.max()) / a.numel() - 0.2) < 0.01
  assert bool((fa.flatten(2).eq(fa.flatten(2)[..., :1])).all(2).float().mean() > 0.15)


def test_dropout_training_backward():
  """Forward + backward in training mode: the gradient is zero exactly where the output was dropped,
  and 1/(1-p) times the upstream gradient elsewhere."""
  x = (torch.rand(256, 64) + 0.5).requires_grad_()
  c = fresh_compiled(lambda x: F.dropout(x * 2, 0.25, training=True))
  out = c(x)
  (out * 3).sum().backward()
  assert_ran_natively()
  dropped = out == 0
  assert 0.2 < float(dropped.double().mean()) < 0.3
  assert bool((x.grad[dropped] == 0).all())
  torch.testing.assert_close(x.grad[~dropped], torch.full_like(x.grad[~dropped], 6 / 0.75))
  torch.testing.assert_close(out[~dropped], x.detach()[~dropped] * 2 / 0.75)


def test_dropout_module_grads_native():
  torch.manual_seed(0)
  model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Dropout(0.5), torch.nn.Linear(32, 4)).train()
  x = torch.randn(64, 32, requires_grad=True)
  c = fresh_compiled(model)
  c(x).sum().backward()
  assert_ran_natively()
  assert x.grad is not None and bool(torch.isfinite(x.grad).all())


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_rrelu(dtype):
  x = torch.linspace(-5, 5, N, dtype=dtype)
  out = run_checked(lambda x: F.rrelu(x, 0.1, 0.3, training=True), x)
  neg = x < 0
  torch.testing.assert_close(out[~neg], x[~neg])
  slope = (out[neg].double() / x[neg].double())
  assert float(slope.min()) >= 0.1 - 1e-2 and float(slope.max()) <= 0.3 + 1e-2
  check_moments(slope, 0.2, 0.04 / 12, sigmas=6)
  check_against_eager(lambda x: F.rrelu(x, 0.1, 0.3, training=False), x)


def test_rrelu_nan():
  x = torch.tensor([float("nan"), -1.0, 2.0, 0.0])
  out = fresh_compiled(lambda x: F.rrelu(x, training=True))(x)
  assert_ran_natively()
  assert math.isnan(out[0]) and out[2] == 2 and out[3] == 0 and -1 / 3 - 1e-6 <= float(out[1]) <= -1 / 8 + 1e-6


# ============================================================================ sampling

@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_multinomial_with_replacement(dtype):
  probs = torch.tensor([[1.0, 0.0, 3.0, 6.0], [5.0, 5.0, 0.0, 0.0]], dtype=dtype)
  s = run_checked(lambda p: torch.multinomial(p, 20000, replacement=True), probs)
  assert s.dtype == torch.int64 and s.shape == (2, 20000)
  freq = torch.stack([torch.bincount(r, minlength=4) for r in s]).double() / 20000
  torch.testing.assert_close(freq, (probs.double() / probs.double().sum(1, keepdim=True)), atol=0.015, rtol=0)
  one = run_checked(lambda p: torch.multinomial(p, 5, True), probs[0])
  assert one.shape == (5,)


def test_multinomial_without_replacement():
  probs = torch.tensor([1.0, 2.0, 0.0, 4.0, 8.0, 1.0])
  c = fresh_compiled(lambda p: torch.multinomial(p.expand(4000, 6), 4, replacement=False))
  torch.manual_seed(0)
  s = c(probs)
  assert_ran_natively()
  assert s.shape == (4000, 4)
  assert bool((s != 2).all()), "a zero-probability category was drawn"
  assert bool((s.sort(1).values.diff(dim=1) > 0).all()), "a category drawn twice in one row"
  first = torch.bincount(s[:, 0], minlength=6).double() / 4000
  torch.testing.assert_close(first, probs.double() / 16, atol=0.03, rtol=0)


# ============================================================================ fractional max pooling

@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
def test_fractional_max_pool2d_given_samples(dtype):
  x = torch.randn(2, 3, 11, 9).to(dtype)
  x[0, 1, 3, 4] = float("nan")
  x[1, 2, 0:2, 0:2] = float("-inf")
  samples = torch.rand(2, 3, 2, dtype=dtype)
  for kw in (dict(kernel_size=3, output_size=(4, 5)), dict(kernel_size=(2, 3), output_ratio=(0.5, 0.5)), dict(kernel_size=2, output_size=(10, 1))):
    check_against_eager(lambda x, s: F.fractional_max_pool2d(x, return_indices=True, _random_samples=s, **kw), x, samples)
  check_against_eager(lambda x, s: F.fractional_max_pool2d(x, 2, output_size=3, return_indices=True, _random_samples=s),
                      x[0], samples[:1])
  check_against_eager(lambda x: F.fractional_max_pool2d(x, 2, output_size=3, return_indices=True), x[:0])   # empty batch


@pytest.mark.parametrize("dtype", [torch.float32])
def test_fractional_max_pool3d_given_samples(dtype):
  x = torch.randn(2, 2, 7, 8, 7, dtype=dtype)
  samples = torch.rand(2, 2, 3, dtype=dtype)
  check_against_eager(lambda x, s: F.fractional_max_pool3d(x, (2, 3, 2), output_size=(4, 3, 5), return_indices=True, _random_samples=s), x, samples)


def test_fractional_max_pool_random_windows():
  x = torch.arange(2 * 3 * 12 * 12, dtype=torch.float32).reshape(2, 3, 12, 12)
  out, idx = run_checked(lambda x: F.fractional_max_pool2d(x, 2, output_size=(5, 5), return_indices=True), x)
  # increasing input: each window's max is its bottom-right element, and the values are the input's at idx
  torch.testing.assert_close(out, x.flatten(2).gather(2, idx.flatten(2)).reshape(out.shape))
  assert bool((idx.diff(dim=3) > 0).all() and (idx.diff(dim=2) > 0).all())
