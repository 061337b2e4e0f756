"""CUDA device: CUDA C source -> PTX through NVRTC -> kernels launched on torch's current stream.

`compile_ptx(source, arch)` compiles with NVRTC (libnvrtc from the `nvidia-cuda-nvrtc-cu12` wheel torch's CUDA
builds install, or the system's; cuda_fp16.h/cuda_bf16.h from `nvidia-cuda-runtime-cu12`'s include folder). It needs
no GPU, so CI checks the CUDA renderer's output with it. `CUDAProgram(source, names)` loads the PTX into torch's
CUDA context (the device's primary context) through the driver API and `launcher(...)` gives a callable taking the
buffers' device addresses (ints, torch's `data_ptr()`) that launches on `torch.cuda.current_stream()`: the kernels
are ordered with torch's own work and never synchronize. At run time NVRTC compiles for the GPU's own architecture
(CUBIN), so the driver need not understand the PTX version of a newer NVRTC. The driver API is called through ctypes (libcuda, present
wherever the driver is): pycuda ships only as source and cuda-python is one more package, and the calls are these
few. PTX is kept in the disk cache (runtime/cache.py) keyed by source, architecture and NVRTC version.
"""
from __future__ import annotations
import ctypes
import ctypes.util
import functools
import glob
import os


class CUDAUnavailable(RuntimeError):
  pass


def _package_dir(module: str) -> str | None:
  try:
    mod = __import__(module, fromlist=["_"])
  except ImportError:
    return None
  paths = list(getattr(mod, "__path__", []))
  return paths[0] if paths else None


@functools.cache
def _nvrtc():
  candidates = []
  d = _package_dir("nvidia.cuda_nvrtc")
  if d: candidates += sorted(glob.glob(os.path.join(d, "lib", "libnvrtc.so*")))
  found = ctypes.util.find_library("nvrtc")
  if found: candidates.append(found)
  candidates += ["libnvrtc.so.12", "libnvrtc.so"]
  for path in candidates:
    if "alt" in os.path.basename(path) or "builtins" in os.path.basename(path): continue
    try: lib = ctypes.CDLL(path)
    except OSError: continue
    lib.nvrtcGetErrorString.restype = ctypes.c_char_p
    return lib
  raise CUDAUnavailable("NVRTC not found: pip install nvidia-cuda-nvrtc-cu12 (torch's CUDA builds bring it)")


@functools.cache
def cuda_include_dirs() -> tuple:
  """Folders holding cuda_fp16.h and cuda_bf16.h."""
  dirs = []
  d = _package_dir("nvidia.cuda_runtime")
  if d and os.path.isdir(os.path.join(d, "include")): dirs.append(os.path.join(d, "include"))
  for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
    if home and os.path.isdir(os.path.join(home, "include")): dirs.append(os.path.join(home, "include"))
  return tuple(dirs)


def check_available() -> None:
  """Raise a clear error if NVRTC or the CUDA driver cannot be loaded."""
  _nvrtc(), _driver()


def nvrtc_available() -> bool:
  try: _nvrtc()
  except CUDAUnavailable: return False
  return True


def nvrtc_version() -> str:
  lib = _nvrtc()
  major, minor = ctypes.c_int(), ctypes.c_int()
  lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
  return f"{major.value}.{minor.value}"


def compile_ptx(source: str, arch: str = "compute_80", name: str = "kernels.cu") -> bytes:
  """PTX for `arch` (a virtual architecture, e.g. compute_90), or with arch "sm_XX" the device code (CUBIN) for
  that GPU, which needs no PTX JIT in the driver; raises RuntimeError with NVRTC's log on an error."""
  from torch_uop.runtime import cache
  cubin = arch.startswith("sm_")
  key = cache.key(source, arch, nvrtc_version())
  ptx = cache.load(key, ".cubin" if cubin else ".ptx")
  if ptx is not None: return ptx
  lib = _nvrtc()
  prog = ctypes.c_void_p()
  _check_nvrtc(lib, lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), name.encode(), 0, None, None))
  try:
    opts = [f"--gpu-architecture={arch}", "--std=c++17", "-default-device"] + [f"-I{d}" for d in cuda_include_dirs()]
    arr = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
    status = lib.nvrtcCompileProgram(prog, len(opts), arr)
    if status != 0:
      size = ctypes.c_size_t()
      lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
      log = ctypes.create_string_buffer(size.value)
      lib.nvrtcGetProgramLog(prog, log)
      raise RuntimeError(f"NVRTC: {lib.nvrtcGetErrorString(status).decode()}:\n{log.value.decode(errors='replace')}")
    size = ctypes.c_size_t()
    get_size, get = (lib.nvrtcGetCUBINSize, lib.nvrtcGetCUBIN) if cubin else (lib.nvrtcGetPTXSize, lib.nvrtcGetPTX)
    _check_nvrtc(lib, get_size(prog, ctypes.byref(size)))
    buf = ctypes.create_string_buffer(size.value)
    _check_nvrtc(lib, get(prog, buf))
    ptx = buf.raw
  finally:
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
  cache.store(key, ptx, ".cubin" if cubin else ".ptx")
  return ptx


def _check_nvrtc(lib, status: int) -> None:
  if status != 0: raise RuntimeError(f"NVRTC: {lib.nvrtcGetErrorString(status).decode()}")


@functools.cache
def _driver():
  for path in ("libcuda.so.1", "libcuda.so", ctypes.util.find_library("cuda")):
    if not path: continue
    try: return ctypes.CDLL(path)
    except OSError: continue
  raise CUDAUnavailable("libcuda (the NVIDIA driver) not found")


def _check(status: int, what: str) -> None:
  if status != 0:
    name = ctypes.c_char_p()
    _driver().cuGetErrorString(status, ctypes.byref(name))
    raise RuntimeError(f"CUDA driver: {what} failed: {name.value.decode() if name.value else status}")


def _current_context(device_index: int) -> None:
  """Make torch's context for the device (its primary context) current on this thread."""
  import torch
  torch.cuda.init()
  drv = _driver()
  ctx = ctypes.c_void_p()
  _check(drv.cuCtxGetCurrent(ctypes.byref(ctx)), "cuCtxGetCurrent")
  dev = ctypes.c_int()
  if ctx.value:
    _check(drv.cuCtxGetDevice(ctypes.byref(dev)), "cuCtxGetDevice")
    if dev.value == device_index: return
  _check(drv.cuDeviceGet(ctypes.byref(dev), device_index), "cuDeviceGet")
  primary = ctypes.c_void_p()
  _check(drv.cuDevicePrimaryCtxRetain(ctypes.byref(primary), dev), "cuDevicePrimaryCtxRetain")
  _check(drv.cuCtxSetCurrent(primary), "cuCtxSetCurrent")


def device_arch(device_index: int) -> str:
  """The GPU's real architecture (sm_XX): NVRTC makes its device code, so the driver need not JIT newer PTX."""
  import torch
  major, minor = torch.cuda.get_device_capability(device_index)
  return f"sm_{major}{minor}"


class CUDAProgram:
  def __init__(self, source: str, names: list[str], device_index: int):
    import torch
    self.device_index = device_index
    self.image = compile_ptx(source, device_arch(device_index))
    drv = _driver()
    with torch.cuda.device(device_index):
      _current_context(device_index)
      self.module = ctypes.c_void_p()
      _check(drv.cuModuleLoadData(ctypes.byref(self.module), ctypes.c_char_p(self.image)), "cuModuleLoadData")
      self.functions = {}
      for n in names:
        fn = ctypes.c_void_p()
        _check(drv.cuModuleGetFunction(ctypes.byref(fn), self.module, n.encode()), f"cuModuleGetFunction({n})")
        self.functions[n] = fn

  def launcher(self, name: str, nbytes: list[int], items: int, local_size: int):
    """`run(*addresses)`: the kernel over `items` output positions (blocks of `local_size` threads, one per output,
    when grouped; else the renderer's BLOCK threads per block, one per output) on torch's current stream."""
    import torch
    from torch_uop.core.renderer.cstyle import CUDARenderer
    drv, fn, device_index = _driver(), self.functions[name], self.device_index
    block = CUDARenderer.BLOCK
    grid, threads = (items, local_size) if local_size else (-(-items // block), block)
    n_args = len(nbytes)

    def run(*addresses):
      values = (ctypes.c_uint64 * n_args)(*addresses)
      params = (ctypes.c_void_p * n_args)(*[ctypes.addressof(values) + 8 * i for i in range(n_args)])
      stream = ctypes.c_void_p(torch.cuda.current_stream(device_index).cuda_stream)
      status = drv.cuLaunchKernel(fn, ctypes.c_uint(grid), 1, 1, ctypes.c_uint(threads), 1, 1, 0, stream, params, None)
      if status == CUDA_ERROR_INVALID_CONTEXT:  # a thread where torch never made its context current
        _current_context(device_index)
        status = drv.cuLaunchKernel(fn, ctypes.c_uint(grid), 1, 1, ctypes.c_uint(threads), 1, 1, 0, stream, params, None)
      _check(status, f"cuLaunchKernel({name})")
    return run


CUDA_ERROR_INVALID_CONTEXT = 201
