"""Which memory a compiled graph's outputs live in, and how long its inputs do.

Outputs share storage with each other and with the inputs only where eager's do (a clone is a copy, even where the
IR sees the same values), and views of one tensor in eager (attention's q, k and v of one GEMM) come out as views of
one buffer, so a training step saves no more than eager's autograd does. A boxed caller's inputs are freed after
their last reader (AOTAutograd's backward hands over the saved activations).
"""
import weakref
import pytest
import torch
import torch_uop
from torch_uop.debug import capture, compile_graph

W = torch.randn(8, 24)


def _storage(t: torch.Tensor) -> int: return t.untyped_storage().data_ptr()


def _sharing(tensors: list) -> list:
  """For every pair of tensors, whether they share storage."""
  return [[_storage(a) == _storage(b) for b in tensors] for a in tensors]


def _qkv(x): return (x @ W).view(4, 3, 8).permute(1, 0, 2).unbind(0)


# functions of one (4, 8) input, each returning a tuple of tensors
CASES = {
  "clone_of_input": lambda x: (x.clone(),),
  "transposed_clone_of_input": lambda x: (x.t().clone(),),
  "view_of_input": lambda x: (x.t(), x[1:]),
  "result_and_its_clone": lambda x: (lambda y: (y, y.clone()))(x + 1),
  "result_and_clone_reshaped": lambda x: (lambda y: (y, y.clone().view(-1)))(x + 1),
  "result_and_its_view": lambda x: (lambda y: (y, y.view(-1), y.t()))(x * 2),
  "qkv_of_one_gemm": _qkv,
  "qkv_one_cloned": lambda x: (lambda q, k, v: (q, k.clone(), v))(*_qkv(x)),
  "row_of_a_result": lambda x: ((x @ W)[0],),
  "result_and_its_row": lambda x: (lambda y: (y, y[0]))(x @ W),
  "two_results_one_value": lambda x: (x.exp(), x.exp().clone()),
  "views_with_dims_of_one": lambda x: (lambda y: (y[None, :, None], y.t()[None]))(x @ W),
}
# where torch_uop hands out views exactly as eager does (elsewhere it may copy what eager shares, never the reverse)
EXACT = {"clone_of_input", "transposed_clone_of_input", "view_of_input", "result_and_its_clone", "result_and_clone_reshaped",
         "result_and_its_view", "qkv_of_one_gemm", "row_of_a_result", "result_and_its_row", "two_results_one_value",
         "views_with_dims_of_one"}


@pytest.mark.parametrize("name", sorted(CASES))
def test_outputs_share_storage_only_where_eager_does(name):
  fn = CASES[name]
  x = torch.randn(4, 8)
  expected = fn(x)
  torch._dynamo.reset()
  got = torch.compile(fn, backend="uop")(x)
  for g, e in zip(got, expected):
    torch.testing.assert_close(g, e)
    assert g.stride() == e.stride()  # dims of size 1 included: a graph reading a saved tensor checks them exactly
  eager, uop = _sharing([*expected, x]), _sharing([*got, x])
  if name in EXACT: assert uop == eager
  for row_u, row_e in zip(uop, eager):
    assert all(e or not u for u, e in zip(row_u, row_e)), f"shares storage where eager does not: {uop} vs {eager}"


def test_writing_to_an_output_leaves_the_input_and_other_outputs_alone():
  x = torch.zeros(3)
  torch._dynamo.reset()
  y = torch.compile(lambda x: x.clone(), backend="uop")(x)
  y.add_(1)
  assert torch.equal(x, torch.zeros(3))
  torch._dynamo.reset()
  a, b = torch.compile(lambda x: (lambda y: (y, y.clone()))(x + 1), backend="uop")(torch.zeros(3))
  b.mul_(5)
  assert a is not b and torch.equal(a, torch.ones(3))


class _Attention(torch.nn.Module):
  """Self-attention as timm's and many vision transformers write it: q, k and v unbound from one projection."""
  def __init__(self, dim: int = 32, heads: int = 4):
    super().__init__()
    self.heads, self.qkv, self.proj = heads, torch.nn.Linear(dim, 3 * dim), torch.nn.Linear(dim, dim)

  def forward(self, x):
    b, n, c = x.shape
    q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
    return self.proj(torch.nn.functional.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, c))


def test_training_saves_q_k_v_as_views_of_one_buffer():
  """An attention block's forward saves q, k and v for its backward as views of the one projection that made them,
  as eager's autograd does, and the step still matches eager."""
  torch.manual_seed(0)
  layer = _Attention()
  x = torch.randn(2, 10, 32)
  layer(x).square().mean().backward()
  expected = [p.grad.clone() for p in layer.parameters()]
  for p in layer.parameters(): p.grad = None
  torch._dynamo.reset()
  with capture() as graphs:
    torch.compile(layer, backend="uop")(x).square().mean().backward()
  for g, p in zip(expected, layer.parameters()): torch.testing.assert_close(p.grad, g, rtol=1e-4, atol=1e-5)
  forward = graphs[0]
  # (views of a computed buffer: "alias" outputs whose slot no input has)
  input_slots = {spec.slot for spec in forward.inputs if spec is not None}
  by_base: dict = {}
  for kind, v, shape in forward.outputs:
    if kind == "alias" and v[0] not in input_slots: by_base.setdefault(v[0], []).append(shape)
  assert any(len(shapes) >= 3 for shapes in by_base.values()), forward.outputs


@torch.library.custom_op("torch_uop_test::probe", mutates_args=())
def _probe(x: torch.Tensor) -> torch.Tensor:
  _PROBED.append([ref() is None for ref in _WATCHED])
  return x.clone()


@_probe.register_fake
def _(x): return torch.empty_like(x)


_PROBED: list = []
_WATCHED: list = []


@pytest.mark.parametrize("general_path", [False, True])
def test_boxed_inputs_are_freed_after_their_last_reader(general_path):
  """Called with a list it may clear (AOTAutograd's boxed convention), a graph lets go of an input once the last
  step that reads it has run: `a` is gone by the time the probe (an op torch runs, after a's reader) is called,
  while `b`, read by the last kernel, is still there."""
  def fn(a, b): return (torch.ops.torch_uop_test.probe(a.sum() * b + 1) * b,)
  a, b = torch.randn(1000), torch.randn(1000)
  graph = compile_graph(fn, a, b)
  expected = fn(a, b)[0]
  for _ in range(2):  # the first call builds the call path, the second runs it
    args = [a.clone(), b.clone()]
    _WATCHED[:] = [weakref.ref(t) for t in args]
    _PROBED.clear()
    if general_path:
      with torch_uop.debug.profile(): out = graph(args)
    else: out = graph(args)
    assert args == []
    torch.testing.assert_close(out[0], expected)
    assert _PROBED == [[True, False]]
