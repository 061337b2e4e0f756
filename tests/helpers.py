"""Test helpers: compile with backend="uop" and compare with eager."""
from __future__ import annotations
import torch
import torch_uop


def _clone(x):
  if isinstance(x, torch.Tensor): return x.detach().clone().requires_grad_(x.requires_grad)
  if isinstance(x, (list, tuple)): return type(x)(_clone(a) for a in x)
  return x


def fresh_compiled(fn, options=None, dynamic=None):
  """torch.compile(fn, backend="uop") with Dynamo's caches (and counters) and torch_uop's metrics cleared first."""
  torch._dynamo.reset()
  torch._dynamo.utils.counters.clear()
  torch_uop.reset_metrics()
  return torch.compile(fn, backend="uop", options=options or {}, dynamic=dynamic)


def assert_ran_natively() -> dict:
  """Since the last reset, torch_uop compiled a graph and ran every node of it as generated kernels."""
  m = torch_uop.metrics()
  assert m["graphs_compiled"] >= 1, "torch_uop never saw a graph"
  assert m["fallback_nodes_total"] == 0 and m["graphs_fallen_back"] == 0, f"fell back: {m['nodes_fallen_back']}"
  return m


def check_against_eager(fn, *inputs, rtol=None, atol=None, expect_native: bool = True, options=None, **kw):
  """Run fn eagerly and through torch.compile(backend="uop"); assert the outputs are close.
  With expect_native, also assert that no node fell back to ATen. Returns the metrics."""
  expected = fn(*_clone(inputs), **kw)
  actual = fresh_compiled(fn, options)(*_clone(inputs), **kw)
  torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol, equal_nan=True)
  if expect_native: return assert_ran_natively()
  m = torch_uop.metrics()
  assert m["graphs_compiled"] >= 1, "torch_uop never saw a graph"
  return m


def check_grads_against_eager(fn, *inputs, rtol=1e-4, atol=1e-5, expect_native: bool = True):
  """Compare outputs and input gradients (for inputs with requires_grad) of a training step."""
  def run(f, xs):
    out = f(*xs)
    grad = torch.ones_like(out) if out.dim() == 0 else torch.linspace(-1, 1, out.numel()).reshape(out.shape).to(out.dtype)
    out.backward(grad)
    return out.detach(), [x.grad for x in xs if isinstance(x, torch.Tensor) and x.requires_grad]
  ref_out, ref_grads = run(fn, _clone(inputs))
  torch._dynamo.reset()
  torch_uop.reset_metrics()
  out, grads = run(torch.compile(fn, backend="uop"), _clone(inputs))
  torch.testing.assert_close(out, ref_out, rtol=rtol, atol=atol)
  for g, r in zip(grads, ref_grads): torch.testing.assert_close(g, r, rtol=rtol, atol=atol)
  m = torch_uop.metrics()
  if expect_native:
    assert m["fallback_nodes_total"] == 0, f"fell back: {m['nodes_fallen_back']}"
  return m
