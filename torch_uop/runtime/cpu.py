"""CPU device: LLVM IR text -> native code through llvmlite, for the host CPU.

`CPUProgram(source, signatures)` compiles one module, or several (e.g. one per kernel), each to a native
object (runtime/llvm_worker.py: O3 pipeline with loop and SLP vectorization, for the host CPU and its
features), loads the objects into one MCJIT engine and exposes each kernel (name -> number of buffer
arguments) as a ctypes function taking one `void*` per buffer and the bounds of its thread-split loop.
llvmlite compiles one module at a time per process, so modules to compile go in batches to helper processes
(`CompileWorkers`, TORCH_UOP_COMPILE_WORKERS), as the caller hands them over (`ModuleCompiles`: the executor
feeds it each kernel as soon as it is generated). `python_entry_ir` writes a launcher that Python calls as
a builtin function (METH_FASTCALL) with the buffers' addresses as ints and that calls one kernel on the calling
thread: about 0.1 µs a call, where a ctypes call costs 1 µs or more. Native objects are kept in the disk cache
(runtime/cache.py): a later process with the same IR skips optimization and code generation
(`disk_cache=False`, for BEAM candidates, neither reads nor writes it).
Libm functions referenced by the IR resolve against the running process. It knows nothing of UOps
or torch.
"""
from __future__ import annotations
import atexit
import ctypes
import ctypes.util
import functools
import os
import platform
import subprocess
import sys
import sysconfig
import threading
import llvmlite.binding as llvm
from torch_uop.runtime import cache
from torch_uop.core.opt import VectorUnit, STAGE_MAX_BYTES
from torch_uop import progress
from torch_uop.runtime.llvm_worker import compile_module, read_message, write_message
from torch_uop.runtime import llvm_worker

_lock = threading.Lock()


@functools.cache
def _init_llvm():
  llvm.initialize_native_target()
  llvm.initialize_native_asmprinter()
  libm = ctypes.util.find_library("m")
  if libm: llvm.load_library_permanently(libm)
  # launchers convert Python ints to addresses through this symbol: resolved when an object is loaded, so
  # objects stay independent of this process's addresses (and can be cached and made by helper processes)
  llvm.add_symbol("torch_uop_long_as_ptr", _LONG_AS_PTR)
  _provide_support_functions()


# Functions LLVM's code may call that the process need not have. On a CPU without native bfloat16 (AVX2), the x86
# backend widens a bfloat16 select or store it cannot do in place to float and narrows the result back through
# __truncsfbf2, which libgcc has only from GCC 13: unresolved, the object's calls jump to address 0. Round to nearest
# even on the float's bits, NaN kept a quiet NaN with its sign (integer operations only: nothing here is widened).
_SUPPORT_IR = {"__truncsfbf2": """
define bfloat @__truncsfbf2(float %x) nounwind {
entry:
  %bits = bitcast float %x to i32
  %upper = lshr i32 %bits, 16
  %odd = and i32 %upper, 1
  %bias = add i32 %odd, 32767
  %rounded = add i32 %bits, %bias
  %nearest = lshr i32 %rounded, 16
  %nan = fcmp uno float %x, %x
  %quiet = or i32 %upper, 64
  %result = select i1 %nan, i32 %quiet, i32 %nearest
  %half = trunc i32 %result to i16
  %bf = bitcast i16 %half to bfloat
  ret bfloat %bf
}
"""}
_support_engines: list = []  # kept alive: their code is what the symbols point to


def _provide_support_functions() -> None:
  for name, ir in _SUPPORT_IR.items():
    if llvm.address_of_symbol(name): continue  # the process has one (a newer libgcc)
    # (the baseline CPU of the target: _target_machine would ask target_id, which needs this set up first)
    engine = llvm.create_mcjit_compiler(llvm.parse_assembly(ir), llvm.Target.from_default_triple().create_target_machine())
    engine.finalize_object()
    _support_engines.append(engine)
    llvm.add_symbol(name, engine.get_function_address(name))


def _target_machine():
  # a fresh one each time: the MCJIT engine takes ownership of the machine it is given
  cpu, features, _ = target_id()
  return llvm_worker.target_machine(cpu, features)


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
  lines = []
  for i in range(n_args):
    lines += [f"  %a{i}.slot = getelementptr ptr, ptr %args, i64 {i}", f"  %a{i} = load ptr, ptr %a{i}.slot",
              f"  %v{i} = call ptr @torch_uop_long_as_ptr(ptr %a{i})"]
  return lines


# a builtin's result: a new reference to its `self` (the CPUProgram, an ordinary object)
_RETURN_SELF = ["  %rc = load i64, ptr %self", "  %rc1 = add i64 %rc, 1", "  store i64 %rc1, ptr %self", "  ret ptr %self", "}"]


def python_entry_ir(entry: str, kernel: str, n_buffers: int, split_size: int | None) -> str:
  """LLVM IR of `entry(*addresses)`, a METH_FASTCALL builtin that calls `kernel(addresses..., 0, split_size)`. It
  trusts its caller: one int per buffer, each a valid address; the kernel runs holding the GIL. Returns its `self`.
  With split_size None (a symbolic one), the builtin takes it as one more argument: `entry(*addresses, split_size)`."""
  n = n_buffers
  lines = [f"define ptr @{entry}(ptr %self, ptr %args, i64 %nargs) {{", "entry:", *_fastcall_args(n + (split_size is None))]
  if split_size is None: lines.append(f"  %split = ptrtoint ptr %v{n} to i64")
  lines.append(f"  call void @{kernel}({''.join(f'ptr %v{i}, ' for i in range(n))}i64 0, i64 {'%split' if split_size is None else split_size})")
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


def parallel_entry_ir(entry: str, kernel: str, n_buffers: int, split_size: int | None) -> str:
  """LLVM IR of `entry(*addresses, n_threads)`, a METH_FASTCALL builtin that runs `kernel` over [0, split_size)
  on n_threads OpenMP threads (GOMP_parallel; the caller is thread 0), each taking an equal slice of the split
  loop. Holds the GIL throughout, like `python_entry_ir`. Needs `openmp_supported()`. With split_size None (a
  symbolic one): `entry(*addresses, split_size, n_threads)`; the size travels to the threads after the addresses."""
  n = n_buffers
  symbolic = split_size is None
  lines = [f"define internal void @{entry}.omp(ptr %data) {{", "entry:",
           "  %tid32 = call i32 @omp_get_thread_num()", "  %nt32 = call i32 @omp_get_num_threads()",
           "  %tid = sext i32 %tid32 to i64", "  %nt = sext i32 %nt32 to i64", "  %tid1 = add i64 %tid, 1"]
  if symbolic:
    lines += [f"  %split.slot = getelementptr ptr, ptr %data, i64 {n}", "  %split.p = load ptr, ptr %split.slot",
              "  %split = ptrtoint ptr %split.p to i64"]
  size = "%split" if symbolic else split_size
  lines += [f"  %lo.m = mul i64 %tid, {size}", "  %lo = sdiv i64 %lo.m, %nt",
            f"  %hi.m = mul i64 %tid1, {size}", "  %hi = sdiv i64 %hi.m, %nt"]
  for i in range(n):
    lines += [f"  %b{i}.slot = getelementptr ptr, ptr %data, i64 {i}", f"  %b{i} = load ptr, ptr %b{i}.slot"]
  lines += [f"  call void @{kernel}({''.join(f'ptr %b{i}, ' for i in range(n))}i64 %lo, i64 %hi)", "  ret void", "}"]
  n_data = n + symbolic  # the addresses, then the split size if it is an argument
  lines += [f"define ptr @{entry}(ptr %self, ptr %args, i64 %nargs) {{", "entry:", *_fastcall_args(n_data + 1),
            f"  %data = alloca [{max(n_data, 1)} x ptr]"]
  for i in range(n_data):
    lines += [f"  %d{i} = getelementptr ptr, ptr %data, i64 {i}", f"  store ptr %v{i}, ptr %d{i}"]
  lines += [f"  %nt64 = ptrtoint ptr %v{n_data} to i64", "  %nt = trunc i64 %nt64 to i32",
            f"  call void @GOMP_parallel(ptr @{entry}.omp, ptr %data, i32 %nt, i32 0)"]
  return "\n".join(lines + _RETURN_SELF)


class CPUProgram:
  def __init__(self, source: str | list[str] | None, signatures: dict[str, int], opt_level: int = 3,
               entries: dict[str, str] | list[dict[str, str]] | None = None, disk_cache: bool = True,
               object_code: list[bytes] | None = None, compiles: ModuleCompiles | None = None):
    """`source`: one module's IR, or a list of self-contained modules (parts) compiled side by side.
    `entries`: launcher name -> its IR (`python_entry_ir`, `parallel_entry_ir`), compiled with the kernels into
    builtins (`self.entries`); with several parts, one dict per part (a launcher goes with its kernel).
    `object_code`: the native objects this class made before (`self.object_code`, e.g. from the graph cache),
    loaded without any LLVM IR; `source` and the entries' IR are then not needed (pass the entries' names).
    `compiles`: a ModuleCompiles the caller fed with the modules (each `module_text(part, its entries)`) while it
    generated them; its objects are loaded, and `source` is not needed either."""
    sources = source if isinstance(source, list) else [source]
    entry_parts = entries if isinstance(entries, list) else [entries or {}]
    all_entries = {name: ir for part in entry_parts for name, ir in part.items()}
    self.optimized_ir, self.objects_from_cache = None, 0
    with _lock:
      _init_llvm()
      if object_code is not None:
        objects = list(object_code)
      else:
        if compiles is None:
          compiles = ModuleCompiles(opt_level, disk_cache)
          for src, part_entries in zip(sources, entry_parts): compiles.add_module(src, part_entries)
        objects = compiles.objects()
        self.objects_from_cache, self.optimized_ir = compiles.from_cache, compiles.optimized_ir
      self.engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), _target_machine())
      for obj in objects: self.engine.add_object_file(llvm.ObjectFileRef.from_data(obj))
      self.engine.finalize_object()
      self.object_code = objects
      self.functions = {}
      for name, nargs in signatures.items():
        addr = self.engine.get_function_address(name)
        # buffers, then the [lo, hi) bounds of the thread-split loop
        self.functions[name] = ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] * nargs), ctypes.c_int64, ctypes.c_int64)(addr)
      self.entries = {}
      self._method_defs = []
      for name in all_entries:
        mdef = _PyMethodDef(name.encode(), self.engine.get_function_address(name), _METH_FASTCALL, None)
        self._method_defs.append(mdef)
        # the builtin holds this program (its `self`), so the code and the method table outlive it
        self.entries[name] = _new_builtin(ctypes.addressof(mdef), self, None)

def module_text(source: str, entries: dict[str, str]) -> str:
  """One kernel module's IR with its launchers (`python_entry_ir`, `parallel_entry_ir`) and what they declare."""
  if not entries: return source
  source += "\ndeclare ptr @torch_uop_long_as_ptr(ptr)\n" + "\n".join(entries.values()) + "\n"
  if any("@GOMP_parallel(" in e for e in entries.values()): source += "\n".join(_OPENMP_DECLS) + "\n"
  return source


class ModuleCompiles:
  """Native objects of LLVM modules, compiled while the caller still generates the next ones. `add(text)` looks a
  module up in the disk cache and otherwise queues it; queued modules go to an idle helper process as soon as they
  make a batch of PARALLEL_MIN_BYTES of IR (a helper's round trip is paid per batch). `objects()` hands out the rest
  in balanced batches, waits, compiles in this process what no helper took (or what one failed on), stores the new
  objects in the disk cache and returns all of them in the order added.
  (Optimizing here costs memory that is never given back: llvmlite's pass builder leaves LLVM's instrumentation
  callbacks behind, about 80 KB per module; a helper's share goes when the helper is replaced.)"""

  def __init__(self, opt_level: int, disk_cache: bool = True):
    self.opt_level, self.disk_cache = opt_level, disk_cache
    self.cpu_name, self.features, _ = target_id()
    self.modules, self.keys, self.found = [], [], []
    self.queued: list[int] = []
    self.sent: list[tuple[list[int], _Pending, int]] = []  # (batch, its submit's replies, its place there)
    self.from_cache, self.optimized_ir = 0, None
    self.workers = compile_workers()

  def add_module(self, source: str, entries: dict[str, str]) -> None:
    """add() a kernel's module with its launchers (module_text)."""
    self.add(module_text(source, entries))

  def add(self, text: str) -> None:
    key = cache.key(text, *target_id(), str(self.opt_level))
    obj = cache.load(key) if self.disk_cache else None
    self.modules.append(text)
    self.keys.append(key)
    self.found.append(obj)
    if obj is not None:
      self.from_cache += 1
      return
    self.queued.append(len(self.modules) - 1)
    if sum(len(self.modules[i]) for i in self.queued) >= PARALLEL_MIN_BYTES and self.workers.idle():
      self._send([self.queued])
      self.queued = []

  def _send(self, batches: list[list[int]]) -> None:
    pending = self.workers.submit([([self.modules[i] for i in b], self.cpu_name, self.features, self.opt_level) for b in batches])
    self.sent += [(b, pending, n) for n, b in enumerate(batches)]

  def objects(self) -> list[bytes]:
    objects, optimized = list(self.found), []
    with progress.steps("LLVM", len(self.queued) + sum(len(b) for b, _, _ in self.sent), unit="module") as done:
      while self.queued or self.sent:
        if self.queued and (self.workers.idle() or not self.sent):
          self._send(balanced_batches([(i, len(self.modules[i])) for i in self.queued], max(self.workers.idle(), 1)))
          self.queued = []
          continue
        batch, pending, n = self.sent.pop(0)
        objs = pending.result(n)
        for j, i in enumerate(batch):
          if objs is None:
            obj, mod = compile_module(self.modules[i], self.cpu_name, self.features, self.opt_level)
            optimized.append(str(mod))
          else: obj = objs[j]
          objects[i] = obj
          if self.disk_cache: cache.store(self.keys[i], obj)
          done.update()
    if optimized: self.optimized_ir = "\n".join(optimized)  # None: nothing was optimized in this process
    return objects


# below this much LLVM IR to compile, everything compiles in the calling process: a helper would cost more than it saves
PARALLEL_MIN_BYTES = 40_000


def balanced_batches(items: list[tuple[object, int]], max_batches: int) -> list[list]:
  """(item, size) pairs grouped into at most `max_batches` batches of similar total size (largest first, each to
  the smallest batch), one batch when the whole is small; empty batches are dropped."""
  total = sum(size for _, size in items)
  n = max(1, min(max_batches, total // PARALLEL_MIN_BYTES, len(items)))
  batches, sizes = [[] for _ in range(n)], [0] * n
  for item, size in sorted(items, key=lambda it: -it[1]):
    k = sizes.index(min(sizes))
    batches[k].append(item)
    sizes[k] += size
  return [b for b in batches if b]


def compile_worker_count() -> int:
  """Helper processes for compiling modules side by side: TORCH_UOP_COMPILE_WORKERS, else one per core (at most
  8); 0 compiles everything in this process."""
  env = os.environ.get("TORCH_UOP_COMPILE_WORKERS")
  if env is not None: return max(int(env), 0)
  return min(os.cpu_count() or 1, 8)


class _Pending:
  """Replies of requests handed to helper processes: `result(i)` waits for request i's objects (None: it failed,
  or no helper took it)."""

  def __init__(self, n: int):
    self.objects, self.threads = [None] * n, []

  def result(self, i: int) -> list[bytes] | None:
    if i >= len(self.threads): return None
    self.threads[i].join()
    return self.objects[i]


class CompileWorkers:
  """Helper processes running runtime/llvm_worker.py, started on first use and kept for the process's life.
  One request per process at a time; a process that fails is dropped (its request is compiled by the caller),
  and after MAX_FAILURES of them no more are started (e.g. an interpreter that cannot run the helper). A helper
  that has compiled RECYCLE_MODULES modules is replaced by a fresh one, which gives back the memory LLVM kept."""

  MAX_FAILURES = 3
  RECYCLE_MODULES = 500

  def __init__(self, n: int):
    self.n, self.pid, self.procs, self.failures = n, os.getpid(), [], 0
    self.compiled: dict = {}  # helper pid -> modules it compiled
    self.busy: set = set()    # helpers with a request in flight (a request goes only to an idle one)
    self.lock = threading.Lock()

  def start(self) -> None:
    """Start the processes now (they load llvmlite while the caller generates code)."""
    with self.lock:
      self.procs = [p for p in self.procs if p.poll() is None]
      while len(self.procs) < self.n:
        cmd = [sys.executable, *(["-P"] if sys.version_info >= (3, 11) else []), llvm_worker.__file__]
        try:
          self.procs.append(subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL))
        except OSError:
          self.n = len(self.procs)
          break

  def idle(self) -> int:
    """How many helpers could take a request now (started or still to start)."""
    with self.lock: return self.n - len(self.busy)

  def submit(self, requests: list) -> _Pending:
    pending = _Pending(len(requests))
    if requests and self.n: self.start()
    with self.lock:
      idle = [p for p in self.procs if p not in self.busy]
      taken = idle[-len(requests):] if requests else []
      self.busy.update(taken)
    for i, request in enumerate(requests):
      if not taken: break  # the rest no helper takes: result() answers None, and the caller compiles them
      proc = taken.pop()
      t = threading.Thread(target=self._run, args=(proc, request, pending, i), daemon=True)
      pending.threads.append(t)
      t.start()
    return pending

  def _run(self, proc, request, pending: _Pending, i: int) -> None:
    try:
      write_message(proc.stdin, request)
      reply = read_message(proc.stdout)
    except (OSError, ValueError, EOFError):
      reply = None
    with self.lock: self.busy.discard(proc)
    if reply is not None and reply[0] == "ok":
      pending.objects[i] = reply[1]
      with self.lock:
        self.compiled[proc.pid] = self.compiled.get(proc.pid, 0) + len(request[0])
        retire = self.compiled[proc.pid] >= self.RECYCLE_MODULES and proc in self.procs
        if retire: self.procs.remove(proc)
      if retire:
        try: proc.stdin.close()  # it exits once its input ends; the next submit starts a fresh one
        except OSError: pass
    elif reply is None:  # no answer: the process is gone or broken, and is not used again
      proc.kill()
      with self.lock:
        if proc in self.procs: self.procs.remove(proc)
      self.failures += 1
      if self.failures >= self.MAX_FAILURES: self.n = 0

  def close(self) -> None:
    for p in self.procs:
      try: p.stdin.close()  # the worker exits at the end of its input
      except OSError: pass
    self.procs = []


_workers: CompileWorkers | None = None


def compile_workers() -> CompileWorkers:
  """This process's helper processes (a forked child gets its own, never its parent's pipes)."""
  global _workers
  if _workers is None or _workers.pid != os.getpid():
    _workers = CompileWorkers(compile_worker_count())
    atexit.register(_workers.close)
  return _workers


@functools.cache
def simd_lanes() -> int:
  """float32 lanes of the vector registers the kernels compile for (core/opt.py sizes register tiles by it)."""
  features = target_id()[1].split(",")
  if "+avx512f" in features and "-prefer-256-bit" in features: return 16
  if "+avx" in features or "+avx2" in features: return 8
  return 4  # SSE, NEON


@functools.cache
def vector_unit() -> VectorUnit:
  """The vector registers the kernels compile for: simd_lanes() float32 each; 32 of them with AVX-512 (at either
  width) or on AArch64, 16 with AVX or SSE; and the stack a kernel's local copies may take (stage_budget)."""
  features = target_id()[1].split(",")
  many = "+avx512f" in features or platform.machine().lower() in ("aarch64", "arm64")
  return VectorUnit(simd_lanes(), 32 if many else 16, stage_budget())


_SIZE_UNITS = {"B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
DEFAULT_THREAD_STACK = 2 << 20  # glibc's stack for new threads on x86_64 and AArch64 where RLIMIT_STACK is unlimited


def _omp_size(text: str) -> int | None:
  """An OMP_STACKSIZE value in bytes: a number with an optional B, K, M or G suffix (kilobytes without one)."""
  text = text.strip().upper()
  unit = _SIZE_UNITS.get(text[-1:], None)
  number = text[:-1] if unit else text
  return int(number) * (unit or 1024) if number.strip().isdigit() else None


def thread_stack_bytes() -> int:
  """The smallest stack a thread running kernels may have: OpenMP's threads take OMP_STACKSIZE (or libgomp's
  GOMP_STACKSIZE, in kilobytes) where set; runtime/threads.py's pool, threading.stack_size() where set; the rest, and
  the main thread, RLIMIT_STACK (glibc's default for new threads too; 2 MiB where it is unlimited)."""
  sizes = []
  for name in ("OMP_STACKSIZE", "GOMP_STACKSIZE"):
    size = _omp_size(os.environ[name]) if os.environ.get(name) else None
    if size: sizes.append(size)
  if threading.stack_size(): sizes.append(threading.stack_size())
  try:
    import resource
    soft = resource.getrlimit(resource.RLIMIT_STACK)[0]
    sizes.append(DEFAULT_THREAD_STACK if soft == resource.RLIM_INFINITY else soft)
  except (ImportError, OSError, ValueError):
    sizes.append(DEFAULT_THREAD_STACK)
  return min(sizes)


def stage_budget() -> int:
  """The bytes a kernel may copy into local arrays on its thread's stack: a quarter of the smallest stack a thread
  running it may have, at most STAGE_MAX_BYTES (a kernel past the stack would crash the process)."""
  return min(STAGE_MAX_BYTES, thread_stack_bytes() // 4)


@functools.cache
def target_id() -> tuple[str, str, str]:
  """What native code depends on besides its IR: the host CPU, its features and the LLVM version."""
  _init_llvm()
  features = llvm.get_host_cpu_features().flatten()
  # LLVM's tuning for AVX-512 CPUs prefers 256-bit vectors (older cores slowed their clock for 512-bit ones), which
  # halves a GEMM's FMA width; the kernels here are long arithmetic loops, where 512-bit vectors pay
  if "+avx512f" in features.split(",") and os.environ.get("TORCH_UOP_AVX512", "1") != "0": features += ",-prefer-256-bit"
  # no vector gathers: on an Intel Emerald Rapids (LLVM 22, -O3) the masked gathers LLVM made for a fractional max
  # pool's index kernel read wrong elements (every index the "none found" sentinel), and where they are right they are
  # slow (microcoded on Zen, under the Downfall mitigation on older Intel cores); loads stay scalar, the math SIMD
  if "+avx2" in features.split(","): features += ",+prefer-no-gather"
  return (llvm.get_host_cpu_name(), features, llvm.__name__ + repr(getattr(llvm, "llvm_version_info", ("?",))))
