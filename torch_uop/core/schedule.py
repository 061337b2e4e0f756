"""Scheduler: cut the tensor graph into kernels.

Takes the tensor-level UOp graph (the roots that must exist in memory: graph outputs and inputs of
fallback steps) and decides which nodes are realized into buffers. Everything else is fused:
elementwise chains inline into their consumer, movement ops become index maps, and an elementwise
prologue and epilogue fuse into their reduction (on the CPU, a contraction's epilogue with a math function that
expands into many operations runs as a kernel of its own). A reduction is realized on its own when its result
is read through a movement op (e.g. broadcast back, as in softmax), nested in another reduction,
reduced over a different domain than the kernel's other reductions, or read by several kernels.

Returns an ordered list of `KernelItem` / `FallbackItem` steps (in graph order, except that a step that frees
memory runs as soon as it can: _freeing_first_order) and the buffer table. It does not generate code (codegen.py does) or touch
memory (the executor does).
"""
from __future__ import annotations
import math
from dataclasses import dataclass, field
from torch_uop.core.uop import UOp, Ops, ELEMENTWISE, STAGED, toposort, AxisKind, RangeArg
from torch_uop.core.dtypes import DType, dtypes
from torch_uop.core.shapetracker import contiguous_strides
from torch_uop.core.sym import hint, is_sym
from torch_uop.core.opt import CHEAP_MATH
from torch_uop.core.symbolic import simplify


@dataclass
class BufferInfo:
  slot: int
  shape: tuple
  dtype: DType
  kind: str  # 'input', 'intermediate', 'fallback'
  strides: tuple = None  # element strides of a realized node's buffer; None: contiguous

  def __post_init__(self):
    if self.strides is None: self.strides = contiguous_strides(self.shape)

  @property
  def nbytes(self) -> int:
    """Bytes a buffer of this shape and strides spans."""
    if any(n == 0 for n in self.shape): return 0
    return (1 + sum((n - 1) * abs(st) for n, st in zip(self.shape, self.strides))) * self.dtype.itemsize


@dataclass
class KernelItem:
  root: UOp
  out_slot: int
  realized: dict  # node -> slot, for every realized node this kernel may read
  buffers: dict = field(default_factory=dict)  # slot -> BufferInfo (strides of what it reads and writes)
  # graphs with symbolic sizes: (slot of the size-variable buffer, name -> position, derived name -> (base, factor))
  size_vars: tuple | None = None
  # reductions this kernel computes once per row of its output and reads back along the row (softmax's max and sum)
  row_reduces: frozenset = frozenset()


@dataclass
class FallbackItem:
  node: UOp   # the FALLBACK node; node.arg is the FallbackOp
  in_slots: list
  out_slots: dict  # result index of the op -> slot, only for results the graph reads


@dataclass
class Schedule:
  items: list
  buffers: dict = field(default_factory=dict)  # slot -> BufferInfo
  node_slot: dict = field(default_factory=dict)  # realized tensor node -> slot


def _is_buffer(u: UOp) -> bool: return u.op is Ops.BUFFER


def _expansion(view: UOp) -> int:
  """How many times a VIEW reads each element of its source (the product of its broadcast dims)."""
  factor = 1
  for v in view.arg.views:
    for size, stride in zip(v.shape, v.strides):
      if stride == 0 and hint(size) > 1: factor *= hint(size)
  return factor


def _recompute_cost(node: UOp, realized: set, touched: set) -> int:
  """Rough cost of recomputing an unrealized elementwise expression once (libm calls weigh most). Adds the nodes
  whose realization would change it to `touched`."""
  cost, stack, seen = 0, [node], set()
  while stack:
    n = stack.pop()
    touched.add(n)
    if n in seen or n in realized or _is_buffer(n) or n.op in (Ops.CONST, Ops.IOTA): continue
    seen.add(n)
    if n.op is Ops.REDUCE_AXIS: continue  # realized on its own under a broadcast anyway
    if n.op is Ops.LOOP: cost += 8 * MAX_BROADCAST_RECOMPUTE  # its step runs a data-dependent number of times
    cost += 8 if n.op is Ops.MATH else 1 if n.op in ELEMENTWISE and n.op is not Ops.CAST else 0
    stack.extend(n.src)
  return cost


# recompute under a broadcast only what is cheaper than a round trip through memory
MAX_BROADCAST_RECOMPUTE = 8


# an elementwise expression read by a reduction through a broadcast this wide is realized however cheap it is
MIN_REDUCE_REUSE = 16


# an elementwise expression that k kernels would each recompute is realized once when (k - 1) times its cost is
# above this (a load weighs 2, a libm-style function 8, other ops 1): e.g. a max-pool's backward read by three kernels
MAX_SHARED_RECOMPUTE = 24


def _region(root: UOp, realized: set) -> set:
  """The unrealized nodes one kernel computes (its root's expression up to realized nodes and buffers)."""
  out, stack = set(), list(root.src)
  while stack:
    n = stack.pop()
    if n in out or n in realized or _is_buffer(n) or n.op in (Ops.CONST, Ops.IOTA): continue
    out.add(n)
    stack.extend(n.src)
  return out


def _expression_cost(node: UOp, realized: set) -> int:
  cost, stack, seen = 0, [node], set()
  while stack:
    n = stack.pop()
    if n in seen: continue
    seen.add(n)
    if n in realized or _is_buffer(n): cost += 2; continue
    if n.op in (Ops.CONST, Ops.IOTA, Ops.REDUCE_AXIS): continue
    cost += 8 if n.op is Ops.MATH else 1 if n.op in ELEMENTWISE or n.op is Ops.GATHER else 0
    stack.extend(n.src)
  return cost


def _shared_expressions(roots: list, realized: set) -> set:
  """Elementwise expressions that several kernels would recompute and that cost more than a trip through memory
  (only the outermost such: what lies inside one is computed in its kernel)."""
  readers: dict = {}
  for r in roots:
    for n in _region(r, realized): readers[n] = readers.get(n, 0) + 1
  costly = {n for n, k in readers.items() if k > 1 and (n.op in ELEMENTWISE or n.op is Ops.GATHER) and n.op is not Ops.CAST
            and not n.dtype.is_bool and (k - 1) * _expression_cost(n, realized) > MAX_SHARED_RECOMPUTE}
  inner = set()
  for n in costly: inner |= _region(n, realized) & costly
  return costly - inner


def _staged(u: UOp) -> bool: return u.op is Ops.CONTIGUOUS and u.arg == STAGED


def _reads_only(u: UOp, buffers: frozenset) -> bool:
  """Whether every buffer u reads is one of `buffers`."""
  leaves = [n for n in u.toposort() if _is_buffer(n)]
  return bool(leaves) and all(n in buffers for n in leaves)


def _reads_broadcast(u: UOp) -> bool:
  """Whether an operand is read through a broadcasting view (possibly under casts and reshapes)."""
  while u.op is Ops.CAST or (u.op is Ops.VIEW and _expansion(u) == 1): u = u.src[0]
  return u.op is Ops.VIEW and _expansion(u) > 1


def _contraction(red: UOp) -> bool:
  """A sum of products of two broadcast operands: a matmul's or a convolution's reduction, which codegen blocks
  into register tiles (core/opt.py)."""
  src = red.src[0]
  while src.op is Ops.CAST: src = src.src[0]
  return red.arg[0] is Ops.ADD and src.op is Ops.MUL and all(_reads_broadcast(s) for s in src.src)


def _costly_epilogue(root: UOp, red: UOp, realized: set) -> bool:
  """Whether the expression a kernel computes from its reduction's result holds a math function that expands into
  many operations (GELU's erf or tanh, SiLU's exp)."""
  stack, seen = [root], set()
  while stack:
    n = stack.pop()
    if n in seen or n is red or (n is not root and (n in realized or _is_buffer(n))): continue
    seen.add(n)
    if n.op is Ops.MATH and n.arg not in CHEAP_MATH: return True
    stack.extend(n.src)
  return False


def _broadcast_back(view: UOp, domain: tuple | None, realized: set, reduced: frozenset = frozenset()) -> bool:
  """Whether `view` reads an unrealized value of `domain`'s shape with its trailing axes kept as 1 (a row
  statistic such as x.max(-1, keepdim=True), or an expression of such statistics) broadcast back along them, as
  the kernel over `domain` reads it (reached from its root through elementwise ops only, so the kernel's loops
  visit each row's columns inside its row loop: the statistic is computed once per row, before them). In a kernel
  that reduces over `reduced` axes of `domain`, the rows must lie inside that reduction (their own axes are not
  reduced): a statistic per value of a reduce loop would need its loops inside that loop."""
  src = view.src[0]
  if domain is None or view.shape != domain or src in realized or _is_buffer(src) or src.op is Ops.CONST: return False
  nd = len(domain)
  if len(src.shape) != nd: return False
  kept = next((k for k in range(nd, -1, -1) if k == 0 or src.shape[k - 1] != 1 or domain[k - 1] == 1), 0)
  if kept == nd or src.shape[:kept] != domain[:kept] or any(is_sym(x) for x in domain): return False
  if any(a < kept for a in reduced): return False
  idx = [UOp(Ops.RANGE, dtypes.index, (UOp.const(dtypes.index, x),), RangeArg(k, AxisKind.GLOBAL)) for k, x in enumerate(domain)]
  flat, valid = view.arg.to_indexed(idx)
  want = UOp.const(dtypes.index, 0)
  for i, st in zip(idx[:kept], contiguous_strides(src.shape)): want = want + i * UOp.const(dtypes.index, st)
  return simplify(valid).arg is True and simplify(flat) is simplify(want)


def _row_reduction(node: UOp, domain: tuple) -> bool:
  """A reduction over trailing axes of `domain` (its source's shape): one value per row."""
  axes, nd = node.arg[1], len(domain)
  return node.src[0].shape == domain and bool(axes) and tuple(axes) == tuple(range(nd - len(axes), nd))


def _kernel_reduces(root: UOp, realized: set, row_fusion: bool, touched: set) -> tuple[list, set, list]:
  """Walk one kernel's region. Returns the reductions it would fuse, those that must be realized, and (with
  row_fusion) those it computes once per row (_broadcast_back). Adds to `touched` every node whose realization
  would change that answer (realized only grows, so the answer holds while none of them is realized)."""
  fused, must_realize, rows = [], set(), []
  # (node, read through a movement op, inside a reduction, the domain an elementwise path from here reaches back
  # to, the domain whose row statistics an elementwise path from here computes)
  stack = [(root, False, False, (root.shape, frozenset()) if row_fusion and root.op is not Ops.REDUCE_AXIS else None, None)]
  seen = set()
  while stack:
    item = stack.pop()
    if item in seen: continue
    seen.add(item)
    node, under_view, under_reduce, domain, row_of = item
    touched.add(node)
    if node is not root and (node in realized or _is_buffer(node)): continue
    if node.op is Ops.REDUCE_AXIS and row_of is not None and _row_reduction(node, row_of):
      if node not in rows: rows.append(node)
      stack.append((node.src[0], False, True, (row_of, frozenset(node.arg[1])), None))
      continue
    if node.op is Ops.REDUCE_AXIS and node is not root:
      if under_view or under_reduce: must_realize.add(node); continue
      if node not in fused: fused.append(node)
      stack.append((node.src[0], False, True, (node.src[0].shape, frozenset(node.arg[1])) if row_fusion else None, None))
      continue
    if node.op is Ops.REDUCE_AXIS:  # the root itself reduces
      if node not in fused: fused.append(node)
      stack.append((node.src[0], False, True, (node.src[0].shape, frozenset(node.arg[1])) if row_fusion else None, None))
      continue
    if node.op is Ops.VIEW: touched.add(node.src[0])  # (both branches below ask whether it is realized)
    if node.op is Ops.VIEW and domain is not None and _broadcast_back(node, domain[0], realized, domain[1]):
      stack.append((node.src[0], under_view, under_reduce, None, domain[0]))
      continue
    if node.op is Ops.VIEW:
      src = node.src[0]
      factor = _expansion(node)
      if factor > 1 and src not in realized and not _is_buffer(src) and not _staged(src):
        cost = _recompute_cost(src, realized, touched)
        # an operand of a reduction read many times over (a GEMM prologue: relu(h) @ W) is worth a pass of its own
        # whatever it costs: a register tile recomputes it in its inner loop, once per tile of the other axis
        if cost * min(factor, 64) > 8 * MAX_BROADCAST_RECOMPUTE or (under_reduce and cost and factor >= MIN_REDUCE_REUSE):
          must_realize.add(src); continue
      # a pure reshape keeps every element where it was: a reduction under it still fuses
      stack.append((src, under_view or not node.arg.is_contiguous, under_reduce, None, None)); continue
    if node.op is Ops.GATHER:
      stack.append((node.src[0], True, under_reduce, None, None))
      for s in node.src[1:]: stack.append((s, under_view, under_reduce, None, None))
      continue
    ew = node.op in ELEMENTWISE
    for s in node.src: stack.append((s, under_view, under_reduce, domain if ew else None, row_of if ew else None))
  return fused, must_realize, rows


def _step_inputs(step: UOp, realized: set) -> tuple[set, set]:
  """What a step reads: the steps whose results it reads (the realized nodes and fallback-produced buffers at its
  region's edge), and the graph's input buffers."""
  edge = {s for n in _region(step, realized) | {step} for s in n.src if s in realized or _is_buffer(s)}
  found = {b.src[0] if _is_buffer(b) else b for b in edge if not _is_buffer(b) or b.src}  # a fallback's result
  return found, {b for b in edge if _is_buffer(b) and not b.src}


def _bytes_read(step: UOp, realized: set) -> dict:
  """About how many bytes a step reads of each step result and input buffer it reads (keyed as _step_inputs gives
  them): the elements of the view it reads one through, not more than the whole (a block's slice of rows of a buffer,
  each element once however often a broadcast repeats it), the whole where it reads it without a view."""
  out: dict = {}
  for n in _region(step, realized) | {step}:
    for s in n.src:
      if not (s in realized or _is_buffer(s)): continue
      whole = _nbytes(s)
      part = whole if n.op is not Ops.VIEW else min(whole, math.prod(hint(x) for x in n.shape) // _expansion(n) * s.dtype.itemsize)
      key = s.src[0] if _is_buffer(s) and s.src else s
      out[key] = min(whole, out.get(key, 0) + part)
  return out


def _reduces(step: UOp, realized: set) -> bool:
  """Whether a kernel step reduces over an axis (a sum, a max, ...) rather than copying or mapping what it reads."""
  return step.op is Ops.REDUCE_AXIS or any(n.op is Ops.REDUCE_AXIS for n in _region(step, realized))


def _freeing_first_order(nodes: list, realized: set, keep: set) -> list:
  """The kernel and fallback steps in the graph's own (depth-first) order, except that a ready step runs at once
  when it frees more bytes than it allocates (the last reader of a big input), writes no more than the results of
  other steps it reads (a product condensing them, an elementwise step replacing one), or is the last step such a
  condensing step waits for; of those, the one freeing most first, then the one reading the newest result. (Graph
  outputs, `keep`, are never freed and their own bytes count as nothing allocated; a step reading only graph inputs
  condenses them if it reduces them to fewer bytes, as attention's backward's row sums of dout * out.) A block's
  intermediates are so consumed while they are still in the cache and their buffers free early: attention's backward
  by blocks runs each block's products right after its scores, not all of them after every block, which would keep
  every block's probabilities alive. A copy of a graph input or of a slice of one (a weight's packing, a saved key
  transposed) keeps its place: what it reads may not be freed after it (a saved activation that is a view of a buffer
  other saved tensors hold, a user's input), while its result would be held the longer (DeiT-tiny's backward made
  all twelve layers' transposed keys first: +1.8 MB at its peak). Fallback steps keep their relative order (each
  waits for the one before: torch's random generator is drawn in graph order).

  A second order defers sinks, graph outputs no step reads (weights' gradients): their bytes count as allocated, and
  one that allocates more than it frees waits while another step is ready. Depth-first from the outputs, a backward
  graph's first output, the token embedding's gradient (GPT-2's: 147 MB), comes right after the input gradient's
  chain, while the first layer's weight gradients and what they read are still to come; eager makes it last. The
  order whose simulated peak (results allocated at their step, intermediates and inputs gone after their last
  reader) is lower is taken, the first on a tie.

  Each order is also made `sliced`: a result read through a slice counts as the slice's bytes (_bytes_read), and a
  step that is the last one a step it unblocks waits for runs at once too. Whisper's attention backward by blocks
  computed every block's do_i @ v^T first (4.3 MB each, from 2.3 + 2.3 MB buffers: "condensing" when the whole
  buffers count) and held them until their blocks came; sliced, each block's runs when the block does, after the
  transposed v it waits for (which unblocks it): the training step's peak 136 -> 110 MB (eager 101). The lowest
  simulated peak of the (up to four) orders is taken, the unsliced first on a tie."""
  g = _StepGraph(nodes, realized, keep)
  candidates = [g.order(defer, sliced) for sliced in (False, True) for defer in ((False, True) if g.sinks else (False,))]
  return min(candidates, key=g.peak)  # (the first on a tie)


class _StepGraph:
  """The steps of a schedule with what each reads and writes, for _freeing_first_order."""

  def __init__(self, nodes: list, realized: set, keep: set):
    self.steps = steps = [n for n in nodes if n.op is Ops.FALLBACK or (n in realized and not _is_buffer(n))]
    self.index = {n: i for i, n in enumerate(steps)}
    self.deps, self.readers, self.inputs = {}, {n: [] for n in steps}, {}
    self.keep, self.realized = keep, realized
    previous_fallback = None
    for n in steps:
      found, self.inputs[n] = _step_inputs(n, realized)
      self.deps[n] = {d for d in found if d in self.index and d is not n}
      if n.op is Ops.FALLBACK:
        if previous_fallback is not None: self.deps[n].add(previous_fallback)
        previous_fallback = n
      for d in self.deps[n]: self.readers[d].append(n)
    self.size = {n: 0 if n.op is Ops.FALLBACK else _nbytes(n) for n in steps}
    self.read = {n: {} if n.op is Ops.FALLBACK else _bytes_read(n, realized) for n in steps}
    self.sinks = {n for n in steps if n in keep and not self.readers[n] and n.op is not Ops.FALLBACK}

  def order(self, defer_sinks: bool, sliced: bool = False) -> list:
    steps, index, deps, readers, size, keep = self.steps, self.index, self.deps, self.readers, self.size, self.keep
    sink = self.sinks if defer_sinks else set()
    unrun_readers = {n: len(readers[n]) for n in steps}
    waits = {n: len(deps[n]) for n in steps}
    position: dict = {}
    ready = {n for n in steps if not waits[n]}
    allocated = {n: 0 if n in keep and n not in sink else size[n] for n in steps}
    # what a step reads of a result: the whole buffer, or with `sliced`, the part its views cover (_bytes_read)
    read = self.read if sliced else {n: {} for n in steps}
    condenses = {n: allocated[n] <= sum(read[n].get(d, size[d]) for d in deps[n]) if deps[n] else
                 allocated[n] < sum(read[n].get(b, _nbytes(b)) for b in self.inputs[n]) and _reduces(n, self.realized)
                 for n in steps}

    def unblocks(n, depth: int) -> bool:  # the last step that a condensing step (or, `sliced`, one it unblocks) waits for
      return any(waits[r] == 1 and (condenses[r] or depth > 0 and unblocks(r, depth - 1)) for r in readers[n])

    def gain(n):  # (whether to run it now, the bytes it frees net of what it allocates, the newest result it reads)
      freed = sum(size[d] for d in deps[n] if unrun_readers[d] == 1 and d not in keep)
      now = freed > allocated[n] or condenses[n] or unblocks(n, 1 if sliced else 0)
      return (now, freed - allocated[n], max((position[d] for d in deps[n]), default=-1), -index[n])

    def waits_as_sink(n): return n in sink and gain(n)[1] < 0

    order, next_in_graph_order = [], 0
    while len(order) < len(steps):
      best = max(ready, key=gain, default=None)
      if best is None or not gain(best)[0]:
        while steps[next_in_graph_order] in position: next_in_graph_order += 1
        best = steps[next_in_graph_order]  # every step before it has run: it is ready
        if waits_as_sink(best):
          # the first ready step that is not such a sink runs instead; when only such sinks are left, the one freeing
          # most (the peak at the end is the results plus what the last one reads)
          others = [n for n in ready if not waits_as_sink(n)]
          best = min(others, key=index.get) if others else \
              max(ready, key=lambda n: (gain(n)[1] + allocated[n], -index[n]))
      ready.discard(best)
      position[best] = len(order)
      order.append(best)
      for d in deps[best]: unrun_readers[d] -= 1
      for r in readers[best]:
        waits[r] -= 1
        if not waits[r]: ready.add(r)
    return order

  def peak(self, order: list) -> int:
    """The most bytes held while the steps run in `order`: the graph's inputs at first, each step's result from its
    step on, an intermediate or input gone after its last reader (outputs stay)."""
    last: dict = {}
    for i, n in enumerate(order):
      for d in self.deps[n] | self.inputs[n]: last[d] = i
    gone: dict = {}
    for d, i in last.items():
      if d not in self.keep: gone.setdefault(i, []).append(d)
    def nbytes(u): return self.size[u] if u in self.size else _nbytes(u)  # a step's result (a fallback's: 0), an input
    held = sum(nbytes(b) for b in last if b not in self.size)
    top = held
    for i, n in enumerate(order):
      held += self.size[n]
      top = max(top, held)
      held -= sum(nbytes(d) for d in gone.get(i, ()))
    return top


def _nbytes(u: UOp) -> int: return math.prod(hint(x) for x in u.shape) * u.dtype.itemsize


def schedule(roots: list[UOp], first_free_slot: int, input_slots: dict, root_strides: dict | None = None,
             row_fusion: bool = False, split_costly_epilogues: bool = False,
             constant_buffers: frozenset = frozenset()) -> Schedule:
  """roots: tensor nodes that must be in memory. input_slots: BUFFER node -> slot (given by the caller).
  root_strides: realized node -> the element strides its buffer must have (e.g. a graph output's eager
  layout, possibly with stride 0 or overlap); others are contiguous. row_fusion: a reduction over the trailing
  axes that is broadcast back along them into one kernel is computed there, once per row (_broadcast_back), instead
  of in a kernel of its own (for the CPU, where a row's second pass reads the cache; not for GPU-style devices,
  where every work-item would redo the whole row). split_costly_epilogues: a contraction's epilogue with a math
  function that expands into many operations runs in a kernel of its own (for the CPU's register tiles).
  constant_buffers: input BUFFER nodes that every call passes unchanged (frozen weights): a staged copy
  (LT.staged) of those alone is realized, so the executor's prologue makes it once instead of every call."""
  nodes = toposort(roots)
  realized: set = set(r for r in roots if not _is_buffer(r))
  for n in nodes:
    if n.op is Ops.FALLBACK: realized.update(s for s in n.src if not _is_buffer(s))
    if n.op is Ops.CONTIGUOUS and (n.arg != STAGED or _reads_only(n, constant_buffers)): realized.add(n)
  # fixpoint: realize reductions that cannot be fused where they are read, and expensive expressions read
  # through a broadcast (e.g. an activation feeding a matmul, recomputed once per output column otherwise)
  walks: dict = {}  # kernel root -> (its _kernel_reduces answer, the nodes it depends on), kept while those stay unrealized
  added: set = set()
  while True:
    reach_count: dict = {}
    new = set()
    row_reduces: dict = {}  # kernel root -> its row reductions, as this pass found them (the last pass's are final)
    for r in [n for n in nodes if n in realized]:
      if r not in walks or not walks[r][1].isdisjoint(added):
        touched: set = set()
        walks[r] = (_kernel_reduces(r, realized, row_fusion, touched), touched)
      fused, must, rows = walks[r][0]
      new |= must
      row_reduces[r] = frozenset(rows)
      for f in rows: reach_count[f] = reach_count.get(f, 0) + 1
      if fused:
        domain = (fused[0].src[0].shape, fused[0].arg[1])
        for f in fused[1:]:
          if (f.src[0].shape, f.arg[1]) != domain: new.add(f)
      for f in fused:
        if f is not r: reach_count[f] = reach_count.get(f, 0) + 1
        # a register-tiled contraction computes its epilogue once per tile position, unrolled: a costly one there
        # makes a huge kernel body (slow to compile, and scalar where SIMD runs along the reduction), so it gets a
        # kernel of its own over the realized result
        if split_costly_epilogues and f is not r and _contraction(f) and _costly_epilogue(r, f, realized): new.add(f)
    new |= {f for f, c in reach_count.items() if c > 1}
    if not new: new = _shared_expressions([n for n in nodes if n in realized], realized)
    new -= realized
    if not new: break
    realized |= new
    added = new

  sched = Schedule(items=[])
  slot = first_free_slot
  steps = _freeing_first_order(nodes, realized, set(roots))
  for n in nodes:
    if _is_buffer(n):
      s = input_slots[n]
      sched.node_slot[n] = s
      sched.buffers[s] = BufferInfo(s, n.shape, n.dtype, 'fallback' if n.src else 'input')
  for n in steps:
    if n.op is Ops.FALLBACK:
      # results nobody reads have no BUFFER among the nodes: they are computed and dropped
      outs = {b.arg[2]: sched.node_slot[b] for b in nodes if _is_buffer(b) and b.src and b.src[0] is n}
      sched.items.append(FallbackItem(n, [sched.node_slot[s] for s in n.src], dict(sorted(outs.items()))))
    else:
      sched.node_slot[n] = slot
      sched.buffers[slot] = BufferInfo(slot, n.shape, n.dtype, 'intermediate', (root_strides or {}).get(n))
      sched.items.append(KernelItem(n, slot, sched.node_slot, sched.buffers, row_reduces=row_reduces[n]))
      slot += 1
  return sched
