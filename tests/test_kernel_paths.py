"""The fast kernel paths against eager: convolution over padded rows (stride 1, strided through space to depth,
dilated, grouped, depthwise), its weight gradient over padded rows or as a GEMM over im2col rows, register tiles that do not divide
their axis, the loop order of a GEMM with a big weight, a GEMM over packed weight panels, a graph output that is a reshape of a computed buffer, an expensive expression shared by kernels, and the
loop order of a transposing copy."""
import re
import pytest
import torch
import torch.nn.functional as F
import torch_uop
import torch_uop.debug
from torch_uop.lowering import linalg
from torch_uop.core.uop import Ops
from torch_uop.runtime import cpu, llvm_worker

FRESH = {"graph_cache": False}  # tests that look at how a graph compiles must not get it from the graph cache


def _compile_checked(fn, args, rtol=1e-5, atol=1e-5) -> list:
  """The graphs torch.compile builds for fn(*args) (fresh, not from the graph cache), its result checked against eager's."""
  torch._dynamo.reset()
  with torch_uop.debug.capture() as graphs:
    got = torch.compile(fn, backend="uop", options=FRESH)(*args)
  torch.testing.assert_close(got, fn(*args), rtol=rtol, atol=atol, equal_nan=True)
  return graphs

# (batch, channels, height, out channels, kernel, stride, padding, dilation, groups)
CONV_CASES = [
  (2, 3, 32, 8, 7, 2, 3, 1, 1),     # a stem: 3 channels, 7x7, stride 2
  (1, 16, 15, 8, 3, 2, 1, 1, 1),    # stride 2, odd size
  (1, 16, 14, 8, 1, 2, 0, 1, 1),    # 1x1 stride 2 (every other pixel)
  (1, 16, 13, 16, 3, 1, 1, 2, 1),   # dilated
  (2, 32, 9, 32, 3, 1, 1, 1, 2),    # grouped
  (1, 8, 10, 8, 5, 3, 2, 1, 1),     # stride 3, 5x5
  (1, 24, 11, 12, 3, 1, 0, 1, 3),   # no padding, 3 groups
  (1, 8, 9, 4, 4, 3, 1, 1, 1),      # even kernel, stride 3
  (2, 16, 12, 16, 3, 1, 1, 1, 16),  # depthwise
  (1, 12, 11, 12, 5, 2, 2, 1, 12),  # depthwise, strided
  (2, 64, 10, 64, 3, 1, 1, 1, 1),   # a ResNet-style block
  # input gradients of kernels smaller than their stride: only the phases the kernel reaches are computed
  (1, 8, 11, 4, 2, 3, 1, 1, 1),     # 2x2 at stride 3: 4 of 9 phases
  (2, 16, 10, 8, 1, 2, 0, 1, 2),    # a grouped 1x1 downsample: 1 of 4
  # weight gradients over padded rows (linalg.WGRAD_ROWS_MIN_PIXELS positions or more), no im2col copy:
  (2, 16, 20, 16, 3, 1, 1, 1, 1),   # over two images, rows not a whole number of vectors
  (1, 32, 24, 32, 3, 1, 2, 2, 2),   # dilated, grouped
  (1, 32, 24, 16, 1, 1, 0, 1, 1),   # 1x1: no padding, x and g read as they are
  (1, 16, 27, 8, 5, 1, 0, 1, 1),    # 5x5, no padding
  (1, 3, 64, 16, 7, 2, 3, 1, 1),    # a 7x7 stride-2 stem: over its 4 phases (4x4 taps each)
  (1, 32, 56, 8, 1, 2, 0, 1, 1),    # 1x1 stride 2: over every other pixel
  (1, 3, 96, 16, 4, 4, 0, 1, 1),    # ConvNeXt's 4x4 stride-4 stem: 16 phases of one tap each
]


def _conv(case):
  n, c, h, o, k, s, p, d, g = case
  torch.manual_seed(0)
  x = torch.randn(n, c, h, h + 1)
  w = torch.randn(o, c // g, k, k)
  b = torch.randn(o)
  return x, w, b, lambda x, w, b: F.conv2d(x, w, b, stride=s, padding=p, dilation=d, groups=g)


@pytest.mark.parametrize("case", CONV_CASES, ids=str)
def test_conv_forward_and_gradients(case):
  x, w, b, conv = _conv(case)
  fn = lambda x, w, b: conv(x, w, b).sin()
  torch._dynamo.reset()
  torch_uop.reset_metrics()
  torch.testing.assert_close(torch.compile(fn, backend="uop")(x, w, b), fn(x, w, b), rtol=1e-4, atol=1e-4)
  leaves = [t.clone().requires_grad_() for t in (x, w, b)]
  got = torch.autograd.grad(torch.compile(fn, backend="uop")(*leaves).sum(), leaves)
  want = torch.autograd.grad(fn(*leaves).sum(), leaves)
  for a, e in zip(got, want): torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-3)
  assert torch_uop.metrics()["fallback_nodes_total"] == 0


def test_conv_rows_path_is_taken(monkeypatch):
  """The dense, strided (5x5 at stride 3: its phases add 1.44x the taps) and depthwise cases above run through the
  padded-rows kernel (not the direct window); a dense 3x3 at stride 2 (phases: 16 taps for 9) is an im2col GEMM."""
  calls, im2col = [], []
  real, real_im2col = linalg._row_major_conv, linalg._im2col_conv
  monkeypatch.setattr(linalg, "_row_major_conv", lambda *a: calls.append(a[1].shape) or real(*a))
  def spy_im2col(*a):
    out = real_im2col(*a)
    if out is not None: im2col.append(a[1].shape)
    return out
  monkeypatch.setattr(linalg, "_im2col_conv", spy_im2col)
  for case in (CONV_CASES[1], CONV_CASES[4], CONV_CASES[5], CONV_CASES[9]):
    x, w, b, conv = _conv(case)
    torch._dynamo.reset()
    compiled = torch.compile(conv, backend="uop", options=FRESH)   # lowered here, not served from the graph cache
    torch.testing.assert_close(compiled(x, w, b), conv(x, w, b), rtol=1e-4, atol=1e-4)
  assert len(calls) == 3 and im2col == [(8, 16, 3, 3)]


def test_conv_weight_gradient_over_rows_is_taken(monkeypatch):
  """The weight gradients of the cases with enough row positions (strided ones over their phases) and of the
  depthwise ones reduce over padded rows, the smaller dense ones over im2col rows; the rows kernel's register tile
  shares loads across output channels (core/opt.py _fewest_loads_tile), not only across the kernel's taps."""
  taken = []
  real = linalg._weight_grad_over_rows
  def spy(*a):
    out = real(*a)
    if out is not None: taken.append(a[0].shape)
    return out
  monkeypatch.setattr(linalg, "_weight_grad_over_rows", spy)
  for case in (CONV_CASES[-7], CONV_CASES[-6], CONV_CASES[-4], CONV_CASES[-3], CONV_CASES[-2], CONV_CASES[-1], CONV_CASES[8],
               CONV_CASES[10]):
    x, w, b, conv = _conv(case)
    torch._dynamo.reset()
    leaves = [t.clone().requires_grad_() for t in (x, w, b)]
    with torch_uop.debug.capture() as graphs:
      got = torch.autograd.grad(torch.compile(conv, backend="uop", options=FRESH)(*leaves).sum(), leaves[1])
    torch.testing.assert_close(got[0], torch.autograd.grad(conv(*leaves).sum(), leaves[1])[0], rtol=1e-4, atol=1e-3)
    over_rows = case != CONV_CASES[10]
    assert (x.shape in taken) == over_rows
    if over_rows and case[3] // case[8] >= 3:   # its kernel's output is [1 (batch), G, O/G, C/G, kh, kw, 1 (rows)]
      k = -(-case[4] // case[5])  # (a strided one's phase kernel)
      wgrad = next(kern for g in graphs for kern, (kind, step) in zip(g.kernels, [s for s in g.plan.steps if s[0] == "kernel"])
                   if tuple(step.shape)[-3:] == (k, k, 1) and kern.opts.upcast)
      assert 2 in dict(wgrad.opts.upcast), wgrad.opts


def test_conv_non_finite_inputs():
  """Inf and NaN reach the same outputs as in eager: the columns computed past each row's end are dropped."""
  x, w, b, conv = _conv((1, 16, 9, 8, 3, 1, 1, 1, 1))
  x[0, 3, 4, 0] = float("inf")
  x[0, 5, 0, 9] = float("nan")
  x[0, 7, 8, 9] = -float("inf")
  torch._dynamo.reset()
  torch.testing.assert_close(torch.compile(conv, backend="uop")(x, w, b), conv(x, w, b), rtol=1e-4, atol=1e-4,
                             equal_nan=True)


@pytest.mark.parametrize("m,k,n", [(197, 64, 61), (5, 33, 7), (13, 128, 200), (128, 256, 96)])
def test_matmul_partial_register_tiles(m, k, n):
  """Register tiles that do not divide M or N (a prime 197 rows, as in ViT; 128 rows in 3-row tiles where the CPU
  has 16 vector registers): the last tile is partial."""
  torch.manual_seed(0)
  a, b, bias = torch.randn(m, k), torch.randn(n, k), torch.randn(n)
  for fn in (lambda a, b, bias: F.linear(a, b, bias), lambda a, b, bias: torch.addmm(bias, a, b.T.contiguous())):
    torch._dynamo.reset()
    torch.testing.assert_close(torch.compile(fn, backend="uop")(a, b, bias), fn(a, b, bias), rtol=1e-4, atol=1e-4)


def test_register_tile_factor_prefers_a_small_partial_tail_to_a_smaller_tile():
  from torch_uop.core.opt import _block_factor
  assert _block_factor(128, 3) == 3 and _block_factor(128, 6) == 6  # 1% and 3% computed past the end
  assert _block_factor(768, 3) == 3 and _block_factor(96, 8) == 8   # the factor divides
  assert _block_factor(20, 6) == 5      # 6-row tiles would compute 24 rows: the divisor 5 instead
  assert _block_factor(9, 8) == 0       # neither a divisor down to 4 nor a tail within 15%
  assert _block_factor(5, 6) == 0       # shorter than one tile


@pytest.mark.parametrize("m,k,n,columns_outer", [(16, 256, 1536, True), (1536, 256, 16, False), (64, 64, 64, False)])
def test_gemm_loop_order_streams_the_big_operand_once(m, k, n, columns_outer):
  """x @ W.T with a weight bigger than L2 and few rows runs the column loop outermost (and split among threads), so
  the weight streams once; with the big operand on the rows, or both small, rows stay outermost."""
  torch.manual_seed(0)
  x, w, bias = torch.randn(m, k), torch.randn(n, k), torch.randn(n)
  fn = lambda x, w, bias: F.silu(F.linear(x, w, bias)) * F.linear(x, w * 0.5)  # two GEMMs in one kernel, as in a gated MLP
  with torch_uop.debug.capture() as graphs:
    out = torch.compile(fn, backend="uop", options=FRESH)(x, w, bias)
  torch.testing.assert_close(out, fn(x, w, bias), rtol=1e-4, atol=1e-4)
  gemm = next(k for k in graphs[0].kernels if any(u.op.name == "REDUCE" for u in k.ast.toposort()))
  assert gemm.opts.split_axis == (1 if columns_outer else 0)


def test_staged_panels_are_copied_once_per_panel():
  """A GEMM that copies its weight panels onto its stack runs the panel loop outermost (split among threads) even
  where the rows' operand is as big as the weight, so each panel is copied once, not once per tile of rows
  (BERT-512's weight gradient dh.t() @ x: both 1.5 MiB); the result matches eager."""
  torch.manual_seed(0)
  dh, x = torch.randn(512, 768), torch.randn(512, 768)
  fn = lambda dh, x: dh.t() @ x
  with torch_uop.debug.capture() as graphs:
    out = torch.compile(fn, backend="uop", options=FRESH)(dh, x)
  torch.testing.assert_close(out, fn(dh, x), rtol=1e-4, atol=1e-3)
  gemm = next(k for k in graphs[0].kernels if any(u.op.name == "REDUCE" for u in k.ast.toposort()))
  outs = [tuple(step.shape) for kind, step in graphs[0].plan.steps if kind == "kernel"]
  assert (768, 768 // linalg.PANEL, linalg.PANEL, 1) in outs  # panels staged in the GEMM: no packed copy before it
  assert gemm.opts.split_axis == 1                          # the panel axis outermost


@pytest.mark.parametrize("m,k,n", [(64, 128, 8192), (97, 256, 4096), (64, 128, 8160), (32, 128, 8192), (256, 128, 8192),
                                   (256, 512, 1024), (197, 192, 768), (64, 768, 768), (128, 896, 2048), (64, 4608, 256),
                                   (64, 9216, 128), (64, 768, 6144)])
@pytest.mark.parametrize("transposed", [False, True], ids=["x@W", "x@W.T"])
def test_gemm_over_packed_weight_panels(m, k, n, transposed):
  """x @ W with W [K, N] bigger than linalg.SWEEP_CACHE_BYTES (GPT-2's Conv1D layers), or x @ W.T with W [N, K]
  bigger than linalg.PACK_MIN_BYTES or reduced over at most linalg.PACK_SHORT_K (nn.Linear), reads W through panels
  of linalg.PANEL columns copied contiguous, when N is whole panels and there are rows enough to reuse them (for
  x @ W.T on a CPU with 16 vector registers: from linalg.PACK_MIN_ROWS rows, a W within SWEEP_CACHE_BYTES, a K of at
  most SHORT_REDUCE_PER_ROW times the rows or an x past SWEEP_CACHE_BYTES); the result, a fused epilogue and the
  gradients match eager either way. A panel within the CPU's stage_bytes (runtime/cpu.py stage_budget, at most 1 MiB)
  is packed by the GEMM kernel itself into a local array (no copy in memory); a longer one is copied by a kernel
  first."""
  from torch_uop.runtime.cpu import vector_unit
  if transposed and vector_unit().registers < 32:  # 16 registers
    w_within_l2, x_past_l2 = k * n * 4 <= linalg.SWEEP_CACHE_BYTES, m * k * 4 > linalg.SWEEP_CACHE_BYTES
    short_k = k <= linalg.SHORT_REDUCE_PER_ROW * m
    packed = m >= linalg.PACK_MIN_ROWS and n % linalg.PANEL == 0 and (w_within_l2 or short_k or x_past_l2)
  elif transposed:  # 32 registers: a K of at most PACK_SHORT_K, or a W from PACK_MIN_BYTES
    short_k, big_w = k <= linalg.PACK_SHORT_K, k * n * 4 >= linalg.PACK_MIN_BYTES
    packed = m >= linalg.PACK_MIN_ROWS and n % linalg.PANEL == 0 and (short_k or big_w)
  else:  # x @ W packs from SWEEP_CACHE_BYTES on any CPU, not PACK_MIN_BYTES
    packed = m >= linalg.PACK_MIN_ROWS and n % linalg.PANEL == 0 and k * n * 4 >= linalg.SWEEP_CACHE_BYTES
  torch.manual_seed(0)
  x, w, bias = torch.randn(m, k, requires_grad=True), torch.randn(*((n, k) if transposed else (k, n)), requires_grad=True), torch.randn(n)
  if transposed: fn = lambda x, w, bias: F.gelu(F.linear(x, w, bias))
  else: fn = lambda x, w, bias: F.gelu(torch.addmm(bias, x, w), approximate="tanh")
  torch._dynamo.reset()
  with torch_uop.debug.capture() as graphs:
    got = torch.compile(fn, backend="uop", options=FRESH)(x, w, bias)
  want = fn(x, w, bias)
  scale = max(1.0, (k / 256) ** 0.5)  # the rounding of a sum of k products grows like its size, sqrt(k)
  torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * scale)
  g = torch.randn_like(want)
  for a, b in zip(torch.autograd.grad(got, (x, w), g), torch.autograd.grad(want, (x, w), g)):
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-3 * scale)
  staged = packed and k * linalg.PANEL * 4 <= vector_unit().stage_bytes
  outs = [tuple(step.shape) for kind, step in graphs[0].plan.steps if kind == "kernel"]  # the copy into panels
  assert ((n // linalg.PANEL, k, linalg.PANEL) in outs) == (packed and not staged)
  local_arrays = [u.arg[1] for kern in graphs[0].kernels for u in kern.program if u.op is Ops.DEFINE_LOCAL]
  assert (k * linalg.PANEL in local_arrays) == staged  # one panel, packed inside the GEMM


@pytest.fixture
def stack_env(monkeypatch):
  """Set OMP_STACKSIZE and friends through monkeypatch; the CPU description is read again after each change."""
  cpu.vector_unit.cache_clear()
  yield monkeypatch
  monkeypatch.undo()
  cpu.vector_unit.cache_clear()


def test_stage_budget_follows_the_threads_stacks(stack_env):
  """Local copies live on the stack of the thread running the kernel: their budget is a quarter of the smallest
  stack a kernel's thread may have (OMP_STACKSIZE, libgomp's GOMP_STACKSIZE in kilobytes, RLIMIT_STACK), at most
  1 MiB."""
  import resource
  stack_env.delenv("OMP_STACKSIZE", raising=False)
  stack_env.delenv("GOMP_STACKSIZE", raising=False)
  soft = resource.getrlimit(resource.RLIMIT_STACK)[0]
  main = cpu.DEFAULT_THREAD_STACK if soft == resource.RLIM_INFINITY else soft
  assert cpu.thread_stack_bytes() == main
  for value, size in [("256K", 256 << 10), ("1m", 1 << 20), ("300", 300 << 10), ("4096B", 4096), ("64 M", 64 << 20)]:
    stack_env.setenv("OMP_STACKSIZE", value)
    assert cpu.thread_stack_bytes() == min(size, main), value
    assert cpu.stage_budget() == min(1 << 20, min(size, main) // 4)
  stack_env.delenv("OMP_STACKSIZE")
  stack_env.setenv("GOMP_STACKSIZE", "512")  # kilobytes
  assert cpu.thread_stack_bytes() == min(512 << 10, main)
  stack_env.setenv("GOMP_STACKSIZE", "a lot")  # not a size: ignored, as libgomp ignores it
  assert cpu.thread_stack_bytes() == main


def test_small_thread_stacks_keep_panels_in_memory(stack_env):
  """Where the threads' stacks are small (OMP_STACKSIZE=256K: a 64 KiB budget), a 96 KiB panel is not copied onto
  the stack: the GEMM reads a packed buffer a kernel made first, and matches eager."""
  stack_env.setenv("OMP_STACKSIZE", "256K")
  assert cpu.vector_unit().stage_bytes == 64 << 10
  torch.manual_seed(0)
  x, w = torch.randn(256, 768), torch.randn(3072, 768)
  fn = lambda x, w: F.linear(x, w)
  torch._dynamo.reset()
  with torch_uop.debug.capture() as graphs:
    got = torch.compile(fn, backend="uop", options=FRESH)(x, w)
  torch.testing.assert_close(got, fn(x, w), rtol=1e-4, atol=1e-3)
  assert not any(u.op is Ops.DEFINE_LOCAL and u.arg[1] == 768 * linalg.PANEL for k in graphs[0].kernels for u in k.program)
  assert (3072 // linalg.PANEL, 768, linalg.PANEL) in [tuple(s.shape) for kind, s in graphs[0].plan.steps if kind == "kernel"]


def test_frozen_weight_panels_are_packed_once():
  """With frozen weights, the panels a GEMM would pack inside its kernel (LT.staged) are packed once, by a kernel of
  the prologue, and the GEMM reads them from memory; after the weight changes they are packed again."""
  torch.manual_seed(0)
  lin = torch.nn.Linear(768, 2048).eval()
  x = torch.randn(128, 768)
  torch._dynamo.reset()
  with torch_uop.debug.capture() as graphs, torch.no_grad():
    f = torch.compile(lin, backend="uop", options={**FRESH, "freezing": True})
    torch.testing.assert_close(f(x), lin(x), rtol=1e-4, atol=1e-4)
    g = graphs[0]
    panels = [i for i, (kind, step) in enumerate(g.plan.steps) if kind == "kernel" and tuple(step.shape) == (2048 // linalg.PANEL, 768, linalg.PANEL)]
    assert panels and set(panels) <= set(g.prologue), g.step_names
    assert not any(u.op is Ops.DEFINE_LOCAL for kern in g.kernels for u in kern.program)
    lin.weight.add_(0.5)
    torch.testing.assert_close(f(x), lin(x), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("t,m,n,copied", [(256, 384, 128, True), (200, 96, 72, True), (256, 384, 48, False),
                                          (64, 384, 128, False), (256, 32, 128, False)])
def test_gemm_copies_a_transposed_left_operand_row_major(t, m, n, copied):
  """A weight gradient's dh.t() @ x reads dh down its columns; with rows and columns enough for the strips of a to
  be read again (linalg._copies_transposed_a), dh.t() (with the product that makes it) is copied row-major first.
  The result and the gradients of a linear layer (whose weight gradient takes that path) match eager either way."""
  torch.manual_seed(0)
  h, g, x = torch.randn(t, m), torch.randn(t, m), torch.randn(t, n)
  fn = lambda h, g, x: (h * g).t() @ x
  torch._dynamo.reset()
  with torch_uop.debug.capture() as graphs:
    got = torch.compile(fn, backend="uop", options=FRESH)(h, g, x)
  torch.testing.assert_close(got, fn(h, g, x), rtol=1e-4, atol=1e-4)
  outs = [tuple(step.shape) for kind, step in graphs[0].plan.steps if kind == "kernel"]
  assert ((m, t) in outs) == copied, outs
  x = torch.randn(t, n, requires_grad=True)
  lin = torch.nn.Linear(n, m)
  torch._dynamo.reset()
  out = torch.compile(lin, backend="uop", options=FRESH)(x)
  gw, gx = torch.autograd.grad(out, (lin.weight, x), g)
  want_w, want_x = torch.autograd.grad(lin(x), (lin.weight, x), g)
  torch.testing.assert_close(gw, want_w, rtol=1e-4, atol=1e-3)
  torch.testing.assert_close(gx, want_x, rtol=1e-4, atol=1e-3)


def test_output_reshape_of_computed_buffer_is_not_copied():
  x = torch.randn(16, 3, 2)
  fn = lambda x: (x * 2).sum(1).reshape(4, 8)
  with torch_uop.debug.capture() as graphs:
    out = torch.compile(fn, backend="uop", options=FRESH)(x)
  torch.testing.assert_close(out, fn(x))
  assert out.shape == (4, 8) and out.is_contiguous()
  assert len(graphs[0].kernels) == 1


@pytest.mark.parametrize("fn", [lambda x: (x * 2)[:, 0], lambda x: (x * 2)[:, :4], lambda x: (x * 2)[:, 1]],
                         ids=["first", "leading", "second"])
def test_output_slice_of_computed_buffer(fn):
  # a leading slice has contiguous strides too, but is not a reshape of the whole buffer
  x = torch.randn(1, 17, 64)
  torch._dynamo.reset()
  torch.testing.assert_close(torch.compile(fn, backend="uop")(x), fn(x))


def test_costly_shared_expression_realized_once():
  """A max-pool backward read by BatchNorm's two gradient reductions and its input gradient: realized once."""
  torch.manual_seed(0)
  m = torch.nn.Sequential(torch.nn.BatchNorm2d(8), torch.nn.ReLU(), torch.nn.MaxPool2d(3, 2, 1))
  x = torch.randn(2, 8, 12, 12, requires_grad=True)
  torch._dynamo.reset()
  with torch_uop.debug.capture() as graphs:
    got = torch.autograd.grad(torch.compile(m, backend="uop", options=FRESH)(x).pow(2).sum(), [x, *m.parameters()])
  want = torch.autograd.grad(m(x).pow(2).sum(), [x, *m.parameters()])
  for a, e in zip(got, want): torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-4)
  backward = graphs[-1]
  # the pooled gradient's scatter back to the input is computed by one kernel (compares of indices with positions)
  gathers = [k for k, src in zip(backward.kernels, backward.sources) if "icmp eq i64" in src]
  assert len(gathers) == 1


@pytest.mark.parametrize("n,vocab,padding_idx", [(7, 11, None), (50, 13, 3), (1, 5, 0), (64, 1000, 999)])
def test_embedding_gradient_with_repeated_indices(n, vocab, padding_idx):
  """The table's gradient from per-token sums: repeated indices add up, the padding row stays zero."""
  torch.manual_seed(0)
  idx = torch.randint(0, vocab, (2, n))
  idx[0, 0] = idx[1, -1]
  if padding_idx is not None: idx[1, 0] = padding_idx
  emb = torch.nn.Embedding(vocab, 6, padding_idx=padding_idx)
  fn = lambda w, i: F.embedding(i, w, padding_idx=padding_idx).sin().sum()
  w = emb.weight.detach().clone().requires_grad_()
  torch._dynamo.reset()
  torch_uop.reset_metrics()
  got, = torch.autograd.grad(torch.compile(fn, backend="uop")(w, idx), [w])
  want, = torch.autograd.grad(fn(w, idx), [w])
  torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
  assert torch_uop.metrics()["fallback_nodes_total"] == 0


@pytest.mark.parametrize("heads,length,head_size", [(2, 64, 16), (3, 48, 64), (2, 40, 16), (1, 32, 128)])
def test_attention_scores_with_short_head_size(heads, length, head_size):
  """q @ k.T over a head size below linalg.SHORT_REDUCE reads k laid out along the keys (SIMD along N, when the keys
  are whole vectors); forward and gradients match eager."""
  torch.manual_seed(0)
  q, k = (torch.randn(heads, length, head_size, requires_grad=True) for _ in range(2))
  fn = lambda q, k: torch.softmax(q @ k.transpose(-1, -2) / head_size ** 0.5, -1)
  torch._dynamo.reset()
  with torch_uop.debug.capture() as graphs:
    got = torch.compile(fn, backend="uop", options=FRESH)(q, k)
  torch.testing.assert_close(got, fn(q, k), rtol=1e-4, atol=1e-5)
  g = torch.randn_like(got)
  gq, gk = torch.autograd.grad(got, (q, k), g)
  eq, ek = torch.autograd.grad(fn(q, k), (q, k), g)
  torch.testing.assert_close(gq, eq, rtol=1e-4, atol=1e-5)
  torch.testing.assert_close(gk, ek, rtol=1e-4, atol=1e-5)
  scores = next(k for k in graphs[0].kernels if any(u.op.name == "REDUCE" for u in k.ast.toposort()))
  along_n = head_size < linalg.SHORT_REDUCE and length % 16 == 0
  assert (scores.opts.vector_axis is not None) == along_n


@pytest.mark.parametrize("cols,cached", [(256, True), (16384, False)])
def test_softmax_row_keeps_its_exponentials(cols, cached):
  """Softmax's exp(x - max) is computed once per element: the sum's loop stores it to a scratch row that the output
  pass reads back (codegen._cache_row_values), unless the row is longer than ROW_CACHE_BYTES. NaN, +-inf and
  all -inf rows give eager's answers either way."""
  from torch_uop.core import codegen
  from torch_uop.core.uop import Ops
  torch.manual_seed(0)
  x = torch.randn(6, cols) * 4
  x[1, 3] = float("nan"); x[2, :] = float("-inf"); x[3, 5] = float("inf"); x[4, 7] = float("-inf")
  fns = [lambda x: torch.softmax(x * 0.5, -1), lambda x: torch.log_softmax(x, -1), lambda x: torch.softmax(x, 0)]
  for fn in fns:
    torch._dynamo.reset()
    with torch_uop.debug.capture() as graphs:
      got = torch.compile(fn, backend="uop", options=FRESH)(x)
    torch.testing.assert_close(got, fn(x), equal_nan=True)
  torch._dynamo.reset()
  with torch_uop.debug.capture() as graphs:
    torch.compile(fns[0], backend="uop", options=FRESH)(x)
  scratch = [u for k in graphs[0].kernels for u in k.program if u.op is Ops.DEFINE_LOCAL]
  assert len(scratch) == (1 if cached else 0)
  assert cols * 4 > codegen.ROW_CACHE_BYTES or cached


@pytest.mark.parametrize("n,c,h,o,k", [(1, 3, 64, 48, 16), (2, 3, 35, 16, 4), (1, 8, 12, 8, 2)])
def test_patch_embedding_is_one_gemm(n, c, h, o, k):
  """A convolution with kernel == stride and no padding (ViT's patch embedding, ConvNeXt's stem; 35 leaves a
  remainder the convolution drops) is a GEMM over the input cut into patches, reducing over c*k*k taps; forward
  and gradients match eager."""
  torch.manual_seed(0)
  x = torch.randn(n, c, h, h + 1, requires_grad=True)
  w = torch.randn(o, c, k, k, requires_grad=True)
  b = torch.randn(o, requires_grad=True)
  fn = lambda x, w, b: F.conv2d(x, w, b, stride=k)
  torch._dynamo.reset()
  with torch_uop.debug.capture() as graphs:
    got = torch.compile(fn, backend="uop", options=FRESH)(x, w, b)
  torch.testing.assert_close(got, fn(x, w, b), rtol=1e-4, atol=1e-4)
  g = torch.randn_like(got)
  for a, e in zip(torch.autograd.grad(got, (x, w, b), g), torch.autograd.grad(fn(x, w, b), (x, w, b), g)):
    torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-4)
  reduce_lengths = {r.src[0].arg for kern in graphs[0].kernels for u in kern.ast.toposort() if u.op.name == "REDUCE"
                    for r in u.src[1:]}
  assert reduce_lengths == {c * k * k}


@pytest.mark.parametrize("n,vectors", [(64, 2), (48, 1)])
def test_gemm_register_tile_is_two_vector_registers_wide(n, vectors):
  """x @ W's SIMD axis takes two of this CPU's vector registers per row where N allows (runtime/cpu.py simd_lanes:
  16 float32 with AVX-512, 8 with AVX2), else one, and the rows are the blocked axis (they share W's vectors)."""
  from torch_uop.runtime.cpu import simd_lanes
  lanes = simd_lanes()
  if n % (2 * lanes) == 0 and vectors == 1: n += lanes  # 48 is whole double-width tiles on a 4- or 8-lane CPU
  torch.manual_seed(0)
  x, w = torch.randn(64, 96), torch.randn(96, n)
  with torch_uop.debug.capture() as graphs:
    out = torch.compile(lambda x, w: x @ w, backend="uop", options=FRESH)(x, w)
  torch.testing.assert_close(out, x @ w, rtol=1e-4, atol=1e-4)
  gemm = next(k for k in graphs[0].kernels if any(u.op.name == "REDUCE" for u in k.ast.toposort()))
  upcast = dict(gemm.opts.upcast)
  assert upcast[gemm.opts.vector_axis] == vectors * lanes
  assert set(upcast) == {0, gemm.opts.vector_axis}


@pytest.mark.parametrize("n", [1024, 1000])
def test_matrix_vector_product_streams_wide_runs_of_each_row(n):
  """x @ W + b for a single row x and a row-major W (GPT-2's Conv1D layers while decoding): no axis can be blocked
  beside the SIMD one, so its tile is half the vector registers wide where that divides N into at least four tiles
  (core/opt.py _wide_simd: each step reads 1 KB of a row on AVX-512, not 128 B); the result matches eager either way."""
  from torch_uop.runtime.cpu import vector_unit
  unit = vector_unit()
  torch.manual_seed(0)
  x, w, b = torch.randn(1, 768), torch.randn(768, n), torch.randn(n)
  fn = lambda x, w, b: torch.addmm(b, x, w)
  with torch_uop.debug.capture() as graphs:
    out = torch.compile(fn, backend="uop", options=FRESH)(x, w, b)
  torch.testing.assert_close(out, fn(x, w, b), rtol=1e-4, atol=1e-4)
  gemv = next(k for k in graphs[0].kernels if any(u.op.name == "REDUCE" for u in k.ast.toposort()))
  width = dict(gemv.opts.upcast).get(gemv.opts.vector_axis, 0)  # (1000 columns: no whole vectors, no SIMD axis)
  wide = unit.registers // 2 * unit.lanes
  assert (width == wide) == (n % wide == 0 and n // wide >= 4), gemv.opts


TRANSPOSING_COPIES = [
  # (input shape, view of it that is copied, the loop order the copy runs in)
  ((96, 64), lambda b: b.reshape(96, 2, 32).permute(1, 0, 2), (1, 0, 2)),                  # packing a weight into panels
  ((2, 24, 4, 16), lambda x: x.permute(0, 2, 1, 3), (0, 2, 1, 3)),                          # attention heads out of (B, S, H, D)
  ((2, 4, 24, 16), lambda x: x.permute(0, 2, 1, 3), (0, 2, 1, 3)),                          # and back
  ((5, 6, 7), lambda x: x.permute(1, 0, 2), ()),                                            # rows of 7 floats: under a cache line
  ((3, 40, 20), lambda x: x.expand(6, 3, 40, 20).permute(1, 0, 2, 3), ()),                  # a broadcast axis keeps its place
  ((4, 8, 32), lambda x: x * 2, ()),                                                        # same layout: axis order
]


@pytest.mark.parametrize("shape,view,order", TRANSPOSING_COPIES, ids=range(len(TRANSPOSING_COPIES)))
def test_transposing_copy_reads_its_source_in_order(shape, view, order):
  """A copy into another layout nests its output loops so the loads walk the source row after row (core/opt.py
  _read_order), with the stored axis innermost."""
  torch.manual_seed(0)
  x = torch.randn(shape)
  fn = lambda x: view(x).contiguous() + 1
  with torch_uop.debug.capture() as graphs:
    out = torch.compile(fn, backend="uop", options=FRESH)(x)
  torch.testing.assert_close(out, fn(x))
  (kernel,) = graphs[0].kernels
  assert kernel.opts.loop_order == order
  assert kernel.opts.split_axis == (order[0] if order else 0)


@pytest.mark.parametrize("s,d", [(77, 64), (197, 32), (100, 16)])
def test_attention_scores_over_a_partial_vector_of_keys(s, d):
  """q @ k.T with a short head size and a key count that is not whole vectors: k is copied along N padded to whole
  vectors, so the scores GEMM has SIMD along the keys (linalg.matmul), and the padding columns are dropped."""
  torch.manual_seed(0)
  q, k = torch.randn(2, 3, s, d, requires_grad=True), torch.randn(2, 3, s, d, requires_grad=True)
  fn = lambda q, k: torch.softmax(q @ k.transpose(-1, -2) * d ** -0.5, -1)
  with torch_uop.debug.capture() as graphs:
    out = torch.compile(fn, backend="uop", options=FRESH)(q, k)
  ref = fn(q, k)
  torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
  g = torch.randn_like(ref)
  torch.testing.assert_close(torch.autograd.grad(out, (q, k), g), torch.autograd.grad(ref, (q, k), g), rtol=1e-4, atol=1e-4)
  scores = next(kn for kn in graphs[0].kernels if any(u.op.name == "REDUCE" for u in kn.ast.toposort()) and kn.opts.upcast)
  assert scores.opts.vector_axis is not None


def test_transposing_kernel_with_heavy_math_is_vectorized():
  """An elementwise kernel computing GELU's backward from a channels-last tensor into NCHW (ConvNeXt's MLP) reads
  with a stride along its innermost loop; its loop is still marked for LLVM to vectorize (llvmir's
  _forced_simd_loops), a transposing copy's is not. Both match eager, NaN and Inf included."""
  torch.manual_seed(0)
  h, g = torch.randn(1, 6, 7, 40), torch.randn(1, 40, 6, 7)
  h[0, 1, 2, 3], h[0, 2, 3, 4], h[0, 3, 4, 5] = float("nan"), float("inf"), -float("inf")
  heavy = lambda h, g: g * torch.ops.aten.gelu_backward(torch.ones_like(h), h).permute(0, 3, 1, 2)
  copy = lambda h, g: g + h.permute(0, 3, 1, 2)
  for fn, forced in ((heavy, True), (copy, False)):
    torch._dynamo.reset()
    with torch_uop.debug.capture() as graphs:
      got = torch.compile(fn, backend="uop", options=FRESH)(h, g)
    torch.testing.assert_close(got, fn(h, g), rtol=1e-5, atol=1e-5, equal_nan=True)
    (source,) = graphs[0].sources
    assert ("!llvm.loop !4" in source) == forced


# (batch, heads, query rows, keys, head size, mask, causal): blocks of 8 query rows (and, in the backward, keys)
ATTENTION_BLOCK_CASES = [
  (1, 2, 40, 40, 16, None, False),     # 5 even blocks
  (2, 3, 37, 37, 8, None, True),       # causal, uneven length: the blocks' rows and keys keep their true positions
  (1, 2, 33, 50, 16, "bool", False),   # cross attention, a boolean mask per (row, key), one row masked whole
  (2, 1, 24, 32, 16, "float", False),  # an additive mask per batch entry, broadcast over heads
  (1, 2, 32, 24, 64, "keys", False),   # a mask per key only, head size 64
  (1, 2, 192, 200, 64, None, False),   # 24 blocks: the output and dq join as a tree of concats (movement.concat)
]


@pytest.mark.parametrize("case", ATTENTION_BLOCK_CASES)
def test_attention_by_blocks_of_rows(monkeypatch, case):
  """Attention whose scores exceed nn.ATTENTION_BLOCK_BYTES runs by blocks of query rows, forward and backward (whose
  blocks give dq and add their shares to dk and dv); output and gradients match eager with masks, causality, cross
  attention and a fully masked row."""
  from torch_uop.lowering import nn as lnn
  b, h, lq, lk, d, mask, causal = case
  monkeypatch.setattr(lnn, "ATTENTION_BLOCK_MIN", 8)
  monkeypatch.setattr(lnn, "ATTENTION_BLOCK_BYTES", b * h * max(lq, lk) * 4 * 8)
  torch.manual_seed(0)
  q = torch.randn(b, h, lq, d, requires_grad=True)
  k, v = (torch.randn(b, h, lk, d, requires_grad=True) for _ in range(2))
  kw = dict(is_causal=causal)
  if mask == "bool":
    kw["attn_mask"] = torch.rand(lq, lk) > 0.3
    kw["attn_mask"][5] = False
  elif mask == "float": kw["attn_mask"] = torch.randn(b, 1, lq, lk)
  elif mask == "keys": kw["attn_mask"] = torch.rand(1, lk) > 0.2
  graphs = _attention_matches_eager(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, **kw), q, k, v)
  rows = lnn._blocks((b, h), lq, lk)
  assert len(rows) >= 3
  block_rows = {e - s for s, e in rows}
  forward, backward = (_kernel_shapes(g) for g in (graphs[0], graphs[-1]))
  assert sum(any(_holds(shape, (h, r, lk)) for r in block_rows) for shape in forward) >= len(rows)
  assert not any(_holds(shape, (h, lq, lk)) for shape in forward)  # no kernel writes the scores whole
  assert sum(any(_holds(shape, (h, r, lk)) for r in block_rows) for shape in backward) >= len(rows)
  assert not any(_holds(shape, (h, lq, lk)) for shape in backward)


@pytest.mark.parametrize("sizes", [[7] * 13, [5, 9, 1, 12, 3, 8, 8, 2, 11, 6, 4]])
def test_concat_of_many_parts_joins_as_a_tree(sizes):
  """A concat of many parts is built as a tree of concats of at most CONCAT_MAX_PARTS parts, each written out, so no
  kernel selects among all the parts at every element; forward and gradients match eager (even and uneven parts,
  joined along a middle dim and read through a transpose, as attention's blocks are)."""
  from torch_uop.lowering import movement
  torch.manual_seed(0)
  parts = [torch.randn(6, n, 256, requires_grad=True) for n in sizes]
  scales = [torch.rand(6, n, 1) for n in sizes]
  fn = lambda *ps: torch.cat([p * s for p, s in zip(ps, scales)], 1).transpose(0, 1).reshape(sum(sizes), 6 * 256)
  torch._dynamo.reset()
  torch_uop.reset_metrics()
  with torch_uop.debug.capture() as graphs:
    got = torch.compile(fn, backend="uop", options=FRESH)(*parts)
    grads = torch.autograd.grad(got, parts, torch.ones_like(got))
  want = fn(*parts)
  torch.testing.assert_close(got, want)
  for g, w in zip(grads, torch.autograd.grad(want, parts, torch.ones_like(want))): torch.testing.assert_close(g, w)
  assert torch_uop.metrics()["fallback_nodes_total"] == 0
  loads = [sum(1 for u in k.ast.toposort() if u.op is Ops.LOAD) for k in graphs[0].kernels]
  assert len(sizes) > movement.CONCAT_MAX_PARTS and max(loads) <= 2 * movement.CONCAT_MAX_PARTS  # (a part and its scale)


def _blocked_backward(monkeypatch, length: int, block_rows: int, d: int = 8) -> tuple:
  """Attention over 1x2 heads of `length` tokens in blocks of `block_rows` query rows, checked against eager: (the
  backward graph, the blocks, a block's scores bytes, a share's bytes)."""
  from torch_uop.lowering import nn as lnn
  b, h = 1, 2
  monkeypatch.setattr(lnn, "ATTENTION_BLOCK_MIN", 8)
  monkeypatch.setattr(lnn, "ATTENTION_BLOCK_BYTES", b * h * length * 4 * block_rows)
  torch.manual_seed(0)
  q, k, v = (torch.randn(b, h, length, d, requires_grad=True) for _ in range(3))
  graphs = _attention_matches_eager(lambda q, k, v: F.scaled_dot_product_attention(q, k, v), q, k, v)
  return graphs[-1], lnn._blocks((b, h), length, length), b * h * block_rows * length * 4, b * h * d * length * 4


def test_attention_backward_blocks_run_in_turn(monkeypatch):
  """The scheduler runs each backward block's products right after its probabilities (core/schedule.py
  _freeing_first_order), so the arena holds a few blocks' scores at a time, not every block's: in graph order the
  products of dk and dv would all run after the last block, with each block's probabilities and score gradients
  alive until then (1.06 MiB of arena here, against 0.39 MiB)."""
  backward, rows, block_bytes, share_bytes = _blocked_backward(monkeypatch, 256, 32)
  assert len(rows) == 8
  # of the scores-sized buffers, only the current block's few (and at most every block's shares of dk and dv)
  assert backward.plan.arena_bytes <= 4 * block_bytes + 2 * len(rows) * share_bytes


def test_attention_backward_sums_key_shares_as_they_come(monkeypatch):
  """With many blocks, the backward's shares of dk and dv are summed in groups as they come (nn.SHARE_SUM_GROUP), so
  a few of them are alive at a time, not one per block: 32 blocks here, 0.70 MB of arena against 2.27 MB when every
  share lived to the end (a UNet at 64x64 latents: 128 blocks, 512 MB of shares)."""
  from torch_uop.lowering import nn as lnn
  backward, rows, block_bytes, share_bytes = _blocked_backward(monkeypatch, 512, 16)
  assert len(rows) == 32
  assert backward.plan.arena_bytes <= 4 * block_bytes + 4 * lnn.SHARE_SUM_GROUP * share_bytes


def test_attention_backward_products_wait_for_their_blocks(monkeypatch):
  """Each block's do_i @ v^T (rows x keys) reads a slice of do, so it does not condense what it reads and runs when
  its block does (core/schedule.py _freeing_first_order, sliced): Whisper's shape, 12 blocks of 125 rows, 14.3 MB of
  arena against 24.1 MB when every block's product ran first and was held until its block came."""
  backward, rows, block_bytes, _ = _blocked_backward(monkeypatch, 1500, 125, d=64)
  assert len(rows) == 12
  assert backward.plan.arena_bytes <= 10 * block_bytes


def _attention_matches_eager(fn, q, k, v) -> list:
  """Compile fn, check its output and the gradients of q, k, v against eager (no fallback); the graphs compiled."""
  torch._dynamo.reset()
  torch_uop.reset_metrics()
  with torch_uop.debug.capture() as graphs:
    got = torch.compile(fn, backend="uop", options=FRESH)(q, k, v)
    grads = torch.autograd.grad(got, (q, k, v), torch.ones_like(got))
  want = fn(q, k, v)
  torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, equal_nan=True)
  for a, e in zip(grads, torch.autograd.grad(want, (q, k, v), torch.ones_like(want))):
    torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-4, equal_nan=True)
  assert torch_uop.metrics()["fallback_nodes_total"] == 0
  return graphs


def _kernel_shapes(graph) -> list:
  return [step.shape for kind, step in graph.plan.steps if kind == "kernel"]


def _holds(shape: tuple, sizes: tuple) -> bool:
  """Whether `sizes` appear as consecutive dims of a kernel's output shape (scores: heads, rows, keys)."""
  return any(tuple(shape[i:i + len(sizes)]) == sizes for i in range(len(shape)))


TRANSPOSE_TILES = [
  # (input shape, the transposing view copied, the (load axis, store axis) of the output tiled, or None)
  ((96, 64), lambda w: w.t(), (1, 0)),                                    # a weight transposed for x @ W.T
  ((2, 3, 40, 16), lambda k: k.transpose(-1, -2), (3, 2)),               # attention's k^T, heads kept
  ((1, 16, 16, 24), lambda x: x.permute(0, 3, 1, 2), (1, 3)),            # NHWC -> NCHW
  ((1, 24, 16, 16), lambda x: x.permute(0, 2, 3, 1), (2, 3)),            # NCHW -> NHWC
  ((30, 64), lambda w: w.t(), (1, 0)),                                   # 30 rows: the last tile overlaps the one before
  ((197, 36), lambda w: w.t(), (1, 0)),                                  # neither size divides (ViT's 197 tokens)
  ((6, 64), lambda w: w.t(), None),                                      # 6 rows: shorter than a tile
  ((96, 64), lambda w: w.t().sin(), None),                               # heavy math per element
  ((64, 64), lambda w: w * w[0, :, None] + 1, None),                     # a row's scale: a broadcast, not a transpose
]


def test_a_gathered_row_plus_an_output_is_not_a_transpose():
  """An embedding lookup added to a row-major tensor (GPT-2's token and position embeddings): the index load moves
  along rows and stays put along the columns, which is no transposition, so the kernel is not tiled."""
  torch.manual_seed(0)
  table, pos = torch.randn(50, 64), torch.randn(40, 64)
  idx = torch.randint(0, 50, (40,))
  fn = lambda table, idx, pos: table[idx] + pos * 2
  torch._dynamo.reset()
  with torch_uop.debug.capture() as graphs:
    out = torch.compile(fn, backend="uop", options=FRESH)(table, idx, pos)
  torch.testing.assert_close(out, fn(table, idx, pos))
  assert graphs[0].kernels and all(k.opts.upcast == () for k in graphs[0].kernels)


@pytest.mark.parametrize("shape,view,axes", TRANSPOSE_TILES, ids=range(len(TRANSPOSE_TILES)))
def test_transposing_copy_is_tiled_square(shape, view, axes):
  """A copy that loads contiguously along one output axis and stores along another is tiled `lanes` x `lanes` over
  both (core/opt.py _transpose_tile: vector loads, a transpose in registers, vector stores); NaN and Inf go through."""
  torch.manual_seed(0)
  x = torch.randn(shape)
  x.view(-1)[:3] = torch.tensor([float("nan"), float("inf"), -float("inf")])
  fn = lambda x: view(x).contiguous() * 2
  torch._dynamo.reset()
  with torch_uop.debug.capture() as graphs:
    out = torch.compile(fn, backend="uop", options=FRESH)(x)
  torch.testing.assert_close(out, fn(x), equal_nan=True)
  (kernel,) = graphs[0].kernels
  tiled = tuple(a for a, f in kernel.opts.upcast if f > 1)
  assert tiled == (tuple(sorted(axes)) if axes else ())
  from torch_uop.runtime.cpu import vector_unit
  assert all(f == vector_unit().lanes for _, f in kernel.opts.upcast)  # a square of one vector register's lanes


@pytest.mark.parametrize("shape,fn", [
  ((197, 768), lambda x: x.sum(0)),                                   # a linear layer's bias gradient
  ((3, 50, 64), lambda x: (x * x).sum(1)),                            # a middle axis, a product summed
  ((40, 96), lambda x: x.amax(0)),                                    # a max: NaN propagates along each column
])
def test_column_reduction_is_simd_along_the_output(shape, fn):
  """A reduction over an axis its loads cross with a stride, along an output axis they walk contiguously, runs SIMD
  along that output axis (vector accumulators, one vector load per row) instead of one strided scalar chain per
  output (core/opt.py heuristic_opts); NaN and Inf go through as in eager."""
  torch.manual_seed(0)
  x = torch.randn(shape)
  x.view(-1)[[5, 70, 200]] = torch.tensor([float("nan"), float("inf"), -float("inf")])
  torch._dynamo.reset()
  with torch_uop.debug.capture() as graphs:
    out = torch.compile(fn, backend="uop", options=FRESH)(x)
  torch.testing.assert_close(out, fn(x), equal_nan=True, rtol=1e-5, atol=1e-4)
  (kernel,) = graphs[0].kernels
  assert kernel.opts.vector_axis == x.dim() - 1  # (the kernel keeps the reduced axis, of size 1)


@pytest.mark.parametrize("case,phases", [(CONV_CASES[11], 4), (CONV_CASES[12], 1), (CONV_CASES[1], 4)])
def test_strided_input_gradient_computes_only_reachable_phases(monkeypatch, case, phases):
  """The input gradient of a strided convolution is one stride-1 convolution over the phases its kernel reaches
  (linalg._strided_input_grad): C * min(k, s)^2 output channels, not C * s^2 of which the rest are zeros."""
  calls = []
  real = linalg.conv
  monkeypatch.setattr(linalg, "conv", lambda x, w, *a: calls.append(w.shape[0]) or real(x, w, *a))
  x, w, b, conv = _conv(case)
  torch._dynamo.reset()
  leaves = [t.clone().requires_grad_() for t in (x, w, b)]
  got = torch.autograd.grad(torch.compile(conv, backend="uop", options=FRESH)(*leaves).sum(), leaves[0])
  torch.testing.assert_close(got[0], torch.autograd.grad(conv(*leaves).sum(), leaves[0])[0], rtol=1e-4, atol=1e-4)
  assert case[1] * phases in calls[1:]  # (the first call is the forward convolution)
  if phases < case[5] ** 2: assert case[1] * case[5] ** 2 not in calls[1:]


@pytest.mark.parametrize("epilogue", ["residual", "bias and residual"])
def test_gemm_epilogue_operands_load_after_the_reduce_loop(epilogue):
  """What only a GEMM's epilogue reads (a residual, a bias) is loaded after the reduce loop (core/codegen.py
  linearize), not before it, where its values would hold registers the accumulator tile needs through the loop;
  the result matches eager."""
  from torch_uop.core.uop import Ops
  torch.manual_seed(0)
  x, w, r, bias = torch.randn(48, 256), torch.randn(256, 64), torch.randn(48, 64), torch.randn(64)
  fn = (lambda x, w, r, b: x @ w + r) if epilogue == "residual" else (lambda x, w, r, b: x @ w + b + r)
  torch._dynamo.reset()
  with torch_uop.debug.capture() as graphs:
    got = torch.compile(fn, backend="uop", options=FRESH)(x, w, r, bias)
  torch.testing.assert_close(got, fn(x, w, r, bias), rtol=1e-4, atol=1e-4)
  (gemm,) = [k for k in graphs[0].kernels if any(u.op is Ops.REDUCE for u in k.program)]
  program = gemm.program
  reduce_range = next(u for u in program if u.op is Ops.RANGE and u.arg[1] in ("reduce", "reduce_serial"))
  start, end = program.index(reduce_range), max(i for i, u in enumerate(program) if u.op is Ops.ENDRANGE and u.src[0] is reduce_range)
  loads = [i for i, u in enumerate(program) if u.op is Ops.LOAD]
  read_in_loop = {u for u in program[start:end] for u in u.toposort()}
  assert any(i > end for i in loads)                                                 # the residual's loads
  assert all(i > end or program[i] in read_in_loop for i in loads)                   # none idle before the loop


class _Attention(torch.nn.Module):
  """Multi-head self-attention as timm's ViT writes it: one qkv projection, its slices per head, SDPA."""
  def __init__(self, dim: int, heads: int):
    super().__init__()
    self.heads, self.qkv, self.proj = heads, torch.nn.Linear(dim, 3 * dim), torch.nn.Linear(dim, dim)

  def forward(self, x):
    b, n, c = x.shape
    q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
    return x + self.proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, c))


def test_backward_copies_of_saved_tensors_keep_their_place(monkeypatch):
  """A step reading only graph inputs runs early only if it reduces them (core/schedule.py _freeing_first_order):
  a copy of a saved tensor (a layer's keys, re-laid out) keeps its graph-order place, so it is not held while the
  later layers' backward runs. Hoisting such copies too (every input-only step that writes fewer bytes than it
  reads) raised this backward's planned peak from 1.88 to 2.01 MB."""
  from torch_uop.core import schedule as sched
  torch.manual_seed(0)
  model = torch.nn.Sequential(_Attention(192, 3), _Attention(192, 3))
  x = torch.randn(1, 101, 192, requires_grad=True)
  def backward_peak() -> int:
    torch._dynamo.reset()
    torch_uop.reset_metrics()
    with torch_uop.debug.capture() as graphs:
      out = torch.compile(model, backend="uop", options=FRESH)(x)
      got = torch.autograd.grad(out.square().sum(), (x, *model.parameters()))
    want = torch.autograd.grad(model(x).square().sum(), (x, *model.parameters()))
    for a, e in zip(got, want): torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-3)
    assert torch_uop.metrics()["fallback_nodes_total"] == 0
    return graphs[-1].peak_bytes
  peak = backward_peak()
  monkeypatch.setattr(sched, "_reduces", lambda step, realized: True)
  assert peak < backward_peak()


LANE_TILES = [
  ("x @ w.T with bias and GELU", lambda x, w, b: F.gelu(x @ w.t() + b), [(64, 96), (80, 96), (80,)]),
  ("x @ w, rows not a multiple of the tile", lambda x, w: x @ w, [(30, 64), (64, 72)]),
  ("a transposing copy with arithmetic", lambda x: x.t().contiguous() * 2 + 1, [(96, 64)]),
  ("NCHW to NHWC", lambda x: x.permute(0, 2, 3, 1).contiguous() - 1, [(2, 24, 9, 16)]),
  ("attention scores, heads batched", lambda q, k: (q @ k.transpose(-1, -2)) * 0.25, [(2, 4, 40, 16), (2, 4, 40, 16)]),
  # a strided convolution's gradients: a mask that moves with a lane sends its tile back to position by position
  ("strided convolution gradients", lambda g, x, w: torch.ops.aten.convolution_backward(
    g, x, w, None, [3, 3], [1, 1], [1, 1], False, [0, 0], 1, [True, True, False])[:2], [(1, 4, 3, 3), (1, 8, 9, 10), (4, 8, 4, 4)]),
]


@pytest.mark.parametrize("name,fn,shapes", LANE_TILES, ids=[c[0] for c in LANE_TILES])
def test_a_tile_built_by_lanes_is_the_tile_built_position_by_position(monkeypatch, name, fn, shapes):
  """A register tile's expression is built once at stand-in lanes and instantiated per position (codegen._lane_tile):
  the kernels are exactly those built position by position, and the results equal eager's. (With one scalar per
  position: a SIMD tile's vector form needs the lanes, test_simd_tiles_are_vectors.)"""
  from torch_uop.core import codegen
  monkeypatch.setattr(codegen, "VECTOR_TILES", False)
  torch.manual_seed(0)
  args = [torch.randn(s) for s in shapes]

  def programs(): return [k.program for g in _compile_checked(fn, args, rtol=1e-4, atol=1e-3) for k in g.kernels]

  used = []
  lane_tile = codegen._lane_tile
  monkeypatch.setattr(codegen, "_lane_tile", lambda *a: used.append(lane_tile(*a)) or used[-1])
  by_lanes = programs()
  assert any(t is not None for t in used)  # the lanes were taken
  monkeypatch.setattr(codegen, "_lane_tile", lambda *a: None)
  assert by_lanes == programs()


def _nan_at(shape, where):
  x = torch.randn(shape)
  x[where] = float("nan")
  return x


# (name, function, inputs): kernels whose register tile has a SIMD axis (a reduction with contiguous outputs)
SIMD_TILES = [
  ("x @ w plus a bias", lambda x, w, b: x @ w + b, lambda: [torch.randn(40, 72), torch.randn(72, 96), torch.randn(96)]),
  ("a batched matmul", torch.bmm, lambda: [torch.randn(3, 20, 48), torch.randn(3, 48, 64)]),
  ("a column sum", lambda x: x.sum(0), lambda: [torch.randn(300, 64)]),
  ("a column max with NaN", lambda x: x.amax(0), lambda: [_nan_at((300, 64), (5, 3))]),
  ("a column min of integers", lambda x: x.amin(0), lambda: [torch.randint(-50, 50, (300, 64))]),
  ("a column any", lambda x: x.any(0), lambda: [torch.randn(300, 64) > 2]),
  ("float64 x @ w through sin", lambda x, w: torch.sin(x @ w), lambda: [torch.randn(24, 40, dtype=torch.float64),
                                                                      torch.randn(40, 64, dtype=torch.float64)]),
  ("a comparison of a product", lambda x, w: (x @ w) > 0, lambda: [torch.randn(40, 72), torch.randn(72, 96)]),
  # (float64 tanh has no vector form: libm is called lane by lane inside the vector tile)
  ("float64 tanh summed down columns", lambda x: torch.tanh(x).sum(0), lambda: [torch.randn(300, 64, dtype=torch.float64)]),
  ("a 3x3 convolution", lambda x, w: F.conv2d(x, w, padding=1), lambda: [torch.randn(2, 16, 10, 10), torch.randn(32, 16, 3, 3)]),
  # weights read through packed panels (linalg._packs): the staged copy's tile rows are vectors too, transposed for W.T
  ("x @ W, W packed", lambda x, w: x @ w, lambda: [torch.randn(64, 256), torch.randn(256, 1024)]),
  ("x @ W.T, W packed", lambda x, w: x @ w.t(), lambda: [torch.randn(64, 1024), torch.randn(1024, 1024)]),
]


@pytest.mark.parametrize("name,fn,make", SIMD_TILES, ids=[c[0] for c in SIMD_TILES])
def test_simd_tiles_are_vectors(monkeypatch, name, fn, make):
  """A register tile with a SIMD axis is built as vectors along it (codegen.vector_lane): one node per vector instead
  of one per position, rendered as LLVM vector loads, stores and arithmetic, with results equal to eager's and to
  the tile built one scalar per position."""
  from torch_uop.core import codegen
  torch.manual_seed(0)
  args = make()
  lanes = cpu.vector_unit().lanes
  results, sizes, sources = {}, {}, {}
  for vector in (True, False):
    monkeypatch.setattr(codegen, "VECTOR_TILES", vector)
    torch._dynamo.reset()
    with torch_uop.debug.capture() as graphs:
      results[vector] = torch.compile(fn, backend="uop", options=FRESH)(*args)
    torch.testing.assert_close(results[vector], fn(*args), rtol=1e-4, atol=1e-4, equal_nan=True)
    sizes[vector] = sum(len(k.program) for k in graphs[-1].kernels)
    sources[vector] = "".join(graphs[-1].sources.values() if isinstance(graphs[-1].sources, dict) else graphs[-1].sources)
  torch.testing.assert_close(results[True], results[False], rtol=1e-6, atol=1e-6, equal_nan=True)
  assert f"load <{lanes} x " in sources[True] and f"store <{lanes} x " in sources[True]
  # (the scalar build has vector loads only where renderer/transpose.py finds a transposing copy's tile)
  assert sources[True].count(f"load <{lanes} x ") > sources[False].count(f"load <{lanes} x ")
  assert sizes[True] * 3 < sizes[False]
  if "packed" in name:  # the slab's copy: rows of 8 (STAGE_TILE) stored as vectors, into the kernel's local array
    assert re.search(r"store <8 x float> %t\d+, ptr %t\d+", sources[True]) and "alloca [" in sources[True]


# (name, function, input shapes, the trips of the kernel's loops as they nest, merged: whether any loop was merged)
MERGED_LOOPS = [
  ("a channel's scale times its 7x7 pixels", lambda x, s: torch.sigmoid(s)[:, :, None, None] * x,
   [(2, 24, 7, 7), (2, 24)], [48, 49], True),
  ("a bias over channels", lambda x, b: x + b[None, :, None, None], [(2, 16, 5, 6), (16,)], [2, 16, 30], True),
  ("elementwise over four dims", lambda x: torch.relu(x) * 2, [(2, 3, 5, 7)], [210], True),
  ("every other column", lambda x: x[:, :, ::2] + 1, [(2, 5, 8)], [40], True),
  ("a comparison with the flat position", lambda x: torch.where(torch.arange(20).reshape(4, 5) > 7, x, 0.), [(3, 4, 5)],
   [3, 20], True),
  ("a mean over the pixels", lambda x: x.mean((2, 3)), [(2, 16, 7, 7)], [32, 49], True),
  ("padding: images and channels merge, rows stay", lambda x: F.pad(x, (1, 1, 1, 1)), [(2, 3, 6, 6)], [6, 8, 8], True),
  ("a transpose", lambda x: x.transpose(1, 2) * 2, [(2, 6, 10)], [2, 10, 6], False),
  ("a concatenation", lambda x, y: torch.cat([x, y], 1) * 2, [(2, 3, 4), (2, 5, 4)], [2, 8, 4], False),
]


@pytest.mark.parametrize("name,fn,shapes,trips,merged", MERGED_LOOPS, ids=[c[0] for c in MERGED_LOOPS])
def test_loops_read_as_one_are_merged(monkeypatch, name, fn, shapes, trips, merged):
  """Adjacent loops that every index reads as one (r1 * size(r2) + r2) are one loop (codegen._merge_loops), output and
  reduction loops alike; loops read apart (a mask, a transpose, a concatenation) stay. Results equal eager's, and the
  same kernels built without merging differ exactly where a loop was merged."""
  from torch_uop.core import codegen
  torch.manual_seed(0)
  args = [torch.randn(s) for s in shapes]

  def loops():  # of the kernel writing the output (a channel's sigmoid is a kernel of its own)
    return [u.src[0].arg for u in _compile_checked(fn, args)[0].kernels[-1].program if u.op is Ops.RANGE]

  assert loops() == trips
  monkeypatch.setattr(codegen, "_merge_loops", lambda ast: ast)
  assert (loops() != trips) == merged


def test_loops_around_loops_are_not_unrolled():
  """A loop around another is marked for LLVM not to unroll (a few short loops unrolled in full would copy the loops
  inside them), and not to vectorize where it steps a load or store by more than one element (vectorized across
  the rows of a padded copy, each lane would be a scalar load); one stepping by one element may vectorize (a column
  sum: across columns). The innermost loop keeps the default. Results equal eager's."""
  torch.manual_seed(0)
  for fn, shape, outer in ((lambda x: F.pad(x, (1, 1, 1, 1)), (2, 3, 6, 6), "!9"), (lambda x: x.sum(0), (33, 42), "!7")):
    (source,) = _compile_checked(fn, (torch.randn(shape),))[0].sources
    marks = [line.rsplit(" ", 1)[-1] for line in source.splitlines() if "!llvm.loop" in line]
    assert marks[0] == "!0" and outer in marks[1:], marks  # (the innermost loop's back edge comes first)


def test_big_weight_gradient_runs_after_the_others(monkeypatch):
  """A backward graph's first output, the token embedding's gradient (here 4 MiB), is computed after the first
  layer's weight gradients (core/schedule.py _freeing_first_order's second order, taken where its simulated peak is
  lower): depth-first from the outputs it came right after the input gradient's chain, and the activation gradients
  those weight gradients read were held beside it. The backward's planned peak (the executor's, buffers as if each
  were allocated alone) is below that order's; gradients match eager's."""
  from torch_uop.testing import zoo
  if zoo.library_missing("transformers"): pytest.skip("transformers is not installed (the test extra brings it)")
  import transformers  # (library_missing has made torchvision importable beside the CPU torch: transformers imports it)
  from torch_uop.core import schedule
  torch.manual_seed(0)
  cfg = transformers.GPT2Config(n_embd=128, n_head=2, n_layer=1, vocab_size=8192, n_positions=128, use_cache=False,
                                attn_implementation="sdpa", bos_token_id=0, eos_token_id=0)
  model = transformers.GPT2Model(cfg).eval()
  ids = torch.randint(0, 8192, (1, 128))
  ramp = torch.linspace(-1, 1, 128 * 128).reshape(1, 128, 128)

  def step(m):
    for p in model.parameters(): p.grad = None
    (m(ids).last_hidden_state * ramp).mean().backward()

  def compiled_backward():
    torch._dynamo.reset()
    with torch_uop.debug.capture() as graphs: step(torch.compile(model, backend="uop", options=FRESH))
    shapes = [tuple(s.shape) for kind, s in graphs[-1].plan.steps if kind == "kernel"]
    return graphs[-1].peak_bytes_unplanned, shapes, [p.grad.clone() for p in model.parameters()]

  deferred, shapes, grads = compiled_backward()
  order = schedule._StepGraph.order
  monkeypatch.setattr(schedule._StepGraph, "order", lambda g, defer_sinks, sliced=False: order(g, False, sliced))
  plain, plain_shapes, _ = compiled_backward()
  step(model)
  for got, p in zip(grads, model.parameters()):
    torch.testing.assert_close(got, p.grad, rtol=1e-4, atol=1e-5)
  wte, c_attn = (8192, 128), (128, 384, 1)  # the embedding's gradient, the qkv weight's (as its kernel writes it)
  assert plain_shapes.index(wte) < plain_shapes.index(c_attn)  # the depth-first order: what made the peak
  assert shapes.index(wte) > shapes.index(c_attn)
  assert deferred < plain


def test_reads_inside_their_buffer_need_no_mask_gate():
  """A padded output's kernel (BatchNorm and SiLU written with the padding of the depthwise convolution after them,
  EfficientNet's blocks) reads each channel's scale and shift at an index the padding mask does not move, always
  inside its buffer: those loads carry no gate (an ungated load vectorizes; a gated one is a gather). The input, read
  at index - 113 under the mask, keeps its gate; the result matches eager, padding included."""
  torch.manual_seed(0)
  x, mean, var, w, b = torch.randn(1, 8, 20, 20), torch.randn(8), torch.rand(8) + 0.5, torch.randn(8), torch.randn(8)
  fn = lambda x, mean, var, w, b: F.pad(F.silu(F.batch_norm(x, mean, var, w, b)), (1, 1, 1, 1))
  g = torch_uop.debug.compile_graph(fn, x, mean, var, w, b)
  torch.testing.assert_close(g(x, mean, var, w, b)[0], fn(x, mean, var, w, b))
  padded = next(k for k in g.kernels if len(k.buffers) >= 4)
  loads = [u for u in padded.program if u.op is Ops.LOAD]
  gated = {u.src[0].arg for u in loads if len(u.src) == 3}
  assert gated and len(gated) == 1, [(u.src[0].arg, len(u.src)) for u in loads]  # only the input's read
  assert sum(1 for u in loads if len(u.src) == 2) >= 2  # the per-channel parameters


@pytest.mark.skipif("+avx2" not in cpu.target_id()[1].split(","), reason="masked vector loads need AVX2 or AVX-512")
def test_gated_contiguous_read_is_a_masked_vector_load():
  """A padded row's read (its index contiguous in the row, gated by the padding mask) is a branch around a scalar
  load in the IR the renderer writes, which LLVM's loop vectorizer turns into masked vector loads: no gathers, no
  scalar lane-by-lane inserts. The padding reads 0, NaN and infinities in the input pass through as in eager."""
  torch.manual_seed(0)
  x = torch.randn(3, 5, 37, 45)
  x[0, 0, 0, :3] = torch.tensor([float("nan"), float("inf"), -float("inf")])
  fn = lambda x: F.pad(torch.sigmoid(x) * x, (1, 2, 1, 1), value=0.0)
  g = torch_uop.debug.compile_graph(fn, x)
  torch.testing.assert_close(g(x)[0], fn(x), equal_nan=True)
  padded = next(i for i, k in enumerate(g.kernels) if any(len(u.src) == 3 for u in k.program if u.op is Ops.LOAD))
  cpu_name, features, _ = cpu.target_id()
  _, module = llvm_worker.compile_module(g.sources[padded], cpu_name, features, 3)
  optimized = str(module)
  assert "llvm.masked.load" in optimized
  assert "gather" not in optimized and "insertelement <16 x float>" not in optimized
