"""Benchmark suite: eager vs Inductor vs torch_uop on models, kernels and GEMMs, in one run.

Entries: the MLP, CNN and transformer block of bench_models.py (inference and a training step),
softmax and layer norm over 4096x1024, an elementwise chain over 16M floats (relu(x*2+1)*y),
float32 GEMMs at 256^3, 512^3 and 1024^3, and a plain tensor copy (x.clone()) as the memory-bandwidth
reference. For every entry and backend it reports:

- time per call: median of the best of several interleaved rounds (bench_models.time_rounds),
  and the speedup over eager (eager ms / backend ms; >1 is faster);
- cold compile time: a fresh process (fresh Dynamo) with empty torch_uop and Inductor cache
  directories compiles the entry after a tiny warm-up function has paid each compiler's one-time
  setup; first call minus a steady-state call;
- warm compile time: the same in a second fresh process sharing the first one's (now filled) cache
  directories, so only on-disk caches count; also the warm *backend* time, the seconds spent inside the
  backend function Dynamo calls (AOTAutograd and the compiler, or their caches), without Dynamo's own
  tracing, which is the same for every backend;
- peak memory: the most bytes torch's CPU allocator held during one steady-state call above what was
  held before it (torch.profiler with profile_memory: outputs and intermediates, for every backend,
  since Inductor and torch_uop allocate through torch);
- whether the first call's outputs (and, in training, every parameter gradient) matched eager;
- GB/s for the copy, elementwise, softmax and layer-norm entries and GFLOP/s for the GEMMs; the
  chain's bandwidth is also given as a % of the best copy.

It prints a table and the geomean speedup of each compiled backend over eager (all entries but the
copy), saves JSON (benchmarks/results/suite_<time>.json, or --out) and a PNG chart next to it.

  python benchmarks/bench_suite.py                         # everything (about ten minutes)
  python benchmarks/bench_suite.py --quick --only softmax,chain --no-inductor
"""
from __future__ import annotations
import argparse
import datetime
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)  # this checkout's torch_uop, also from a worktree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_models as bm  # noqa: E402  sets fresh cache dirs for this process, imports torch and torch_uop

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

import torch_uop  # noqa: E402
from torch_uop.debug import peak_alloc_bytes  # noqa: E402

MODELS = ("mlp", "cnn", "tf")
KERNELS = ("softmax", "layernorm", "chain", "gemm256", "gemm512", "gemm1024", "copy")
ENTRIES = MODELS + KERNELS
REFERENCE = "copy"  # the bandwidth reference, left out of the geomean


class Softmax(nn.Module):
  def forward(self, x): return torch.softmax(x, dim=-1)


class Chain(nn.Module):
  def forward(self, x, y): return torch.relu(x * 2 + 1) * y


class Matmul(nn.Module):
  def forward(self, a, b): return a @ b


class Copy(nn.Module):
  def forward(self, x): return x.clone()


def entry_case(name: str, quick: bool):
  """-> (model, inputs, target, description, work) for one entry; seeded like bench_models.make_case.
  work: ("bytes", n) moved per call or ("flops", n), or None."""
  if name in MODELS: return (*bm.make_case(name), None)
  torch.manual_seed(0)
  rows, cols = (256, 128) if quick else (4096, 1024)
  n = 1 << (16 if quick else 24)
  if name == "softmax":
    return Softmax(), torch.randn(rows, cols), None, f"softmax over the last dim of {rows}x{cols}", ("bytes", 2 * rows * cols * 4)
  if name == "layernorm":
    m = nn.LayerNorm(cols)
    with torch.no_grad(): m.weight.normal_(), m.bias.normal_()
    return m, torch.randn(rows, cols), None, f"layer norm over {rows}x{cols}", ("bytes", 2 * rows * cols * 4)
  if name == "chain":
    return Chain(), (torch.randn(n), torch.randn(n)), None, f"relu(x*2+1)*y over {n} float32", ("bytes", 3 * n * 4)
  if name == "copy":
    return Copy(), torch.randn(n), None, f"x.clone() of {n} float32", ("bytes", 2 * n * 4)
  if name.startswith("gemm"):
    s = int(name[4:]) // (4 if quick else 1)
    return Matmul(), (torch.randn(s, s), torch.randn(s, s)), None, f"float32 matmul {s}x{s}x{s}", ("flops", 2 * s ** 3)
  raise ValueError(f"unknown entry {name!r}; choose from {', '.join(ENTRIES)}")


def tolerance(name: str) -> tuple[float, float]:
  """GEMMs sum k products in a different order than BLAS: the absolute error grows with k."""
  if name.startswith("gemm"): return 1e-4, 1e-5 * int(name[4:])
  return bm.RTOL, bm.ATOL


def cases_for(only: list[str]) -> list[tuple[str, str]]:
  """(entry, mode) pairs; models run in inference and training, kernels in inference."""
  return [(n, m) for n in only for m in (bm.MODES if n in MODELS else ("infer",))]


# ----- compile times in fresh processes -----

def child_main(name: str, mode: str, backend: str, quick: bool) -> int:
  """In a fresh process: pay the compiler's one-time setup on a tiny function, then compile the
  entry; prints one JSON line: compile_s = first call minus the median of 3 steady-state calls."""
  setup_s = bm.one_time_setup(backend)
  torch._dynamo.reset()
  torch_uop.reset_metrics()
  model, x, y, _, _ = entry_case(name, quick)
  model.train(mode == "train")
  backend_fn, spent = timed_backend(backend)
  call = bm.make_call(mode, torch.compile(model, backend=backend_fn, dynamic=False), x, y)
  t0 = time.perf_counter()
  call()
  first = time.perf_counter() - t0
  steady = statistics.median(bm.timed_calls(call, 3))
  out = {"setup_s": setup_s, "first_call_s": first, "compile_s": max(first - steady, 0.0), "backend_s": spent[0]}
  if backend == "uop":
    m = torch_uop.metrics()
    out["uop"] = {k: m[k] for k in ("kernels_compiled", "cache_hits", "graph_cache_hits", "compile_time_s")}
  print("CHILD_RESULT " + json.dumps(out), flush=True)
  return 0


def timed_backend(name: str):
  """The registered backend `name` wrapped to add the seconds each call of it takes to `spent[0]`."""
  import functools
  from torch._dynamo.backends.registry import lookup_backend
  fn, spent = lookup_backend(name), [0.0]

  @functools.wraps(fn)
  def timed(gm, example_inputs, **kwargs):
    t0 = time.perf_counter()
    try:
      return fn(gm, example_inputs, **kwargs)
    finally:
      spent[0] += time.perf_counter() - t0
  return timed, spent


def run_child(name: str, mode: str, backend: str, args, cache: dict[str, str]) -> dict:
  env = dict(os.environ, **cache, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
  cmd = [sys.executable, os.path.abspath(__file__), "--child", name, mode, backend]
  if args.quick: cmd.append("--quick")
  if args.threads: cmd += ["--threads", str(args.threads)]
  try:
    p = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=600)
  except subprocess.TimeoutExpired:
    return {"error": "timed out after 600 s"}
  for line in p.stdout.splitlines():
    if line.startswith("CHILD_RESULT "): return json.loads(line[len("CHILD_RESULT "):])
  return {"error": f"exit {p.returncode}: " + " | ".join(p.stderr.strip().splitlines()[-3:])}


def compile_times(name: str, mode: str, backend: str, args) -> dict:
  """Cold then warm compile of one entry, each in a fresh process, sharing fresh cache directories."""
  dirs = {"TORCH_UOP_CACHE_DIR": tempfile.mkdtemp(prefix="suite_uop_"),
          "TORCHINDUCTOR_CACHE_DIR": tempfile.mkdtemp(prefix="suite_inductor_")}
  try:
    cold = run_child(name, mode, backend, args, dirs)
    warm = run_child(name, mode, backend, args, dirs)
  finally:
    for d in dirs.values(): shutil.rmtree(d, ignore_errors=True)
  return {"cold": cold, "warm": warm}


# ----- report -----

def add_derived(rows: list[dict], works: dict) -> None:
  """Speedup, bandwidth or throughput, and the chain's % of the best copy, into each row."""
  eager = {(r["model"], r["mode"]): r.get("ms") for r in rows if r["backend"] == "eager"}
  for r in rows:
    e = eager.get((r["model"], r["mode"]))
    if "ms" in r and e: r["speedup"] = e / r["ms"]
    work = works.get(r["model"])
    if work and "ms" in r:
      kind, n = work
      r["gb_s" if kind == "bytes" else "gflop_s"] = n / (r["ms"] / 1e3) / 1e9
  copies = [r["gb_s"] for r in rows if r["model"] == REFERENCE and "gb_s" in r]
  if copies:
    for r in rows:
      if r["model"] != REFERENCE and "gb_s" in r: r["pct_of_copy"] = 100 * r["gb_s"] / max(copies)


def geomeans(rows: list[dict], backends: list[str]) -> dict:
  out = {}
  for b in backends:
    if b == "eager": continue
    xs = [r["speedup"] for r in rows if r["backend"] == b and r["model"] != REFERENCE and r.get("speedup")]
    if xs: out[b] = {"geomean": math.exp(sum(map(math.log, xs)) / len(xs)), "entries": len(xs)}
  return out


def fmt_table(rows: list[dict], backends: list[str]) -> str:
  by = {(r["model"], r["mode"], r["backend"]): r for r in rows}
  compiled = [b for b in backends if b != "eager"]
  head = ["entry", "mode", "eager ms", "eager peak MB"]
  for b in compiled: head += [f"{b} ms", f"{b} x", f"{b} cold s", f"{b} warm s", f"{b} warm be s", f"{b} peak MB", f"{b} ok"]
  head.append("throughput (eager / " + " / ".join(compiled) + ")")
  f = lambda v, p=3: "-" if v is None else f"{v:.{p}f}"
  lines = []
  for (entry, mode) in dict.fromkeys((r["model"], r["mode"]) for r in rows):
    e = by[(entry, mode, "eager")]
    cells = [entry, mode, f(e.get("ms")) if "ms" in e else "ERROR", f(e.get("peak_mb"), 1)]
    for b in compiled:
      r = by.get((entry, mode, b), {})
      cells += [f(r.get("ms")) if "ms" in r else "ERROR", f(r.get("speedup"), 2), f(r.get("cold_compile_s"), 2),
                f(r.get("warm_compile_s"), 2), f(r.get("warm_backend_s"), 3), f(r.get("peak_mb"), 1), {True: "yes", False: "NO"}.get(r.get("match"), "-")]
    tput = [by.get((entry, mode, b), {}) for b in backends]
    if any("gb_s" in r for r in tput): cells.append(" / ".join(f(r.get("gb_s"), 1) for r in tput) + " GB/s")
    elif any("gflop_s" in r for r in tput): cells.append(" / ".join(f(r.get("gflop_s"), 1) for r in tput) + " GFLOP/s")
    else: cells.append("")
    lines.append(cells)
  return bm.text_table(head, lines)


def save_chart(path: str, rows: list[dict], backends: list[str]) -> str | None:
  """Speedup over eager per entry, and cold/warm compile times, per compiled backend. None without matplotlib."""
  try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
  except ImportError:
    return None
  compiled = [b for b in backends if b != "eager"]
  labels = list(dict.fromkeys(f"{r['model']}/{r['mode']}" if r["model"] in MODELS else r["model"] for r in rows))
  by = {(f"{r['model']}/{r['mode']}" if r["model"] in MODELS else r["model"], r["backend"]): r for r in rows}
  fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(max(8, 0.8 * len(labels)), 8))
  w = 0.8 / max(len(compiled), 1)
  for i, b in enumerate(compiled):
    ax1.bar([k + i * w for k in range(len(labels))], [by.get((l, b), {}).get("speedup") or 0 for l in labels], w, label=b)
  ax1.axhline(1.0, color="black", linewidth=0.8)
  ax1.set_yscale("log"); ax1.set_ylabel("speedup over eager (x)"); ax1.legend()
  ax1.set_xticks([k + w * (len(compiled) - 1) / 2 for k in range(len(labels))], labels, rotation=30, ha="right")
  series = [(b, kind) for b in compiled for kind in ("cold", "warm")]
  w2 = 0.8 / max(len(series), 1)
  for i, (b, kind) in enumerate(series):
    ax2.bar([k + i * w2 for k in range(len(labels))], [by.get((l, b), {}).get(f"{kind}_compile_s") or 0 for l in labels], w2, label=f"{b} {kind}")
  ax2.set_yscale("log"); ax2.set_ylabel("compile time (s)"); ax2.legend()
  ax2.set_xticks([k + w2 * (len(series) - 1) / 2 for k in range(len(labels))], labels, rotation=30, ha="right")
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return path


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--only", default=",".join(ENTRIES), help=f"comma-separated subset of {','.join(ENTRIES)}")
  ap.add_argument("--quick", action="store_true", help="small sizes and fewer timed calls (a smoke run)")
  ap.add_argument("--no-inductor", action="store_true", help="skip backend='inductor' (its compiles take most of the time)")
  ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads(N) (default: leave torch's default)")
  ap.add_argument("--out", default=None, help="JSON path (default: benchmarks/results/suite_<time>.json); the PNG goes next to it")
  ap.add_argument("--child", nargs=3, metavar=("ENTRY", "MODE", "BACKEND"), help=argparse.SUPPRESS)
  args = ap.parse_args(argv)
  if args.threads: torch.set_num_threads(args.threads)
  if args.child: return child_main(*args.child, args.quick)
  only = [n.strip() for n in args.only.split(",") if n.strip()]
  for n in only:
    if n not in ENTRIES: ap.error(f"unknown entry {n!r}; choose from {', '.join(ENTRIES)}")
  backends = [b for b in bm.BACKENDS if not (b == "inductor" and args.no_inductor)]
  warmup, rounds, per_round = (2, 3, 5) if args.quick else (5, 5, 10)
  cases = cases_for(only)
  info = bm.machine_info()
  print(f"# torch {info['torch']}, {info['cpu_count']} CPUs, torch threads {info['torch_threads']}, {info['processor']}, "
        f"load average {info['loadavg_at_start']}; {len(cases)} cases; timed: {rounds} rounds x {per_round} calls", flush=True)
  t_start = time.perf_counter()

  built = {n: entry_case(n, args.quick) for n in only}
  descriptions = {n: c[3] for n, c in built.items()}
  works = {n: c[4] for n, c in built.items() if c[4]}
  del built
  build = lambda name: entry_case(name, args.quick)[:4]

  # 1. compile times, each entry and compiled backend in two fresh processes (cold, then warm)
  compiles = {}
  for name, mode in cases:
    for b in backends:
      if b == "eager": continue
      c = compiles[(name, mode, b)] = compile_times(name, mode, b, args)
      print(f"  {name:9s} {mode:5s} {b:8s} compile cold {c['cold'].get('compile_s', float('nan')):.2f}s "
            f"warm {c['warm'].get('compile_s', float('nan')):.2f}s (backend {c['warm'].get('backend_s', float('nan')):.3f}s)" + "".join(f"  {k}: {v['error']}" for k, v in c.items() if "error" in v), flush=True)

  # 2. in this process: first calls (correctness), then interleaved timing rounds over everything
  torch._dynamo.reset()
  timed, rows = [], []
  for name, mode in cases:
    rows_, calls = bm.prepare_case(name, mode, backends, warmup, build, tolerance(name))
    for r in rows_:
      if r.get("match") is False or "error" in r: print(f"  {name} {mode} {r['backend']}: {r.get('error') or 'MISMATCH ' + ' '.join(r['mismatch'])}", flush=True)
      if r["backend"] in calls: r["peak_mb"] = peak_alloc_bytes(calls[r["backend"]]) / 2 ** 20
      c = compiles.get((name, mode, r["backend"]))
      if c:
        r["compile"] = c
        r["cold_compile_s"], r["warm_compile_s"] = c["cold"].get("compile_s"), c["warm"].get("compile_s")
        r["cold_backend_s"], r["warm_backend_s"] = c["cold"].get("backend_s"), c["warm"].get("backend_s")
    timed.append((rows_, calls))
    rows += rows_
  print(f"# timing: {rounds} rounds x {per_round} calls of every backend of every case", flush=True)
  bm.time_rounds(timed, rounds, per_round)
  for r in rows: r["in_process_compile_s"] = r.pop("compile_s", None)
  add_derived(rows, works)
  gm = geomeans(rows, backends)
  total_s = time.perf_counter() - t_start

  print()
  print(fmt_table(rows, backends))
  print()
  for n, d in descriptions.items(): print(f"  {n}: {d}")
  print("  ms: median of the best of the interleaved rounds; x: eager ms / backend ms (>1: faster);")
  print("  cold s / warm s: compile time (first call minus a steady call) in a fresh process with empty cache dirs /")
  print("  in a second fresh process with those dirs filled; each compiler's one-time setup paid before, on a tiny function;")
  print("  warm be s: of the warm compile, the seconds inside the backend function (AOTAutograd + compiler, or their caches);")
  print("  peak MB: most bytes torch's CPU allocator held during one steady-state call above what it held before;")
  print(f"  ok: outputs (and in train every parameter gradient) assert_close to eager (rtol {bm.RTOL}, atol {bm.ATOL}; GEMMs atol 1e-5*k)")
  pct = [(r["backend"], r["pct_of_copy"]) for r in rows if r["model"] == "chain" and "pct_of_copy" in r]
  if pct: print("  elementwise chain bandwidth, % of the best copy: " + ", ".join(f"{b} {p:.0f}%" for b, p in pct))
  for r in rows:
    if r.get("uop", {}).get("nodes_fallen_back"): print(f"  uop fallbacks {r['model']}/{r['mode']}: {r['uop']['nodes_fallen_back']}")
  for b, g in gm.items(): print(f"  geomean speedup over eager, {b}: {g['geomean']:.2f}x over {g['entries']} entries (all but {REFERENCE})")
  print(f"  whole run {total_s:.0f}s; load average at start {info['loadavg_at_start']}, at end {bm._loadavg()}")
  if any(la and la[0] > 0.5 * (os.cpu_count() or 1) for la in (info["loadavg_at_start"], bm._loadavg())):
    print("  WARNING: the machine was busy with other work during this run; torch's OpenMP threads (eager, Inductor) "
          "stall on busy cores, so check the per-round medians in the JSON, or rerun on an idle machine (or with --threads 1).")

  out = args.out or os.path.join(bm.RESULTS_DIR, f"suite_{datetime.datetime.now():%Y%m%d_%H%M%S}.json")
  os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
  with open(out, "w") as f:
    json.dump({"machine": info, "args": vars(args), "warmup": warmup, "rounds": rounds, "calls_per_round": per_round,
               "entries": descriptions, "geomean_speedup": gm, "total_s": total_s, "loadavg_at_end": bm._loadavg(),
               "rows": rows}, f, indent=1, default=str)
  print(f"  saved {out}")
  png = save_chart(os.path.splitext(out)[0] + ".png", rows, backends)
  print(f"  chart {png}" if png else "  no chart: matplotlib is not installed (pip install torch_uop[bench])")
  return 1 if any(r.get("match") is False or "error" in r for r in rows) else 0


if __name__ == "__main__":
  sys.exit(main())
