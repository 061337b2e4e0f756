"""Inspection helpers: see the kernels torch_uop makes for a function.

`compile_graph(fn, *inputs)` traces `fn` to core ATen (the backend's decomposition table) with
make_fx, without Dynamo or AOTAutograd, and compiles it; the returned `CompiledGraph` has
`.kernels` (each with `.name`, `.ast` — the kernel UOp graph, print it with
`torch_uop.core.uop.pretty` — and `.program`, the linear program) and `.sources` (LLVM IR per kernel, or with
`device="opencl"`/`"cuda"` each kernel's OpenCL C / CUDA C, and `.device_source`, the whole program).
`capture()` records every graph compiled while it is active, e.g. by `torch.compile(backend="uop")`.
`profile()` times every kernel and fallback step of every compiled graph called while it is active.
`kernel_work(graph)` gives each kernel's bytes moved and FLOPs, keyed like `profile()`'s steps.
`peak_alloc_bytes(call)` is the most memory torch's CPU allocator held during `call()` above what it held before.
(Under `torch.profiler.profile()` the same steps appear in the trace as `uop:<graph>:k<n> <ops>[<shape>]`.)
`python -m torch_uop.debug pipeline` prints the compile pipeline's passes (torch_uop/pipeline.py).

    with torch_uop.debug.capture() as graphs:
      torch.compile(fn, backend="uop")(x)
    for g in graphs: print([k.name for k in g.kernels])
"""
from __future__ import annotations
import contextlib
import sys
import torch
import torch.utils._pytree as pytree

__all__ = ["compile_graph", "capture", "profile", "format_profile", "kernel_work", "peak_alloc_bytes"]


def compile_graph(fn, *example_inputs, name: str = "graph", opt_level: int = 3, debug: int = 0, device: str | None = None):
  """Trace fn(*example_inputs) to an ATen FX graph and compile it with torch_uop, for `device` ("cpu", "opencl",
  "cuda"; default: "cuda" for inputs on a CUDA device, else "cpu").

  Returns a `CompiledGraph`: call it with tensors of the example inputs' shapes, dtypes and strides;
  it returns the flattened outputs of fn as a list. Kernels are named `{name}_k{i}`. Nodes without a
  lowering fall back to ATen exactly as under torch.compile.
  """
  from torch.fx.experimental.proxy_tensor import make_fx
  from torch_uop.dynamo_backend import decomposition_table
  from torch_uop.lowering.graph import lower_graph
  from torch_uop.runtime.executor import CompiledGraph
  from torch_uop.runtime.devices import Target
  import torch_uop.lowering  # noqa: F401  fills the registry

  def flat_fn(*args): return list(pytree.tree_leaves(fn(*args)))

  functional = torch.func.functionalize(flat_fn, remove="mutations_and_views")
  gm = make_fx(functional, decomposition_table=decomposition_table(), tracing_mode="fake")(*example_inputs)
  on_cuda = next((t.device for t in example_inputs if isinstance(t, torch.Tensor) and t.is_cuda), None)
  target = Target(device or ("cuda" if on_cuda is not None else "cpu"), (on_cuda.index or 0) if on_cuda is not None else 0)
  return CompiledGraph(lower_graph(gm, device=target.torch_device, vectors=target.vector_unit()), debug=debug, opt_level=opt_level, name=name,
                       target=target)


@contextlib.contextmanager
def capture():
  """Collect every `CompiledGraph` built while the block runs (forward, backward and inference
  graphs of torch.compile alike, in compilation order). Graphs that fall back whole are not built,
  so they do not appear."""
  from torch_uop.runtime import executor
  graphs: list = []
  executor._observers.append(graphs)
  try: yield graphs
  finally: executor._observers.remove(graphs)


@contextlib.contextmanager
def profile():
  """Time each step (kernel or fallback) of compiled graphs called inside the block; yields a dict
  "kernel name (output shape)" -> (calls, seconds), filled as calls happen. Calls take the executor's general
  path while profiling, so the per-call overhead measured around them is not the usual one.

      with torch_uop.debug.profile() as steps:
        for _ in range(10): compiled(x)
      print(torch_uop.debug.format_profile(steps))
  """
  from torch_uop.runtime import executor
  if executor._profile is not None: raise RuntimeError("torch_uop.debug.profile() is already active")
  steps: dict = {}
  executor._profile = steps
  try: yield steps
  finally: executor._profile = None


def format_profile(steps: dict, top: int = 30) -> str:
  """A table of `profile()`'s result, the slowest steps first."""
  total = sum(s for _, s in steps.values()) or 1.0
  rows = sorted(steps.items(), key=lambda kv: -kv[1][1])[:top]
  lines = [f"{'step':48s} {'calls':>6s} {'us/call':>9s} {'share':>6s}"]
  lines += [f"{name[:48]:48s} {calls:6d} {1e6 * secs / calls:9.1f} {100 * secs / total:5.1f}%" for name, (calls, secs) in rows]
  return "\n".join(lines)


def kernel_work(graph) -> dict:
  """{step name: (bytes, flops)} for each kernel of a `CompiledGraph`, keyed like `profile()`'s steps
  ("forward1_k3 (1, 128, 768)"), for one call.

  bytes: the output buffer's size plus, for each buffer the kernel reads, its size or, if smaller, the bytes its
  loads fetch (an embedding table read at a few rows counts those rows). flops: for each reduction in the kernel,
  its body's executions (outputs x reduction length), twice for a sum of products (matmul, convolution; two fused
  matmuls count twice); a kernel without reductions, one per output element. The counts come from the kernel's AST,
  which a graph loaded from the graph cache lacks (compile with `options={"graph_cache": False}`): there every
  buffer counts whole and a kernel one FLOP per output element. A graph with symbolic sizes has no plan: {}."""
  import math
  from torch_uop.torch_dtypes import to_torch
  from torch_uop.runtime.executor import profile_key
  plan = getattr(graph, "plan", None)
  if plan is None: return {}
  counted = {k.name: _ast_counts(k) for k in graph.kernels}
  work = {}
  for kind, step in plan.steps:
    if kind != "kernel": continue
    outputs = math.prod(step.shape)
    loads, flops = counted.get(step.label, ({}, None))
    nbytes = plan.buffers[step.out_slot].nbytes
    for slot in dict.fromkeys(step.slots[1:]):
      info = plan.buffers[slot]
      size = info.nbytes
      nbytes += min(size, loads[slot] * to_torch(info.dtype).itemsize) if slot in loads else size
    work[profile_key(step)] = (nbytes, outputs if flops is None else flops)
  return work


def kernel_ops(graph) -> dict:
  """{step name: the ATen ops the kernel computes} for each kernel of a `CompiledGraph`, keyed like `profile()`'s
  steps, e.g. "convolution+...+relu" (the profiler names' ops, without their shape); {} for a graph with no plan."""
  from torch_uop.runtime.executor import profile_key
  plan = getattr(graph, "plan", None)
  if plan is None: return {}
  return {profile_key(step): (step.what or "").split("[")[0] for kind, step in plan.steps if kind == "kernel"}


def _ast_counts(kernel) -> tuple[dict, int | None]:
  """({buffer slot: elements its loads fetch per call}, FLOPs per call or None without reductions) of a kernel's AST.
  A node runs once per iteration of the loops it depends on (codegen hoists it out of the others; a reduction's
  result no longer depends on the loops it reduces over, so softmax's sum runs once per row, not per element; a
  read of a panel staged on the stack does not depend on the loops that copy it there); a loop whose trip count is
  symbolic or data counts once."""
  import math
  from torch_uop.core.uop import Ops, AxisKind
  nodes = kernel.ast.toposort()
  ranges: dict = {}
  for u in nodes:
    deps = frozenset().union(*(ranges[s] for s in u.src)) | ({u} if u.op is Ops.RANGE else frozenset())
    if u.op is Ops.REDUCE: deps = deps - frozenset(u.src[1:])
    # a staged panel (AFTER its copy into a local array) is copied once per panel: its reads do not run in the copy's
    # loops (nor once per lane of the copy's vectors); a vector lane elsewhere counts its lanes, as a loop would
    if u.op is Ops.AFTER: deps = frozenset(r for r in deps if r.arg.kind not in (AxisKind.STAGE, AxisKind.VECTOR))
    ranges[u] = deps

  def runs(u) -> int:
    return math.prod(r.src[0].arg for r in ranges[u] if r.src[0].op is Ops.CONST)

  def is_product(u) -> bool:
    while u.op is Ops.CAST: u = u.src[0]
    return u.op is Ops.MUL
  loads: dict = {}
  for u in nodes:
    if u.op is Ops.LOAD and u.src[0].op is Ops.DEFINE_GLOBAL: loads[u.src[0].arg] = loads.get(u.src[0].arg, 0) + runs(u)
  reduces = [u for u in nodes if u.op is Ops.REDUCE]
  flops = sum((2 if u.arg is Ops.ADD and is_product(u.src[0]) else 1) * runs(u.src[0]) for u in reduces) if reduces else None
  slot_of = dict(zip(kernel.argument_ids, kernel.buffers))  # the AST numbers buffers by argument id
  return {slot_of[i]: n for i, n in loads.items()}, flops


def peak_alloc_bytes(call) -> int:
  """The most bytes torch's CPU allocator held during call(), above what it held before it (torch.profiler with
  profile_memory; torch_uop's kernels, like eager and Inductor, allocate through torch, so this compares backends).
  The profiler does not see the freeing of memory allocated before call() (measure a whole training step, not its
  backward alone), and an arena the executor keeps between calls (runtime/executor.py ARENA_KEEP_BYTES) counts only
  in the call that allocates it."""
  import os
  from torch.profiler import profile as torch_profile, ProfilerActivity
  from torch._C._profiler import _EventType
  saved = os.dup(2)  # kineto prints a line to stderr at each start and stop
  try:
    with open(os.devnull, "w") as null: os.dup2(null.fileno(), 2)
    with torch_profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof: call()
  finally:
    os.dup2(saved, 2)
    os.close(saved)
  allocs, stack = [], list(prof.profiler.kineto_results.experimental_event_tree())
  while stack:
    node = stack.pop()
    if node.tag == _EventType.Allocation: allocs.append(node)
    stack.extend(node.children)
  if not allocs: return 0
  allocs.sort(key=lambda a: a.start_time_ns)
  first = allocs[0].extra_fields
  before = first.total_allocated - first.alloc_size
  return max(a.extra_fields.total_allocated for a in allocs) - before


def _main(argv: list) -> int:
  """`python -m torch_uop.debug pipeline`: the compile pipeline's passes in order."""
  if argv == ["pipeline"]:
    from torch_uop.pipeline import describe_pipeline
    print(describe_pipeline())
    print("\nTORCH_UOP_DEBUG_AFTER=<pass>[,<pass>...] (or \"all\") logs what a pass produced.")
    return 0
  print("usage: python -m torch_uop.debug pipeline", file=sys.stderr)
  return 2


if __name__ == "__main__":
  sys.exit(_main(sys.argv[1:]))
