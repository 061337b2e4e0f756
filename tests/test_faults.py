"""Faults injected into compiling and running: LLVM failing in the middle of a graph, a fallback op raising at
run time, an interrupt during compile, a cache directory that cannot be created. Each ends in eager's answer
or eager's exception, and the next call or compile works. (Damaged cache entries, a full disk and untrusted
caches: tests/test_cache.py; a helper process dying: tests/test_executor.py.)"""
from __future__ import annotations
import os
import pytest
import torch
import torch_uop
from helpers import fresh_compiled


def _model(x): return (torch.relu(x @ x.T) + x.sum()).softmax(-1).sum(0)


@pytest.fixture
def compile_here(monkeypatch, tmp_path):
  """LLVM runs in this process (no helpers), on a fresh cache directory, so its functions can be patched."""
  from torch_uop.runtime import cpu
  monkeypatch.setenv("TORCH_UOP_COMPILE_WORKERS", "0")
  monkeypatch.setenv("TORCH_UOP_CACHE_DIR", str(tmp_path))
  monkeypatch.setattr(cpu, "_workers", None)
  yield cpu
  monkeypatch.setattr(cpu, "_workers", None)


def test_llvm_failing_mid_graph_falls_back_to_eager(compile_here, monkeypatch):
  real, calls = compile_here.compile_module, []
  def flaky(source, *a):
    calls.append(source)
    if len(calls) == 2: raise RuntimeError("LLVM ERROR: injected failure")
    return real(source, *a)
  monkeypatch.setattr(compile_here, "compile_module", flaky)
  x = torch.randn(6, 6)
  torch.testing.assert_close(fresh_compiled(_model)(x), _model(x))
  assert len(calls) >= 2 and torch_uop.metrics()["graphs_fallen_back"] == 1
  monkeypatch.setattr(compile_here, "compile_module", real)
  torch.testing.assert_close(fresh_compiled(_model)(x), _model(x))
  assert torch_uop.metrics()["graphs_fallen_back"] == 0, "the next compile is native"


def test_an_interrupt_during_compile_leaves_no_entry(compile_here, monkeypatch, tmp_path):
  real = compile_here.compile_module
  def interrupted(*a): raise KeyboardInterrupt
  monkeypatch.setattr(compile_here, "compile_module", interrupted)
  x = torch.randn(6, 6)
  with pytest.raises(KeyboardInterrupt): fresh_compiled(_model)(x)
  assert not [f for _, _, files in os.walk(tmp_path) for f in files], "no entry and no temp file"
  monkeypatch.setattr(compile_here, "compile_module", real)
  torch.testing.assert_close(fresh_compiled(_model)(x), _model(x))
  assert torch_uop.metrics()["graphs_fallen_back"] == 0


@torch.library.custom_op("torch_uop_tests::picky", mutates_args=())
def picky(x: torch.Tensor) -> torch.Tensor:
  if bool((x < 0).any()): raise ValueError("picky: negative input")
  return x * 2


@picky.register_fake
def _(x): return torch.empty_like(x)


def test_a_fallback_op_raising_at_run_time_reaches_the_caller():
  fn = lambda x: picky(x.exp() - 1).sum(0) + x.mean()
  compiled = fresh_compiled(fn, options={"graph_cache": False})
  good, bad = torch.rand(4, 3), -torch.rand(4, 3)
  torch.testing.assert_close(compiled(good), fn(good))
  assert torch_uop.metrics()["fallback_nodes_total"] == 1, "picky ran as a fallback step between kernels"
  with pytest.raises(ValueError, match="picky: negative input"): fn(bad)
  with pytest.raises(ValueError, match="picky: negative input"): compiled(bad)
  torch.testing.assert_close(compiled(good), fn(good))  # the next call works


def test_a_cache_directory_that_cannot_be_created(tmp_path, monkeypatch):
  blocker = tmp_path / "a_file"
  blocker.write_text("not a directory")
  monkeypatch.setenv("TORCH_UOP_CACHE_DIR", str(blocker / "cache"))
  x = torch.randn(6, 6)
  torch.testing.assert_close(fresh_compiled(_model)(x), _model(x))
  assert torch_uop.metrics()["graphs_fallen_back"] == 0
