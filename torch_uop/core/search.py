"""BEAM search: choose one kernel's opts by compiling and timing candidates.

`beam_search(item, width, opt_level)` takes a scheduled kernel and returns the `KernelOpts` to build it
with. It starts from the heuristic's opts (core/opt.py); each round it derives every neighbour of the
`width` fastest opts found so far (an axis upcast twice or half as far, another SIMD axis, another
thread-split axis), compiles each with llvmlite, runs it on scratch buffers of the kernel's shapes,
strides and dtypes (random data) and keeps the fastest `width`. A candidate whose output differs from
the heuristic's is rejected. The search stops when a round finds nothing faster, after `MAX_SEARCH_S`
seconds or after `MAX_CANDIDATES` candidates; the best is then timed again alternately with the
heuristic and wins only if it is still faster by `MIN_GAIN`. The winner is kept in the tuning store
(runtime/cache.py) under the kernel's identity (its plain LLVM IR), the CPU, the thread count, the
beam width, the torch_uop version and a digest of the optimizer's sources, so a later process skips
the search.

Small kernels, and kernels with data-dependent loops (random data could make them run for ever), keep
the heuristic. This module times native code: it is the one part of core/ that runs anything.

Per device (`target`, runtime/devices.py): on OpenCL and CUDA the search starts from `gpu_opts` and its
neighbours are another group size for a reduction (0 = none, or a power of two within the device's limit) and
register blocking of at most GPU_UPCAST per axis; candidates are rendered as the device's C, built for it and
timed there on scratch buffers in the device's memory. The tuning key then names the device.
"""
from __future__ import annotations
import contextlib
import functools
import json
import math
import sys
import time
from torch_uop.core.opt import KernelOpts, heuristic_opts, gpu_opts, GPU_UPCAST
from torch_uop.core.uop import Ops
from torch_uop import counters as _metrics, log

_log = log.get("search")

MAX_SEARCH_S = 10.0      # per kernel, compile and timing together
MAX_CANDIDATES = 40      # per kernel, the heuristic's and the plain kernel's opts included
MIN_WORK = 1 << 16       # kernels with fewer output elements x reduce steps keep the heuristic
UPCAST_FACTORS = (2, 4, 8, 16)
MAX_AXIS_UPCAST = 32     # the most one axis is upcast by
MAX_TOTAL_UPCAST = 128   # the most stores (accumulators) one loop iteration has
MAX_UPCAST_AXES = 3
TIME_PER_CANDIDATE_S = 0.05  # timing runs stop once this much was spent (after at least MIN_RUNS)
MIN_RUNS, MAX_RUNS = 3, 20
MIN_GAIN = 0.05          # a winner must beat the heuristic by this fraction, else the heuristic stays (noise)
CONFIRM_RUNS, CONFIRM_S = 10, 0.3  # the final heuristic-vs-best check: alternate runs, up to this many or seconds


def _plain_ast(item, gpu: bool = False):
  from torch_uop.core.codegen import _kernel_ast
  if gpu: return _kernel_ast(item, KernelOpts(), "off")[0]
  from torch_uop.runtime.cpu import vector_unit
  return _kernel_ast(item, KernelOpts(), "plan", vector_unit().stage_bytes)[0]


def _default_split(shape: tuple, upcast: tuple) -> int | None:
  factors = dict(upcast)
  return next((a for a in range(len(shape)) if shape[a] // factors.get(a, 1) >= 2), None)


def neighbours(opts: KernelOpts, shape: tuple, reduces: bool) -> list[KernelOpts]:
  """Opts one step away from `opts`: one axis upcast further or less, another SIMD axis, another split axis."""
  out = []
  factors = dict(opts.upcast)
  total = math.prod(factors.values())

  def with_upcast(axis: int, new: int) -> KernelOpts:
    upcast = tuple(sorted((a, f) for a, f in {**factors, axis: new}.items() if f > 1))
    keep_split = opts.split_axis is not None and shape[opts.split_axis] // dict(upcast).get(opts.split_axis, 1) >= 2
    vector_axis = opts.vector_axis if opts.vector_axis in dict(upcast) else None
    return KernelOpts(upcast, opts.split_axis if keep_split else _default_split(shape, upcast), vector_axis)

  for axis, size in enumerate(shape):
    if size == 1: continue
    for f in UPCAST_FACTORS:
      new = factors.get(axis, 1) * f
      if size % new or new > MAX_AXIS_UPCAST or total * f > MAX_TOTAL_UPCAST: continue
      if axis not in factors and len(factors) >= MAX_UPCAST_AXES: continue
      out.append(with_upcast(axis, new))
    if axis in factors: out.append(with_upcast(axis, factors[axis] // 2))
  if reduces:  # SIMD along an upcast output axis (the reduce loop then stays scalar), or along the reduction
    for axis in [None, *factors]:
      if axis != opts.vector_axis: out.append(KernelOpts(opts.upcast, opts.split_axis, axis))
  for axis, size in enumerate(shape):
    if axis != opts.split_axis and size // factors.get(axis, 1) >= 2:
      out.append(KernelOpts(opts.upcast, axis, opts.vector_axis))
  return out


def gpu_neighbours(opts: KernelOpts, shape: tuple, reduces: bool, max_group: int) -> list[KernelOpts]:
  """GPU-style opts one step away: another group size (a reduction), or one axis upcast twice or half as far."""
  out = []
  if reduces:
    for g in (0, 32, 64, 128, 256):
      if g != opts.group and g <= max_group: out.append(KernelOpts(() if g else opts.upcast, None, None, g))
  if opts.group: return out
  factors = dict(opts.upcast)
  for axis, size in enumerate(shape):
    f = factors.get(axis, 1)
    for new in (f * 2, f // 2):
      if new < 1 or new > GPU_UPCAST or new == f or not isinstance(size, int) or size % new: continue
      upcast = tuple(sorted((a, x) for a, x in {**factors, axis: new}.items() if x > 1))
      if len(upcast) <= 2: out.append(KernelOpts(upcast))
  return out


def _scratch(info, torch, device=None):
  """A buffer of this BufferInfo's shape, strides and dtype, filled with random values."""
  from torch_uop.core.dtypes import to_torch
  dt = to_torch(info.dtype)
  t = torch.empty_strided(info.shape, info.strides, dtype=dt, device=device)
  if dt.is_floating_point: t.copy_(torch.randn(info.shape))
  elif dt is torch.bool: t.copy_(torch.rand(info.shape) < 0.5)
  else: t.copy_(torch.randint(0, 4, info.shape))  # small values: valid indices, shifts and divisors stay tame
  return t


class _Bench:
  """Compiles candidates of one kernel and times them on shared scratch buffers."""

  def __init__(self, item, opt_level: int, target=None):
    import torch
    from torch_uop.runtime.devices import CPU
    self.item, self.opt_level, self.torch, self.target = item, opt_level, torch, target or CPU
    state = torch.random.get_rng_state()
    torch.manual_seed(0)
    try:
      with _one_torch_thread(torch):
        self.buffers = {s: _scratch(info, torch, self.target.torch_device) for s, info in item.buffers.items()}
    finally:
      torch.random.set_rng_state(state)
    self.reference = None  # the heuristic's output
    self.launchers: dict = {}  # opts -> (program, launch()) of each correct candidate

  def run(self, opts: KernelOpts, cutoff: float = math.inf) -> float | None:
    """Seconds one call of the kernel built with `opts` takes (min over runs), or None if it failed or was wrong.
    A first run slower than `cutoff` is not repeated."""
    from torch_uop.core.codegen import build_kernel
    from torch_uop.core.renderer.llvmir import render_kernel
    from torch_uop.runtime.cpu import CPUProgram
    from torch_uop.runtime import threads
    from torch_uop.pipeline import kernel_work
    torch = self.torch
    ptrs = None
    try:
      if self.target.kind == "gpu":
        prog, launch = self._device_launch(opts)
      else:
        k = build_kernel(self.item, "tune", opts)
        prog = CPUProgram(render_kernel(k), {k.name: len(k.buffers)}, self.opt_level, disk_cache=False)
        fn, ptrs = prog.functions[k.name], [self.buffers[s].data_ptr() for s in k.buffers]
    except Exception:
      return None
    if ptrs is not None:
      n_threads = threads.max_threads(k.split_size, kernel_work(k))
      launch = lambda: threads.launch(fn, ptrs, k.split_size, n_threads)
    out = self.buffers[self.item.out_slot]
    with _one_torch_thread(torch):  # torch's own small ops crawl when its threads fight ours for the cores
      out.fill_(float("nan") if out.dtype.is_floating_point else 0x5A if out.dtype is not torch.bool else True)
    best = _timed(launch)
    with _one_torch_thread(torch):
      if self.reference is None: self.reference = out.clone()
      elif not _same(out, self.reference, torch): return None
    self.launchers[opts] = (prog, launch)  # the program owns the code `launch` calls
    spent, runs = best, 1
    while best < cutoff and (runs < MIN_RUNS or (runs < MAX_RUNS and spent < TIME_PER_CANDIDATE_S)):
      dt = _timed(launch)
      best, spent, runs = min(best, dt), spent + dt, runs + 1
    return best

  def _device_launch(self, opts: KernelOpts):
    """(program, launch()) of the kernel built with `opts` for a GPU-style target; launch() waits for the kernel."""
    from torch_uop.core.codegen import build_kernel
    from torch_uop.core.renderer.cstyle import launch_items
    from torch_uop.runtime.executor import _nbytes
    target, torch = self.target, self.torch
    k = build_kernel(self.item, "tune", opts, "gpu")
    renderer = target.renderer()
    prog = target.program(renderer.program_source([renderer.render_kernel(k.name, k.program, k.argument_ids, k.local_size)]), [k.name])
    run = prog.launcher(k.name, [_nbytes(self.item.buffers[s]) for s in k.buffers], launch_items(k.program), k.local_size)
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
def _one_torch_thread(torch):
  n = torch.get_num_threads()
  torch.set_num_threads(1)
  try:
    yield
  finally:
    torch.set_num_threads(n)


def _same(a, b, torch) -> bool:
  if a.dtype.is_floating_point:
    a, b = a.double(), b.double()
    scale = 1.0 + float(b.nan_to_num(0, 0, 0).abs().max()) if b.numel() else 1.0
    return bool(torch.allclose(a, b, rtol=1e-3, atol=1e-4 * scale, equal_nan=True))
  return bool(torch.equal(a, b))


def _searchable(item, plain) -> bool:
  nodes = plain.toposort()
  if any(n.op in (Ops.LOOP, Ops.LOOP_VAR) for n in nodes): return False
  if any(st < 0 for info in item.buffers.values() for st in info.strides): return False
  if any(math.prod(info.shape) == 0 for info in item.buffers.values()): return False
  reduce_size = 1
  for r in next((n.src[1:] for n in nodes if n.op is Ops.REDUCE), ()): reduce_size *= r.src[0].arg
  return math.prod(item.root.shape) * reduce_size >= MIN_WORK


def _tuning_key(item, width: int, opt_level: int, target=None) -> str:
  import torch
  if target is not None and target.kind == "gpu":
    from torch_uop.core.codegen import build_kernel
    from torch_uop.runtime import cache
    import torch_uop
    k = build_kernel(item, "k", KernelOpts(), "gpu")
    source = target.renderer().render(k.name, k.program, k.argument_ids)
    return cache.key("beam", target.name, target.describe(), source, f"width={width}", torch_uop.__version__,
                     _optimizer_sources())
  import torch_uop
  from torch_uop.core.codegen import build_kernel
  from torch_uop.core.renderer.llvmir import render_kernel
  from torch_uop.runtime import cache
  from torch_uop.runtime.cpu import target_id
  k = build_kernel(item, "k", KernelOpts())
  cpu_name, features, _ = target_id()
  return cache.key("beam", render_kernel(k), cpu_name, features, f"threads={torch.get_num_threads()}", f"width={width}",
                   f"opt={opt_level}", torch_uop.__version__, _optimizer_sources())


@functools.cache
def _optimizer_sources() -> str:
  """A digest of the code that decides what an opt means and which opts exist: a change there retunes."""
  import hashlib
  import torch_uop.core.codegen, torch_uop.core.opt, torch_uop.core.renderer.llvmir, torch_uop.core.renderer.cstyle  # noqa: E401
  h = hashlib.sha256()
  for mod in (torch_uop.core.codegen, torch_uop.core.opt, torch_uop.core.renderer.llvmir, torch_uop.core.renderer.cstyle,
              sys.modules[__name__]):
    with open(mod.__file__, "rb") as f: h.update(f.read())
  return h.hexdigest()


def _opts_from_json(d: dict) -> KernelOpts:
  return KernelOpts(tuple((int(a), int(f)) for a, f in d["upcast"]), d["split_axis"], d["vector_axis"], int(d.get("group", 0)),
                    tuple(int(a) for a in d.get("loop_order", ())))


def beam_search(item, width: int, opt_level: int = 3, name: str = "", target=None) -> KernelOpts | None:
  """The opts to build `item` with for `target` (None: the CPU): the tuned winner, or None (build with the heuristic)."""
  from torch.utils._python_dispatch import _disable_current_modes
  with _disable_current_modes():  # compiling runs under Dynamo's fake-tensor mode; scratch buffers must be real
    try:
      return _beam_search(item, width, opt_level, name, target)
    except Exception as e:  # a kernel the search cannot run (e.g. overlapping scratch layouts) keeps the heuristic
      _log.info("beam %s: not searched (%s: %s)", name, type(e).__name__, e)
      return None


def _beam_search(item, width: int, opt_level: int, name: str, target=None) -> KernelOpts | None:
  from torch_uop.runtime import cache
  gpu = target is not None and target.kind == "gpu"
  plain = _plain_ast(item, gpu)
  if not _searchable(item, plain): return None
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
    step = lambda o: gpu_neighbours(o, shape, reduces, max_group)
  else:
    from torch_uop.runtime.cpu import vector_unit
    heuristic = heuristic_opts(shape, plain, vector_unit())
    step = lambda o: neighbours(o, shape, reduces)
  bench = _Bench(item, opt_level, target)
  timed: dict[KernelOpts, float | None] = {heuristic: bench.run(heuristic)}
  if timed[heuristic] is None: return None  # the heuristic itself does not build: nothing to compare against
  beam = [heuristic]
  best = timed[heuristic]

  def out_of_budget() -> bool:  # stop before a candidate that would likely overrun the time budget
    spent = time.perf_counter() - t_start
    return len(timed) >= MAX_CANDIDATES or spent + spent / len(timed) > MAX_SEARCH_S

  while True:
    fresh = [c for b in beam for c in [b, *step(b)] if c not in timed]
    for c in dict.fromkeys(fresh):
      if out_of_budget(): break
      timed[c] = bench.run(c, cutoff=2 * best)
    ranked = sorted((t, i, o) for i, (o, t) in enumerate(timed.items()) if t is not None)
    beam = [o for _, _, o in ranked[:width]]
    improved = ranked[0][0] < best
    best = ranked[0][0]
    if not improved or out_of_budget(): break
  winner, t_heuristic, t_best = heuristic, timed[heuristic], timed[heuristic]
  if beam[0] != heuristic:
    t_heuristic, t_best = bench.confirm(heuristic, beam[0])
    if t_best < t_heuristic * (1 - MIN_GAIN): winner = beam[0]
  st["kernels_searched"] += 1
  _log.info("beam %s: %d candidates in %.2fs, heuristic %.1fus %s, best %.1fus %s, chosen %s", name, len(timed),
            time.perf_counter() - t_start, t_heuristic * 1e6, heuristic, t_best * 1e6, beam[0], winner)
  record = {"upcast": winner.upcast, "split_axis": winner.split_axis, "vector_axis": winner.vector_axis, "group": winner.group,
            "loop_order": winner.loop_order,
            "time_s": t_best if winner != heuristic else t_heuristic, "heuristic_time_s": t_heuristic, "candidates": len(timed)}
  cache.store_tuning(key, json.dumps(record))
  return winner
