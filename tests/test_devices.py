"""GPU-style targets: OpenCL (pocl on the CPU in CI) and CUDA (NVRTC to PTX without a GPU; run when one is present).

The op and model tests run on OpenCL too (conftest.py); these cover what is particular to the targets: grouped
reductions (local memory and barriers), symbolic sizes, training, half types, errors, the CUDA source path.
"""
from __future__ import annotations
import os
import pytest
import torch
import torch_uop
import torch_uop.debug
from helpers import check_against_eager, fresh_compiled, check_grads_against_eager
from conftest import opencl_missing, nvrtc_missing, check_cuda_source

needs_opencl = pytest.mark.skipif(opencl_missing() is not None, reason=f"OpenCL unavailable: {opencl_missing()}")
needs_nvrtc = pytest.mark.skipif(nvrtc_missing() is not None, reason=str(nvrtc_missing()))
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine")
OPENCL = {"device": "opencl"}


@needs_opencl
@pytest.mark.parametrize("n", [1 << 20, 1000, 257])
def test_grouped_reductions(n, monkeypatch):
  """Few outputs, long rows: work-groups share each row through local memory (and still match eager). The device
  is taken to run as many work-items at once as a big GPU, so kernels are grouped where they would be there."""
  from torch_uop.runtime.devices import OpenCLTarget
  monkeypatch.setattr(OpenCLTarget, "parallelism", lambda self: 1 << 18)
  x = torch.randn(3, n)
  x[1, n // 3] = float("nan")
  with torch_uop.debug.capture() as graphs:
    check_against_eager(lambda t: (t.sum(-1), t.amax(-1), t.amin(-1), (t > 0).any(-1), t.abs().mean()), x,
                        options=OPENCL, rtol=1e-4, atol=1e-3)
  assert any(k.local_size > 1 for g in graphs for k in g.kernels), "no reduction was grouped"


@needs_opencl
def test_ungrouped_reduction_many_outputs():
  with torch_uop.debug.capture() as graphs:
    check_against_eager(lambda t: t.sum(0), torch.randn(300, 20000), options=OPENCL, rtol=1e-4, atol=1e-4)
  assert all(k.local_size == 0 for g in graphs for k in g.kernels)


@needs_opencl
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_types(dtype):
  a, b = torch.randn(64, 33).to(dtype), torch.randn(33, 17).to(dtype)
  check_against_eager(lambda x, y: ((x @ y).relu() * 3 - 1, x.float().to(dtype), torch.signbit(x * 2)), a, b,
                      options=OPENCL, rtol=2e-2, atol=2e-2)


@needs_opencl
def test_symbolic_sizes_on_opencl():
  fn = lambda x: torch.softmax(x * 2, -1).sum(0)
  compiled = fresh_compiled(fn, OPENCL, dynamic=True)
  for n in (5, 9, 17):
    x = torch.randn(n, 300)
    torch.testing.assert_close(compiled(x), fn(x), rtol=1e-5, atol=1e-5)
  m = torch_uop.metrics()
  assert m["symbolic_graphs"] >= 1 and m["fallback_nodes_total"] == 0


@needs_opencl
def test_training_on_opencl(monkeypatch):
  monkeypatch.setenv("TORCH_UOP_DEVICE", "opencl")
  lin = torch.nn.Linear(12, 5)
  check_grads_against_eager(lambda x: torch.tanh(lin(x)).square().sum(), torch.randn(7, 12, requires_grad=True))


@needs_opencl
def test_opencl_device_that_does_not_exist(monkeypatch):
  from torch_uop.runtime import opencl
  monkeypatch.setenv("TORCH_UOP_OPENCL_DEVICE", "no such platform")
  opencl.opencl_device.cache_clear()
  try:
    with pytest.raises(Exception, match="no OpenCL device on a platform matching 'no such platform'"):
      fresh_compiled(lambda x: x + 1, OPENCL)(torch.ones(3))
  finally:
    opencl.opencl_device.cache_clear()


def test_cuda_ci_has_nvrtc():
  """CI must check CUDA sources; a machine without NVRTC only skips the CUDA checks."""
  if os.environ.get("CI") and nvrtc_missing(): pytest.fail(f"CI without NVRTC: {nvrtc_missing()}")
  if nvrtc_missing(): pytest.skip(str(nvrtc_missing()))
  from torch_uop.runtime.cuda import compile_ptx
  with pytest.raises(RuntimeError, match="NVRTC"):
    compile_ptx('extern "C" __global__ void broken(float* x) { x[0] = undefined_name; }')


@needs_opencl
@needs_nvrtc
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_cuda_source_compiles(dtype):
  """The CUDA renderer's kernels for a graph with grouped reductions, half types and casts compile to PTX."""
  fn = lambda x, i: ((x.float().softmax(-1) * 2).to(x.dtype), x.sum(), (x > 0).all(), x.to(torch.int32) + i, torch.signbit(x - 0.5))
  with torch_uop.debug.capture() as graphs:
    check_against_eager(fn, torch.randn(4, 3000).to(dtype), torch.arange(3000, dtype=torch.int32), options=OPENCL,
                        rtol=2e-2, atol=2e-2)
  check_cuda_source(graphs)


@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_cuda_ops(dtype):
  x, y = torch.randn(64, 300, device="cuda").to(dtype), torch.randn(300, 40, device="cuda").to(dtype)
  tol = dict(rtol=2e-2, atol=2e-2) if dtype != torch.float32 else dict(rtol=1e-4, atol=1e-4)
  m = check_against_eager(lambda a, b: ((a @ b).relu().sum(-1), a.softmax(-1), a.amax(), a.float().mean(0)), x, y, **tol)
  assert m["kernels_launched"] >= 1


@needs_gpu
def test_cuda_training():
  lin = torch.nn.Linear(32, 16).cuda()
  check_grads_against_eager(lambda x: torch.nn.functional.gelu(lin(x)).square().mean(),
                            torch.randn(8, 32, device="cuda", requires_grad=True))


@needs_opencl
def test_beam_search_on_opencl(tmp_path, monkeypatch):
  """BEAM times GPU-style candidates (group sizes, register blocking) on the device itself; the winner matches eager."""
  monkeypatch.setenv("TORCH_UOP_CACHE_DIR", str(tmp_path))
  m = check_against_eager(lambda a, b, x: (a @ b, x.sum(-1)), torch.randn(128, 128), torch.randn(128, 128),
                          torch.randn(16, 4096), options={"device": "opencl", "beam": 2}, rtol=1e-4, atol=1e-3)
  assert m["kernels_searched"] == 2


SPECIAL_CASES = {
  # data-dependent loops (LT.loop: loop-carried state and an early exit)
  "gcd": (lambda a, b: torch.gcd(a, b), lambda: (torch.randint(-50, 50, (64,)), torch.randint(-50, 50, (64,)))),
  "bessel_j0": (lambda x: torch.special.bessel_j0(x), lambda: (torch.randn(64) * 10,)),
  "chebyshev": (lambda x, n: torch.special.chebyshev_polynomial_t(x, n), lambda: (torch.rand(32), torch.randint(0, 9, (32,)))),
  "digamma": (lambda x: torch.digamma(x), lambda: (torch.rand(64) * 5 + 0.1,)),
  # scans, ranks, gathers, scatters
  "cumsum_sort": (lambda x: (x.cumsum(-1), x.sort(-1).values, x.topk(3, -1).indices), lambda: (torch.randn(8, 50),)),
  "index_put": (lambda x, i, v: x.index_put((i,), v, accumulate=True), lambda: (torch.randn(10, 4), torch.tensor([1, 3, 1]), torch.randn(3, 4))),
  # complex values and LAPACK-style kernels
  "fft": (lambda x: torch.fft.rfft(x).abs(), lambda: (torch.randn(4, 32),)),
  "solve": (lambda a, b: torch.linalg.solve(a, b), lambda: (torch.randn(5, 5) + 5 * torch.eye(5), torch.randn(5, 2))),
  "bool_int8": (lambda x: ((x > 0).sum(-1).to(torch.int8) * 3, (x.to(torch.int16) >> 1), x.amax(-1).to(torch.uint8)),
                lambda: (torch.randn(6, 40) * 9,)),
}


@needs_opencl
@pytest.mark.parametrize("case", list(SPECIAL_CASES))
def test_special_kernels_on_opencl_and_as_cuda(case):
  """Loops with early exits, scans, scatters, complex and LAPACK kernels: they match eager on OpenCL, and their
  CUDA rendering compiles to PTX."""
  fn, inputs = SPECIAL_CASES[case]
  with torch_uop.debug.capture() as graphs:
    check_against_eager(fn, *inputs(), options=OPENCL, rtol=1e-4, atol=1e-4)
  assert graphs and any(g.kernels for g in graphs)
  if nvrtc_missing() is None: check_cuda_source(graphs)
