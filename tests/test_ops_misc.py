"""Checks against eager for the misc lowerings (torch_uop/lowering/misc.py) and the dtype/argument
cases added to existing ones: small unstable sorts of any dtype, integer avg pooling, nextafter of half
types, as_strided storage offsets and intermediates, bilinear, tril/triu_indices, nonzero_static, mode. Each asserts that
no node fell back to ATen (check_against_eager), except where the fallback is the point."""
from __future__ import annotations
import pytest
import torch
import torch.nn.functional as F
import torch_uop
import torch_uop.debug
from helpers import check_against_eager

nan, inf = float("nan"), float("inf")


def ties(shape, dtype):
  """Values with many ties (three distinct values)."""
  return torch.randint(0, 3, shape).to(dtype)


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool, torch.bfloat16])
@pytest.mark.parametrize("n", [5, 16])
def test_small_unstable_sort_with_ties(dtype, n):
  x = ties((4, n), dtype)
  check_against_eager(lambda x: torch.sort(x, dim=-1, descending=True), x)
  check_against_eager(lambda x: torch.argsort(x, dim=-1), x)
  check_against_eager(lambda x: torch.msort(x), x.t().contiguous())


def test_long_unstable_sort_of_ints_falls_back():
  x = ties((2, 17), torch.int64)
  m = check_against_eager(lambda x: torch.sort(x), x, expect_native=False)
  assert m["fallback_nodes_total"] == 1


def test_topk_of_ints_with_ties_falls_back():
  x = ties((3, 6), torch.int64)   # quickselect orders ties its own way: never guessed
  m = check_against_eager(lambda x: torch.topk(x, 3), x, expect_native=False)
  assert m["fallback_nodes_total"] == 1


def test_avg_pool_of_integers_truncates():
  x = torch.randint(-20, 20, (2, 3, 7, 6))   # eager pools int64 only
  check_against_eager(lambda x: F.avg_pool2d(x, 3, stride=2, padding=1), x)
  check_against_eager(lambda x: F.avg_pool2d(x, 2, count_include_pad=False, padding=1, ceil_mode=True), x)
  check_against_eager(lambda x: F.avg_pool2d(x, 2, divisor_override=3), x)
  check_against_eager(lambda x: F.avg_pool1d(x, 3), x[0, 0])
  check_against_eager(lambda x: F.avg_pool3d(x, 2, padding=1), x)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_nextafter_bits(dtype):
  fi = torch.finfo(dtype)
  v = torch.tensor([0., -0., 1., -1., inf, -inf, nan, fi.max, -fi.max, fi.tiny, fi.tiny / 4, 3.5, -2.25], dtype=dtype)
  a, b = v[:, None].expand(13, 13).contiguous(), v[None, :].expand(13, 13).contiguous()
  expected = torch.nextafter(a, b)
  torch._dynamo.reset(); torch_uop.reset_metrics()
  actual = torch.compile(torch.nextafter, backend="uop")(a, b)
  assert torch_uop.metrics()["fallback_nodes_total"] == 0
  same = (actual.view(torch.int16 if dtype.itemsize == 2 else actual.dtype) == expected.view(torch.int16 if dtype.itemsize == 2 else expected.dtype))
  assert (same | (actual.isnan() & expected.isnan())).all()


def test_as_strided_offsets():
  base = torch.arange(20.)
  x = base[4:16]
  check_against_eager(lambda x: torch.as_strided(x, (2, 3), (1, 2)) * 2, x)        # storage offset of x kept
  check_against_eager(lambda x: torch.as_strided(x, (2, 3), (1, 2), 6) * 2, x)     # 2 past x's first element
  check_against_eager(lambda x: torch.as_strided(x, (3, 2), (1, 3)) + 1, base.reshape(4, 5).t())   # non-contiguous input
  check_against_eager(lambda x: torch.as_strided(x, (1,), (1,), 0) + 1, torch.randn(1))
  # before x's first element: not addressable from its buffer, falls back (and stays right)
  check_against_eager(lambda x: torch.as_strided(x, (2,), (1,), 1) * 2, x, expect_native=False)


def test_as_strided_over_intermediates():
  """as_strided of a value computed in the graph reads eager's storage of it: an expanded value's storage holds each
  element once, a transposed one's is its untransposed order (as in adaptive_avg_pool2d's backward at 1x1)."""
  x = torch.randn(4, 5)
  check_against_eager(lambda x: torch.as_strided((x + 1)[None].expand(3, 4, 5), (5, 2), (1, 5)) * 2, x)
  check_against_eager(lambda x: torch.as_strided((x * 2).t(), (2, 6), (6, 1), 3) + 1, x)
  check_against_eager(lambda x: torch.as_strided((x * 2)[:, None].expand(4, 3, 5).permute(2, 1, 0), (10,), (2,)), x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64])
def test_bilinear(dtype):
  x1, x2 = torch.randn(6, 3).to(dtype), torch.randn(6, 4).to(dtype)
  w, b = torch.randn(5, 3, 4).to(dtype), torch.randn(5).to(dtype)
  check_against_eager(F.bilinear, x1, x2, w, b, rtol=1e-4, atol=1e-4)
  check_against_eager(F.bilinear, x1[:0], x2[:0], w, b)
  check_against_eager(F.bilinear, x1[0], x2[0], w, None, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("fn", [torch.tril_indices, torch.triu_indices])
def test_tri_indices(fn):
  for row, col, off in [(3, 4, 1), (4, 3, -1), (6, 2, -8), (6, 2, 9), (0, 3, 0)]:
    check_against_eager(lambda: fn(row, col, off))
  check_against_eager(lambda: fn(4, 5, 1, dtype=torch.int32))


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
def test_nonzero_static(dtype):
  x = torch.randint(0, 2, (3, 4, 2)).to(dtype)
  check_against_eager(lambda x: torch.nonzero_static(x, size=3), x)
  check_against_eager(lambda x: torch.nonzero_static(x, size=30, fill_value=7), x)
  check_against_eager(lambda x: torch.nonzero_static(x, size=4), torch.zeros(5, dtype=dtype))
  check_against_eager(lambda x: torch.nonzero_static(x, size=2), torch.ones((), dtype=dtype))
  check_against_eager(lambda x: torch.nonzero_static(x, size=2), torch.ones((0, 3), dtype=dtype))


def test_nonzero_static_nan():
  check_against_eager(lambda x: torch.nonzero_static(x, size=4), torch.tensor([0., nan, -0., 2.]))


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool])
def test_mode(dtype):
  x = ties((4, 6, 5), dtype)
  check_against_eager(lambda x: torch.mode(x), x)
  check_against_eager(lambda x: torch.mode(x, 1, True), x)
  check_against_eager(lambda x: torch.mode(x), torch.tensor([5, 1, 5, 1, 7]).to(dtype))


def test_mode_of_floats_falls_back():
  m = check_against_eager(lambda x: torch.mode(x), torch.tensor([3., nan, 3., nan]), expect_native=False)
  assert m["fallback_nodes_total"] == 1


@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min", "prod"])
def test_segment_reduce(reduce):
  data = torch.randn(7, 3)
  data[2, 1] = nan
  lengths = torch.tensor([2, 0, 3, 2])
  for initial in (None, 2.5):
    check_against_eager(lambda d, l: torch.segment_reduce(d, reduce, lengths=l, initial=initial), data, lengths)
    offsets = torch.tensor([0, 2, 2, 5, 7])
    check_against_eager(lambda d, o: torch.segment_reduce(d, reduce, offsets=o, initial=initial), data, offsets)
  batched = torch.randn(2, 6)
  check_against_eager(lambda d, l: torch.segment_reduce(d, reduce, lengths=l, axis=1), batched, torch.tensor([[1, 5], [3, 3]]))


def test_as_strided_scatter():
  x, src = torch.randn(4, 5), torch.randn(2, 3)
  check_against_eager(lambda x, s: torch.as_strided_scatter(x, s, (2, 3), (5, 2), 1), x, src)
  check_against_eager(lambda x, s: torch.as_strided_scatter(x, s, (3, 2), (1, 6)), x, src.t())
  check_against_eager(lambda x, s: torch.as_strided_scatter(x, s, (0, 3), (5, 1)), x, src[:0])
  check_against_eager(lambda x, s: torch.as_strided_scatter(x, s, (), (), 7), x.long(), torch.tensor(3))
  # an overlapping window: eager's write order is its own, so it falls back
  check_against_eager(lambda x, s: torch.as_strided_scatter(x, s, (2, 3), (1, 1)), x, src, expect_native=False)


@pytest.mark.parametrize("mode,padding_mode,align_corners", [
  ("bilinear", "zeros", False), ("bilinear", "border", True), ("bilinear", "reflection", False),
  ("bilinear", "reflection", True), ("nearest", "zeros", True), ("nearest", "reflection", False)])
def test_grid_sample_3d(mode, padding_mode, align_corners):
  x = torch.randn(2, 3, 4, 5, 6, dtype=torch.float64)
  grid = torch.rand(2, 3, 2, 4, 3, dtype=torch.float64) * 2.6 - 1.3     # some samples outside [-1, 1]
  check_against_eager(lambda x, g: F.grid_sample(x, g, mode=mode, padding_mode=padding_mode, align_corners=align_corners), x, grid)


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_embedding_bag(mode):
  w = torch.randn(10, 4)
  w[3, 1] = nan
  idx = torch.tensor([1, 3, 2, 3, 9, 0, 7, 3])
  offsets = torch.tensor([0, 3, 3, 6])
  check_against_eager(lambda w, i, o: F.embedding_bag(i, w, o, mode=mode), w, idx, offsets)
  check_against_eager(lambda w, i, o: F.embedding_bag(i, w, o, mode=mode, padding_idx=3), w, idx, offsets)
  check_against_eager(lambda w, i: F.embedding_bag(i, w, mode=mode), w, idx.reshape(2, 4))
  check_against_eager(lambda w, i, o: F.embedding_bag(i, w, o, mode=mode, include_last_offset=True), w, idx, torch.tensor([0, 3, 3, 8]))
  if mode == "sum":
    psw = torch.rand(8)
    check_against_eager(lambda w, i, o, p: F.embedding_bag(i, w, o, mode=mode, per_sample_weights=p), w, idx, offsets, psw)


def test_embedding_max_norm():
  w, idx = torch.randn(10, 4) * 3, torch.tensor([[1, 3, 3], [0, 9, 1]])
  check_against_eager(lambda w, i: F.embedding(i, w.clone(), max_norm=2.0), w, idx)
  check_against_eager(lambda w, i: F.embedding_bag(i, w.clone(), max_norm=1.5, norm_type=1.0), w, idx)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_histogram(dtype):
  x = torch.cat([torch.randn(40) * 4, torch.arange(-5., 6.)]).to(dtype)   # integers land on edges
  for bins, rng, density in [(7, None, False), (10, None, True), (5, (-2.0, 3.0), True), (1, (1.0, 1.0), False)]:
      check_against_eager(lambda x: torch.histogram(x, bins, range=rng, density=density), x)
  check_against_eager(lambda x, w: torch.histogram(x, 4, weight=w), x, torch.rand(51, dtype=dtype))
  check_against_eager(lambda x, b: torch.histogram(x, b), x, torch.tensor([-3., 0., 0.5, 4.], dtype=dtype))
  check_against_eager(lambda x: torch.histogram(x, 3, density=True), torch.ones(4, dtype=dtype))   # widened range
  check_against_eager(lambda x: torch.histogram(x, 3), torch.empty(0, dtype=dtype))


def test_histogramdd():
  x = torch.randn(30, 3)
  check_against_eager(lambda x: torch.histogramdd(x, [2, 3, 4]), x)
  check_against_eager(lambda x: torch.histogramdd(x, [2, 3, 1], range=[-1., 1., -2., 2., 0., 1.], density=True), x)
  check_against_eager(lambda x: torch.histogramdd(x, [torch.tensor([-1., 0., 1.]), torch.tensor([-2., 2.]), torch.tensor([-5., 0., 5.])]), x)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_linear_cross_entropy_chunked(reduction):
  from torch.nn.modules.linear_cross_entropy_options import LinearCrossEntropyOptions
  opts = LinearCrossEntropyOptions(allow_retain_graph=True, batch_chunk_size=2)
  x, lw, bias, cw = torch.randn(6, 5), torch.randn(4, 5), torch.randn(4), torch.rand(4)
  target = torch.tensor([0, 3, 1, -100, 2, 3])
  check_against_eager(lambda x, w, t: F.linear_cross_entropy(x, w, t, linear_bias=bias, weight=cw, reduction=reduction,
                                                             options=opts), x, lw, target, rtol=1e-5, atol=1e-5)
  check_against_eager(lambda x, w, t: F.linear_cross_entropy(x, w, t, ignore_index=3, reduction=reduction, options=opts),
                      x, lw, target.clamp(min=0), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_upsample_bilinear_antialias(dtype):
  x = torch.randn(2, 3, 10, 12, dtype=dtype)
  for kw in (dict(size=(3, 17)), dict(scale_factor=(1.7, 0.45)), dict(size=(4, 5), align_corners=True), dict(scale_factor=1.05)):
    check_against_eager(lambda x: F.interpolate(x, mode="bilinear", antialias=True, **kw), x)


_NEAREST_CASES = [
  ((2, 3, 5, 7), dict(scale_factor=2)),                        # the usual 2x: a broadcast view, a window sum back
  ((2, 3, 5, 7), dict(scale_factor=3)),
  ((1, 2, 5, 7), dict(size=(11, 13))),                          # any other ratio: a gather, a masked window back
  ((1, 2, 9, 10), dict(size=(4, 3))),                           # downsampling: some inputs get no gradient
  ((1, 2, 5, 7), dict(scale_factor=(1.5, 2.7))),                # the given scales, not in/out, set the mapping
  ((1, 2, 7, 7), dict(scale_factor=1.7, recompute_scale_factor=True)),
  ((1, 1, 33, 17), dict(size=(100, 51))),
  ((1, 2, 6), dict(scale_factor=2.5)),                          # 1d
  ((1, 2, 3, 4, 5), dict(scale_factor=2)),                      # 3d
  ((1, 2, 3, 4, 5), dict(size=(5, 7, 4))),
]


@pytest.mark.parametrize("mode", ["nearest", "nearest-exact"])
@pytest.mark.parametrize("shape,kw", _NEAREST_CASES)
def test_upsample_nearest_and_its_gradient(mode, shape, kw):
  """F.interpolate's nearest modes lowered whole (not the decomposition, whose backward is an index_put with
  accumulate, which scans every output position per input position): output bit for bit, input gradient close."""
  from helpers import check_grads_against_eager
  x = torch.randn(shape, requires_grad=True)
  fn = lambda x: F.interpolate(x, mode=mode, **kw)
  assert torch.equal(torch.compile(fn, backend="uop")(x.detach()), fn(x.detach()))
  m = check_grads_against_eager(lambda x: fn(x).sin(), x)
  torch._dynamo.reset()
  with torch_uop.debug.capture() as graphs:
    torch.compile(fn, backend="uop")(x).sum().backward()
  ops = " ".join(step.what or "" for g in graphs for kind, step in g.plan.steps if kind == "kernel")
  assert "index_put" not in ops and "upsample_nearest" in ops, ops
  assert m["fallback_nodes_total"] == 0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_upsample_nearest_dtypes_and_layouts(dtype):
  """Half types accumulate their gradient in float32 as eager does; a channels-last input keeps its layout."""
  from helpers import check_grads_against_eager
  x = torch.randn(2, 4, 6, 5).to(dtype).to(memory_format=torch.channels_last).requires_grad_()
  tol = dict(rtol=1e-2, atol=1e-2) if dtype in (torch.bfloat16, torch.float16) else dict(rtol=1e-7, atol=1e-7)
  for kw in (dict(scale_factor=2), dict(size=(9, 11))):
    out = torch.compile(lambda x: F.interpolate(x, **kw), backend="uop")(x.detach())
    ref = F.interpolate(x.detach(), **kw)
    assert torch.equal(out, ref) and out.stride() == ref.stride()
    check_grads_against_eager(lambda x: F.interpolate(x, **kw) * 3, x, **tol)


@pytest.mark.parametrize("kw", [dict(scale_factor=2), dict(scale_factor=3), dict(size=(9, 5))])
def test_upsample_nearest_gradient_under_symbolic_sizes(kw):
  """Under dynamic shapes the resize and its backward compile once for every size (symbolic), and stay right."""
  fn = lambda x: F.interpolate(x, mode="nearest", **kw) * 3
  torch._dynamo.reset()
  torch_uop.reset_metrics()
  compiled = torch.compile(fn, backend="uop", dynamic=True)
  for h, w in [(4, 6), (5, 8), (7, 10)]:
    x = torch.randn(1, 2, h, w, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    ref = fn(x)
    g = torch.randn(ref.shape)
    ref.backward(g)
    out = compiled(x2)
    out.backward(g)
    assert torch.equal(out, ref)
    torch.testing.assert_close(x2.grad, x.grad)
  m = torch_uop.metrics()
  assert m["symbolic_graphs"] >= 2 and m["size_specializations"] == 0 and m["fallback_nodes_total"] == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
@pytest.mark.parametrize("one", [1, 1.0])
def test_mul_by_one(dtype, one):
  """x * 1 is x in torch's promoted dtype (int * 1.0 is float, bool * 1 is int64), for either operand order, with
  NaN, inf and -0 as they are."""
  x = torch.tensor([0.0, -0.0, 1.5, -2.0, float("nan"), float("inf"), 7.0]).to(dtype)
  for fn in (lambda t: t * one, lambda t: one * t, lambda t: torch.mul(t, one)):
    got, want = torch.compile(fn, backend="uop")(x), fn(x)
    assert got.dtype == want.dtype
    torch.testing.assert_close(got, want, equal_nan=True, rtol=0, atol=0)
    if dtype.is_floating_point: assert torch.equal(got.signbit(), want.signbit())


def test_linear_bias_is_read_where_it_lies():
  """torch's addmm decomposition multiplies the product and the bias by 1. Where the sum is read by several kernels
  (a residual stream read by a layer norm and the next residual add), the bias times 1 became a kernel of its own;
  now every kernel's output is a 2-d or wider tensor (the packed weight panels, the GEMMs and their epilogues)."""
  lin, lin2, ln = torch.nn.Linear(768, 192), torch.nn.Linear(192, 768), torch.nn.LayerNorm(192)
  x, r = torch.randn(1, 197, 768), torch.randn(1, 197, 192)
  def block(x, r):
    h = r + lin(x)
    return h + lin(lin2(ln(h)))
  with torch_uop.debug.capture() as graphs, torch.no_grad():
    got = torch.compile(block, backend="uop")(x, r)
    want = block(x, r)
  torch.testing.assert_close(got, want)
  shapes = [tuple(g.buffers[k.buffers[0]].shape) for g in graphs for k in g.kernels]
  assert shapes and all(len(s) >= 2 for s in shapes), shapes
