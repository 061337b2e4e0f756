"""The registry from ATen overloads to lowering functions.

`@register(aten.add.Tensor, aten.add.Scalar)` adds a lowering. A lowering is called as
`fn(ctx, *args, **kwargs)` with FX node arguments replaced by `LT`s (lists of nodes by lists of LTs)
and returns an LT, or a tuple/list of LTs for multi-output ops. `ctx` carries the node's
`meta["val"]`: `ctx.shape`, `ctx.dtype` (IR dtype), `ctx.vals` for multi-output nodes. A lowering
may raise (e.g. `Unsupported`) for cases it does not handle: the node then falls back to ATen.
`ctx.host_call` adds a step of the lowering's own that runs on the host between kernels (e.g. a
data-dependent error check); it is part of the lowering, not a fallback.
"""
from __future__ import annotations
from typing import Callable
import torch
from torch_uop.core.dtypes import from_torch
from torch_uop.lowering.specialize import to_size

LOWERINGS: dict = {}
# lowerings for nodes that read or produce complex tensors (held as real tensors with a trailing dim of 2);
# filled by lowering/complex.py, looked up instead of LOWERINGS for such nodes
COMPLEX_LOWERINGS: dict = {}


_graph_device = torch.device("cpu")  # the device of the graph being lowered (lowering/graph.py sets it)


def set_graph_device(device: torch.device) -> None:
  global _graph_device
  _graph_device = torch.device(device)


def on_graph_device(device) -> bool:
  """Whether a `device=` argument (None: the default) names the device of the graph being lowered."""
  if device is None: return True
  d = torch.device(device)
  return d.type == _graph_device.type and (d.index is None or _graph_device.index is None or d.index == _graph_device.index)


class Unsupported(NotImplementedError):
  """A lowering does not handle this particular call; the node falls back to ATen."""


def register(*ops) -> Callable:
  def deco(fn):
    for op in ops:
      if isinstance(op, torch._ops.OpOverloadPacket):
        for name in op.overloads(): LOWERINGS[getattr(op, name)] = fn
      else: LOWERINGS[op] = fn
    return fn
  return deco


def lowering_for(target, complex_values: bool = False):
  return (COMPLEX_LOWERINGS if complex_values else LOWERINGS).get(target)


class LoweringContext:
  def __init__(self, node: torch.fx.Node):
    self.node = node
    self.val = node.meta.get("val")
    self.graph = None  # the lowering's GraphState (lowering/graph.py), set while a graph is lowered

  def host_call(self, fn: Callable, inputs: list, outputs: list) -> list:
    """At run time, call `fn(*inputs)` on torch tensors between kernels; `outputs` lists its results as
    (shape, IR dtype) pairs. Returns an LT per result, for the lowering to build on."""
    if self.graph is None: raise Unsupported("no graph to add a host step to")
    return self.graph.host_call(fn, list(inputs), list(outputs))

  @property
  def vals(self) -> list: return list(self.val) if isinstance(self.val, (tuple, list)) else [self.val]
  @property
  def shape(self) -> tuple: return tuple(to_size(s) for s in self.val.shape)
  @property
  def dtype(self): return from_torch(self.val.dtype)
  def shape_of(self, i: int) -> tuple: return tuple(to_size(s) for s in self.vals[i].shape)
  def dtype_of(self, i: int): return from_torch(self.vals[i].dtype)
