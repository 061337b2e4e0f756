"""The registry from ATen overloads to lowering functions.

`@register(aten.add.Tensor, aten.add.Scalar)` adds a lowering. A lowering is called as
`fn(ctx, *args, **kwargs)` with FX node arguments replaced by `LT`s (lists of nodes by lists of LTs)
and returns an LT, or a tuple/list of LTs for multi-output ops. `ctx` carries the node's
`meta["val"]`: `ctx.shape`, `ctx.dtype` (IR dtype), `ctx.vals` for multi-output nodes. A lowering
may raise (e.g. `Unsupported`) for cases it does not handle: the node then falls back to ATen.
`ctx.host_call` adds a step of the lowering's own that runs on the host between kernels; it is part of the
lowering, not a fallback. `ctx.check` / `ctx.check_all` / `ctx.check_index` add the data checks eager makes at run time (an index
in range): a kernel reduces the data to one value, which the executor reads after the call's kernels.
"""
from __future__ import annotations
from typing import Callable
import torch
from torch_uop.core.dtypes import dtypes
from torch_uop.torch_dtypes import from_torch
from torch_uop.lowering.specialize import to_size
from torch_uop.lowering.scope import graph_scope

LOWERINGS: dict = {}
# lowerings for nodes that read or produce complex tensors (held as real tensors with a trailing dim of 2);
# filled by lowering/complex.py, looked up instead of LOWERINGS for such nodes
COMPLEX_LOWERINGS: dict = {}


def on_graph_device(device) -> bool:
  """Whether a `device=` argument (None: the default) names the device of the graph being lowered."""
  if device is None: return True
  d, here = torch.device(device), graph_scope().device
  return d.type == here.type and (d.index is None or here.index is None or d.index == here.index)


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

  def check(self, value, error: str, message: str, ok=False, name_op: bool = True) -> None:
    """Raise `error` (a builtin exception's name) with `message` (after the op's name, with `name_op`) at run time
    unless `value` (an LT of one element) equals `ok`; `message` may name the value as {value}. Costs one small
    kernel and one read per call."""
    if self.graph is None: raise Unsupported("no graph to add a run-time check to")
    from torch_uop.lowering.graph import RuntimeCheck
    self.graph.check(value, RuntimeCheck(error, f"{self.op_name}: {message}" if name_op else message, ok))

  def check_all(self, valid, error: str, message: str, name_op: bool = True) -> None:
    """Raise `error` with `message` at run time unless every element of `valid` (a bool LT) is true."""
    if valid.numel() == 0: return
    self.check(valid.reshape((valid.numel(),)).logical_not().max((0,), keepdim=False), error, message, name_op=name_op)

  def check_index(self, index, size, dim: int = 0, wraps: bool = False, error: str = "IndexError",
                  message: str = "index {value} is out of bounds for dimension {dim} with size {size}") -> None:
    """Eager's error for an index outside [0, size), or [-size, size) where negative indices wrap. The run-time
    value is the largest offending index (the message's {value}); `message` may also name {dim} and {size}."""
    if index.numel() == 0: return
    idx = index.cast(dtypes.int64).reshape((index.numel(),))
    bad = ((idx < -size) if wraps else (idx < 0)) | (idx >= size)
    lowest = dtypes.int64.min()
    worst = bad.where(idx.maximum(lowest + 1), lowest).max((0,), keepdim=False)
    self.check(worst, error, message.replace("{dim}", str(dim)).replace("{size}", str(size)), ok=lowest)

  @property
  def op_name(self) -> str:
    """The node's ATen op as users know it (`aten.gather.default` -> gather)."""
    name = getattr(self.node.target, "__name__", str(self.node.target))
    return name.split(".")[0]

  @property
  def vals(self) -> list: return list(self.val) if isinstance(self.val, (tuple, list)) else [self.val]
  @property
  def shape(self) -> tuple: return tuple(to_size(s) for s in self.val.shape)
  @property
  def dtype(self): return from_torch(self.val.dtype)
  def shape_of(self, i: int) -> tuple: return tuple(to_size(s) for s in self.vals[i].shape)
  def dtype_of(self, i: int): return from_torch(self.vals[i].dtype)
