"""Fusion: how many kernels the scheduler makes for common patterns (metrics()["kernels_compiled"]).

Elementwise chains fuse into one kernel, an elementwise prologue and epilogue fuse into their
reduction (on the CPU, except a matmul's epilogue with a math function such as GELU's), and on the CPU a statistic over the trailing axes read back along them (softmax, layer norm,
mean-centering) is computed once per row inside its reader; over other axes it costs one extra kernel. Every case is also checked against eager and must not fall back.
"""
import pytest
import torch
import torch.nn.functional as F
from helpers import check_against_eager


def kernels(fn, *inputs, **kw):
  m = check_against_eager(fn, *inputs, **kw)
  return m["kernels_compiled"]


def test_elementwise_chain_is_one_kernel():
  assert kernels(lambda x: (x * 2 + 1).relu(), torch.randn(16, 33)) == 1


def test_long_elementwise_chain_with_broadcast_is_one_kernel():
  fn = lambda x, b: torch.sigmoid(x * b - 3).tanh() * x.abs() + b.exp()
  assert kernels(fn, torch.randn(8, 16), torch.randn(16)) == 1


def test_softmax_last_axis_at_most_three_kernels():
  n = kernels(lambda x: torch.softmax(x, -1), torch.randn(6, 50))
  assert 1 <= n <= 3


def test_log_softmax_at_most_three_kernels():
  n = kernels(lambda x: F.log_softmax(x, -1), torch.randn(6, 50))
  assert 1 <= n <= 3


def test_reduction_with_prologue_and_epilogue_is_one_kernel():
  assert kernels(lambda x: (x.exp() * 2).sum(-1).sqrt() + 1, torch.randn(7, 40)) == 1


@pytest.mark.parametrize("dim", [0, 1, (0, 1)])
def test_reductions_over_other_axes_are_one_kernel(dim):
  assert kernels(lambda x: (x * x).sum(dim).sqrt(), torch.randn(12, 9)) == 1


def test_two_reductions_over_the_same_domain_share_a_kernel():
  # sum and max of the same rows, combined elementwise: one kernel with two accumulators
  assert kernels(lambda x: x.sum(-1) + x.amax(-1), torch.randn(5, 30)) == 1


def test_row_statistic_broadcast_back_is_one_kernel():
  # the mean over the last axis is computed once per row inside the kernel that subtracts it
  assert kernels(lambda x: x - x.mean(-1, keepdim=True), torch.randn(9, 21)) == 1


def test_softmax_layer_norm_and_rms_norm_are_one_kernel_each():
  x, w, b = torch.randn(7, 40), torch.randn(40), torch.randn(40)
  assert kernels(lambda x: torch.softmax(x * 0.5, -1), x) == 1
  assert kernels(lambda x: F.log_softmax(x, -1), x) == 1
  assert kernels(lambda x, w, b: F.layer_norm(x, (40,), w, b), x, w, b) == 1
  assert kernels(lambda x, w: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w, x, w) == 1


def test_statistic_over_a_leading_axis_broadcast_back_is_two_kernels():
  # rows of the kernel's loops are not what the mean runs over: it is realized on its own
  assert kernels(lambda x: x - x.mean(0, keepdim=True), torch.randn(9, 21)) == 2


def test_row_statistics_with_non_finite_values():
  x = torch.randn(6, 33)
  x[1, 4], x[2, 0], x[3, 32], x[4, 5], x[4, 6] = float("nan"), float("inf"), -float("inf"), float("inf"), -float("inf")
  for fn in (lambda x: torch.softmax(x, -1), lambda x: F.log_softmax(x, -1), lambda x: x - x.amax(-1, keepdim=True),
             lambda x: F.layer_norm(x, (33,))):
    check_against_eager(fn, x)


def test_linear_bias_relu_is_one_kernel():
  w, b = torch.randn(24, 16), torch.randn(24)
  assert kernels(lambda x: F.relu(F.linear(x, w, b)), torch.randn(10, 16)) == 1


def test_matmul_with_epilogue_is_one_kernel():
  assert kernels(lambda a, b, c: torch.relu(a @ b + c).clamp(max=3) * 2, torch.randn(8, 12), torch.randn(12, 5), torch.randn(5)) == 1


def test_matmul_prologue_read_by_many_columns_is_its_own_kernel():
  # relu(h) @ W: a register tile would recompute relu(h) in its inner loop once per tile of W's columns
  h, w = torch.randn(32, 40), torch.randn(40, 64)
  assert kernels(lambda h, w: torch.relu(h) @ w, h, w) == 2


@pytest.mark.parametrize("act", [torch.tanh, torch.nn.functional.gelu, torch.nn.functional.silu, torch.sigmoid])
def test_matmul_with_a_math_function_epilogue_is_two_kernels(act):
  # a register-tiled GEMM would compute the epilogue once per tile position, unrolled: a math function that expands
  # into tens of operations gets a pointwise kernel of its own over the GEMM's result
  a, b, c = torch.randn(40, 24), torch.randn(24, 48), torch.randn(48)
  fn = lambda a, b, c: act(torch.nn.functional.linear(a, b.t(), c)) * 2
  assert kernels(fn, a, b, c) == 2
  torch.testing.assert_close(torch.compile(fn, backend="uop")(a, b, c), fn(a, b, c))


def test_movement_ops_fuse_into_their_consumer():
  fn = lambda x: (x.t().reshape(4, 6, 5)[:, 1:4].flip(0) * 3).permute(2, 0, 1)
  assert kernels(fn, torch.randn(30, 4)) == 1


def test_kernels_launched_per_call():
  fn = torch.compile(lambda x: x - x.mean(0, keepdim=True), backend="uop")
  x = torch.randn(4, 8)
  for _ in range(3): torch.testing.assert_close(fn(x), x - x.mean(0, keepdim=True))
  import torch_uop
  m = torch_uop.metrics()
  assert (m["kernels_compiled"], m["kernels_launched"]) == (2, 6)


def test_expensive_activation_feeding_matmul_is_computed_once():
  """GELU read by a matmul through a broadcast is realized, not recomputed for every output column."""
  import torch_uop.debug
  from torch_uop.core.uop import Ops
  fn = lambda x, w1, w2: F.gelu(x @ w1) @ w2
  args = (torch.randn(16, 8), torch.randn(8, 32), torch.randn(32, 24))
  check_against_eager(fn, *args)
  with torch_uop.debug.capture() as graphs:
    torch._dynamo.reset()
    torch.compile(fn, backend="uop")(*args)
  for k in graphs[0].kernels:
    nodes = k.ast.toposort()
    if any(n.op is Ops.REDUCE for n in nodes):
      reduced = [n for n in nodes if n.op is Ops.REDUCE][0].src[0].toposort()
      assert not any(n.op is Ops.MATH and n.arg == "erf" for n in reduced), f"erf recomputed inside {k.name}'s reduction"


def test_cheap_prologue_still_fuses_into_matmul():
  """A scale on a matmul input is cheaper to recompute than to realize: one kernel."""
  assert kernels(lambda a, b: (a * 0.5) @ b, torch.randn(16, 8), torch.randn(8, 12)) == 1


@pytest.mark.parametrize("fn, shape", [(lambda x: x.sum(), (1 << 13, 128)), (lambda x: x.abs().amax(), (1 << 13, 128)),
                                       (lambda x: x.amin(dim=(0, 2)), (8, 8, 1 << 15)), (lambda x: (x * x).mean(), (1 << 20,)),
                                       (lambda x: x.t().sum(1), (1 << 18, 8))],
                         ids=["sum", "abs_amax", "amin_two_dims", "mean_of_squares", "transposed_rows"])
def test_big_reduction_to_few_outputs_is_split_for_threads(fn, shape):
  # 2^18 or more elements per result, at most 8 results: a first kernel of 64 partial results per output (threads share
  # its output loop), then a small kernel over the partials
  from torch_uop.debug import capture
  with capture() as graphs:
    assert kernels(fn, torch.randn(shape), rtol=1e-5, atol=1e-3) == 2
  first = next(p for k, p in graphs[-1].steps if k == "kernel")
  assert first.split_size >= 2, "the partial-results kernel has a loop to split among threads"
