"""Shared test fixtures: every test starts with a fresh Dynamo cache and fresh torch_uop metrics."""
import pytest
import torch
import torch_uop


@pytest.fixture(autouse=True)
def fresh_state():
  torch._dynamo.reset()
  torch_uop.reset_metrics()
  torch.manual_seed(0)
  yield
  torch._dynamo.reset()
