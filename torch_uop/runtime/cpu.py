"""CPU device: LLVM IR text -> native code through llvmlite, for the host CPU.

`CPUProgram(source, signatures)` parses, verifies and optimizes (O3 pipeline with loop and SLP
vectorization) one module, JIT-compiles it with MCJIT for the host CPU and its features, and
exposes each kernel (name -> number of buffer arguments) as a ctypes function taking one `void*`
per buffer and the bounds of its thread-split loop. The native object is kept in the disk cache
(runtime/cache.py): a later process with the same IR skips optimization and code generation
(`disk_cache=False`, for BEAM candidates, neither reads nor writes it).
Libm functions referenced by the IR resolve against the running process. It knows nothing of UOps
or torch.
"""
from __future__ import annotations
import ctypes
import ctypes.util
import functools
import threading
import llvmlite.binding as llvm
from torch_uop.runtime import cache

_lock = threading.Lock()


@functools.cache
def _init_llvm():
  llvm.initialize_native_target()
  llvm.initialize_native_asmprinter()
  libm = ctypes.util.find_library("m")
  if libm: llvm.load_library_permanently(libm)


def _target_machine():
  # a fresh one each time: the MCJIT engine takes ownership of the machine it is given
  _init_llvm()
  target = llvm.Target.from_default_triple()
  return target.create_target_machine(cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(),
                                      opt=3, reloc="default", codemodel="jitdefault")


def optimize(mod, tm, level: int = 3):
  pto = llvm.create_pipeline_tuning_options(speed_level=level)
  pto.loop_vectorization = level >= 2
  pto.slp_vectorization = level >= 2
  pb = llvm.create_pass_builder(tm, pto)
  pb.getModulePassManager().run(mod, pb)


class CPUProgram:
  def __init__(self, source: str, signatures: dict[str, int], opt_level: int = 3, disk_cache: bool = True):
    with _lock:
      tm = _target_machine()
      cache_key = cache.key(source, llvm.get_host_cpu_name(), llvm.get_host_cpu_features().flatten(), str(opt_level),
                            llvm.__name__ + getattr(llvm, "llvm_version_info", ("?",)).__repr__())
      cached = cache.load(cache_key) if disk_cache else None
      self.cache_hit = cached is not None
      mod = llvm.parse_assembly(source)
      mod.verify()
      if opt_level and cached is None: optimize(mod, tm, opt_level)
      self.engine = llvm.create_mcjit_compiler(mod, _target_machine())
      # MCJIT asks the cache before generating code and reports what it generated
      if disk_cache: self.engine.set_object_cache(lambda m, buf: cache.store(cache_key, buf), lambda m: cached)
      self.engine.finalize_object()
      self.optimized_ir = None if cached is not None else str(mod)
      self.functions = {}
      for name, nargs in signatures.items():
        addr = self.engine.get_function_address(name)
        # buffers, then the [lo, hi) bounds of the thread-split loop
        self.functions[name] = ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] * nargs), ctypes.c_int64, ctypes.c_int64)(addr)
