"""The executor: a LoweredGraph -> the callable PyTorch calls in place of the FX graph.

At compile time: schedule the tensor graph, build and linearize each kernel, render each kernel as
its own LLVM module (named by a digest of its code, so equal kernels are one function and a kernel
compiled before loads from the disk cache), compile them (runtime/cpu.py), and plan every step
(which buffers to allocate, which to free after their last use). Intermediates that only kernels touch share one arena: each gets an offset,
and two share bytes only if their lifetimes do not overlap; an arena up to ARENA_KEEP_BYTES is
allocated once and kept (guarded by a lock), a bigger one once per call. At the first call the call
path is generated as straight-line Python (`call_source`): check each input's dtype, shape and
strides, allocate outputs, call each small kernel through its builtin launcher (runtime/cpu.py)
with its buffers' addresses, bigger ones through runtime/threads.py, run fallback ops, return the
outputs. Anything else (another layout, a storage offset guard, complex values, the arena in use by
another thread) takes `_call_general`. Outputs are allocated by torch, never in the arena, with the
strides eager gives them (AOTAutograd compiles the backward for the saved tensors' eager layouts).
On a GPU-style target (runtime/devices.py: OpenCL, CUDA) kernels are rendered as C and built into one program
per graph; each kernel step gets a launcher that knows its buffers' sizes and work-item counts, and a target
whose launches only enqueue (OpenCL on host memory) is synchronized before every host step and the return.
"""
from __future__ import annotations
import hashlib
import logging
import math
import dataclasses
from dataclasses import dataclass, field
import threading
import time
import torch
from torch.autograd import profiler as _torch_profiler
from torch_uop.core.dtypes import to_torch, dtypes
from torch_uop.core.sym import Sym, is_sym, concrete, known_equal
from torch_uop.core.uop import UOp, Ops, pretty
from torch_uop.lowering.tensor import LT
from torch_uop.core.schedule import schedule, KernelItem, FallbackItem, BufferInfo
from torch_uop.core.shapetracker import ShapeTracker, contiguous_strides
from torch_uop.core.symbolic import simplify, base_and_offset
from torch_uop.core.codegen import build_kernel, canonical_item, with_slots, vector_widths
from torch_uop.core.search import beam_search
from torch_uop.core.renderer.llvmir import render_kernel
from torch_uop.core.renderer.cstyle import launch_items
from torch_uop.runtime.devices import Target, CPU
from torch_uop.lowering.graph import LoweredGraph, TensorRef
from torch_uop.runtime.cpu import CPUProgram, python_entry_ir, python_entries_supported, parallel_entry_ir, openmp_supported, \
    ModuleCompiles, module_text
from torch_uop.runtime import threads
from torch_uop.runtime.memory import advise_huge_pages, huge_page_advisor, HUGE_PAGE_MIN_BYTES
from torch_uop import counters as _metrics, log, progress

_log = log.get("kernels")


class _Timer:
  def __init__(self, stage: str): self.stage = stage
  def __enter__(self): self.t0 = time.perf_counter()
  def __exit__(self, *a): _metrics.state()["compile_time_s"][self.stage] += time.perf_counter() - self.t0


def _substitute(x, tensors):
  if isinstance(x, TensorRef): return tensors[x.index]
  if isinstance(x, (list, tuple)): return type(x)(_substitute(a, tensors) for a in x)
  return x


# an arena up to this size is allocated once per graph and kept; a bigger one is allocated at each call
ARENA_KEEP_BYTES = 16 << 20
# kernels with less work than this (scalar operations, roughly) are called through a builtin launcher
ENTRY_MAX_WORK = 1 << 17
# alignment of each buffer in an arena (what torch's CPU allocator gives)
ARENA_ALIGN = 64

try:  # torch's C++ allocation fast path (the one Inductor's generated code calls)
  from torch._C._dynamo.guards import _empty_strided_cpu as _empty_strided
except ImportError:  # pragma: no cover
  def _empty_strided(shape, strides, dtype): return torch.empty_strided(shape, strides, dtype=dtype)


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
  work: int          # scalar operations per call, roughly (_kernel_work)
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
class GraphPlan:
  """Everything a CompiledGraph needs to run, without the IR: what the graph cache (runtime/graph_cache.py) pickles."""
  inputs: list
  storage_offset_guards: list
  buffers: dict
  steps: list              # ("kernel", KernelStep) | ("fallback", FallbackStep)
  outputs: list            # ("tensor", slot, shape) | ("input", index, None) | ("alias", (slot, strides, offset), shape)
                           # | ("value", v, None)
  complex_outputs: set
  release: list            # per step: slots dead after it
  arena_offsets: dict
  arena_bytes: int
  signatures: dict         # kernel function (KernelStep.name) -> number of buffers
  object_code: list[bytes] | None  # native objects, one per kernel module
  peak_bytes: tuple        # (planned, unplanned)
  size_values: tuple = ()  # a graph with symbolic sizes: its size variables' values, which its kernels read from
  size_slot: int | None = None  # the int64 buffer in this slot
  target: object = None    # runtime/devices.py Target (None: the CPU)
  checks: list = field(default_factory=list)  # (slot, lowering.graph.RuntimeCheck): read after the kernels
  prologue: tuple = ()     # steps that read only constant inputs (freezing): run once, their outputs kept


# step name -> (calls, seconds) while torch_uop.debug.profile() is active, else None
_profile: dict | None = None

# lists that every new CompiledGraph is appended to (see torch_uop.debug.capture)
_observers: list[list] = []


class CompiledGraph:
  """`kernels` (codegen.Kernel: name, ast, program, buffers) and `sources` (each kernel's LLVM IR, in
  the same order) stay available for inspection; `n_kernels`/`n_fallbacks` count the steps of one call.
  `keep_arena` (set by the backend: mode="reduce-overhead"): keep the arena between calls whatever its size."""

  keep_arena = False

  def __init__(self, lowered: LoweredGraph, debug: int = 0, opt_level: int = 3, name: str = "graph", beam: int = 0,
               size_vars: list | None = None, target: Target = CPU, constant_inputs: frozenset = frozenset()):
    """`size_vars`: the graph's size variables (DEFINE_VARs, in the order of the int64 buffer kernels read them
    from) when its sizes are symbolic: built inside a core.sym.SizeContext, the result is a template whose
    `instance(values)` is the graph for one call's sizes (kernels shared, only the plan made again).
    `target`: where the kernels run (runtime/devices.py). `constant_inputs`: positions of inputs that every call
    passes unchanged (frozen weights): the kernels that read only them run once, at the first call (the prologue),
    and their results are kept until `refresh_constants()`."""
    self.target, self.name = target, name
    gpu = target.kind == "gpu"
    # an instance attribute, so wrappers made with functools.wraps (torch._dynamo.disable) keep it
    self._boxed_call = True
    self.size_vars = list(size_vars or [])
    first_slot = lowered.next_slot
    vars_slot = None
    if self.size_vars: vars_slot, first_slot, beam = first_slot, first_slot + 1, 0
    self.debug = debug
    self.inputs = lowered.inputs
    # (input index, storage offset) pairs the kernels assume; on a mismatch `eager` (the graph run by torch,
    # set by the backend) runs instead
    self.storage_offset_guards = [(i, lowered.storage_offset_guards[spec.slot]) for i, spec in enumerate(lowered.inputs)
                                  if spec is not None and spec.slot in lowered.storage_offset_guards]
    self.eager = None
    roots, root_strides = [], {}
    owner: dict = {}  # a realized node -> the eager storage root of the outputs handed out from its buffer
    outputs = []
    n_outputs = len(lowered.outputs)
    strides_of = lowered.output_strides or [None] * n_outputs
    eager_roots = lowered.output_roots or [None] * n_outputs
    views = _shared_views(lowered.outputs, strides_of, lowered.output_complex, eager_roots)
    for i, ((kind, v), want, is_complex, eager_root) in enumerate(zip(lowered.outputs, strides_of, lowered.output_complex, eager_roots)):
      shape = v.shape if kind == "tensor" else None
      if kind == "tensor" and not is_complex and (alias := _input_alias(v.uop, want, eager_root, lowered.inputs)) is not None:
        outputs.append(("alias", alias, shape))  # a strided view of a graph input (a saved weight's transpose)
        continue
      if i in views and owner.get(views[i][0], eager_root) == eager_root and (views[i][0] not in root_strides or \
         _same_strides(views[i][0].shape, root_strides[views[i][0]] or contiguous_strides(views[i][0].shape),
                       views[i][3] or contiguous_strides(views[i][0].shape))):
        # a strided view of a computed node's buffer, as eager's (attention's q, k and v of one GEMM; its output seen
        # as the next matmul's rows), in the layout the node's buffer is written in (views[i][3], None: row-major)
        base = views[i][0]
        if base not in root_strides: roots.append(base); root_strides[base] = views[i][3]
        owner[base] = eager_root
        outputs.append(("view", views[i][:3], shape))
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
      outputs.append((kind, v, shape))
    for v, _ in lowered.checks:  # each run-time check's value is a buffer of its own, read after the kernels
      if v.uop not in root_strides: roots.append(v.uop); root_strides[v.uop] = None
    with _Timer("schedule"):
      constant_slots = {self.inputs[i].slot for i in constant_inputs if self.inputs[i] is not None}
      sched = schedule(roots, first_slot, lowered.buffer_slots, {u: s for u, s in root_strides.items() if s is not None},
                       row_fusion=target.kind != "gpu", split_costly_epilogues=target.kind != "gpu",
                       constant_buffers=frozenset(u for u, s in lowered.buffer_slots.items() if s in constant_slots))
    if vars_slot is not None:
      # variable name -> its place in the table kernels read; codegen adds derived ones (v // f of an upcast axis)
      self.var_position, self.derived_vars = {v.arg[0]: k for k, v in enumerate(self.size_vars)}, {}
      for item in sched.items:
        if isinstance(item, KernelItem): item.size_vars = (vars_slot, self.var_position, self.derived_vars)
    self.vars_slot = vars_slot
    self.buffers = sched.buffers
    kernels, tuned = [], {}
    n_items = sum(isinstance(item, KernelItem) for item in sched.items)
    if beam:  # opts chosen by timing candidates (core/search.py); None keeps the heuristic
      with _Timer("search"), progress.steps(f"{name}: BEAM search", n_items) as done:
        for i, item in enumerate(sched.items):
          if isinstance(item, KernelItem):
            tuned[i] = beam_search(item, beam, opt_level, f"{name}_k{i}", target if gpu else None)
            done.update()
    max_group, parallelism = (target.max_group(), target.parallelism()) if gpu else (0, 0)
    renderer = target.renderer() if gpu else None
    # each CPU kernel is its own LLVM module, under a name derived from its code: a kernel seen before (in this graph,
    # another graph or another size of it) is one function, and its native object comes from the disk cache. The
    # modules compile in helper processes (runtime/cpu.py) while codegen goes on to the next kernels.
    compiles = ModuleCompiles(opt_level) if not gpu and n_items else None
    if compiles is not None: compiles.workers.start()  # the helpers load llvmlite while the first kernels are built
    sources, symbols, work = [], {}, {}
    modules: dict = {}  # symbol -> (IR, launchers' IR by name, number of buffers)
    built: dict = {}  # (structure, opts) -> (kernel, source) for items that differ only in their slots (codegen.canonical_item)
    with progress.steps(f"{name}: codegen", n_items) as done:
      for i, item in enumerate(sched.items):
        if not isinstance(item, KernelItem): continue
        kname = f"{name}_k{i}"
        with _Timer("codegen"):
          canonical = canonical_item(item)
          key = None if canonical is None else (canonical[0], tuned.get(i))
          if key in built:
            first, first_src = built[key]
            k, src = with_slots(first, kname, canonical[2]), _renamed(first_src, first.name, kname)
          else:
            k = build_kernel(item if canonical is None else canonical[1], kname, tuned.get(i), target.kind, max_group,
                             parallelism, target.vector_unit())
            if canonical is not None: k = with_slots(k, kname, canonical[2])
            src = None
        if src is None:
          with _Timer("render"):
            src = renderer.render_kernel(k.name, k.program, k.argument_ids, k.local_size) if gpu else render_kernel(k)
          if key is not None: built[key] = (k, src)
        kernels.append((item, k))
        sources.append(src)
        work[k.name] = _kernel_work(k)
        sym = symbols[k.name] = _kernel_symbol(k, src)
        if sym not in modules:
          modules[sym] = _gpu_module(k, sym, src) if gpu else _cpu_module(k, sym, src, work[k.name])
          if compiles is not None: compiles.add(module_text(*modules[sym][:2]))
        done.update()
    if vars_slot is not None:
      sched.buffers[vars_slot] = BufferInfo(vars_slot, (len(self.var_position),), dtypes.int64, "input")
    self.kernels = [k for _, k in kernels]
    self.sources = sources
    if debug >= 2 or _log.isEnabledFor(logging.DEBUG): self._log_kernels(sched, sources)
    signatures = {sym: nbuf for sym, (_, _, nbuf) in modules.items()}
    program = None
    self.device_source = None  # a GPU-style target: the program's source (all kernels)
    if kernels and gpu:
      with _Timer("device_compile"):
        self.device_source = renderer.program_source([src for src, _, _ in modules.values()])
        program = target.program(self.device_source, list(modules))
    elif kernels:
      with _Timer("llvm"):
        program = CPUProgram(None, signatures, opt_level, [entries for _, entries, _ in modules.values()], compiles=compiles)
      _metrics.state()["cache_hits"] += program.objects_from_cache
    _metrics.state()["kernels_compiled"] += len(kernels)

    # plan the steps: ("kernel", KernelStep) | ("fallback", FallbackStep), with buffer lifetimes
    kernel_of = {id(item): k for item, k in kernels}
    steps = []
    for item in sched.items:
      if isinstance(item, KernelItem):
        info = self.buffers[item.out_slot]
        k = kernel_of[id(item)]
        sym = symbols[k.name]
        entries = {} if gpu else program.entries  # a GPU-style kernel's launcher is made per step (_link)
        steps.append(("kernel", KernelStep(sym, k.buffers, item.out_slot, info.shape, info.strides, to_torch(info.dtype),
                                           math.prod(info.shape) == 0, k.split_size, work[k.name],
                                           f"{sym}_py" if f"{sym}_py" in entries else None,
                                           f"{sym}_par" if f"{sym}_par" in entries else None, k.name,
                                           is_sym(k.split_size), launch_items(k.program) if gpu else 0, k.local_size,
                                           _describe(item, lowered.provenance, info.shape))))
      else:
        steps.append(("fallback", FallbackStep(item.node.arg, [src.shape for src in item.node.src], item.in_slots, item.out_slots)))
    self.n_fallbacks = sum(1 for s in steps if s[0] == "fallback")
    outputs_plan = []
    for kind, v, shape in outputs:
      if kind == "view": kind, v = "alias", (sched.node_slot[v[0]], v[1], v[2])  # the node's buffer, seen through the view
      outputs_plan.append((kind, sched.node_slot[v.uop] if kind == "tensor" else v, shape))
    # complex outputs are computed as their view_as_real and handed out through view_as_complex
    complex_outputs = {i for i, c in enumerate(lowered.output_complex) if c and outputs_plan[i][0] == "tensor"}
    checks = [(sched.node_slot[v.uop], check) for v, check in lowered.checks]
    handed_out = {slot for kind, slot, _ in outputs_plan if kind == "tensor"} | {v[0] for kind, v, _ in outputs_plan if kind == "alias"}
    prologue = _constant_steps(steps, constant_slots, handed_out) \
        if not self.size_vars else ()
    self._template = (steps, outputs_plan, complex_outputs, checks, signatures,
                      program.object_code if program and not gpu else None, prologue)
    self.program = program
    if self.size_vars:  # the plan depends on the sizes: one per call signature, made by instance()
      self.plan, self.n_kernels = None, sum(1 for kind, _ in steps if kind == "kernel")
      return
    self.plan = self._make_plan({})
    self._link(program)

  def _make_plan(self, values: dict) -> GraphPlan:
    """The plan for the sizes `values` gives the size variables (empty for a static graph): lifetimes, the arena."""
    steps, outputs_plan, complex_outputs, checks, signatures, object_code, prologue = self._template
    if self.size_vars: values = {**values, **{name: values[base] // f for name, (base, f) in self.derived_vars.items()}}
    if values:
      steps = [(kind, _concrete_fields(step, values)) for kind, step in steps]
      # a big instance of a kernel runs outside the GIL-holding builtin launcher
      steps = [(kind, dataclasses.replace(step, entry=None) if kind == "kernel" and step.work >= ENTRY_MAX_WORK else step)
               for kind, step in steps]
      outputs_plan = concrete(outputs_plan, values)
    buffers = {s: _concrete_fields(info, values) for s, info in self.buffers.items()} if values else self.buffers
    inputs = [None if spec is None else _concrete_fields(spec, values) for spec in self.inputs] if values else self.inputs
    # free each intermediate after its last use, and each input not handed back: a boxed caller gives its references
    # over (AOTAutograd's backward clears the saved tensors first), so a saved activation goes at its last reader
    keep = {slot for kind, slot, _ in outputs_plan if kind == "tensor"} | {slot for slot, _ in checks} | \
        {inputs[v].slot for kind, v, _ in outputs_plan if kind == "input" and inputs[v] is not None} | \
        {v[0] for kind, v, _ in outputs_plan if kind == "alias"} | \
        {steps[i][1].out_slot for i in prologue}  # (the prologue's results live as long as the graph)
    input_slots = {spec.slot for spec in inputs if spec is not None}  # (not the size-variable table)
    last_use: dict = {}
    for i, (kind, step) in enumerate(steps):
      for s in step.slots if kind == "kernel" else step.in_slots + list(step.out_slots.values()): last_use[s] = i
    release = [[] for _ in steps]
    for s, i in last_use.items():
      if s not in keep and (buffers[s].kind != "input" or s in input_slots): release[i].append(s)
    arena_offsets, arena_bytes = _plan_arena(steps, buffers, keep, last_use)
    self.peak_bytes_unplanned = _peak_bytes(steps, buffers, release, {})
    self.peak_bytes = _peak_bytes(steps, buffers, release, arena_offsets) + arena_bytes
    sizes = tuple(values[name] for name in sorted(self.var_position, key=self.var_position.get)) if self.size_vars else ()
    return GraphPlan(inputs, self.storage_offset_guards, buffers, steps, outputs_plan, complex_outputs,
                     release, arena_offsets, arena_bytes, signatures, object_code,
                     (self.peak_bytes, self.peak_bytes_unplanned), sizes, self.vars_slot, self.target, checks, prologue)

  def instance(self, values: dict) -> "CompiledGraph":
    """A graph with symbolic sizes, for the sizes `values` gives its variables (by name): its kernels, a new plan."""
    graph = CompiledGraph.from_plan(self._make_plan(values), self.debug, self.program, self.name)
    graph.keep_arena = self.keep_arena
    return graph

  @classmethod
  def from_plan(cls, plan: "GraphPlan", debug: int = 0, program=None, name: str = "graph") -> "CompiledGraph":
    """A graph from a cached plan (runtime/graph_cache.py): no lowering, scheduling, codegen or LLVM. `program`:
    the kernels already loaded (an instance of a graph with symbolic sizes)."""
    self = cls.__new__(cls)
    self.size_vars, self.name = [], name
    self.target = plan.target or CPU
    self._boxed_call = True
    self.debug, self.plan, self.eager = debug, plan, None
    self.inputs, self.storage_offset_guards, self.buffers = plan.inputs, plan.storage_offset_guards, plan.buffers
    self.peak_bytes, self.peak_bytes_unplanned = plan.peak_bytes
    self.kernels, self.sources = [], []  # not kept in a plan; compile with the cache off to inspect them
    self.n_fallbacks = sum(1 for s in plan.steps if s[0] == "fallback")
    if program is None and plan.object_code is not None:
      entries = {e: None for kind, s in plan.steps if kind == "kernel" for e in (s.entry, s.parallel_entry) if e is not None}
      if any(kind == "kernel" and s.parallel_entry for kind, s in plan.steps) and not openmp_supported():
        raise RuntimeError("this plan launches kernels through OpenMP, which this process cannot call")
      program = CPUProgram(None, plan.signatures, entries=entries, object_code=plan.object_code)
    self._link(program)
    return self

  @property
  def cacheable(self) -> bool:
    """Whether `plan` can stand for this graph in another process: a storage offset guard needs the FX graph."""
    return not self.storage_offset_guards and self.target.kind == "cpu" and \
        (self.plan.object_code is not None or not self.plan.signatures)

  def _link(self, program) -> None:
    """Bind the plan's kernel steps to `program`'s functions and launchers."""
    plan = self.plan
    self.program = program
    self.steps = []
    target = self.target
    for kind, step in plan.steps:
      if kind == "kernel" and target.kind == "gpu":  # one launcher per step: it knows its buffers' sizes
        run = program.launcher(step.name, [_nbytes(plan.buffers[s]) for s in step.slots], step.items, step.local_size)
        self.steps.append((kind, (run, step.slots, step.out_slot, step.shape, step.strides, step.dtype, step.empty, 0, 1,
                                  run, None, False)))
      elif kind == "kernel":
        self.steps.append((kind, (program.functions[step.name], step.slots, step.out_slot, step.shape, step.strides,
                                  step.dtype, step.empty, step.split_size, threads.max_threads(step.split_size, step.work),
                                  program.entries.get(step.entry) if step.entry else None,
                                  program.entries.get(step.parallel_entry) if step.parallel_entry else None,
                                  step.split_arg)))
      else:
        self.steps.append((kind, step))
    self.n_kernels = sum(1 for kind, _ in plan.steps if kind == "kernel")
    self.step_names = [_step_name(self.name, kind, step) for kind, step in plan.steps]
    # a target whose launches only enqueue (OpenCL in host memory): wait before host code touches a buffer
    self._sync = getattr(program, "synchronize", None) if target.kind == "gpu" else None
    self.outputs, self.complex_outputs, self.release = plan.outputs, plan.complex_outputs, plan.release
    self.checks = plan.checks
    # held: slot -> a prologue step's result that later steps read (None: the prologue has not run)
    self.prologue = frozenset(plan.prologue)
    self.held = None if self.prologue else {}
    self.arena_offsets, self.arena_bytes = plan.arena_offsets, plan.arena_bytes
    self.arena = None
    self.size_table = torch.tensor(plan.size_values, dtype=torch.int64, device=target.torch_device) \
        if plan.size_slot is not None else None
    self._arena_lock = threading.Lock()
    self.call_source = None
    self._run = self._first_call  # the call path is built at the first call (not under the compiler's fake tensor mode)
    for obs in _observers: obs.append(self)

  def _log_kernels(self, sched, sources):
    """The kernel list on torch_uop.kernels at DEBUG (debug >= 2, or the logger at DEBUG), with each kernel's AST
    (debug >= 5) and source (debug >= 4)."""
    lines = [f"{self.name}: {len(self.kernels)} kernels, {sum(isinstance(i, FallbackItem) for i in sched.items)} fallback steps"]
    for k, src in zip(self.kernels, sources):
      info = self.buffers[k.buffers[0]]
      lines.append(f"  {k.name}: out {tuple(info.shape)} {info.dtype.name} <- buffers {k.buffers[1:]}")
      if self.debug >= 5: lines.append(pretty(k.ast))
      if self.debug >= 4: lines.append(src)
    _log.debug("%s", "\n".join(lines))

  def _bind_input(self, spec, t: torch.Tensor) -> torch.Tensor:
    if spec.is_complex and isinstance(t, torch.Tensor) and t.is_complex(): t = _as_real(t)
    # the common case, checked cheaply: exactly the compiled dtype, shape and strides, on the compiled device
    device = self.target.torch_device
    if isinstance(t, torch.Tensor) and t.dtype is spec.dtype and t.shape == spec.shape and t.stride() == spec.strides \
       and t.device == device:
      return t
    if t is None and math.prod(spec.shape) == 0:
      return torch.empty(spec.shape, dtype=spec.dtype, device=device)  # AOTAutograd passes None for side-effect tokens
    if not isinstance(t, torch.Tensor):
      raise TypeError(f"torch_uop: expected a tensor for input {spec.slot}, got {type(t).__name__}")
    if t.device != device:
      raise RuntimeError(f"torch_uop: input {spec.slot} is on {t.device}, but this graph was compiled for {device}")
    if t.dtype != spec.dtype or tuple(t.shape) != spec.shape:
      raise RuntimeError(f"torch_uop: input {spec.slot} is {tuple(t.shape)} {t.dtype}, compiled for {spec.shape} {spec.dtype}")
    if math.prod(spec.shape) > 1 and any(st != want for n, st, want in zip(spec.shape, t.stride(), spec.strides) if n > 1):
      # a layout the kernels were not built for: copy into the compiled layout, if it holds one element per location
      if not _one_element_per_location(spec.shape, spec.strides):
        raise RuntimeError(f"torch_uop: input {spec.slot} has strides {tuple(t.stride())}, but this graph was compiled for "
                           f"strides {spec.strides}, where several elements share one memory location (an expanded or "
                           f"overlapping tensor); its kernels cannot read other values. Compile it again for this layout.")
      t = torch.empty_strided(spec.shape, spec.strides, dtype=t.dtype, device=device).copy_(t)
    return t

  def _wants_huge_pages(self, nbytes: int) -> bool:
    """A buffer this big, fresh from the OS, is faulted in by its first kernel: in huge pages if asked for first."""
    return nbytes >= HUGE_PAGE_MIN_BYTES and self.target.kind == "cpu" and huge_page_advisor() is not None

  def _allocator(self):
    """empty(shape, strides, dtype) on this graph's device (on the CPU, torch's C++ fast path)."""
    if self.target.torch_device.type == "cpu": return _empty_strided
    device = self.target.torch_device
    return lambda shape, strides, dtype: torch.empty_strided(shape, strides, dtype=dtype, device=device)

  def __call__(self, *args):
    # boxed convention (one list, which we clear) or plain positional tensors: graph inputs are never lists
    args = args[0] if len(args) == 1 and type(args[0]) is list else list(args)
    # timed step by step (torch_uop.debug.profile), or each step recorded by an active torch.profiler
    if _profile is not None or _torch_profiler._is_profiler_enabled: return self._call_general(args)
    return self._run(args)

  def refresh_constants(self) -> None:
    """The constant inputs changed (freezing saw new weights): the next call runs the prologue again."""
    self.held, self.call_source, self._run = (None if self.prologue else {}), None, self._first_call

  def _run_prologue(self, args: list) -> None:
    """Run the steps that read only constant inputs, keeping their results (`held`)."""
    bufs = {spec.slot: self._bind_input(spec, t) for spec, t in zip(self.inputs, args) if spec is not None}
    for i in sorted(self.prologue):
      kind, payload = self.steps[i]
      if kind == "kernel": self._launch(payload, bufs)
      else: self._run_fallback(payload, bufs)
    if self._sync is not None: self._sync()
    read = {slot for slot, _ in self.checks}  # results a later step or a check reads are kept; the rest go
    for i, (kind, payload) in enumerate(self.steps):
      if i not in self.prologue: read.update(payload[1] if kind == "kernel" else payload.in_slots)
    self.held = {slot: bufs[slot] for i in self.prologue if (slot := self.steps[i][1][2]) in read}

  def _launch(self, payload, bufs: dict) -> None:
    """One kernel step of the general call path: allocate its output in `bufs` and launch it."""
    fn, slots, out_slot, shape, strides, dtype, empty, split_size, max_threads, entry, par_entry, split_arg = payload
    bufs[out_slot] = torch.empty_strided(shape, strides, dtype=dtype, device=self.target.torch_device)
    if self._wants_huge_pages(nbytes := _nbytes(self.buffers[out_slot])): advise_huge_pages(bufs[out_slot].data_ptr(), nbytes)
    if not empty:
      threads.launch(fn, [bufs[s].data_ptr() for s in slots], split_size, max_threads, entry, par_entry, split_arg)

  def _first_call(self, args: list):
    if self.held is None: self._run_prologue(args)
    # the arena outlives calls when it is small: its addresses are then constants of the call path
    if 0 < self.arena_bytes and (self.arena_bytes <= ARENA_KEEP_BYTES or self.keep_arena):
      self.arena = torch.empty(self.arena_bytes, dtype=torch.uint8, device=self.target.torch_device)
    self.call_source, self._run = self._build_call_path()
    return self._run(args)

  def _build_call_path(self):
    """The call path as straight-line Python, generated once: check each input's dtype, shape and strides (any
    surprise goes to `_call_general`), allocate the outputs and non-arena buffers, launch each kernel with its
    buffers' addresses (arena buffers: constants, or offsets from this call's arena) and run fallbacks."""
    if self.complex_outputs or any(spec is not None and spec.is_complex for spec in self.inputs):
      return None, self._call_general
    env = {"general": self._call_general, "empty": self._allocator(), "launch": threads.launch, "M": _metrics,
           "lock": self._arena_lock, "advise": advise_huge_pages}
    huge = self._wants_huge_pages
    def const(value, prefix: str) -> str:
      name = f"{prefix}{len(env)}"
      env[name] = value
      return name
    # on the CUDA device the graph was compiled for (not only some CUDA device)
    on_device = f"device == {const(self.target.torch_device, 'V')}" if self.target.name == "cuda" else "is_cpu"
    lines = ["def run(args):", "  try:"]
    conds = []
    for i, spec in enumerate(self.inputs):
      if spec is None: continue  # a size argument: the graph was made for its value
      lines.append(f"    b{spec.slot} = args[{i}]")
      conds.append(f"b{spec.slot}.dtype is {const(spec.dtype, 'D')} and b{spec.slot}.shape == {spec.shape!r} and "
                   f"b{spec.slot}.stride() == {spec.strides!r} and b{spec.slot}.{on_device}")
    for i, off in self.storage_offset_guards: conds.append(f"args[{i}].storage_offset() == {off}")
    lines += [f"    if not ({' and '.join(conds) or 'True'}): return general(args)",
              "  except (AttributeError, IndexError): return general(args)"]
    # the caller's list is emptied before the first step, so an input can be freed after its last reader
    body = [f"r{v} = args[{v}]" for kind, v, _ in self.outputs if kind == "input"] + ["args.clear()"]
    arena = self.arena
    if self.arena_offsets:
      if arena is None:
        body.append(f"arena = empty(({self.arena_bytes},), (1,), {const(torch.uint8, 'D')}); base = arena.data_ptr()")
        if huge(self.arena_bytes): body.append(f"advise(base, {self.arena_bytes})")
      else:
        lines.append("  if not lock.acquire(False): return general(args)  # the kept arena is in use (another thread)")
    # each buffer a kernel reads or writes gets its address once, as p<slot>: an int, an arena constant or an offset
    kernel_slots = {s for kind, p in self.steps if kind == "kernel" for s in p[1]}
    addresses = lambda slots: [f"p{s} = b{s}.data_ptr()" for s in slots if s in kernel_slots and s not in self.arena_offsets]
    ptr = lambda s: (f"{arena.data_ptr() + self.arena_offsets[s]}" if arena is not None else f"base + {self.arena_offsets[s]}") \
        if s in self.arena_offsets else f"p{s}"
    if self.size_table is not None: body.append(f"p{self.plan.size_slot} = {self.size_table.data_ptr()}")
    body += addresses(spec.slot for spec in self.inputs if spec is not None)
    for slot, t in self.held.items():  # the prologue's results: constants of the call path
      body.append(f"b{slot} = {const(t, 'H')}")
      if slot in kernel_slots: body.append(f"p{slot} = {t.data_ptr()}")
    for i, ((kind, payload), release) in enumerate(zip(self.steps, self.release)):
      if i in self.prologue: continue
      if kind == "kernel":
        fn, slots, out_slot, shape, strides, dtype, empty, split_size, max_threads, entry, par_entry, split_arg = payload
        if out_slot not in self.arena_offsets:
          body.append(f"b{out_slot} = empty({tuple(shape)!r}, {tuple(strides)!r}, {const(dtype, 'D')})")
          body += addresses([out_slot])
          if huge(nbytes := _nbytes(self.buffers[out_slot])): body.append(f"advise(p{out_slot}, {nbytes})")
        if not empty:
          args = ", ".join(ptr(s) for s in slots)
          if max_threads > 1:
            body.append(f"launch({const(fn, 'K')}, ({args},), {split_size}, {max_threads}, {const(entry, 'E')}, "
                        f"{const(par_entry, 'P')}, {split_arg})")
          elif entry is not None: body.append(f"{const(entry, 'E')}({args}{f', {max(split_size, 1)}' if split_arg else ''})")
          else: body.append(f"{const(fn, 'K')}({args}, 0, {max(split_size, 1)})")
      else:
        if self._sync is not None: body.append(f"{const(self._sync, 'S')}()")
        results = "".join(f"b{s}, " for s in payload.out_slots.values())
        body.append(f"{'(' + results + ') = ' if results else ''}{const(_fallback_fn(payload), 'F')}"
                    f"({', '.join(f'b{s}' for s in payload.in_slots)})")
        body += addresses(payload.out_slots.values())
      # (kernels that only enqueue may still read a buffer after its last step: it lives until the call returns)
      if self._sync is None and (dead := [f"b{s}" for s in release if s not in self.arena_offsets]):
        body.append(f"del {', '.join(dead)}")
    if self._sync is not None: body.append(f"{const(self._sync, 'S')}()")
    body.append(f"M._state['kernels_launched'] += {self.n_kernels}")
    if self.n_fallbacks: body.append(f"M._state['fallback_steps_run'] += {self.n_fallbacks}")
    if self.arena_offsets and arena is not None:
      lines += ["  try:", *(f"    {l}" for l in body), "  finally: lock.release()"]
    else:
      lines += [f"  {l}" for l in body]
    for slot, check in self.checks:  # eager's error for bad data (an index out of range): one read per check
      lines.append(f"  if (v := b{slot}.item()) != {check.ok!r}: {const(check.fail, 'X')}(v)")
    outs = []
    for i, (kind, v, shape) in enumerate(self.outputs):
      if kind == "tensor":
        produced_by_kernel = any(k == "kernel" and p[2] == v for k, p in self.steps)
        if produced_by_kernel and tuple(self.buffers[v].shape) == tuple(shape): outs.append(f"b{v}")
        else: outs.append(f"(b{v}.view({tuple(shape)!r}) if b{v}.shape != {tuple(shape)!r} else b{v})")
      elif kind == "input": outs.append(f"r{v}")
      elif kind == "alias": outs.append(f"b{v[0]}.as_strided({tuple(shape)!r}, {v[1]!r}, b{v[0]}.storage_offset() + {v[2]})")
      else: outs.append(const(v, "C"))
    lines += [f"  outs = [{', '.join(outs)}]", "  return outs"]
    source = "\n".join(lines) + "\n"
    exec(compile(source, f"<torch_uop call path {id(self):x}>", "exec"), env)
    return source, env["run"]

  def _call_general(self, args: list):
    """The call path for every case: layouts to copy, storage offsets to check, complex values, None tokens."""
    if self.storage_offset_guards and self.eager is not None and \
       any(args[i].storage_offset() != off for i, off in self.storage_offset_guards):
      _metrics._state["graph_calls_run_by_torch"] += 1
      log.warn_once("fallback", f"storage offset: {self.name}", "graph %s runs in torch for a call whose input has another "
                    "storage offset than the as_strided it was compiled for", self.name)
      outs = self.eager(list(args))
      args.clear()
      return outs
    bufs: dict = {}
    if self.size_table is not None: bufs[self.plan.size_slot] = self.size_table
    if self.held is None: self._run_prologue(args)
    for spec, t in zip(self.inputs, args):
      if spec is not None: bufs[spec.slot] = self._bind_input(spec, t)
    returned = {v: args[v] for kind, v, _ in self.outputs if kind == "input"}
    args.clear()  # (as the fast path: inputs are freed after their last reader)
    bufs.update(self.held)
    prof = _profile
    record = _torch_profiler._is_profiler_enabled
    for i, ((kind, payload), release) in enumerate(zip(self.steps, self.release)):
      if i in self.prologue: continue
      if prof is not None: t0 = time.perf_counter()
      if record: event = _torch_profiler.record_function(self.step_names[i]).__enter__()
      if kind == "kernel": self._launch(payload, bufs)
      else:
        if self._sync is not None: self._sync()
        self._run_fallback(payload, bufs)
      if record:
        if self._sync is not None: self._sync()
        event.__exit__(None, None, None)
      if prof is not None:
        if self._sync is not None: self._sync()
        step = self.plan.steps[i][1]
        name = profile_key(step) if kind == "kernel" else f"fallback {step.op.name}"
        calls, secs = prof.get(name, (0, 0.0))
        prof[name] = (calls + 1, secs + time.perf_counter() - t0)
      if self._sync is None:
        for s in release: del bufs[s]
    if self._sync is not None: self._sync()
    st = _metrics._state
    st["kernels_launched"] += self.n_kernels
    if self.n_fallbacks: st["fallback_steps_run"] += self.n_fallbacks
    for slot, check in self.checks:
      if (v := bufs[slot].item()) != check.ok: check.fail(v)
    outs = []
    for kind, v, shape in self.outputs:
      if kind == "tensor": outs.append(bufs[v].view(shape) if bufs[v].shape != shape else bufs[v])
      elif kind == "input": outs.append(returned[v])
      elif kind == "alias": outs.append(bufs[v[0]].as_strided(shape, v[1], bufs[v[0]].storage_offset() + v[2]))
      else: outs.append(v)
    for i in self.complex_outputs: outs[i] = torch.view_as_complex(outs[i])
    args.clear()
    return outs

  @staticmethod
  def _run_fallback(item: FallbackStep, bufs: dict):
    op = item.op
    tensors = []
    for shape, s in zip(item.src_shapes, item.in_slots):
      t = bufs[s]
      # a realized node or a flat buffer: give the op the shape its graph node had
      tensors.append(t.reshape(shape) if tuple(t.shape) != shape else t)
    for i in op.complex_inputs: tensors[i] = _as_complex(tensors[i])
    result = op.target(*_substitute(op.args, tensors), **{k: _substitute(v, tensors) for k, v in op.kwargs.items()})
    results = list(result) if isinstance(result, (tuple, list)) else [result]
    for k, s in item.out_slots.items(): bufs[s] = (_as_real(results[k]) if k in op.complex_outputs else results[k]).contiguous()


def _fallback_fn(item: FallbackStep):
  """A fallback step as a function: its input tensors -> the tuple of the results the graph reads."""
  def run(*inputs):
    bufs = dict(zip(item.in_slots, inputs))
    CompiledGraph._run_fallback(item, bufs)
    return tuple(bufs[s] for s in item.out_slots.values())
  return run


def _nbytes(info) -> int:
  """Bytes a buffer of this shape and strides spans."""
  if any(n == 0 for n in info.shape): return 0
  return (1 + sum((n - 1) * abs(st) for n, st in zip(info.shape, info.strides))) * to_torch(info.dtype).itemsize


def _plan_arena(steps: list, buffers: dict, keep: set, last_use: dict) -> tuple[dict, int]:
  """Offsets in one arena for the intermediates that only kernels touch (written by one kernel, read by later
  kernels, not a graph output, not seen by a fallback op that might keep a view of it); two buffers share bytes only
  if their lifetimes (first write to last read, both inclusive) do not overlap. Returns ({slot: offset}, arena size)."""
  seen_by_fallback = {s for kind, p in steps if kind == "fallback" for s in p.in_slots}
  lives = []
  for i, (kind, p) in enumerate(steps):
    if kind != "kernel": continue
    slot = p.out_slot
    size = _nbytes(buffers[slot])
    if slot in keep or slot in seen_by_fallback or buffers[slot].kind == "input" or size == 0: continue
    lives.append((size, i, last_use.get(slot, i), slot))
  best = None
  for order in (lambda x: (-x[0], x[1]), lambda x: (x[1], -x[0])):  # first fit, biggest first or earliest first
    offsets, total = _first_fit(sorted(lives, key=order))
    if best is None or total < best[1]: best = (offsets, total)
  return best[0], -(-best[1] // ARENA_ALIGN) * ARENA_ALIGN


def _first_fit(lives: list) -> tuple[dict, int]:
  placed, offsets, total = [], {}, 0
  for size, start, end, slot in lives:
    busy = sorted((o, o + sz) for o, sz, s2, e2 in placed if s2 <= end and start <= e2)
    offset = 0
    for lo, hi in busy:  # the lowest gap that fits, among buffers alive at the same time
      if offset + size <= lo: break
      offset = max(offset, -(-hi // ARENA_ALIGN) * ARENA_ALIGN)
    placed.append((offset, size, start, end))
    offsets[slot] = offset
    total = max(total, offset + size)
  return offsets, total


def _peak_bytes(steps: list, buffers: dict, release: list, in_arena: dict) -> int:
  """The most bytes of buffers this graph allocates that are alive at once, outside the arena (an estimate: a
  fallback's results are counted at their buffer's size)."""
  live, peak = 0, 0
  for (kind, p), dead in zip(steps, release):
    made = [p.out_slot] if kind == "kernel" else list(p.out_slots.values())
    live += sum(_nbytes(buffers[s]) for s in made if s not in in_arena)
    peak = max(peak, live)
    live -= sum(_nbytes(buffers[s]) for s in dead if s not in in_arena and buffers[s].kind != "input")
  return peak


def _as_real(t: torch.Tensor) -> torch.Tensor:
  """A complex tensor's values as its view_as_real (a lazily conjugated or negated one is resolved first)."""
  return torch.view_as_real(t.resolve_conj().resolve_neg())


def _as_complex(t: torch.Tensor) -> torch.Tensor:
  """view_as_complex of a real tensor with a trailing dim of 2, copied first where its layout does not allow the view."""
  if t.stride(-1) != 1 or t.storage_offset() % 2 or any(s % 2 for s in t.stride()[:-1]): t = t.contiguous()
  return torch.view_as_complex(t)


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


def _step_name(graph: str, kind: str, step) -> str:
  """A step's name in torch.profiler traces: `uop:<graph>:k<n> <what it computes>` (n: the kernel's number in the
  TORCH_UOP_DEBUG listing) or `uop:<graph>:fallback <op>`."""
  if kind != "kernel": return f"uop:{graph}:fallback {step.op.name}"
  number = step.label.rsplit("_", 1)[-1] if step.label else step.name
  return f"uop:{graph}:{number} {step.what or tuple(step.shape)}"


def profile_key(step) -> str:
  """A kernel step's name in `torch_uop.debug.profile()`'s table and its companions: "forward1_k3 (1, 128, 768)"."""
  return f"{step.label or step.name} {tuple(step.shape)}"


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


def _renamed(source: str, old: str, new: str) -> str:
  """A kernel's source with its function renamed (`@name(` in LLVM IR, ` name(` in C-style code)."""
  return source.replace(f"@{old}(", f"@{new}(", 1).replace(f" {old}(", f" {new}(", 1)


def _kernel_symbol(k, source: str) -> str:
  """The kernel's function name in native code: a digest of its LLVM IR (with its own name taken out) and its
  thread-split size (which its launchers bake in), so equal kernels share one function and one cached object."""
  code = source.replace(f"@{k.name}(", "@kernel(", 1).replace(f" {k.name}(", " kernel(", 1) + f"|split={k.split_size}"
  return "k_" + hashlib.sha256(code.encode()).hexdigest()[:24]


def _gpu_module(k, sym: str, source: str) -> tuple:
  """(the kernel's source under its symbol, no launchers, its number of buffers) for a GPU-style program."""
  return source.replace(f" {k.name}(", f" {sym}(", 1), {}, len(k.buffers)


def _cpu_module(k, sym: str, source: str, work) -> tuple:
  """(the kernel's LLVM IR under its symbol, its launchers' IR by name, its number of buffers)."""
  entries = {}
  # a symbolic split size (or work) is known per call: such a kernel gets both launchers, which take the split
  # size as an argument, and each instance picks (_make_plan)
  symbolic = is_sym(k.split_size) or is_sym(work)
  split = None if is_sym(k.split_size) else k.split_size
  # small kernels also get a launcher Python calls as a builtin (holding the GIL: only for short runs)
  if python_entries_supported() and (symbolic or work < ENTRY_MAX_WORK):
    entries[f"{sym}_py"] = python_entry_ir(f"{sym}_py", sym, len(k.buffers), None if split is None else max(split, 1))
  if openmp_supported() and (symbolic or threads.max_threads(k.split_size, work) > 1):
    entries[f"{sym}_par"] = parallel_entry_ir(f"{sym}_par", sym, len(k.buffers), split)
  return source.replace(f"@{k.name}(", f"@{sym}(", 1), entries, len(k.buffers)


def _kernel_work(k):
  """Scalar operations one call of a kernel does, roughly: its loop trip counts times its body size, a vector node
  counted once per lane (a Sym when some trip count is a symbolic size)."""
  widths = vector_widths(k.program)
  trips = 1
  for u in k.program:
    if u.op is Ops.RANGE and u.arg[1] == "stage": continue  # (a copy beside the loop nest, not inside it)
    if u.op is Ops.RANGE and u.src[0].op is Ops.CONST: trips *= u.src[0].arg
    elif u.op is Ops.RANGE and u.arg[1] != "loop": trips = trips * Sym(u.src[0])
  return trips * max(1, sum(widths.get(u, 1) for u in k.program))


def _concrete_fields(obj, values: dict):
  """A dataclass instance with the Syms in its fields (and a fallback step's op arguments) evaluated."""
  changes = {f.name: concrete(getattr(obj, f.name), values) for f in dataclasses.fields(obj)}
  if isinstance(obj, FallbackStep):
    op = obj.op
    changes["op"] = dataclasses.replace(op, args=concrete(op.args, values), kwargs=concrete(op.kwargs, values))
  return dataclasses.replace(obj, **changes)


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
  at = [UOp(Ops.RANGE, dtypes.index, (UOp.const(dtypes.index, n),), (d, "global")) if n > 1 else UOp.const(dtypes.index, 0)
        for d, n in enumerate(u.shape)]
  flat, valid = (ShapeTracker.from_strides(base.shape, layout) + u.arg).to_indexed(at)
  valid, flat = simplify(valid), simplify(flat)
  if valid.op is not Ops.CONST or valid.arg is not True: return None
  strides = [0] * len(at)
  terms, offset = base_and_offset(flat)  # flat as a sum of range * constant terms and a constant
  for t in terms:
    if t.op is Ops.RANGE: strides[t.arg[0]] += 1
    elif t.op is Ops.MUL and t.src[0].op is Ops.RANGE and t.src[1].op is Ops.CONST: strides[t.src[0].arg[0]] += t.src[1].arg
    else: return None
  if min(strides, default=0) < 0 or offset < 0: return None
  return _in_eager_layout(base, u.shape, strides, offset, want)


def _same_strides(shape: tuple, a: tuple, b: tuple) -> bool:
  return all(x == y for n, x, y in zip(shape, a, b) if n > 1)


def _one_element_per_location(shape: tuple, strides: tuple) -> bool:
  """True if no two in-bounds indices of this layout address the same element (no stride 0, no overlap)."""
  dims = sorted((abs(st), n) for n, st in zip(shape, strides) if n > 1)
  reach = 1  # every offset reachable by the dims so far lies in [0, reach)
  for st, n in dims:
    if st < reach: return False
    reach = st * (n - 1) + reach
  return True


