"""The executor: a LoweredGraph -> the callable PyTorch calls in place of the FX graph.

At compile time: schedule the tensor graph, build and linearize each kernel, render all kernels
into one LLVM module and compile it, and plan every step (which buffers to allocate, which to free
after their last use). At call time: check each input's layout, bind `data_ptr`s, launch kernels
and fallback ops in order, and return the outputs. Intermediates and outputs are allocated by torch;
outputs get the strides eager gives them (AOTAutograd compiles the backward for the saved tensors'
eager layouts).
"""
from __future__ import annotations
import math
import re
import sys
import time
import torch
from torch_uop.core.dtypes import to_torch
from torch_uop.core.uop import UOp, Ops, pretty
from torch_uop.lowering.tensor import LT
from torch_uop.core.schedule import schedule, KernelItem, FallbackItem
from torch_uop.core.shapetracker import contiguous_strides
from torch_uop.core.codegen import build_kernel
from torch_uop.core.search import beam_search
from torch_uop.core.renderer.llvmir import render_llvm
from torch_uop.lowering.graph import LoweredGraph, TensorRef
from torch_uop.runtime.cpu import CPUProgram
from torch_uop.runtime import threads
from torch_uop import counters as _metrics


class _Timer:
  def __init__(self, stage: str): self.stage = stage
  def __enter__(self): self.t0 = time.perf_counter()
  def __exit__(self, *a): _metrics.state()["compile_time_s"][self.stage] += time.perf_counter() - self.t0


def _substitute(x, tensors):
  if isinstance(x, TensorRef): return tensors[x.index]
  if isinstance(x, (list, tuple)): return type(x)(_substitute(a, tensors) for a in x)
  return x


# lists that every new CompiledGraph is appended to (see torch_uop.debug.capture)
_observers: list[list] = []


class CompiledGraph:
  """`kernels` (codegen.Kernel: name, ast, program, buffers) and `sources` (each kernel's LLVM IR, in
  the same order) stay available for inspection; `n_kernels`/`n_fallbacks` count the steps of one call."""

  def __init__(self, lowered: LoweredGraph, debug: int = 0, opt_level: int = 3, name: str = "graph", beam: int = 0):
    # an instance attribute, so wrappers made with functools.wraps (torch._dynamo.disable) keep it
    self._boxed_call = True
    self.debug = debug
    self.inputs = lowered.inputs
    # (input index, storage offset) pairs the kernels assume; on a mismatch `eager` (the graph run by torch,
    # set by the backend) runs instead
    self.storage_offset_guards = [(i, lowered.storage_offset_guards[spec.slot]) for i, spec in enumerate(lowered.inputs)
                                  if spec is not None and spec.slot in lowered.storage_offset_guards]
    self.eager = None
    roots, root_strides = [], {}
    outputs = []
    strides_of = lowered.output_strides or [None] * len(lowered.outputs)
    for (kind, v), want in zip(lowered.outputs, strides_of):
      if kind == "tensor":
        if v.uop.op is Ops.BUFFER and (not v.uop.src or (want is not None and not _same_strides(v.shape, want, contiguous_strides(v.shape)))):
          v = LT(UOp(Ops.CONTIGUOUS, v.dtype, (v.uop,)))  # never hand out a graph input; give a fallback result its layout
        # an output computed by a kernel is written in its eager layout; two outputs that are one node but
        # want different layouts get a copy each
        while v.uop in root_strides and want is not None and not _same_strides(v.shape, want, root_strides[v.uop] or want):
          v = LT(UOp(Ops.CONTIGUOUS, v.dtype, (v.uop,)))
        if v.uop not in root_strides: roots.append(v.uop); root_strides[v.uop] = want
      outputs.append((kind, v))
    with _Timer("schedule"):
      sched = schedule(roots, lowered.next_slot, lowered.buffer_slots, {u: s for u, s in root_strides.items() if s is not None})
    self.buffers = sched.buffers
    kernels, tuned = [], {}
    if beam:  # opts chosen by timing candidates (core/search.py); None keeps the heuristic
      with _Timer("search"):
        tuned = {i: beam_search(item, beam, opt_level, debug, f"{name}_k{i}") for i, item in enumerate(sched.items)
                 if isinstance(item, KernelItem)}
    with _Timer("codegen"):
      for i, item in enumerate(sched.items):
        if isinstance(item, KernelItem): kernels.append((item, build_kernel(item, f"{name}_k{i}", tuned.get(i))))
    with _Timer("render"):
      sources = [render_llvm(k.name, k.program, k.buffers) for _, k in kernels]
    self.kernels = [k for _, k in kernels]
    self.sources = sources
    if debug >= 2: self._print_kernels(sched, sources)
    self.program = None
    if kernels:
      with _Timer("llvm"):
        self.program = CPUProgram(_merge_modules(sources), {k.name: len(k.buffers) for _, k in kernels}, opt_level)
      if self.program.cache_hit: _metrics.state()["cache_hits"] += 1
    _metrics.state()["kernels_compiled"] += len(kernels)

    # plan the steps: (kind, payload) with buffer lifetimes
    fn_of = {id(item): self.program.functions[k.name] for item, k in kernels}
    kernel_of = {id(item): k for item, k in kernels}
    steps = []
    for item in sched.items:
      if isinstance(item, KernelItem):
        info = self.buffers[item.out_slot]
        k = kernel_of[id(item)]
        n_threads = threads.threads_for(k.split_size, _kernel_work(k))
        steps.append(("kernel", (fn_of[id(item)], k.buffers, item.out_slot, info.shape, info.strides, to_torch(info.dtype),
                                 math.prod(info.shape) == 0, k.split_size, n_threads)))
      else:
        steps.append(("fallback", item))
    self.steps = steps
    self.n_kernels = len(kernels)
    self.n_fallbacks = sum(1 for s in steps if s[0] == "fallback")
    self.outputs = []
    for kind, v in outputs:
      self.outputs.append((kind, sched.node_slot[v.uop] if kind == "tensor" else v, v.shape if kind == "tensor" else None))
    # complex outputs are computed as their view_as_real and handed out through view_as_complex
    self.complex_outputs = {i for i, c in enumerate(lowered.output_complex) if c and self.outputs[i][0] == "tensor"}
    # free each intermediate after its last use
    keep = {slot for kind, slot, _ in self.outputs if kind == "tensor"}
    last_use: dict = {}
    for i, (kind, payload) in enumerate(steps):
      used = payload[1] if kind == "kernel" else payload.in_slots + list(payload.out_slots.values())
      for s in used: last_use[s] = i
    self.release = [[] for _ in steps]
    for s, i in last_use.items():
      if s not in keep and self.buffers[s].kind != "input": self.release[i].append(s)
    for obs in _observers: obs.append(self)

  def _print_kernels(self, sched, sources):
    print(f"[torch_uop] {len(self.kernels)} kernels, {sum(isinstance(i, FallbackItem) for i in sched.items)} fallback steps",
          file=sys.stderr)
    for k, src in zip(self.kernels, sources):
      info = self.buffers[k.buffers[0]]
      print(f"  {k.name}: out {tuple(info.shape)} {info.dtype.name} <- buffers {k.buffers[1:]}", file=sys.stderr)
      if self.debug >= 5: print(pretty(k.ast), file=sys.stderr)
      if self.debug >= 4: print(src, file=sys.stderr)

  def _bind_input(self, spec, t: torch.Tensor) -> torch.Tensor:
    if spec.is_complex and isinstance(t, torch.Tensor) and t.is_complex(): t = _as_real(t)
    # the common case, checked cheaply: exactly the compiled dtype, shape and strides, on the CPU
    if isinstance(t, torch.Tensor) and t.dtype is spec.dtype and t.shape == spec.shape and t.stride() == spec.strides \
       and t.is_cpu:
      return t
    if t is None and math.prod(spec.shape) == 0:
      return torch.empty(spec.shape, dtype=spec.dtype)  # AOTAutograd passes None for side-effect tokens
    if not isinstance(t, torch.Tensor):
      raise TypeError(f"torch_uop: expected a tensor for input {spec.slot}, got {type(t).__name__}")
    if t.device.type != "cpu":
      raise RuntimeError(f"torch_uop: input {spec.slot} is on {t.device}, but this graph was compiled for the CPU")
    if t.dtype != spec.dtype or tuple(t.shape) != spec.shape:
      raise RuntimeError(f"torch_uop: input {spec.slot} is {tuple(t.shape)} {t.dtype}, compiled for {spec.shape} {spec.dtype}")
    if math.prod(spec.shape) > 1 and any(st != want for n, st, want in zip(spec.shape, t.stride(), spec.strides) if n > 1):
      # a layout the kernels were not built for: copy into the compiled layout, if it holds one element per location
      if not _one_element_per_location(spec.shape, spec.strides):
        raise RuntimeError(f"torch_uop: input {spec.slot} has strides {tuple(t.stride())}, but this graph was compiled for "
                           f"strides {spec.strides}, where several elements share one memory location (an expanded or "
                           f"overlapping tensor); its kernels cannot read other values. Compile it again for this layout.")
      t = torch.empty_strided(spec.shape, spec.strides, dtype=t.dtype).copy_(t)
    return t

  def __call__(self, *args):
    # boxed convention (one list, which we may clear) or plain positional tensors: graph inputs are never lists
    boxed = len(args) == 1 and isinstance(args[0], list)
    if boxed: args = args[0]
    if self.storage_offset_guards and self.eager is not None and \
       any(args[i].storage_offset() != off for i, off in self.storage_offset_guards):
      _metrics._state["graph_calls_run_by_torch"] += 1
      outs = self.eager(list(args))
      if boxed: args.clear()
      return outs
    bufs: dict = {}
    for spec, t in zip(self.inputs, args): bufs[spec.slot] = self._bind_input(spec, t)
    for (kind, payload), release in zip(self.steps, self.release):
      if kind == "kernel":
        fn, slots, out_slot, shape, strides, dtype, empty, split_size, n_threads = payload
        bufs[out_slot] = torch.empty_strided(shape, strides, dtype=dtype)
        if not empty: threads.launch(fn, [bufs[s].data_ptr() for s in slots], split_size, n_threads)
      else:
        self._run_fallback(payload, bufs)
      for s in release: del bufs[s]
    st = _metrics._state
    st["kernels_launched"] += self.n_kernels
    if self.n_fallbacks: st["fallback_steps_run"] += self.n_fallbacks
    outs = []
    for kind, v, shape in self.outputs:
      if kind == "tensor": outs.append(bufs[v].view(shape) if bufs[v].shape != shape else bufs[v])
      elif kind == "input": outs.append(args[v])
      else: outs.append(v)
    for i in self.complex_outputs: outs[i] = torch.view_as_complex(outs[i])
    if boxed: args.clear()
    return outs

  def _run_fallback(self, item: FallbackItem, bufs: dict):
    op = item.node.arg
    tensors = []
    for src, s in zip(item.node.src, item.in_slots):
      t = bufs[s]
      # a realized node or a flat buffer: give the op the shape its graph node had
      tensors.append(t.reshape(src.shape) if tuple(t.shape) != src.shape else t)
    for i in op.complex_inputs: tensors[i] = _as_complex(tensors[i])
    result = op.target(*_substitute(op.args, tensors), **{k: _substitute(v, tensors) for k, v in op.kwargs.items()})
    results = list(result) if isinstance(result, (tuple, list)) else [result]
    for k, s in item.out_slots.items(): bufs[s] = (_as_real(results[k]) if k in op.complex_outputs else results[k]).contiguous()


def _as_real(t: torch.Tensor) -> torch.Tensor:
  """A complex tensor's values as its view_as_real (a lazily conjugated or negated one is resolved first)."""
  return torch.view_as_real(t.resolve_conj().resolve_neg())


def _as_complex(t: torch.Tensor) -> torch.Tensor:
  """view_as_complex of a real tensor with a trailing dim of 2, copied first where its layout does not allow the view."""
  if t.stride(-1) != 1 or t.storage_offset() % 2 or any(s % 2 for s in t.stride()[:-1]): t = t.contiguous()
  return torch.view_as_complex(t)


def _kernel_work(k) -> int:
  """Scalar operations one call of a kernel does, roughly: its loop trip counts times its body size."""
  trips = 1
  for u in k.program:
    if u.op is Ops.RANGE and u.src[0].op is Ops.CONST: trips *= u.src[0].arg
  return trips * max(1, len(k.program))


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


def _merge_modules(sources: list[str]) -> str:
  """Concatenate kernel functions into one module: each external declared once, each kernel's
  numbered metadata shifted past the previous kernels'."""
  decls, bodies, meta = set(), [], []
  offset = 0
  for src in sources:
    lines = src.splitlines()
    decls.update(l for l in lines if l.startswith("declare "))
    mine = [l for l in lines if l.startswith("!")]
    shift = lambda text, k=offset: re.sub(r"!(\d+)", lambda m: f"!{int(m.group(1)) + k}", text)
    body = "\n".join(l for l in lines if not l.startswith(("declare ", "attributes", "!")))
    bodies.append(re.sub(r"!llvm\.loop !(\d+)", lambda m: shift(m.group(0)), body))
    meta.extend(shift(l) for l in mine)
    offset += len(mine)
  return "\n".join(sorted(decls)) + "\n" + "\n".join(bodies) + "\nattributes #0 = { nounwind }\n" + "\n".join(meta) + "\n"