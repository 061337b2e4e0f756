"""Model-zoo benchmark: eager vs Inductor vs torch_uop on real models (torch_uop/testing/zoo.py), in one run.

Every (model, mode, backend) runs in a fresh process (a worker; a worker that fails or runs past --timeout is
recorded with its error and the run goes on). Modes: inference (under torch.no_grad) and a training step
(forward, the zoo's loss, backward); models stay in eval mode, so dropout is off and outputs compare. A
worker builds the model from a fixed seed, runs it eagerly for the reference (compiled backends), builds it
again, compiles it, and reports:

- ms per call: the median of the best of 5 rounds after warmup (each round about half a second, at least one
  call; 3 rounds for models slower than about 0.8 s a call; the JSON has every round's median);
  x = eager ms / backend ms (>1: faster);
- cold compile s: first call minus a steady call. Each worker gets fresh cache directories, copied from ones
  where the compiler compiled a tiny function first, so its one-time setup (Inductor's headers, about 8 s)
  is not counted, but nothing of the model is cached;
- peak MB: the most bytes torch's CPU allocator held during one steady call above what it held before
  (torch profiler, torch_uop.debug.peak_alloc_bytes); RSS MB: the worker's peak resident set (eager reference
  and imports included);
- ok: first call's main output (and in training every parameter gradient) assert_close to eager with
  rtol 1e-3, atol 1e-3 * max|reference| per tensor (zoo.assert_matches); where it does not, the model runs in float64
  too, and "f64" marks a backend no farther from float64 than eager on any tensor (eager's rounding, not a wrong
  result: float64_check), "NO" one that is farther;
- torch_uop's fallbacks (torch_uop.metrics()).

Two kernels (scaled softmax over 4096x1024, a pointwise mix over 4M floats) run in inference only, with
GB/s and their fraction of this machine's copy bandwidth (measured at the start); they are left out of
the model geomeans. It prints one table per mode, geomeans (torch_uop and Inductor over eager, torch_uop
over Inductor), saves JSON and a PNG chart to benchmarks/results/ (or --out).

The default run (15 models x 2 modes + 2 kernels, x 3 backends: 96 workers, real sizes, 2 threads) takes
about 40 minutes on an otherwise idle 2-core machine (estimated from timing 4 of the models; more when the
machine is busy), most of it Inductor's compiles (EfficientNet-B0's training step alone 2-4 minutes);
--quick shortens only the timing. `--set more` runs eight models beyond the zoo of record instead (Whisper's
encoder, DistilBERT, a Gemma-style decoder, Swin-T, DenseNet-121, RegNetY-400MF, MobileViT-XXS, the UNet at 64x64
latents): architectures and sizes nothing was tuned on, to check that speed holds there; their geomeans are their own.

  python benchmarks/bench_zoo.py                                   # everything
  python benchmarks/bench_zoo.py --size tiny --only gpt2,resnet18 --quick
  python benchmarks/bench_zoo.py --only bert,unet --modes train --backends eager,uop
  python benchmarks/bench_zoo.py --set more --backends eager,uop  # models beyond the zoo of record
  python benchmarks/bench_zoo.py --profile llama --mode train     # torch_uop's kernels by time

--profile MODEL compiles one model with torch_uop in this process and lists its kernels by total time under
torch_uop.debug.profile(): us per call, share, bytes moved and FLOPs (torch_uop.debug.kernel_work), and
the achieved GB/s and GFLOP/s as fractions of this machine's copy bandwidth and torch.mm throughput.
"""
from __future__ import annotations
import argparse
import datetime
import gc
import json
import math
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, REPO)  # this checkout's torch_uop, also from a worktree
sys.path.insert(0, HERE)
import bench_models as bm  # noqa: E402  imports torch and torch_uop
from torch_uop.debug import peak_alloc_bytes  # noqa: E402

import torch  # noqa: E402

import torch_uop  # noqa: E402
import torch_uop.debug  # noqa: E402
from torch_uop.testing import zoo  # noqa: E402

BACKENDS = ("eager", "inductor", "uop")
# torch_uop with an option or mode: each is a backend column of its own (--backends eager,uop,uop-freezing);
# aot_eager is Dynamo and AOTAutograd with no compiler: its compile time is the tracing every backend pays
VARIANTS = {"aot_eager": {"backend": "aot_eager"},
            "uop-freezing": {"backend": "uop", "options": {"freezing": True}},
            "uop-max-autotune": {"backend": "uop", "mode": "max-autotune"},
            "uop-reduce-overhead": {"backend": "uop", "mode": "reduce-overhead"}}
ALL_BACKENDS = BACKENDS + tuple(VARIANTS)


def compile_kwargs(backend: str) -> dict:
  """torch.compile's keyword arguments for a backend column."""
  return dict(VARIANTS.get(backend, {"backend": backend}))


def is_uop(backend: str) -> bool: return compile_kwargs(backend)["backend"] == "uop"
MODES = ("infer", "train")
RTOL, ATOL_SCALE = 1e-3, 1e-3
RESULT_TAG = "ZOO_RESULT "


# ----- one worker: one (model, mode, backend) -----

def make_call(mode: str, model, inputs: tuple, module=None):
  """The callable a worker times: `model` (a module or its torch.compile) on `inputs`. Returns (main output,
  {parameter name of `module` (default `model`): grad} in training, else None)."""
  if mode == "infer":
    def call():
      with torch.no_grad(): return zoo.main_output(model(*inputs)), None
    return call
  params = [(n, p) for n, p in (module or model).named_parameters() if p.requires_grad]

  def call():
    for _, p in params: p.grad = None
    out = model(*inputs)
    zoo.loss_of(out).backward()
    return zoo.main_output(out).detach(), {n: p.grad for n, p in params}
  return call


def detached(result):
  out, grads = result
  return out.detach().clone(), None if grads is None else {n: None if g is None else g.clone() for n, g in grads.items()}


def time_steady(call, rounds: int, round_s: float, budget_s: float) -> dict:
  """Rounds of timed calls, each about `round_s` long (at least one call), fewer rounds (at least 3) where they
  would take more than `budget_s`. ms: the median of the best round (other work on a shared machine stalls
  torch's threads for a while; the best round is the one it disturbed least); median_ms: the median of the
  round medians."""
  per_call = bm.timed_calls(call, 1)[0]
  if per_call < 0.2: per_call = min(bm.timed_calls(call, 2))  # one more warmup for fast models
  n = max(1, min(50, round(round_s / max(per_call, 1e-6))))
  rounds = max(3, min(rounds, int(budget_s / (n * per_call))))
  medians, every = [], []
  for _ in range(rounds):
    ts = bm.timed_calls(call, n)
    medians.append(statistics.median(ts))
    every += ts
  return {"ms": min(medians) * 1e3, "median_ms": statistics.median(medians) * 1e3, "min_ms": min(every) * 1e3,
          "calls_per_round": n, "rounds": rounds, "round_medians_ms": [round(m * 1e3, 4) for m in medians]}


def float64_check(name: str, mode: str, size: str, got, reference) -> dict:
  """Where a backend and eager disagree, which is nearer the truth: the model run in float64 from the same seed.
  Per tensor (the main output, each gradient), the largest difference from float64 over float64's largest magnitude,
  for the backend and for eager. `closer`: the backend is no farther from float64 than eager on any tensor (or
  within 1e-6 of it): the disagreement is eager's rounding, not a wrong result."""
  model, inputs = zoo.build(name, size)
  truth = make_call(mode, model.double(), tuple(x.double() if x.is_floating_point() else x for x in inputs))()

  def error(a, t): return ((a.double() - t).abs().max() / t.abs().max().clamp_min(1e-300)).item() if t.numel() else 0.0
  pairs = [("output", got[0], reference[0], truth[0])]
  pairs += [(n, got[1].get(n), g, truth[1][n]) for n, g in (reference[1] or {}).items() if g is not None]
  worst = {"backend": 0.0, "eager": 0.0}
  closer = True
  for what, b, e, t in pairs:
    eb, ee = (float("inf") if b is None else error(b, t)), error(e, t)
    closer &= eb <= max(ee, 1e-6)
    if eb > worst["backend"]: worst.update(backend=eb, backend_at=what)
    if ee > worst["eager"]: worst.update(eager=ee, eager_at=what)
  return {"closer": closer, **worst}


def rounding_only(row: dict) -> bool:
  """Whether a row that disagrees with eager is no farther from float64 than eager (float64_check)."""
  return bool(row.get("float64", {}).get("closer"))


def worker_main(name: str, mode: str, backend: str, size: str, quick: bool) -> dict:
  row = {"model": name, "mode": mode, "backend": backend, "size": size}
  rounds, round_s, budget_s = (3, 0.15, 1.0) if quick else (5, 0.5, 4.0)
  if backend != "eager": row["setup_s"] = bm.one_time_setup(compile_kwargs(backend)["backend"])  # pre-warmed cache: seconds
  torch._dynamo.reset()
  reference = None
  if backend != "eager":
    model, inputs = zoo.build(name, size)
    reference = detached(make_call(mode, model, inputs)())
    del model
    gc.collect()
  torch_uop.reset_metrics()
  model, inputs = zoo.build(name, size)
  compiled = model if backend == "eager" else torch.compile(model, dynamic=False, **compile_kwargs(backend))
  call = make_call(mode, compiled, inputs, model)
  t0 = time.perf_counter()
  first = call()
  row["first_call_s"] = time.perf_counter() - t0
  if reference is not None:
    try:
      zoo.assert_matches(first, reference, RTOL, ATOL_SCALE)
      row["match"] = True
    except AssertionError as e:
      row["match"], row["mismatch"] = False, " ".join(str(e).split())[:400]
      row["float64"] = float64_check(name, mode, size, first, reference)
  if is_uop(backend):
    m = torch_uop.metrics()
    row["uop"] = {k: m[k] for k in ("graphs_compiled", "graphs_fallen_back", "fallback_nodes_total", "nodes_fallen_back",
                                     "nodes_lowered", "kernels_compiled")}
    row["uop"]["compile_time_s"] = m["compile_time_s"]
  del first, reference
  row.update(time_steady(call, rounds, round_s, budget_s))
  if backend != "eager": row["compile_s"] = max(row["first_call_s"] - row["ms"] / 1e3, 0.0)
  row["peak_alloc_mb"] = peak_alloc_bytes(call) / 2 ** 20
  row["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
  return row


def worker_entry(args) -> int:
  name, mode, backend = args.worker
  try:
    row = worker_main(name, mode, backend, args.size, args.quick)
  except Exception as e:  # reported as the row's error; the run goes on
    traceback.print_exc()
    row = {"model": name, "mode": mode, "backend": backend, "size": args.size, "error": f"{type(e).__name__}: {e}"[:600]}
  print(RESULT_TAG + json.dumps(row, default=str), flush=True)
  return 0


# ----- the run: workers in fresh processes -----

def run_process(cmd: list, env: dict, timeout: float) -> tuple[dict | None, str]:
  """Run a worker in its own process group (Inductor's compile workers die with it on a timeout).
  Returns (its result or None, why not)."""
  p = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
  try:
    out, err = p.communicate(timeout=timeout)
  except subprocess.TimeoutExpired:
    os.killpg(p.pid, signal.SIGKILL)
    p.communicate()
    return None, f"timed out after {timeout:.0f} s"
  for line in out.splitlines():
    if line.startswith(RESULT_TAG): return json.loads(line[len(RESULT_TAG):]), ""
  tail = " | ".join(err.strip().splitlines()[-3:])
  return None, f"exit {p.returncode}: {tail}"[:600]


def worker_cmd(args, *extra) -> list:
  cmd = [sys.executable, os.path.abspath(__file__), "--size", args.size, "--threads", str(args.threads), *extra]
  return cmd + (["--quick"] if args.quick else [])


def cache_env(root: str) -> dict:
  return dict(os.environ, TORCHINDUCTOR_CACHE_DIR=os.path.join(root, "inductor"), TORCH_UOP_CACHE_DIR=os.path.join(root, "uop"),
              PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))


def prewarm(backend: str, root: str, args) -> str:
  """Cache directories in which `backend` compiled a tiny function: each worker starts from a copy."""
  base = os.path.join(root, f"base_{backend}")
  os.makedirs(base)
  _, why = run_process(worker_cmd(args, "--setup", backend), cache_env(base), args.timeout)
  if why: print(f"  setup of {backend} failed: {why}", flush=True)
  return base


def run_worker(name: str, mode: str, backend: str, args, root: str, bases: dict) -> dict:
  fresh = tempfile.mkdtemp(prefix="worker_", dir=root)
  try:
    if backend in bases: shutil.copytree(bases[backend], fresh, dirs_exist_ok=True)
    t0 = time.perf_counter()
    row, why = run_process(worker_cmd(args, "--worker", name, mode, backend), cache_env(fresh), args.timeout)
    wall = time.perf_counter() - t0
    if args.warm and backend != "eager" and row and "compile_s" in row:  # again, with the caches the first run left
      again, _ = run_process(worker_cmd(args, "--worker", name, mode, backend), cache_env(fresh), args.timeout)
      if again and "compile_s" in again: row["warm_compile_s"] = again["compile_s"]
  finally:
    shutil.rmtree(fresh, ignore_errors=True)
  row = row or {"model": name, "mode": mode, "backend": backend, "size": args.size, "error": why}
  row["worker_s"] = wall
  return row


def setup_entry(args) -> int:
  print(f"setup {args.setup}: {bm.one_time_setup(compile_kwargs(args.setup)['backend']):.1f}s", flush=True)
  print(RESULT_TAG + "{}", flush=True)
  return 0


# ----- machine limits -----

def machine_limits(copy_floats: int = 1 << 24, mm: int = 1024, repeats: int = 20) -> dict:
  """This machine's copy bandwidth (GB/s, read + write of a 64 MB float32 copy_ into an existing tensor) and
  torch.mm throughput (GFLOP/s at mm^3 float32), each the best of `repeats`, at torch's current thread count."""
  x = torch.randn(copy_floats)
  y = torch.empty_like(x)
  y.copy_(x)
  copy_s = min(bm.timed_calls(lambda: y.copy_(x), repeats))
  a, b = torch.randn(mm, mm), torch.randn(mm, mm)
  bm.timed_calls(lambda: torch.mm(a, b), 3)
  mm_s = min(bm.timed_calls(lambda: torch.mm(a, b), repeats))
  return {"copy_gb_s": 2 * x.nbytes / copy_s / 1e9, "mm_gflop_s": 2 * mm ** 3 / mm_s / 1e9, "copy_mb": x.nbytes / 2 ** 20, "mm_size": mm}


# ----- report -----

def add_derived(rows: list[dict], limits: dict, size: str) -> None:
  """Speedups over eager, torch_uop over Inductor, and the kernels' GB/s and fraction of the copy bandwidth."""
  by = {(r["model"], r["mode"], r["backend"]): r for r in rows}
  for r in rows:
    if "ms" not in r: continue
    e = by.get((r["model"], r["mode"], "eager"), {})
    if r["backend"] != "eager" and "ms" in e: r["speedup"] = e["ms"] / r["ms"]
    ind = by.get((r["model"], r["mode"], "inductor"), {})
    if r["backend"] == "uop" and "ms" in ind: r["vs_inductor"] = ind["ms"] / r["ms"]
    entry = zoo.ZOO[r["model"]]
    if entry.bytes_moved:
      r["gb_s"] = entry.bytes_moved(size) / (r["ms"] / 1e3) / 1e9
      r["pct_of_copy"] = 100 * r["gb_s"] / limits["copy_gb_s"]


def geomean(xs: list[float]) -> float | None:
  return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None


def geomeans(rows: list[dict], modes: list[str]) -> dict:
  """Over the models (not the kernels), per mode and over both: uop/eager, inductor/eager, uop/inductor."""
  out = {}
  for label, ms in [(m, [m]) for m in modes] + ([("all", modes)] if len(modes) > 1 else []):
    sel = [r for r in rows if r["mode"] in ms and zoo.ZOO[r["model"]].group != "kernels"]
    g = {}
    pairs = [(f"{b.replace('-', '_')}_over_eager", b, "speedup") for b in ALL_BACKENDS if b != "eager"]
    for key, backend, field in pairs + [("uop_over_inductor", "uop", "vs_inductor")]:
      xs = [r[field] for r in sel if r["backend"] == backend and r.get(field)]
      if xs: g[key] = {"geomean": geomean(xs), "entries": len(xs)}
    out[label] = g
  return out


def fmt(v, p=2) -> str:
  return "-" if v is None else f"{v:.{p}f}"


def fmt_table(rows: list[dict], mode: str, backends: list[str], kernels: bool) -> str:
  by = {(r["model"], r["backend"]): r for r in rows if r["mode"] == mode}
  names = [n for n in dict.fromkeys(r["model"] for r in rows if r["mode"] == mode) if (zoo.ZOO[n].group == "kernels") == kernels]
  if not names: return ""
  compiled = [b for b in backends if b != "eager"]
  head = ["model"] + [f"{b} ms" + (" (x)" if b != "eager" else "") for b in backends]
  if "uop" in compiled and "inductor" in compiled: head.append("uop/ind")
  if compiled: head += ["compile s " + "/".join(compiled), "ok " + "/".join(compiled)]
  warm = [b for b in compiled if any("warm_compile_s" in by.get((n, b), {}) for n in names)]
  if warm: head.append("warm compile s " + "/".join(warm))
  head += ["peak MB " + "/".join(backends), "RSS MB " + "/".join(backends)]
  if kernels: head += ["GB/s " + "/".join(backends), "% of copy"]
  if "uop" in compiled: head.append("uop fallbacks")
  lines = []
  for n in names:
    rs = [by.get((n, b), {}) for b in backends]
    cells = [n]
    for b, r in zip(backends, rs):
      if "ms" not in r: cells.append("ERROR" if "error" in r else "-"); continue
      cells.append(f"{r['ms']:.3f}" + (f" ({fmt(r.get('speedup'))})" if b != "eager" else ""))
    u = by.get((n, "uop"), {})
    if "uop" in compiled and "inductor" in compiled: cells.append(fmt(u.get("vs_inductor")))
    if compiled:
      cs = [by.get((n, b), {}) for b in compiled]
      cells.append(" / ".join(fmt(r.get("compile_s"), 1) for r in cs))
      cells.append(" / ".join("ERR" if "error" in r else "f64" if rounding_only(r) else
                              {True: "yes", False: "NO"}.get(r.get("match"), "-") for r in cs))
      if warm: cells.append(" / ".join(fmt(by.get((n, b), {}).get("warm_compile_s"), 1) for b in warm))
    cells.append(" / ".join(fmt(r.get("peak_alloc_mb"), 0) for r in rs))
    cells.append(" / ".join(fmt(r.get("peak_rss_mb"), 0) for r in rs))
    if kernels:
      cells.append(" / ".join(fmt(r.get("gb_s"), 1) for r in rs))
      cells.append(" / ".join(fmt(r.get("pct_of_copy"), 0) for r in rs))
    if "uop" in compiled:
      m = u.get("uop")
      cells.append("-" if not m else str(m["fallback_nodes_total"]) + (f" ({m['graphs_fallen_back']} graphs)" if m["graphs_fallen_back"] else ""))
    lines.append(cells)
  return bm.text_table(head, lines)


def save_chart(path: str, rows: list[dict], backends: list[str]) -> str | None:
  """Speedup over eager and compile time per (model, mode), one bar per compiled backend. None without matplotlib."""
  try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
  except ImportError:
    return None
  compiled = [b for b in backends if b != "eager"]
  labels = list(dict.fromkeys(f"{r['model']}/{r['mode']}" for r in rows))
  by = {(f"{r['model']}/{r['mode']}", r["backend"]): r for r in rows}
  fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(max(8, 0.45 * len(labels)), 9))
  w = 0.8 / max(len(compiled), 1)
  xs = range(len(labels))
  for i, b in enumerate(compiled):
    ax1.bar([k + i * w for k in xs], [by.get((l, b), {}).get("speedup") or 0 for l in labels], w, label=b)
    ax2.bar([k + i * w for k in xs], [by.get((l, b), {}).get("compile_s") or 0 for l in labels], w, label=b)
  ax1.axhline(1.0, color="black", linewidth=0.8)
  ax1.set_yscale("log"); ax1.set_ylabel("speedup over eager (x)"); ax1.legend()
  ax2.set_yscale("log"); ax2.set_ylabel("cold compile (s)"); ax2.legend()
  for ax in (ax1, ax2): ax.set_xticks([k + w * (len(compiled) - 1) / 2 for k in xs], labels, rotation=60, ha="right", fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return path


def run_main(args, names: list[str], modes: list[str], backends: list[str]) -> int:
  cases = [(n, m) for n in names for m in modes if m == "infer" or zoo.ZOO[n].group != "kernels"]
  info = bm.machine_info()
  limits = machine_limits()
  print(f"# torch {info['torch']}, {info['cpu_count']} CPUs, torch threads {args.threads}, {info['processor']}, "
        f"load average {info['loadavg_at_start']}; size {args.size}; {len(cases)} cases x {len(backends)} backends, "
        f"a fresh process each; copy {limits['copy_gb_s']:.1f} GB/s, mm {limits['mm_gflop_s']:.0f} GFLOP/s", flush=True)
  t_start = time.perf_counter()
  root = tempfile.mkdtemp(prefix="bench_zoo_")
  rows = []
  try:
    bases = {b: prewarm(b, root, args) for b in backends if b != "eager"}
    for name, mode in cases:
      for b in backends:
        r = run_worker(name, mode, b, args, root, bases)
        rows.append(r)
        status = r.get("error") or (f"{r['ms']:.3f} ms" + (f", compile {r['compile_s']:.1f}s" if "compile_s" in r else "") +
                                    ("" if r.get("match", True) else ", MISMATCH"))
        fb = r.get("uop", {}).get("fallback_nodes_total")
        print(f"  {name:18s} {mode:5s} {b:8s} {status}" + (f", {fb} fallbacks" if fb else "") + f"  [{r['worker_s']:.0f}s]", flush=True)
  finally:
    shutil.rmtree(root, ignore_errors=True)
  add_derived(rows, limits, args.size)
  gm = geomeans(rows, modes)
  total_s = time.perf_counter() - t_start

  print()
  for mode in modes:
    for kernels in (False, True):
      table = fmt_table(rows, mode, backends, kernels)
      if table: print(f"## {mode}{' (kernels)' if kernels else ''}\n{table}\n")
  for n in names: print(f"  {n}: {zoo.ZOO[n].description[args.size]}")
  print("  ms: median of the best timing round; (x): eager ms / backend ms (>1: faster); uop/ind: inductor ms / uop ms;")
  print("  compile s: first call minus a steady call, cache dirs fresh (the compiler's one-time setup paid before);")
  print("  peak MB: most bytes torch's allocator held during one steady call; RSS MB: the worker's peak resident set;")
  print(f"  ok: main output (and in train every parameter gradient) assert_close to eager, rtol {RTOL}, atol {ATOL_SCALE}*max|ref|;"
        " f64: not, but no farther from a float64 run than eager on any tensor;")
  print(f"  % of copy: kernel GB/s over this machine's copy_ bandwidth ({limits['copy_gb_s']:.1f} GB/s)")
  for label, g in gm.items():
    if g: print(f"  geomean ({label}, models): " + ", ".join(f"{k.replace('_', ' ')} {v['geomean']:.2f}x ({v['entries']})" for k, v in g.items()))
  for r in rows:
    if r.get("uop", {}).get("nodes_fallen_back"): print(f"  uop fallbacks {r['model']}/{r['mode']}: {r['uop']['nodes_fallen_back']}")
    if r.get("match") is False:
      print(f"  MISMATCH {r['model']}/{r['mode']}/{r['backend']}: {r['mismatch']}")
      if "float64" in r:
        f = r["float64"]
        print(f"    against float64: {r['backend']} {f['backend']:.1e} (worst: {f.get('backend_at', '-')}), eager {f['eager']:.1e} "
              f"(worst: {f.get('eager_at', '-')}); " + ("no farther than eager on every tensor: shown as f64" if f["closer"] else "farther than eager"))
    if "error" in r: print(f"  ERROR {r['model']}/{r['mode']}/{r['backend']}: {r['error']}")
  print(f"  whole run {total_s:.0f}s; load average at start {info['loadavg_at_start']}, at end {bm._loadavg()}")
  if any(la and la[0] > 0.5 * (os.cpu_count() or 1) for la in (info["loadavg_at_start"], bm._loadavg())):
    print("  WARNING: the machine was busy with other work during this run; torch's threads stall on busy cores "
          "(eager and Inductor most), so rerun on an idle machine before reading the ratios.")

  name = f"zoo_{args.size}_{datetime.datetime.now():%Y%m%d_%H%M%S}.json"
  # a folder (one that exists, or a path ending in a separator) gets a file of its own name
  folder = args.out and (os.path.isdir(args.out) or args.out.endswith(os.sep))
  out = os.path.join(args.out, name) if folder else args.out or os.path.join(bm.RESULTS_DIR, name)
  os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
  with open(out, "w") as f:
    json.dump({"machine": info, "limits": limits, "args": vars(args), "models": {n: zoo.ZOO[n].description[args.size] for n in names},
               "geomean": gm, "total_s": total_s, "loadavg_at_end": bm._loadavg(), "rows": rows}, f, indent=1, default=str)
  print(f"  saved {out}")
  png = save_chart(os.path.splitext(out)[0] + ".png", rows, backends)
  print(f"  chart {png}" if png else "  no chart: matplotlib is not installed (pip install torch_uop[bench])")
  return 1 if any(r.get("match") is False and not rounding_only(r) or "error" in r for r in rows) else 0


# ----- the profile view -----

def format_groups(kernel_steps: dict, what: dict, work: dict, total: float, iters: int, limits: dict, top: int = 12) -> str:
  """Kernel time summed by what the kernels compute (their ATen ops), so a kind of kernel spread thin over many
  launches (a model's 12 attention blocks) shows as one line, with its achieved rates."""
  groups: dict = {}
  for step, (calls, secs) in kernel_steps.items():
    g = groups.setdefault(what.get(step, "-"), [0, 0.0, 0.0, 0.0])
    g[0] += 1
    g[1] += secs
    if step in work:
      g[2] += work[step][0] * calls
      g[3] += work[step][1] * calls
  lines = []
  for ops, (n, secs, nbytes, flops) in sorted(groups.items(), key=lambda kv: -kv[1][1])[:top]:
    gb, gf = nbytes / secs / 1e9, flops / secs / 1e9
    lines.append([ops[:60], f"{n}", f"{1e3 * secs / iters:.2f}", f"{100 * secs / total:.1f}%", f"{gb:.1f}",
                  f"{100 * gb / limits['copy_gb_s']:.0f}", f"{gf:.1f}", f"{100 * gf / limits['mm_gflop_s']:.0f}"])
  return bm.text_table(["kernels computing", "kernels", "ms/it", "share", "GB/s", "% copy", "GFLOP/s", "% mm"], lines,
                       left_first=True)


def profile_main(name: str, mode: str, size: str, top: int = 25) -> int:
  """torch_uop's kernels of one model by total time, with their work and achieved fraction of the machine's limits."""
  if zoo.ZOO[name].group == "kernels" and mode == "train": raise SystemExit(f"{name} is a kernel: inference only")
  limits = machine_limits()
  print(f"# {name} ({zoo.ZOO[name].description[size]}), {mode}, torch threads {torch.get_num_threads()}; "
        f"this machine: copy {limits['copy_gb_s']:.1f} GB/s, mm {limits['mm_gflop_s']:.0f} GFLOP/s", flush=True)
  model, inputs = zoo.build(name, size)
  eager_ms = statistics.median(bm.timed_calls(make_call(mode, model, inputs), 5)) * 1e3
  torch._dynamo.reset()
  torch_uop.reset_metrics()
  # no graph cache: a graph loaded whole from disk has no kernel ASTs, which kernel_work reads the FLOPs from
  compiled = torch.compile(model, backend="uop", dynamic=False, options={"graph_cache": False})
  call = make_call(mode, compiled, inputs, model)
  with torch_uop.debug.capture() as graphs:
    t0 = time.perf_counter()
    call()
    first_s = time.perf_counter() - t0
  metrics = torch_uop.metrics()
  bm.timed_calls(call, 2)
  uop_ms = statistics.median(bm.timed_calls(call, 5)) * 1e3
  iters = max(3, min(20, round(3000 / max(uop_ms, 1e-3))))
  with torch_uop.debug.profile() as steps:
    for _ in range(iters): call()
  work, what = {}, {}
  for g in graphs:
    work.update(torch_uop.debug.kernel_work(g))
    what.update(torch_uop.debug.kernel_ops(g))

  total = sum(s for _, s in steps.values()) or 1e-12
  rows = sorted(steps.items(), key=lambda kv: -kv[1][1])
  head = ["step", "ops", "calls/it", "us/call", "share", "MB", "MFLOP", "GB/s", "% copy", "GFLOP/s", "% mm"]
  lines, missing = [], 0
  for step, (calls, secs) in rows[:top]:
    per = secs / calls
    cells = [step[:40], what.get(step, "-")[:40], f"{calls / iters:.0f}", f"{per * 1e6:.1f}", f"{100 * secs / total:.1f}%"]
    if step in work:
      nbytes, flops = work[step]
      gb, gf = nbytes / per / 1e9, flops / per / 1e9
      cells += [f"{nbytes / 2 ** 20:.2f}", f"{flops / 1e6:.2f}", f"{gb:.1f}", f"{100 * gb / limits['copy_gb_s']:.0f}",
                f"{gf:.1f}", f"{100 * gf / limits['mm_gflop_s']:.0f}"]
    else:
      missing += not step.startswith("fallback ")
      cells += ["-"] * 6
    lines.append(cells)
  print(bm.text_table(head, lines, left_first=True))

  kernel_steps = {k: v for k, v in steps.items() if not k.startswith("fallback ")}
  print()
  print(format_groups(kernel_steps, what, work, total, iters, limits))
  fallback_steps = {k: v for k, v in steps.items() if k.startswith("fallback ")}
  k_secs = sum(s for _, s in kernel_steps.values())
  k_bytes = sum(work[k][0] * c for k, (c, _) in kernel_steps.items() if k in work)
  k_flops = sum(work[k][1] * c for k, (c, _) in kernel_steps.items() if k in work)
  print()
  print(f"  {len(kernel_steps)} kernels, {1e3 * k_secs / iters:.2f} ms per iteration; {len(steps) - len(rows[:top])} more steps below the top {top}")
  if k_secs:
    gb, gf = k_bytes / k_secs / 1e9, k_flops / k_secs / 1e9
    print(f"  kernels in all: {k_bytes / iters / 2 ** 20:.1f} MB and {k_flops / iters / 1e9:.3f} GFLOP per iteration, "
          f"{gb:.1f} GB/s ({100 * gb / limits['copy_gb_s']:.0f}% of copy), {gf:.1f} GFLOP/s ({100 * gf / limits['mm_gflop_s']:.0f}% of mm)")
  if fallback_steps:
    print(f"  fallback steps: {1e3 * sum(s for _, s in fallback_steps.values()) / iters:.2f} ms per iteration")
    for k, (c, s) in sorted(fallback_steps.items(), key=lambda kv: -kv[1][1]): print(f"    {k}: {c / iters:.0f} per iteration, {1e6 * s / c:.1f} us each")
  else:
    print("  fallback steps: none")
  print(f"  nodes fallen back: {metrics['nodes_fallen_back'] or 'none'}; whole graphs fallen back: {metrics['graphs_fallen_back']}")
  print(f"  profiled steps sum to {1e3 * total / iters:.2f} ms per iteration ({iters} iterations); unprofiled: "
        f"uop {uop_ms:.2f} ms, eager {eager_ms:.2f} ms per call; first call (compile) {first_s:.1f}s")
  if missing: print(f"  {missing} kernels without work figures (their graph came without a plan)")
  return 0


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--set", default="zoo", choices=("zoo", "more"), help="zoo: the models of record and the two kernels "
                  f"(default); more: {','.join(zoo.MORE)}, models beyond the zoo of record")
  ap.add_argument("--only", default=None, help=f"comma-separated names from either set (overrides --set): {','.join(zoo.ZOO)}")
  ap.add_argument("--modes", default="infer,train", help="comma-separated subset of infer,train")
  ap.add_argument("--backends", default=",".join(BACKENDS), help=f"comma-separated subset of {','.join(ALL_BACKENDS)}")
  ap.add_argument("--warm", action="store_true", help="run each compiled worker a second time in the cache directory "
                  "its first run filled, and report that compile time too (warm compile s)")
  ap.add_argument("--size", default="real", choices=zoo.SIZES)
  ap.add_argument("--quick", action="store_true", help="fewer and shorter timing rounds")
  ap.add_argument("--threads", type=int, default=2, help="torch.set_num_threads(N) in every worker (default 2)")
  ap.add_argument("--timeout", type=float, default=480, help="seconds a worker may run (default 480)")
  ap.add_argument("--out", default=None, help="JSON path or a folder for it (default: benchmarks/results/zoo_<size>_<time>.json); the PNG goes next to it")
  ap.add_argument("--profile", metavar="MODEL", help="list torch_uop's kernels of MODEL by time instead of the benchmark")
  ap.add_argument("--mode", default="infer", choices=MODES, help="the mode --profile runs (default infer)")
  ap.add_argument("--top", type=int, default=25, help="how many of the slowest steps --profile lists (default 25)")
  ap.add_argument("--worker", nargs=3, metavar=("MODEL", "MODE", "BACKEND"), help=argparse.SUPPRESS)
  ap.add_argument("--setup", metavar="BACKEND", help=argparse.SUPPRESS)
  args = ap.parse_args(argv)
  torch.set_num_threads(args.threads)
  if args.worker: return worker_entry(args)
  if args.setup: return setup_entry(args)
  if args.profile:
    if args.profile not in zoo.ZOO: ap.error(f"unknown model {args.profile!r}; choose from {', '.join(zoo.ZOO)}")
    return profile_main(args.profile, args.mode, args.size, args.top)
  default = zoo.MORE if args.set == "more" else [n for n in zoo.ZOO if n not in zoo.MORE]
  names = [n.strip() for n in args.only.split(",") if n.strip()] if args.only else default
  modes = [m.strip() for m in args.modes.split(",") if m.strip()]
  backends = [b.strip() for b in args.backends.split(",") if b.strip()]
  for n in names:
    if n not in zoo.ZOO: ap.error(f"unknown model {n!r}; choose from {', '.join(zoo.ZOO)}")
  for m in modes:
    if m not in MODES: ap.error(f"unknown mode {m!r}; choose from {', '.join(MODES)}")
  for b in backends:
    if b not in ALL_BACKENDS: ap.error(f"unknown backend {b!r}; choose from {', '.join(ALL_BACKENDS)}")
  return run_main(args, names, modes, [b for b in ALL_BACKENDS if b in backends])


if __name__ == "__main__":
  sys.exit(main())
