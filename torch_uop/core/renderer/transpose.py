"""Transposes in registers: find, in a linear program, the square tiles of loads that its stores read crosswise.

A transposing copy's register tile (core/opt.py `_transpose_tile`) unrolls into `V` runs of `V` scalar loads, each
run consecutive in memory, whose values are stored `V` runs crosswise: store run j, position k, holds (a function
of) load run k, position j. Left scalar, that is V*V loads and V*V stores, which LLVM's SLP pass does not turn into
vector loads and shuffles (a weight packed into panels moved 6-15 GB/s on a Zen 3). `find_transpose_tiles` finds
those tiles so that the renderer loads each run as one vector, transposes the V vectors with `butterfly_masks`
(log2 V stages of two-input shuffles) and reads each scalar load's value out of the transposed vector the store run
uses; the stores and whatever they compute stay scalar, for LLVM's SLP pass to vectorize as consecutive stores.

A tile lies in one straight-line stretch of the program (no loop boundary or early exit between its loads), its
loads are ungated and read a kernel argument that the stretch does not store to, and every run's index is the same
sum of terms plus consecutive constants. It only changes where values come from, never which values: a load's
value is the same element read through a vector.
"""
from __future__ import annotations
from dataclasses import dataclass
from torch_uop.core.uop import UOp, Ops, ELEMENTWISE
from torch_uop.core.symbolic import base_and_offset

VECTOR_BYTES = 32  # one AVX register: 8 floats, 4 doubles
_BOUNDARIES = (Ops.RANGE, Ops.ENDRANGE, Ops.BREAK_UNLESS)


@dataclass(eq=False)
class TransposeTile:
  """`rows[k]`: the first load of run k (its index addresses the run's vector); `lanes`: V. A load of the tile at
  position j of run k holds element k of transposed vector j (`TileLoad`). `vector_stores`: {j: the store run, in
  address order} for the store runs that store transposed vector j itself (a plain copy): the renderer writes each
  as one vector store, where LLVM, given scalar stores of its elements, would fold the shuffles back into scalar
  moves."""
  rows: list
  lanes: int
  vector_stores: dict


@dataclass(frozen=True)
class TileLoad:
  tile: TransposeTile
  column: int   # which transposed vector (position in its run)
  lane: int     # which element of it (which run)


def _runs(accesses: list, lanes: int) -> dict:
  """{access: (run id, position)} for accesses grouped into runs of `lanes` consecutive elements (a group's sorted
  offsets cut into whole runs; a group that is not whole runs of consecutive offsets gives none)."""
  groups: dict = {}
  for a in accesses:
    terms, off = base_and_offset(a.src[1])
    groups.setdefault((a.src[0], terms), []).append((off, a))
  out: dict = {}
  for members in groups.values():
    members.sort(key=lambda m: m[0])
    offsets = [m[0] for m in members]
    if len(members) % lanes or len(set(offsets)) != len(offsets): continue
    for start in range(0, len(members), lanes):
      run = members[start:start + lanes]
      if run[-1][0] - run[0][0] != lanes - 1: continue
      for pos, (_, a) in enumerate(run): out[a] = (id(run[0][1]), pos)
  return out


def _source_load(value: UOp, run_of: dict):
  """The one load of a run that a stored value is computed from through elementwise ops (None if none or several)."""
  found, stack, seen = set(), [value], set()
  while stack:
    u = stack.pop()
    if u in seen: continue
    seen.add(u)
    if u in run_of: found.add(u)
    elif u.op in ELEMENTWISE: stack.extend(u.src)
  return found.pop() if len(found) == 1 else None


def _defined_by(u: UOp, before: set, cache: dict) -> bool:
  """Whether an index expression can be computed at a point where `before` is defined: arithmetic over it and
  constants (the renderer computes it early)."""
  if u in cache: return cache[u]
  ok = u in before or u.op is Ops.CONST or (u.op in ELEMENTWISE and all(_defined_by(s, before, cache) for s in u.src))
  cache[u] = ok
  return ok


def find_transpose_tiles(program: list) -> dict:
  """{LOAD: TileLoad} for the loads of every whole transpose tile in the program (module docstring)."""
  found: dict = {}
  start = 0
  for end in [i for i, u in enumerate(program) if u.op in _BOUNDARIES] + [len(program)]:
    found.update(_tiles_in(program[start:end], set(program[:start])))
    start = end + 1
  return found


def _tiles_in(stretch: list, before: set) -> dict:
  stored = {u.src[0] for u in stretch if u.op is Ops.STORE}
  candidates: dict = {}
  for u in stretch:
    if (u.op is Ops.LOAD and len(u.src) == 2 and u.src[0].op is Ops.DEFINE_GLOBAL and u.src[0] not in stored
        and not u.dtype.is_bool and VECTOR_BYTES // u.dtype.itemsize >= 2):
      candidates.setdefault(u.dtype, []).append(u)
  found: dict = {}
  access_terms: dict = {}
  if candidates:
    for u in stretch:
      if u.op in (Ops.LOAD, Ops.STORE):
        access_terms.setdefault((u.op, u.src[0]), set()).add(base_and_offset(u.src[1])[0])
  for dtype, loads in candidates.items():
    lanes = VECTOR_BYTES // dtype.itemsize
    run_of = _runs(loads, lanes)
    if not run_of: continue
    first = {}  # run id -> its load at position 0
    for ld, (run, pos) in run_of.items():
      if pos == 0: first[run] = ld
    stores = [u for u in stretch if u.op is Ops.STORE and u.src[2].dtype.itemsize == dtype.itemsize]
    # store runs whose k-th store reads position j of the k-th of `lanes` distinct load runs, the same j for all k
    columns: dict = {}  # (load run of each k) -> {j: ([its loads by k], the store run)}
    for store_run in _store_runs(stores, lanes):
      sources = [_source_load(s.src[2], run_of) for s in store_run]
      if any(s is None for s in sources): continue
      runs = tuple(run_of[s][0] for s in sources)
      positions = {run_of[s][1] for s in sources}
      if len(set(runs)) != lanes or len(positions) != 1: continue
      columns.setdefault(runs, {})[positions.pop()] = (sources, store_run)
    cache: dict = {}
    for runs, by_position in columns.items():
      if len(by_position) != lanes: continue
      rows = [first[r] for r in runs]
      if not all(_defined_by(r.src[1], before, cache) for r in rows): continue
      tile = TransposeTile(rows, lanes, {})
      for j, (sources, store_run) in by_position.items():
        for k, ld in enumerate(sources): found[ld] = TileLoad(tile, j, k)
        if all(s.src[2] is ld for s, ld in zip(store_run, sources)) and _stores_apart(store_run, access_terms):
          tile.vector_stores[j] = store_run
  return found


def _stores_apart(store_run: list, access_terms: dict) -> bool:
  """Whether a store run may be written at once where its last store stands: the stretch reads nothing from its
  buffer, and every store to that buffer in the stretch indexes from the same terms (so distinct constants are
  distinct addresses). `access_terms`: (LOAD or STORE, buffer) -> the index terms of its accesses in the stretch."""
  buf = store_run[0].src[0]
  terms = base_and_offset(store_run[0].src[1])[0]
  return (Ops.LOAD, buf) not in access_terms and access_terms[(Ops.STORE, buf)] == {terms}


def _store_runs(stores: list, lanes: int) -> list:
  """The stores as runs of `lanes` consecutive elements (each run in address order)."""
  runs: dict = {}
  for s, (run, pos) in _runs(stores, lanes).items(): runs.setdefault(run, [None] * lanes)[pos] = s
  return list(runs.values())


def butterfly_masks(lanes: int) -> list:
  """The transpose of `lanes` vectors of `lanes` elements as stages of shuffles: for each stage, for each pair
  (i, i + d) with bit d clear in i, the new vectors i and i + d as two-input shuffle masks of (x_i, x_(i+d)) (index
  c: x_i[c], lanes + c: x_(i+d)[c]). Stage d swaps, between the two, the elements whose position has bit d set
  with those it has clear: after the stages d = lanes/2, ..., 2, 1, vector j holds element j of every input."""
  stages = []
  d = lanes // 2
  while d:
    low = [c if not c & d else lanes + c - d for c in range(lanes)]
    high = [c + d if not c & d else lanes + c for c in range(lanes)]
    stages.append([(i, i + d, low, high) for i in range(lanes) if not i & d])
    d //= 2
  return stages
