"""Targets: where a graph's kernels run, and everything about the device the pipeline needs, behind one interface.

`Target(name)` finds the target class registered under `name` (`TARGETS`); each says, for its device, the kind the
optimizer plans for (core/opt.py: "cpu" or "gpu"), its renderer (core/renderer/), its limits, how a rendered
kernel becomes a module (`module`) and how a graph's modules become one program (`start_compiles`, `program_of`):
- "cpu": LLVM IR through llvmlite (runtime/cpu.py), one module per kernel with its launchers, CPU tensors (the default);
- "opencl": OpenCL C through pyopencl (runtime/opencl.py), on CPU tensors' memory (in place on devices that share
  host memory);
- "cuda": CUDA C through NVRTC (runtime/cuda.py), on CUDA tensors, chosen by the graph's inputs being on a CUDA device.
A new device is a subclass here (its name, renderer, program class and limits); pipeline.py does not change.
"""
from __future__ import annotations
from dataclasses import dataclass
import torch
from torch_uop.core.opt import GROUP_SIZE
from torch_uop.core.sym import is_sym
from torch_uop.core.renderer.llvmir import LLVMRenderer
from torch_uop.core.renderer.cstyle import OpenCLRenderer, CUDARenderer
from torch_uop.runtime import cpu, opencl, cuda, threads

TARGETS: dict[str, type] = {}  # name -> its Target subclass

# CPU kernels with less work than this (scalar operations, roughly) are called through a builtin launcher
ENTRY_MAX_WORK = 1 << 17


def module_signatures(modules: dict) -> dict:
  """Each module's kernel symbol -> its number of buffers (what a CPU program's launchers are built for)."""
  return {sym: nbuf for sym, (_, _, nbuf) in modules.items()}


@dataclass(frozen=True)
class Target:
  """A device kernels run on: `Target("opencl")` is an OpenCLTarget. Equal targets (name and CUDA device index) share
  tuning and cache entries."""
  name: str = "cpu"
  device_index: int = 0      # the CUDA device
  kind = "cpu"               # what core/opt.py plans for: "cpu" or "gpu"

  def __new__(cls, name: str = "cpu", device_index: int = 0):
    if cls is Target:
      if name not in TARGETS: raise ValueError(f"torch_uop: no target {name!r}; targets: {', '.join(TARGETS)}")
      cls = TARGETS[name]
    return object.__new__(cls)

  def __post_init__(self):
    if TARGETS.get(self.name) is not type(self):
      raise ValueError(f"torch_uop: {type(self).__name__} is not the target {self.name!r}: make targets by name, Target(name)")

  def __init_subclass__(cls, target_name: str | None = None, **kw):
    super().__init_subclass__(**kw)
    if target_name is not None: TARGETS[target_name] = cls

  @property
  def torch_device(self) -> torch.device: return torch.device("cpu")

  def renderer(self):
    """A fresh renderer for one graph's kernels (a C-style one collects what its program's preamble declares)."""
    raise NotImplementedError

  def max_group(self) -> int:
    """The most work-items a grouped reduction uses here (0: no groups)."""
    return 0

  def parallelism(self) -> int:
    """Work-items the device runs at once, roughly: fewer outputs than this make a long reduction worth grouping."""
    return 0

  def vector_unit(self):
    """The CPU's vector registers (core/opt.py VectorUnit: what sizes heuristic_opts' register tiles); None elsewhere."""
    return None

  def describe(self) -> str:
    """The device in words (what tuning results depend on)."""
    return self.name

  def check_available(self) -> None:
    """Raise a clear error (naming what is missing) if this target cannot run kernels in this process."""

  def start_compiles(self, opt_level: int):
    """What compiles a graph's modules while codegen goes on (runtime/cpu.py ModuleCompiles), or None."""
    return None

  def module(self, kernel, symbol: str, source: str, work) -> tuple:
    """(the kernel's source under `symbol`, its launchers' source by name, its number of buffers)."""
    raise NotImplementedError

  def program_of(self, modules: dict, renderer, opt_level: int, compiles) -> tuple:
    """(the program holding every module's kernel, the device source it was built from or None)."""
    raise NotImplementedError


class CPUTarget(Target, target_name="cpu"):
  def renderer(self): return LLVMRenderer()
  def vector_unit(self): return cpu.vector_unit()

  def start_compiles(self, opt_level: int):
    compiles = cpu.ModuleCompiles(opt_level)
    compiles.workers.start()  # the helpers load llvmlite while the first kernels are built
    return compiles

  def module(self, kernel, symbol: str, source: str, work) -> tuple:
    entries = {}
    # a symbolic split size (or work) is known per call: such a kernel gets both launchers, which take the split
    # size as an argument, and each instance picks (runtime/executor.py _make_plan)
    symbolic = is_sym(kernel.split_size) or is_sym(work)
    split = None if is_sym(kernel.split_size) else kernel.split_size
    n = len(kernel.buffers)
    # small kernels also get a launcher Python calls as a builtin (holding the GIL: only for short runs)
    if cpu.python_entries_supported() and (symbolic or work < ENTRY_MAX_WORK):
      entries[f"{symbol}_py"] = cpu.python_entry_ir(f"{symbol}_py", symbol, n, None if split is None else max(split, 1))
    if cpu.openmp_supported() and (symbolic or threads.max_threads(kernel.split_size, work) > 1):
      entries[f"{symbol}_par"] = cpu.parallel_entry_ir(f"{symbol}_par", symbol, n, split)
    return LLVMRenderer.rename(source, kernel.name, symbol), entries, n

  def program_of(self, modules: dict, renderer, opt_level: int, compiles) -> tuple:
    entries = [entries for _, entries, _ in modules.values()]
    return cpu.CPUProgram(None, module_signatures(modules), opt_level, entries, compiles=compiles), None


class GPUTarget(Target):
  """A GPU-style device: C-style kernels in one program per graph, launched per step over work-items."""
  kind = "gpu"
  renderer_class = None

  def renderer(self): return self.renderer_class()
  def max_local_size(self) -> int: return 1024
  def max_group(self) -> int: return min(GROUP_SIZE, self.max_local_size())
  def module(self, kernel, symbol: str, source: str, work) -> tuple:
    return self.renderer_class.rename(source, kernel.name, symbol), {}, len(kernel.buffers)

  def program_of(self, modules: dict, renderer, opt_level: int, compiles) -> tuple:
    source = renderer.program_source([src for src, _, _ in modules.values()])
    return self.program(source, list(modules)), source

  def program(self, source: str, names: list[str]):
    """The compiled program of a whole source holding the kernels `names`."""
    raise NotImplementedError


class OpenCLTarget(GPUTarget, target_name="opencl"):
  renderer_class = OpenCLRenderer
  def max_local_size(self) -> int: return opencl.device_limits()["max_local_size"]
  def parallelism(self) -> int: return opencl.device_limits()["parallelism"]
  def describe(self) -> str: return opencl.device_limits()["name"]
  def check_available(self) -> None: opencl.opencl_device()
  def program(self, source: str, names: list[str]): return opencl.OpenCLProgram(source, names)


class CUDATarget(GPUTarget, target_name="cuda"):
  renderer_class = CUDARenderer

  @property
  def torch_device(self) -> torch.device: return torch.device("cuda", self.device_index)

  def parallelism(self) -> int:
    props = torch.cuda.get_device_properties(self.device_index)
    return props.multi_processor_count * getattr(props, "max_threads_per_multi_processor", 2048)

  def describe(self) -> str: return torch.cuda.get_device_name(self.device_index)
  def check_available(self) -> None: cuda.check_available()
  def program(self, source: str, names: list[str]): return cuda.CUDAProgram(source, names, self.device_index)


CPU = Target("cpu")
