"""The compile pipeline: a LoweredGraph and a Target -> kernels compiled for it and the steps that run them.

`PASSES` lists the stages in the order `compile_lowered` runs them over one `Compilation` (the per-compile state:
every pass reads and fills its fields; no module global is written). What comes out is the input of the executor
(runtime/executor.py CompiledGraph), which only plans buffers, links the steps to the program and calls them.

  outputs   which nodes the graph hands out and how: a view of an input, a view of a computed buffer, or a buffer
            of its own in the layout eager gives it
  schedule  the tensor graph -> kernel items and fallback steps in run order, and the buffers between them
            (core/schedule.py: fusion, realization, the order that keeps memory low)
  search    BEAM: each kernel's opts chosen by timing candidates (runtime/tuning.py runs what core/search.py
            walks; only with beam > 0)
  codegen   each kernel item -> a kernel (core/codegen.py: opts, the kernel AST, the linear program), rendered as
            LLVM IR or C (core/renderer/) under a name derived from its code; on the CPU each module is handed to
            the compile helpers as soon as it is rendered, so LLVM runs while codegen goes on
  compile   the modules -> the target's program (runtime/devices.py: native code through runtime/cpu.py on the
            CPU, one OpenCL or CUDA program of all kernels on a GPU-style device)
  steps     the kernel and fallback steps, the outputs' slots and the prologue (runtime/executor.py plans them)

`TORCH_UOP_DEBUG_AFTER=schedule,codegen` (or `options={"debug_after": ...}`, "all" for every pass) logs what a
pass produced on the `torch_uop.pipeline` logger; `python -m torch_uop.debug pipeline` prints this list.
"""
from __future__ import annotations
import hashlib
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Callable
import torch
from torch_uop.core.dtypes import dtypes
from torch_uop.torch_dtypes import to_torch
from torch_uop.core.sym import is_sym, known_equal
from torch_uop.core.uop import UOp, Ops, pretty, AxisKind, RangeArg
from torch_uop.core.spec import check_kernel
from torch_uop.lowering.tensor import LT
from torch_uop.core.schedule import schedule, KernelItem, FallbackItem, BufferInfo, Schedule
from torch_uop.core.shapetracker import ShapeTracker, contiguous_strides
from torch_uop.core.symbolic import simplify, base_and_offset
from torch_uop.core.codegen import build_kernel, canonical_item, with_slots, kernel_work
from torch_uop.runtime.tuning import beam_search
from torch_uop.core.renderer.cstyle import launch_items
from torch_uop.runtime.devices import Target, CPU, module_signatures
from torch_uop.lowering.graph import LoweredGraph
from torch_uop import counters as _metrics, log, progress

_log = log.get("pipeline")
_kernels_log = log.get("kernels")

@dataclass
class KernelStep:
  name: str          # the kernel's function in the program (a name derived from its code, see _kernel_symbol)
  slots: list        # buffer slots it takes, output first
  out_slot: int
  shape: tuple
  strides: tuple
  dtype: torch.dtype
  empty: bool        # the output has no elements: nothing to launch
  split_size: int    # trip count of its thread-split loop
  work: int          # scalar operations per call, roughly (kernel_work)
  entry: str | None  # its builtin launcher, for small kernels
  parallel_entry: str | None = None  # its OpenMP launcher, for kernels worth several threads
  label: str = ""    # the kernel's name in this graph (e.g. forward1_k3), for people reading profiles
  split_arg: bool = False  # its launchers take the split size as an argument (a symbolic one)
  items: int = 0     # GPU-style targets: output positions (work-items, or work-groups when grouped)
  local_size: int = 0  # GPU-style targets: work-items per group of a grouped reduction
  what: str = ""     # what it computes, for profiles: the ATen ops fused into it and its shape (_describe)


@dataclass
class FallbackStep:
  op: object         # lowering.graph.FallbackOp
  src_shapes: list   # the shape each tensor input had in the graph
  in_slots: list
  out_slots: dict    # result index of the op -> slot, only for results the graph reads


@dataclass
class Compilation:
  """One graph's compile: its inputs (the first block) and what each pass fills in, in pass order."""
  lowered: LoweredGraph
  target: Target = CPU
  name: str = "graph"
  opt_level: int = 3
  beam: int = 0
  size_vars: list = field(default_factory=list)   # DEFINE_VARs of a graph with symbolic sizes, in table order
  constant_inputs: frozenset = frozenset()        # input positions every call passes unchanged (frozen weights)
  debug: int = 0
  spec: bool = False                               # check each kernel's IR (core/spec.py) as codegen builds it
  # outputs
  outputs: list = field(default_factory=list)     # per graph output: (kind, LT | (node, strides, offset) | value, shape)
  roots: list = field(default_factory=list)       # the nodes that must be realized: outputs and run-time checks
  root_strides: dict = field(default_factory=dict)  # root -> the strides eager gives it (None: row-major)
  first_slot: int = 0                             # the first buffer slot the schedule may take
  vars_slot: int | None = None                    # the size-variable table's slot (symbolic sizes)
  # schedule
  schedule: Schedule | None = None
  constant_slots: set = field(default_factory=set)
  var_position: dict = field(default_factory=dict)  # size variable name -> its place in the table kernels read
  derived_vars: dict = field(default_factory=dict)  # codegen's derived variables (v // f of an upcast axis)
  # search
  tuned: dict = field(default_factory=dict)       # schedule item index -> KernelOpts BEAM chose
  # codegen
  kernels: list = field(default_factory=list)     # (KernelItem, codegen.Kernel) in schedule order
  sources: list = field(default_factory=list)     # each kernel's rendered source, in the same order
  symbols: dict = field(default_factory=dict)     # kernel name -> its function's name in the program
  work: dict = field(default_factory=dict)        # kernel name -> scalar operations per call (kernel_work)
  modules: dict = field(default_factory=dict)     # symbol -> (source, launchers' source by name, number of buffers)
  compiles: object = None                         # the CPU's modules queued for its compile helpers (Target.start_compiles)
  renderer: object = None                         # the target's renderer (core/renderer/: LLVM IR, OpenCL C, CUDA C)
  # compile
  program: object = None                          # runtime/cpu.py CPUProgram or the device's program
  device_source: str | None = None                # a GPU-style target: the program's source (all kernels)
  # steps
  steps: list = field(default_factory=list)       # ("kernel", KernelStep) | ("fallback", FallbackStep)
  outputs_plan: list = field(default_factory=list)  # per output: ("tensor", slot, shape) | ("input", i, None) | ...
  complex_outputs: set = field(default_factory=set)
  checks: list = field(default_factory=list)      # (slot, RuntimeCheck)
  prologue: tuple = ()                            # steps that read only constant inputs: run once

  @property
  def gpu(self) -> bool: return self.target.kind == "gpu"

  @property
  def signatures(self) -> dict: return module_signatures(self.modules)


@dataclass(frozen=True)
class Pass:
  name: str
  run: Callable[[Compilation], None]
  show: Callable[[Compilation], str]  # what the pass produced, for TORCH_UOP_DEBUG_AFTER
  doc: str


class _Timer:
  """Adds the time of a block to the compile_time_s metric of a stage."""
  def __init__(self, stage: str): self.stage = stage
  def __enter__(self): self.t0 = time.perf_counter()
  def __exit__(self, *a): _metrics.state()["compile_time_s"][self.stage] += time.perf_counter() - self.t0


# ---- outputs

def _outputs(c: Compilation) -> None:
  lowered = c.lowered
  roots, root_strides = c.roots, c.root_strides
  owner: dict = {}  # a realized node -> the eager storage root of the outputs handed out from its buffer
  n_outputs = len(lowered.outputs)
  strides_of = lowered.output_strides or [None] * n_outputs
  eager_roots = lowered.output_roots or [None] * n_outputs
  views = _shared_views(lowered.outputs, strides_of, lowered.output_complex, eager_roots)
  for i, ((kind, v), want, is_complex, eager_root) in enumerate(zip(lowered.outputs, strides_of, lowered.output_complex, eager_roots)):
    shape = v.shape if kind == "tensor" else None
    if kind == "tensor" and not is_complex and (alias := _input_alias(v.uop, want, eager_root, lowered.inputs)) is not None:
      c.outputs.append(("alias", alias, shape))  # a strided view of a graph input (a saved weight's transpose)
      continue
    if i in views and owner.get(views[i][0], eager_root) == eager_root and (views[i][0] not in root_strides or \
       _same_strides(views[i][0].shape, root_strides[views[i][0]] or contiguous_strides(views[i][0].shape),
                     views[i][3] or contiguous_strides(views[i][0].shape))):
      # a strided view of a computed node's buffer, as eager's (attention's q, k and v of one GEMM; its output seen
      # as the next matmul's rows), in the layout the node's buffer is written in (views[i][3], None: row-major)
      base = views[i][0]
      if base not in root_strides: roots.append(base); root_strides[base] = views[i][3]
      owner[base] = eager_root
      c.outputs.append(("view", views[i][:3], shape))
      continue
    if kind == "tensor":
      # a contiguous reshape of a computed node is that node's buffer, handed out as a view: no copy kernel
      if (base := _reshaped_from(v.uop)) is not None and (want is None or _same_strides(shape, want, contiguous_strides(shape))):
        v, want = LT(base), None
      if v.uop.op is Ops.BUFFER and (not v.uop.src or (want is not None and not _same_strides(v.shape, want, contiguous_strides(v.shape)))):
        v = LT(UOp(Ops.CONTIGUOUS, v.dtype, (v.uop,)))  # never hand out a graph input; give a fallback result its layout
      # an output computed by a kernel is written in its eager layout; two outputs that are one node but want
      # different layouts, or are separate tensors in eager (y and y.clone()), get a copy each
      while v.uop in root_strides and (owner.get(v.uop) != eager_root or
                                       (want is not None and not _same_strides(v.shape, want, root_strides[v.uop] or want))):
        v = LT(UOp(Ops.CONTIGUOUS, v.dtype, (v.uop,)))
      if v.uop not in root_strides: roots.append(v.uop); root_strides[v.uop] = want; owner[v.uop] = eager_root
    c.outputs.append((kind, v, shape))
  for v, _ in lowered.checks:  # each run-time check's value is a buffer of its own, read after the kernels
    if v.uop not in root_strides: roots.append(v.uop); root_strides[v.uop] = None


def _show_outputs(c: Compilation) -> str:
  lines = []
  for i, (kind, v, shape) in enumerate(c.outputs):
    what = pretty(v.uop, limit=40) if kind == "tensor" else repr(v if kind != "view" else (v[1], v[2]))
    lines.append(f"output {i}: {kind} {tuple(shape) if shape is not None else ''}\n{what}")
  return "\n".join(lines)


def _reshaped_from(u: UOp) -> UOp | None:
  """The computed node that `u` is a plain contiguous reshape of (same elements in the same order), else None."""
  if u.op is not Ops.VIEW or not u.arg.is_contiguous: return None
  base = u.src[0]
  # (a leading slice such as x[:, 0] also has contiguous strides: only as many elements as the base is a reshape)
  if base.op in (Ops.BUFFER, Ops.CONST) or base.dtype != u.dtype or not known_equal(math.prod(u.shape), math.prod(base.shape)):
    return None
  return base


def _strided_view(u: UOp, want: tuple | None) -> tuple | None:
  """(base node, strides, offset) when `u` is a plain strided view of its source (one view, no mask, no negative or
  symbolic stride) in the layout eager gives it (`want`), else None."""
  if u.op is not Ops.VIEW or len(u.arg.views) != 1: return None
  base, view = u.src[0], u.arg.views[0]
  if base.dtype != u.dtype or view.mask is not None: return None
  if not all(isinstance(x, int) for x in (*view.shape, *view.strides, view.offset)) or min(view.strides, default=0) < 0:
    return None
  return _in_eager_layout(base, view.shape, view.strides, view.offset, want)


def _in_eager_layout(base: UOp, shape: tuple, strides: tuple, offset: int, want: tuple | None) -> tuple | None:
  """(base, strides, offset) for a view of base that eager lays out with the strides `want` (None: any), or None
  where they differ. Eager's strides are handed out, which may differ from the view's in dims of size 1: a graph that
  reads the output (the backward reading a saved tensor) checks strides exactly."""
  if want is None: return base, tuple(strides), offset
  if not _same_strides(shape, want, strides): return None
  return base, tuple(want) if all(isinstance(x, int) for x in want) else tuple(strides), offset


def _input_alias(u: UOp, want: tuple | None, eager_root: tuple | None, inputs: list) -> tuple | None:
  """(input slot, strides, offset) when `u` is a plain strided view of a graph input that is a view of that input in
  eager too (`eager_root`, lowering.graph.storage_root): the output is then that view, not a copy."""
  view = _strided_view(u, want)
  if view is None or view[0].op is not Ops.BUFFER or view[0].src: return None
  slot = view[0].arg[0]
  if eager_root is not None and (eager_root[0] != "input" or inputs[eager_root[1]] is None or inputs[eager_root[1]].slot != slot):
    return None
  return slot, view[1], view[2]


def _shared_views(outputs: list, strides_of: list, complex_of: list, eager_roots: list) -> dict:
  """The outputs to hand out as strided views of one computed node's buffer, as eager's views of one tensor:
  {output index: (node, strides, offset, the node's buffer layout or None for row-major)}. A node that is an output
  itself is written in its eager layout, and its views are read through that layout (attention's output, written
  heads-inside, is the next matmul's rows as they lie). Only where all outputs seen through that node come from one
  eager storage, and they cover at least as many elements as the node has (a row of a big result is copied, not
  kept with the rest of it)."""
  layouts: dict = {}  # a computed node handed out itself -> the strides eager gives it (the first such output's)
  for (kind, v), want, is_complex in zip(outputs, strides_of, complex_of):
    if kind == "tensor" and not is_complex and want is not None and v.uop.op not in (Ops.BUFFER, Ops.CONST, Ops.VIEW):
      layouts.setdefault(v.uop, want)
  by_base: dict = {}
  for i, ((kind, v), want, is_complex, root) in enumerate(zip(outputs, strides_of, complex_of, eager_roots)):
    if kind != "tensor" or is_complex or root is None or root[0] != "node" or v.uop.op is not Ops.VIEW: continue
    base = v.uop.src[0]
    layout = layouts.get(base)
    if layout is not None and (not all(isinstance(x, int) for x in layout) or _same_strides(base.shape, layout, contiguous_strides(base.shape))):
      layout = None
    view = _strided_view(v.uop, want) if layout is None else _view_through_layout(v.uop, want, layout)
    if view is not None and view[0].op not in (Ops.BUFFER, Ops.CONST) and all(isinstance(d, int) for d in view[0].shape):
      by_base.setdefault(view[0], []).append((i, root, (*view, layout)))
  shared = {}
  for base, users in by_base.items():
    roots = {root for _, root, _ in users}
    if len(roots) != 1: continue
    covered = sum(math.prod(outputs[i][1].shape) for i, _, _ in users)
    if any(kind == "tensor" and v.uop is base and root in roots for (kind, v), root in zip(outputs, eager_roots)):
      covered += math.prod(base.shape)  # the node is an output itself: its buffer is there anyway
    if covered >= math.prod(base.shape): shared.update({i: view for i, _, view in users})
  return shared


def _view_through_layout(u: UOp, want: tuple | None, layout: tuple) -> tuple | None:
  """(base node, strides, offset) when the view `u` of a node whose buffer is laid out with the strides `layout`
  reads that buffer at an affine offset (one stride per dim, no mask) in eager's layout `want`, else None. The view's
  index math is composed with the layout and simplified at symbolic positions: a permute-then-reshape that needs two
  views of the node's row-major order can be one strided view of its buffer."""
  if not all(isinstance(x, int) for x in (*u.shape, *layout)): return None
  base = u.src[0]
  if base.dtype != u.dtype: return None
  at = [UOp(Ops.RANGE, dtypes.index, (UOp.const(dtypes.index, n),), RangeArg(d, AxisKind.GLOBAL)) if n > 1 else UOp.const(dtypes.index, 0)
        for d, n in enumerate(u.shape)]
  flat, valid = (ShapeTracker.from_strides(base.shape, layout) + u.arg).to_indexed(at)
  valid, flat = simplify(valid), simplify(flat)
  if valid.op is not Ops.CONST or valid.arg is not True: return None
  strides = [0] * len(at)
  terms, offset = base_and_offset(flat)  # flat as a sum of range * constant terms and a constant
  for t in terms:
    if t.op is Ops.RANGE: strides[t.arg.axis] += 1
    elif t.op is Ops.MUL and t.src[0].op is Ops.RANGE and t.src[1].op is Ops.CONST: strides[t.src[0].arg.axis] += t.src[1].arg
    else: return None
  if min(strides, default=0) < 0 or offset < 0: return None
  return _in_eager_layout(base, u.shape, strides, offset, want)


def _same_strides(shape: tuple, a: tuple, b: tuple) -> bool:
  return all(x == y for n, x, y in zip(shape, a, b) if n > 1)


# ---- schedule

def _schedule(c: Compilation) -> None:
  lowered, inputs = c.lowered, c.lowered.inputs
  with _Timer("schedule"):
    c.constant_slots = {inputs[i].slot for i in c.constant_inputs if inputs[i] is not None}
    c.schedule = schedule(c.roots, c.first_slot, lowered.buffer_slots, {u: s for u, s in c.root_strides.items() if s is not None},
                          row_fusion=not c.gpu, split_costly_epilogues=not c.gpu,
                          constant_buffers=frozenset(u for u, s in lowered.buffer_slots.items() if s in c.constant_slots))
  if c.vars_slot is not None:
    c.var_position = {v.arg[0]: k for k, v in enumerate(c.size_vars)}
    for item in c.schedule.items:
      if isinstance(item, KernelItem): item.size_vars = (c.vars_slot, c.var_position, c.derived_vars)


def _show_schedule(c: Compilation) -> str:
  lines = [f"{c.name}: {len(c.schedule.items)} steps"]
  for i, item in enumerate(c.schedule.items):
    if isinstance(item, KernelItem):
      info = c.schedule.buffers[item.out_slot]
      lines.append(f"step {i}: kernel -> slot {item.out_slot} {tuple(info.shape)} {info.dtype.name} "
                   f"{_describe(item, c.lowered.provenance, info.shape)}\n{pretty(item.root, limit=60)}")
    else:
      lines.append(f"step {i}: fallback {item.node.arg.name} {item.in_slots} -> {item.out_slots}")
  return "\n".join(lines)


# ---- search

def _search(c: Compilation) -> None:
  if not c.beam: return
  items = c.schedule.items
  with _Timer("search"), progress.steps(f"{c.name}: BEAM search", sum(isinstance(i, KernelItem) for i in items)) as done:
    for i, item in enumerate(items):
      if isinstance(item, KernelItem):
        c.tuned[i] = beam_search(item, c.beam, c.opt_level, f"{c.name}_k{i}", c.target if c.gpu else None)
        done.update()


def _show_search(c: Compilation) -> str:
  return "\n".join(f"{c.name}_k{i}: {opts}" for i, opts in c.tuned.items()) or "(no search: beam 0)"


# ---- codegen (build, linearize, render, queue)

def _codegen(c: Compilation) -> None:
  items = c.schedule.items
  n_items = sum(isinstance(item, KernelItem) for item in items)
  target = c.target
  max_group, parallelism = target.max_group(), target.parallelism()
  c.renderer = renderer = target.renderer()
  # each kernel is a module under a name derived from its code: a kernel seen before (in this graph, another graph
  # or another size of it) is one function, and on the CPU its native object comes from the disk cache. CPU modules
  # compile in helper processes (runtime/cpu.py) while codegen goes on to the next kernels.
  c.compiles = target.start_compiles(c.opt_level) if n_items else None
  built: dict = {}  # (structure, opts) -> (kernel, source) for items that differ only in their slots (codegen.canonical_item)
  with progress.steps(f"{c.name}: codegen", n_items) as done:
    for i, item in enumerate(items):
      if not isinstance(item, KernelItem): continue
      kname = f"{c.name}_k{i}"
      with _Timer("codegen"):
        canonical = canonical_item(item)
        key = None if canonical is None else (canonical[0], c.tuned.get(i))
        if key in built:
          first, first_src = built[key]
          k, src = with_slots(first, kname, canonical[2]), renderer.rename(first_src, first.name, kname)
        else:
          k = build_kernel(item if canonical is None else canonical[1], kname, c.tuned.get(i), target.kind, max_group,
                           parallelism, target.vector_unit())
          if canonical is not None: k = with_slots(k, kname, canonical[2])
          if c.spec: check_kernel(k.ast, k.program, "codegen")
          src = None
      if src is None:
        with _Timer("render"):
          src = renderer.render(k)
        if key is not None: built[key] = (k, src)
      c.kernels.append((item, k))
      c.sources.append(src)
      c.work[k.name] = kernel_work(k)
      sym = c.symbols[k.name] = _kernel_symbol(k, src, renderer)
      if sym not in c.modules:
        c.modules[sym] = target.module(k, sym, src, c.work[k.name])
        if c.compiles is not None: c.compiles.add_module(*c.modules[sym][:2])
      done.update()
  if c.vars_slot is not None:
    c.schedule.buffers[c.vars_slot] = BufferInfo(c.vars_slot, (len(c.var_position),), dtypes.int64, "input")
  if c.debug >= 2 or _kernels_log.isEnabledFor(logging.DEBUG): _log_kernels(c)


def _log_kernels(c: Compilation) -> None:
  """The kernel list on torch_uop.kernels at DEBUG (debug >= 2, or the logger at DEBUG), with each kernel's AST
  (debug >= 5) and source (debug >= 4)."""
  fallbacks = sum(isinstance(i, FallbackItem) for i in c.schedule.items)
  lines = [f"{c.name}: {len(c.kernels)} kernels, {fallbacks} fallback steps"]
  for (_, k), src in zip(c.kernels, c.sources):
    info = c.schedule.buffers[k.buffers[0]]
    lines.append(f"  {k.name}: out {tuple(info.shape)} {info.dtype.name} <- buffers {k.buffers[1:]}")
    if c.debug >= 5: lines.append(pretty(k.ast))
    if c.debug >= 4: lines.append(src)
  _kernels_log.debug("%s", "\n".join(lines))


def _show_codegen(c: Compilation) -> str:
  lines = []
  for (_, k), src in zip(c.kernels, c.sources):
    lines += [f"{k.name} ({c.symbols[k.name]}), opts {k.opts}:", pretty(k.ast), src]
  return "\n".join(lines)


def _kernel_symbol(k, source: str, renderer) -> str:
  """The kernel's function name in native code: a digest of its source (with its own name taken out) and its
  thread-split size (which its launchers bake in), so equal kernels share one function and one cached object."""
  code = renderer.rename(source, k.name, "kernel") + f"|split={k.split_size}"
  return "k_" + hashlib.sha256(code.encode()).hexdigest()[:24]


# ---- compile

def _compile(c: Compilation) -> None:
  if c.kernels:
    with _Timer("device_compile" if c.gpu else "llvm"):
      c.program, c.device_source = c.target.program_of(c.modules, c.renderer, c.opt_level, c.compiles)
    _metrics.state()["cache_hits"] += getattr(c.program, "objects_from_cache", 0)
  _metrics.state()["kernels_compiled"] += len(c.kernels)


def _show_compile(c: Compilation) -> str:
  if c.program is None: return "(no kernels)"
  if c.device_source is not None: return c.device_source
  return f"{len(c.modules)} modules, {c.program.objects_from_cache} from the disk cache: " + ", ".join(c.modules)


# ---- steps

def _steps(c: Compilation) -> None:
  sched, gpu = c.schedule, c.gpu
  kernel_of = {id(item): k for item, k in c.kernels}
  for item in sched.items:
    if isinstance(item, KernelItem):
      info = sched.buffers[item.out_slot]
      k = kernel_of[id(item)]
      sym = c.symbols[k.name]
      entries = {} if gpu else c.program.entries  # a GPU-style kernel's launcher is made per step (executor._link)
      c.steps.append(("kernel", KernelStep(sym, k.buffers, item.out_slot, info.shape, info.strides, to_torch(info.dtype),
                                           math.prod(info.shape) == 0, k.split_size, c.work[k.name],
                                           f"{sym}_py" if f"{sym}_py" in entries else None,
                                           f"{sym}_par" if f"{sym}_par" in entries else None, k.name,
                                           is_sym(k.split_size), launch_items(k.program) if gpu else 0, k.local_size,
                                           _describe(item, c.lowered.provenance, info.shape))))
    else:
      c.steps.append(("fallback", FallbackStep(item.node.arg, [src.shape for src in item.node.src], item.in_slots, item.out_slots)))
  for kind, v, shape in c.outputs:
    if kind == "view": kind, v = "alias", (sched.node_slot[v[0]], v[1], v[2])  # the node's buffer, seen through the view
    c.outputs_plan.append((kind, sched.node_slot[v.uop] if kind == "tensor" else v, shape))
  # complex outputs are computed as their view_as_real and handed out through view_as_complex
  c.complex_outputs = {i for i, cx in enumerate(c.lowered.output_complex) if cx and c.outputs_plan[i][0] == "tensor"}
  c.checks = [(sched.node_slot[v.uop], check) for v, check in c.lowered.checks]
  handed_out = {slot for kind, slot, _ in c.outputs_plan if kind == "tensor"} | \
      {v[0] for kind, v, _ in c.outputs_plan if kind == "alias"}
  c.prologue = _constant_steps(c.steps, c.constant_slots, handed_out) if not c.size_vars else ()


def _show_steps(c: Compilation) -> str:
  lines = [f"step {i}: {kind} {step.label} {step.what} slots {step.slots}" if kind == "kernel" else
           f"step {i}: fallback {step.op.name} {step.in_slots} -> {step.out_slots}" for i, (kind, step) in enumerate(c.steps)]
  lines += [f"output {i}: {o}" for i, o in enumerate(c.outputs_plan)]
  if c.prologue: lines.append(f"prologue: steps {list(c.prologue)}")
  return "\n".join(lines)


def _constant_steps(steps: list, constant_slots: set, output_slots: set) -> tuple:
  """Indices of the kernel steps whose every input is a constant input or another such step's result (and whose
  result is no graph output or view's buffer, which a caller may change): what the prologue computes once."""
  known, found = set(constant_slots), []
  if not known: return ()
  for i, (kind, step) in enumerate(steps):
    if kind == "kernel" and step.out_slot not in output_slots and all(s in known for s in step.slots[1:]):
      known.add(step.out_slot)
      found.append(i)
  return tuple(found)


def _describe(item: KernelItem, provenance: dict, shape: tuple) -> str:
  """What a kernel computes, for profiles: the ATen ops whose results it computes (LoweredGraph.provenance) from its
  inputs to its output, the first and the last when there are more than three, and its output's shape, e.g.
  `convolution+...+relu[8x64x56x56]`."""
  names, seen, stack = [], set(), [(item.root, False)]
  while stack:  # post-order: an op's inputs before it
    u, done = stack.pop()
    if done:
      if (name := provenance.get(u)) is not None and name not in names: names.append(name)
      continue
    if u in seen: continue
    seen.add(u)
    stack.append((u, True))
    if u is item.root or u not in item.realized: stack.extend((s, False) for s in u.src if s.op is not Ops.BUFFER)
  ops = "+".join(names if len(names) <= 3 else [names[0], "...", names[-1]]) or "copy"
  return f"{ops}[{'x'.join(str(d) for d in shape)}]"


PASSES: tuple[Pass, ...] = (
  Pass("outputs", _outputs, _show_outputs, "which nodes the graph hands out: input views, buffer views, own buffers"),
  Pass("schedule", _schedule, _show_schedule, "tensor graph -> kernel items and fallback steps (core/schedule.py)"),
  Pass("search", _search, _show_search, "BEAM: kernel opts chosen by timing candidates (runtime/tuning.py; beam > 0)"),
  Pass("codegen", _codegen, _show_codegen, "kernel items -> kernels, rendered and queued (core/codegen.py, core/renderer/)"),
  Pass("compile", _compile, _show_compile, "modules -> the target's program (runtime/devices.py Target.program_of)"),
  Pass("steps", _steps, _show_steps, "kernel and fallback steps, output slots, the prologue"),
)
PASS_NAMES = tuple(p.name for p in PASSES)


def parse_debug_after(text: str) -> tuple:
  """The pass names of a debug_after option ("schedule,codegen", "all"); an unknown name is an error that lists them."""
  names = tuple(n.strip() for n in text.split(",") if n.strip())
  if names == ("all",): return PASS_NAMES
  unknown = [n for n in names if n not in PASS_NAMES]
  if unknown: raise ValueError(f"torch_uop: unknown pipeline pass {unknown[0]!r}; passes: {', '.join(PASS_NAMES)}")
  return names


def compile_lowered(lowered: LoweredGraph, target: Target = CPU, name: str = "graph", opt_level: int = 3, beam: int = 0,
                    size_vars: list | None = None, constant_inputs: frozenset = frozenset(), debug: int = 0,
                    debug_after: tuple = (), spec: bool = False) -> Compilation:
  """Run PASSES over one lowered graph. `debug_after`: names of passes whose result is logged (parse_debug_after).
  `spec`: check each kernel's AST and program against core/spec.py as codegen builds it (SpecError on a bad node)."""
  c = Compilation(lowered, target, name, opt_level, beam, list(size_vars or []), constant_inputs, debug, spec)
  c.first_slot = lowered.next_slot
  # a graph with symbolic sizes reads them from an int64 table in a slot of its own; it is not searched
  if c.size_vars: c.vars_slot, c.first_slot, c.beam = c.first_slot, c.first_slot + 1, 0
  for p in PASSES:
    p.run(c)
    if p.name in debug_after: _log.info("%s after %s:\n%s", c.name, p.name, p.show(c))
  return c


def describe_pipeline() -> str:
  """The passes, one line each, in order (`python -m torch_uop.debug pipeline`)."""
  width = max(map(len, PASS_NAMES))
  return "\n".join(f"{i + 1}. {p.name:<{width}}  {p.doc}" for i, p in enumerate(PASSES))
