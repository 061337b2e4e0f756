"""Resident memory a process keeps per compiled graph that Dynamo dropped: N compiles of a small MLP with
torch._dynamo.reset() between them, torch_uop against backend="eager", each case in a fresh process.

Cases: `same` (one graph compiled again and again), `distinct` (50 batch sizes in turn: new kernels for the first
50) with the disk cache in a fresh directory, and `distinct, no disk cache` (every kernel through LLVM each time).
KB per compile is (RSS after the N compiles - RSS after 30 warm-up compiles) / N.

  python benchmarks/bench_compile_memory.py            # 1000 compiles per case
  python benchmarks/bench_compile_memory.py --n 200
"""
from __future__ import annotations
import argparse
import os
import subprocess
import sys
import tempfile

WORKER = r"""
import gc, os, sys, torch, torch_uop
backend, n, distinct = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "distinct"
def rss():
  with open("/proc/self/statm") as f: return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
def one(i):
  x = torch.randn(8 + (i % 50 if distinct else 0), 16)
  torch._dynamo.reset()
  c = torch.compile(m, backend=backend)
  with torch.no_grad():
    c(x)
    torch.testing.assert_close(c(x), m(x))
for i in range(30): one(i)
gc.collect(); r0 = rss()
for i in range(n): one(i)
gc.collect()
print(f"KB {(rss() - r0) / n / 1024:.2f}")
"""


def run(backend: str, n: int, kind: str, env: dict) -> float:
  out = subprocess.run([sys.executable, "-c", WORKER, backend, str(n), kind], capture_output=True, text=True,
                       env={**os.environ, **env}, timeout=3600)
  if out.returncode != 0: raise RuntimeError(out.stderr[-2000:])
  return float(next(l for l in out.stdout.splitlines() if l.startswith("KB")).split()[1])


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--n", type=int, default=1000)
  args = ap.parse_args(argv)
  rows = []
  with tempfile.TemporaryDirectory() as root:
    cases = [("same", "same", {}), ("distinct", "distinct", {}), ("distinct, no disk cache", "distinct", {"TORCH_UOP_CACHE": "0"})]
    for label, kind, extra in cases:
      env = {"TORCH_UOP_CACHE_DIR": os.path.join(root, label.replace(" ", "_").replace(",", "")), **extra}
      eager, uop = run("eager", args.n, kind, env), run("uop", args.n, kind, env)
      rows.append((label, eager, uop))
      print(f"{label:26s} eager {eager:7.1f} KB/compile   uop {uop:7.1f} KB/compile   uop - eager {uop - eager:+6.1f} KB", flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
