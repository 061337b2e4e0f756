"""BEAM search, run: time each candidate of a kernel's opts on this machine and remember the winner.

`beam_search(item, width, opt_level)` takes a scheduled kernel and returns the `KernelOpts` to build it with, or
None for the heuristic's. core/search.py walks the candidates; here each is built, compiled with llvmlite (or as
the device's C on OpenCL and CUDA), run on scratch buffers of the kernel's shapes, strides and dtypes (random
data, in the device's memory) and timed; a candidate whose output differs from the heuristic's is rejected. The
winner is kept in the tuning store (runtime/cache.py) under the kernel's identity (its plain LLVM IR, or the
device's source and name), the CPU, the thread count, the beam width, the torch_uop version and a digest of the
optimizer's sources, so a later process skips the search.
"""
from __future__ import annotations
import contextlib
import functools
import json
import math
import sys
import time
import hashlib
import torch
from torch.utils._python_dispatch import _disable_current_modes
import torch_uop
from torch_uop.core import codegen, opt, search
from torch_uop.core.codegen import build_kernel, kernel_work
from torch_uop.core.opt import KernelOpts, heuristic_opts, gpu_opts
from torch_uop.core.renderer import llvmir, cstyle
from torch_uop.core.renderer.llvmir import LLVMRenderer
from torch_uop.core.renderer.cstyle import launch_items
from torch_uop.core.uop import Ops
from torch_uop.torch_dtypes import to_torch
from torch_uop.runtime import cache, threads
from torch_uop.runtime.cpu import CPUProgram, target_id, vector_unit
from torch_uop.runtime.devices import CPU
from torch_uop import counters as _metrics, log

_log = log.get("search")

TIME_PER_CANDIDATE_S = 0.05  # timing runs stop once this much was spent (after at least MIN_RUNS)
MIN_RUNS, MAX_RUNS = 3, 20
CONFIRM_RUNS, CONFIRM_S = 10, 0.3  # the final heuristic-vs-best check: alternate runs, up to this many or seconds


def _scratch(info, device=None):
  """A buffer of this BufferInfo's shape, strides and dtype, filled with random values."""
  dt = to_torch(info.dtype)
  t = torch.empty_strided(info.shape, info.strides, dtype=dt, device=device)
  if dt.is_floating_point: t.copy_(torch.randn(info.shape))
  elif dt is torch.bool: t.copy_(torch.rand(info.shape) < 0.5)
  else: t.copy_(torch.randint(0, 4, info.shape))  # small values: valid indices, shifts and divisors stay tame
  return t


class _Bench:
  """Compiles candidates of one kernel and times them on shared scratch buffers."""

  def __init__(self, item, opt_level: int, target=None):
    self.item, self.opt_level, self.target = item, opt_level, target or CPU
    state = torch.random.get_rng_state()
    torch.manual_seed(0)
    try:
      with _one_torch_thread():
        self.buffers = {s: _scratch(info, self.target.torch_device) for s, info in item.buffers.items()}
    finally:
      torch.random.set_rng_state(state)
    self.reference = None  # the heuristic's output
    self.launchers: dict = {}  # opts -> (program, launch()) of each correct candidate

  def run(self, opts: KernelOpts, cutoff: float = math.inf) -> float | None:
    """Seconds one call of the kernel built with `opts` takes (min over runs), or None if it failed or was wrong.
    A first run slower than `cutoff` is not repeated."""
    ptrs = None
    try:
      if self.target.kind == "gpu":
        prog, launch = self._device_launch(opts)
      else:
        k = build_kernel(self.item, "tune", opts)
        prog = CPUProgram(LLVMRenderer().render(k), {k.name: len(k.buffers)}, self.opt_level, disk_cache=False)
        fn, ptrs = prog.functions[k.name], [self.buffers[s].data_ptr() for s in k.buffers]
    except Exception:
      return None
    if ptrs is not None:
      n_threads = threads.max_threads(k.split_size, kernel_work(k))
      launch = lambda: threads.launch(fn, ptrs, k.split_size, n_threads)
    out = self.buffers[self.item.out_slot]
    with _one_torch_thread():  # torch's own small ops crawl when its threads fight ours for the cores
      out.fill_(float("nan") if out.dtype.is_floating_point else 0x5A if out.dtype is not torch.bool else True)
    best = _timed(launch)
    with _one_torch_thread():
      if self.reference is None: self.reference = out.clone()
      elif not _same(out, self.reference): return None
    self.launchers[opts] = (prog, launch)  # the program owns the code `launch` calls
    spent, runs = best, 1
    while best < cutoff and (runs < MIN_RUNS or (runs < MAX_RUNS and spent < TIME_PER_CANDIDATE_S)):
      dt = _timed(launch)
      best, spent, runs = min(best, dt), spent + dt, runs + 1
    return best

  def _device_launch(self, opts: KernelOpts):
    """(program, launch()) of the kernel built with `opts` for a GPU-style target; launch() waits for the kernel."""
    target = self.target
    k = build_kernel(self.item, "tune", opts, "gpu")
    prog = target.program(target.renderer().render_program(k), [k.name])
    run = prog.launcher(k.name, [self.item.buffers[s].nbytes for s in k.buffers], launch_items(k.program), k.local_size)
    ptrs = [self.buffers[s].data_ptr() for s in k.buffers]
    wait = getattr(prog, "synchronize", None) or (lambda: torch.cuda.synchronize(target.torch_device))
    def launch():
      run(*ptrs)
      wait()
    return prog, launch

  def confirm(self, a: KernelOpts, b: KernelOpts) -> tuple[float, float]:
    """Both candidates timed again, alternately, so that a load change on the machine hits both alike."""
    ta, tb, spent, runs = math.inf, math.inf, 0.0, 0
    while runs < MIN_RUNS or (runs < CONFIRM_RUNS and spent < CONFIRM_S):
      da, db = _timed(self.launchers[a][1]), _timed(self.launchers[b][1])
      ta, tb, spent, runs = min(ta, da), min(tb, db), spent + da + db, runs + 1
    return ta, tb


def _timed(launch) -> float:
  t0 = time.perf_counter()
  launch()
  return time.perf_counter() - t0


@contextlib.contextmanager
def _one_torch_thread():
  n = torch.get_num_threads()
  torch.set_num_threads(1)
  try:
    yield
  finally:
    torch.set_num_threads(n)


def _same(a, b) -> bool:
  if a.dtype.is_floating_point:
    a, b = a.double(), b.double()
    scale = 1.0 + float(b.nan_to_num(0, 0, 0).abs().max()) if b.numel() else 1.0
    return bool(torch.allclose(a, b, rtol=1e-3, atol=1e-4 * scale, equal_nan=True))
  return bool(torch.equal(a, b))


def _tuning_key(item, width: int, opt_level: int, target=None) -> str:
  if target is not None and target.kind == "gpu":
    k = build_kernel(item, "k", KernelOpts(), "gpu")
    source = target.renderer().render_program(k)
    return cache.key("beam", target.name, target.describe(), source, f"width={width}", torch_uop.__version__,
                     _optimizer_sources())
  k = build_kernel(item, "k", KernelOpts())
  cpu_name, features, _ = target_id()
  return cache.key("beam", LLVMRenderer().render(k), cpu_name, features, f"threads={torch.get_num_threads()}", f"width={width}",
                   f"opt={opt_level}", torch_uop.__version__, _optimizer_sources())


@functools.cache
def _optimizer_sources() -> str:
  """A digest of the code that decides what an opt means and which opts exist: a change there retunes."""
  h = hashlib.sha256()
  for mod in (codegen, opt, llvmir, cstyle, search, sys.modules[__name__]):
    with open(mod.__file__, "rb") as f: h.update(f.read())
  return h.hexdigest()


def _opts_from_json(d: dict) -> KernelOpts:
  return KernelOpts(tuple((int(a), int(f)) for a, f in d["upcast"]), d["split_axis"], d["vector_axis"], int(d.get("group", 0)),
                    tuple(int(a) for a in d.get("loop_order", ())))


def beam_search(item, width: int, opt_level: int = 3, name: str = "", target=None) -> KernelOpts | None:
  """The opts to build `item` with for `target` (None: the CPU): the tuned winner, or None (build with the heuristic)."""
  with _disable_current_modes():  # compiling runs under Dynamo's fake-tensor mode; scratch buffers must be real
    try:
      return _beam_search(item, width, opt_level, name, target)
    except Exception as e:  # a kernel the search cannot run (e.g. overlapping scratch layouts) keeps the heuristic
      _log.info("beam %s: not searched (%s: %s)", name, type(e).__name__, e)
      return None


def _beam_search(item, width: int, opt_level: int, name: str, target=None) -> KernelOpts | None:
  gpu = target is not None and target.kind == "gpu"
  plain = search.plain_ast(item, 0 if gpu else vector_unit().stage_bytes, gpu)
  if not search.searchable(item, plain): return None
  st = _metrics.state()
  key = _tuning_key(item, width, opt_level, target)
  hit = cache.load_tuning(key)
  if hit is not None:
    try:
      opts = _opts_from_json(json.loads(hit))
      st["search_cache_hits"] += 1
      return opts
    except (ValueError, KeyError, TypeError):
      pass
  t_start = time.perf_counter()
  shape = item.root.shape
  reduces = any(n.op is Ops.REDUCE for n in plain.toposort())
  if gpu:
    max_group = target.max_group()
    heuristic = gpu_opts(shape, plain, max_group, target.parallelism())
    step = lambda o: search.gpu_neighbours(o, shape, reduces, max_group)
  else:
    heuristic = heuristic_opts(shape, plain, vector_unit())
    step = lambda o: search.neighbours(o, shape, reduces)
  bench = _Bench(item, opt_level, target)
  found = search.search(heuristic, step, bench.run, bench.confirm, width)
  if found is None: return None
  winner, t_heuristic, t_best, best, candidates = found
  st["kernels_searched"] += 1
  _log.info("beam %s: %d candidates in %.2fs, heuristic %.1fus %s, best %.1fus %s, chosen %s", name, candidates,
            time.perf_counter() - t_start, t_heuristic * 1e6, heuristic, t_best * 1e6, best, winner)
  record = {"upcast": winner.upcast, "split_axis": winner.split_axis, "vector_axis": winner.vector_axis, "group": winner.group,
            "loop_order": winner.loop_order,
            "time_s": t_best if winner != heuristic else t_heuristic, "heuristic_time_s": t_heuristic, "candidates": candidates}
  cache.store_tuning(key, json.dumps(record))
  return winner
