"""Creation lowerings: full, scalar_tensor, arange, iota, and the *_like / new_* family.

Constants are broadcast CONST nodes and ranges are IOTA nodes, so creation ops fuse into their
consumers and cost no memory. Uninitialized tensors (empty) are zeros.
"""
from __future__ import annotations
import torch
from torch_uop.lowering.registry import register, Unsupported, on_graph_device
from torch_uop.lowering.tensor import LT
from torch_uop.core.dtypes import dtypes

aten = torch.ops.aten
prims = torch.ops.prims


def _check_device(kwargs):
  d = kwargs.get("device")
  if not on_graph_device(d): raise Unsupported(f"tensor on {d}")


@register(aten.full.default, aten.full_like.default, aten.new_full.default)
def full(ctx, *args, **kwargs):
  _check_device(kwargs)
  value = args[-1]
  return LT.full(ctx.shape, value, ctx.dtype)


@register(aten.zeros.default, aten.zeros_like.default, aten.new_zeros.default, aten.empty.memory_format,
          aten.empty_like.default, aten.new_empty.default, aten.empty_strided.default, aten.new_empty_strided.default,
          aten.empty_permuted.default)
def zeros(ctx, *args, **kwargs):
  _check_device(kwargs)
  return LT.full(ctx.shape, 0, ctx.dtype)


@register(aten.ones.default, aten.ones_like.default, aten.new_ones.default)
def ones(ctx, *args, **kwargs):
  _check_device(kwargs)
  return LT.full(ctx.shape, 1, ctx.dtype)


@register(aten.scalar_tensor.default)
def scalar_tensor(ctx, value, **kwargs):
  _check_device(kwargs)
  return LT.full((), value, ctx.dtype)


@register(aten.fill.Scalar)
def fill(ctx, x, value): return LT.full(ctx.shape, value, ctx.dtype)


@register(aten.arange.start_step, aten.arange.default, aten.arange.start)
def arange(ctx, *args, **kwargs):
  _check_device(kwargs)
  nums = [a for a in args if isinstance(a, (int, float))]
  start, step = 0, 1
  if len(nums) == 1: (end,) = nums
  elif len(nums) == 2: start, end = nums
  else: start, end, step = nums[:3]
  n = ctx.shape[0]
  dt = ctx.dtype
  if dt.is_float:
    # eager's CPU arange computes start + step * i in acc_type: double for float and double, float for half types
    acc = dtypes.float32 if dt in (dtypes.float16, dtypes.bfloat16) else dtypes.float64
    return (LT.iota(n).cast(acc) * step + start).cast(dt)
  return (LT.iota(n, dt) * step + start)


@register(prims.iota.default)
def iota(ctx, length, *, start, step, dtype, device, requires_grad):
  return LT.iota(ctx.shape[0], ctx.dtype) * step + start
