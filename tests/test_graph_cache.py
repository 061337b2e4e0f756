"""The graph cache (runtime/graph_cache.py): a second compile of the same graph, here after torch._dynamo.reset()
in the same process (tests/test_cache.py does it across processes), takes the whole compiled graph from disk and
still agrees with eager: inference, training with BatchNorm's in-place running statistics, input mutations,
fallback steps, and the errors AOTAutograd's runtime gives."""
import copy
import pytest
import torch
import torch.nn.functional as F
import torch_uop
import torch_uop.debug
from torch_uop.testing.models import MLP, CNN, Block
from helpers import fresh_compiled


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
  monkeypatch.setenv("TORCH_UOP_CACHE_DIR", str(tmp_path))
  monkeypatch.delenv("TORCH_UOP_CACHE", raising=False)
  monkeypatch.delenv("TORCH_UOP_GRAPH_CACHE", raising=False)


def _compile_twice(run):
  """Call run() twice (it compiles through fresh_compiled, so after a Dynamo reset); returns each run's metrics."""
  metrics = []
  for _ in range(2):
    run()
    metrics.append(torch_uop.metrics())
  return metrics


def test_inference_graph_comes_from_the_cache():
  model, x = MLP().eval(), torch.randn(16, 32)
  def run():
    with torch.no_grad():
      torch.testing.assert_close(fresh_compiled(model)(x), model(x))
  cold, warm = _compile_twice(run)
  assert cold["graph_cache_hits"] == 0 and warm["graph_cache_hits"] == 1
  assert "dynamo_graph_cache" in warm["compile_time_s"], "the Dynamo-level entry skipped AOTAutograd"
  assert warm["kernels_compiled"] == cold["kernels_compiled"] and warm["nodes_lowered"] == cold["nodes_lowered"]


@pytest.mark.parametrize("make", [CNN, Block], ids=["cnn", "tf"])
def test_training_steps_from_the_cache_match_eager(make):
  torch.manual_seed(0)
  initial = make()
  x = torch.randn(8, 3, 32, 32) if make is CNN else torch.randint(0, 100, (4, 32))
  y = torch.randint(0, 10, (8,)) if make is CNN else torch.randint(0, 100, (4, 32))
  loss_of = lambda out: F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
  for run in range(2):  # the second run's graphs all come from the cache
    model, twin = copy.deepcopy(initial), copy.deepcopy(initial)
    compiled = fresh_compiled(twin)
    opt_ref = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    opt = torch.optim.SGD(twin.parameters(), lr=0.1, momentum=0.9)
    for _ in range(3):
      ref = loss_of(model(x))
      ref.backward()
      loss = loss_of(compiled(x))
      loss.backward()
      torch.testing.assert_close(loss, ref, rtol=1e-4, atol=1e-5)
      for (n, p), q in zip(twin.named_parameters(), model.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=n)
      opt_ref.step(), opt.step(), opt_ref.zero_grad(), opt.zero_grad()
    for (n, b), c in zip(twin.named_buffers(), model.buffers()): torch.testing.assert_close(b, c, msg=n)
    m = torch_uop.metrics()
    if run == 1:
      assert m["graph_cache_hits"] == m["graphs_compiled"] == 2 and "dynamo_graph_cache" in m["compile_time_s"]


def test_input_mutation_from_the_cache():
  def f(x, y):
    x.mul_(2)
    return x + y
  for run in range(2):
    x, y = torch.randn(5, 7), torch.randn(5, 7)
    xe = x.clone()
    with torch.no_grad():
      out = fresh_compiled(f)(x, y)
    torch.testing.assert_close(out, f(xe, y))
    torch.testing.assert_close(x, xe)
  assert torch_uop.metrics()["graph_cache_hits"] == 1


def test_fallback_steps_survive_the_cache():
  # a 20x20 determinant is beyond the native LU (n <= 16): an ATen step between two kernels
  fn = lambda a: torch.linalg.det(a * 2 + 1) * 3
  a = torch.randn(3, 20, 20)
  def run(): torch.testing.assert_close(fresh_compiled(fn)(a), fn(a))
  cold, warm = _compile_twice(run)
  assert warm["graph_cache_hits"] == 1
  assert warm["nodes_fallen_back"] == cold["nodes_fallen_back"] == {"_linalg_det.default": 1}
  assert warm["fallback_steps_run"] == 1 and warm["kernels_compiled"] == 2


def test_grad_mode_is_part_of_the_key():
  model, x = MLP(), torch.randn(4, 32)
  with torch.no_grad(): fresh_compiled(model)(x)
  twin = copy.deepcopy(model)
  out = fresh_compiled(twin)(x)  # a training graph: not the no-grad entry
  out.sum().backward()
  model(x).sum().backward()
  for p, q in zip(twin.parameters(), model.parameters()): torch.testing.assert_close(p.grad, q.grad)
  assert torch_uop.metrics()["graph_cache_hits"] == 0


def test_double_backward_through_a_cached_graph_raises():
  fn = lambda x: (x.sin() * x).sum()
  for run in range(2):
    x = torch.randn(6, requires_grad=True)
    (g,) = torch.autograd.grad(fresh_compiled(fn)(x), x, create_graph=True)
    torch.testing.assert_close(g, x.cos() * x + x.sin())
    with pytest.raises(RuntimeError):
      g.sum().backward()
  assert torch_uop.metrics()["graph_cache_hits"] == 2


def test_graph_cache_option_off():
  fn = lambda x: (x * 2 + 1).relu()
  x = torch.randn(32)
  for _ in range(2):
    torch.testing.assert_close(fresh_compiled(fn, {"graph_cache": False})(x), fn(x))
    assert torch_uop.metrics()["graph_cache_hits"] == 0


@torch.library.custom_op("torch_uop_test::scale_shift", mutates_args=())
def _scale_shift(x: torch.Tensor) -> torch.Tensor:
  return x * 2 + 1


@_scale_shift.register_fake
def _(x): return torch.empty_like(x)


def test_custom_op_graphs_skip_the_dynamo_level():
  # a user's op may change between processes, so its graph is not reused whole; it still compiles (and falls back)
  fn = lambda x: _scale_shift(x.sin()).cos()
  x = torch.randn(64)
  def run(): torch.testing.assert_close(fresh_compiled(fn)(x), fn(x))
  _, warm = _compile_twice(run)
  assert "dynamo_graph_cache" not in warm["compile_time_s"]


def test_tensor_constants_from_the_cache_are_real_tensors():
  # cache entries are read while AOTAutograd's fake mode is active; a graph constant (here the index [2, 0]) must not
  # come back as a FakeTensor
  z, w = torch.randn(4, 5, dtype=torch.complex64), torch.randn(2, 5, dtype=torch.complex64)
  fn = lambda z, w: (torch.constant_pad_nd(z, (1, 2, 0, 1), 3.0), z[1:3, ::2], torch.cat([z, w]), z.t().clone(),
                     z.permute(1, 0).reshape(-1), z.unsqueeze(0).expand(2, 4, 5), z.flip(0), z[[2, 0]],
                     torch.where(z.real > 0, z, w[0]), z.unbind(0)[1])
  def run():
    for got, want in zip(fresh_compiled(fn)(z, w), fn(z, w)): torch.testing.assert_close(got, want)
  cold, warm = _compile_twice(run)
  assert warm["graph_cache_hits"] > cold["graph_cache_hits"]


def _deep_mlp():
  torch.manual_seed(0)
  layers = []
  for _ in range(8): layers += [torch.nn.Linear(256, 256), torch.nn.Tanh()]
  return torch.nn.Sequential(*layers)


def _assert_same_grads(model, ref):
  for p, q in zip(model.parameters(), ref.parameters()):
    torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-4)


def test_cached_backward_frees_saved_activations_as_it_goes():
  """A backward loaded from the cache frees each saved activation after its last reader, as AOTAutograd's own
  backward does: before, the wrapper held all of them to its end, and a training step's peak held every layer's
  activation and every weight's gradient at once (here 7 x 256 KiB more)."""
  x = torch.randn(256, 256)
  peaks = []
  for run in range(2):  # the second run's graphs come from the cache
    model = _deep_mlp()
    compiled = fresh_compiled(model)
    def step():
      model.zero_grad(set_to_none=True)
      compiled(x).square().sum().backward()
    step(), step()  # the measured step finds every kept arena made
    peaks.append(torch_uop.debug.peak_alloc_bytes(step))
    ref = _deep_mlp()
    ref(x).square().sum().backward()
    _assert_same_grads(model, ref)
  assert torch_uop.metrics()["graph_cache_hits"] == 2
  cold, warm = peaks
  assert warm <= cold + (64 << 10), (cold, warm)


def test_cached_backward_with_retain_graph_runs_twice():
  """retain_graph=True keeps the saved activations of a cached graph for a second backward."""
  x = torch.randn(64, 256)
  for run in range(2):
    model = _deep_mlp()
    loss = fresh_compiled(model)(x).square().sum()
    loss.backward(retain_graph=True)
    loss.backward()
    ref = _deep_mlp()
    ref_loss = ref(x).square().sum()
    ref_loss.backward(retain_graph=True)
    ref_loss.backward()
    _assert_same_grads(model, ref)
  assert torch_uop.metrics()["graph_cache_hits"] == 2
