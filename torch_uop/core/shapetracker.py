"""Views: movement ops as index maps, so reshape/permute/expand/pad/shrink/flip never copy.

A `View` maps an n-d index to a flat offset: `offset + sum(idx * stride)`, valid only inside `mask`
(outside the mask the value is the pad value, 0). A `ShapeTracker` is a stack of views: when a
reshape cannot be expressed by new strides, a new view is pushed on top and indices are unflattened
through the one below. `to_indexed(idxs)` turns index UOps into (flat index UOp, valid UOp).
Views never look at data. Sizes, strides and offsets are ints, or core.sym.Syms in a graph with symbolic sizes.
"""
from __future__ import annotations
from dataclasses import dataclass
import functools
import math
from torch_uop.core.uop import UOp
from torch_uop.core.dtypes import dtypes
from torch_uop.core.sym import known_equal


def contiguous_strides(shape: tuple) -> tuple:
  strides, acc = [], 1
  for s in reversed(shape):
    strides.append(acc if s != 1 else 0)
    acc *= s
  return tuple(reversed(strides))


def prod(xs) -> int: return math.prod(xs)


@dataclass(frozen=True)
class View:
  shape: tuple
  strides: tuple
  offset: int = 0
  mask: tuple | None = None  # ((lo, hi), ...) per dim

  @staticmethod
  @functools.cache
  def contiguous(shape: tuple) -> View: return View(tuple(shape), contiguous_strides(tuple(shape)))

  @property
  def is_contiguous(self) -> bool:
    return known_equal(self.offset, 0) and self.mask is None and known_equal(self.strides, contiguous_strides(self.shape))

  def valid_bounds(self):  # the mask, or every position's bounds where there is none
    return self.mask if self.mask is not None else tuple((0, s) for s in self.shape)

  def _with_mask(self, mask) -> tuple | None:
    if mask is None: return None
    if all(lo == 0 and hi == s for (lo, hi), s in zip(mask, self.shape)): return None
    return tuple(mask)

  def permute(self, order: tuple) -> View:
    return View(tuple(self.shape[i] for i in order), tuple(self.strides[i] for i in order), self.offset,
                None if self.mask is None else tuple(self.mask[i] for i in order))

  def expand(self, shape: tuple) -> View:
    strides, mask = [], []
    for s_old, s_new, st, m in zip(self.shape, shape, self.strides, self.valid_bounds()):
      if s_old == s_new: strides.append(st); mask.append(m)
      else:
        assert s_old == 1, f"cannot expand {self.shape} to {shape}"
        strides.append(0); mask.append((0, s_new) if m == (0, 1) else (0, 0))
    v = View(tuple(shape), tuple(strides), self.offset)
    return View(v.shape, v.strides, v.offset, v._with_mask(mask) if self.mask is not None else None)

  def shrink(self, bounds: tuple) -> View:
    offset = self.offset + sum(lo * st for (lo, _), st in zip(bounds, self.strides))
    shape = tuple(hi - lo for lo, hi in bounds)
    mask = None
    if self.mask is not None:
      mask = tuple((max(0, mlo - lo), max(0, min(hi, mhi) - lo)) for (lo, hi), (mlo, mhi) in zip(bounds, self.mask))
      mask = tuple((min(a, b), b) for a, b in mask)
    v = View(shape, self.strides, offset)
    return View(shape, self.strides, offset, v._with_mask(mask))

  def pad(self, pads: tuple) -> View:
    """pads: ((before, after), ...) with non-negative entries."""
    shape = tuple(s + b + a for s, (b, a) in zip(self.shape, pads))
    offset = self.offset - sum(b * st for (b, _), st in zip(pads, self.strides))
    mask = tuple((mlo + b, mhi + b) for (mlo, mhi), (b, _) in zip(self.valid_bounds(), pads))
    v = View(shape, self.strides, offset)
    return View(shape, self.strides, offset, v._with_mask(mask))

  def flip(self, dims: tuple) -> View:
    strides, offset, mask = list(self.strides), self.offset, list(self.valid_bounds())
    for d in dims:
      offset += (self.shape[d] - 1) * strides[d]
      strides[d] = -strides[d]
      lo, hi = mask[d]
      mask[d] = (self.shape[d] - hi, self.shape[d] - lo)
    v = View(self.shape, tuple(strides), offset)
    return View(self.shape, tuple(strides), offset, v._with_mask(mask) if self.mask is not None else None)

  def stride_step(self, steps: tuple) -> View:
    """Keep every step-th element along each dim (step >= 1)."""
    shape = tuple((s + k - 1) // k for s, k in zip(self.shape, steps))
    strides = tuple(st * k for st, k in zip(self.strides, steps))
    mask = None
    if self.mask is not None:
      mask = tuple(((lo + k - 1) // k, max((lo + k - 1) // k, (hi + k - 1) // k)) for (lo, hi), k in zip(self.mask, steps))
    v = View(shape, strides, self.offset)
    return View(shape, strides, self.offset, v._with_mask(mask))

  def reshape(self, shape: tuple) -> View | None:
    """The same elements with a new shape, or None if that needs a second view."""
    if known_equal(self.shape, shape): return self
    if self.is_contiguous: return View.contiguous(shape)
    if prod(shape) == 0: return View.contiguous(shape)
    # drop size-1 dims (their stride is irrelevant), then merge groups as torch's computeStride does
    if self.mask is not None:
      if [s for s in self.shape if s != 1] == [s for s in shape if s != 1]:
        it = iter([(st, m) for s, st, m in zip(self.shape, self.strides, self.mask) if s != 1])
        strides, mask = [], []
        for s in shape:
          if s == 1: strides.append(0); mask.append((0, 1))
          else:
            st, m = next(it); strides.append(st); mask.append(m)
        # a size-1 dim that was fully masked out must stay masked out
        if any(s == 1 and m != (0, 1) for s, m in zip(self.shape, self.mask)): return None
        return View(shape, tuple(strides), self.offset, tuple(mask))
      return None
    old = [(s, st) for s, st in zip(self.shape, self.strides) if s != 1]
    oi = 0
    ni = 0
    shape_nz = [s for s in shape]
    result = [0] * len(shape)
    while ni < len(shape_nz):
      if shape_nz[ni] == 1: result[ni] = 0; ni += 1; continue
      # take a group of old dims and a group of new dims with the same element count
      if oi >= len(old): return None
      group_old, group_new = [old[oi]], [ni]
      n_old, n_new = old[oi][0], shape_nz[ni]
      oi += 1; ni += 1
      while n_old != n_new:
        if n_old < n_new:
          if oi >= len(old): return None
          group_old.append(old[oi]); n_old *= old[oi][0]; oi += 1
        else:
          while ni < len(shape_nz) and shape_nz[ni] == 1: result[ni] = 0; ni += 1
          if ni >= len(shape_nz): return None
          group_new.append(ni); n_new *= shape_nz[ni]; ni += 1
      # the old group must be mergeable: stride[i] == stride[i+1] * size[i+1]
      for (s0, st0), (s1, st1) in zip(group_old, group_old[1:]):
        if st0 != st1 * s1: return None
      base = group_old[-1][1]
      acc = base
      for j in reversed(group_new):
        if shape[j] == 1: result[j] = 0; continue
        result[j] = acc; acc *= shape[j]
    return View(shape, tuple(result), self.offset)

  def to_indexed(self, idxs: list[UOp]) -> tuple[UOp, UOp]:
    flat = UOp.const(dtypes.index, self.offset)
    for i, s, st in zip(idxs, self.shape, self.strides):
      if st != 0 and s != 1: flat = flat + i * UOp.const(dtypes.index, st)
    valid = UOp.const(dtypes.bool, True)
    if self.mask is not None:
      for i, s, (lo, hi) in zip(idxs, self.shape, self.mask):
        if lo != 0: valid = valid & (UOp.const(dtypes.index, lo) <= i)
        if hi != s: valid = valid & (i < UOp.const(dtypes.index, hi))
    return flat, valid


def unflatten(flat: UOp, shape: tuple) -> list[UOp]:
  """Per-dim indices of a flat contiguous index."""
  idxs = []
  for s, st in zip(shape, contiguous_strides(shape)):
    if s == 1: idxs.append(UOp.const(dtypes.index, 0)); continue
    i = flat // UOp.const(dtypes.index, st) if st != 1 else flat
    idxs.append(i % UOp.const(dtypes.index, s))
  return idxs


@dataclass(frozen=True)
class ShapeTracker:
  views: tuple

  @staticmethod
  def from_shape(shape: tuple) -> ShapeTracker: return ShapeTracker((View.contiguous(tuple(shape)),))

  @staticmethod
  def from_strides(shape: tuple, strides: tuple, offset: int = 0) -> ShapeTracker:
    return ShapeTracker((View(tuple(shape), tuple(strides), offset),))

  @property
  def shape(self) -> tuple: return self.views[-1].shape
  @property
  def is_contiguous(self) -> bool: return len(self.views) == 1 and self.views[0].is_contiguous

  def _top(self, v: View) -> ShapeTracker: return ShapeTracker(self.views[:-1] + (v,))

  def permute(self, order): return self._top(self.views[-1].permute(tuple(order)))
  def expand(self, shape): return self._top(self.views[-1].expand(tuple(shape)))
  def shrink(self, bounds): return self._top(self.views[-1].shrink(tuple(bounds)))
  def pad(self, pads): return self._top(self.views[-1].pad(tuple(pads)))
  def flip(self, dims): return self._top(self.views[-1].flip(tuple(dims)))
  def stride_step(self, steps): return self._top(self.views[-1].stride_step(tuple(steps)))

  def reshape(self, shape) -> ShapeTracker:
    shape = tuple(shape)
    if (v := self.views[-1].reshape(shape)) is not None: return self._top(v)
    return ShapeTracker(self.views + (View.contiguous(shape),))

  def as_strided(self, shape, strides, offset=0) -> ShapeTracker:
    """A raw strided window over this tracker's contiguous element order."""
    base = self if self.is_contiguous else None
    new = View(tuple(shape), tuple(strides), offset)
    if base is not None: return ShapeTracker((new,))
    return ShapeTracker(self.views + (new,))

  def __add__(self, other: ShapeTracker) -> ShapeTracker:
    """Compose: `other` applied on top of this tracker's output."""
    out = self
    for v in other.views:
      if v.is_contiguous and known_equal(v.shape, out.shape): continue
      if len(other.views) == 1 and v.mask is None and out.is_contiguous: return ShapeTracker((v,))
      out = ShapeTracker(out.views + (v,))
    return out

  def to_indexed(self, idxs: list[UOp]) -> tuple[UOp, UOp]:
    flat, valid = self.views[-1].to_indexed(idxs)
    for v in reversed(self.views[:-1]):
      f2, v2 = v.to_indexed(unflatten(flat, v.shape))
      flat, valid = f2, valid & v2
    return flat, valid
