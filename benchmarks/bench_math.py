"""Elementwise math and row kernels against the machine's copy bandwidth: eager, torch_uop (and Inductor with
--inductor) on float32 tensors, ms per call, GB/s moved, percent of a plain copy, and ns per element per thread.

The cases are the vectorized-math functions of core/transcendental.py alone and in the mixes models make (GELU,
SiLU, the issue's tanh * sigmoid + sqrt mix), plus softmax and layer norm rows. `--interleave 1,2` compiles the
torch_uop cases once per value of the LLVM renderer's FORCED_SIMD_INTERLEAVE (vector iterations a forced-SIMD loop
runs side by side; 0: LLVM's choice, the default), to tune it on a new CPU in one run.

  python benchmarks/bench_math.py [--threads N] [--n ELEMENTS] [--interleave 0,2] [--inductor] [--only exp,mix]
                                  [--out FILE.json]
"""
from __future__ import annotations
import argparse
import json
import math
import os
import platform
import statistics
import time

import torch
import torch.nn.functional as F


def _cases(n: int):
  rows = max(1, n // 1024)
  a, b = torch.randn(n), torch.randn(n)
  pos = torch.rand(n) * 10 + 1e-3
  m = torch.randn(rows, 1024)
  w, bias = torch.randn(1024), torch.randn(1024)
  # (name, function, inputs, bytes moved per call)
  return [
    ("exp", torch.exp, (a,), 2 * a.nbytes),
    ("sigmoid", torch.sigmoid, (a,), 2 * a.nbytes),
    ("tanh", torch.tanh, (a,), 2 * a.nbytes),
    ("log", torch.log, (pos,), 2 * a.nbytes),
    ("sin", torch.sin, (a,), 2 * a.nbytes),
    ("erf", torch.erf, (a,), 2 * a.nbytes),
    ("gelu", F.gelu, (a,), 2 * a.nbytes),
    ("gelu_tanh", lambda x: F.gelu(x, approximate="tanh"), (a,), 2 * a.nbytes),
    ("silu", F.silu, (a,), 2 * a.nbytes),
    ("mix", lambda x, y: torch.tanh(x) * torch.sigmoid(y) + torch.sqrt(torch.abs(x - y)) * 0.5, (a, b), 3 * a.nbytes),
    ("add", torch.add, (a, b), 3 * a.nbytes),
    ("softmax", lambda x: torch.softmax(x * 0.125, -1), (m,), 2 * m.nbytes),
    ("layer_norm", lambda x: F.layer_norm(x, (1024,), w, bias), (m,), 2 * m.nbytes),
  ]


def _time(fn, args, budget_s: float = 0.4) -> float:
  """Median seconds of one call over rounds that each take about 50 ms."""
  fn(*args)
  t0 = time.perf_counter(); fn(*args); one = max(time.perf_counter() - t0, 1e-6)
  reps = max(1, int(0.05 / one))
  samples = []
  deadline = time.perf_counter() + budget_s
  while len(samples) < 5 or time.perf_counter() < deadline:
    t0 = time.perf_counter()
    for _ in range(reps): fn(*args)
    samples.append((time.perf_counter() - t0) / reps)
    if len(samples) >= 40: break
  return statistics.median(samples)


def cpu_name() -> str:
  try:
    with open("/proc/cpuinfo") as fh:
      return next(line.split(":", 1)[1].strip() for line in fh if line.startswith("model name"))
  except (OSError, StopIteration):
    return platform.processor() or platform.machine()


def copy_bandwidth(n: int) -> float:
  x = torch.randn(max(n, 8 << 20)); y = torch.empty_like(x)
  return 2 * x.nbytes / _time(lambda: y.copy_(x), ())


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--threads", type=int, default=torch.get_num_threads())
  ap.add_argument("--n", type=int, default=4 << 20, help="elements per input (default 4M)")
  ap.add_argument("--interleave", default="", help="comma-separated FORCED_SIMD_INTERLEAVE values to compare (0: LLVM's)")
  ap.add_argument("--inductor", action="store_true")
  ap.add_argument("--only", default="", help="comma-separated case names")
  ap.add_argument("--out", default="")
  args = ap.parse_args()
  torch.set_num_threads(args.threads)
  os.environ.setdefault("TORCH_UOP_CACHE", "0")
  import torch_uop  # noqa: F401  (registers the backend)
  from torch_uop.core.renderer import llvmir

  cases = [c for c in _cases(args.n) if not args.only or c[0] in args.only.split(",")]
  interleaves = [int(v) for v in args.interleave.split(",") if v] or [llvmir.FORCED_SIMD_INTERLEAVE or 0]
  copy = copy_bandwidth(args.n)
  backends = ["eager"] + (["inductor"] if args.inductor else []) + [f"uop_i{k}" for k in interleaves]
  print(f"{cpu_name()}, {args.threads} threads, n={args.n}, copy {copy / 1e9:.1f} GB/s")
  print(f"{'case':<11}" + "".join(f"{b:>22}" for b in backends) + "   (ms | % of copy | ns/elem/thread)")
  results = {"cpu": cpu_name(), "threads": args.threads, "n": args.n, "copy_GBps": copy / 1e9, "cases": {}}
  for name, fn, inputs, nbytes in cases:
    row = {}
    for backend in backends:
      torch._dynamo.reset()
      if backend == "eager": f = fn
      elif backend == "inductor": f = torch.compile(fn, backend="inductor")
      else:
        llvmir.FORCED_SIMD_INTERLEAVE = int(backend[5:]) or None
        f = torch.compile(fn, backend="uop")
      with torch.no_grad():
        s = _time(f, inputs)
        ok = torch.allclose(f(*inputs), fn(*inputs), rtol=1e-5, atol=1e-5, equal_nan=True)
      elems = inputs[0].numel()
      row[backend] = {"ms": s * 1e3, "pct_copy": 100 * nbytes / s / copy, "ns_per_elem_thread": s * 1e9 * args.threads / elems,
                      "matches_eager": bool(ok)}
    results["cases"][name] = row
    print(f"{name:<11}" + "".join(f"{r['ms']:8.2f} {r['pct_copy']:4.0f}% {r['ns_per_elem_thread']:5.2f}{'' if r['matches_eager'] else '!'}"
                                    for r in row.values()))
  for backend in backends[1:]:
    ratios = [results["cases"][c]["eager"]["ms"] / results["cases"][c][backend]["ms"] for c in results["cases"]]
    print(f"geomean speedup over eager, {backend}: {math.exp(sum(map(math.log, ratios)) / len(ratios)):.2f}x")
  if args.out:
    with open(args.out, "w") as fh: json.dump(results, fh, indent=1)


if __name__ == "__main__":
  main()
