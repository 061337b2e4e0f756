"""Targets: where a graph's kernels run, and what that changes along the pipeline.

A `Target` names the device kind the optimizer plans for (core/opt.py: "cpu" or "gpu"), the renderer
(LLVM IR, or core/renderer/cstyle.py's OpenCL C / CUDA C), the program class that compiles a graph's
kernels (runtime/cpu.py, runtime/opencl.py, runtime/cuda.py) and the torch device its buffers live on:
- "cpu": LLVM through llvmlite, CPU tensors (the default);
- "opencl": OpenCL C through pyopencl, on CPU tensors' memory (in place on devices that share host memory);
- "cuda": CUDA C through NVRTC, on CUDA tensors, chosen by the graph's inputs being on a CUDA device.
"""
from __future__ import annotations
from dataclasses import dataclass
import torch


@dataclass(frozen=True)
class Target:
  name: str = "cpu"          # "cpu" | "opencl" | "cuda"
  device_index: int = 0      # the CUDA device

  @property
  def kind(self) -> str: return "cpu" if self.name == "cpu" else "gpu"

  @property
  def torch_device(self) -> torch.device:
    return torch.device("cuda", self.device_index) if self.name == "cuda" else torch.device("cpu")

  def renderer(self):
    from torch_uop.core.renderer.cstyle import RENDERERS
    from torch_uop.core.renderer.llvmir import LLVMRenderer
    return LLVMRenderer() if self.name == "cpu" else RENDERERS[self.name]()

  def max_local_size(self) -> int:
    """The most work-items one group may have on this device."""
    if self.name == "opencl":
      from torch_uop.runtime.opencl import device_limits
      return device_limits()["max_local_size"]
    return 1024

  def max_group(self) -> int:
    """The most work-items a grouped reduction uses here: core/opt.py's GROUP_SIZE within the device's limit."""
    from torch_uop.core.opt import GROUP_SIZE
    return min(GROUP_SIZE, self.max_local_size())

  def vector_unit(self):
    """The CPU's vector registers (core/opt.py VectorUnit: what sizes heuristic_opts' register tiles); None elsewhere."""
    if self.name != "cpu": return None
    from torch_uop.runtime.cpu import vector_unit
    return vector_unit()

  def describe(self) -> str:
    """The device in words (what tuning results depend on)."""
    if self.name == "opencl":
      from torch_uop.runtime.opencl import device_limits
      return device_limits()["name"]
    if self.name == "cuda": return torch.cuda.get_device_name(self.device_index)
    return "cpu"

  def parallelism(self) -> int:
    """Work-items the device runs at once, roughly: fewer outputs than this make a long reduction worth grouping."""
    if self.name == "opencl":
      from torch_uop.runtime.opencl import device_limits
      return device_limits()["parallelism"]
    props = torch.cuda.get_device_properties(self.device_index)
    return props.multi_processor_count * getattr(props, "max_threads_per_multi_processor", 2048)

  def check_available(self) -> None:
    """Raise a clear error (naming what is missing) if this target cannot run kernels in this process."""
    if self.name == "opencl":
      from torch_uop.runtime.opencl import opencl_device
      opencl_device()
    elif self.name == "cuda":
      from torch_uop.runtime.cuda import _nvrtc, _driver
      _nvrtc(), _driver()

  def program(self, source: str, names: list[str]):
    if self.name == "opencl":
      from torch_uop.runtime.opencl import OpenCLProgram
      return OpenCLProgram(source, names)
    from torch_uop.runtime.cuda import CUDAProgram
    return CUDAProgram(source, names, self.device_index)



CPU = Target("cpu")
