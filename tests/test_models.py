"""Whole models through backend="uop": an MLP, a small CNN and a transformer block.

Each model is checked in inference (eval + no_grad), in one training step (cross-entropy loss,
backward, every parameter's .grad and BatchNorm running statistics), over a few SGD steps (the
optimizer itself runs eagerly), and over 20 steps with the optimizer's step compiled too (every loss,
then the parameters and buffers). Every case must compile with no ATen fallback at all.
"""
import copy
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch_uop
from torch_uop.testing.models import MLP, CNN, Block

RTOL, ATOL = 1e-4, 1e-5


def make_case(name):
  """(model, input, integer targets) for one model, built from the test's seeded RNG."""
  if name == "mlp": model, x, y = MLP(), torch.randn(8, 32), torch.randint(0, 10, (8,))
  elif name == "cnn": model, x, y = CNN(), torch.randn(4, 3, 16, 16), torch.randint(0, 10, (4,))
  else: model, x, y = Block(), torch.randint(0, 100, (2, 8)), torch.randint(0, 100, (2, 8))
  return model, x, y


def loss_fn(out, y): return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))


def assert_no_fallback():
  m = torch_uop.metrics()
  assert m["graphs_compiled"] >= 1, "torch_uop never saw a graph"
  assert m["fallback_nodes_total"] == 0, f"fell back: {m['nodes_fallen_back']}"
  assert m["graphs_fallen_back"] == 0
  return m


def assert_params_grads_close(ref: nn.Module, got: nn.Module):
  for (name, p_ref), (_, p_got) in zip(ref.named_parameters(), got.named_parameters()):
    assert p_got.grad is not None, f"{name} has no gradient"
    torch.testing.assert_close(p_got.grad, p_ref.grad, rtol=RTOL, atol=ATOL, msg=lambda m: f"grad of {name}: {m}")


def assert_buffers_close(ref: nn.Module, got: nn.Module):
  for (name, b_ref), (_, b_got) in zip(ref.named_buffers(), got.named_buffers()):
    torch.testing.assert_close(b_got, b_ref, rtol=RTOL, atol=ATOL, msg=lambda m: f"buffer {name}: {m}")


MODELS = ["mlp", "cnn", "transformer"]


@pytest.mark.parametrize("name", MODELS)
def test_inference(name):
  model, x, _ = make_case(name)
  model.eval()
  compiled = torch.compile(copy.deepcopy(model), backend="uop")
  with torch.no_grad():
    expected = model(x)
    actual = compiled(x)
    torch.testing.assert_close(actual, expected, rtol=RTOL, atol=ATOL)
    # a second call reuses the compiled graph and still agrees
    x2 = torch.randint_like(x, 0, 100) if not x.is_floating_point() else torch.randn_like(x)
    torch.testing.assert_close(compiled(x2), model(x2), rtol=RTOL, atol=ATOL)
  m = assert_no_fallback()
  assert m["graphs_compiled"] == 1, "one inference graph, compiled once"
  assert m["kernels_compiled"] >= 1


@pytest.mark.parametrize("name", MODELS)
def test_training_step(name):
  model, x, y = make_case(name)
  twin = copy.deepcopy(model)
  compiled = torch.compile(twin, backend="uop")
  ref_loss = loss_fn(model(x), y)
  ref_loss.backward()
  loss = loss_fn(compiled(x), y)
  loss.backward()
  torch.testing.assert_close(loss, ref_loss, rtol=RTOL, atol=ATOL)
  assert_params_grads_close(model, twin)
  # BatchNorm running_mean / running_var / num_batches_tracked are updated in place by the forward graph
  assert_buffers_close(model, twin)
  if name == "cnn": assert int(twin.b1.num_batches_tracked) == 1
  m = assert_no_fallback()
  assert m["graphs_compiled"] == 2, "a forward and a backward graph"


@pytest.mark.parametrize("name", MODELS)
def test_sgd_steps(name):
  model, x, y = make_case(name)
  twin = copy.deepcopy(model)
  compiled = torch.compile(twin, backend="uop")
  opt_ref = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
  opt = torch.optim.SGD(twin.parameters(), lr=0.05, momentum=0.9)
  ref_losses, losses = [], []
  for _ in range(3):
    for mod, fwd, o, out in ((model, model, opt_ref, ref_losses), (twin, compiled, opt, losses)):
      o.zero_grad()
      loss = loss_fn(fwd(x), y)
      loss.backward()
      o.step()
      out.append(loss.item())
  torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=RTOL, atol=ATOL)
  assert ref_losses[-1] < ref_losses[0], "the reference itself should learn"
  for (name_, p_ref), (_, p) in zip(model.named_parameters(), twin.named_parameters()):
    torch.testing.assert_close(p, p_ref, rtol=RTOL, atol=ATOL, msg=lambda m: f"param {name_}: {m}")
  assert_buffers_close(model, twin)
  m = assert_no_fallback()
  assert m["graphs_compiled"] == 2, "parameter updates must not cause recompiles"
  assert m["kernels_launched"] == 3 * m["kernels_compiled"]


# Adam's g/sqrt(v) turns rounding noise in a gradient that is zero in exact arithmetic into visible drift: the
# CNN's convolution biases feed BatchNorm, and the attention's key bias shifts every score of a query alike
# (softmax cancels it), so those two models train with SGD with momentum
TRAIN_20_OPTIMIZERS = {"mlp": lambda p: torch.optim.Adam(p, lr=1e-3),
                       "transformer": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9),
                       "cnn": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9)}


@pytest.mark.parametrize("name", MODELS)
def test_twenty_steps_with_a_compiled_optimizer(name):
  model, x, y = make_case(name)
  twin = copy.deepcopy(model)
  compiled = torch.compile(twin, backend="uop")
  opt, opt_twin = TRAIN_20_OPTIMIZERS[name](model.parameters()), TRAIN_20_OPTIMIZERS[name](twin.parameters())
  step = torch.compile(opt_twin.step, backend="uop")
  for i in range(20):
    ref = loss_fn(model(x), y)
    ref.backward()
    opt.step()
    opt.zero_grad()
    loss = loss_fn(compiled(x), y)
    loss.backward()
    step()
    opt_twin.zero_grad()
    torch.testing.assert_close(loss, ref, rtol=RTOL, atol=ATOL, msg=lambda m: f"step {i}: {m}")
    # the optimizer's first steps create its state (momentum buffers, Adam's moments): graphs settle by step 3
    if i == 2: settled = torch_uop.metrics()["graphs_compiled"]
  for (n, p), q in zip(twin.named_parameters(), model.parameters()):
    torch.testing.assert_close(p, q, rtol=RTOL, atol=ATOL, msg=lambda m: f"{n}: {m}")
  assert_buffers_close(model, twin)
  assert_no_fallback()
  assert torch_uop.metrics()["graphs_compiled"] == settled, "a graph was compiled after the third step"
