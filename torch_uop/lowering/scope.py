"""The state one graph's lowering shares: a `GraphScope`, set by lower_graph for as long as it runs.

Lowerings read it through `graph_scope()`: the device the graph's tensors live on (a `device=` argument naming
another one falls back), the vector registers of the CPU it compiles for (core/opt.py VectorUnit; None for a
GPU-style device: linalg's packed panels are laid out for them) and the symbolic sizes of a dynamic-shape graph
(lowering/specialize.py SizeVars; None for a static one). It is held per thread and restored when the lowering
ends, so graphs lowered on two threads, or one inside another, do not see each other's.
"""
from __future__ import annotations
import contextlib
import threading
from typing import Any, NamedTuple
import torch


class GraphScope(NamedTuple):
  device: torch.device = torch.device("cpu")
  vectors: Any = None  # core/opt.py VectorUnit, None off the CPU
  sizes: Any = None    # lowering/specialize.py SizeVars, None for static sizes


_DEFAULT = GraphScope()
_local = threading.local()


def graph_scope() -> GraphScope:
  """The scope of the graph being lowered on this thread (outside lower_graph: the CPU, static sizes)."""
  return getattr(_local, "scope", _DEFAULT)


@contextlib.contextmanager
def lowering_scope(scope: GraphScope):
  previous = graph_scope()
  _local.scope = scope
  try: yield scope
  finally: _local.scope = previous
