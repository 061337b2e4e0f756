"""Random lowerings: rand/randn/randint (and *_like), bernoulli, uniform, normal, exponential, geometric,
log_normal, cauchy, native_dropout, rrelu (training), multinomial, fractional_max_pool2d/3d.

Random numbers come from a counter-based generator evaluated inside the kernels: element i of the
b-th random node of a graph gets `splitmix64(seed + (b * 2^40 + i + 1) * golden)`, position
b * 2^40 + i of one splitmix64 sequence (the generator of Java's SplittableRandom). The seed is a
one-element int64 buffer that a step draws from torch's default CPU generator at every call of the
compiled graph, so torch.manual_seed(s) reproduces a compiled run, two calls give different numbers,
and no two random values of one call share a sequence position. Values follow
eager's distributions and scaling, not its exact bit stream (eager's mt19937 sequence is not replayed).
"""
from __future__ import annotations
import math
import torch
from torch_uop.core.uop import Ops
from torch_uop.core.dtypes import dtypes, DType
from torch_uop.torch_dtypes import to_torch
from torch_uop.lowering.registry import register, Unsupported
from torch_uop.lowering.tensor import LT, compute_dtype
from torch_uop.lowering.reduction import arg_extreme, sort_along

aten = torch.ops.aten

_GOLDEN = 0x9E3779B97F4A7C15      # 2^64 / golden ratio, the splitmix64 increment
_MIX1, _MIX2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
_BLOCK = 1 << 40                  # sequence positions reserved for one random node


# ---------------- the generator

class _DrawSeed:
  """The run-time step that gives a graph its seed for one call: 62 bits from torch's default generator."""
  __name__ = "random seed"

  def __call__(self): return torch.randint(0, 2 ** 62, (1,), dtype=torch.int64)


def _lshr(x: LT, k: int) -> LT:
  """Logical shift right of int64 bits (SHR on int64 is arithmetic: mask the sign copies off)."""
  return x.alu(Ops.SHR, k) & ((1 << (64 - k)) - 1)


def _mix64(z: LT) -> LT:
  """splitmix64's finalizer: a bijection on 64-bit words whose output bits each depend on all input bits."""
  z = (z ^ _lshr(z, 30)) * _MIX1
  z = (z ^ _lshr(z, 27)) * _MIX2
  return z ^ _lshr(z, 31)


def _check_generator(kwargs):
  if kwargs.get("generator") is not None: raise Unsupported("an explicit torch.Generator")
  d = kwargs.get("device")
  if d is not None and torch.device(d).type != "cpu": raise Unsupported(f"random tensor on {d}")


def random_bits(ctx, shape: tuple, draws: int = 1) -> list[LT]:
  """`draws` independent tensors of 64 random bits (int64) of `shape`. All random nodes of a graph read one
  splitmix64 sequence, `mix(seed + (j + 1) * golden)`, each node its own block of 2^40 positions j, so
  no two values of one call share a state."""
  state = getattr(ctx, "graph", None)
  if state is None: raise Unsupported("random numbers need the graph's seed")
  n = math.prod(shape)
  if n * draws >= _BLOCK: raise Unsupported(f"{n * draws} random values in one node")
  if "rng_seed" not in state.shared:
    state.shared["rng_seed"] = state.run_time_tensor(_DrawSeed(), "random seed", (1,), dtypes.int64).reshape(())
    state.shared["rng_blocks"] = 0
  block = state.shared["rng_blocks"]
  state.shared["rng_blocks"] += 1
  counter = LT.iota(max(n, 1)).shrink(((0, n),)).reshape(shape) * draws
  seed = state.shared["rng_seed"]
  return [_mix64(seed + (counter + (block * _BLOCK + k + 1)) * _GOLDEN) for k in range(draws)]


_MANTISSA = {dtypes.float64: 53, dtypes.float32: 24, dtypes.float16: 11, dtypes.bfloat16: 8}


def _math_dtype(dt: DType) -> DType:
  """Random floats are made and transformed in float64 for double results, else float32."""
  return dtypes.float64 if dt == dtypes.float64 else dtypes.float32


def to_uniform(bits: LT, dt: DType, open_interval: bool = False) -> LT:
  """Uniform floats in [0, 1) with `dt`'s resolution (multiples of 2^-mantissa, so they stay below 1 once
  cast to dt, as eager's), in `_math_dtype(dt)`. open_interval: in (0, 1), half a step off each end, for
  transforms that take a log."""
  n = _MANTISSA.get(dt, 24)
  k = _lshr(bits, 64 - n).cast(_math_dtype(dt))
  if open_interval: k = k + 0.5
  return k * (2.0 ** -n)


def uniform(ctx, shape, dt: DType, open_interval: bool = False) -> LT:
  return to_uniform(random_bits(ctx, shape)[0], dt, open_interval)


def standard_normal(ctx, shape, dt: DType) -> LT:
  """Box-Muller: sqrt(-2 ln u1) * cos(2 pi u2), one normal per element, in `_math_dtype(dt)`."""
  b1, b2 = random_bits(ctx, shape, 2)
  md = _math_dtype(dt)
  u1, u2 = to_uniform(b1, md, True), to_uniform(b2, md)
  return (u1.log() * -2.0).sqrt() * (u2 * (2 * math.pi)).math("cos")


def _result(x: LT, ctx) -> LT: return x.cast(ctx.dtype)


# ---------------- creation

@register(aten.rand.default, aten.rand.generator, aten.rand_like.default)
def rand(ctx, *args, **kwargs):
  _check_generator(kwargs)
  if not ctx.dtype.is_float: raise Unsupported(f"rand of {ctx.dtype}")
  return _result(uniform(ctx, ctx.shape, ctx.dtype), ctx)


@register(aten.randn.default, aten.randn.generator, aten.randn_like.default)
def randn(ctx, *args, **kwargs):
  _check_generator(kwargs)
  if not ctx.dtype.is_float: raise Unsupported(f"randn of {ctx.dtype}")
  return _result(standard_normal(ctx, ctx.shape, ctx.dtype), ctx)


def _randint(ctx, low: int, high: int) -> LT:
  if not isinstance(low, int) or not isinstance(high, int): raise Unsupported("randint bounds that are not ints")
  if high <= low: raise Unsupported("empty randint range (eager raises)")
  if ctx.dtype.is_bool: raise Unsupported("randint of bool")
  span = high - low
  if span >= 1 << 62: raise Unsupported("randint range of 2^62 or more")
  # 63 random bits mod span: the bias, span / 2^63, is far below what any test of uniformity can see
  v = _lshr(random_bits(ctx, ctx.shape)[0], 1).alu(Ops.MOD, span) + low
  return v.cast(ctx.dtype)


@register(aten.randint.default, aten.randint.generator)
def randint(ctx, high, size, **kwargs):
  _check_generator(kwargs)
  return _randint(ctx, 0, high)


@register(aten.randint.low, aten.randint.low_generator)
def randint_low(ctx, low, high, size, **kwargs):
  _check_generator(kwargs)
  return _randint(ctx, low, high)


@register(aten.randint_like.default)
def randint_like(ctx, x, high, **kwargs):
  _check_generator(kwargs)
  return _randint(ctx, 0, high)


@register(aten.randint_like.low_dtype)
def randint_like_low(ctx, x, low, high, **kwargs):
  _check_generator(kwargs)
  return _randint(ctx, low, high)


# ---------------- distributions that fill a tensor of self's shape

def _float_result(ctx):
  if not ctx.dtype.is_float: raise Unsupported(f"a continuous distribution into {ctx.dtype}")


@register(aten.uniform.default)
def uniform_(ctx, x, low=0.0, high=1.0, **kwargs):
  _check_generator(kwargs)
  _float_result(ctx)
  if low > high: raise Unsupported("uniform_ with from > to (eager raises)")
  u = uniform(ctx, ctx.shape, ctx.dtype)
  return _result(u * (float(high) - float(low)) + float(low), ctx)


@register(aten.normal_functional.default)
def normal_functional(ctx, x, mean=0.0, std=1.0, **kwargs):
  _check_generator(kwargs)
  _float_result(ctx)
  if std < 0: raise Unsupported("negative std (eager raises)")
  return _result(standard_normal(ctx, ctx.shape, ctx.dtype) * float(std) + float(mean), ctx)


@register(aten.normal.Tensor_Tensor, aten.normal.Tensor_float, aten.normal.float_Tensor, aten.normal.float_float)
def normal(ctx, mean, std=1.0, *args, **kwargs):
  _check_generator(kwargs)
  _float_result(ctx)
  if isinstance(std, (int, float)) and std < 0: raise Unsupported("negative std (eager raises)")
  md = _math_dtype(ctx.dtype)
  z = standard_normal(ctx, ctx.shape, ctx.dtype)
  scale = std.cast(md) if isinstance(std, LT) else float(std)
  shift = mean.cast(md) if isinstance(mean, LT) else float(mean)
  return _result(z * scale + shift, ctx)


@register(aten.log_normal.default)
def log_normal(ctx, x, mean=1.0, std=2.0, **kwargs):
  _check_generator(kwargs)
  _float_result(ctx)
  if std <= 0: raise Unsupported("non-positive std (eager raises)")
  return _result((standard_normal(ctx, ctx.shape, ctx.dtype) * float(std) + float(mean)).exp(), ctx)


@register(aten.exponential.default)
def exponential(ctx, x, lambd=1.0, **kwargs):
  _check_generator(kwargs)
  _float_result(ctx)
  if lambd <= 0: raise Unsupported("non-positive rate (eager raises)")
  # -ln(u) / lambda with u in (0, 1): never 0 and never inf, as eager's
  return _result(uniform(ctx, ctx.shape, _math_dtype(ctx.dtype), True).log() * (-1.0 / float(lambd)), ctx)


@register(aten.cauchy.default)
def cauchy(ctx, x, median=0.0, sigma=1.0, **kwargs):
  _check_generator(kwargs)
  _float_result(ctx)
  if sigma <= 0: raise Unsupported("non-positive sigma (eager raises)")
  u = uniform(ctx, ctx.shape, _math_dtype(ctx.dtype), True)
  return _result(((u - 0.5) * math.pi).math("tan") * float(sigma) + float(median), ctx)


@register(aten.geometric.default)
def geometric(ctx, x, p, **kwargs):
  _check_generator(kwargs)
  if ctx.dtype.is_bool or not 0 < p < 1:
    if p == 1 and not ctx.dtype.is_bool: return LT.full(ctx.shape, 1, ctx.dtype)
    raise Unsupported(f"geometric with p={p} (eager raises outside (0, 1])")
  # number of Bernoulli(p) trials up to the first success: ceil(ln u / ln(1 - p)), at least 1
  u = to_uniform(random_bits(ctx, ctx.shape)[0], dtypes.float64, True)
  k = (u.log() * (1.0 / math.log1p(-p))).math("ceil").maximum(1.0)
  if ctx.dtype.is_int: k = k.minimum(float(ctx.dtype.max()))
  return k.cast(ctx.dtype)


@register(aten.bernoulli.p)
def bernoulli_p(ctx, x, p=0.5, **kwargs):
  _check_generator(kwargs)
  if not 0 <= p <= 1: raise Unsupported("p outside [0, 1] (eager raises)")
  dt = _math_dtype(ctx.dtype) if ctx.dtype.is_float else dtypes.float64
  return (uniform(ctx, ctx.shape, dt) < float(p)).cast(ctx.dtype)


@register(aten.bernoulli.default, aten.bernoulli.Tensor)
def bernoulli(ctx, x, p=None, **kwargs):
  _check_generator(kwargs)
  probs = x if p is None else p
  if not probs.dtype.is_float: raise Unsupported("integer probabilities")
  ctx.check_all((probs >= 0) & (probs <= 1), "RuntimeError",
                "Expected p_in >= 0 && p_in <= 1 to be true, but got false (a probability outside [0, 1], or NaN)")
  md = _math_dtype(probs.dtype)
  return (uniform(ctx, ctx.shape, md) < probs.cast(md).broadcast_to(ctx.shape)).cast(ctx.dtype)


# ---------------- nn

@register(aten.native_dropout.default)
def native_dropout(ctx, x, p, train):
  mask_dt = ctx.dtype_of(1)
  if train is False or p == 0:
    return x, LT.full(x.shape, True, mask_dt)
  if not x.dtype.is_float: raise Unsupported("dropout of a non-float tensor")
  if p == 1: return LT.full(x.shape, 0, x.dtype), LT.full(x.shape, False, mask_dt)
  keep = uniform(ctx, x.shape, _math_dtype(x.dtype)) >= float(p)
  cd = compute_dtype(x.dtype)
  out = keep.where(x.cast(cd) * (1.0 / (1.0 - p)), 0.0)
  return out.cast(x.dtype), keep.cast(mask_dt)


@register(aten.rrelu_with_noise_functional.default)
def rrelu_with_noise(ctx, x, noise, lower=1.0 / 8, upper=1.0 / 3, training=False, generator=None):
  if generator is not None: raise Unsupported("an explicit torch.Generator")
  cd = compute_dtype(x.dtype)
  xc = x.cast(cd)
  if not training:  # leaky_relu with the mean slope; the noise is left as it is
    return (xc > 0).where(xc, xc * ((lower + upper) / 2)).cast(x.dtype), noise
  r = uniform(ctx, x.shape, dtypes.float64) * (float(upper) - float(lower)) + float(lower)
  r = r.cast(cd)
  neg = xc <= 0
  return neg.where(xc * r, xc).cast(x.dtype), neg.where(r, 1.0).cast(noise.dtype)


# ---------------- sampling

_MAX_GUMBEL_ELEMENTS = 1 << 24


def _gumbel_keys(ctx, probs: LT, shape: tuple) -> LT:
  """log p + Gumbel noise, broadcast to shape: the index of the largest key is a draw from p."""
  md = _math_dtype(probs.dtype)
  u = uniform(ctx, shape, md, True)
  return probs.cast(md).broadcast_to(shape).log() - (-u.log()).log()


@register(aten.multinomial.default)
def multinomial(ctx, probs, num_samples, replacement=False, **kwargs):
  _check_generator(kwargs)
  if probs.ndim not in (1, 2) or not probs.dtype.is_float: raise Unsupported("multinomial input")
  rows = probs if probs.ndim == 2 else probs.reshape((1, probs.shape[0]))
  r, cats = rows.shape
  if r * cats == 0 or num_samples == 0: raise Unsupported("empty multinomial (eager decides)")
  if not replacement and num_samples > cats: raise Unsupported("more samples than categories (eager raises)")
  ctx.check_all((rows >= 0) & (rows < math.inf), "RuntimeError",  # (NaN compares false)
                "probability tensor contains either `inf`, `nan` or element < 0")
  ctx.check_all(rows.sum((1,), keepdim=False) > 0, "RuntimeError", "invalid multinomial distribution (sum of probabilities <= 0)")
  if replacement:
    # each sample: argmax over categories of log p + Gumbel (Gumbel-max)
    if r * num_samples * cats > _MAX_GUMBEL_ELEMENTS: raise Unsupported("multinomial too large for Gumbel-max")
    keys = _gumbel_keys(ctx, rows.reshape((r, 1, cats)), (r, num_samples, cats))
    _, idx = arg_extreme(keys, 2, False, True)
  else:
    # without replacement: the num_samples largest keys, in order (Gumbel top-k)
    if num_samples > cats: raise Unsupported("more samples than categories (eager raises)")
    keys = _gumbel_keys(ctx, rows, (r, cats))
    _, idx = sort_along(keys, 1, True, True)  # raises Unsupported for very long rows
    idx = idx.slice(1, 0, num_samples)
  return idx.reshape(ctx.shape)


def _window_starts(sample: LT, in_size: int, out_size: int, pool: int, dt: DType) -> LT:
  """Eager's fractional pooling intervals: start[i] = int((i + u) * alpha) - int(u * alpha) with
  alpha = (in - pool) / (out - 1), each step rounded to the input dtype; the last window ends at the edge.
  sample: (..., 1) -> (..., out_size) int64."""
  lead = sample.shape[:-1]
  if out_size == 1: return LT.full((*lead, 1), in_size - pool, dtypes.int64)
  cd = compute_dtype(dt)
  rnd = lambda v: v.cast(dt).cast(cd)   # eager computes in the scalar type itself
  alpha = float(torch.tensor(in_size - pool, dtype=to_torch(dt)) / torch.tensor(out_size - 1, dtype=to_torch(dt)))
  u = sample.cast(cd)
  i = LT.iota(out_size).cast(cd).reshape((1,) * len(lead) + (out_size,))
  first = rnd(rnd(i + u) * alpha).cast(dtypes.int32)
  base = rnd(u * alpha).cast(dtypes.int32)
  starts = (first - base).cast(dtypes.int64)
  last = LT.iota(out_size).reshape((1,) * len(lead) + (out_size,)).eq(out_size - 1)
  return last.where(LT.full(starts.shape, in_size - pool, dtypes.int64), starts)


def _fractional_max_pool(ctx, x: LT, kernel, out_size, samples: LT, nd: int):
  if samples.shape[-1] != nd: raise Unsupported("random samples shape")
  batched = x.ndim == nd + 2
  if not batched: x = x.unsqueeze(0)
  n, c = x.shape[:2]
  spatial = x.shape[2:]
  kernel = tuple(kernel) * (nd if len(kernel) == 1 else 1)
  out_size = tuple(out_size)
  if any(o + k - 1 > s for o, k, s in zip(out_size, kernel, spatial)): raise Unsupported("pool too large (eager raises)")
  shape = (n, c, *out_size)
  if math.prod(shape) == 0:  # nothing to pool (an empty batch): empty results
    out, ind = LT.full(shape, 0, x.dtype), LT.full(shape, 0, dtypes.int64)
    return (out, ind) if batched else (out.reshape(shape[1:]), ind.reshape(shape[1:]))
  if x.numel() == 0: raise Unsupported("pooling an empty input (eager raises)")
  samples = samples.reshape((n, c, nd))
  # the sample for spatial dim d: eager's 2-d kernel takes [0] for W and [1] for H; the 3-d one [0] T, [1] H, [2] W
  sample_of = (1, 0) if nd == 2 else (0, 1, 2)
  full = (n, c, *out_size, *kernel)
  idx = []
  for d in range(nd):
    s = samples.slice(2, sample_of[d], sample_of[d] + 1)                        # (n, c, 1)
    start = _window_starts(s, spatial[d], out_size[d], kernel[d], x.dtype)       # (n, c, out_d)
    view = [1] * len(full)
    view[0], view[1], view[2 + d] = n, c, out_size[d]
    offset = [1] * len(full)
    offset[2 + nd + d] = kernel[d]
    idx.append(start.reshape(view).broadcast_to(full) + LT.iota(kernel[d]).reshape(offset).broadcast_to(full))
  win = x.gather_nd((0, 1, *[("idx", d) for d in range(nd)]), idx)             # (n, c, *out, *kernel)
  flat = idx[0]
  for d in range(1, nd): flat = flat * spatial[d] + idx[d]
  kaxes = tuple(range(2 + nd, 2 + 2 * nd))
  m = win.reduce(Ops.MAX, kaxes, True)                                           # NaN-propagating
  big = math.prod(spatial)
  # eager keeps the first maximum, or the last NaN
  first = (win.eq(m)).where(flat, big).reduce(Ops.MIN, kaxes, True)
  if win.dtype.is_float:
    last_nan = win.isnan().where(flat, -1).reduce(Ops.MAX, kaxes, True)
    first = m.isnan().where(last_nan, first)
  out, ind = m.reshape(shape), first.reshape(shape)
  if not batched: out, ind = out.reshape(shape[1:]), ind.reshape(shape[1:])
  return out, ind


@register(aten.fractional_max_pool2d.default)
def fractional_max_pool2d(ctx, x, kernel_size, output_size, random_samples):
  return _fractional_max_pool(ctx, x, kernel_size, output_size, random_samples, 2)


@register(aten.fractional_max_pool3d.default)
def fractional_max_pool3d(ctx, x, kernel_size, output_size, random_samples):
  return _fractional_max_pool(ctx, x, kernel_size, output_size, random_samples, 3)
