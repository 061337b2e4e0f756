"""Eager's run-time data checks in compiled graphs: an index out of range, embedding_bag offsets that do not cut
the indices into bags, masked_scatter with too few source elements and a graph's own asserts (one_hot) raise the
exception type eager raises, from the compiled call, with a message naming the op; in-range data (negative indices
where eager wraps them) still gives eager's values, and the call after an error works."""
from __future__ import annotations
import pytest
import torch
import torch.nn.functional as F
import torch_uop
from helpers import fresh_compiled, assert_ran_natively

torch.manual_seed(0)
X = torch.randn(10, 4)

# name -> (fn of an int64 index tensor, (bad indices...), (good indices...), the op named in the message)
CASES = {
  "embedding": (lambda i: F.embedding(i, X), ([1, 12], [1, -1], [10]), ([0, 9, 3],), "embedding"),
  "index_select": (lambda i: torch.index_select(X, 0, i), ([1, 10], [-1, 2]), ([9, 0],), "index_select"),
  "index_select_dim1": (lambda i: torch.index_select(X, 1, i), ([4],), ([3, 0],), "index_select"),
  "gather": (lambda i: torch.gather(X, 0, i.reshape(-1, 1).expand(-1, 4)), ([1, 12], [-1]), ([9, 0],), "gather"),
  "index": (lambda i: X[i], ([1, 10], [-11]), ([1, -1, -10],), "index"),
  "index_dim1": (lambda i: X[:, i], ([4], [-5]), ([-4, 3],), "index"),
  "take": (lambda i: torch.take(X, i), ([45], [-41]), ([39, -40],), "index"),
  "scatter": (lambda i: X.scatter(0, i.reshape(-1, 1).expand(-1, 4), 1.0), ([1, 12], [-1]), ([9, 2],), "scatter"),
  "scatter_add": (lambda i: X.scatter_add(0, i.reshape(-1, 1).expand(-1, 4), torch.ones(i.numel(), 4)), ([10],), ([3, 3],),
                  "scatter_add"),
  "scatter_reduce": (lambda i: X.scatter_reduce(0, i.reshape(-1, 1).expand(-1, 4), torch.ones(i.numel(), 4), "amax"),
                     ([11], [-2]), ([0, 9],), "scatter_reduce"),
  "index_put": (lambda i: X.index_put((i,), torch.ones(i.numel(), 4)), ([1, 12], [-11]), ([-1, 2],), "index_put"),
  "index_put_acc": (lambda i: X.index_put((i,), torch.ones(i.numel(), 4), accumulate=True), ([10],), ([-10, 9, 9],),
                    "index_put"),
  "index_add": (lambda i: X.index_add(0, i, torch.ones(i.numel(), 4)), ([1, 12], [-1]), ([2, 2, 9],), "index_add"),
  "index_copy": (lambda i: X.index_copy(0, i, torch.ones(i.numel(), 4)), ([10], [-1]), ([2, 7],), "index_copy"),
  "index_fill": (lambda i: X.index_fill(0, i, 2.0), ([10], [-11]), ([-1, 0],), "index_fill"),
  "index_reduce": (lambda i: X.index_reduce(0, i, torch.ones(i.numel(), 4), "amax"), ([5, 10], [-1]), ([5, 0],),
                   "index_reduce"),
  "index_fill_tensor": (lambda i: X.index_fill(1, i, torch.tensor(3.0)), ([4],), ([-4, 1],), "index_fill"),
  "put": (lambda i: X.put(i, torch.ones(i.numel())), ([40], [-41]), ([39, -40],), "put"),
  "one_hot": (lambda i: F.one_hot(i, 10), ([1, 10], [-1]), ([0, 9],), "Class values"),
  "embedding_bag": (lambda i: F.embedding_bag(i, X, torch.tensor([0])), ([1, 10], [-3]), ([9, 0, 4],), "embedding_bag"),
}


def _eager_error(fn, idx):
  with pytest.raises(Exception) as info: fn(idx)
  return type(info.value)


@pytest.mark.parametrize("name", list(CASES))
def test_out_of_range_index_raises_eagers_error(name):
  fn, bad, good, named = CASES[name]
  compiled = fresh_compiled(fn, options={"graph_cache": False}, dynamic=False)
  for idx in good:
    i = torch.tensor(idx)
    torch.testing.assert_close(compiled(i), fn(i))
  assert_ran_natively()
  for idx in bad:
    i = torch.tensor(idx)
    error = _eager_error(fn, i)
    with pytest.raises(error, match=named): compiled(i)
  i = torch.tensor(good[0])
  torch.testing.assert_close(compiled(i), fn(i))  # the call after an error works


def test_int32_indices_and_two_dims_are_checked():
  x = torch.randn(5, 6)
  fn = lambda i, j: x[i, j]
  compiled = fresh_compiled(fn, options={"graph_cache": False}, dynamic=False)
  i, j = torch.tensor([4, -5], dtype=torch.int32), torch.tensor([5, 0], dtype=torch.int32)
  torch.testing.assert_close(compiled(i, j), fn(i, j))
  with pytest.raises(IndexError, match="index 6 is out of bounds for dimension 1 with size 6"):
    compiled(i, torch.tensor([6, 0], dtype=torch.int32))
  with pytest.raises(IndexError, match="dimension 0"): compiled(torch.tensor([0, 5], dtype=torch.int32), j)


def test_computed_indices_are_checked():
  """An index computed inside the graph (not an input) is checked too."""
  w = torch.randn(8, 3)
  fn = lambda t: F.embedding(t * 2 + 1, w)
  compiled = fresh_compiled(fn, options={"graph_cache": False}, dynamic=False)
  torch.testing.assert_close(compiled(torch.tensor([0, 3])), fn(torch.tensor([0, 3])))
  with pytest.raises(IndexError, match="embedding: index out of range in self"): compiled(torch.tensor([0, 4]))


def test_embedding_index_check_in_training():
  emb = torch.nn.Embedding(10, 4)
  def step(i):
    emb.zero_grad()
    out = emb(i).sum()
    out.backward()
    return out.detach(), emb.weight.grad.clone()
  torch._dynamo.reset()
  torch_uop.reset_metrics()
  compiled_emb = torch.compile(emb, backend="uop", options={"graph_cache": False}, dynamic=False)
  i = torch.tensor([1, 1, 9])
  ref = step(i)
  emb.zero_grad()
  out = compiled_emb(i).sum()
  out.backward()
  torch.testing.assert_close((out.detach(), emb.weight.grad), ref)
  with pytest.raises(IndexError, match="embedding"): compiled_emb(torch.tensor([1, 10, 2]))


def test_checks_survive_the_graph_cache(tmp_path, monkeypatch):
  """A graph loaded from the disk cache (no lowering) still makes its checks."""
  monkeypatch.setenv("TORCH_UOP_CACHE_DIR", str(tmp_path))
  fn = lambda i: F.embedding(i, X) * 2
  for _ in range(2):  # the second compile is a graph cache hit
    compiled = fresh_compiled(fn, dynamic=False)
    torch.testing.assert_close(compiled(torch.tensor([3, 4])), fn(torch.tensor([3, 4])))
    with pytest.raises(IndexError, match="embedding"): compiled(torch.tensor([3, 14]))
  assert torch_uop.metrics()["graph_cache_hits"] >= 1


@pytest.mark.parametrize("offsets, include_last, match", [
  ([1, 2], False, "offsets\\[0\\] has to be 0"),
  ([0, 5], False, "can not be greater than input's length"),
  ([0, 3, 2], False, "non-decreasing"),
])
def test_embedding_bag_offsets_are_checked(offsets, include_last, match):
  fn = lambda i, off: F.embedding_bag(i, X, off, include_last_offset=include_last)
  compiled = fresh_compiled(fn, options={"graph_cache": False}, dynamic=False)
  i, good = torch.tensor([1, 2, 3, 4]), torch.tensor([0, 2, 4][:len(offsets)])
  torch.testing.assert_close(compiled(i, good), fn(i, good))
  with pytest.raises(RuntimeError): fn(i, torch.tensor(offsets))
  with pytest.raises(RuntimeError, match=match): compiled(i, torch.tensor(offsets))


def test_masked_scatter_with_too_few_source_elements():
  fn = lambda m, s: torch.zeros(4).masked_scatter(m, s)
  compiled = fresh_compiled(fn, options={"graph_cache": False}, dynamic=False)
  m, s = torch.tensor([True, False, True, False]), torch.arange(3.0)
  torch.testing.assert_close(compiled(m, s), fn(m, s))
  with pytest.raises(RuntimeError, match="Number of elements of source < number of ones in mask"):
    compiled(torch.tensor([True, True, True, True]), s)


def test_graph_assert_raises_its_message():
  def fn(x):
    torch._assert_async((x > 0).all(), "x must be positive")
    return x * 2
  compiled = fresh_compiled(fn, options={"graph_cache": False}, dynamic=False)
  torch.testing.assert_close(compiled(torch.ones(3)), torch.full((3,), 2.0))
  with pytest.raises(RuntimeError, match="x must be positive"): compiled(-torch.ones(3))


def test_index_checks_with_dynamic_shapes():
  w = torch.randn(12, 3)
  fn = lambda i: F.embedding(i, w)
  compiled = fresh_compiled(fn, options={"graph_cache": False}, dynamic=True)
  for n in (3, 5, 7):
    i = torch.arange(n)
    torch.testing.assert_close(compiled(i), fn(i))
    with pytest.raises(IndexError, match="embedding"): compiled(i + 10)


@pytest.mark.parametrize("p", [[0.5, 1.5], [0.5, float("nan")], [-0.1, 0.2]])
def test_bernoulli_probabilities_are_checked(p):
  fn = lambda p: torch.bernoulli(p)
  compiled = fresh_compiled(fn, options={"graph_cache": False}, dynamic=False)
  good = torch.tensor([0.0, 1.0])
  torch.testing.assert_close(compiled(good), fn(good))
  with pytest.raises(RuntimeError): fn(torch.tensor(p))
  with pytest.raises(RuntimeError, match="p_in >= 0"): compiled(torch.tensor(p))


@pytest.mark.parametrize("probs, match", [([[0.5, float("nan")], [0.2, 0.3]], "inf`, `nan` or element < 0"),
                                          ([[0.5, -1.0], [0.2, 0.3]], "element < 0"),
                                          ([[0.5, float("inf")], [0.2, 0.3]], "inf"),
                                          ([[0.5, 0.5], [0.0, 0.0]], "sum of probabilities <= 0")])
def test_multinomial_distributions_are_checked(probs, match):
  fn = lambda p: torch.multinomial(p, 1)
  compiled = fresh_compiled(fn, options={"graph_cache": False}, dynamic=False)
  good = torch.tensor([[0.0, 1.0], [1.0, 0.0]])
  torch.testing.assert_close(compiled(good), fn(good))
  assert_ran_natively()
  with pytest.raises(RuntimeError, match=match): fn(torch.tensor(probs))
  with pytest.raises(RuntimeError, match=match): compiled(torch.tensor(probs))
