"""Lowerings of nodes that read or produce complex tensors.

The IR has no complex dtype: a complex tensor of shape S is held as its view_as_real, a real LT of
shape (*S, 2) whose last dim is (real, imag); graph inputs are bound through torch.view_as_real and
complex outputs handed out through torch.view_as_complex (both free views). graph.py sends every
node that touches a complex tensor here (registry.COMPLEX_LOWERINGS) instead of to the real
lowerings, so a real lowering never mistakes the trailing (real, imag) dim for a data dim.

A lowering registered with `@register_complex` receives a `CT` for each complex tensor argument and
an LT for each real one, and returns CTs and/or LTs. Movement ops and other ops that treat the real
and imaginary parts independently reuse the real lowering on each part (`_per_part`). Conjugate and
negative views (lazy bits in eager) mean their values here: `_conj` conjugates.
"""
from __future__ import annotations
import math
import weakref
import torch
from torch_uop.core.dtypes import DType, dtypes
from torch_uop.torch_dtypes import from_torch, complex_part
from torch_uop.lowering.registry import COMPLEX_LOWERINGS, LOWERINGS, LoweringContext, Unsupported, register, on_graph_device
from torch_uop.lowering.tensor import LT, compute_dtype

aten, prims = torch.ops.aten, torch.ops.prims

# stacked LT's uop -> (re, im) it was built from, so reading a part back does not go through the stacking
_PARTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class CT:
  """A complex tensor: `lt` is its view_as_real, a real LT with a trailing dim of 2."""
  __slots__ = ("lt",)

  def __init__(self, lt: LT):
    assert lt.ndim >= 1 and lt.shape[-1] == 2, f"not a complex representation: {lt}"
    self.lt = lt

  @property
  def shape(self) -> tuple: return self.lt.shape[:-1]
  @property
  def ndim(self) -> int: return self.lt.ndim - 1
  @property
  def part_dtype(self) -> DType: return self.lt.dtype
  def __repr__(self): return f"CT({self.shape}, {self.part_dtype})"

  def _part(self, i: int) -> LT:
    if (parts := _PARTS.get(self.lt.uop)) is not None: return parts[i]
    return self.lt.slice(-1, i, i + 1).reshape(self.shape)

  @property
  def re(self) -> LT: return self._part(0)
  @property
  def im(self) -> LT: return self._part(1)

  @staticmethod
  def from_parts(re: LT, im: LT, part_dtype: DType | None = None) -> CT:
    """Stack real and imaginary parts (broadcast together) into one complex tensor."""
    dt = part_dtype or re.dtype
    shape = tuple(torch.broadcast_shapes(re.shape, im.shape))
    re, im = re.cast(dt).broadcast_to(shape), im.cast(dt).broadcast_to(shape)
    # a select, not pad-and-add: the sign of a zero part must survive
    is_re = LT.iota(2).reshape((1,) * len(shape) + (2,)).eq(0)
    lt = is_re.where(re.unsqueeze(-1), im.unsqueeze(-1))
    _PARTS[lt.uop] = (re, im)
    return CT(lt)

  def cast(self, part_dtype: DType) -> CT:
    if part_dtype == self.part_dtype: return self
    return CT.from_parts(self.re.cast(part_dtype), self.im.cast(part_dtype))

  def conj(self) -> CT: return CT.from_parts(self.re, -self.im)


def _is_complex_val(v) -> bool: return isinstance(v, torch.Tensor) and v.is_complex()


def _wrap(x, src):
  """Replace the LT of each complex tensor argument by a CT (src: the same argument as FX nodes)."""
  if isinstance(x, LT):
    return CT(x) if isinstance(src, torch.fx.Node) and _is_complex_val(src.meta.get("val")) else x
  if isinstance(x, (list, tuple)):
    return type(x)(_wrap(a, b) for a, b in zip(x, src if isinstance(src, (list, tuple)) else [None] * len(x)))
  return x


def _unwrap(x):
  if isinstance(x, CT): return x.lt
  if isinstance(x, (list, tuple)): return type(x)(_unwrap(a) for a in x)
  return x


def register_complex(*ops):
  """Register a lowering for nodes touching complex tensors: it gets CTs for complex arguments."""
  def deco(fn):
    def lower(ctx, *args, **kwargs):
      args = _wrap(args, ctx.node.args)
      kwargs = {k: _wrap(v, ctx.node.kwargs.get(k)) for k, v in kwargs.items()}
      return _unwrap(fn(ctx, *args, **kwargs))
    for op in ops:
      if isinstance(op, torch._ops.OpOverloadPacket):
        for name in op.overloads(): COMPLEX_LOWERINGS[getattr(op, name)] = lower
      else: COMPLEX_LOWERINGS[op] = lower
    return fn
  return deco


def check_eager_has_chalf(ctx) -> None:
  """Eager's CPU kernels of some ops (div, reciprocal, angle, polar, sum) lack complex32: let it raise."""
  vals = [n.meta.get("val") for n in ctx.node.all_input_nodes] + list(ctx.vals)
  if any(isinstance(v, torch.Tensor) and v.dtype == torch.complex32 for v in vals) or \
     (ctx.node.target is aten.polar.default and ctx.val.dtype == torch.complex32):
    raise Unsupported("complex32 is an error in eager for this op")


def part_dtype_of(val: torch.Tensor) -> DType:
  """IR dtype of each part of a complex meta value (or the dtype of a real one)."""
  return from_torch(complex_part(val.dtype) or val.dtype)


# ---------------- ops that act on the real and imaginary parts independently

class _PartContext(LoweringContext):
  """The context a real lowering sees when it runs on one part: the node's values as real tensors."""

  def __init__(self, node, val, graph):
    self.node = node
    self.val = val
    self.graph = graph


def _real_meta(v):
  if isinstance(v, (list, tuple)): return type(v)(_real_meta(a) for a in v)
  if not _is_complex_val(v): return v
  return torch.empty_strided(tuple(v.shape), tuple(v.stride()), dtype=complex_part(v.dtype), device="meta")


def _per_part(data_positions=(0,)):
  """A lowering that runs the op's real lowering once on the real parts and once on the imaginary
  parts. Arguments at `data_positions` are the op's values (a real tensor or number there is promoted
  to complex, imaginary part 0); other arguments (dims, indices, conditions) go to both runs unchanged."""
  def lower(ctx, *args, **kwargs):
    real_fn = LOWERINGS.get(ctx.node.target)
    if real_fn is None: raise Unsupported(f"no real lowering of {ctx.node.target} to apply per part")
    if any(isinstance(v, (CT, complex, float)) for v in kwargs.values()): raise Unsupported("a value as keyword argument")

    def part(x, i, is_data):
      if isinstance(x, CT):
        if not is_data: raise Unsupported("complex tensor in a non-data position")
        return x.re if i == 0 else x.im
      if isinstance(x, (list, tuple)) and is_data: return type(x)(part(a, i, True) for a in x)
      if not is_data: return x
      if isinstance(x, LT): return x if i == 0 else x.const_like(0)
      if isinstance(x, (bool, int, float, complex)): return x.real if i == 0 else x.imag
      return x

    pctx = _PartContext(ctx.node, _real_meta(ctx.val), ctx.graph)
    outs = [real_fn(pctx, *[part(a, i, k in data_positions) for k, a in enumerate(args)], **kwargs) for i in (0, 1)]
    vals = ctx.val if isinstance(ctx.val, (list, tuple)) else None

    def stack(re, im, val):
      if val is None or not _is_complex_val(val): return re  # a real result (e.g. an index)
      return CT.from_parts(re, im, part_dtype_of(val))
    if vals is None: return stack(outs[0], outs[1], ctx.val)
    return type(outs[0])(stack(r, i, v) for r, i, v in zip(outs[0], outs[1], vals))
  return lower


_SAME_PER_PART = [
  aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.view_copy.default, aten.permute.default,
  aten.t.default, aten.transpose.int, aten.expand.default, aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default,
  aten.unsqueeze.default, aten.slice.Tensor, aten.select.int, aten.flip.default, aten.split_with_sizes.default,
  aten.split.Tensor, aten.unbind.int, aten.unfold.default, aten.index.Tensor, aten.index_select.default,
  aten.repeat.default, aten.diagonal.default, aten.diagonal_copy.default,
]
for _op in _SAME_PER_PART: register_complex(_op)(_per_part())


@register_complex(aten.sum.dim_IntList, aten.sum.default)
def sum_(ctx, *args, **kwargs):
  check_eager_has_chalf(ctx)
  return _per_part()(ctx, *args, **kwargs)


register_complex(aten.cat.default)(_per_part((0,)))
register_complex(aten.constant_pad_nd.default)(_per_part((0, 2)))  # the pad value: its real part pads re, its imag part im
register_complex(aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther)(_per_part((1, 2)))
register_complex(aten.slice_scatter.default, aten.select_scatter.default, aten.diagonal_scatter.default,
                 aten.copy.default)(_per_part((0, 1)))


@register_complex(aten.clone.default, aten.alias.default, aten.lift_fresh_copy.default, aten.resolve_conj.default,
                  aten.resolve_neg.default)
def same_values(ctx, x, *args, **kwargs):
  if not (isinstance(x, CT) and ctx.val.is_complex() and part_dtype_of(ctx.val) == x.part_dtype): raise Unsupported("dtype change")
  return x


@register(aten._conj.default, aten.conj.default, aten.conj_physical.default, aten._conj_physical.default,
          aten.resolve_conj.default, aten.resolve_neg.default)
def conj_of_real(ctx, x):
  """Conjugating a real tensor (or resolving its lazy bits) leaves its values as they are."""
  return x


# ---------------- creation

_ZEROS = (aten.zeros.default, aten.zeros_like.default, aten.new_zeros.default, aten.empty.memory_format,
          aten.empty_like.default, aten.new_empty.default, aten.empty_strided.default, aten.new_empty_strided.default,
          aten.empty_permuted.default)
_ONES = (aten.ones.default, aten.ones_like.default, aten.new_ones.default)


@register_complex(aten.full.default, aten.full_like.default, aten.new_full.default, aten.scalar_tensor.default,
                  aten.fill.Scalar, *_ZEROS, *_ONES)
def full(ctx, *args, **kwargs):
  if not on_graph_device(kwargs.get("device")): raise Unsupported("tensor on another device")
  if not ctx.val.is_complex(): raise Unsupported("a real tensor shaped after a complex one")
  target = ctx.node.target
  value = 0 if target in _ZEROS else 1 if target in _ONES else args[0] if target is aten.scalar_tensor.default else args[-1]
  if isinstance(value, (LT, CT)): raise Unsupported("fill value is a tensor")
  v, dt, shape = complex(value), part_dtype_of(ctx.val), tuple(ctx.val.shape)
  return CT.from_parts(LT.full(shape, v.real, dt), LT.full(shape, v.imag, dt))


# ---------------- conversions

@register_complex(prims.convert_element_type.default)
def convert_element_type(ctx, x, dtype): return _convert(ctx, x)


@register_complex(aten._to_copy.default)
def to_copy(ctx, x, *args, **kwargs):
  if not on_graph_device(kwargs.get("device")): raise Unsupported("copy to another device")
  return _convert(ctx, x)


def _convert(ctx, x):
  """Any dtype to any dtype where one side is complex: real -> complex gets imaginary part 0,
  complex -> real keeps the real part (bool: nonzero in either part), as eager does."""
  out = ctx.val
  if out.is_complex():
    dt = part_dtype_of(out)
    if isinstance(x, CT): return x.cast(dt)
    return CT.from_parts(x.cast(dt), x.const_like(0, dt), dt)
  dt = from_torch(out.dtype)
  if dt.is_bool: return x.re.ne(0) | x.im.ne(0)
  return x.re.cast(dt)


@register_complex(aten.view_as_real.default)
def view_as_real(ctx, x: CT): return x.lt


@register_complex(aten.view_as_complex.default)
def view_as_complex(ctx, x: LT):
  if x.ndim == 0 or x.shape[-1] != 2: raise Unsupported("view_as_complex needs a trailing dim of 2")
  return CT(x)


@register_complex(aten.real.default)
def real(ctx, x: CT): return x.re


@register_complex(aten.imag.default)
def imag(ctx, x: CT): return x.im


@register_complex(aten.complex.default)
def complex_(ctx, re: LT, im: LT): return CT.from_parts(re, im, part_dtype_of(ctx.val))


@register_complex(aten.polar.default)
def polar(ctx, r: LT, theta: LT):
  check_eager_has_chalf(ctx)
  dt = part_dtype_of(ctx.val)
  r, theta = r.cast(compute_dtype(dt)), theta.cast(compute_dtype(dt))
  return CT.from_parts(r * theta.math("cos"), r * theta.math("sin"), dt)


# ---------------- conjugation and negation (lazy views in eager; their values here)

@register_complex(aten._conj.default, aten.conj.default, aten.conj_physical.default, aten._conj_physical.default)
def conj(ctx, x): return x.conj() if isinstance(x, CT) else x


@register_complex(aten._neg_view.default, aten.neg.default)
def neg(ctx, x: CT): return CT.from_parts(-x.re, -x.im)


@register(aten._neg_view.default)
def neg_view_of_real(ctx, x):
  """The lazily negated view eager gives for the imaginary part of a conjugated tensor: its values."""
  return -x


# ---------------- elementwise arithmetic

def _parts(x, dt: DType, shape: tuple) -> tuple[LT, LT]:
  """(re, im) of an operand (CT, real LT or Python number) in dtype dt, broadcast to shape."""
  if isinstance(x, CT): re, im = x.re.cast(dt), x.im.cast(dt)
  elif isinstance(x, LT): re = x.cast(dt); im = re.const_like(0)
  else:
    v = complex(x)
    return LT.full(shape, v.real, dt), LT.full(shape, v.imag, dt)
  return re.broadcast_to(shape), im.broadcast_to(shape)


def _compute(ctx) -> tuple[DType, DType, tuple]:
  """(compute dtype, result part dtype, shape) of a complex-valued elementwise node."""
  if not ctx.val.is_complex(): raise Unsupported("expected a complex result")
  dt = part_dtype_of(ctx.val)
  return compute_dtype(dt), dt, tuple(ctx.val.shape)


def _mul(a, b): return a[0] * b[0] - a[1] * b[1], a[0] * b[1] + a[1] * b[0]


def _div(a, b):
  """(a + bi) / (c + di) with the scaling of c10::complex (numpy's method): no overflow in c*c + d*d."""
  (ar, ai), (c, d) = a, b
  c_big = c.math("abs") >= d.math("abs")
  rat_c, rat_d = d / c, c / d
  scl_c, scl_d = (c + d * rat_c).recip(), (d + c * rat_d).recip()
  re = c_big.where((ar + ai * rat_c) * scl_c, (ar * rat_d + ai) * scl_d)
  im = c_big.where((ai - ar * rat_c) * scl_c, (ai * rat_d - ar) * scl_d)
  # 0 / 0: complex inf or nan, part by part
  zero = c.eq(0) & d.eq(0)
  return zero.where(ar / c.math("abs"), re), zero.where(ai / d.math("abs"), im)


@register_complex(aten.add.Tensor, aten.add.Scalar, aten.sub.Tensor, aten.sub.Scalar, aten.rsub.Tensor, aten.rsub.Scalar)
def add_sub(ctx, a, b, alpha=1):
  comp, dt, shape = _compute(ctx)
  if ctx.node.target in (aten.rsub.Tensor, aten.rsub.Scalar): a, b = b, a
  x, y = _parts(a, comp, shape), _parts(b, comp, shape)
  if alpha != 1: y = _mul(y, _parts(alpha, comp, shape))
  sub = ctx.node.target not in (aten.add.Tensor, aten.add.Scalar)
  return CT.from_parts(x[0] - y[0] if sub else x[0] + y[0], x[1] - y[1] if sub else x[1] + y[1], dt)


@register_complex(aten.mul.Tensor, aten.mul.Scalar)
def mul(ctx, a, b):
  comp, dt, shape = _compute(ctx)
  if not (isinstance(a, CT) and isinstance(b, CT)):  # complex times real: scale both parts
    z, s = (a, b) if isinstance(a, CT) else (b, a)
    s = s.cast(comp).broadcast_to(shape) if isinstance(s, LT) else s
    if isinstance(s, complex): return CT.from_parts(*_mul(_parts(z, comp, shape), _parts(s, comp, shape)), dt)
    re, im = _parts(z, comp, shape)
    return CT.from_parts(re * s, im * s, dt)
  return CT.from_parts(*_mul(_parts(a, comp, shape), _parts(b, comp, shape)), dt)


@register_complex(aten.div.Tensor, aten.div.Scalar)
def div(ctx, a, b):
  check_eager_has_chalf(ctx)
  comp, dt, shape = _compute(ctx)
  if not isinstance(b, CT) and not isinstance(b, complex):  # by a real divisor: divide both parts
    re, im = _parts(a, comp, shape)
    s = b.cast(comp).broadcast_to(shape) if isinstance(b, LT) else b
    return CT.from_parts(re / s, im / s, dt)
  return CT.from_parts(*_div(_parts(a, comp, shape), _parts(b, comp, shape)), dt)


@register_complex(aten.reciprocal.default)
def reciprocal(ctx, x: CT):
  check_eager_has_chalf(ctx)
  comp, dt, shape = _compute(ctx)
  return CT.from_parts(*_div(_parts(1.0, comp, shape), _parts(x, comp, shape)), dt)


@register_complex(aten.sgn.default)
def sgn(ctx, x: CT):
  """z / |z|, and 0 for 0."""
  comp, dt, shape = _compute(ctx)
  re, im = _parts(x, comp, shape)
  r = re.math("hypot", im)
  zero = r.eq(0)
  return CT.from_parts(zero.where(0.0, re / r), zero.where(0.0, im / r), dt)


@register_complex(aten.abs.default)
def abs_(ctx, x: CT):
  dt = from_torch(ctx.val.dtype)
  comp = compute_dtype(dt)
  return x.re.cast(comp).math("hypot", x.im.cast(comp)).cast(dt)


@register_complex(aten.angle.default)
def angle(ctx, x: CT):
  check_eager_has_chalf(ctx)
  dt = from_torch(ctx.val.dtype)
  comp = compute_dtype(dt)
  return x.im.cast(comp).math("atan2", x.re.cast(comp)).cast(dt)
