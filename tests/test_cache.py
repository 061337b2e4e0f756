"""The disk cache of compiled kernels: a second process compiling the same graph skips LLVM."""
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
  print("HITS", torch_uop.metrics()["cache_hits"], "KERNELS", torch_uop.metrics()["kernels_compiled"])
""")


def _run(cache_dir, **env):
  full = {**os.environ, "TORCH_UOP_CACHE_DIR": str(cache_dir), **env}
  out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=full, timeout=300)
  assert out.returncode == 0, out.stderr[-2000:]
  line = [l for l in out.stdout.splitlines() if l.startswith("HITS")][0].split()
  return int(line[1]), int(line[3])


def test_second_process_hits_the_cache(tmp_path):
  hits, kernels = _run(tmp_path)
  assert hits == 0 and kernels > 0
  assert any(f.endswith(".o") for _, _, files in os.walk(tmp_path) for f in files)
  hits, _ = _run(tmp_path)
  assert hits >= 1


def test_cache_can_be_turned_off(tmp_path):
  _run(tmp_path, TORCH_UOP_CACHE="0")
  hits, _ = _run(tmp_path, TORCH_UOP_CACHE="0")
  assert hits == 0
  assert not any(files for _, _, files in os.walk(tmp_path))
