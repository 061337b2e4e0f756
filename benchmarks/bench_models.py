"""Benchmark: eager vs torch.compile(backend="inductor") vs torch.compile(backend="uop"), in one run.

Models: an MLP, a small CNN (conv, batchnorm, relu, maxpool, adaptive avgpool, linear) and a
transformer block (embedding, layernorm, causal attention, GELU MLP, LM head). Each runs in two
modes: inference (eval + no_grad) and a training step (forward, cross entropy, backward).

For each (model, mode, backend) it reports the time per call (torch's default thread count; every
case is compiled and warmed up first, then rounds of timed calls go over every backend of every
case in turn, and a time is the median of its best round, so that other work on a small shared
machine, which stalls torch's threads, has to last through every round to distort it), the
speedup vs eager (eager ms / compiled ms; >1 is faster), the cold compile time (first call minus a steady-state call), whether
the first call matched eager (torch.testing.assert_close on outputs, and on all parameter gradients
in training) and, for uop, the fallbacks reported by torch_uop.metrics(). It prints a table and writes JSON to
benchmarks/results/.

Inductor and torch_uop each get a fresh disk-cache directory per run (unless TORCHINDUCTOR_CACHE_DIR
or TORCH_UOP_CACHE_DIR is set), so their compile times are cold. The one-time setup of each compiler (first compile in the process, and for Inductor in a
fresh cache dir) is measured on a tiny function first and reported apart from the per-model times.

  python benchmarks/bench_models.py                  # everything (a few minutes, mostly Inductor compiles)
  python benchmarks/bench_models.py --quick --no-inductor --models mlp,tf
"""
from __future__ import annotations
import argparse
import atexit
import datetime
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
import traceback

# fresh cache directories, set before torch is imported: both compilers compile cold in every run
for _var, _prefix in (("TORCHINDUCTOR_CACHE_DIR", "bench_inductor_cache_"), ("TORCH_UOP_CACHE_DIR", "bench_uop_cache_")):
  if _var not in os.environ:
    os.environ[_var] = tempfile.mkdtemp(prefix=_prefix)
    atexit.register(shutil.rmtree, os.environ[_var], True)

import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_uop

RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
BACKENDS = ("eager", "inductor", "uop")
MODES = ("infer", "train")
RTOL, ATOL = 1e-4, 1e-5


from torch_uop.testing.models import MLP, CNN, Block  # noqa: E402  the reference definitions


def text_table(head: list, lines: list, left_first: bool = False) -> str:
  """Rows of cells under a header, each column right-aligned to its widest cell (the first left-aligned if asked),
  with a rule of dashes under the header."""
  widths = [max(len(str(c)) for c in col) for col in zip(head, *lines)]
  def row(cells) -> str:
    return "  ".join(str(c).ljust(w) if left_first and i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))
  return "\n".join([row(head), "  ".join("-" * w for w in widths), *(row(line) for line in lines)])


def make_case(name: str):
  """-> (model, input, target, description); seeded, so every backend gets identical weights and data."""
  torch.manual_seed(0)
  if name == "mlp":
    x = torch.randn(64, 32)
    return MLP(), x, torch.randint(0, 10, (64,)), "MLP 32-64-64-10, batch 64"
  if name == "cnn":
    x = torch.randn(8, 3, 32, 32)
    return CNN(), x, torch.randint(0, 10, (8,)), "CNN, 8x3x32x32"
  if name == "tf":
    ids = torch.randint(0, 100, (4, 32))
    return Block(), ids, torch.randint(0, 100, (4, 32)), "transformer block d=32 h=4, 4x32 tokens"
  raise ValueError(f"unknown model {name!r}; choose from mlp, cnn, tf")


# ----- one measurement -----

def compile_for(backend: str, model: nn.Module) -> nn.Module:
  """dynamic=False: entries that share a module class at other shapes (the GEMMs of bench_suite) each
  get their own static-shape graph, not one dynamic-shape graph made at the second shape."""
  if backend == "eager": return model
  return torch.compile(model, backend=backend, dynamic=False)


def make_call(mode: str, model: nn.Module, x, y):
  """The callable to time, returning (output, grads) for the correctness check. `x` is the input,
  or a tuple of inputs."""
  args = x if isinstance(x, tuple) else (x,)
  if mode == "infer":
    def call():
      with torch.no_grad(): return model(*args), None
  else:
    def call():
      for p in model.parameters(): p.grad = None
      out = model(*args)
      loss = F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
      loss.backward()
      return loss.detach(), [p.grad for p in model.parameters()]
  return call


def timed_calls(call, n: int) -> list[float]:
  times = []
  for _ in range(n):
    t0 = time.perf_counter()
    call()
    times.append(time.perf_counter() - t0)
  return times


def first_call(name: str, mode: str, backend: str, reference, build=None, tol=(RTOL, ATOL)) -> tuple[dict, object, object]:
  """Build a fresh model (`build(name)`, default make_case), compile it with `backend` and make the
  first (cold) call. Returns (row, the timed callable or None on error, the first call's (output, grads))."""
  torch_uop.reset_metrics()
  model, x, y, _ = (build or make_case)(name)
  model.train(mode == "train")
  call = make_call(mode, compile_for(backend, model), x, y)
  row = {"model": name, "mode": mode, "backend": backend}
  try:
    t0 = time.perf_counter()
    first = call()
    row["first_call_s"] = time.perf_counter() - t0
  except Exception as e:  # a backend that fails is reported, the rest of the run goes on
    row["error"] = f"{type(e).__name__}: {e}"
    traceback.print_exc()
    return row, None, None
  if reference is not None:
    try:
      rtol, atol = tol
      torch.testing.assert_close(first[0], reference[0], rtol=rtol, atol=atol)
      for g, r in zip(first[1] or [], reference[1] or []): torch.testing.assert_close(g, r, rtol=rtol, atol=atol)
      row["match"] = True
    except AssertionError as e:
      row["match"], row["mismatch"] = False, str(e).splitlines()[0:3]
  if backend == "uop":
    m = torch_uop.metrics()
    row["uop"] = {k: m[k] for k in ("graphs_compiled", "graphs_fallen_back", "fallback_nodes_total", "nodes_fallen_back",
                                     "nodes_lowered", "kernels_compiled", "cache_hits")}
    row["uop"]["compile_time_s"] = m["compile_time_s"]
  return row, call, first


def prepare_case(name: str, mode: str, backends: list[str], warmup: int, build=None, tol=(RTOL, ATOL)) -> tuple[list[dict], dict]:
  """All backends for one (model, mode): the first calls (compile, correctness), eager first, then
  warmup calls. Returns the rows and {backend: timed callable}."""
  rows, calls, reference = [], {}, None
  for b in backends:
    row, call, first = first_call(name, mode, b, reference, build, tol)
    if b == "eager": reference = first
    rows.append(row)
    if call is not None: calls[b] = call
  for b, call in list(calls.items()):
    try: timed_calls(call, warmup)
    except Exception as e:
      next(r for r in rows if r["backend"] == b)["error"] = f"{type(e).__name__}: {e}"
      del calls[b]
  return rows, calls


def time_rounds(cases: list[tuple[list[dict], dict]], rounds: int, per_round: int) -> None:
  """Each round times `per_round` calls of every backend of every case in turn; a row's time is the
  median of its best round. The rounds of one case are spread over the whole run, and its backends
  are timed side by side, so a burst of other work on the machine (which stalls torch's threads)
  has to last through every round to distort a number."""
  samples = {id(row): [] for rows, calls in cases for row in rows if row["backend"] in calls}
  for _ in range(rounds):
    for rows, calls in cases:
      for row in rows:
        if id(row) in samples: samples[id(row)].append(timed_calls(calls[row["backend"]], per_round))
  for rows, calls in cases:
    for row in rows:
      if id(row) not in samples: continue
      per = samples[id(row)]
      every = [t for ts in per for t in ts]
      row["ms"] = min(statistics.median(ts) for ts in per) * 1e3
      row["median_all_ms"], row["min_ms"] = statistics.median(every) * 1e3, min(every) * 1e3
      row["round_medians_ms"] = [round(statistics.median(ts) * 1e3, 4) for ts in per]
      row["compile_s"] = max(row["first_call_s"] - row["ms"] / 1e3, 0.0) if row["backend"] != "eager" else None


def one_time_setup(backend: str) -> float:
  """Seconds for the first compile of a tiny function: imports, LLVM/C++ toolchain setup, headers."""
  torch._dynamo.reset()
  f = torch.compile(lambda a: (a * 2 + 1).relu().sum(), backend=backend)
  t0 = time.perf_counter()
  f(torch.randn(16))
  return time.perf_counter() - t0


# ----- report -----

def fmt_table(rows: list[dict], backends: list[str], descriptions: dict) -> str:
  by = {(r["model"], r["mode"], r["backend"]): r for r in rows}
  compiled = [b for b in backends if b != "eager"]
  head = ["model", "mode", "eager ms"]
  for b in compiled: head += [f"{b} ms", f"{b} x", f"{b} compile s", f"{b} ok"]
  if "uop" in compiled: head += ["uop fallbacks"]
  lines = []
  for (model, mode) in dict.fromkeys((r["model"], r["mode"]) for r in rows):
    e = by.get((model, mode, "eager"), {})
    cells = [model, mode, f"{e['ms']:.3f}" if "ms" in e else "ERROR"]
    for b in compiled:
      r = by.get((model, mode, b), {})
      if "ms" not in r:
        cells += ["ERROR", "-", "-", "-"]
        continue
      ratio = e["ms"] / r["ms"] if "ms" in e else float("nan")
      cells += [f"{r['ms']:.3f}", f"{ratio:.2f}", f"{r['compile_s']:.2f}", {True: "yes", False: "NO"}.get(r.get("match"), "?")]
    if "uop" in compiled:
      u = by.get((model, mode, "uop"), {}).get("uop")
      cells += [f"{u['fallback_nodes_total']} ({u['graphs_fallen_back']} whole graphs)" if u else "-"]
    lines.append(cells)
  out = text_table(head, lines).split("\n")
  out.append("")
  out += [f"  {k}: {v}" for k, v in descriptions.items()]
  out.append("  ms = median of the best of several interleaved rounds of timed calls; x = eager ms / compiled ms (>1: faster);")
  out.append("  compile s = first call minus a steady-state call;")
  out.append(f"  ok = first call's output (and, in train, every parameter gradient) assert_close to eager (rtol={RTOL}, atol={ATOL})")
  return "\n".join(out)


def machine_info() -> dict:
  return {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
          "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
          "python": platform.python_version(), "torch_uop": torch_uop.__version__, "loadavg_at_start": _loadavg()}


def _loadavg():
  try: return [round(v, 2) for v in os.getloadavg()]
  except OSError: return None


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--models", default="mlp,cnn,tf", help="comma-separated subset of mlp,cnn,tf")
  ap.add_argument("--modes", default="infer,train", help="comma-separated subset of infer,train")
  ap.add_argument("--quick", action="store_true", help="fewer warmup and timed calls")
  ap.add_argument("--no-inductor", action="store_true", help="skip backend='inductor' (its compiles take most of the time)")
  ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads(N) (default: leave torch's default)")
  ap.add_argument("--out", default=None, help="JSON path (default: benchmarks/results/bench_<time>.json)")
  args = ap.parse_args(argv)
  models = [m.strip() for m in args.models.split(",") if m.strip()]
  modes = [m.strip() for m in args.modes.split(",") if m.strip()]
  for m in models:
    if m not in ("mlp", "cnn", "tf"): ap.error(f"unknown model {m!r}; choose from mlp, cnn, tf")
  if args.threads: torch.set_num_threads(args.threads)
  for m in modes:
    if m not in MODES: ap.error(f"unknown mode {m!r}; choose from {MODES}")
  backends = [b for b in BACKENDS if not (b == "inductor" and args.no_inductor)]
  warmup, rounds, per_round = (3, 3, 7) if args.quick else (10, 5, 20)

  info = machine_info()
  print(f"# torch {info['torch']}, {info['cpu_count']} CPUs, torch threads {info['torch_threads']}, "
        f"{info['processor']}, load average {info['loadavg_at_start']}; warmup {warmup}, timed: {rounds} rounds x {per_round} calls per backend", flush=True)
  t_start = time.perf_counter()
  setup = {}
  for b in backends:
    if b != "eager":
      setup[b] = one_time_setup(b)
      print(f"# {b} one-time setup (first compile in this process, fresh cache dir): "
            f"{setup[b]:.1f}s", flush=True)

  rows, descriptions = [], {}
  torch._dynamo.reset()
  cases = []
  for name in models:  # compile everything first: the compiled models stay alive for the timing rounds
    descriptions[name] = make_case(name)[3]
    for mode in modes:
      rows_, calls = prepare_case(name, mode, backends, warmup)
      for row in rows_:
        status = row.get("error") or f"first call {row['first_call_s']:.2f}s" + ("" if row.get("match", True) else ", MISMATCH")
        print(f"  {name:4s} {mode:5s} {row['backend']:8s} {status}", flush=True)
      cases.append((rows_, calls))
      rows += rows_
  print(f"# timing: {rounds} rounds x {per_round} calls of every backend of every case", flush=True)
  time_rounds(cases, rounds, per_round)
  total_s = time.perf_counter() - t_start

  print()
  print(fmt_table(rows, backends, descriptions))
  print(f"  one-time setup: " + ", ".join(f"{b} {s:.1f}s" for b, s in setup.items()) + f"; whole run {total_s:.0f}s; load average at end {_loadavg()}")
  busy = [la for la in (info["loadavg_at_start"], _loadavg()) if la and la[0] > 0.5 * (os.cpu_count() or 1)]
  if busy:
    print("  WARNING: the machine was busy with other work during this run; torch's OpenMP threads (eager, Inductor) "
          "stall on busy cores, so check the per-round medians in the JSON, or rerun on an idle machine.")
  for r in rows:
    if r.get("uop", {}).get("nodes_fallen_back"): print(f"  uop fallbacks {r['model']}/{r['mode']}: {r['uop']['nodes_fallen_back']}")
    if r.get("match") is False: print(f"  MISMATCH {r['model']}/{r['mode']}/{r['backend']}: {' '.join(r['mismatch'])}")
    if "error" in r: print(f"  ERROR {r['model']}/{r['mode']}/{r['backend']}: {r['error']}")

  out = args.out or os.path.join(RESULTS_DIR, f"bench_{datetime.datetime.now():%Y%m%d_%H%M%S}.json")
  os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
  with open(out, "w") as f:
    json.dump({"machine": info, "args": vars(args), "warmup": warmup, "rounds": rounds, "calls_per_round": per_round, "one_time_setup_s": setup,
               "models": descriptions, "total_s": total_s, "loadavg_at_end": _loadavg(), "rows": rows}, f, indent=1, default=str)
  print(f"  saved {out}")
  return 1 if any(r.get("match") is False or "error" in r for r in rows) else 0


if __name__ == "__main__":
  sys.exit(main())
