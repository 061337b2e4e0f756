"""The disk cache: a second process compiling the same model takes whole graphs from the graph cache (no
AOTAutograd, lowering, codegen or LLVM); with the graph cache off, it still skips LLVM (kernel objects)."""
import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
  import torch, torch_uop
  torch.manual_seed(0)
  m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
  x = torch.randn(8, 16)
  out = torch.compile(m, backend="uop")(x)
  torch.testing.assert_close(out, m(x))
  m = torch_uop.metrics()
  print("HITS", m["cache_hits"], "KERNELS", m["kernels_compiled"], "GRAPHS", m["graph_cache_hits"])
""")


def _run(cache_dir, **env):
  full = {**os.environ, "TORCH_UOP_CACHE_DIR": str(cache_dir), **env}
  out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=full, timeout=300)
  assert out.returncode == 0, out.stderr[-2000:]
  line = [l for l in out.stdout.splitlines() if l.startswith("HITS")][0].split()
  return int(line[1]), int(line[3]), int(line[5])


def test_second_process_hits_the_graph_cache(tmp_path):
  hits, kernels, graphs = _run(tmp_path)
  assert hits == 0 and kernels > 0 and graphs == 0
  assert any(f.endswith(".graph") for _, _, files in os.walk(tmp_path) for f in files)
  hits, kernels2, graphs = _run(tmp_path)
  assert graphs == 1 and kernels2 == kernels, "the whole graph came from the cache, with the same kernels"


def test_second_process_hits_the_kernel_cache(tmp_path):
  hits, kernels, _ = _run(tmp_path, TORCH_UOP_GRAPH_CACHE="0")
  assert hits == 0 and kernels > 0
  assert any(f.endswith(".o") for _, _, files in os.walk(tmp_path) for f in files)
  hits, _, graphs = _run(tmp_path, TORCH_UOP_GRAPH_CACHE="0")
  assert hits >= 1 and graphs == 0


def test_cache_can_be_turned_off(tmp_path):
  _run(tmp_path, TORCH_UOP_CACHE="0")
  hits, _, graphs = _run(tmp_path, TORCH_UOP_CACHE="0")
  assert hits == 0 and graphs == 0
  assert not any(files for _, _, files in os.walk(tmp_path))
