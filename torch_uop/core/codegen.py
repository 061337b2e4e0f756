"""Codegen: one scheduled kernel -> kernel UOp graph -> linear UOp program.

`build_kernel` evaluates the kernel's tensor expression at symbolic loop indices: movement ops
become index arithmetic (through ShapeTracker), realized nodes and inputs become LOADs,
fused reductions become REDUCE over their own RANGEs, and the root becomes a STORE. The result is
simplified with the symbolic rules. A register tile is built once at stand-in lanes and instantiated per position;
along a SIMD axis whose accesses allow it, per vector: its lanes stay one stand-in (`vector_lane`) that the renderer
writes as vectors. `linearize` orders that graph into one list: output loops,
then for a reduction its accumulator, reduce loops, update and loop end, then the epilogue and store.
An `LT.loop` becomes a RANGE whose trip count is a value, with its state in accumulators (DEFINE_ACC
with an initial value, plain ASSIGNs, an optional BREAK_UNLESS), placed where its result is first read.
Nothing here knows about LLVM or torch.
"""
from __future__ import annotations
import itertools
import math
from dataclasses import dataclass
from typing import NamedTuple
import dataclasses
from torch_uop.core.uop import UOp, Ops, UPat, PatternMatcher, ELEMENTWISE, STAGED, toposort, graph_rewrite, substitute, const_key, AxisKind, RangeArg, KernelLoopVar
from torch_uop.core.dtypes import DType, dtypes
from torch_uop.core.shapetracker import unflatten, contiguous_strides
from torch_uop.core.symbolic import simplify, simplify_within, range_limits, base_and_offset
from torch_uop.core.schedule import KernelItem
from torch_uop.core.opt import KernelOpts, VectorUnit, AVX2, STAGED_SLAB, heuristic_opts, gpu_opts, has_row_reductions, stride_along, trip_count
from torch_uop.core.transcendental import transcendental
from torch_uop.core.sym import Sym, SizeContext, known_equal

IDX = dtypes.index
STAGE_LOCAL_BASE = 100  # DEFINE_LOCAL ids of staged slabs (row caches count from 0)
STAGE_TILE = 8  # a slab is copied in square tiles of this side over its last two dims: the LLVM renderer loads a tile's
                # rows as vectors and transposes them in registers where it is stored crosswise (renderer/transpose.py)


def _c(v) -> UOp: return UOp.const(IDX, v)


def reduce_identity(op: Ops, dtype: DType):
  if op is Ops.ADD: return False if dtype.is_bool else 0
  if op is Ops.MUL: return True if dtype.is_bool else 1
  if op is Ops.MAX: return dtype.min()
  if op is Ops.MIN: return dtype.max()
  raise NotImplementedError(op)


@dataclass
class Kernel:
  name: str
  ast: UOp                 # SINK(STORE(...))
  buffers: list            # slots in argument order; first is the output
  buffer_dtypes: list
  program: list            # linear UOps
  opts: KernelOpts = None
  split_size: int = 0      # iterations of the thread-split loop (0: the kernel has none); a core.sym.Sym if symbolic
  local_size: int = 0      # GPU-style devices: work-items per group of a grouped reduction (0: not grouped)
  # the DEFINE_GLOBAL ids of ast and program in argument order, where they are not the slots in `buffers` (a kernel
  # built once for items of one structure, `canonical_item`); renderers number arguments by these
  buffer_ids: list | None = None

  @property
  def argument_ids(self) -> list: return self.buffers if self.buffer_ids is None else self.buffer_ids


class _Evaluator:
  def __init__(self, item: KernelItem, opts: KernelOpts, staging: str = "off", stage_bytes: int = 0, stage_lanes: int = 0):
    self.item, self.opts = item, opts
    self.stage_lanes = stage_lanes  # copy a staged slab's tile rows as vectors of this many lanes (0: by scalars)
    # staged copies (LT.staged): "copy" copies their slabs into local arrays (the CPU), "plan" reads them as if they
    # were in memory of their own (what the optimizer reads: the loads a realized copy gives), "off" reads their source
    # stage_bytes: the most the slabs may take, the target's VectorUnit.stage_bytes (0: none is copied)
    self.staging, self.stage_bytes = staging, stage_bytes
    self.stages: dict = {}  # (staged node, its dim-0 index) -> AFTER(local array, the copy's STORE); None in "plan"
    self.args: dict[int, UOp] = {}  # slot -> DEFINE_GLOBAL
    self.memo: dict = {}
    self.broadcast_dims: dict = {}  # VIEW -> the dims it does not read (_read_dims)
    self.reduce_ranges: tuple | None = None
    self.row_ranges: list = []  # the loops of each row reduction evaluated (schedule.KernelItem.row_reduces)
    self.loops: dict = {}      # (LT.loop tag, idxs, gate) -> (loop id, kernel LOOP sources)
    self.loop_vars: dict = {}  # (LT.loop tag, idxs, gate) -> (counter RANGE, state LOOP_VARs)
    self.at_lanes = False      # evaluating a register tile at stand-in lanes (_lane_tile)
    self.lane_reach: dict = {} # node -> whether a lane reaches it (_lane_reaches), while and after evaluating at lanes

  def buf(self, slot: int, dtype: DType) -> UOp:
    if slot not in self.args: self.args[slot] = UOp(Ops.DEFINE_GLOBAL, dtype, (), slot)
    return self.args[slot]

  def load(self, slot: int, dtype: DType, flat: UOp, gate: UOp) -> UOp:
    ungated = gate.op is Ops.CONST and gate.arg or self._inside(slot, flat)
    src = (self.buf(slot, dtype), flat) if ungated else (self.buf(slot, dtype), flat, gate)
    return UOp(Ops.LOAD, dtype, src)

  def _inside(self, slot: int, flat: UOp) -> bool:
    """Whether `flat` stays inside the buffer at every position the loops can take, the gate aside: a read under a
    mask whose index does not depend on it (BatchNorm's per-channel scale inside a padded output) then needs no
    gate, since a gated value is discarded by the mask's select anyway, and an ungated load is a vector load."""
    info = self.item.buffers.get(slot)
    if info is None or not all(isinstance(x, int) for x in (*info.shape, *info.strides)): return False
    lo, hi = flat.vmin, flat.vmax
    return isinstance(lo, int) and isinstance(hi, int) and lo >= 0 and hi * info.dtype.itemsize < info.nbytes

  def eval(self, node: UOp, idxs: tuple, gate: UOp) -> UOp:
    if node.op is Ops.VIEW: idxs = self._read_dims(node, idxs)
    key = (node, idxs, gate)
    if key in self.memo: return self.memo[key]
    out = self._eval(node, idxs, gate)
    self.memo[key] = out
    return out

  def _read_dims(self, view: UOp, idxs: tuple) -> tuple:
    """idxs with 0 along the dims a view broadcasts (stride 0, no mask there), which it does not read: a register
    tile's positions along such a dim then share one evaluation of what lies below (a GEMM's x is read once per row
    of the tile, not once per position)."""
    if view not in self.broadcast_dims:
      top = view.arg.views[-1]
      mask = top.valid_bounds()
      self.broadcast_dims[view] = tuple(d for d, (n, st) in enumerate(zip(top.shape, top.strides))
                                        if st == 0 and mask[d] == (0, n) and not known_equal(n, 1))
    dims = self.broadcast_dims[view]
    if not dims: return idxs
    return tuple(_c(0) if d in dims else i for d, i in enumerate(idxs))

  def _eval(self, node: UOp, idxs: tuple, gate: UOp) -> UOp:
    slots = self.item.realized
    if node is not self.item.root and node in slots:  # a realized node (another kernel's output) is read
      if node.op is Ops.BUFFER: return self.load(slots[node], node.dtype, idxs[0], gate)
      return self.load(slots[node], node.dtype, _strided(idxs, self.item.buffers[slots[node]].strides), gate)
    out = EVALUATE.translate(node, _At(self, idxs, gate))
    if out is None: raise NotImplementedError(f"codegen cannot evaluate {node.op}")
    return out

  def _stages(self, node: UOp, idxs: tuple, gate: UOp) -> bool:
    """Whether this read of a staged node goes through a local copy of its slab: on the CPU, ungated, outside row
    reductions, for a dim-0 index no reduce loop moves (the slab is copied once per outer iteration, then read by
    all the reduction's steps), a slab of constant size, and within the kernel's stage_bytes. Otherwise the
    kernel reads the source itself."""
    if self.at_lanes and _lane_reaches(idxs[0], self.lane_reach): raise _PositionDependent  # (a slab per position)
    if (node, idxs[0]) in self.stages: return True
    slab = node.shape[1:]
    if self.staging == "off" or not (gate.op is Ops.CONST and gate.arg) or self.item.row_reduces: return False
    if any(not isinstance(n, int) for n in slab): return False
    if any(u.op is Ops.RANGE and u.arg.kind not in (AxisKind.GLOBAL, AxisKind.SPLIT) for u in idxs[0].toposort()): return False
    staged_bytes = sum(math.prod(k.shape[1:]) * k.dtype.itemsize for k, _ in self.stages)
    return staged_bytes + math.prod(slab) * node.dtype.itemsize <= self.stage_bytes

  def _staged(self, node: UOp, idxs: tuple) -> UOp:
    """A read of a staged node at idxs: from the local array holding its slab at idxs[0]. The copy is a STORE in
    loops of its own (kind "stage"), which linearize places once the loops of idxs[0] are open, before the others."""
    slab = node.shape[1:]
    key = (node, idxs[0])
    if self.staging == "plan":  # the optimizer's view: a buffer of its own
      self.stages[key] = None
      return UOp(Ops.LOAD, node.dtype, (UOp(Ops.DEFINE_GLOBAL, node.dtype, (), STAGED_SLAB), _strided(idxs, contiguous_strides(node.shape))))
    strides = contiguous_strides(slab)
    if key not in self.stages:
      k = len(self.stages)
      tiled = [len(slab) >= 2 and d >= len(slab) - 2 and all(n % STAGE_TILE == 0 for n in slab[-2:]) for d in range(len(slab))]
      ranges = [UOp(Ops.RANGE, IDX, (_c(n // STAGE_TILE if t else n),), RangeArg(d, AxisKind.STAGE, k))
                for d, (n, t) in enumerate(zip(slab, tiled))]
      local = UOp(Ops.DEFINE_LOCAL, node.dtype, (), (STAGE_LOCAL_BASE + k, math.prod(slab)))
      stores = None
      if self.stage_lanes == STAGE_TILE and tiled[-1]:  # each row of a tile one vector, where its accesses allow
        lane = vector_lane(STAGE_TILE)
        stores = self._stage_stores(node, idxs[0], local, strides, ranges, tiled, lane)
        if not _lanes_fit(simplify(UOp(Ops.SINK, dtypes.void, tuple(stores))), lane): stores = None
      if stores is None: stores = self._stage_stores(node, idxs[0], local, strides, ranges, tiled)
      self.stages[key] = UOp(Ops.AFTER, node.dtype, (local, *stores))
    return UOp(Ops.LOAD, node.dtype, (self.stages[key], _strided(idxs[1:], strides)))

  def _stage_stores(self, node: UOp, first: UOp, local: UOp, strides: tuple, ranges: list, tiled: list, lane=None) -> list:
    """The STOREs copying a staged node's slab at dim-0 index `first` into `local`: one per position of a tile (the
    tiled dims' loops step by STAGE_TILE), or with a vector `lane`, one per row of it, the lane along the last dim."""
    true = UOp.const(dtypes.bool, True)
    last = len(ranges) - 1
    def positions(d: int, r: UOp, t: bool) -> list:
      if not t: return [r]
      if lane is not None and d == last: return [r * _c(STAGE_TILE) + lane]
      return [r * _c(STAGE_TILE) + _c(o) for o in range(STAGE_TILE)]
    return [UOp(Ops.STORE, dtypes.void, (local, _strided(at, strides), self.eval(node.src[0], (first, *at), true)))
            for at in itertools.product(*[positions(d, r, t) for d, (r, t) in enumerate(zip(ranges, tiled))])]

  def _loop(self, node: UOp, idxs: tuple, gate: UOp) -> UOp:
    """One kernel loop per (LT.loop, output position): a RANGE counting to the element's trip count and a
    LOOP_VAR per state value, in which the step is evaluated; every result of that LT.loop shares them."""
    key = (node.arg[0], idxs, gate)
    if key not in self.loops:
      lid = len(self.loops)
      nstate = (len(node.src) - 2) // 2
      counter = UOp(Ops.RANGE, IDX, (self.eval(node.src[0], idxs, gate).cast(IDX),), RangeArg(lid, AxisKind.LOOP))
      self.loop_vars[key] = (counter, tuple(UOp(Ops.LOOP_VAR, s.dtype, (), KernelLoopVar(lid, i)) for i, s in enumerate(node.src[2:2 + nstate])))
      self.loops[key] = (lid, (counter, *[self.eval(s, idxs, gate) for s in node.src[1:]]))
    lid, src = self.loops[key]
    return UOp(Ops.LOOP, node.dtype, src, (lid, node.arg[1]))


class _At(NamedTuple):
  """Where a tensor-level node is evaluated: the evaluator, the output position's index along each of the node's
  dims, and the gate (where the value is used at all)."""
  ev: _Evaluator
  idxs: tuple
  gate: UOp


def _eval_view(at: _At, x: UOp) -> UOp:
  ev, slots = at.ev, at.ev.item.realized
  flat, valid = x.arg.to_indexed(list(at.idxs))
  valid = _simplify(valid)
  src = x.src[0]
  inner_gate = _simplify(at.gate & valid)
  # (a position's mask clauses narrow its index math, range_limits below: a tile whose masks move with a lane is
  # built position by position)
  if ev.at_lanes and inner_gate.op is not Ops.CONST and _lane_reaches(inner_gate, ev.lane_reach):
    raise _PositionDependent
  # what is read here is only used where the mask holds: the index may assume it (a concatenation's
  # (r - 32) % 64 for r in [32, 64) is r - 32)
  limits = range_limits(inner_gate) if inner_gate.op is not Ops.CONST else {}
  flat = simplify_within(flat, limits)
  if src.op is Ops.CONST: value = src
  elif src in slots and src is not ev.item.root and (src.op is Ops.BUFFER or _row_major(ev.item.buffers[slots[src]])):
    # (a realized node stored in row-major order is read at the flat index itself: unflattening it only for
    # the strides to sum it back leaves divisions that the simplifier does not always undo)
    value = ev.load(slots[src], src.dtype, flat, inner_gate)
  else:
    src_idxs = tuple(simplify_within(i, limits) for i in unflatten(flat, src.shape))
    value = ev.eval(src, src_idxs, inner_gate)
  if valid.op is Ops.CONST and valid.arg: return value
  return valid.where(value, UOp.const(value.dtype, 0))


def _eval_reduce(at: _At, x: UOp) -> UOp:
  ev, (op, axes) = at.ev, x.arg
  if x in ev.item.row_reduces:
    # computed once per row (schedule._broadcast_back), in loops of its own: after the reductions it reads, before
    # the loops over the row that read it
    k = len(ev.row_ranges)
    ranges = tuple(UOp(Ops.RANGE, IDX, (_c(x.src[0].shape[a]),), RangeArg(a, AxisKind.REDUCE, k)) for a in axes)
    ev.row_ranges.append(ranges)
  else:
    if ev.reduce_ranges is None:
      kind = AxisKind.REDUCE if ev.opts.vector_axis is None else AxisKind.REDUCE_SERIAL
      ev.reduce_ranges = tuple(UOp(Ops.RANGE, IDX, (_c(x.src[0].shape[a]),), RangeArg(a, kind)) for a in axes)
      ev.reduce_axes = axes
    assert ev.reduce_axes == axes, "scheduler fused reductions over different axes"
    ranges = ev.reduce_ranges
  src_idxs = list(at.idxs)
  for a, r in zip(axes, ranges): src_idxs[a] = r
  return UOp(Ops.REDUCE, x.dtype, (ev.eval(x.src[0], tuple(src_idxs), at.gate), *ranges), op)


def _eval_gather(at: _At, x: UOp) -> UOp:
  source, *indices = x.src
  new = []
  for d, where in enumerate(x.arg):
    if isinstance(where, int): new.append(at.idxs[where]); continue
    i = at.ev.eval(indices[where[1]], at.idxs, at.gate).cast(IDX)
    size = _c(source.shape[d])
    i = (i < _c(0)).where(i + size, i)
    new.append(i.maximum(_c(0)).minimum(size - _c(1)))  # never read out of bounds, whatever the data
  return at.ev.eval(source, tuple(new), at.gate)


def _eval_contiguous(at: _At, x: UOp) -> UOp:
  ev = at.ev
  if x.arg == STAGED and x is not ev.item.root and ev._stages(x, at.idxs, at.gate): return ev._staged(x, at.idxs)
  return ev.eval(x.src[0], at.idxs, at.gate)


def _eval_loop_var(at: _At, x: UOp) -> UOp:
  """Inside its loop's step: the counter or a state value of that loop."""
  counter, state = at.ev.loop_vars[(x.arg.tag, at.idxs, at.gate)]
  return counter.cast(x.dtype) if x.arg.index < 0 else state[x.arg.index]


# how each tensor-level node becomes kernel-level UOps at one output position (_Evaluator._eval; a realized node is
# read from its buffer before these rules are tried)
EVALUATE = PatternMatcher([
  (UPat((Ops.CONST, Ops.DEFINE_VAR), name="x"), lambda at, x: x),
  (UPat(Ops.VIEW, name="x"), _eval_view),
  (UPat(Ops.REDUCE_AXIS, name="x"), _eval_reduce),
  (UPat(Ops.IOTA, name="x"), lambda at, x: at.idxs[0].cast(x.dtype)),
  (UPat(Ops.GATHER, name="x"), _eval_gather),
  (UPat(Ops.CONTIGUOUS, name="x"), _eval_contiguous),
  (UPat(Ops.LOOP, name="x"), lambda at, x: at.ev._loop(x, at.idxs, at.gate)),
  (UPat(Ops.LOOP_VAR, name="x"), _eval_loop_var),
  (UPat(tuple(ELEMENTWISE), name="x"), lambda at, x: x.replace(src=tuple(at.ev.eval(s, at.idxs, at.gate) for s in x.src))),
])


_simplify = simplify


def _row_major(info) -> bool:
  """Whether a realized buffer holds its node's elements in row-major order (contiguous strides)."""
  return all(known_equal(st, want) for n, st, want in zip(info.shape, info.strides, contiguous_strides(info.shape))
             if not known_equal(n, 1))


def _strided(idxs, strides) -> UOp:
  flat = _c(0)
  for i, st in zip(idxs, strides):
    if st: flat = flat + i * _c(st)
  return flat


def upcast_trips(size, factor: int, clamped: bool = False):
  """Iterations of an output loop upcast by `factor`: one more for a partial last tile when factor does not divide
  size. A symbolic size is divided by its factor (opt.py guards that for a SIMD axis) unless `clamped` (a blocked
  axis of symbolic size: its last tile clamps, _upcast_index)."""
  if isinstance(size, Sym): return (size + (factor - 1)) // factor if clamped else size // factor
  return size // factor if size % factor == 0 else -(-size // factor)


def _upcast_index(r: UOp, factor: int, offset: int, size, clamped: bool = False) -> UOp:
  """Position `offset` of tile r. Where factor does not divide size, the last tile starts early, at size - factor,
  overlapping the one before it: its positions compute and store values that tile stored already (no kernel writes
  a buffer it reads), and a tile's positions stay consecutive, so its loads and stores along the axis are still
  vectors. An axis shorter than the factor, or a `clamped` one of symbolic size (any size, no guard: register
  blocking over a batch or sequence length), clamps its positions past the end to the last one instead."""
  if clamped: return (r * _c(factor) + _c(offset)).minimum(_c(size - 1))
  if upcast_trips(size, factor) * factor == size: return r * _c(factor) + _c(offset)
  if size >= factor: return (r * _c(factor)).minimum(_c(size - factor)) + _c(offset)
  return (r * _c(factor) + _c(offset)).minimum(_c(size - 1))


def _clamped(opts: KernelOpts, shape: tuple, axis: int) -> bool:
  """Whether an upcast output axis of symbolic size clamps its last tile: all but the SIMD axis, whose factor opt.py
  guards to divide it."""
  return isinstance(shape[axis], Sym) and opts.factor(axis) > 1 and axis != opts.vector_axis


def kernel_ast(item: KernelItem, opts: KernelOpts, staging: str = "off", stage_bytes: int = 0,
                simd_lanes: int = 0) -> tuple[UOp, _Evaluator]:
  """Evaluate the kernel's root at the loop indices `opts` describe; one STORE per upcast position, or with
  `simd_lanes`, per `simd_lanes` positions along the SIMD axis (opts.vector_axis) where the tile is built once at
  stand-in lanes and its accesses allow (_lanes_fit): those positions are one vector (vector_lane).
  `staging`: how staged copies are read, within `stage_bytes` (_Evaluator)."""
  stage_lanes = STAGE_TILE if simd_lanes else 0
  ev = _Evaluator(item, opts, staging, stage_bytes, stage_lanes)
  root = item.root
  out_shape = root.shape
  loops = []
  for d, s in enumerate(out_shape):
    kind = AxisKind.SPLIT if d == opts.split_axis else AxisKind.GLOBAL
    trips = upcast_trips(s, opts.factor(d), _clamped(opts, out_shape, d))
    loops.append(None if s == 1 else UOp(Ops.RANGE, IDX, (_c(trips),), RangeArg(d, kind)))
  out_buf = ev.buf(item.out_slot, root.dtype)
  stores = []
  # each axis' index at each of its tile positions, built once
  axis_idxs = [[_c(0)] if r is None else [r] if opts.factor(d) == 1 else
               [_upcast_index(r, opts.factor(d), o, out_shape[d], _clamped(opts, out_shape, d)) for o in range(opts.factor(d))]
               for d, r in enumerate(loops)]
  true = UOp.const(dtypes.bool, True)
  tile = _lane_tile(item, opts, loops)
  if tile is not None:
    lanes, lane_idxs = tile
    ev.at_lanes = True
    try: at_lanes = simplify(ev.eval(root, lane_idxs, true))
    except _PositionDependent:
      tile, ev = None, _Evaluator(item, opts, staging, stage_bytes, stage_lanes)
      ev.buf(item.out_slot, root.dtype)
    ev.at_lanes = False
  # the output buffer's strides may be a graph output's eager layout (permuted, or stride 0: the same
  # value is then stored once per aliasing index)
  out_strides = item.buffers[item.out_slot].strides
  va = opts.vector_axis
  if tile is not None and simd_lanes and va in lanes and opts.factor(va) % simd_lanes == 0:
    # SIMD across the tile's vector axis: one position per `simd_lanes` of it, its lanes a VECTOR lane
    lane = vector_lane(simd_lanes)
    steps = [range(0, len(a), simd_lanes) if d == va else range(len(a)) for d, a in enumerate(axis_idxs)]
    for pos in itertools.product(*steps):
      offsets = {lanes[d]: _c(pos[d]) for d in lanes}
      offsets[lanes[va]] = _c(pos[va]) + lane
      idxs = [a[p] for a, p in zip(axis_idxs, pos)]
      idxs[va] = idxs[va] + lane
      value = _at_position(at_lanes, offsets, ev.lane_reach, {})
      stores.append(UOp(Ops.STORE, dtypes.void, (out_buf, _strided(idxs, out_strides), value)))
    sink = simplify(UOp(Ops.SINK, dtypes.void, tuple(stores)))
    if _lanes_fit(sink, lane): return sink, ev
    stores = []
  for pos, idxs in zip(itertools.product(*[range(len(a)) for a in axis_idxs]), itertools.product(*axis_idxs)):
    if tile is None: value = ev.eval(root, idxs, true)
    else: value = simplify(_at_position(at_lanes, {lane: _c(pos[d]) for d, lane in lanes.items()}, ev.lane_reach, {}))
    stores.append(UOp(Ops.STORE, dtypes.void, (out_buf, _strided(idxs, out_strides), value)))
  return simplify(UOp(Ops.SINK, dtypes.void, tuple(stores))), ev


# register tiles with a SIMD axis are built as vectors along it (False: one scalar per position, for LLVM's SLP pass to
# pack: the same machine code from about 16 times the IR, which LLVM took 0.25-1 s per module to optimize)
VECTOR_TILES = True


def vector_lane(width: int) -> UOp:
  """The stand-in for a SIMD lane: a RANGE of kind "vector" over `width` lanes that no loop runs. Every node it
  reaches is a vector of `width` values (one per lane) to the renderer; a load or store it reaches reads or writes
  `width` consecutive elements (_vector_accesses gives their index as base + lane)."""
  return UOp(Ops.RANGE, IDX, (_c(width),), RangeArg(0, AxisKind.VECTOR))


def is_vector_lane(u: UOp) -> bool: return u.op is Ops.RANGE and u.arg.kind == AxisKind.VECTOR


def vector_widths(nodes: list) -> dict:
  """{node: SIMD width} for the nodes (a kernel's program, and all below them) that a vector lane reaches: a load by
  its index, a store by its index or value; an AFTER (a local array, once its copy is stored) is no vector."""
  width: dict = {}
  for u in toposort(nodes):
    if is_vector_lane(u): width[u] = u.src[0].arg
    elif u.op is Ops.AFTER: continue
    else:
      w = next((width[s] for s in (u.src[1:] if u.op in (Ops.LOAD, Ops.STORE) else u.src) if s in width), 0)
      if w: width[u] = w
  return width


class _LaneSteps:
  """How far an index moves from one lane to the next (None: not by a constant), for the nodes of one kernel. (A lane
  reaches through values only: an AFTER, a local array a copy stored, is not reached by the copy's lane.)"""
  def __init__(self, lane: UOp):
    self.lane, self.reach, self.memo = lane, {}, {}

  def reaches(self, u: UOp) -> bool:
    if u not in self.reach: self.reach[u] = u is self.lane or (u.op is not Ops.AFTER and any([self.reaches(s) for s in u.src]))
    return self.reach[u]

  def step(self, index: UOp):
    return affine_terms(index, self.memo, free=lambda v: {self.lane: None} if self.reaches(v) else {}).get(self.lane, 0)


def _lanes_fit(sink: UOp, lane: UOp) -> bool:
  """Whether a kernel built with a vector lane can run as vectors: every store the lane reaches moves one element per
  lane (no scatter), every load it reaches a constant number of elements (one: a vector load; more, ungated: a
  strided one, which the renderer transposes in registers with the loads beside it or gathers), and no load's mask
  moves with it."""
  lanes = _LaneSteps(lane)
  strided: dict = {}  # (buffer, index terms at lane 0, step) -> the offsets of the strided loads
  for n in sink.toposort():
    if n.op not in (Ops.LOAD, Ops.STORE): continue
    gated = n.op is Ops.LOAD and len(n.src) == 3
    if gated and lanes.reaches(n.src[2]): return False
    if n.op is Ops.STORE and lanes.reaches(n.src[2]) and not lanes.reaches(n.src[1]): return False
    if not lanes.reaches(n.src[1]): continue
    step = lanes.step(n.src[1])
    if step == 1: continue
    if n.op is Ops.STORE or gated or not step: return False
    terms, offset = base_and_offset(simplify(substitute(n.src[1], {lane: _c(0)})))
    strided.setdefault((n.src[0], terms, step), set()).add(offset)
  # strided loads only as whole blocks, which the renderer transposes (one by itself would be a gather, a scalar load
  # per lane)
  return all(whole_block(o, lane.src[0].arg) for o in strided.values())


def whole_block(offsets, width: int) -> bool:
  """Whether strided vector loads at these offsets (their index terms and step alike) read a whole block of `width`
  rows by `width` columns: `width` loads at consecutive offsets."""
  return sorted(offsets) == list(range(min(offsets), min(offsets) + width))


def _vector_accesses(ast: UOp) -> UOp:
  """Each load and store a vector lane reaches, indexed as ADD(the index at lane 0, lane), or for a strided load
  ADD(the index at lane 0, MUL(lane, its step)): the renderer reads the first element's address and the step from it
  (_lanes_fit checked that the step is a constant)."""
  nodes = ast.toposort()
  lanes = [_LaneSteps(n) for n in nodes if is_vector_lane(n)]  # (a tile's, and a staged copy's of its own width)
  if not lanes: return ast
  new: dict = {}
  for n in nodes:
    src = tuple(new.get(s, s) for s in n.src)
    at = next((x for x in lanes if x.reaches(n.src[1])), None) if n.op in (Ops.LOAD, Ops.STORE) else None
    if at is not None:
      step = at.step(n.src[1])
      moved = at.lane if step == 1 else UOp(Ops.MUL, IDX, (at.lane, _c(step)))
      src = (src[0], UOp(Ops.ADD, IDX, (simplify(substitute(src[1], {at.lane: _c(0)})), moved)), *src[2:])
    if src != n.src: new[n] = n.replace(src=src)
  return new.get(ast, ast)


def _lane_tile(item: KernelItem, opts: KernelOpts, loops: list):
  """A register tile's expression built once instead of once per position: each upcast axis' index is written
  base + lane, with lane a stand-in RANGE over the tile's positions (kind "lane"); the kernel's root is evaluated and
  simplified at those indices, and each position is that result with the lanes replaced by its offsets
  (_at_position), simplified again. Returns ({axis: lane}, the indices), or None where the tile is built position by
  position: a tile of one position, an axis whose positions are not base + offset (clamped), or an expression where a
  position's own facts shape what is built: gathers, row reductions, LT.loop, and (found while evaluating,
  _PositionDependent) a mask that moves with a lane, whose clauses narrow each position's index math, or a staged
  slab that does."""
  if not opts.upcast or item.row_reduces: return None
  shape = item.root.shape
  for d, f in opts.upcast:
    if f > 1 and (loops[d] is None or _clamped(opts, shape, d) or isinstance(shape[d], Sym) or shape[d] < f): return None
  stack, seen = [item.root], set()
  while stack:
    u = stack.pop()
    if u in seen: continue
    seen.add(u)
    if u is not item.root and u in item.realized: continue
    if u.op in (Ops.GATHER, Ops.LOOP, Ops.LOOP_VAR): return None
    stack.extend(u.src)
  lanes, idxs = {}, []
  for d, r in enumerate(loops):
    f = opts.factor(d)
    if r is None: idxs.append(_c(0)); continue
    if f == 1: idxs.append(r); continue
    lanes[d] = UOp(Ops.RANGE, IDX, (_c(f),), RangeArg(d, AxisKind.LANE))
    idxs.append(_upcast_index(r, f, 0, shape[d]) + lanes[d])
  return lanes, tuple(idxs)


class _PositionDependent(Exception):
  """Raised while evaluating a tile at stand-in lanes where what is built depends on the position itself."""


def _at_position(u: UOp, offsets: dict, reach: dict, cache: dict) -> UOp:
  """u with each lane of `offsets` replaced by its constant; what no lane reaches is returned as it is. `reach`
  (_lane_reaches' memo) is shared between the positions of one tile."""
  if u in offsets: return offsets[u]
  if not _lane_reaches(u, reach): return u
  if u not in cache: cache[u] = u.replace(src=tuple(_at_position(s, offsets, reach, cache) for s in u.src))
  return cache[u]


def _lane_reaches(u: UOp, reach: dict) -> bool:
  """Whether a lane (a RANGE of kind "lane") is u or below it; `reach` memoizes it per node."""
  if u not in reach: reach[u] = u.op is Ops.RANGE and u.arg.kind == AxisKind.LANE or any([_lane_reaches(s, reach) for s in u.src])
  return reach[u]


ROW_CACHE_BYTES = 32 << 10  # the most a row's cached values may take (the kernel's stack; with the row, in L1)
_COSTLY = {Ops.MATH, Ops.FDIV}


def _cache_row_values(ast: UOp) -> UOp:
  """A row reduction's summand that the pass over the row after it computes again (softmax's exp(x - max), which
  the sum adds up and the output divides) is stored to a scratch array in the reduction's loop and loaded back
  there, when it is costly (a math function or a division) and the row fits ROW_CACHE_BYTES: one exp per element
  instead of two. The later pass's copy is found as the summand with each reduce loop replaced by the output loop
  of the same axis."""
  nodes = ast.toposort()
  outputs = {n.arg.axis: n for n in nodes if n.op is Ops.RANGE and n.arg.kind in (AxisKind.GLOBAL, AxisKind.SPLIT)}
  present = set(nodes)
  mapping, stores = {}, []
  for red in (n for n in nodes if n.op is Ops.REDUCE and has_row_reductions([n])):
    value, ranges = red.src[0], red.src[1:]
    axes = [r.arg.axis for r in ranges]
    if not any(n.op in _COSTLY for n in value.toposort()) or not all(a in outputs for a in axes): continue
    if any(outputs[a].src[0] is not r.src[0] for a, r in zip(axes, ranges)): continue  # an upcast output loop
    sizes = tuple(r.src[0].arg for r in ranges)
    if math.prod(sizes) * value.dtype.itemsize > ROW_CACHE_BYTES: continue
    again = substitute(value, {r: outputs[a] for a, r in zip(axes, ranges)})
    if again not in present or again in mapping: continue
    local = UOp(Ops.DEFINE_LOCAL, value.dtype, (), (len(stores), math.prod(sizes)))
    row_major = contiguous_strides(sizes)
    stores.append(UOp(Ops.STORE, dtypes.void, (local, _strided(ranges, row_major), value)))
    read_back = _strided([outputs[a] for a in axes], row_major)
    mapping[again] = UOp(Ops.LOAD, value.dtype, (UOp(Ops.AFTER, value.dtype, (local, red)), read_back))
  if not mapping: return ast
  ast = substitute(ast, mapping)
  return ast.replace(src=ast.src + tuple(stores))


def canonical_item(item: KernelItem) -> tuple[tuple, KernelItem, dict] | None:
  """(structure, the item with its buffers renumbered, canonical id -> slot), or None for an item with symbolic sizes.

  Items of one structure (the same expression over buffers of the same shapes, strides and dtypes: each layer of a
  transformer) differ only in their slots. Renumbered in the order a walk of the root first meets them (the output
  0), they are one item, whose kernel is built and rendered once and launched with each item's slots. The structure
  is that walk's list of nodes, each with its children's positions in the list; the walk stops where the kernel
  loads, at realized nodes. (Symbolic sizes are left out: their comparisons may record guards.)"""
  if item.size_vars is not None: return None
  ids = {item.out_slot: 0}
  out = item.buffers[item.out_slot]
  entries: list = [(out.shape, out.strides, out.dtype)]
  index: dict = {}
  stack = [(item.root, False)]
  while stack:
    u, expanded = stack.pop()
    if u in index: continue
    if u is not item.root and u in item.realized:
      slot = item.realized[u]
      if slot not in ids: ids[slot] = len(ids)
      info = item.buffers[slot]
      entry = ("load", ids[slot], u.op is Ops.BUFFER, u.dtype, u.shape, info.shape, info.strides, info.dtype)
    elif not expanded:
      stack.append((u, True))
      stack.extend((s, False) for s in reversed(u.src))
      continue
    else:
      entry = (u.op, u.dtype, const_key(u.arg) if u.op is Ops.CONST else u.arg, tuple(index[s] for s in u.src),
               u in item.row_reduces)
    index[u] = len(entries)
    entries.append(entry)
  # (item.realized and item.buffers are the whole schedule's: only what the walk met is kept)
  realized = {u: ids[item.realized[u]] for u in index if u in item.realized and item.realized[u] in ids}
  buffers = {i: dataclasses.replace(item.buffers[slot], slot=i) for slot, i in ids.items()}
  canonical = KernelItem(item.root, 0, realized, buffers, None, item.row_reduces)
  return tuple(entries), canonical, {i: slot for slot, i in ids.items()}


def with_slots(kernel: Kernel, name: str, slot_of: dict) -> Kernel:
  """The kernel built for a canonical item (`canonical_item`), named `name`, launched with the slots `slot_of`
  gives its canonical ids."""
  return dataclasses.replace(kernel, name=name, buffers=[slot_of[i] for i in kernel.argument_ids],
                             buffer_ids=list(kernel.argument_ids))


def _relabel_split(ast: UOp, split_axis: int | None) -> UOp:
  """The AST with output loop `split_axis` marked as the thread-split loop (what kernel_ast does for it)."""
  loops = [u for u in ast.toposort() if u.op is Ops.RANGE and u.arg == RangeArg(split_axis, AxisKind.GLOBAL)]
  return substitute(ast, {r: r.replace(arg=RangeArg(split_axis, AxisKind.SPLIT)) for r in loops}) if loops else ast


def build_kernel(item: KernelItem, name: str, opts: KernelOpts | None = None, device_kind: str = "cpu",
                 max_group: int = 0, parallelism: int = 0, vectors: VectorUnit = AVX2) -> Kernel:
  """`device_kind`: "cpu" (opts for the LLVM CPU path, a CPU with the vector registers `vectors`) or
  "gpu" (OpenCL and CUDA: core/opt.py gpu_opts, with groups of at most `max_group` work-items, for a device running
  `parallelism` work-items at once)."""
  ast = None
  cpu = device_kind == "cpu"
  stage_bytes = vectors.stage_bytes if cpu and vectors is not None else 0  # (a GPU-style device stages nothing)
  if opts is None:
    plain, plain_ev = kernel_ast(item, KernelOpts(), "plan" if cpu else "off", stage_bytes)
    opts = heuristic_opts(item.root.shape, plain, vectors) if cpu else gpu_opts(item.root.shape, plain, max_group, parallelism)
    # without upcasts (or staged copies) the kernel is the plain AST with its split loop relabeled: no second build
    if not opts.upcast and opts.vector_axis is None and not plain_ev.stages: ast, ev = _relabel_split(plain, opts.split_axis), plain_ev
  if ast is None:
    simd_lanes = vectors.lanes if cpu and vectors is not None and VECTOR_TILES else 0
    ast, ev = kernel_ast(item, opts, "copy" if cpu else "off", stage_bytes, simd_lanes)
  if item.row_reduces: ast = _cache_row_values(ast)
  elif cpu and not opts.loop_order: ast = _merge_loops(ast)
  # polynomial exp/erf vectorize on the CPU; a GPU-style device has its own math functions (and rounds to bf16 itself)
  if device_kind == "cpu" and transcendental.may_rewrite(ast.toposort()): ast = graph_rewrite(ast, transcendental)
  if item.size_vars is not None: ast = _divided_variables(ast, item, opts)
  size_vars = [n for n in ast.toposort() if n.op is Ops.DEFINE_VAR]
  if size_vars:
    # the kernel reads the size variables' values from one more buffer argument (the graph's int64 size-variable
    # buffer, item.size_vars = (its slot, variable name -> position, derived variables))
    vars_slot, position, _ = item.size_vars
    table = ev.buf(vars_slot, dtypes.int64)
    ast = substitute(ast, {v: UOp(Ops.DEFINE_VAR, IDX, (table,), v.arg + (position[v.arg[0]],)) for v in size_vars})
  slots = [item.out_slot] + sorted(s for s in ev.args if s != item.out_slot)
  split = next((n for n in ast.toposort() if n.op is Ops.RANGE and n.arg.kind == AxisKind.SPLIT), None)
  split_size = 0 if split is None else split.src[0].arg if split.src[0].op is Ops.CONST else Sym(split.src[0])
  program = linearize(_vector_accesses(ast) if cpu else ast, opts.loop_order)
  return Kernel(name, ast, slots, [ev.args[s].dtype for s in slots], program, opts, split_size, _group_size(program, opts))


def kernel_work(k):
  """Scalar operations one call of a kernel does, roughly: its loop trip counts times its body size, a vector node
  counted once per lane (a Sym when some trip count is a symbolic size)."""
  widths = vector_widths(k.program)
  trips = 1
  for u in k.program:
    if u.op is Ops.RANGE and u.arg.kind == AxisKind.STAGE: continue  # (a copy beside the loop nest, not inside it)
    if u.op is Ops.RANGE and u.src[0].op is Ops.CONST: trips *= u.src[0].arg
    elif u.op is Ops.RANGE and u.arg.kind != AxisKind.LOOP: trips = trips * Sym(u.src[0])
  return trips * max(1, sum(widths.get(u, 1) for u in k.program))


def is_affine_index(u: UOp) -> bool:
  """Whether u is a loop or index math that affine_terms looks through (a sum, a product with a constant)."""
  return u.op is Ops.RANGE or (u.dtype == IDX and (u.op is Ops.ADD or (u.op is Ops.MUL and any(x.op is Ops.CONST for x in u.src))))


def affine_terms(u: UOp, memo: dict, free=None) -> dict:
  """u's coefficient per loop (RANGE -> int) where u is a sum of loops times constants plus free terms: a node that is
  not such index math (a load, a division) adds `free(node)`, by default nothing (whoever checks index math checks
  its operands there); a coefficient `free` gives as None stays None through sums and products."""
  if u in memo: return memo[u]
  if u.op is Ops.RANGE: t = {u: 1}
  elif is_affine_index(u) and u.op is Ops.ADD:
    a, b = affine_terms(u.src[0], memo, free), affine_terms(u.src[1], memo, free)
    t = {r: None if a.get(r, 0) is None or b.get(r, 0) is None else a.get(r, 0) + b.get(r, 0) for r in a.keys() | b.keys()}
  elif is_affine_index(u):  # a product with a constant
    k, x = (u.src[0], u.src[1]) if u.src[0].op is Ops.CONST else (u.src[1], u.src[0])
    t = {r: None if c is None else c * k.arg for r, c in affine_terms(x, memo, free).items()}
  else: t = {} if free is None else free(u)
  memo[u] = t
  return t


# kernels whose loops _merge_loops leaves as they are: staged slabs and LT.loop state are laid out by their loops
_MERGE_BLOCKERS = (Ops.DEFINE_LOCAL, Ops.AFTER, Ops.LOOP, Ops.LOOP_VAR, Ops.DEFINE_VAR)


def _merge_loops(ast: UOp) -> UOp:
  """Adjacent loops merged into one where every index reads them as one: a loop r1 of A trips around r2 of B is one
  loop m of A*B trips when each index expression the kernel computes (a load's, a store's, a comparison's, a cast's
  operand...) is affine in them with r1's coefficient B times r2's; that expression is then a function of
  r1*B + r2 = m, and r1 -> 0, r2 -> m gives it. A channel's 7x7 or 14x14 pixels become one loop of 49 or 196 that
  LLVM vectorizes, where it would otherwise unroll the short inner loop in full and vectorize across channels, with
  one scalar load per lane. Output loops merge as they nest (the split loop outermost, then by axis), a reduction's
  loops by axis; the merged loop keeps the inner loop's id, and is the thread-split loop if either was."""
  nodes = ast.toposort()
  if any(n.op in _MERGE_BLOCKERS for n in nodes): return ast
  ranges = [n for n in nodes if n.op is Ops.RANGE and n.src[0].op is Ops.CONST]
  outputs = sorted((r for r in ranges if r.arg.kind in (AxisKind.GLOBAL, AxisKind.SPLIT)), key=lambda r: (r.arg.kind != AxisKind.SPLIT, r.arg.axis))
  reduces = sorted((r for r in ranges if r.arg.kind in (AxisKind.REDUCE, AxisKind.REDUCE_SERIAL)), key=lambda r: r.arg.order)
  if len(outputs) < 2 and len(reduces) < 2: return ast
  # every index expression that is an operand of something other than more affine index math (a reduction's list of
  # its loops is not one)
  memo: dict = {}
  operands = {s for n in nodes if not is_affine_index(n) and n.op is not Ops.REDUCE
              for s in n.src if is_affine_index(s) and s.op is not Ops.CONST}
  forms = [dict(t) for t in (affine_terms(s, memo) for s in operands) if t]
  mapping: dict = {}  # a loop of the kernel -> what replaces it
  for run in (outputs, reduces):
    merged = run[0] if run else None  # the loop standing for the loops merged so far (the kernel's, or a new one)
    for inner in run[1:]:
      trips = inner.src[0].arg
      if not all(t.get(merged, 0) == trips * t.get(inner, 0) for t in forms):
        merged = inner
        continue
      kind = AxisKind.SPLIT if AxisKind.SPLIT in (merged.arg.kind, inner.arg.kind) else inner.arg.kind
      m = UOp(Ops.RANGE, IDX, (_c(merged.src[0].arg * trips),), RangeArg(inner.arg.axis, kind))
      for t in forms:  # c_outer*outer + c_inner*inner = c_inner*m
        c = t.pop(inner, 0)
        t.pop(merged, None)
        if c: t[m] = c
      for r, v in mapping.items():
        if v is merged: mapping[r] = _c(0)
      if merged in ranges: mapping[merged] = _c(0)
      mapping[inner] = m
      merged = m
  if not mapping: return ast
  ast = substitute(ast, mapping)
  # a reduction lists the loops it reduces over: the outer one of a merged pair is gone
  fixed = {n: n.replace(src=(n.src[0], *(r for r in n.src[1:] if r.op is Ops.RANGE)))
           for n in ast.toposort() if n.op is Ops.REDUCE and any(r.op is not Ops.RANGE for r in n.src[1:])}
  return simplify(substitute(ast, fixed) if fixed else ast)


def _group_size(program: list, opts: KernelOpts) -> int:
  """Work-items per group: opts.group, or less (a power of two) when the outermost reduce loop is shorter."""
  first = next((u for u in program if u.op is Ops.RANGE and u.arg.kind in (AxisKind.REDUCE, AxisKind.REDUCE_SERIAL)), None)
  if not opts.group or first is None: return 0
  trips = trip_count(first) or opts.group
  size = opts.group
  while size > 32 and size // 2 >= trips: size //= 2
  return size


def _divided_variables(ast: UOp, item: KernelItem, opts: KernelOpts) -> UOp:
  """An output axis of symbolic size v upcast by f (opt.py guards v % f == 0): v is written f * v_f for a derived
  variable v_f = v // f, so that index math sees the loop (r < v_f, lanes r*f + o) stay below v. The derived
  variable joins the graph's table (item.size_vars: its position, and its (base, factor) for the executor)."""
  _, position, derived = item.size_vars
  mapping = {}
  for axis, f in opts.upcast:
    size = item.root.shape[axis]
    if not isinstance(size, Sym) or _clamped(opts, item.root.shape, axis): continue
    v = size.uop
    name = f"{v.arg[0]}_div{f}"
    if name not in position:
      position[name] = len(position)
      derived[name] = (v.arg[0], f)
      hints = SizeContext.current().hints
      hints[name] = hints[v.arg[0]] // f
    mapping[v] = UOp(Ops.DEFINE_VAR, IDX, (), (name, -(-v.arg[1] // f), v.arg[2] // f)) * _c(f)
  return simplify(substitute(ast, mapping)) if mapping else ast


def _ranges_of(u: UOp, cache: dict) -> frozenset:
  """The loop ranges u depends on (a REDUCE hides the ranges it reduces over)."""
  if u in cache: return cache[u]
  if is_vector_lane(u): r = frozenset()  # (no loop runs it)
  elif u.op is Ops.RANGE: r = frozenset([u]) | _ranges_of(u.src[0], cache)  # an LT.loop's trip count is data
  elif u.op is Ops.REDUCE: r = _ranges_of(u.src[0], cache) - frozenset(u.src[1:])
  elif u.op is Ops.AFTER:  # (what it waits for is done once its loops end)
    r = frozenset(x for s in u.src[1:] for x in _ranges_of(s, cache) if x.arg.kind != AxisKind.STAGE)
  elif not u.src: r = frozenset()
  else:
    r = _ranges_of(u.src[0], cache)
    for s in u.src[1:]:
      more = _ranges_of(s, cache)
      if not more <= r: r = r | more  # (most sources add no loop: no new set is built for them)
  cache[u] = r
  return r


def linearize(sink: UOp, loop_order: tuple = ()) -> list[UOp]:
  """Order a kernel graph into a linear program with explicit loop structure; the output loops nest in
  `loop_order` (outermost axis first) where it is given (opt.KernelOpts.loop_order), else in axis order."""
  nodes = toposort([sink])
  rcache: dict = {}
  for n in nodes: _ranges_of(n, rcache)
  reduces = [n for n in nodes if n.op is Ops.REDUCE]
  if has_row_reductions(reduces): return _linearize_rows(nodes, rcache)
  reduce_ranges = _order_reduce_ranges(list(reduces[0].src[1:]), nodes, rcache) if reduces else []
  outer_ranges = _output_ranges(nodes, set(reduce_ranges), loop_order)
  skip = {Ops.RANGE, Ops.SINK, Ops.CONST, Ops.DEFINE_GLOBAL, Ops.LOOP_VAR}
  loop_of = _loop_membership(nodes)
  stage_blocks, staged = _stage_blocks(nodes, rcache, outer_ranges, skip)
  nodes = [n for n in nodes if n not in staged]
  after_reduce: dict = {}

  def depends_on_reduce(u: UOp) -> bool:
    if u not in after_reduce: after_reduce[u] = u.op is Ops.REDUCE or any(depends_on_reduce(s) for s in u.src)
    return after_reduce[u]

  program: list[UOp] = [n for n in nodes if n.op is Ops.DEFINE_GLOBAL]
  rset = set(reduce_ranges)
  body_nodes = [n for n in nodes if loop_of[n] and n.op not in skip]
  nodes = [n for n in nodes if not loop_of[n]]  # a loop's step is emitted with its LOOP, below
  pre = [n for n in nodes if n.op not in skip and not depends_on_reduce(n) and not (rcache[n] & rset)]
  # what no loop moves (size variables and arithmetic on them: symbolic loop bounds) comes before every loop
  program += [n for n in pre if not rcache[n] and n.op is not Ops.STORE]
  pre = [n for n in pre if rcache[n] or n.op is Ops.STORE]
  program += stage_blocks.get(-1, [])
  for d, r in enumerate(outer_ranges): program += [r, *stage_blocks.get(d, [])]
  inner = [n for n in nodes if n.op not in skip and not depends_on_reduce(n) and (rcache[n] & rset)]
  post = [n for n in nodes if n.op not in skip and depends_on_reduce(n) and n.op is not Ops.REDUCE]
  if reduces:
    # what only the epilogue reads (a bias or a running sum added to a GEMM's result) is loaded after the reduce
    # loops: loaded before them, its values would hold registers the accumulators need through the whole loop
    early, stack = set(), [*reduces, *inner]
    while stack:
      n = stack.pop()
      if n not in early: early.add(n); stack.extend(n.src)
    late = {n for n in pre if n not in early and n.op is not Ops.STORE}
    if late:
      pre = [n for n in pre if n not in late]
      late |= set(post)
      post = [n for n in nodes if n in late]
  program += [n for n in pre if n.op is not Ops.STORE]
  if reduces:
    accs = [UOp(Ops.DEFINE_ACC, r.dtype, (r,)) for r in reduces]
    program += accs
    # each body node goes right after the innermost reduce loop it reads: index math that does not move with
    # the inner loops (a convolution's div/mod over the kernel window) is computed once per outer iteration
    depth = {r: d for d, r in enumerate(reduce_ranges)}
    for d, r in enumerate(reduce_ranges):
      program.append(r)
      program += [n for n in inner if max(depth[x] for x in rcache[n] & rset) == d]
    program += [UOp(Ops.ASSIGN, r.dtype, (acc, r.src[0]), r.arg) for acc, r in zip(accs, reduces)]
    program += [UOp(Ops.ENDRANGE, dtypes.void, (r,)) for r in reversed(reduce_ranges)]
    program += reduces
  program += post
  program += [n for n in pre if n.op is Ops.STORE]
  program += [UOp(Ops.ENDRANGE, dtypes.void, (r,)) for r in reversed(outer_ranges)]
  return _expand_loops(program, body_nodes, loop_of) if body_nodes or any(n.op is Ops.LOOP for n in program) else program


def _stage_blocks(nodes: list, rcache: dict, outer_ranges: list, skip: set) -> tuple[dict, set]:
  """The copies of staged slabs (codegen's _Evaluator._staged: STOREs into local arrays, in loops of kind "stage"),
  each placed as soon as the output loops its slab depends on are open, before the loops inside them: a weight panel
  is copied once per iteration of the thread-split loop over panels, then read by every tile of rows. Returns {depth
  in outer_ranges (-1: before them): the program lines to emit there} and the nodes they hold."""
  position = {r: d for d, r in enumerate(outer_ranges)}
  copies: dict = {}  # the copy's loops -> its stores
  for n in nodes:
    loops = frozenset(r for r in rcache[n] if r.arg.kind == AxisKind.STAGE)
    if n.op is Ops.STORE and n.src[0].op is Ops.DEFINE_LOCAL and loops: copies.setdefault(loops, []).append(n)
  blocks: dict = {}
  placed: set = set()
  for loops, stores in copies.items():
    above = set(toposort(stores))
    # what the copy computes, in graph order; what moves with no loop (size variables) stays before every loop
    own = [n for n in nodes if n in above and n not in placed and n.op not in skip and n.op is not Ops.DEFINE_LOCAL and rcache[n]]
    body = [n for n in own if rcache[n] & loops]
    # the innermost loop is the one the loads move along the least (reading the source in order)
    loads = [n for n in body if n.op is Ops.LOAD]
    ranges = [n for n in nodes if n in above and n.op is Ops.RANGE]
    moved = {r: sum(abs(stride_along(ld.src[1], r, ranges) or 0) for ld in loads) for r in loops}
    order = sorted(loops, key=lambda r: (-moved[r], r.arg.order))
    level = {r: d for d, r in enumerate(order)}
    lines = [n for n in own if not rcache[n] & loops]
    for d, r in enumerate(order): lines += [r, *[n for n in body if max(level[x] for x in rcache[n] & loops) == d]]
    lines += [UOp(Ops.ENDRANGE, dtypes.void, (r,)) for r in reversed(order)]
    blocks.setdefault(max((position[r] for s in stores for r in rcache[s] if r in position), default=-1), []).extend(lines)
    placed |= set(own)
  return blocks, placed


def _output_ranges(nodes: list, reduce_ranges: set, loop_order: tuple = ()) -> list:
  """The kernel's loops outside its reduction, the thread-split loop outermost, then in RangeArg.order, output loops
  in `loop_order` (else axis order)."""
  place = {a: k for k, a in enumerate(loop_order)}

  def key(r: UOp) -> tuple:
    kind, group, axis = r.arg.order
    return (r.arg.kind != AxisKind.SPLIT, kind, group, place.get(axis, axis) if r.arg.kind in (AxisKind.GLOBAL, AxisKind.SPLIT) else axis)
  return sorted({n for n in nodes if n.op is Ops.RANGE and n.arg.kind not in (AxisKind.LOOP, AxisKind.STAGE, AxisKind.VECTOR)} - reduce_ranges, key=key)


def _linearize_rows(nodes: list, rcache: dict) -> list[UOp]:
  """linearize for a kernel with row reductions: every node is placed in the outermost output loop that holds the
  loops it reads, and each reduction (with the reductions sharing its loops) is one block there: accumulators, its
  reduce loops with their body, the updates, the results. Softmax's kernel is then: row loop { max loop; sum loop
  (reads the max); column loop (reads both) }."""
  groups: dict = {}  # reduce ranges -> the REDUCEs over them
  for n in nodes:
    if n.op is Ops.REDUCE: groups.setdefault(n.src[1:], []).append(n)
  reduce_ranges = {r for key in groups for r in key}
  outer = _output_ranges(nodes, reduce_ranges)
  position = {r: d for d, r in enumerate(outer)}
  loop_of = _loop_membership(nodes)
  skip = {Ops.RANGE, Ops.SINK, Ops.CONST, Ops.DEFINE_GLOBAL, Ops.DEFINE_LOCAL, Ops.LOOP_VAR}
  body_nodes = [n for n in nodes if loop_of[n] and n.op not in skip]
  order = {n: i for i, n in enumerate(nodes)}
  # each node's item: the reduction block it is computed in (the block's key), or itself
  item: dict = {}
  for n in nodes:
    if n.op in skip or loop_of[n]: continue
    owner = next((key for key in groups if n.op is not Ops.REDUCE and rcache[n] & set(key)), None)
    item[n] = ("block", n.src[1:]) if n.op is Ops.REDUCE else ("block", owner) if owner is not None else n
  members: dict = {}
  for n, it in item.items(): members.setdefault(it, []).append(n)

  def depth(it) -> int:
    deps = set().union(*[rcache[n] for n in members[it]]) - reduce_ranges if isinstance(it, tuple) else rcache[it]
    return max((position[r] for r in deps if r in position), default=-1)
  needs: dict = {it: set() for it in members}
  for n, it in item.items():
    for s_ in n.src:
      if s_ in item and item[s_] != it: needs[it].add(item[s_])
  # items in dependency order (ties: graph order), then by depth
  done, ready_order = set(), []
  pending = sorted(members, key=lambda it: min(order[n] for n in members[it]))
  while pending:
    it = next(x for x in pending if needs[x] <= done)
    pending.remove(it); done.add(it); ready_order.append(it)
  at_depth: dict = {}
  for it in ready_order: at_depth.setdefault(depth(it), []).append(it)

  def emit(it) -> list:
    if not isinstance(it, tuple): return [it]
    key = it[1]
    reds = groups[key]
    ranges = _order_reduce_ranges(list(key), nodes, rcache)
    level = {r: d for d, r in enumerate(ranges)}
    body = sorted((n for n in members[it] if n.op is not Ops.REDUCE), key=order.get)
    accs = [UOp(Ops.DEFINE_ACC, r.dtype, (r,)) for r in reds]
    out = list(accs)
    for d, r in enumerate(ranges):
      out.append(r)
      out += [n for n in body if max(level[x] for x in rcache[n] & set(key)) == d]
    out += [UOp(Ops.ASSIGN, r.dtype, (acc, r.src[0]), r.arg) for acc, r in zip(accs, reds)]
    out += [UOp(Ops.ENDRANGE, dtypes.void, (r,)) for r in reversed(ranges)]
    return out + reds
  program: list[UOp] = [n for n in nodes if n.op in (Ops.DEFINE_GLOBAL, Ops.DEFINE_LOCAL)]
  for d in range(-1, len(outer)):
    if d >= 0: program.append(outer[d])
    for it in at_depth.get(d, []): program += emit(it)
  program += [UOp(Ops.ENDRANGE, dtypes.void, (r,)) for r in reversed(outer)]
  return _expand_loops(program, body_nodes, loop_of) if body_nodes or any(n.op is Ops.LOOP for n in program) else program


def _order_reduce_ranges(reduce_ranges: list, nodes: list, rcache: dict) -> list:
  """Nest the reduce loops so that the innermost one walks every load it moves contiguously (locality, and
  SIMD along it), and otherwise so the one that the fewest divisions and modulos read runs innermost: index
  math over a convolution's window then stays out of the loop over channels. Stable otherwise."""
  divmods = [n for n in nodes if n.op in (Ops.IDIV, Ops.MOD) and n.dtype.is_int]
  cost = {r: sum(1 for n in divmods if r in rcache[n]) for r in reduce_ranges}
  loads = [n for n in nodes if n.op is Ops.LOAD]
  all_ranges = [n for n in nodes if n.op is Ops.RANGE]

  def unit_stride(r: UOp) -> bool:
    moving = [ld for ld in loads if r in rcache[ld.src[1]]]
    return bool(moving) and all(stride_along(ld.src[1], r, all_ranges) == 1 for ld in moving)
  return sorted(reduce_ranges, key=lambda r: (unit_stride(r), -cost[r]))


def _loop_membership(nodes: list) -> dict:
  """node -> the loop ids whose counter or state it reads (a LOOP hides its own loop), for toposorted nodes."""
  if not any(n.op is Ops.LOOP_VAR or n.op is Ops.RANGE and n.arg.kind == AxisKind.LOOP for n in nodes):
    return dict.fromkeys(nodes, frozenset())  # (the common case: no LT.loop in the kernel)
  loop_of: dict = {}
  for n in nodes:
    if n.op is Ops.LOOP_VAR: loop_of[n] = frozenset([n.arg.loop])
    elif n.op is Ops.RANGE and n.arg.kind == AxisKind.LOOP: loop_of[n] = frozenset([n.arg.axis])
    else:
      deps = frozenset().union(*[loop_of[s] for s in n.src])
      loop_of[n] = deps - {n.arg[0]} if n.op is Ops.LOOP else deps
    if len(loop_of[n]) > 1: raise NotImplementedError("nested LT.loop")
  return loop_of


def _expand_loops(program: list, body_nodes: list, loop_of: dict) -> list:
  """Put each loop where its first LOOP result is read: state accumulators set to the initial values, the
  counter loop, the state read at the top, the step (break if keep_going is false), the state update."""
  out, done = [], set()
  for u in program:
    if u.op is not Ops.LOOP: out.append(u); continue
    lid = u.arg[0]
    if lid in done: continue
    done.add(lid)
    counter, keep_going, *rest = u.src
    inits, nexts = rest[:len(rest) // 2], rest[len(rest) // 2:]
    state = [UOp(Ops.LOOP_VAR, i.dtype, (), KernelLoopVar(lid, k)) for k, i in enumerate(inits)]
    accs = [UOp(Ops.DEFINE_ACC, v.dtype, (v, i)) for v, i in zip(state, inits)]
    body = [n for n in body_nodes if lid in loop_of[n]]
    out += accs + [counter] + state
    if not (keep_going.op is Ops.CONST and keep_going.arg):
      # test before the step runs: the step may be undefined once the loop should stop (x % 0)
      test = set(keep_going.toposort())
      out += [n for n in body if n in test] + [UOp(Ops.BREAK_UNLESS, dtypes.void, (keep_going, counter))]
      body = [n for n in body if n not in test]
    out += body + [UOp(Ops.ASSIGN, a.dtype, (a, n)) for a, n in zip(accs, nexts)]
    out.append(UOp(Ops.ENDRANGE, dtypes.void, (counter,)))
    out += [n for n in program if n.op is Ops.LOOP and n.arg[0] == lid]
  return out
