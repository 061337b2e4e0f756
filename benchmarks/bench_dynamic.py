"""Benchmark: dynamic shapes. eager vs Inductor vs torch_uop, each compiled with dynamic=True, over a
sequence of batch sizes (and, for the transformer, sequence lengths), in one run. torch_uop runs twice:
`uop` (the default: one symbolic compile serves every size) and `uop-static` (symbolic_shapes=False: a
static copy per size).

For each model (MLP, CNN, transformer block of bench_models.py) and mode (inference, training step)
every backend gets the same seeded model and walks the same list of sizes. At each new size it makes
the first call (compile, or for torch_uop a size specialization, plus one run; checked against
eager with assert_close), then times steady calls. It reports:

- ms per call at each size (median of the best of interleaved rounds, as bench_models), the geomean
  speedup over eager across sizes;
- compile s: the sum over sizes of (first call at that size - a steady call at it): what a user pays
  for the sizes, Dynamo's tracing included;
- the number of Dynamo graphs (recompiles), torch_uop's symbolic compiles and size specializations.

  python benchmarks/bench_dynamic.py                  # everything (a few minutes)
  python benchmarks/bench_dynamic.py --models tf --modes train --no-inductor
"""
from __future__ import annotations
import argparse
import copy
import datetime
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_models as bm  # noqa: E402  fresh cache dirs for this process, then torch and torch_uop

import torch  # noqa: E402
import torch_uop  # noqa: E402

SIZES = {  # per model: the input sizes walked, in order
  "mlp": [(64,), (32,), (100,), (17,), (48,)],
  "cnn": [(8,), (4,), (12,), (6,), (16,)],
  "tf": [(4, 32), (2, 24), (6, 16), (3, 40), (8, 32)],
}


def inputs_for(name: str, size: tuple):
  g = torch.Generator().manual_seed(sum(size))
  if name == "mlp": return torch.randn(size[0], 32, generator=g), torch.randint(0, 10, size, generator=g)
  if name == "cnn": return torch.randn(size[0], 3, 32, 32, generator=g), torch.randint(0, 10, size, generator=g)
  return torch.randint(0, 100, size, generator=g), torch.randint(0, 100, size, generator=g)


def run_backend(name: str, mode: str, backend: str, model, reference: dict | None, rounds: int, per_round: int) -> dict:
  """Walk every size with one compiled model; returns per-size first-call and steady times."""
  torch._dynamo.reset()
  torch._dynamo.utils.counters.clear()
  torch_uop.reset_metrics()
  model = copy.deepcopy(model).train(mode == "train")
  if backend == "eager": compiled = model
  elif backend == "uop-static": compiled = torch.compile(model, backend="uop", dynamic=True, options={"symbolic_shapes": False})
  else: compiled = torch.compile(model, backend=backend, dynamic=True)
  row = {"model": name, "mode": mode, "backend": backend, "sizes": {}, "outputs": {}}
  calls = {}
  for size in SIZES[name]:
    x, y = inputs_for(name, size)
    call = bm.make_call(mode, compiled, x, y)
    t0 = time.perf_counter()
    first = call()
    first_s = time.perf_counter() - t0
    ok = None
    if reference is not None:
      ref = reference[size]
      try:
        torch.testing.assert_close(first[0], ref[0], rtol=bm.RTOL, atol=bm.ATOL)
        for a, b in zip(first[1] or [], ref[1] or []): torch.testing.assert_close(a, b, rtol=bm.RTOL, atol=bm.ATOL)
        ok = True
      except AssertionError: ok = False
    row["outputs"][size] = first
    bm.timed_calls(call, 3)  # warm
    calls[size] = call
    row["sizes"][size] = {"first_s": first_s, "ok": ok}
  for _ in range(rounds):  # rounds over the sizes, so a burst of other work cannot distort one size alone
    for size, call in calls.items():
      row["sizes"][size].setdefault("rounds", []).append(sorted(bm.timed_calls(call, per_round))[per_round // 2])
  for size, s in row["sizes"].items():
    s["ms"] = min(s.pop("rounds")) * 1e3
    s["compile_s"] = max(s["first_s"] - s["ms"] / 1e3, 0.0)
  row["compile_s"] = sum(s["compile_s"] for s in row["sizes"].values()) if backend != "eager" else None
  row["dynamo_graphs"] = torch._dynamo.utils.counters["stats"]["unique_graphs"]
  if backend.startswith("uop"):
    m = torch_uop.metrics()
    row["uop"] = {k: m[k] for k in ("graphs_compiled", "symbolic_graphs", "size_specializations", "graphs_fallen_back",
                                    "fallback_nodes_total")}
  return row


def fmt(rows: list[dict], backends: list[str]) -> str:
  lines = []
  for name, mode in dict.fromkeys((r["model"], r["mode"]) for r in rows):
    by = {r["backend"]: r for r in rows if (r["model"], r["mode"]) == (name, mode)}
    eager = by.get("eager")
    lines.append(f"{name} {mode}: sizes {SIZES[name]}")
    for b in backends:
      r = by.get(b)
      if r is None: continue
      ms = [r["sizes"][s]["ms"] for s in SIZES[name]]
      speedup = math.exp(sum(math.log(eager["sizes"][s]["ms"] / r["sizes"][s]["ms"]) for s in SIZES[name]) / len(ms)) if eager else float("nan")
      extra = ""
      if b != "eager":
        ok = all(r["sizes"][s]["ok"] for s in SIZES[name])
        extra = f"  compile {r['compile_s']:.2f}s  dynamo graphs {r['dynamo_graphs']}  ok {'yes' if ok else 'NO'}"
        if "uop" in r:
          u = r["uop"]
          extra += f"  symbolic {u['symbolic_graphs']}  specializations {u['size_specializations']}  " \
                   f"fallbacks {u['fallback_nodes_total'] + u['graphs_fallen_back']}"
      lines.append(f"  {b:10s} ms {' '.join(f'{v:7.3f}' for v in ms)}  x{speedup:5.2f}{extra}")
  lines.append("  ms = median of the best round of steady calls per size; x = geomean over sizes of eager ms / ms;")
  lines.append("  compile = sum over sizes of (first call - steady call); ok = every first call assert_close to eager")
  return "\n".join(lines)


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--models", default="mlp,cnn,tf")
  ap.add_argument("--modes", default="infer,train")
  ap.add_argument("--no-inductor", action="store_true")
  ap.add_argument("--no-static", action="store_true", help="leave out uop-static (a static copy per size)")
  ap.add_argument("--rounds", type=int, default=5)
  ap.add_argument("--per-round", type=int, default=10)
  ap.add_argument("--out", default=None)
  args = ap.parse_args(argv)
  backends = ["eager"] + ([] if args.no_inductor else ["inductor"]) + ["uop"] + ([] if args.no_static else ["uop-static"])
  setup = {b: bm.one_time_setup(b) for b in backends if b not in ("eager", "uop-static")}
  rows = []
  for name in args.models.split(","):
    for mode in args.modes.split(","):
      model = bm.make_case(name)[0]
      reference = None
      for b in backends:
        row = run_backend(name, mode, b, model, reference, args.rounds, args.per_round)
        if b == "eager": reference = row["outputs"]
        rows.append(row)
        print(f"  done {name} {mode} {b}", file=sys.stderr)
  for r in rows: r.pop("outputs")
  print(fmt(rows, backends))
  print(f"one-time compiler setup (s, not counted above): {', '.join(f'{b} {s:.2f}' for b, s in setup.items())}")
  out = args.out or os.path.join(bm.RESULTS_DIR, f"dynamic_{datetime.datetime.now():%Y%m%d_%H%M%S}.json")
  os.makedirs(os.path.dirname(out), exist_ok=True)
  for r in rows: r["sizes"] = {str(k): v for k, v in r["sizes"].items()}
  with open(out, "w") as f: json.dump({"machine": bm.machine_info(), "rows": rows, "setup_s": setup}, f, indent=1)
  print(f"saved {out}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
