"""Movement lowerings: view/reshape, permute, expand, slice, select, squeeze/unsqueeze, cat,
constant_pad_nd, flip, as_strided, and the scatters of their backwards (slice_scatter,
select_scatter). All of them are index maps (VIEW nodes); none copies data. The functional `*_copy` forms of the
views (what a functionalized trace such as torch_uop.debug.compile_graph's holds) lower the same way: the copy is the
kernel that reads through the view.
"""
from __future__ import annotations
import math
import torch
from torch_uop.core.dtypes import dtypes
from torch_uop.lowering.registry import register, Unsupported
from torch_uop.core.uop import Ops
from torch_uop.lowering.tensor import LT, compute_dtype
from torch_uop.core.sym import hint, is_sym
from torch_uop.lowering.tensor import broadcast_shapes

aten = torch.ops.aten


@register(aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.view_copy.default)
def view(ctx, x, shape): return x.reshape(ctx.shape)


@register(aten.permute.default, aten.permute_copy.default)
def permute(ctx, x, dims): return x.permute(dims)


@register(aten.t.default, aten.t_copy.default)
def t(ctx, x): return x.permute((1, 0)) if x.ndim == 2 else x


@register(aten.transpose.int, aten.transpose_copy.int)
def transpose(ctx, x, a, b): return x.transpose(a % x.ndim, b % x.ndim) if x.ndim else x


@register(aten.expand.default, aten.expand_copy.default)
def expand(ctx, x, shape, implicit=False): return x.broadcast_to(ctx.shape)


@register(aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default, aten.unsqueeze.default, aten.squeeze_copy.dim,
          aten.squeeze_copy.dims, aten.squeeze_copy.default, aten.unsqueeze_copy.default)
def squeeze(ctx, x, *dims): return x.reshape(ctx.shape)


@register(aten.slice.Tensor, aten.slice_copy.Tensor)
def slice_(ctx, x, dim=0, start=None, end=None, step=1):
  dim %= x.ndim
  size = x.shape[dim]
  start, end = _clamp_range(start, end, size)
  return x.slice(dim, start, end, step)


def _clamp_range(start, end, size):
  start = 0 if start is None else start
  end = size if end is None else end
  if start < 0: start += size
  if end < 0: end += size
  start = min(max(start, 0), size)
  end = min(max(end, start), size)
  return start, end


@register(aten.select.int, aten.select_copy.int)
def select(ctx, x, dim, index):
  dim %= x.ndim
  if index < 0: index += x.shape[dim]
  return x.slice(dim, index, index + 1).squeeze_dims((dim,))


@register(aten.cat.default)
def cat(ctx, tensors, dim=0):
  tensors = [t for t in tensors if not (t.ndim == 1 and t.shape[0] == 0)]  # legacy: empty 1-d tensors are skipped
  if not tensors: return LT.full(ctx.shape, 0, ctx.dtype)
  return concat([t.cast(ctx.dtype) for t in tensors], dim)


# A kernel that reads a concat evaluates one select and one gated load per part at every element (it cannot tell
# which part an element lies in before it runs), so its work grows with the number of parts: attention's output over
# 12 blocks of query rows (Whisper's 1500 frames) took 2.7 ms for 2.3 MB, 64 blocks 240 ms. A concat of more than
# CONCAT_MAX_PARTS parts whose output has at least CONCAT_TREE_MIN_ELEMENTS is built as a tree instead: the parts
# joined in groups of CONCAT_MAX_PARTS, each group written out, then the groups joined the same way, a few passes
# over the data instead of a select chain as long as the parts list.
CONCAT_MAX_PARTS = 4
CONCAT_TREE_MIN_ELEMENTS = 1 << 16


def joined_in_groups(parts: list, group: int, join) -> list:
  """`parts` joined `group` at a time by `join` (a list of LTs -> LT), each group's result written out, then those
  results the same way, until at most `group` are left; a group of one is left as it is. The caller joins what is
  left: a tree whose every kernel reads at most `group` parts."""
  while len(parts) > group:
    groups = [parts[i:i + group] for i in range(0, len(parts), group)]
    parts = [join(g).contiguous() if len(g) > 1 else g[0] for g in groups]
  return parts


def concat(parts: list, dim: int) -> LT:
  """The tensors joined along `dim` (same dtype, same other sizes): each padded into place and selected where it lies.
  The selects nest with the first part outermost, so a graph walk reaches the parts in order (the scheduler keeps
  the graph's depth-first order: a blocked computation's blocks run first to last). Many parts: a tree of concats
  (CONCAT_MAX_PARTS)."""
  if len(parts) == 1: return parts[0]
  dim %= parts[0].ndim
  if len(parts) > CONCAT_MAX_PARTS and math.prod(hint(x) for x in parts[0].shape) * len(parts) >= CONCAT_TREE_MIN_ELEMENTS:
    parts = joined_in_groups(parts, CONCAT_MAX_PARTS, lambda g: concat(g, dim))
  total = sum(t.shape[dim] for t in parts)
  offsets = [0]
  for t in parts[:-1]: offsets.append(offsets[-1] + t.shape[dim])
  out = None
  for t, offset in zip(reversed(parts), reversed(offsets)):
    pads = [(0, 0)] * t.ndim
    pads[dim] = (offset, total - offset - t.shape[dim])
    piece = t.pad(pads)
    out = piece if out is None else LT.full(t.shape, True, dtypes.bool).pad(pads).where(piece, out)
  return out


@register(aten.constant_pad_nd.default)
def constant_pad_nd(ctx, x, pad, value=0):
  pads = [(0, 0)] * x.ndim
  for i in range(len(pad) // 2):
    pads[x.ndim - 1 - i] = (pad[2 * i], pad[2 * i + 1])
  return x.pad(pads, value)


@register(aten.flip.default)
def flip(ctx, x, dims): return x.flip(dims)


@register(aten.split_with_sizes.default)
def split_with_sizes(ctx, x, sizes, dim=0):
  dim %= x.ndim
  out, offset = [], 0
  for s in sizes:
    out.append(x.slice(dim, offset, offset + s))
    offset += s
  return out


@register(aten.split.Tensor)
def split(ctx, x, size, dim=0):
  dim %= x.ndim
  return [x.slice(dim, o, min(o + size, x.shape[dim])) for o in range(0, x.shape[dim], size)] or [x]


@register(aten.unbind.int)
def unbind(ctx, x, dim=0):
  dim %= x.ndim
  return [x.slice(dim, i, i + 1).squeeze_dims((dim,)) for i in range(x.shape[dim])]


@register(aten.slice_scatter.default)
def slice_scatter(ctx, x, src, dim=0, start=None, end=None, step=1):
  dim %= x.ndim
  start, end = _clamp_range(start, end, x.shape[dim])
  n = src.shape[dim]
  if n == 0: return x

  def place(t: LT) -> LT:
    """Put t's rows at start, start+step, ... along dim (zeros between and around them)."""
    if step != 1:
      t = t.unsqueeze(dim + 1)
      stuff = [(0, 0)] * t.ndim
      stuff[dim + 1] = (0, step - 1)
      t = t.pad(stuff).reshape(src.shape[:dim] + (n * step,) + src.shape[dim + 1:])
      t = t.slice(dim, 0, (n - 1) * step + 1)
    pads = [(0, 0)] * t.ndim
    pads[dim] = (start, x.shape[dim] - start - t.shape[dim])
    return t.pad(pads)

  inside = place(LT.full(src.shape, True, dtypes.bool))
  return inside.where(place(src.cast(x.dtype)), x)


@register(aten.select_scatter.default)
def select_scatter(ctx, x, src, dim, index):
  dim %= x.ndim
  if index < 0: index += x.shape[dim]
  src = src.unsqueeze(dim)
  pads = [(0, 0)] * x.ndim
  pads[dim] = (index, x.shape[dim] - index - 1)
  inside = LT.full(src.shape, True, dtypes.bool).pad(pads)
  return inside.where(src.cast(x.dtype).pad(pads), x)


def _eager_storage(x: LT, val: torch.Tensor) -> LT | None:
  """x's elements in the order eager stores them, from its eager layout (`val`): broadcast (stride 0) dims taken
  once, the others by decreasing stride. Only for a layout that covers its storage densely from its first element
  (an expanded or permuted intermediate, such as adaptive_avg_pool2d's backward expanding its gradient); else None."""
  if any(is_sym(n) for n in (*val.shape, *val.stride())): return None
  shape, strides = tuple(val.shape), tuple(val.stride())
  base = x.shrink(tuple((0, 1) if st == 0 else (0, n) for n, st in zip(shape, strides)))
  dims = sorted((d for d in range(len(shape)) if strides[d] != 0 and shape[d] != 1), key=lambda d: -strides[d])
  expected = 1
  for d in reversed(dims):
    if strides[d] != expected: return None
    expected *= shape[d]
  rest = [d for d in range(len(shape)) if d not in dims]
  return base.permute(tuple(rest + dims)).reshape((expected,))


@register(aten.as_strided.default)
def as_strided(ctx, x, size, stride, storage_offset=None):
  """A strided window over x's storage. Offsets are taken relative to x's first element (its data_ptr,
  where a graph input is bound); the storage must be that of a graph input or of a whole contiguous tensor."""
  val = ctx.node.args[0].meta.get("val")
  if not isinstance(val, torch.Tensor): raise Unsupported("as_strided without the input's layout")
  rel = 0 if storage_offset is None else storage_offset - val.storage_offset()
  if x.uop.op is Ops.VIEW and x.uop.src[0].op is Ops.BUFFER and not x.uop.src[0].src:  # a graph input
    storage = LT(x.uop.src[0])
    if storage_offset is not None:  # an absolute offset: right only for inputs at this storage offset
      if ctx.graph is None: raise Unsupported("as_strided with an offset needs a storage offset guard")
      ctx.graph.guard_storage_offset(x.uop.src[0].arg[0], val.storage_offset())
  elif x.uop.op is not Ops.VIEW or x.uop.arg.is_contiguous: storage = x.reshape((x.numel(),))
  elif (storage := _eager_storage(x, val)) is None:
    raise Unsupported("as_strided of a view inside the graph (its storage is not materialized)")
  last = rel + sum((n - 1) * st for n, st in zip(size, stride)) if all(size) else rel
  if rel < 0 or last >= max(storage.numel(), 1) or any(st < 0 for st in stride):
    raise Unsupported("as_strided outside the input's elements")
  return storage.as_strided(tuple(size), tuple(stride), rel)


@register(aten.copy.default)
def copy(ctx, x, src, non_blocking=False):
  return src.cast(ctx.dtype).broadcast_to(ctx.shape)


@register(aten.index_select.default)
def index_select(ctx, x, dim, index):
  if x.ndim == 0: return x.reshape(()) if index.numel() == 1 else x.broadcast_to(ctx.shape)
  dim %= x.ndim
  if dim == 1:  # eager's kernel for dim 1 has an error of its own
    ctx.check_index(index, x.shape[dim], dim, error="RuntimeError", message="INDICES element is out of DATA bounds, id={value} axis_dim={size}")
  else: ctx.check_index(index, x.shape[dim], dim, message="index out of range in self (index {value}, dimension {dim} of size {size})")
  shape = ctx.shape
  idx = index.reshape(tuple(-1 if d == dim else 1 for d in range(x.ndim))).broadcast_to(shape)
  return x.gather_nd(tuple(("idx", 0) if d == dim else d for d in range(x.ndim)), [idx])


@register(aten.gather.default)
def gather(ctx, x, dim, index, sparse_grad=False):
  if x.ndim == 0: return x.broadcast_to(ctx.shape)
  ctx.check_index(index, x.shape[dim % x.ndim], dim % x.ndim, error="RuntimeError")
  return x.gather(dim, index)


@register(aten.index.Tensor)
def index(ctx, x, indices):
  """Advanced indexing x[i0, i1, ...] with integer index tensors (None: the whole dim). The broadcast
  index dims replace the indexed dims in place when those are adjacent, else they lead."""
  indices = list(indices) + [None] * (x.ndim - len(indices))
  pos = [d for d, i in enumerate(indices) if i is not None]
  if not pos: return x
  if any(indices[d].dtype.is_bool for d in pos): raise Unsupported("boolean mask indexing (data-dependent shape)")
  bshape = broadcast_shapes(*[indices[d].shape for d in pos])
  adjacent = pos == list(range(pos[0], pos[-1] + 1))
  rest = [d for d in range(x.ndim) if indices[d] is None]
  if adjacent:
    before, after = [d for d in rest if d < pos[0]], [d for d in rest if d > pos[-1]]
  else:
    before, after = [], rest
  out_shape = tuple(x.shape[d] for d in before) + bshape + tuple(x.shape[d] for d in after)
  nb = len(bshape)
  lead = len(before)
  sources, idx_lts = [None] * x.ndim, []
  for k, d in enumerate(before): sources[d] = k
  for k, d in enumerate(after): sources[d] = lead + nb + k
  for d in pos:
    ctx.check_index(indices[d], x.shape[d], d, wraps=True)
    i = indices[d].broadcast_to(bshape).reshape((1,) * lead + bshape + (1,) * len(after)).broadcast_to(out_shape)
    sources[d] = ("idx", len(idx_lts))
    idx_lts.append(i)
  return x.gather_nd(tuple(sources), idx_lts)


def _sum_dtype(dt):
  """The dtype scatter-adds and accumulating index_puts sum in: float32 for floats narrower than it, else dt."""
  return dtypes.float32 if dt.is_float and dt.itemsize < 4 else dt


def _scatter_hits(x: LT, dim: int, index: LT) -> LT:
  """[*x.shape, m] bool: output position p receives the m-th index entry along dim
  (index[p with p[dim] := j] == p[dim], and p lies within index's extent in the other dims)."""
  m = index.shape[dim]
  # pad index out to x's extent in the other dims with an out-of-range value (matches nothing, even
  # after negative wrap-around), then move dim to a new last axis
  pads = [(0, 0) if d == dim else (0, x.shape[d] - index.shape[d]) for d in range(x.ndim)]
  idx = index.cast(dtypes.int64).pad(pads, -x.shape[dim] - 1)
  idx = idx.unsqueeze(x.ndim).transpose(dim, x.ndim)             # [.., 1 at dim, .., m]
  full = (*x.shape, m)
  pos = LT.iota_along(full, dim)
  wrapped = (idx < 0).where(idx + x.shape[dim], idx)
  return (idx >= -x.shape[dim]) & wrapped.broadcast_to(full).eq(pos)


@register(aten.scatter.value, aten.scatter.src, aten.scatter_add.default)
def scatter(ctx, x, dim, index, src):
  """Scatters as gathers: each output position looks for the index entries that name it."""
  if x.ndim == 0: raise Unsupported("scatter into a 0-d tensor")
  dim %= x.ndim
  ctx.check_index(index, x.shape[dim], dim, error="RuntimeError")
  hits = _scatter_hits(x, dim, index)
  m = index.shape[dim]
  full = hits.shape
  if not isinstance(src, LT):                                                            # scatter.value
    return hits.max((x.ndim,), keepdim=False).where(LT.full(x.shape, src, x.dtype), x)
  # src seen at [.., 1 at dim, .., m] like the index (only src[:index.shape] is read)
  src_v = src.shrink([(0, s) for s in index.shape]).cast(x.dtype)
  pads = [(0, 0) if d == dim else (0, x.shape[d] - index.shape[d]) for d in range(x.ndim)]
  src_v = src_v.pad(pads).unsqueeze(x.ndim).transpose(dim, x.ndim).broadcast_to(full)
  if ctx.node.target is aten.scatter_add.default:
    acc = _sum_dtype(x.dtype)
    added = hits.where(src_v.cast(acc), 0).sum((x.ndim,), keepdim=False)
    return (x.cast(acc) + added).cast(x.dtype)
  # several entries naming one position: eager keeps one of them; take the last
  j = LT.iota(m).reshape((1,) * x.ndim + (m,)).broadcast_to(full)
  last = hits.where(j, -1).max((x.ndim,), keepdim=True)                                   # [.., 1]
  picked = src_v.gather_nd(tuple(range(x.ndim)) + (("idx", 0),), [last.maximum(0)])       # src at that entry
  return (last >= 0).where(picked, x.unsqueeze(x.ndim)).reshape(x.shape)


@register(aten.repeat.default)
def repeat(ctx, x, repeats):
  x = x.reshape((1,) * (len(repeats) - x.ndim) + x.shape)
  tiled = []
  for r, s in zip(repeats, x.shape): tiled += [1, s]
  x = x.reshape(tuple(tiled))
  expanded = []
  for r, s in zip(repeats, x.shape[1::2]): expanded += [r, s]
  return x.expand(tuple(expanded)).reshape(ctx.shape)


@register(aten.unfold.default)
def unfold(ctx, x, dim, size, step):
  """Sliding windows along dim, as one strided view: [.., n_windows, .., size]."""
  if x.ndim == 0: return x.reshape((1,))
  dim %= x.ndim
  cstr = [1] * x.ndim
  for i in range(x.ndim - 2, -1, -1): cstr[i] = cstr[i + 1] * x.shape[i + 1]
  n = (x.shape[dim] - size) // step + 1
  shape = x.shape[:dim] + (n,) + x.shape[dim + 1:] + (size,)
  strides = tuple(cstr[:dim]) + (cstr[dim] * step,) + tuple(cstr[dim + 1:]) + (cstr[dim],)
  return x.as_strided(shape, strides)


@register(aten.index_put.default)
def index_put(ctx, x, indices, values, accumulate=False):
  return _index_put(ctx, x, indices, values, accumulate, check=True)


def _index_put(ctx, x, indices, values, accumulate: bool, check: bool):
  """x[indices] = values (or += with accumulate), written as a gather: each position of x looks for
  the index entries that name it. A single boolean mask with one value is a where. `check`: eager's error
  for an index outside [-n, n) (off where the caller checked its own range)."""
  indices = list(indices)
  if len(indices) == 1 and indices[0] is not None and indices[0].dtype.is_bool:
    mask = indices[0]
    if values.numel() != 1: raise Unsupported("boolean-mask index_put with several values (data-dependent)")
    m = mask.reshape(mask.shape + (1,) * (x.ndim - mask.ndim)).broadcast_to(x.shape)
    v = values.reshape(()).cast(x.dtype).broadcast_to(x.shape)
    return m.where(x + v if accumulate else v, x)
  if any(i is not None and i.dtype.is_bool for i in indices): raise Unsupported("boolean masks among several indices")
  indices += [None] * (x.ndim - len(indices))
  pos = [d for d, i in enumerate(indices) if i is not None]
  if not pos: raise Unsupported("index_put without indices")
  bshape = broadcast_shapes(*[indices[d].shape for d in pos])
  mcount = math.prod(bshape)
  rest = [d for d in range(x.ndim) if indices[d] is None]
  adjacent = pos == list(range(pos[0], pos[-1] + 1))
  before = [d for d in rest if d < pos[0]] if adjacent else []
  after = [d for d in rest if d not in before]
  sel_shape = tuple(x.shape[d] for d in before) + bshape + tuple(x.shape[d] for d in after)
  if accumulate and adjacent and not x.dtype.is_bool and _separable(indices, pos, bshape):
    return _index_add_by_dim(ctx, x, indices, pos, values.broadcast_to(sel_shape), len(before), check)
  full = (*x.shape, mcount)
  # values as [*x.shape with indexed dims 1, M]
  v = values.cast(x.dtype).broadcast_to(sel_shape)
  v = v.reshape(tuple(x.shape[d] for d in before) + (mcount,) + tuple(x.shape[d] for d in after))
  nb = len(before)
  v = v.permute(tuple(range(nb)) + tuple(range(nb + 1, v.ndim)) + (nb,))           # rest dims in order, then M
  v = v.reshape(tuple(1 if d in pos else x.shape[d] for d in range(x.ndim)) + (mcount,)).broadcast_to(full)
  hits = None
  for d in pos:
    n = x.shape[d]
    if check: ctx.check_index(indices[d], n, d, wraps=True)
    i = indices[d].cast(dtypes.int64).broadcast_to(bshape).reshape((1,) * x.ndim + (mcount,)).broadcast_to(full)
    i = (i < 0).where(i + n, i)
    p = LT.iota_along(full, d)
    h = i.eq(p)
    hits = h if hits is None else hits & h
  if accumulate:
    acc = _sum_dtype(x.dtype)
    if x.dtype.is_bool: return x | (hits & v).max((x.ndim,), keepdim=False)
    return (x.cast(acc) + hits.where(v.cast(acc), 0).sum((x.ndim,), keepdim=False)).cast(x.dtype)
  j = LT.iota(mcount).reshape((1,) * x.ndim + (mcount,)).broadcast_to(full)
  last = hits.where(j, -1).max((x.ndim,), keepdim=True)                                 # the last write wins
  picked = v.gather_nd(tuple(range(x.ndim)) + (("idx", 0),), [last.maximum(0)])
  return (last >= 0).where(picked, x.unsqueeze(x.ndim)).reshape(x.shape)


def _separable(indices: list, pos: list, bshape: tuple) -> bool:
  """Whether several index tensors select an outer product: index t varies only along axis t of their broadcast
  shape (a bilinear resize's row and column indices, [H, 1] and [W]), so a position hit by entry (m_1, .., m_k)
  is hit along each dim apart."""
  if len(pos) < 2 or len(bshape) != len(pos): return False
  for t, d in enumerate(pos):
    shape = (1,) * (len(bshape) - indices[d].ndim) + tuple(indices[d].shape)
    if any(s != 1 for a, s in enumerate(shape) if a != t): return False
  return True


def _index_add_by_dim(ctx, x: LT, indices: list, pos: list, values: LT, nb: int, check: bool) -> LT:
  """x[i_1, .., i_k] += values for separable indices (_separable) at adjacent dims pos, values [*x's dims before
  pos (nb of them), M_1, .., M_k, *x's dims after]: the sum over each entry axis M_t into x's dim pos[t], one dim
  at a time (a GEMM with the M_t x N_t one-hot matrix of index t), instead of over all M_1 * .. * M_k entries at
  every position of x (a bilinear resize's gradient from 128x128 to 16x16: two GEMMs of K = 128, not a sum over
  16384 entries at each of x's 256 positions per channel)."""
  from torch_uop.lowering.linalg import matmul   # (linalg imports this module)
  acc = _sum_dtype(x.dtype)
  v = values.cast(acc)
  for t, d in enumerate(pos):
    n, axis = x.shape[d], nb + t
    m = v.shape[axis]
    if check: ctx.check_index(indices[d], n, d, wraps=True)
    i = indices[d].cast(dtypes.int64).reshape((m, 1))
    i = (i < 0).where(i + n, i)
    one_hot = i.broadcast_to((m, n)).eq(LT.iota_along((m, n), 1)).cast(acc)          # [M_t, N_t]
    order = tuple(a for a in range(v.ndim) if a != axis) + (axis,)
    rows = v.permute(order)
    summed = matmul(rows.reshape((math.prod(rows.shape[:-1]), m)), one_hot)          # a GEMM over the entries
    back = tuple(order.index(a) for a in range(v.ndim))
    v = summed.reshape(rows.shape[:-1] + (n,)).permute(back)
  return (x.cast(acc) + v).cast(x.dtype)


@register(aten.diagonal.default, aten.diagonal_copy.default)
def diagonal(ctx, x, offset=0, dim1=0, dim2=1):
  """x's diagonal along (dim1, dim2), as a gather: out[.., k] = x[.., k + max(-offset, 0), k + max(offset, 0)]."""
  dim1, dim2 = dim1 % x.ndim, dim2 % x.ndim
  shape = ctx.shape
  n = shape[-1]
  if n == 0 or x.numel() == 0: return LT.full(shape, 0, x.dtype)
  k = LT.iota(n).reshape((1,) * (len(shape) - 1) + (n,)).broadcast_to(shape)
  rest = [d for d in range(x.ndim) if d not in (dim1, dim2)]
  sources = [None] * x.ndim
  for j, d in enumerate(rest): sources[d] = j
  sources[dim1], sources[dim2] = ("idx", 0), ("idx", 1)
  return x.gather_nd(tuple(sources), [k + max(-offset, 0), k + max(offset, 0)])


@register(aten.diagonal_scatter.default)
def diagonal_scatter(ctx, x, src, offset=0, dim1=0, dim2=1):
  """x with its diagonal along (dim1, dim2) replaced by src: each position of x on that diagonal reads
  src at its diagonal index."""
  dim1, dim2 = dim1 % x.ndim, dim2 % x.ndim
  n = src.shape[-1]
  if n == 0 or x.numel() == 0: return x
  shape = x.shape
  i, j = LT.iota_along(shape, dim1), LT.iota_along(shape, dim2)
  on = (j - i).eq(offset)
  k = (i - max(-offset, 0)).maximum(0).minimum(n - 1)
  rest = [d for d in range(x.ndim) if d not in (dim1, dim2)]
  picked = src.cast(x.dtype).gather_nd(tuple(rest) + (("idx", 0),), [k])
  return on.where(picked, x)


@register(aten.scatter_reduce.two, aten.scatter.reduce, aten.scatter.value_reduce)
def scatter_reduce(ctx, x, dim, index, src, reduce, include_self=True):
  """x with, at each position, the reduction of the src entries whose index names it (and of x's own
  value with include_self). As scatter: a masked reduction over the index entries, no scatter."""
  if x.ndim == 0:
    one = lambda t: t.reshape((1,)) if isinstance(t, LT) else t
    return scatter_reduce(ctx, one(x), 0, one(index), one(src), reduce, include_self).reshape(())
  reduce = {"add": "sum", "multiply": "prod"}.get(reduce, reduce)   # scatter.reduce's names
  dim %= x.ndim
  if index.numel() == 0: return x
  ctx.check_index(index, x.shape[dim], dim, error="RuntimeError")
  return _scatter_reduce(x, dim, index, src, reduce, include_self)


def _scatter_reduce(x: LT, dim: int, index: LT, src, reduce: str, include_self: bool) -> LT:
  hits = _scatter_hits(x, dim, index)
  full = hits.shape
  acc = compute_dtype(x.dtype) if not x.dtype.is_bool else dtypes.bool
  if isinstance(src, LT):
    src_v = src.shrink([(0, s) for s in index.shape]).cast(acc)
    pads = [(0, 0) if d == dim else (0, x.shape[d] - index.shape[d]) for d in range(x.ndim)]
    src_v = src_v.pad(pads).unsqueeze(x.ndim).transpose(dim, x.ndim).broadcast_to(full)
  else: src_v = LT.full(full, src, acc)
  xa = x.cast(acc)
  ax = (x.ndim,)
  any_hit = hits.max(ax, keepdim=False)
  if reduce in ("sum", "mean"):
    total = hits.where(src_v, 0).sum(ax, keepdim=False)
    if acc.is_bool: total = hits.where(src_v, False).max(ax, keepdim=False)
    out = (xa | total if acc.is_bool else xa + total) if include_self else total
    if reduce == "mean":
      count = hits.cast(acc).sum(ax, keepdim=False) + (1 if include_self else 0)
      count = count.maximum(1)
      out = out / count if acc.is_float else _floor_div(out, count)
  elif reduce == "prod":
    out = hits.where(src_v, 1).reduce(Ops.MUL, ax, keepdim=False)
    if include_self: out = xa * out
  elif reduce in ("amax", "amin"):
    op = Ops.MAX if reduce == "amax" else Ops.MIN
    ident = acc.min() if reduce == "amax" else acc.max()
    if acc.is_float: ident = -math.inf if reduce == "amax" else math.inf
    out = hits.where(src_v, ident).reduce(op, ax, keepdim=False)
    if include_self: out = xa.alu(op, out)
  else: raise Unsupported(f"scatter reduce {reduce}")
  return any_hit.where(out, xa).cast(x.dtype)


def _floor_div(a: LT, b: LT) -> LT:
  q = a.alu(Ops.IDIV, b)
  r = a.alu(Ops.MOD, b)
  return (r.ne(0) & (r < 0).ne(b < 0)).where(q - 1, q)


@register(aten.index_reduce.default)
def index_reduce(ctx, x, dim, index, source, reduce, include_self=True):
  """index_reduce along dim: index [m] names the output row of each of source's m rows."""
  if x.ndim == 0: x, source, dim = x.reshape((1,)), source.reshape((1,)), 0
  dim %= x.ndim
  if index.numel() == 0: return x.reshape(ctx.shape)
  ctx.check_index(index, x.shape[dim], dim, message="index out of range in self (index {value}, dimension {dim} of size {size})")
  idx = index.reshape(tuple(-1 if d == dim else 1 for d in range(x.ndim))).broadcast_to(source.shape)
  return _scatter_reduce(x, dim, idx, source, reduce, include_self).reshape(ctx.shape)


def _as_rows(x: LT, index: LT, source) -> tuple:
  """A 0-d index_add/index_copy/index_fill as one over a 1-element dim 0."""
  return x.reshape((1,)), 0, index.reshape((index.numel(),)), source.reshape((source.numel(),)) if isinstance(source, LT) else source


@register(aten.index_add.default)
def index_add(ctx, x, dim, index, source, alpha=1):
  """x with source's rows added at the rows index names along dim (eager rejects negative indices, which
  index_put, where the decomposition would lead, wraps)."""
  if x.ndim == 0: return index_add(ctx, *_as_rows(x, index, source), alpha).reshape(())
  dim %= x.ndim
  ctx.check_index(index, x.shape[dim], dim, error="RuntimeError")
  if index.numel() == 0: return x
  return _index_put(ctx, x, [None] * dim + [index], source if alpha == 1 else source * alpha, True, check=False)


@register(aten.index_copy.default)
def index_copy(ctx, x, dim, index, source):
  if x.ndim == 0: return index_copy(ctx, *_as_rows(x, index, source)).reshape(())
  dim %= x.ndim
  ctx.check_index(index, x.shape[dim], dim, message="index_copy_(): index {value} is out of bounds for dimension {dim} with size {size}")
  if index.numel() == 0: return x
  return _index_put(ctx, x, [None] * dim + [index], source, False, check=False)


@register(aten.index_fill.int_Scalar, aten.index_fill.int_Tensor)
def index_fill(ctx, x, dim, index, value):
  """x with the rows index names along dim set to value (negative indices wrap, as in eager; its decomposition
  would go through index_copy, which rejects them)."""
  if x.ndim == 0: return index_fill(ctx, *_as_rows(x, index, value)).reshape(())
  dim %= x.ndim
  if index.numel() == 0: return x
  shape = tuple(index.numel() if d == dim else n for d, n in enumerate(x.shape))
  v = value.reshape(()).broadcast_to(shape) if isinstance(value, LT) else LT.full(shape, value, x.dtype)
  return _index_put(ctx, x, [None] * dim + [index.reshape((index.numel(),))], v, False, check=True)


@register(aten.put.default)
def put(ctx, x, index, source, accumulate=False):
  """x.put_(index, source): index_put on x flattened."""
  flat = x.reshape((x.numel(),))
  out = index_put(ctx, flat, [index.reshape((index.numel(),))], source.reshape((source.numel(),)), accumulate)
  return out.reshape(x.shape)


@register(aten.masked_scatter.default)
def masked_scatter(ctx, x, mask, source):
  """Positions where mask is set take source's elements in order: the k-th set position (row-major)
  reads source.flat[k], k from a prefix count of the mask (O(n^2), up to 8192 elements)."""
  shape = ctx.shape
  n = math.prod(shape)
  if n == 0: return x.broadcast_to(shape)
  if n > 8192: raise Unsupported("masked_scatter prefix count over more than 8192 elements")
  m = mask.cast(dtypes.bool).broadcast_to(shape).reshape((n,))
  i = LT.iota(n).reshape((n, 1)).broadcast_to((n, n))
  j = LT.iota(n).reshape((1, n)).broadcast_to((n, n))
  before = ((j < i) & m.reshape((1, n)).broadcast_to((n, n))).cast(dtypes.int64).sum((1,), keepdim=False)   # [n]
  src = source.reshape((source.numel(),))
  ctx.check(m.cast(dtypes.int64).sum((0,), keepdim=False) > src.shape[0], "RuntimeError",
            "Number of elements of source < number of ones in mask")
  if src.shape[0] == 0: return x.broadcast_to(shape)
  k = before.minimum(src.shape[0] - 1)
  picked = src.cast(x.dtype).gather_nd((("idx", 0),), [k])
  return m.where(picked, x.broadcast_to(shape).reshape((n,))).reshape(shape)
