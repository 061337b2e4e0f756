"""Scheduler: cut the tensor graph into kernels.

Takes the tensor-level UOp graph (the roots that must exist in memory: graph outputs and inputs of
fallback steps) and decides which nodes are realized into buffers. Everything else is fused:
elementwise chains inline into their consumer, movement ops become index maps, and an elementwise
prologue and epilogue fuse into their reduction. A reduction is realized on its own when its result
is read through a movement op (e.g. broadcast back, as in softmax), nested in another reduction,
reduced over a different domain than the kernel's other reductions, or read by several kernels.

Returns an ordered list of `KernelItem` / `FallbackItem` steps and the buffer table. It does not
generate code (codegen.py does) or touch memory (the executor does).
"""
from __future__ import annotations
from dataclasses import dataclass, field
from torch_uop.core.uop import UOp, Ops, ELEMENTWISE, toposort
from torch_uop.core.dtypes import DType
from torch_uop.core.shapetracker import contiguous_strides
from torch_uop.core.sym import hint


@dataclass
class BufferInfo:
  slot: int
  shape: tuple
  dtype: DType
  kind: str  # 'input', 'intermediate', 'fallback'
  strides: tuple = None  # element strides of a realized node's buffer; None: contiguous

  def __post_init__(self):
    if self.strides is None: self.strides = contiguous_strides(self.shape)


@dataclass
class KernelItem:
  root: UOp
  out_slot: int
  realized: dict  # node -> slot, for every realized node this kernel may read
  buffers: dict = field(default_factory=dict)  # slot -> BufferInfo (strides of what it reads and writes)
  # graphs with symbolic sizes: (slot of the size-variable buffer, name -> position, derived name -> (base, factor))
  size_vars: tuple | None = None


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


def _recompute_cost(node: UOp, realized: set) -> int:
  """Rough cost of recomputing an unrealized elementwise expression once (libm calls weigh most)."""
  cost, stack, seen = 0, [node], set()
  while stack:
    n = stack.pop()
    if n in seen or n in realized or _is_buffer(n) or n.op in (Ops.CONST, Ops.IOTA): continue
    seen.add(n)
    if n.op is Ops.REDUCE_AXIS: continue  # realized on its own under a broadcast anyway
    if n.op is Ops.LOOP: cost += 8 * MAX_BROADCAST_RECOMPUTE  # its step runs a data-dependent number of times
    cost += 8 if n.op is Ops.MATH else 1 if n.op in ELEMENTWISE and n.op is not Ops.CAST else 0
    stack.extend(n.src)
  return cost


# recompute under a broadcast only what is cheaper than a round trip through memory
MAX_BROADCAST_RECOMPUTE = 8


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


def _kernel_reduces(root: UOp, realized: set) -> tuple[list, set]:
  """Walk one kernel's region. Returns the reductions it would fuse and those that must be realized."""
  fused, must_realize = [], set()
  stack = [(root, False, False)]
  seen = set()
  while stack:
    node, under_view, under_reduce = stack.pop()
    if (node, under_view, under_reduce) in seen: continue
    seen.add((node, under_view, under_reduce))
    if node is not root and (node in realized or _is_buffer(node)): continue
    if node.op is Ops.REDUCE_AXIS and node is not root:
      if under_view or under_reduce: must_realize.add(node); continue
      if node not in fused: fused.append(node)
      stack.append((node.src[0], False, True))
      continue
    if node.op is Ops.REDUCE_AXIS:  # the root itself reduces
      if node not in fused: fused.append(node)
      stack.append((node.src[0], False, True))
      continue
    if node.op is Ops.VIEW:
      src = node.src[0]
      factor = _expansion(node)
      if factor > 1 and src not in realized and not _is_buffer(src) and \
         _recompute_cost(src, realized) * min(factor, 64) > 8 * MAX_BROADCAST_RECOMPUTE:
        must_realize.add(src); continue
      # a pure reshape keeps every element where it was: a reduction under it still fuses
      stack.append((src, under_view or not node.arg.is_contiguous, under_reduce)); continue
    if node.op is Ops.GATHER:
      stack.append((node.src[0], True, under_reduce))
      for s in node.src[1:]: stack.append((s, under_view, under_reduce))
      continue
    for s in node.src: stack.append((s, under_view, under_reduce))
  return fused, must_realize


def schedule(roots: list[UOp], first_free_slot: int, input_slots: dict, root_strides: dict | None = None) -> Schedule:
  """roots: tensor nodes that must be in memory. input_slots: BUFFER node -> slot (given by the caller).
  root_strides: realized node -> the element strides its buffer must have (e.g. a graph output's eager
  layout, possibly with stride 0 or overlap); others are contiguous."""
  nodes = toposort(roots)
  realized: set = set(r for r in roots if not _is_buffer(r))
  for n in nodes:
    if n.op is Ops.FALLBACK: realized.update(s for s in n.src if not _is_buffer(s))
    if n.op is Ops.CONTIGUOUS: realized.add(n)
  # fixpoint: realize reductions that cannot be fused where they are read, and expensive expressions read
  # through a broadcast (e.g. an activation feeding a matmul, recomputed once per output column otherwise)
  while True:
    reach_count: dict = {}
    new = set()
    for r in [n for n in nodes if n in realized]:
      fused, must = _kernel_reduces(r, realized)
      new |= must
      if fused:
        domain = (fused[0].src[0].shape, fused[0].arg[1])
        for f in fused[1:]:
          if (f.src[0].shape, f.arg[1]) != domain: new.add(f)
      for f in fused:
        if f is not r: reach_count[f] = reach_count.get(f, 0) + 1
    new |= {f for f, c in reach_count.items() if c > 1}
    if not new: new = _shared_expressions([n for n in nodes if n in realized], realized)
    new -= realized
    if not new: break
    realized |= new

  sched = Schedule(items=[])
  slot = first_free_slot
  for n in nodes:
    if _is_buffer(n):
      s = input_slots[n]
      sched.node_slot[n] = s
      sched.buffers[s] = BufferInfo(s, n.shape, n.dtype, 'fallback' if n.src else 'input')
  for n in nodes:
    if n.op is Ops.FALLBACK:
      # results nobody reads have no BUFFER among the nodes: they are computed and dropped
      outs = {b.arg[2]: sched.node_slot[b] for b in nodes if _is_buffer(b) and b.src and b.src[0] is n}
      sched.items.append(FallbackItem(n, [sched.node_slot[s] for s in n.src], dict(sorted(outs.items()))))
    elif n in realized and not _is_buffer(n):
      sched.node_slot[n] = slot
      sched.buffers[slot] = BufferInfo(slot, n.shape, n.dtype, 'intermediate', (root_strides or {}).get(n))
      sched.items.append(KernelItem(n, slot, sched.node_slot, sched.buffers))
      slot += 1
  return sched
