"""Dynamic shapes: with dynamic=True, torch._dynamo.mark_dynamic or Dynamo's automatic dynamic shapes, one traced
graph serves every size (no recompile after the first) and is compiled once, with size variables in its kernels
(dynamo_backend.compile_symbolic_graph); every size agrees with eager, in inference and in training. With
symbolic_shapes off, or where the symbolic compile fails, each size runs as its own static copy instead."""
import copy
import pytest
import torch
import torch.nn.functional as F
import torch_uop
from torch_uop.testing.models import MLP, CNN, Block
from helpers import fresh_compiled, assert_ran_natively


def _dynamo_graphs() -> int:
  return torch._dynamo.utils.counters["stats"]["unique_graphs"]


def test_transformer_over_5_batch_sizes_and_3_sequence_lengths_compiles_once():
  torch.manual_seed(0)
  model = Block().eval()
  compiled = fresh_compiled(model, dynamic=True)
  sizes = [(b, t) for t in (8, 12, 20) for b in (2, 3, 4, 6, 9)]
  with torch.no_grad():
    for i, (b, t) in enumerate(sizes):
      ids = torch.randint(0, 100, (b, t))
      torch.testing.assert_close(compiled(ids), model(ids), rtol=1e-4, atol=1e-5)
      assert _dynamo_graphs() == 1, f"recompiled at batch {b}, sequence {t}"
      if i == 1: after_second = torch_uop.metrics()
    m = assert_ran_natively()
    # the first size compiles the symbolic graph; the second (a new batch size) one with the sequence length
    # pinned, which serves the batch sizes at that length; no other compile (the first serves the rest)
    assert m["graphs_compiled"] == 1 and m["symbolic_graphs"] == 2 and m["size_specializations"] == 0
    assert m["kernels_compiled"] == after_second["kernels_compiled"]
    ids = torch.randint(0, 100, sizes[3])
    torch.testing.assert_close(compiled(ids), model(ids), rtol=1e-4, atol=1e-5)
  m = torch_uop.metrics()
  assert m["symbolic_graphs"] == 2 and m["size_specializations"] == 0 and _dynamo_graphs() == 1


@pytest.mark.parametrize("make", [MLP, CNN, Block], ids=["mlp", "cnn", "tf"])
def test_training_steps_at_changing_batch_sizes_match_eager(make):
  # forward and backward graphs with symbolic sizes, SymInts saved for backward, BatchNorm's running statistics
  # updated in place, and SGD steps in between: losses, gradients, parameters and buffers against eager
  torch.manual_seed(0)
  model = make()
  twin = copy.deepcopy(model)
  compiled = fresh_compiled(twin, dynamic=True)
  opt_ref = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
  opt = torch.optim.SGD(twin.parameters(), lr=0.05, momentum=0.9)
  for batch in (4, 6, 3, 6):
    if make is Block:
      x, y = torch.randint(0, 100, (batch, 10 + batch)), torch.randint(0, 100, (batch, 10 + batch))
    else:
      x = torch.randn(batch, 32) if make is MLP else torch.randn(batch, 3, 16, 16)
      y = torch.randint(0, 10, (batch,))
    for m, f, o in ((model, model, opt_ref), (twin, compiled, opt)):
      o.zero_grad()
      out = f(x)
      m.loss = F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
      m.loss.backward()
    torch.testing.assert_close(twin.loss, model.loss, rtol=1e-4, atol=1e-5)
    for (n, p), q in zip(twin.named_parameters(), model.parameters()):
      torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=n)
    opt_ref.step(); opt.step()
  for (n, b), c in zip(twin.named_buffers(), model.buffers()): torch.testing.assert_close(b, c, msg=n)
  m = assert_ran_natively()
  assert _dynamo_graphs() == 1 and m["graphs_compiled"] == 2, "one forward and one backward graph"
  # each graph compiled for every size at the first batch size, and, where some sizes stayed at the second (an
  # image's, a feature size), once more with those pinned; nothing after that
  assert m["symbolic_graphs"] == (4 if make is CNN else 2) and m["size_specializations"] == 0


def test_mark_dynamic_serves_every_batch_size_from_one_graph():
  fn = lambda x, w: (x @ w).relu().sum(-1) / x.shape[0]
  w = torch.randn(16, 8)
  compiled = fresh_compiled(fn)
  for n in (5, 7, 12):
    x = torch.randn(n, 16)
    torch._dynamo.mark_dynamic(x, 0)
    torch.testing.assert_close(compiled(x, w), fn(x, w))
  m = assert_ran_natively()
  assert _dynamo_graphs() == 1 and m["graphs_compiled"] == 1 and m["symbolic_graphs"] == 1 and m["size_specializations"] == 0


def test_automatic_dynamic_recompiles_once_then_serves_every_size():
  fn = lambda x: (x * 2).softmax(-1) + x.sum()
  compiled = fresh_compiled(fn)
  for n in [3, 5, 8, 13]:
    x = torch.randn(n, 7)
    torch.testing.assert_close(compiled(x), fn(x))
  m = assert_ran_natively()
  # the first size compiles a static graph; the second a symbolic one, which serves 5, 8 and 13
  assert _dynamo_graphs() == 2 and m["graphs_compiled"] == 2 and m["symbolic_graphs"] == 1 and m["size_specializations"] == 0


def test_strides_are_part_of_the_specialization():
  fn = lambda x: x.exp() + 1
  compiled = fresh_compiled(fn, dynamic=True)
  a = torch.randn(6, 9)
  for x in (a, a.t(), a[:, ::2], torch.randn(4, 3)):
    torch.testing.assert_close(compiled(x), fn(x))
  assert_ran_natively()


def test_a_size_that_cannot_be_specialized_runs_in_torch(monkeypatch):
  import torch_uop.lowering.specialize as specialize
  def refuse(gm, args): raise RuntimeError("no static copy")
  monkeypatch.setattr(specialize, "specialize", refuse)
  fn = lambda x: x.sin() * x.shape[0]
  compiled = fresh_compiled(fn, {"symbolic_shapes": False}, dynamic=True)
  for n in (3, 4):
    x = torch.randn(n, 2)
    torch.testing.assert_close(compiled(x), fn(x))
  m = torch_uop.metrics()
  assert m["graphs_compiled"] == 1 and m["size_specializations"] == 0 and m["graphs_fallen_back"] == 2


def test_static_copies_come_from_the_graph_cache_the_second_time(tmp_path, monkeypatch):
  monkeypatch.setenv("TORCH_UOP_CACHE_DIR", str(tmp_path))
  monkeypatch.delenv("TORCH_UOP_GRAPH_CACHE", raising=False)
  model = MLP().eval()
  runs = []
  for _ in range(2):  # the second run, after a Dynamo reset, compiles no kernel
    compiled = fresh_compiled(model, {"symbolic_shapes": False}, dynamic=True)
    with torch.no_grad():
      for n in (5, 9, 12):
        x = torch.randn(n, 32)
        torch.testing.assert_close(compiled(x), model(x))
    runs.append(assert_ran_natively())
  assert runs[0]["graph_cache_hits"] == 0 and runs[1]["graph_cache_hits"] == 3
  assert runs[0]["size_specializations"] == runs[1]["size_specializations"] == 3
  assert "llvm" not in runs[1]["compile_time_s"] and "codegen" not in runs[1]["compile_time_s"]


# sizes used as values, in slices, views, creation ops and scale factors: kernels compute them from the size variables
SIZE_ARITHMETIC = {
  "mean_by_size": lambda x: x.sum() / x.shape[0],
  "float_of_size": lambda x: x * (x.shape[1] ** 0.5),
  "arange_of_size": lambda x: x + torch.arange(x.shape[1]),
  "slice_by_size": lambda x: x[:, : x.shape[1] // 2] * 2,
  "view_minus_one": lambda x: x.view(-1, 2).sum(-1),
  "interpolate": lambda x: F.interpolate(x[None, None], scale_factor=2.0, mode="nearest")[0, 0],
  "cat_of_pad": lambda x: torch.cat([x, F.pad(x, (1, 1))], 1).softmax(-1),
  "matmul_with_transpose": lambda x: x @ x.t(),
  "zeros_of_size": lambda x: torch.zeros(x.shape[0], 3) + x[:, :3],
}


@pytest.mark.parametrize("name", SIZE_ARITHMETIC)
def test_sizes_used_as_values(name):
  fn = SIZE_ARITHMETIC[name]
  compiled = fresh_compiled(fn, dynamic=True)
  for n, m in [(4, 6), (5, 8), (7, 10)]:
    x = torch.randn(n, m)
    torch.testing.assert_close(compiled(x), fn(x))
  m = assert_ran_natively()
  assert m["graphs_compiled"] == 1 and m["symbolic_graphs"] == 1 and m["size_specializations"] == 0


def test_a_graph_the_symbolic_path_cannot_hold_runs_as_static_copies(monkeypatch):
  import torch_uop.dynamo_backend as backend
  def refuse(*args): raise NotImplementedError("not symbolic")
  monkeypatch.setattr(backend, "compile_symbolic_graph", refuse)
  fn = lambda x: (x @ x.t()).softmax(-1) * x.shape[0]
  compiled = fresh_compiled(fn, dynamic=True)
  for n in (3, 4, 6):
    x = torch.randn(n, 5)
    torch.testing.assert_close(compiled(x), fn(x))
  m = assert_ran_natively()
  assert m["symbolic_graphs"] == 0 and m["size_specializations"] == 3


@pytest.mark.parametrize("transposed", [False, True], ids=["x@W", "x@W.T"])
def test_gemm_rows_of_symbolic_size_are_register_blocked(transposed, monkeypatch):
  """A GEMM whose row count is a size variable (a batch or sequence length) is register-blocked over its rows like a
  static one, its last tile clamping the positions past the end (codegen._upcast_index, clamped): no guard, so one
  symbolic graph serves every size, from 2 rows (fewer than a tile) up, and every size agrees with eager, in the
  forward and the backward."""
  from torch_uop.core import codegen
  clamped_calls = []
  real = codegen._upcast_index
  def spy(r, factor, offset, size, clamped=False):
    if clamped: clamped_calls.append(factor)
    return real(r, factor, offset, size, clamped)
  monkeypatch.setattr(codegen, "_upcast_index", spy)
  torch.manual_seed(0)
  w = torch.randn(96, 64, requires_grad=True) if transposed else torch.randn(64, 96, requires_grad=True)
  fn = (lambda x, w: F.linear(x, w).relu()) if transposed else (lambda x, w: (x @ w).relu())
  compiled = fresh_compiled(fn)
  for n in (19, 2, 3, 8, 9, 130):
    x = torch.randn(n, 64, requires_grad=True)
    torch._dynamo.mark_dynamic(x, 0)
    got, want = compiled(x, w), fn(x, w)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    g = torch.randn_like(want)
    for a, b in zip(torch.autograd.grad(got, (x, w), g), torch.autograd.grad(want, (x, w), g)):
      torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
  m = assert_ran_natively()
  assert _dynamo_graphs() == 1 and m["size_specializations"] == 0 and m["symbolic_graphs"] == 2  # forward, backward
  assert clamped_calls and min(clamped_calls) >= 2, "no kernel blocked its rows of symbolic size"
