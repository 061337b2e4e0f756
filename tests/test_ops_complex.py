"""Complex tensors (held as view_as_real in the IR) and the FFT primitives, against eager."""
import pytest
import torch
import torch_uop
from tests.helpers import check_against_eager, check_grads_against_eager

fft = torch.fft


def _native(fn, *inputs, **kw):
  return check_against_eager(fn, *inputs, **kw)


# ------------------------------------------------------------------ FFT primitives

@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_real_input_transforms(dtype):
  """_fft_r2c (onesided and not), with padding, trimming, norms, lengths that are not powers of two."""
  x = torch.randn(3, 6, 7, dtype=dtype)
  _native(lambda x: (fft.rfft(x), fft.rfft(x, n=10, dim=1, norm="ortho"), fft.fft(x, n=5, norm="forward"),
                     fft.ihfft(x, dim=0), fft.rfftn(x, s=(4, 9), dim=(0, 2), norm="backward")), x)


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_complex_input_transforms(dtype):
  """_fft_c2c forward and backward over one and several dims, and _fft_c2r (irfft, hfft)."""
  x = torch.randn(4, 5, 6, dtype=dtype)
  _native(lambda x: (fft.fft(x), fft.ifft(x, dim=1, norm="ortho"), fft.fftn(x, dim=(0, 2)), fft.ifft2(x, s=(3, 8)),
                     fft.irfft(x, n=9), fft.irfftn(x, norm="forward"), fft.hfft(x, dim=0), fft.hfft2(x, s=(4, 7))), x)


def test_real_to_complex_to_real_graphs():
  """float32 inputs through complex intermediates back to real outputs: hfft, irfft2, ihfftn."""
  x = torch.randn(5, 8)
  _native(lambda x: (fft.hfft(x), fft.irfft2(x, s=(5, 11)), fft.ihfftn(x, norm="ortho")), x)


def test_round_trips():
  x = torch.randn(2, 9, 10, dtype=torch.float64)
  z = torch.randn(2, 9, 10, dtype=torch.complex128)
  fn = lambda x, z: (fft.irfft(fft.rfft(x), n=10), fft.ifftn(fft.fftn(z)), fft.irfftn(fft.rfftn(x, dim=(1, 2)), s=x.shape[1:]))
  torch._dynamo.reset()
  a, b, c = torch.compile(fn, backend="uop")(x, z)
  torch.testing.assert_close(a, x)
  torch.testing.assert_close(b, z)
  torch.testing.assert_close(c, x)


def test_fft_size_one_and_empty():
  _native(lambda x: fft.rfft(x), torch.randn(3, 1))  # a single point: the identity
  # eager's CPU FFT rejects an empty tensor; compiled, the node falls back and raises the same way
  torch._dynamo.reset()
  with pytest.raises(RuntimeError):
    torch.compile(lambda x: fft.fft(x, dim=1), backend="uop")(torch.randn(0, 5))


def test_fft_nan_inf_match_eager_structure():
  """A zero twiddle is a term an FFT never computes: NaN/Inf does not leak into those output parts."""
  x = torch.arange(1.0, 9.0).repeat(3, 1)
  x[0, 0], x[1, 4], x[2, 3] = float("nan"), float("inf"), float("nan")
  expected = fft.rfft(x)
  torch._dynamo.reset()
  torch_uop.reset_metrics()
  actual = torch.compile(fft.rfft, backend="uop")(x)
  assert torch_uop.metrics()["fallback_nodes_total"] == 0
  # compare parts: assert_close measures a complex difference, which is NaN next to an infinite part
  torch.testing.assert_close(torch.view_as_real(actual), torch.view_as_real(expected), equal_nan=True)


def test_stft():
  x = torch.randn(2, 64)
  _native(lambda x: torch.stft(x, 16, hop_length=4, window=torch.hann_window(16), return_complex=True), x)


def test_half_fft_falls_back_like_eager():
  """Eager has no half-precision FFT on the CPU: the node falls back, and raises as eager does."""
  torch._dynamo.reset()
  with pytest.raises(Exception):
    torch.compile(fft.rfft, backend="uop")(torch.randn(8).half())


def test_gradient_through_rfft_abs():
  x = torch.randn(3, 10, requires_grad=True)
  check_grads_against_eager(lambda x: fft.rfft(x, norm="ortho").abs().sum(), x)


# ------------------------------------------------------------------ complex tensors

def test_complex_outputs_are_complex_with_eager_strides():
  x = torch.randn(5, 6, 7)
  fn = lambda x: (fft.rfft(x, n=10, dim=1), fft.fft(x, dim=0).permute(2, 0, 1), torch.view_as_complex(x[..., :2].contiguous()))
  expected = fn(x)
  torch._dynamo.reset()
  actual = torch.compile(fn, backend="uop")(x)
  for a, e in zip(actual, expected):
    assert a.dtype == e.dtype and a.stride() == e.stride(), (a.dtype, a.stride(), e.dtype, e.stride())
    torch.testing.assert_close(a, e)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.bool])
def test_conversions_to_complex(dtype):
  x = torch.randn(4, 3).mul(3).to(dtype)
  _native(lambda x: (x.cfloat(), x.cdouble(), x.to(torch.complex32)), x)


def test_conversions_from_complex_and_views():
  z = torch.randn(4, 3, dtype=torch.complex128)
  z[0, 0] = complex(0, 0)
  z[1, 1] = complex(0, -2)
  _native(lambda z: (z.cfloat(), z.real.float(), z.imag * 1, torch.view_as_real(z) + 1, z.to(torch.bool),
                     torch.view_as_complex(torch.view_as_real(z) * 2)), z)


def test_complex_and_polar():
  r, t = torch.rand(5, 1) + 0.5, torch.randn(1, 4)
  _native(lambda r, t: (torch.complex(r, t), torch.polar(r, t.expand(5, 4)), torch.complex(r.double(), r.double())), r, t)


def test_conj_views_are_values():
  z = torch.randn(3, 4, dtype=torch.complex64)
  _native(lambda z: (z.conj(), z.conj() * 2, torch.conj_physical(z), z.conj().resolve_conj().clone(), z.conj().imag), z)
  # a lazily conjugated input is read by its values
  torch._dynamo.reset()
  out = torch.compile(lambda z: z * 1, backend="uop")(z.conj())
  torch.testing.assert_close(out, z.conj().resolve_conj())


def test_complex_arithmetic():
  a, b = torch.randn(3, 4, dtype=torch.complex64), torch.randn(4, dtype=torch.complex64)
  r = torch.randn(3, 1)
  a[0, 0] = 0
  _native(lambda a, b, r: (a + b, a - b * 2, a * b, a / b, a * r, r / a, a + r, -a, a.abs(), a.angle(), 2 - a,
                           a * (1 - 2j), r * 1j, 1j / a, a.reciprocal(), a.sgn(), a.sum(1), a.sum()), a, b, r)


def test_complex32_runs_where_eager_does():
  """complex32 (chalf): computed in float32 and rounded; ops whose eager CPU kernel lacks it raise as in eager."""
  h = torch.randn(3, 4, dtype=torch.complex64).to(torch.complex32)
  _native(lambda h: (h.abs(), h * h + 1, -h.conj(), torch.cat([h, h]), h.real), h, rtol=1e-3, atol=1e-3)
  for fn in (lambda h: h / h, lambda h: h.sum(), lambda h: torch.fft.fft(h)):
    torch._dynamo.reset()
    with pytest.raises(Exception):
      torch.compile(fn, backend="uop")(h)


def test_complex_division_edge_cases():
  a = torch.tensor([1 + 1j, 1e30 + 1e30j, 1 + 0j, 0j, 2 - 3j], dtype=torch.complex64)
  b = torch.tensor([0j, 1e30 + 1e-30j, 1e-30j, 0j, float("inf") + 0j], dtype=torch.complex64)
  expected = a / b
  torch._dynamo.reset()
  actual = torch.compile(lambda a, b: a / b, backend="uop")(a, b)
  torch.testing.assert_close(torch.view_as_real(actual), torch.view_as_real(expected), equal_nan=True)


def test_complex_movement_ops():
  z = torch.randn(4, 5, dtype=torch.complex64)
  w = torch.randn(2, 5, dtype=torch.complex64)
  _native(lambda z, w: (torch.constant_pad_nd(z, (1, 2, 0, 1), 3.0), z[1:3, ::2], torch.cat([z, w]), z.t().clone(),
                        z.permute(1, 0).reshape(-1), z.unsqueeze(0).expand(2, 4, 5), z.flip(0), z[[2, 0]],
                        torch.where(z.real > 0, z, w[0]), z.unbind(0)[1]), z, w)


def test_complex_creation_and_empty():
  z = torch.randn(0, 3, dtype=torch.complex128)
  _native(lambda z: (z * 2, torch.full((2, 2), 1 - 1j), torch.ones(3, dtype=torch.complex64) + z.sum()), z)


def test_unlowered_complex_op_falls_back_per_node():
  """A complex op with no lowering (exp) runs as a fallback node on complex tensors; the rest stays native."""
  z = torch.randn(3, 4, dtype=torch.complex64)
  m = check_against_eager(lambda z: (torch.exp(z * 2) + 1).conj(), z, expect_native=False)
  assert m["graphs_fallen_back"] == 0
  assert set(m["nodes_fallen_back"]) == {"exp.default"}
