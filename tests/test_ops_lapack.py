"""LU, Cholesky, triangular solves and the linear algebra on them (torch_uop/lowering/lapack.py) against eager:
values, pivots exactly, info codes, the errors eager raises on singular / non-PD input or bad pivots, and
gradients. Every case must run natively (no ATen fallback)."""
import re
import warnings
import pytest
import torch
import torch_uop
from torch_uop.lowering.lapack import MAX_N
from tests.helpers import check_against_eager, check_grads_against_eager, fresh_compiled, assert_ran_natively

warnings.filterwarnings("ignore", message=".*deprecated.*")


def _rand(*shape, dtype=torch.float32, seed=0):
  g = torch.Generator().manual_seed(seed)
  return torch.randn(*shape, generator=g, dtype=dtype)


def _spd(n, batch=(), dtype=torch.float32):
  a = _rand(*batch, n, n, dtype=dtype, seed=1)
  return a @ a.mT + n * torch.eye(n, dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(5, 5), (3, 5), (2, 5, 3)])
def test_lu_factor_ex(shape, dtype):
  check_against_eager(torch.linalg.lu_factor_ex, _rand(*shape, dtype=dtype))


def test_lu_factor_singular_ties_nan_and_empty():
  singular = torch.tensor([[1., 2, 3], [2, 4, 6], [7, 1, 2]])
  ties = torch.tensor([[1., -2, 0], [-1, 2, 1], [1, 0, 1]])   # equal |values|: the first one is the pivot
  nan_later = torch.tensor([[1., 2, 3], [float("nan"), 5, 1], [7, 1, 2]])
  nan_first = torch.tensor([[float("nan"), 2, 3], [4, 5, 1], [7, 1, 2]])
  for a in (singular, ties, nan_later, nan_first, torch.zeros(3, 3), torch.eye(3)[[2, 0, 1]]):
    check_against_eager(torch.linalg.lu_factor_ex, a)
  check_against_eager(torch.linalg.lu_factor_ex, torch.zeros(0, 0))
  check_against_eager(torch.linalg.lu_factor_ex, torch.zeros(0, 3, 3))


def test_lu_unpack_and_linalg_lu():
  a = _rand(2, 4, 5)
  lu, piv = torch.linalg.lu_factor(a)
  check_against_eager(torch.lu_unpack, lu, piv)
  check_against_eager(torch.linalg.lu, _rand(5, 4, dtype=torch.float64))


@pytest.mark.parametrize("left,adjoint", [(True, False), (True, True), (False, False), (False, True)])
def test_lu_solve(left, adjoint):
  a = _rand(2, 4, 4, dtype=torch.float64)
  lu, piv = torch.linalg.lu_factor(a)
  b = _rand(2, 4, 3, dtype=torch.float64, seed=2) if left else _rand(2, 3, 4, dtype=torch.float64, seed=2)
  check_against_eager(lambda lu, piv, b: torch.linalg.lu_solve(lu, piv, b, left=left, adjoint=adjoint), lu, piv, b)


def test_bad_pivots_raise_like_eager():
  lu = _rand(3, 3)
  for fn in (lambda lu, p: torch.lu_unpack(lu, p), lambda lu, p: torch.linalg.lu_solve(lu, p, torch.ones(3, 1))):
    f = fresh_compiled(fn)
    f(lu, torch.tensor([1, 2, 3], dtype=torch.int32))
    assert_ran_natively()
    for bad in ([0, 2, 3], [4, 2, 3]):
      p = torch.tensor(bad, dtype=torch.int32)
      with pytest.raises(RuntimeError) as eager_err: fn(lu, p)
      with pytest.raises(RuntimeError, match=re.escape(str(eager_err.value)[:40])): f(lu, p)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_solve_inv(dtype):
  a = _rand(5, 5, dtype=dtype)
  check_against_eager(torch.linalg.solve, a, _rand(5, 3, dtype=dtype, seed=3))
  check_against_eager(torch.linalg.solve, a, _rand(5, dtype=dtype, seed=3))                  # vector rhs
  check_against_eager(lambda a, b: torch.linalg.solve(a, b, left=False), a, _rand(2, 5, dtype=dtype, seed=3))
  check_against_eager(torch.linalg.solve, _rand(2, 1, 4, 4, dtype=dtype), _rand(3, 4, 2, dtype=dtype, seed=3))  # batch broadcast
  check_against_eager(torch.linalg.inv, _rand(2, 4, 4, dtype=dtype))
  check_against_eager(torch.linalg.inv_ex, torch.zeros(2, 3, 3, dtype=dtype))               # singular: info, inf/nan


def _raises_like_eager(fn, f, x):
  with pytest.raises(RuntimeError) as eager_err: fn(x)
  with pytest.raises(eager_err.type, match=re.escape(str(eager_err.value)[:40])): f(x)


def test_singular_raises_like_eager():
  singular = torch.tensor([[1., 2], [2, 4]])
  for fn in (torch.linalg.inv, lambda a: torch.linalg.solve(a, torch.ones(2)), torch.linalg.lu_factor):
    f = fresh_compiled(fn)
    f(torch.eye(2) * 3)
    assert_ran_natively()
    _raises_like_eager(fn, f, singular)
    _raises_like_eager(fn, f, torch.stack([torch.eye(2), singular]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_det_slogdet(dtype):
  a = _rand(3, 4, 4, dtype=dtype)
  singular = torch.tensor([[1., 2, 3], [0, 0, 0], [7, 1, 2]], dtype=dtype)   # a zero pivot whatever the rounding
  for x in (a, singular, torch.zeros(0, 0, dtype=dtype)):
    check_against_eager(torch.linalg.det, x)
    check_against_eager(torch.linalg.slogdet, x)
  check_against_eager(torch.logdet, a @ a.mT)


@pytest.mark.parametrize("upper", [False, True])
def test_cholesky(upper):
  s = _spd(5, (2,), torch.float64)
  check_against_eager(lambda s: torch.linalg.cholesky(s, upper=upper), s)
  check_against_eager(lambda s: torch.cholesky(s, upper=upper), s)
  not_pd = s.clone()
  not_pd[1, 2, 2] = -5
  not_pd[0, 1, 1] = float("nan")
  check_against_eager(lambda s: torch.linalg.cholesky_ex(s, upper=upper), not_pd)   # info, and L as LAPACK leaves it
  for fn in (torch.linalg.cholesky, torch.cholesky):
    f = fresh_compiled(fn)
    f(s)
    assert_ran_natively()
    _raises_like_eager(fn, f, not_pd)


@pytest.mark.parametrize("upper", [False, True])
def test_cholesky_solve_inverse(upper):
  f = torch.linalg.cholesky(_spd(4, (2,)), upper=upper)
  check_against_eager(lambda b, f: torch.cholesky_solve(b, f, upper=upper), _rand(2, 4, 3, seed=4), f)
  check_against_eager(lambda f: torch.cholesky_inverse(f, upper=upper), f[0])


@pytest.mark.parametrize("upper,left,unit", [(True, True, False), (False, True, True), (True, False, True), (False, False, False)])
def test_solve_triangular(upper, left, unit):
  a = _rand(2, 4, 4, dtype=torch.float64) + 3 * torch.eye(4, dtype=torch.float64)
  b = _rand(2, 4, 3, dtype=torch.float64, seed=5) if left else _rand(2, 3, 4, dtype=torch.float64, seed=5)
  check_against_eager(lambda a, b: torch.linalg.solve_triangular(a, b, upper=upper, left=left, unitriangular=unit), a, b)


def test_triangular_solve_transpose():
  a = _rand(4, 4) + 3 * torch.eye(4)
  check_against_eager(lambda b, a: torch.triangular_solve(b, a, upper=False, transpose=True), _rand(2, 4, 2, seed=6), a)


def test_gradients():
  a = (_rand(4, 4, dtype=torch.float64) + 4 * torch.eye(4, dtype=torch.float64)).requires_grad_()
  b = _rand(4, 2, dtype=torch.float64, seed=7).requires_grad_()
  check_grads_against_eager(lambda a, b: torch.linalg.solve(a, b), a, b)
  check_grads_against_eager(lambda a: torch.linalg.inv(a) * torch.linalg.det(a), a)
  check_grads_against_eager(torch.linalg.cholesky, _spd(4, dtype=torch.float64).requires_grad_())


def test_size_limit_falls_back():
  a = _rand(MAX_N + 1, MAX_N + 1)
  m = check_against_eager(torch.linalg.det, a, expect_native=False)
  assert m["fallback_nodes_total"] == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_ldl_factor_solve(dtype):
  a = _rand(3, 6, 6, dtype=dtype)
  sym = a + a.mT
  pairs = torch.tensor([[0.1, 2, 3, 0.5], [2, 0.2, 1, 4], [3, 1, 0.1, 2], [0.5, 4, 2, 0.3]], dtype=dtype)  # 2x2 pivots
  for x in (sym, pairs, torch.zeros(3, 3, dtype=dtype), torch.zeros(0, 2, 2, dtype=dtype)):
    check_against_eager(torch.linalg.ldl_factor_ex, x)
  for x in (sym, pairs):
    ld, piv = torch.linalg.ldl_factor(x)
    check_against_eager(torch.linalg.ldl_solve, ld, piv, _rand(*x.shape[:-1], 2, dtype=dtype, seed=8))
  ld, piv = torch.linalg.ldl_factor(pairs)
  f = fresh_compiled(lambda piv: torch.linalg.ldl_solve(ld, piv, torch.ones(4, 1, dtype=dtype)))
  f(piv)
  assert_ran_natively()
  _raises_like_eager(lambda piv: torch.linalg.ldl_solve(ld, piv, torch.ones(4, 1, dtype=dtype)), f, torch.tensor([1, 2, 5, 4], dtype=torch.int32))
