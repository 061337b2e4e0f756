"""CPU device: LLVM IR text -> native code through llvmlite, for the host CPU.

`CPUProgram(source, signatures)` parses, verifies and optimizes (O3 pipeline with loop and SLP
vectorization) one module, JIT-compiles it with MCJIT for the host CPU and its features, and
exposes each kernel (name -> number of buffer arguments) as a ctypes function taking one `void*`
per buffer and the bounds of its thread-split loop. `python_entry_ir` writes a launcher that Python calls as
a builtin function (METH_FASTCALL) with the buffers' addresses as ints and that calls one kernel on the calling
thread: about 0.1 µs a call, where a ctypes call costs 1 µs or more. The native object is kept in the disk cache
(runtime/cache.py): a later process with the same IR skips optimization and code generation
(`disk_cache=False`, for BEAM candidates, neither reads nor writes it).
Libm functions referenced by the IR resolve against the running process. It knows nothing of UOps
or torch.
"""
from __future__ import annotations
import ctypes
import ctypes.util
import functools
import os
import sys
import sysconfig
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
  cpu, features, _ = target_id()
  target = llvm.Target.from_default_triple()
  return target.create_target_machine(cpu=cpu, features=features, opt=3, reloc="default", codemodel="jitdefault")


def optimize(mod, tm, level: int = 3):
  pto = llvm.create_pipeline_tuning_options(speed_level=level)
  pto.loop_vectorization = level >= 2
  pto.slp_vectorization = level >= 2
  pb = llvm.create_pass_builder(tm, pto)
  pb.getModulePassManager().run(mod, pb)


_METH_FASTCALL = 0x80
# free-threaded builds count references differently: no launchers there
_ENTRIES_SUPPORTED = sys.implementation.name == "cpython" and not sysconfig.get_config_var("Py_GIL_DISABLED")


class _PyMethodDef(ctypes.Structure):
  _fields_ = [("ml_name", ctypes.c_char_p), ("ml_meth", ctypes.c_void_p), ("ml_flags", ctypes.c_int), ("ml_doc", ctypes.c_char_p)]


_new_builtin = ctypes.pythonapi.PyCFunction_NewEx
_new_builtin.restype, _new_builtin.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.py_object, ctypes.c_void_p]
_LONG_AS_PTR = ctypes.cast(ctypes.pythonapi.PyLong_AsVoidPtr, ctypes.c_void_p).value


def python_entries_supported() -> bool: return _ENTRIES_SUPPORTED


def _fastcall_args(n_args: int) -> list[str]:
  """IR lines that read a METH_FASTCALL builtin's first n_args arguments (Python ints) as %v0.. pointers."""
  lines = ["  %as_ptr = load ptr, ptr @torch_uop_long_as_ptr"]
  for i in range(n_args):
    lines += [f"  %a{i}.slot = getelementptr ptr, ptr %args, i64 {i}", f"  %a{i} = load ptr, ptr %a{i}.slot",
              f"  %v{i} = call ptr %as_ptr(ptr %a{i})"]
  return lines


# a builtin's result: a new reference to its `self` (the CPUProgram, an ordinary object)
_RETURN_SELF = ["  %rc = load i64, ptr %self", "  %rc1 = add i64 %rc, 1", "  store i64 %rc1, ptr %self", "  ret ptr %self", "}"]


def python_entry_ir(entry: str, kernel: str, n_buffers: int, split_size: int) -> str:
  """LLVM IR of `entry(*addresses)`, a METH_FASTCALL builtin that calls `kernel(addresses..., 0, split_size)`. It
  trusts its caller: one int per buffer, each a valid address; the kernel runs holding the GIL. Returns its `self`."""
  lines = [f"define ptr @{entry}(ptr %self, ptr %args, i64 %nargs) {{", "entry:", *_fastcall_args(n_buffers)]
  lines.append(f"  call void @{kernel}({''.join(f'ptr %v{i}, ' for i in range(n_buffers))}i64 0, i64 {split_size})")
  return "\n".join(lines + _RETURN_SELF)


_OPENMP_DECLS = ["declare void @GOMP_parallel(ptr, ptr, i32, i32)", "declare i32 @omp_get_thread_num()",
                  "declare i32 @omp_get_num_threads()"]


@functools.cache
def openmp_supported() -> bool:
  """Whether kernels can run across threads through torch's own OpenMP runtime (libgomp, already loaded by torch):
  its pool is the one eager ops use, so our kernels neither pay a Python thread handoff nor compete with its
  spinning workers for the cores. TORCH_UOP_OPENMP=0 turns it off (kernels then use runtime/threads.py's pool)."""
  if os.environ.get("TORCH_UOP_OPENMP", "1") == "0" or not _ENTRIES_SUPPORTED: return False
  _init_llvm()
  try:
    with open("/proc/self/maps") as f: paths = sorted({l.split()[-1] for l in f if l.rstrip().rsplit("/", 1)[-1].startswith("libgomp")})
  except OSError:
    return False
  for path in paths:  # dlopen of a loaded library's path returns that library: no second runtime
    try: llvm.load_library_permanently(path)
    except RuntimeError: pass
  return all(llvm.address_of_symbol(s) for s in ("GOMP_parallel", "omp_get_thread_num", "omp_get_num_threads"))


def parallel_entry_ir(entry: str, kernel: str, n_buffers: int, split_size: int) -> str:
  """LLVM IR of `entry(*addresses, n_threads)`, a METH_FASTCALL builtin that runs `kernel` over [0, split_size)
  on n_threads OpenMP threads (GOMP_parallel; the caller is thread 0), each taking an equal slice of the split
  loop. Holds the GIL throughout, like `python_entry_ir`. Needs `openmp_supported()`."""
  n = n_buffers
  lines = [f"define internal void @{entry}.omp(ptr %data) {{", "entry:",
           "  %tid32 = call i32 @omp_get_thread_num()", "  %nt32 = call i32 @omp_get_num_threads()",
           "  %tid = sext i32 %tid32 to i64", "  %nt = sext i32 %nt32 to i64", "  %tid1 = add i64 %tid, 1",
           f"  %lo.m = mul i64 %tid, {split_size}", "  %lo = sdiv i64 %lo.m, %nt",
           f"  %hi.m = mul i64 %tid1, {split_size}", "  %hi = sdiv i64 %hi.m, %nt"]
  for i in range(n):
    lines += [f"  %b{i}.slot = getelementptr ptr, ptr %data, i64 {i}", f"  %b{i} = load ptr, ptr %b{i}.slot"]
  lines += [f"  call void @{kernel}({''.join(f'ptr %b{i}, ' for i in range(n))}i64 %lo, i64 %hi)", "  ret void", "}"]
  lines += [f"define ptr @{entry}(ptr %self, ptr %args, i64 %nargs) {{", "entry:", *_fastcall_args(n + 1),
            f"  %data = alloca [{max(n, 1)} x ptr]"]
  for i in range(n):
    lines += [f"  %d{i} = getelementptr ptr, ptr %data, i64 {i}", f"  store ptr %v{i}, ptr %d{i}"]
  lines += [f"  %nt64 = ptrtoint ptr %v{n} to i64", "  %nt = trunc i64 %nt64 to i32",
            f"  call void @GOMP_parallel(ptr @{entry}.omp, ptr %data, i32 %nt, i32 0)"]
  return "\n".join(lines + _RETURN_SELF)


class CPUProgram:
  def __init__(self, source: str | None, signatures: dict[str, int], opt_level: int = 3, entries: dict[str, str] = None,
               disk_cache: bool = True, object_code: bytes | None = None):
    """`entries`: launcher name -> its IR (`python_entry_ir`, `parallel_entry_ir`), compiled with the kernels into
    builtins (`self.entries`).
    `object_code`: a native object this class made before (`self.object_code`, e.g. from the graph cache), loaded
    without any LLVM IR; `source` and the entries' IR are then not needed (pass the entries' names)."""
    entries = entries or {}
    with _lock:
      if object_code is not None:
        self.cache_hit, self.optimized_ir = True, None
        self.engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), _target_machine())
        self.engine.add_object_file(llvm.ObjectFileRef.from_data(object_code))
        self.engine.finalize_object()
        self.object_code = object_code
      else:
        self._compile(source, opt_level, entries, disk_cache)
      self.functions = {}
      for name, nargs in signatures.items():
        addr = self.engine.get_function_address(name)
        # buffers, then the [lo, hi) bounds of the thread-split loop
        self.functions[name] = ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] * nargs), ctypes.c_int64, ctypes.c_int64)(addr)
      self.entries = {}
      if entries:
        ctypes.c_void_p.from_address(self.engine.get_global_value_address("torch_uop_long_as_ptr")).value = _LONG_AS_PTR
        self._method_defs = []
        for name in entries:
          mdef = _PyMethodDef(name.encode(), self.engine.get_function_address(name), _METH_FASTCALL, None)
          self._method_defs.append(mdef)
          # the builtin holds this program (its `self`), so the code and the method table outlive it
          self.entries[name] = _new_builtin(ctypes.addressof(mdef), self, None)

  def _compile(self, source: str, opt_level: int, entries: dict, disk_cache: bool) -> None:
    if entries: source += "\n@torch_uop_long_as_ptr = global ptr null\n" + "\n".join(entries.values()) + "\n"
    if any("@GOMP_parallel(" in e for e in entries.values()): source += "\n".join(_OPENMP_DECLS) + "\n"
    tm = _target_machine()
    cache_key = cache.key(source, *target_id(), str(opt_level))
    cached = cache.load(cache_key) if disk_cache else None
    self.cache_hit = cached is not None
    mod = llvm.parse_assembly(source)
    mod.verify()
    if opt_level and cached is None: optimize(mod, tm, opt_level)
    self.engine = llvm.create_mcjit_compiler(mod, _target_machine())
    self.object_code = cached

    def generated(_mod, buf):  # MCJIT reports the object it generated: kept, and stored on disk
      self.object_code = bytes(buf)
      if disk_cache: cache.store(cache_key, self.object_code)
    # MCJIT asks the cache before generating code and reports what it generated
    self.engine.set_object_cache(generated, lambda _mod: cached)
    self.engine.finalize_object()
    self.optimized_ir = None if cached is not None else str(mod)


@functools.cache
def target_id() -> tuple[str, str, str]:
  """What native code depends on besides its IR: the host CPU, its features and the LLVM version."""
  _init_llvm()
  return (llvm.get_host_cpu_name(), llvm.get_host_cpu_features().flatten(),
          llvm.__name__ + repr(getattr(llvm, "llvm_version_info", ("?",))))
