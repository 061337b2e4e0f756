"""Inspection helpers: see the kernels torch_uop makes for a function.

`compile_graph(fn, *inputs)` traces `fn` to core ATen (the backend's decomposition table) with
make_fx, without Dynamo or AOTAutograd, and compiles it; the returned `CompiledGraph` has
`.kernels` (each with `.name`, `.ast` — the kernel UOp graph, print it with
`torch_uop.core.uop.pretty` — and `.program`, the linear program) and `.sources` (LLVM IR per kernel).
`capture()` records every graph compiled while it is active, e.g. by `torch.compile(backend="uop")`.

    with torch_uop.debug.capture() as graphs:
      torch.compile(fn, backend="uop")(x)
    for g in graphs: print([k.name for k in g.kernels])
"""
from __future__ import annotations
import contextlib
import torch
import torch.utils._pytree as pytree

__all__ = ["compile_graph", "capture"]


def compile_graph(fn, *example_inputs, name: str = "graph", opt_level: int = 3, debug: int = 0):
  """Trace fn(*example_inputs) to an ATen FX graph and compile it with torch_uop.

  Returns a `CompiledGraph`: call it with tensors of the example inputs' shapes, dtypes and strides;
  it returns the flattened outputs of fn as a list. Kernels are named `{name}_k{i}`. Nodes without a
  lowering fall back to ATen exactly as under torch.compile.
  """
  from torch.fx.experimental.proxy_tensor import make_fx
  from torch_uop.dynamo_backend import decomposition_table
  from torch_uop.lowering.graph import lower_graph
  from torch_uop.runtime.executor import CompiledGraph
  import torch_uop.lowering  # noqa: F401  fills the registry

  def flat_fn(*args): return list(pytree.tree_leaves(fn(*args)))

  functional = torch.func.functionalize(flat_fn, remove="mutations_and_views")
  gm = make_fx(functional, decomposition_table=decomposition_table(), tracing_mode="fake")(*example_inputs)
  return CompiledGraph(lower_graph(gm, debug), debug=debug, opt_level=opt_level, name=name)


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
