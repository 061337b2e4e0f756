"""Kernel optimizer: choose per-kernel opts before codegen.

`KernelOpts` says how to shape one kernel's loops:
- `upcast`: output axis -> factor. The axis' loop steps by `factor` and the body is replicated for
  each of the `factor` positions, so values that do not depend on that axis (a matmul's other
  operand) are loaded once and reused from registers. This is the register blocking of GEMM and
  convolution: a 4x4 tile of outputs shares 4+4 loads per reduction step instead of 16+16.
- `split_axis`: the output axis whose iterations are divided among CPU threads (the outermost loop
  left with at least two iterations); the kernel takes its bounds as arguments.
- `loop_order`: how the output loops nest when not in axis order (a transposing copy reads its source in order).

- `group` (GPU-style devices): a work-group of up to `group` work-items computes one output together, each
  taking a strided share of the outermost reduce loop (renderer/cstyle.py combines the shares in local memory).

`heuristic_opts(item, plain_ast)` picks them for the CPU; `gpu_opts` for OpenCL and CUDA devices, where every
output position is its own work-item (no upcast, no thread split) and long reductions with few outputs are grouped.
`heuristic_opts` picks them from the kernel as first built: upcast the (at most two)
output axes along which some load is invariant, when the kernel reduces (a register-blocking factor need not
divide a constant axis: the last tile then overlaps the one before it). It reads shapes and index
expressions only; it never runs anything. With symbolic sizes (core/sym.py) it reads the first call's
sizes where it only estimates. A symbolic SIMD axis needs a factor that divides it for every size the graph serves,
under a guard (codegen's _divided_variables); a symbolic axis blocked for registers needs none: its last tile clamps
its positions past the end (codegen's _upcast_index).
"""
from __future__ import annotations
import itertools
from dataclasses import dataclass
from torch_uop.core.uop import UOp, Ops, ELEMENTWISE, substitute, AxisKind
from torch_uop.core.dtypes import dtypes
from torch_uop.core.sym import is_sym, hint, SizeContext, SymbolicSizeError, evaluate
from torch_uop.core.symbolic import simplify


@dataclass(frozen=True)
class KernelOpts:
  upcast: tuple = ()          # ((axis, factor), ...)
  split_axis: int | None = None
  vector_axis: int | None = None  # an upcast output axis SIMD runs along; the reduce loop then stays scalar
  group: int = 0              # GPU-style devices: work-items that share one output's outermost reduce loop (0: none)
  loop_order: tuple = ()      # the output loops' nesting, outermost axis first (the split loop outermost); (): axis order

  def factor(self, axis: int) -> int: return dict(self.upcast).get(axis, 1)


def has_row_reductions(reduces: list) -> bool:
  """Whether a kernel's REDUCEs include row reductions (loops of their own, schedule.KernelItem.row_reduces)."""
  return any(r.src[1].arg.row_reduce for r in reduces)


UPCAST_FACTOR = 4
VECTOR_BLOCK_FACTOR = 8
VECTOR_UPCAST = 16   # one AVX-512 register of float32 (two of AVX2): the lowering's unit of a whole vector
STAGE_MAX_BYTES = 1 << 20  # the most a kernel's staged slabs (codegen's local copies) ever take, whatever the stack
STAGED_SLAB = -1  # the buffer id that codegen's planning view (staging="plan") gives a staged slab's loads
MAX_UPCAST_AXES = 2


@dataclass(frozen=True)
class VectorUnit:
  """What a CPU's vector registers hold, as far as register tiles care (runtime/cpu.py vector_unit): `lanes` float32
  per register and how many `registers` there are. A tile's accumulators and the operands it keeps loaded must fit
  in the registers: past that LLVM spills accumulators to the stack inside the reduce loop, and a GEMM runs at
  half speed (16 accumulators on AVX2's 16 registers). `stage_bytes`: the most a kernel may copy into local arrays
  (staged slabs, codegen's _Evaluator._staged), which live on the stack of the thread running it (runtime/cpu.py
  stage_budget sizes it by the threads' stacks)."""
  lanes: int = 8
  registers: int = 16
  stage_bytes: int = STAGE_MAX_BYTES // 2

  def rows_beside(self, vectors: int) -> int:
    """Rows of a tile `vectors` registers wide with SIMD along the row: rows x vectors accumulators, plus the row's
    vectors of the shared operand and one broadcast of the other."""
    return min(VECTOR_BLOCK_FACTOR, (self.registers - vectors - 1) // vectors)

  def square_factor(self) -> int:
    """The side f of an f x f tile with SIMD along the reduction: f*f vector accumulators, plus f vectors loaded
    from each operand."""
    f = UPCAST_FACTOR
    while f > 2 and f * f + 2 * f > self.registers: f -= 1
    return f


AVX2 = VectorUnit(8, 16)  # the default where the caller does not say
MIN_BLOCKED_REDUCE = 8
MIN_SIMD_REDUCE = 8


def trip_count(r: UOp) -> int:
  """A loop's trip count; for a symbolic one, its value in the call being compiled (a heuristic's estimate, never
  used where correctness depends on it); 0 when it is data."""
  if r.src[0].op is Ops.CONST: return r.src[0].arg
  try: return evaluate(r.src[0], SizeContext.current().hints)
  except (SymbolicSizeError, KeyError): return 0  # no symbolic compile, or a trip count read from data


def stride_along(index: UOp, r: UOp, ranges: list) -> int | None:
  """How far an affine index moves when loop r steps by one (None if that is not a constant)."""
  zero = {x: UOp.const(dtypes.index, 0) for x in ranges}
  at0 = simplify(substitute(index, zero))
  at1 = simplify(substitute(index, {**zero, r: UOp.const(dtypes.index, 1)}))
  if at0.op is Ops.CONST and at1.op is Ops.CONST: return at1.arg - at0.arg
  return None


def _divisible(size, factor: int, used_vars: set) -> bool:
  """Whether an upcast by `factor` may be tried on an axis of this size: a number it divides, or one size variable
  (not upcast yet) whose value in the call being compiled it divides (a heuristic read: nothing is guarded here)."""
  if not is_sym(size): return size % factor == 0
  return size.uop.op is Ops.DEFINE_VAR and size.uop not in used_vars and hint(size) % factor == 0


def _guard_divisible(size, factor: int, used_vars: set) -> bool:
  """Commit to the upcast: a symbolic size records the guard size % factor == 0 (sizes that fail it get a compile
  of their own) and its variable is taken."""
  if not is_sym(size): return True
  if size % factor != 0: return False
  used_vars.add(size.uop)
  return True


MAX_TAIL_WASTE = 1.15  # a register tile that does not divide its axis may compute this much more than the axis holds
SMALL_TAIL_WASTE = 1.04  # ... and one wasting at most this is preferred to a smaller factor that divides the axis


def _block_factor(size: int, preferred: int) -> int:
  """The register-blocking factor for a constant axis: `preferred` where its partial last tile (codegen clamps its
  extra positions) wastes little, else the largest factor down to half of it that divides the axis, else `preferred`
  where the waste is still bounded; 0 for an axis too short to block. A smaller tile costs more than the tail: with
  fewer accumulators than the FMA units keep in flight (latency x throughput, 8 on a Zen 3) the reduce loop waits on
  them (128 rows beside a 3-column K-SIMD tile: 3 rows and 9 accumulators, not 2 rows and 6, 82 -> 107 GFLOP/s)."""
  if size < preferred: return 0
  waste = -(-size // preferred) * preferred / size
  if waste <= SMALL_TAIL_WASTE: return preferred
  for f in range(preferred - 1, preferred // 2 - 1, -1):
    if f >= 2 and size % f == 0: return f
  return preferred if waste <= MAX_TAIL_WASTE else 0


def _depends_on(u: UOp, r: UOp, cache: dict) -> bool:
  key = (u, r)
  if key not in cache: cache[key] = u is r or any(_depends_on(s, r, cache) for s in u.src)
  return cache[key]


def heuristic_opts(out_shape: tuple, plain_ast: UOp, vectors: VectorUnit = AVX2) -> KernelOpts:
  """`vectors`: the CPU's vector registers (runtime/cpu.py vector_unit), which size the register tiles."""
  nodes = plain_ast.toposort()
  ranges = {n.arg.axis: n for n in nodes if n.op is Ops.RANGE and n.arg.kind == AxisKind.GLOBAL}
  all_ranges = [n for n in nodes if n.op is Ops.RANGE]
  reduces = [n for n in nodes if n.op is Ops.REDUCE]
  if has_row_reductions(reduces):
    # row reductions (softmax in one kernel): each loop over a row is left for LLVM to vectorize; upcasting the
    # output would only replicate the elementwise tail
    return KernelOpts((), next((a for a in range(len(out_shape)) if hint(out_shape[a]) >= 2), None))
  upcast, vector_axis = [], None
  used_vars: set = set()  # size variables an upcast already divides (codegen writes each as factor * a new variable)
  reduce_size = 1
  for r in (reduces[0].src[1:] if reduces else ()): reduce_size *= trip_count(r)
  # register blocking pays off when each accumulator sees a long enough reduction
  if reduces and reduce_size >= MIN_BLOCKED_REDUCE:
    loads = [n for n in nodes if n.op is Ops.LOAD]
    stores = [n for n in nodes if n.op is Ops.STORE]
    cache: dict = {}
    reduce_ranges = reduces[0].src[1:]

    def contiguous_along(r: UOp, accesses) -> bool:
      moving = [a for a in accesses if _depends_on(a.src[1], r, cache)]
      return bool(moving) and all(stride_along(a.src[1], r, all_ranges) == 1 for a in moving)

    # SIMD along the reduction when every load it moves is contiguous there (e.g. x @ w.T); otherwise
    # along an output axis that the loads and the store walk contiguously (e.g. x @ w), by upcasting it
    # (a reduce loop shorter than a vector is not worth SIMD: a 3x3 convolution window)
    # The SIMD axis takes two vector registers per row where it divides (with 32 registers, 8 rows x 2 vectors: 16
    # accumulators, two vector loads and 8 broadcasts per 16 FMAs; with 16, 6 rows), else one. A symbolic axis takes
    # VECTOR_UPCAST whatever the CPU, so the guard on its divisibility, and the sizes one compile serves, stay the same
    # everywhere.
    if not any(contiguous_along(r, loads) and trip_count(r) >= MIN_SIMD_REDUCE for r in reduce_ranges):
      for axis in sorted(ranges, reverse=True):
        size, r = out_shape[axis], ranges[axis]
        widths = (VECTOR_UPCAST,) if is_sym(size) else (2 * vectors.lanes, vectors.lanes)
        width = next((w for w in widths if _divisible(size, w, used_vars)), None)
        if width is None: continue
        # (with no load invariant along the axis too: a column sum, bias gradients, adds vectors of rows)
        if contiguous_along(r, loads + stores) and _guard_divisible(size, width, used_vars):
          upcast.append((axis, width)); vector_axis = axis
          break
    # register blocking: axes (innermost first) along which some load's address does not move; next to a SIMD axis,
    # one along which a vector load does not move (rows of x @ w share each vector of w; blocking the other way
    # would share only x's broadcast scalar)
    vector_loads = [ld for ld in loads if _depends_on(ld.src[1], ranges[vector_axis], cache)] if vector_axis is not None else []
    simd_registers = max(1, dict(upcast)[vector_axis] // vectors.lanes) if vector_axis is not None else 0
    blockable = []
    for axis in sorted(ranges, reverse=True):
      size, r = out_shape[axis], ranges[axis]
      # next to a SIMD axis, a taller tile (up to 8 rows) keeps more accumulators in registers. An axis of symbolic
      # size (a batch or sequence length) takes the preferred factor: its last tile clamps its positions past the end
      # (codegen's _upcast_index), which needs no guard, so one compile still serves every size
      preferred = vectors.rows_beside(simd_registers) if vector_axis is not None else vectors.square_factor()
      factor = preferred if is_sym(size) else _block_factor(size, preferred)
      if axis == vector_axis or not factor: continue
      if vector_loads and all(_depends_on(ld.src[1], r, cache) for ld in vector_loads): continue
      # (what moves along the axis may be a load or an index compare, as in a one-hot sum)
      if any(not _depends_on(ld.src[1], r, cache) for ld in loads) and _depends_on(reduces[0], r, cache):
        blockable.append((axis, factor))
    upcast += _fewest_loads_tile(blockable, MAX_UPCAST_AXES - len(upcast), loads, ranges, cache)
    if vector_axis is not None and len(upcast) == 1: upcast = [(vector_axis, _wide_simd(out_shape[vector_axis], upcast[0][1], vectors))]
  if not reduces: upcast, vector_axis = _transpose_tile(out_shape, nodes, ranges, all_ranges, vectors)
  factors = dict(upcast)
  # (a symbolic size is at least 2 when its variable's range says so; otherwise the split is a guarded decision)
  # (a blocked axis of symbolic size is looped over as it was unblocked: its tile count would be a new guard)
  looped = [a for a in range(len(out_shape))
            if out_shape[a] // (1 if is_sym(out_shape[a]) and a != vector_axis else factors.get(a, 1)) >= 2]
  order = () if reduces else _read_order(out_shape, nodes, ranges, all_ranges)
  if order: looped = [a for a in order if a in looped]
  split = _outermost_axis(looped, ranges, nodes, reduces) if reduces and len(looped) >= 2 else next(iter(looped), None)
  return KernelOpts(tuple(sorted(upcast)), split, vector_axis, loop_order=order)


WIDE_SIMD_MIN_TILES = 4  # a widened SIMD tile still leaves this many tiles along its axis to share among threads


def _wide_simd(size, width: int, vectors: VectorUnit) -> int:
  """The SIMD tile's width where no other axis is blocked beside it (a matrix-vector product's single row, a column
  sum): up to half the registers wide, so each reduce step reads a longer run of each row (1 KB on AVX-512 against
  the two vectors' 128 B: a row-major weight streamed by a GEMV runs at about twice the bandwidth), where that
  divides the axis into at least WIDE_SIMD_MIN_TILES tiles; else `width`."""
  if is_sym(size): return width
  for vecs in (vectors.registers // 2, vectors.registers // 4):
    wide = vecs * vectors.lanes
    if wide > width and size % wide == 0 and size // wide >= WIDE_SIMD_MIN_TILES: return wide
  return width


def _fewest_loads_tile(blockable: list, axes: int, loads: list, ranges: dict, cache: dict) -> list:
  """Up to `axes` of the blockable (axis, factor) pairs (innermost first) as a register tile: the set whose tile
  loads the fewest values per accumulator in each reduce step (a load whose address moves along a tiled axis is
  loaded once per position of it), the innermost on a tie. A convolution's weight gradient over rows reduces
  x[c, q + ky*W + kx] * g[o, q]: a tile over (ky, kx) loads 9 + 1 values for 9 accumulators, one over (o, kx) 3 + 3."""
  def loads_per_accumulator(tile) -> float:
    total = 0
    for ld in loads:
      n = 1
      for axis, f in tile:
        if _depends_on(ld.src[1], ranges[axis], cache): n *= f
      total += n
    accumulators = 1
    for _, f in tile: accumulators *= f
    return total / accumulators
  tiles = [list(t) for t in itertools.combinations(blockable, min(axes, len(blockable)))]
  return min(tiles, key=loads_per_accumulator) if tiles else []


MIN_STORE_RUN_BYTES = 64  # a kernel's innermost loop stores at least a cache line in a row before its loops may reorder


def _read_order(out_shape: tuple, nodes: list, ranges: dict, all_ranges: list) -> tuple:
  """The output loops of a kernel without reductions nested so that its loads read memory in order: the axis the
  store walks contiguously stays innermost, the others go outermost first by how far the loads jump along them.
  A transposing copy (packing a weight into panels, splitting attention heads) then reads its source row after
  row and writes a few streams of whole cache lines, where in axis order each step of the loop around the
  innermost one would read a new row, from a new page. Axes no load moves along (broadcasts) keep their places,
  as does everything when the innermost loop stores less than MIN_STORE_RUN_BYTES in a row.
  () when that is axis order."""
  loads = [n for n in nodes if n.op is Ops.LOAD]
  stores = [n for n in nodes if n.op is Ops.STORE]
  axes = sorted(ranges)
  if len(axes) < 3 or not loads or len(stores) != 1 or any(is_sym(out_shape[a]) for a in axes): return ()

  def stride(access: UOp, axis: int) -> int:
    st = stride_along(access.src[1], ranges[axis], all_ranges)
    return abs(st) if st is not None else 0
  inner = axes[-1]
  if stride(stores[0], inner) != 1 or out_shape[inner] * stores[0].src[2].dtype.itemsize < MIN_STORE_RUN_BYTES: return ()
  jumps = {a: sum(stride(ld, a) * ld.dtype.itemsize for ld in loads) for a in axes[:-1]}
  moving = iter(sorted((a for a in axes[:-1] if jumps[a]), key=lambda a: -jumps[a]))
  order = (*[next(moving) if jumps[a] else a for a in axes[:-1]], inner)
  return () if order == tuple(axes) else order


# math functions that are one instruction or a few on a CPU; every other one expands into tens of operations
CHEAP_MATH = frozenset({"sqrt", "abs", "floor", "ceil", "trunc", "round", "copysign"})
TRANSPOSE_TILE_MAX_OPS = 8  # an elementwise kernel with more operations per element than this is not tiled (the
                            # 8x8 tile unrolls its element 64 times; heavy math vectorizes along one loop instead)


def _transpose_tile(out_shape: tuple, nodes: list, ranges: dict, all_ranges: list, vectors: VectorUnit) -> tuple:
  """A kernel without reductions that stores contiguously along one output axis and loads contiguously along another
  (a transposing copy: packing x @ W.T's weight, attention's k.transpose(-1, -2), NHWC <-> NCHW) gets a square tile
  of `lanes` x `lanes` elements over those two axes, unrolled: the LLVM renderer turns it into vector loads, a shuffle
  transpose in registers and vector stores (renderer/transpose.py). Untiled, one of the two sides goes element by
  element (768 x 768 floats on a Zen 3: 4.6 -> 24 GB/s, and 49-51 GB/s since the renderer transposes the tile). Only ungated loads at constant strides, sizes of at least a tile, and cheap
  elements: at most TRANSPOSE_TILE_MAX_OPS value operations, no math function beyond CHEAP_MATH. Returns (the upcasts,
  the SIMD axis: the store's), or ((), None)."""
  loads = [n for n in nodes if n.op is Ops.LOAD]
  stores = [n for n in nodes if n.op is Ops.STORE]
  if len(stores) != 1 or not loads or any(len(ld.src) != 2 for ld in loads): return (), None
  values = [n for n in nodes if n.dtype is not dtypes.index and (n.op in ELEMENTWISE and n.op is not Ops.CAST or n.op is Ops.MATH)]
  if len(values) > TRANSPOSE_TILE_MAX_OPS or any(n.op is Ops.MATH and n.arg not in CHEAP_MATH for n in values): return (), None
  lanes = vectors.lanes

  def unit_axis(access: UOp):  # the output axis along which an access moves by one element, if any
    return next((a for a, r in ranges.items() if stride_along(access.src[1], r, all_ranges) == 1), None)
  store_axis = unit_axis(stores[0])
  if store_axis is None: return (), None
  for ld in loads:
    load_axis = unit_axis(ld)
    # (a load that stays put along the store axis, a row's scale or an embedding row's index, is a broadcast, not a
    # transposition: the plain loop already stores and loads the others contiguously)
    if load_axis is None or load_axis == store_axis or stride_along(ld.src[1], ranges[store_axis], all_ranges) in (None, 0): continue
    sizes = (out_shape[load_axis], out_shape[store_axis])
    # a size the tile does not divide ends with a tile overlapping the one before (codegen's _upcast_index)
    if any(is_sym(x) or x < lanes for x in sizes): return (), None
    return sorted([(load_axis, lanes), (store_axis, lanes)]), store_axis
  return (), None


SWEEP_CACHE_BYTES = 1 << 20  # an operand this small stays in a core's L2 cache while the loops sweep it again


def _outermost_axis(looped: list, ranges: dict, nodes: list, reduces: list) -> int:
  """The output axis to run outermost, which is also the one split among threads (codegen puts the split loop
  first, the other output loops inside it in axis order). This is the first looped axis unless a later one moves
  operands bigger than L2 (the weight of x @ W.T when the layer is wide and there are few rows). In that case the
  later axis goes outermost, so the big operand streams from memory once and the small one is swept from cache.
  An axis along which a staged slab moves (a weight panel the kernel copies onto its stack) goes outermost whatever
  the sizes: inside another loop, the slab would be copied again for every iteration of that loop (every tile of
  rows), where outermost each panel is copied once and read by all the tiles (BERT-512's weight gradient
  dh.t() @ x, 3072 x 512 x 768: 204 -> 262 GFLOP/s on two AVX-512 cores, eager 342)."""
  reduce_ranges = {r for red in reduces for r in red.src[1:]}
  cache: dict = {}
  staged = [ld for ld in nodes if ld.op is Ops.LOAD and ld.src[0].op is Ops.DEFINE_GLOBAL and ld.src[0].arg == STAGED_SLAB]
  slab_axes = [a for a in looped if a in ranges and any(_depends_on(ld.src[1], ranges[a], cache) for ld in staged)]
  if slab_axes: return slab_axes[0]
  operands = [ld for ld in nodes if ld.op is Ops.LOAD and any(_depends_on(ld.src[1], r, cache) for r in reduce_ranges)]

  def footprint(axis: int) -> int:  # bytes of the operands whose addresses move along this axis
    r = ranges.get(axis)
    if r is None: return 0
    total = 0
    for ld in operands:
      lo, hi = ld.src[1].vmin, ld.src[1].vmax
      if _depends_on(ld.src[1], r, cache) and isinstance(lo, int) and isinstance(hi, int): total += (hi - lo + 1) * ld.dtype.itemsize
    return total
  first = looped[0]
  best = max(looped, key=footprint)
  return best if footprint(best) > max(SWEEP_CACHE_BYTES, footprint(first)) else first


GPU_UPCAST = 4             # the most one output axis is upcast by in a GPU work-item
GROUP_SIZE = 256           # work-items per group of a grouped reduction (a power of two)
GROUP_MIN_REDUCE = 256     # a reduction at least this long ...
GROUP_MAX_OUTPUTS = 16384  # ... with fewer outputs than the device runs work-items at once (at most this many) is
                           # grouped: one work-item per output would leave the device idle


def _contiguous_upcast(out_shape: tuple, nodes: list, outputs: int, parallelism: int) -> KernelOpts:
  """An elementwise kernel with work enough for the whole device several times over: GPU_UPCAST consecutive
  outputs per work-item along an axis the stores walk contiguously (the renderer makes vector loads and stores)."""
  if outputs < GPU_UPCAST * parallelism: return KernelOpts()
  ranges = [n for n in nodes if n.op is Ops.RANGE]
  stores = [n for n in nodes if n.op is Ops.STORE]
  for r in sorted((n for n in ranges if n.arg.kind == AxisKind.GLOBAL), key=lambda n: -n.arg.axis):
    size = out_shape[r.arg.axis]
    if not is_sym(size) and size % GPU_UPCAST == 0 and all(stride_along(s.src[1], r, ranges) == 1 for s in stores):
      return KernelOpts(((r.arg.axis, GPU_UPCAST),))
  return KernelOpts()


def gpu_opts(out_shape: tuple, plain_ast: UOp, max_group: int = GROUP_SIZE, parallelism: int = GROUP_MAX_OUTPUTS) -> KernelOpts:
  """Opts for GPU-style devices: every output position is a work-item; a long reduction with fewer outputs than
  `parallelism` (work-items the device runs at once) is grouped. The group size is only a heuristic read of the
  sizes (any size works: the loop is strided)."""
  nodes = plain_ast.toposort()
  reduces = [n for n in nodes if n.op is Ops.REDUCE]
  outputs = 1
  for s in out_shape: outputs *= hint(s)
  if not reduces: return _contiguous_upcast(out_shape, nodes, outputs, parallelism)
  reduce_size = 1
  for r in reduces[0].src[1:]: reduce_size *= trip_count(r)
  group = 1 << (min(GROUP_SIZE, max_group).bit_length() - 1)  # a power of two within the device's limit
  if group >= 2 and reduce_size >= GROUP_MIN_REDUCE and outputs < min(parallelism, GROUP_MAX_OUTPUTS):
    return KernelOpts(group=group)
  # register blocking as on the CPU (a matmul's 4x4 tile of outputs per work-item shares 4+4 loads per step), with
  # no SIMD axis: a work-item's upcast is at most GPU_UPCAST along an axis
  cpu = heuristic_opts(out_shape, plain_ast, VectorUnit(8, 32))  # (the tiles of an AVX2 CPU with registers to spare)
  return KernelOpts(tuple((axis, min(f, GPU_UPCAST)) for axis, f in cpu.upcast))
