"""BEAM search (core/search.py, runtime/tuning.py): option parsing, results equal to eager, wrong candidates rejected,
winners cached on disk so a second process skips the search."""
import os
import subprocess
import sys
import textwrap
import pytest
import torch
import torch_uop
from torch_uop.config import Config
from torch_uop.core import codegen, search
from torch_uop.runtime import tuning
from torch_uop.core.opt import KernelOpts


@pytest.fixture
def quick_search(monkeypatch, tmp_path):
  monkeypatch.setattr(search, "MAX_SEARCH_S", 2.0)
  monkeypatch.setattr(search, "MAX_CANDIDATES", 8)
  monkeypatch.setenv("TORCH_UOP_CACHE_DIR", str(tmp_path))
  return tmp_path


def test_beam_option_and_environment(monkeypatch):
  monkeypatch.delenv("TORCH_UOP_BEAM", raising=False)
  assert Config.from_options().beam == 0
  assert Config.from_options({"beam": "3"}).beam == 3
  monkeypatch.setenv("TORCH_UOP_BEAM", "2")
  assert Config.from_options().beam == 2
  assert Config.from_options({"beam": 0}).beam == 0  # options win
  with pytest.raises(ValueError, match="beam"): Config.from_options({"beam": -1})
  with pytest.raises(ValueError, match="beam"): Config.from_options({"beam": "wide"})


def test_neighbours_are_valid_opts():
  shape = (64, 48, 1)
  for o in search.neighbours(KernelOpts(((1, 4),), 0, None), shape, reduces=True):
    assert all(shape[a] % f == 0 and f <= search.MAX_AXIS_UPCAST for a, f in o.upcast)
    assert o.split_axis is None or shape[o.split_axis] // o.factor(o.split_axis) >= 2
    assert o.vector_axis is None or o.vector_axis in dict(o.upcast)
    assert all(a != 2 for a, _ in o.upcast)  # a size-1 axis is never upcast


def test_default_does_not_search(quick_search):
  a, b = torch.randn(64, 64), torch.randn(64, 64)
  torch.testing.assert_close(torch.compile(lambda a, b: a @ b, backend="uop")(a, b), a @ b)
  m = torch_uop.metrics()
  assert m["kernels_searched"] == 0 and "search" not in m["compile_time_s"]
  assert not any(f.endswith(".tune.json") for _, _, fs in os.walk(quick_search) for f in fs)


@pytest.mark.parametrize("fn, b_shape", [(lambda a, b: a @ b, (96, 64)), (lambda a, b: torch.softmax(a @ b.T + 1, -1), (64, 96))])
def test_beam_matches_eager(quick_search, fn, b_shape):
  a, b = torch.randn(64, 96), torch.randn(b_shape)
  out = torch.compile(fn, backend="uop", options={"beam": 2})(a, b)
  torch.testing.assert_close(out, fn(a, b), rtol=1e-4, atol=1e-4)
  m = torch_uop.metrics()
  assert m["kernels_searched"] >= 1 and m["compile_time_s"]["search"] > 0
  assert any(f.endswith(".tune.json") for _, _, fs in os.walk(quick_search) for f in fs)


def test_wrong_candidate_is_rejected(quick_search, monkeypatch):
  # an upcast by 7 of 60 rows, built here without its partial last tile, skips the last 4 rows: its output differs
  # from the heuristic's (whose tiles, 3 or 4 rows, divide 60) and must lose, however fast it runs
  bad = KernelOpts(((0, 7),), 0, None)
  monkeypatch.setattr(search, "neighbours", lambda opts, shape, reduces: [bad])
  monkeypatch.setattr(codegen, "upcast_trips", lambda size, factor, clamped=False: size // factor)
  timings = []
  real_run = tuning._Bench.run

  def run(self, opts, cutoff=float("inf")):
    t = real_run(self, opts, cutoff)
    timings.append((opts, t))
    return 1e-9 if opts == bad and t is not None else t  # were it accepted, it would win
  monkeypatch.setattr(tuning._Bench, "run", run)
  a, b = torch.randn(60, 64), torch.randn(64, 60)
  torch.testing.assert_close(torch.compile(lambda a, b: a @ b, backend="uop", options={"beam": 2})(a, b), a @ b)
  assert (bad, None) in timings
  assert torch_uop.metrics()["kernels_searched"] == 1


SCRIPT = textwrap.dedent("""
  import torch, torch_uop
  import torch_uop.core.search as search
  search.MAX_SEARCH_S, search.MAX_CANDIDATES = 2.0, 6
  a, b = torch.randn(64, 64), torch.randn(64, 64)
  out = torch.compile(lambda a, b: a @ b, backend="uop", options={"beam": 2})(a, b)
  torch.testing.assert_close(out, a @ b)
  m = torch_uop.metrics()
  print("SEARCHED", m["kernels_searched"], "HITS", m["search_cache_hits"])
""")


def _compile_matmul_with_beam():
  a, b = torch.randn(64, 64), torch.randn(64, 64)
  torch._dynamo.reset()
  torch_uop.reset_metrics()
  torch.testing.assert_close(torch.compile(lambda a, b: a @ b, backend="uop", options={"beam": 2})(a, b), a @ b)
  m = torch_uop.metrics()
  return m["kernels_searched"], m["search_cache_hits"]


def test_second_process_skips_the_search(quick_search, monkeypatch):
  # one process searches and stores the winner; this one (another process) finds it. The graph cache would
  # hand this process the whole compiled graph, never asking for the winner: off, to test the tuning cache
  monkeypatch.setenv("TORCH_UOP_GRAPH_CACHE", "0")
  env = {**os.environ, "TORCH_UOP_CACHE_DIR": str(quick_search)}
  out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=300,
                       cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  assert out.returncode == 0, out.stderr[-2000:]
  assert "SEARCHED 1 HITS 0" in out.stdout
  assert _compile_matmul_with_beam() == (0, 1)


def test_search_cache_can_be_turned_off(quick_search, monkeypatch):
  monkeypatch.setenv("TORCH_UOP_CACHE", "0")
  assert _compile_matmul_with_beam() == (1, 0)
  assert _compile_matmul_with_beam() == (1, 0)
  assert not any(fs for _, _, fs in os.walk(quick_search))


def test_a_damaged_tuning_entry_is_searched_again(quick_search, monkeypatch):
  monkeypatch.setenv("TORCH_UOP_GRAPH_CACHE", "0")
  assert _compile_matmul_with_beam() == (1, 0)
  paths = [os.path.join(d, f) for d, _, fs in os.walk(quick_search) for f in fs if f.endswith(".tune.json")]
  assert paths
  for p in paths:
    with open(p, "rb") as f: data = f.read()
    with open(p, "wb") as f: f.write(data[:len(data) // 2])
  assert _compile_matmul_with_beam() == (1, 0), "the damaged winner is not read: the kernel is searched again"
  assert _compile_matmul_with_beam() == (0, 1), "and the new winner replaced it"
