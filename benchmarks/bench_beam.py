"""Heuristic opts vs BEAM search: time per call and search time, cold (empty tuning cache) and warm.

Run: python benchmarks/bench_beam.py [--beam 4] [--repeats 15] [--only softmax]
Each case is compiled with the heuristic (beam 0) and with BEAM=N in a fresh cache directory (cold search),
then compiled again after a Dynamo reset (the winners now come from the disk cache: warm). Calls are timed
interleaved, median of `repeats` rounds; the ratio is heuristic time / BEAM time (above 1: BEAM is faster).
"""
import argparse
import os
import statistics
import sys
import tempfile
import time

os.environ["TORCH_UOP_CACHE_DIR"] = tempfile.mkdtemp(prefix="torch_uop_bench_beam_")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import torch  # noqa: E402
import torch_uop  # noqa: E402
from torch_uop.testing.models import CNN  # noqa: E402


def cases():
  yield "matmul 512^3", (lambda a, b: a @ b), (torch.randn(512, 512), torch.randn(512, 512))
  yield "matmul 1024^3", (lambda a, b: a @ b), (torch.randn(1024, 1024), torch.randn(1024, 1024))
  yield "softmax 4096x1024", (lambda x: torch.softmax(x, -1)), (torch.randn(4096, 1024),)
  cnn = CNN().eval()
  yield "CNN 8x3x32x32 (eval)", cnn, (torch.randn(8, 3, 32, 32),)


def _own_code(fn):
  """fn behind a function with a code object of its own: Dynamo keeps compiled graphs per code object, so
  variants compiled from one function would otherwise share (and evict) each other's entries."""
  ns = {"fn": fn}
  exec("def call(*args): return fn(*args)", ns)
  return ns["call"]


def compile_timed(fn, args, beam):
  torch_uop.reset_metrics()
  f = torch.compile(_own_code(fn), backend="uop", options={"beam": beam}, dynamic=False)
  with torch.no_grad(): f(*args)
  return f, torch_uop.metrics()


def time_call(f, args, inner):
  with torch.no_grad():
    t0 = time.perf_counter()
    for _ in range(inner): f(*args)
  return (time.perf_counter() - t0) / inner


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--beam", type=int, default=4)
  ap.add_argument("--repeats", type=int, default=15)
  ap.add_argument("--only", default="", help="run the cases whose name contains this")
  opt = ap.parse_args()
  print(f"load: {os.getloadavg()}, threads {torch.get_num_threads()}")
  print(f"{'case':24s} {'heur ms':>9s} {'beam ms':>9s} {'ratio':>6s} {'search cold s':>14s} {'search warm s':>14s} {'searched':>8s}")
  for name, fn, args in cases():
    if opt.only not in name: continue
    torch._dynamo.reset()
    with torch.no_grad(): ref = fn(*args)
    heur, _ = compile_timed(fn, args, 0)
    beam, cold = compile_timed(fn, args, opt.beam)
    with torch.no_grad(): torch.testing.assert_close(beam(*args), ref, rtol=1e-3, atol=1e-3)
    _, warm = compile_timed(fn, args, opt.beam)  # the tuning winners now come from the disk cache
    beam, _ = compile_timed(fn, args, opt.beam)
    heur, _ = compile_timed(fn, args, 0)
    t = time_call(heur, args, 1)
    inner = max(1, int(0.05 / max(t, 1e-6)))
    th, tb = [], []
    for _ in range(opt.repeats):  # interleaved, so load changes hit both alike
      th.append(time_call(heur, args, inner))
      tb.append(time_call(beam, args, inner))
    mh, mb = statistics.median(th), statistics.median(tb)
    print(f"{name:24s} {mh * 1e3:9.3f} {mb * 1e3:9.3f} {mh / mb:6.2f} {cold['compile_time_s'].get('search', 0):14.2f} "
          f"{warm['compile_time_s'].get('search', 0):14.3f} {cold['kernels_searched']:4d}/{warm['search_cache_hits']:<3d}")
  print(f"load: {os.getloadavg()}")


if __name__ == "__main__":
  main()
