"""BEAM search over one kernel's opts: which candidates exist and how the beam walks them.

`search(heuristic, step, run, confirm, width)` starts from the heuristic's opts (core/opt.py); each round it derives
every neighbour (`step`: `neighbours` on the CPU, an axis upcast twice or half as far, another SIMD axis, another
thread-split axis; `gpu_neighbours` on OpenCL and CUDA, another group size or register blocking of at most
GPU_UPCAST per axis) of the `width` fastest opts found so far, has each timed (`run`: seconds, or None for a
candidate that failed or computed something else than the heuristic) and keeps the fastest `width`. It stops when a
round finds nothing faster, after `MAX_SEARCH_S` seconds or after `MAX_CANDIDATES` candidates; the best is then timed
again alternately with the heuristic (`confirm`) and wins only if it is still faster by `MIN_GAIN`.

Nothing here compiles or runs a kernel: runtime/tuning.py builds, times and caches the candidates
(`beam_search`). `searchable` says which kernels are worth it: small kernels, and kernels with data-dependent loops
(random data could make them run for ever), keep the heuristic.
"""
from __future__ import annotations
import math
import time
from torch_uop.core.opt import KernelOpts, GPU_UPCAST
from torch_uop.core.uop import Ops
from torch_uop.core.codegen import kernel_ast

MAX_SEARCH_S = 10.0      # per kernel, compile and timing together
MAX_CANDIDATES = 40      # per kernel, the heuristic's and the plain kernel's opts included
MIN_WORK = 1 << 16       # kernels with fewer output elements x reduce steps keep the heuristic
UPCAST_FACTORS = (2, 4, 8, 16)
MAX_AXIS_UPCAST = 32     # the most one axis is upcast by
MAX_TOTAL_UPCAST = 128   # the most stores (accumulators) one loop iteration has
MAX_UPCAST_AXES = 3
MIN_GAIN = 0.05          # a winner must beat the heuristic by this fraction, else the heuristic stays (noise)


def plain_ast(item, stage_bytes: int = 0, gpu: bool = False):
  """The kernel's AST without opts, as the heuristic reads it (`stage_bytes`: the CPU's VectorUnit.stage_bytes)."""
  if gpu: return kernel_ast(item, KernelOpts(), "off")[0]
  return kernel_ast(item, KernelOpts(), "plan", stage_bytes)[0]


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


def searchable(item, plain) -> bool:
  """Whether a kernel is worth searching (see the module docstring)."""
  nodes = plain.toposort()
  if any(n.op in (Ops.LOOP, Ops.LOOP_VAR) for n in nodes): return False
  if any(st < 0 for info in item.buffers.values() for st in info.strides): return False
  if any(math.prod(info.shape) == 0 for info in item.buffers.values()): return False
  reduce_size = 1
  for r in next((n.src[1:] for n in nodes if n.op is Ops.REDUCE), ()): reduce_size *= r.src[0].arg
  return math.prod(item.root.shape) * reduce_size >= MIN_WORK


def search(heuristic, step, run, confirm, width: int):
  """-> (winner, heuristic's seconds, best's seconds, the best candidate, candidates timed), or None where the
  heuristic's own kernel fails to run; see the module docstring. `run(opts, cutoff)`: seconds one call takes (a run
  slower than `cutoff` need not be repeated), or None."""
  t_start = time.perf_counter()
  timed: dict = {heuristic: run(heuristic, math.inf)}
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
      timed[c] = run(c, 2 * best)
    ranked = sorted((t, i, o) for i, (o, t) in enumerate(timed.items()) if t is not None)
    beam = [o for _, _, o in ranked[:width]]
    improved = ranked[0][0] < best
    best = ranked[0][0]
    if not improved or out_of_budget(): break
  winner, t_heuristic, t_best = heuristic, timed[heuristic], timed[heuristic]
  if beam[0] != heuristic:
    t_heuristic, t_best = confirm(heuristic, beam[0])
    if t_best < t_heuristic * (1 - MIN_GAIN): winner = beam[0]
  return winner, t_heuristic, t_best, beam[0], len(timed)
