"""Orthogonal factorizations and spectral linear algebra (torch_uop/lowering/orthogonal.py) against eager.

QR and its reflector ops must match LAPACK's signs exactly; singular values, eigenvalues and the
sign-invariant ops built on them (pinv, matrix_rank, cond, nuclear norm) run natively; singular and
eigen vectors, whose signs LAPACK picks, must fall back rather than differ.
"""
from __future__ import annotations
import pytest
import torch
import torch_uop
from helpers import check_against_eager


def rand(*shape, dtype=torch.float64, seed=0):
  g = torch.Generator().manual_seed(seed)
  return torch.randn(*shape, generator=g, dtype=dtype)


# ---------------------------------------------------------------- QR family

@pytest.mark.parametrize("dtype,shape", [(torch.float32, (5, 3)), (torch.float64, (3, 5)), (torch.float32, (2, 4, 4))])
def test_geqrf_and_qr(dtype, shape):
  a = rand(*shape, dtype=dtype)
  check_against_eager(lambda x: (torch.geqrf(x), *[torch.linalg.qr(x, mode=m) for m in ("reduced", "complete", "r")]), a)


def test_qr_zero_column_keeps_lapack_convention():
  # a column that is already zero below the diagonal gives tau = 0 and keeps its (negative) diagonal entry
  a = torch.tensor([[-2.0, 1.0, 3.0], [0.0, 4.0, 1.0], [0.0, -1.0, 2.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
  check_against_eager(lambda x: torch.geqrf(x), a)
  check_against_eager(lambda x: torch.linalg.qr(x), a)
  check_against_eager(lambda x: torch.linalg.qr(x), torch.zeros(3, 2, dtype=torch.float64))


@pytest.mark.parametrize("left", [True, False])
@pytest.mark.parametrize("transpose", [True, False])
def test_ormqr(left, transpose):
  packed, tau = torch.geqrf(rand(2, 5, 3, seed=1))
  c = rand(2, 5, 4, seed=2) if left else rand(2, 4, 5, seed=2)
  check_against_eager(lambda v, t, x: torch.ormqr(v, t, x, left=left, transpose=transpose), packed, tau, c)


def test_householder_product():
  packed, tau = torch.geqrf(rand(5, 4, seed=3))
  check_against_eager(torch.linalg.householder_product, packed, tau)
  check_against_eager(torch.linalg.householder_product, packed, tau[:2])


# ---------------------------------------------------------------- Jacobi: values and sign-invariant ops

def test_svdvals_and_friends():
  # svd whose vectors nobody reads is native too
  a = rand(2, 4, 3, dtype=torch.float32, seed=4)
  check_against_eager(lambda x: (torch.linalg.svd(x.mT)[1], torch.linalg.matrix_rank(x), torch.norm(x, p="nuc", dim=(-2, -1))), a)


def test_svdvals_hard_spectra():
  # graded and clustered singular values, float64 at the size limit n = 8
  q1, _ = torch.linalg.qr(rand(8, 8, seed=5))
  q2, _ = torch.linalg.qr(rand(8, 8, seed=6))
  graded = q1 @ torch.diag(torch.logspace(0, -10, 8, dtype=torch.float64)) @ q2
  clustered = q1 @ torch.diag(torch.tensor([3, 3, 3 + 1e-9, 1, 1, 1e-3, 1e-3, 0], dtype=torch.float64)) @ q2
  check_against_eager(torch.linalg.svdvals, torch.stack([graded, clustered]), rtol=1e-12, atol=1e-13)


def test_eigvalsh():
  a = rand(2, 3, 3, seed=7)
  check_against_eager(lambda x: (torch.linalg.eigh(x, UPLO="L")[0], torch.linalg.eigvalsh(x, UPLO="U"),
                                 torch.linalg.matrix_rank(x[:, :2, :2] @ x[:, :2, :2].mT, hermitian=True)), a)


def test_pinv():
  a = rand(2, 3, seed=8)                                            # wide: pinv of the transpose, transposed
  singular = a.mT @ a                                               # 3 x 3, rank 2
  check_against_eager(lambda x, s: (torch.linalg.pinv(x), torch.linalg.pinv(x, atol=0.5), torch.pinverse(s),
                                    torch.linalg.pinv(x[:, :2], hermitian=True)), a, singular)


def test_cond_and_empty():
  check_against_eager(torch.linalg.cond, rand(3, 3, dtype=torch.float32, seed=9))
  check_against_eager(lambda x, y: (torch.linalg.svdvals(x), torch.linalg.eigvalsh(y)), torch.zeros(2, 0, 3), torch.zeros(0, 2, 2))


# ---------------------------------------------------------------- vectors fall back, never differ

def test_singular_and_eigen_vectors_fall_back():
  a = rand(4, 3, seed=10)
  m = check_against_eager(lambda x: torch.linalg.svd(x, full_matrices=False), a, expect_native=False)
  assert m["fallback_nodes_total"] == 1
  m = check_against_eager(torch.linalg.eigh, a[:3], expect_native=False)
  assert m["fallback_nodes_total"] == 1


def test_too_large_falls_back():
  a = rand(9, 9, dtype=torch.float32)
  m = check_against_eager(torch.linalg.svdvals, a, expect_native=False)
  assert m["fallback_nodes_total"] == 1


def test_extreme_magnitudes_and_nan():
  # a power-of-two prescale keeps the sums of squares finite, as LAPACK's scaled norms do
  a = rand(4, 2, dtype=torch.float32, seed=11)
  for scale in (1e25, 1e-25):
    check_against_eager(lambda x: (torch.geqrf(x), torch.linalg.svdvals(x)), a * scale)
  b = rand(4, 3, seed=12)
  b[1, 1] = float("nan")                     # NaN spreads to the entries LAPACK's trailing updates reach
  check_against_eager(lambda x: (torch.geqrf(x), torch.linalg.qr(x)), b)
