"""Kernel optimizer: choose per-kernel opts before codegen.

`KernelOpts` says how to shape one kernel's loops:
- `upcast`: output axis -> factor. The axis' loop steps by `factor` and the body is replicated for
  each of the `factor` positions, so values that do not depend on that axis (a matmul's other
  operand) are loaded once and reused from registers. This is the register blocking of GEMM and
  convolution: a 4x4 tile of outputs shares 4+4 loads per reduction step instead of 16+16.
- `split_axis`: the output axis whose iterations are divided among CPU threads (the outermost loop
  left with at least two iterations); the kernel takes its bounds as arguments.

`heuristic_opts(item, plain_ast)` picks them from the kernel as first built: upcast the (at most two)
output axes along which some load is invariant, when the kernel reduces. It reads shapes and index
expressions only; it never runs anything.
"""
from __future__ import annotations
from dataclasses import dataclass, field
from torch_uop.core.uop import UOp, Ops


@dataclass(frozen=True)
class KernelOpts:
  upcast: tuple = ()          # ((axis, factor), ...)
  split_axis: int | None = None

  def factor(self, axis: int) -> int: return dict(self.upcast).get(axis, 1)


UPCAST_FACTOR = 4
MAX_UPCAST_AXES = 2


def _depends_on(u: UOp, r: UOp, cache: dict) -> bool:
  key = (u, r)
  if key not in cache: cache[key] = u is r or any(_depends_on(s, r, cache) for s in u.src)
  return cache[key]


def heuristic_opts(out_shape: tuple, plain_ast: UOp) -> KernelOpts:
  nodes = plain_ast.toposort()
  ranges = {n.arg[0]: n for n in nodes if n.op is Ops.RANGE and n.arg[1] == "global"}
  has_reduce = any(n.op is Ops.REDUCE for n in nodes)
  upcast = []
  if has_reduce:
    loads = [n for n in nodes if n.op is Ops.LOAD]
    cache: dict = {}
    # axes (innermost first) along which some load's address does not move: upcasting them reuses it
    for axis in sorted(ranges, reverse=True):
      size = out_shape[axis]
      if size < UPCAST_FACTOR or size % UPCAST_FACTOR: continue
      r = ranges[axis]
      if any(not _depends_on(ld.src[1], r, cache) for ld in loads) and any(_depends_on(ld.src[1], r, cache) for ld in loads):
        upcast.append((axis, UPCAST_FACTOR))
      if len(upcast) == MAX_UPCAST_AXES: break
  factors = dict(upcast)
  split = next((a for a in range(len(out_shape)) if out_shape[a] // factors.get(a, 1) >= 2), None)
  return KernelOpts(tuple(sorted(upcast)), split)
