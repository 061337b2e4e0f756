"""OpenCL device: OpenCL C source -> kernels run through pyopencl on torch CPU tensors' memory.

`OpenCLProgram(source, names)` builds one program (a graph's kernels together) for this process's OpenCL
device (`opencl_device()`: TORCH_UOP_OPENCL_DEVICE="platform substring[:device index]", else the first GPU,
else the first device of any kind, e.g. pocl on the CPU). The built binary is kept in the disk cache
(runtime/cache.py), keyed by source, device and driver. `launcher(...)` gives a callable taking the buffers'
host addresses (ints), as the CPU launchers do: on a device that shares host memory
(CL_DEVICE_HOST_UNIFIED_MEMORY, e.g. pocl) each buffer wraps the tensor's memory in place (CL_MEM_USE_HOST_PTR),
kernels are only enqueued, and the executor calls `synchronize()` before host code touches a buffer (outputs are
mapped there if a probe found the device does not write host memory in place); on any other device the buffers are
copied in and the output copied out, and each launch waits.
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
  import pyopencl as cl
  _, _, dev = opencl_device()
  # a CPU device runs a work-item per SIMD lane of each core; a GPU fills its compute units with whole groups
  lanes = 16 if dev.type & cl.device_type.CPU else dev.max_work_group_size
  return {"max_local_size": dev.max_work_group_size, "name": f"{dev.platform.name} / {dev.name}",
          "parallelism": dev.max_compute_units * lanes}


class OpenCLProgram:
  def __init__(self, source: str, names: list[str]):
    import pyopencl as cl
    from torch_uop.runtime import cache
    ctx, self.queue, dev = opencl_device()
    self.device = device_state()
    self.pending: list = []  # buffers of kernels launched since the last synchronize()
    key = cache.key(source, dev.platform.name, dev.name, dev.driver_version)
    binary = cache.load(key, ".clbin")
    with _lock:
      program = None
      if binary is not None:
        try: program = _build(cl.Program(ctx, [dev], [binary]))
        except cl.Error: program = None
      if program is None:
        try:
          program = _build(cl.Program(ctx, source))
        except cl.RuntimeError as e:
          raise RuntimeError(f"OpenCL build failed: {e}") from None
        cache.store(key, program.get_info(cl.program_info.BINARIES)[0], ".clbin")
    self.program = program
    self.kernels = {n: cl.Kernel(program, n) for n in names}

  def launcher(self, name: str, nbytes: list[int], items: int, local_size: int):
    """`run(*addresses)`: the kernel over `items` output positions (work-groups of `local_size` work-items when
    grouped), on buffers of `nbytes` bytes each at those host addresses; the first is the output. Where the device
    writes host memory in place, the launch is only enqueued (the queue keeps kernels in order): the host calls
    `synchronize()` before it reads or writes any buffer (a fallback step, the graph's return)."""
    import pyopencl as cl
    kernel, queue, pending, device = self.kernels[name], self.queue, self.pending, self.device
    mode = device.mode
    ctx = queue.context
    flags = cl.mem_flags.READ_WRITE | (cl.mem_flags.COPY_HOST_PTR if mode == "copy" else cl.mem_flags.USE_HOST_PTR)
    gsize, lsize = ((items * local_size,), (local_size,)) if local_size else ((items,), None)

    def run(*addresses):
      # (address 0: an empty tensor, which the kernel never reads)
      bufs = [cl.Buffer(ctx, flags, hostbuf=_host(a, n)) if n and a else device.dummy for a, n in zip(addresses, nbytes)]
      with device.lock:  # a kernel object holds its arguments: one launch at a time
        kernel.set_args(*bufs)
        done = cl.enqueue_nd_range_kernel(queue, kernel, gsize, lsize)
      if mode == "copy":  # the next buffer made may copy this output in: wait for it
        if nbytes[0] and addresses[0]: cl.enqueue_copy(queue, _host(addresses[0], nbytes[0]), bufs[0], wait_for=[done])
        queue.finish()
      else:
        pending.append(bufs)  # kept alive until the kernel ran
    return run

  def synchronize(self) -> None:
    """Wait for every launched kernel; where the device does not write host memory in place, map the outputs."""
    if not self.pending: return
    self.queue.finish()
    if self.device.mode == "map":
      import pyopencl as cl
      for bufs in self.pending:
        if bufs[0] is self.device.dummy: continue
        mapped, ev = cl.enqueue_map_buffer(self.queue, bufs[0], cl.map_flags.READ, 0, (bufs[0].size,), "b")
        ev.wait()
        mapped.base.release(self.queue)
      self.queue.finish()
    self.pending.clear()


def _host(addr: int, n: int): return (ctypes.c_char * n).from_address(addr)


def _build(program):
  """program.build(), quietly: the compiler's notes on generated code are not the user's business (-w, and
  pyopencl's CompilerWarning for what a driver prints anyway)."""
  import pyopencl as cl
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", cl.CompilerWarning)
    return program.build(options=["-w"])


class _DeviceState:
  """Per process: a 1-byte buffer standing for empty tensors (OpenCL has no buffer of 0 bytes), the launch lock, and
  how the device sees host memory: "in_place" (it writes the tensor's memory itself: probed once), "map" (shared
  memory that needs a map to be seen), "copy" (its own memory)."""

  def __init__(self, ctx, queue, dev):
    import pyopencl as cl
    self.dummy = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 1)
    self.lock = threading.Lock()
    self.mode = "copy"
    if dev.host_unified_memory:
      self.mode = "in_place" if _writes_in_place(ctx, queue) else "map"


def _writes_in_place(ctx, queue) -> bool:
  """Whether a kernel's writes to a CL_MEM_USE_HOST_PTR buffer land in the host memory without a map (pocl)."""
  import pyopencl as cl
  import numpy as np
  host = np.zeros(1024, dtype=np.float32)  # 4 KiB, aligned as torch's allocations are
  buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE | cl.mem_flags.USE_HOST_PTR, hostbuf=host)
  prg = _build(cl.Program(ctx, "__kernel void probe(__global float* x) { x[get_global_id(0)] = 7.0f; }"))
  k = cl.Kernel(prg, "probe")
  k.set_args(buf)
  cl.enqueue_nd_range_kernel(queue, k, (1024,), None)
  queue.finish()
  return bool((host == 7.0).all())


@functools.cache
def device_state() -> _DeviceState:
  return _DeviceState(*opencl_device())
