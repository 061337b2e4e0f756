"""GPU-style targets: eager vs Inductor vs torch_uop on CUDA tensors (torch_uop renders CUDA C), or torch_uop's
OpenCL kernels on CPU tensors (--device opencl; eager and Inductor then run on the CPU), in one run.

Entries:
- copy: x.clone() over 16M floats, the bandwidth reference (each backend's own copy);
- chain: relu(x*2+1)*y over 16M floats, elementwise bandwidth, also as a fraction of eager's device-to-device copy;
- sum: a full reduction of 16M floats (torch_uop: one grouped reduction);
- softmax, layernorm: 4096x1024 rows;
- gemm32: float32 GEMM at 1024^3; gemm16: float16 GEMM at 4096^3 (TFLOP/s, and as a fraction of torch.mm's);
- mlp, tf: bench_models.py's MLP and transformer block, inference.
Each time is the median of timed calls after warm-up (CUDA: synchronized); "first s" is the first call (compile
included). Every first call is checked against eager. JSON goes to benchmarks/results/gpu_<device>_<time>.json.

  python benchmarks/bench_gpu.py                          # CUDA, every entry
  python benchmarks/bench_gpu.py --device opencl --quick  # pocl on the CPU: small sizes
"""
from __future__ import annotations
import argparse
import datetime
import json
import os
import statistics
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import torch_uop  # noqa: E402

ENTRIES = ("copy", "chain", "sum", "softmax", "layernorm", "gemm32", "gemm16", "mlp", "tf")


def make_entry(name: str, device: str, quick: bool):
  """(function, inputs, work) where work is ("bytes", n) or ("flops", n)."""
  n = (1 << 20) if quick else (1 << 24)
  rows = 256 if quick else 4096
  dev = "cpu" if device == "opencl" else device
  r = lambda *s, dtype=torch.float32: torch.randn(*s, device=dev, dtype=dtype)
  if name == "copy": return (lambda x: x.clone()), [r(n)], ("bytes", 8 * n)
  if name == "chain": return (lambda x, y: torch.relu(x * 2 + 1) * y), [r(n), r(n)], ("bytes", 12 * n)
  if name == "sum": return (lambda x: x.sum()), [r(n)], ("bytes", 4 * n)
  if name == "softmax": return (lambda x: torch.softmax(x, -1)), [r(rows, 1024)], ("bytes", 8 * rows * 1024)
  if name == "layernorm":
    w, b = r(1024), r(1024)
    return (lambda x: F.layer_norm(x, (1024,), w, b)), [r(rows, 1024)], ("bytes", 8 * rows * 1024)
  if name in ("gemm32", "gemm16"):
    m = (256 if quick else 1024) if name == "gemm32" else (512 if quick else 4096)
    dt = torch.float32 if name == "gemm32" else torch.float16
    return (lambda a, b: a @ b), [r(m, m, dtype=dt), r(m, m, dtype=dt)], ("flops", 2 * m ** 3)
  import bench_models as bm
  model, x, _, _ = bm.make_case(name)
  model = model.to(dev).eval()
  x = x.to(dev)
  def run(inp, model=model):
    with torch.no_grad(): return model(inp)
  return run, [x], None


def timed(fn, inputs, device: str, reps: int) -> list[float]:
  sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
  out = []
  for _ in range(reps):
    sync()
    t0 = time.perf_counter()
    fn(*inputs)
    sync()
    out.append(time.perf_counter() - t0)
  return out


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--device", default="cuda", choices=("cuda", "opencl"))
  ap.add_argument("--only", default=",".join(ENTRIES))
  ap.add_argument("--quick", action="store_true", help="small sizes, few calls")
  ap.add_argument("--no-inductor", action="store_true")
  ap.add_argument("--out", default=None)
  args = ap.parse_args(argv)
  if args.device == "cuda" and not torch.cuda.is_available():
    print("no CUDA device: use --device opencl", file=sys.stderr)
    return 2
  backends = ["eager"] + ([] if args.no_inductor else ["inductor"]) + ["uop"]
  reps = 5 if args.quick else 20
  rows = []
  for name in [e.strip() for e in args.only.split(",") if e.strip()]:
    fn, inputs, work = make_entry(name, args.device, args.quick)
    with torch.no_grad(): expected = fn(*inputs)
    for backend in backends:
      torch._dynamo.reset()
      torch_uop.reset_metrics()
      if backend == "eager": compiled = fn
      elif backend == "inductor": compiled = torch.compile(fn, backend="inductor")
      else: compiled = torch.compile(fn, backend="uop", options={"device": args.device} if args.device == "opencl" else {})
      row = {"entry": name, "backend": backend}
      try:
        first = timed(compiled, inputs, args.device, 1)[0]
        got = compiled(*inputs)
        tol = dict(rtol=2e-2, atol=2e-2) if name == "gemm16" else dict(rtol=1e-3, atol=1e-3)
        try:
          torch.testing.assert_close(got, expected, **tol)
          row["match"] = True
        except AssertionError as e:
          row["match"], row["mismatch"] = False, str(e).splitlines()[0]
        timed(compiled, inputs, args.device, 2)
        ms = 1e3 * statistics.median(timed(compiled, inputs, args.device, reps))
        row.update(ms=ms, first_s=first)
        if work:
          kind, amount = work
          row["gb_s" if kind == "bytes" else "tflop_s"] = amount / (ms / 1e3) / (1e9 if kind == "bytes" else 1e12)
        if backend == "uop":
          m = torch_uop.metrics()
          row["fallbacks"] = m["fallback_nodes_total"] + m["graphs_fallen_back"]
      except Exception as e:  # a benchmark reports a failure and goes on
        row["error"] = f"{type(e).__name__}: {e}"[:200]
      rows.append(row)
      print(json.dumps(row), flush=True)
  by = {(r["entry"], r["backend"]): r for r in rows}
  copy = by.get(("copy", "eager"), {}).get("gb_s")
  mm = by.get(("gemm16", "eager"), {}).get("tflop_s")
  print(f"\n{'entry':>10} " + " ".join(f"{b + ' ms':>13} {b + ' x':>8}" for b in backends[1:]) + f" {'eager ms':>10}  notes")
  for entry in dict.fromkeys(r["entry"] for r in rows):
    e = by[(entry, "eager")].get("ms")
    cells = []
    for b in backends[1:]:
      r = by.get((entry, b), {})
      cells.append(f"{r.get('ms', float('nan')):13.3f} {(e / r['ms']) if e and r.get('ms') else float('nan'):8.2f}")
    u = by.get((entry, "uop"), {})
    notes = []
    if "gb_s" in u: notes.append(f"uop {u['gb_s']:.1f} GB/s" + (f" = {u['gb_s'] / copy:.0%} of eager's copy" if copy else ""))
    if "tflop_s" in u: notes.append(f"uop {u['tflop_s']:.2f} TFLOP/s" + (f" = {u['tflop_s'] / mm:.0%} of torch.mm" if mm and entry == "gemm16" else ""))
    if u.get("match") is False: notes.append("MISMATCH")
    if "error" in u: notes.append(u["error"][:80])
    print(f"{entry:>10} " + " ".join(cells) + f" {e if e else float('nan'):10.3f}  {'; '.join(notes)}")
  os.makedirs(os.path.join(REPO, "benchmarks", "results"), exist_ok=True)
  out = args.out or os.path.join(REPO, "benchmarks", "results",
                                 f"gpu_{args.device}_{datetime.datetime.now():%Y%m%d_%H%M%S}.json")
  info = {"device": torch.cuda.get_device_name() if args.device == "cuda" else "opencl", "torch": torch.__version__}
  with open(out, "w") as f: json.dump({"info": info, "rows": rows}, f, indent=1)
  print(f"\nwrote {out}")
  return 0 if all(r.get("match", True) and "error" not in r for r in rows) else 1


if __name__ == "__main__":
  sys.exit(main())
