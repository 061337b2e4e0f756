"""The executor: a LoweredGraph -> the callable PyTorch calls in place of the FX graph.

At compile time `CompiledGraph` runs the compile pipeline (torch_uop/pipeline.py: outputs, schedule, search,
codegen, compile, steps) and plans every step it returns: which buffers to allocate, which to free after their last
use. Intermediates that only kernels touch share one arena: each gets an offset,
and two share bytes only if their lifetimes do not overlap; an arena up to ARENA_KEEP_BYTES is
allocated once and kept (guarded by a lock), a bigger one once per call. At the first call the call
path is generated as straight-line Python (`call_source`): check each input's dtype, shape and
strides, allocate outputs, call each small kernel through its builtin launcher (runtime/cpu.py)
with its buffers' addresses, bigger ones through runtime/threads.py, run fallback ops, return the
outputs. Anything else (another layout, a storage offset guard, complex values, the arena in use by
another thread) takes `_call_general`. Outputs are allocated by torch, never in the arena, with the
strides eager gives them (AOTAutograd compiles the backward for the saved tensors' eager layouts).
On a GPU-style target (runtime/devices.py: OpenCL, CUDA) each kernel step gets a launcher that knows its buffers'
sizes and work-item counts, and a target whose launches only enqueue (OpenCL on host memory) is synchronized before
every host step and the return.
"""
from __future__ import annotations
import math
import dataclasses
from dataclasses import dataclass, field
from typing import NamedTuple
import threading
import time
import torch
from torch.autograd import profiler as _torch_profiler
from torch_uop.core.sym import concrete
from torch_uop.runtime.devices import Target, CPU, ENTRY_MAX_WORK
from torch_uop.lowering.graph import LoweredGraph, TensorRef
from torch_uop.runtime.cpu import CPUProgram, openmp_supported
from torch_uop.runtime import threads
from torch_uop.runtime.memory import advise_huge_pages, huge_page_advisor, HUGE_PAGE_MIN_BYTES
from torch_uop.pipeline import compile_lowered, FallbackStep
from torch_uop import counters as _metrics, log

_log = log.get("kernels")


def _substitute(x, tensors):
  if isinstance(x, TensorRef): return tensors[x.index]
  if isinstance(x, (list, tuple)): return type(x)(_substitute(a, tensors) for a in x)
  return x


# an arena up to this size is allocated once per graph and kept; a bigger one is allocated at each call
ARENA_KEEP_BYTES = 16 << 20
# alignment of each buffer in an arena (what torch's CPU allocator gives)
ARENA_ALIGN = 64

try:  # torch's C++ allocation fast path (the one Inductor's generated code calls)
  from torch._C._dynamo.guards import _empty_strided_cpu as _empty_strided
except ImportError:  # pragma: no cover
  def _empty_strided(shape, strides, dtype): return torch.empty_strided(shape, strides, dtype=dtype)


class LinkedKernel(NamedTuple):
  """A kernel step bound to the loaded program (CompiledGraph._link): what a call needs to launch it."""
  fn: object              # the kernel's function (ctypes, or a GPU-style target's launcher)
  slots: list             # buffer slots it takes, output first
  out_slot: int
  shape: tuple            # its output's shape, strides and torch dtype
  strides: tuple
  dtype: torch.dtype
  empty: bool             # the output has no elements: nothing to launch
  split_size: int         # trip count of its thread-split loop
  max_threads: int        # threads worth running it on (runtime/threads.py max_threads)
  entry: object           # its builtin launcher (small kernels), or None
  parallel_entry: object  # its OpenMP launcher, or None
  split_arg: bool         # the launchers take the split size as an argument


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
               size_vars: list | None = None, target: Target = CPU, constant_inputs: frozenset = frozenset(),
               debug_after: tuple = (), spec: bool = False):
    """Compile `lowered` (torch_uop/pipeline.py) and plan its steps. `size_vars`: the graph's size variables
    (DEFINE_VARs, in the order of the int64 buffer kernels read them from) when its sizes are symbolic: built inside
    a core.sym.SizeContext, the result is a template whose `instance(values)` is the graph for one call's sizes
    (kernels shared, only the plan made again). `target`: where the kernels run (runtime/devices.py).
    `constant_inputs`: positions of inputs that every call passes unchanged (frozen weights): the kernels that read
    only them run once, at the first call (the prologue), and their results are kept until `refresh_constants()`.
    `debug_after`: pipeline passes whose result is logged (pipeline.parse_debug_after). `spec`: check every kernel's
    IR against core/spec.py (pipeline.compile_lowered)."""
    self.target, self.name = target, name
    # an instance attribute, so wrappers made with functools.wraps (torch._dynamo.disable) keep it
    self._boxed_call = True
    self.debug = debug
    self.inputs = lowered.inputs
    # (input index, storage offset) pairs the kernels assume; on a mismatch `eager` (the graph run by torch,
    # set by the backend) runs instead
    self.storage_offset_guards = [(i, lowered.storage_offset_guards[spec.slot]) for i, spec in enumerate(lowered.inputs)
                                  if spec is not None and spec.slot in lowered.storage_offset_guards]
    self.eager = None
    c = compile_lowered(lowered, target, name, opt_level, beam, size_vars, constant_inputs, debug, debug_after, spec)
    self.size_vars, self.vars_slot = c.size_vars, c.vars_slot
    self.var_position, self.derived_vars = c.var_position, c.derived_vars
    self.buffers = c.schedule.buffers
    self.kernels = [k for _, k in c.kernels]
    self.sources = c.sources
    self.device_source = c.device_source  # a GPU-style target: the program's source (all kernels)
    self.n_fallbacks = sum(1 for s in c.steps if s[0] == "fallback")
    self._template = (c.steps, c.outputs_plan, c.complex_outputs, c.checks, c.signatures,
                      c.program.object_code if c.program and target.kind != "gpu" else None, c.prologue)
    self.program = c.program
    if self.size_vars:  # the plan depends on the sizes: one per call signature, made by instance()
      self.plan, self.n_kernels = None, sum(1 for kind, _ in c.steps if kind == "kernel")
      return
    self.plan = self._make_plan({})
    self._link(c.program)

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
        run = program.launcher(step.name, [plan.buffers[s].nbytes for s in step.slots], step.items, step.local_size)
        self.steps.append((kind, LinkedKernel(run, step.slots, step.out_slot, step.shape, step.strides, step.dtype,
                                              step.empty, 0, 1, run, None, False)))
      elif kind == "kernel":
        self.steps.append((kind, LinkedKernel(program.functions[step.name], step.slots, step.out_slot, step.shape,
                                              step.strides, step.dtype, step.empty, step.split_size,
                                              threads.max_threads(step.split_size, step.work),
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
      if i not in self.prologue: read.update(payload.slots if kind == "kernel" else payload.in_slots)
    self.held = {slot: bufs[slot] for i in self.prologue if (slot := self.steps[i][1].out_slot) in read}

  def _launch(self, k: LinkedKernel, bufs: dict) -> None:
    """One kernel step of the general call path: allocate its output in `bufs` and launch it."""
    bufs[k.out_slot] = out = torch.empty_strided(k.shape, k.strides, dtype=k.dtype, device=self.target.torch_device)
    if self._wants_huge_pages(nbytes := self.buffers[k.out_slot].nbytes): advise_huge_pages(out.data_ptr(), nbytes)
    if not k.empty:
      threads.launch(k.fn, [bufs[s].data_ptr() for s in k.slots], k.split_size, k.max_threads, k.entry,
                     k.parallel_entry, k.split_arg)

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
    kernel_slots = {s for kind, p in self.steps if kind == "kernel" for s in p.slots}
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
        k, out = payload, payload.out_slot
        if out not in self.arena_offsets:
          body.append(f"b{out} = empty({tuple(k.shape)!r}, {tuple(k.strides)!r}, {const(k.dtype, 'D')})")
          body += addresses([out])
          if huge(nbytes := self.buffers[out].nbytes): body.append(f"advise(p{out}, {nbytes})")
        if not k.empty:
          args = ", ".join(ptr(s) for s in k.slots)
          if k.max_threads > 1:
            body.append(f"launch({const(k.fn, 'K')}, ({args},), {k.split_size}, {k.max_threads}, {const(k.entry, 'E')}, "
                        f"{const(k.parallel_entry, 'P')}, {k.split_arg})")
          elif k.entry is not None:
            body.append(f"{const(k.entry, 'E')}({args}{f', {max(k.split_size, 1)}' if k.split_arg else ''})")
          else: body.append(f"{const(k.fn, 'K')}({args}, 0, {max(k.split_size, 1)})")
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
        produced_by_kernel = any(k == "kernel" and p.out_slot == v for k, p in self.steps)
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


def _plan_arena(steps: list, buffers: dict, keep: set, last_use: dict) -> tuple[dict, int]:
  """Offsets in one arena for the intermediates that only kernels touch (written by one kernel, read by later
  kernels, not a graph output, not seen by a fallback op that might keep a view of it); two buffers share bytes only
  if their lifetimes (first write to last read, both inclusive) do not overlap. Returns ({slot: offset}, arena size)."""
  seen_by_fallback = {s for kind, p in steps if kind == "fallback" for s in p.in_slots}
  lives = []
  for i, (kind, p) in enumerate(steps):
    if kind != "kernel": continue
    slot = p.out_slot
    size = buffers[slot].nbytes
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
    live += sum(buffers[s].nbytes for s in made if s not in in_arena)
    peak = max(peak, live)
    live -= sum(buffers[s].nbytes for s in dead if s not in in_arena and buffers[s].kind != "input")
  return peak


def _as_real(t: torch.Tensor) -> torch.Tensor:
  """A complex tensor's values as its view_as_real (a lazily conjugated or negated one is resolved first)."""
  return torch.view_as_real(t.resolve_conj().resolve_neg())


def _as_complex(t: torch.Tensor) -> torch.Tensor:
  """view_as_complex of a real tensor with a trailing dim of 2, copied first where its layout does not allow the view."""
  if t.stride(-1) != 1 or t.storage_offset() % 2 or any(s % 2 for s in t.stride()[:-1]): t = t.contiguous()
  return torch.view_as_complex(t)


def _step_name(graph: str, kind: str, step) -> str:
  """A step's name in torch.profiler traces: `uop:<graph>:k<n> <what it computes>` (n: the kernel's number in the
  TORCH_UOP_DEBUG listing) or `uop:<graph>:fallback <op>`."""
  if kind != "kernel": return f"uop:{graph}:fallback {step.op.name}"
  number = step.label.rsplit("_", 1)[-1] if step.label else step.name
  return f"uop:{graph}:{number} {step.what or tuple(step.shape)}"


def profile_key(step) -> str:
  """A kernel step's name in `torch_uop.debug.profile()`'s table and its companions: "forward1_k3 (1, 128, 768)"."""
  return f"{step.label or step.name} {tuple(step.shape)}"


def _concrete_fields(obj, values: dict):
  """A dataclass instance with the Syms in its fields (and a fallback step's op arguments) evaluated."""
  changes = {f.name: concrete(getattr(obj, f.name), values) for f in dataclasses.fields(obj)}
  if isinstance(obj, FallbackStep):
    op = obj.op
    changes["op"] = dataclasses.replace(op, args=concrete(op.args, values), kwargs=concrete(op.kwargs, values))
  return dataclasses.replace(obj, **changes)


def _one_element_per_location(shape: tuple, strides: tuple) -> bool:
  """True if no two in-bounds indices of this layout address the same element (no stride 0, no overlap)."""
  dims = sorted((abs(st), n) for n, st in zip(shape, strides) if n > 1)
  reach = 1  # every offset reachable by the dims so far lies in [0, reach)
  for st, n in dims:
    if st < reach: return False
    reach = st * (n - 1) + reach
  return True


