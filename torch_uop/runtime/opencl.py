"""OpenCL device: OpenCL C source -> kernels run through pyopencl on torch CPU tensors' memory.

`OpenCLProgram(source, names)` builds one program (a graph's kernels together) for this process's OpenCL
device (`opencl_device()`: TORCH_UOP_OPENCL_DEVICE="platform substring[:device index]", else the first GPU,
else the first device of any kind, e.g. pocl on the CPU). The built binary is kept in the disk cache
(runtime/cache.py), keyed by source, device and driver. `launcher(...)` gives a callable taking the buffers'
host addresses (ints), as the CPU launchers do: on a device that shares host memory
(CL_DEVICE_HOST_UNIFIED_MEMORY, e.g. pocl) each buffer wraps the tensor's memory in place (CL_MEM_USE_HOST_PTR)
and the output is mapped back after the kernel; on any other device the buffers are copied in and the output
copied out. Each launch waits for its kernel: the next step may be torch code reading the output.
It knows nothing of UOps or torch.
"""
from __future__ import annotations
import ctypes
import functools
import os
import threading
import warnings

_lock = threading.Lock()


class OpenCLUnavailable(RuntimeError):
  pass


@functools.cache
def opencl_device():
  """(context, queue, device) of this process's OpenCL device; raises OpenCLUnavailable naming what is missing."""
  try:
    import pyopencl as cl
  except ImportError as e:
    raise OpenCLUnavailable(f"device 'opencl' needs pyopencl ({e}); pip install pyopencl") from None
  try:
    platforms = cl.get_platforms()
  except cl.Error as e:
    raise OpenCLUnavailable(f"no OpenCL platform ({e}); install a driver, e.g. apt-get install pocl-opencl-icd") from None
  choice = os.environ.get("TORCH_UOP_OPENCL_DEVICE", "")
  want, _, index = choice.partition(":")
  devices = [d for p in platforms if want.lower() in p.name.lower() for d in p.get_devices()]
  if not devices: raise OpenCLUnavailable(f"no OpenCL device{f' on a platform matching {want!r}' if want else ''}")
  if index: device = devices[int(index)]
  else: device = next((d for d in devices if d.type & cl.device_type.GPU), devices[0])
  ctx = cl.Context([device])
  return ctx, cl.CommandQueue(ctx), device


def device_limits() -> dict:
  _, _, dev = opencl_device()
  return {"max_local_size": dev.max_work_group_size, "name": f"{dev.platform.name} / {dev.name}"}


class OpenCLProgram:
  def __init__(self, source: str, names: list[str]):
    import pyopencl as cl
    from torch_uop.runtime import cache
    self.source = source
    ctx, self.queue, dev = opencl_device()
    self.unified = bool(dev.host_unified_memory)
    key = cache.key(source, dev.platform.name, dev.name, dev.driver_version)
    binary = cache.load(key, ".clbin")
    self.from_cache = binary is not None
    with _lock:
      program = None
      if binary is not None:
        try:
          with warnings.catch_warnings():
            warnings.simplefilter("ignore", cl.CompilerWarning)
            program = cl.Program(ctx, [dev], [binary]).build()
        except cl.Error: program = None
      if program is None:
        try:
          with warnings.catch_warnings():  # the compiler's notes on generated code are not the user's business
            warnings.simplefilter("ignore", cl.CompilerWarning)
            program = cl.Program(ctx, source).build()
        except cl.RuntimeError as e:
          raise RuntimeError(f"OpenCL build failed: {e}") from None
        cache.store(key, program.get_info(cl.program_info.BINARIES)[0], ".clbin")
    self.program = program
    self.kernels = {n: cl.Kernel(program, n) for n in names}

  def launcher(self, name: str, nbytes: list[int], items: int, local_size: int):
    """`run(*addresses)`: the kernel over `items` output positions (work-groups of `local_size` work-items when
    grouped), on buffers of `nbytes` bytes each at those host addresses; the first is the output."""
    import pyopencl as cl
    kernel, queue, unified = self.kernels[name], self.queue, self.unified
    ctx = queue.context
    mf = cl.mem_flags
    gsize, lsize = ((items * local_size,), (local_size,)) if local_size else ((items,), None)
    dummy = cl.Buffer(ctx, mf.READ_WRITE, 1)  # for empty buffers (OpenCL has no buffer of 0 bytes)
    lock = threading.Lock()  # a kernel object holds its arguments: one launch at a time

    def host(addr: int, n: int): return (ctypes.c_char * n).from_address(addr)

    def run(*addresses):
      # (address 0: an empty tensor, which the kernel never reads)
      flags = mf.READ_WRITE | (mf.USE_HOST_PTR if unified else mf.COPY_HOST_PTR)
      bufs = [cl.Buffer(ctx, flags, hostbuf=host(a, n)) if n and a else dummy for a, n in zip(addresses, nbytes)]
      with lock:
        kernel.set_args(*bufs)
        done = cl.enqueue_nd_range_kernel(queue, kernel, gsize, lsize)
      if not nbytes[0]: return done.wait()
      if unified:  # mapping makes the device's writes visible in host memory (a no-op where it wrote there)
        mapped, ev = cl.enqueue_map_buffer(queue, bufs[0], cl.map_flags.READ, 0, (nbytes[0],), "b", wait_for=[done])
        ev.wait()
        mapped.base.release(queue)
        queue.finish()
      else:
        cl.enqueue_copy(queue, host(addresses[0], nbytes[0]), bufs[0], wait_for=[done]).wait()
    return run
