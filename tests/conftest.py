"""Shared test fixtures: every test starts with a fresh Dynamo cache and fresh torch_uop metrics.

The op and model tests (DEVICE_MODULES) run twice: on the CPU (LLVM) and on OpenCL (`TORCH_UOP_DEVICE=opencl`;
pocl on the CPU in CI). On OpenCL, the kernels each test compiled are also rendered as CUDA C and compiled to PTX
with NVRTC (no GPU needed), so a CUDA source error fails that test's teardown.
"""
import functools
import pytest
import torch
import torch_uop
import torch_uop.debug

DEVICE_MODULES = {"test_ops", "test_models"}
DEVICES = ["cpu", "opencl"]


@functools.cache
def opencl_missing() -> str | None:
  """Why OpenCL cannot run here (None: it can)."""
  try:
    from torch_uop.runtime.opencl import opencl_device
    opencl_device()
  except Exception as e:
    return str(e)
  return None


@functools.cache
def nvrtc_missing() -> str | None:
  from torch_uop.runtime.cuda import nvrtc_available
  return None if nvrtc_available() else "NVRTC not installed (pip install nvidia-cuda-nvrtc-cu12 nvidia-cuda-runtime-cu12)"


def check_cuda_source(graphs: list) -> None:
  """Render every kernel of `graphs` (built for a GPU-style device) as CUDA C and compile it all to PTX."""
  from torch_uop.core.renderer.cstyle import CUDARenderer
  from torch_uop.runtime.cuda import compile_ptx
  renderer = CUDARenderer()
  # graphs of separate compiles in one test may reuse kernel names: each gets its graph's index
  names = {(i, k.name): f"g{i}_{k.name}" for i, g in enumerate(graphs) for k in g.kernels}
  functions = [renderer.render_kernel(names[i, k.name], k.program, k.argument_ids, k.local_size)
               for i, g in enumerate(graphs) for k in g.kernels]
  if not functions: return
  ptx = compile_ptx(renderer.program_source(functions), "compute_80")
  for name in names.values(): assert f".entry {name}(".encode() in ptx, f"no PTX entry for {name}"


def pytest_generate_tests(metafunc):
  if metafunc.module.__name__.rsplit(".", 1)[-1] in DEVICE_MODULES:
    metafunc.parametrize("uop_device", DEVICES, indirect=True)


@pytest.fixture(autouse=True)
def uop_device(request, monkeypatch):
  """The device the test's graphs compile for (the default `device` option): "cpu", or "opencl" (parametrized)."""
  device = getattr(request, "param", "cpu")
  if device == "cpu":
    yield device
    return
  if opencl_missing(): pytest.skip(f"OpenCL unavailable: {opencl_missing()} (CI installs pocl-opencl-icd and pyopencl)")
  monkeypatch.setenv("TORCH_UOP_DEVICE", device)
  with torch_uop.debug.capture() as graphs:
    yield device
  if not nvrtc_missing(): check_cuda_source(graphs)


@pytest.fixture(autouse=True)
def fresh_state():
  torch._dynamo.reset()
  torch_uop.reset_metrics()
  torch.manual_seed(0)
  yield
  torch._dynamo.reset()
