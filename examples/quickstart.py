"""Quickstart: compile a small model with backend="uop", check it against eager, time it, show metrics.

Run: python examples/quickstart.py     (exits non-zero if the compiled model disagrees with eager)
"""
import statistics
import sys
import time

import torch
import torch.nn as nn

import torch_uop


class TinyNet(nn.Module):
  def __init__(self):
    super().__init__()
    self.net = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.LayerNorm(128), nn.Linear(128, 10))

  def forward(self, x): return self.net(x).softmax(-1)


def ms_per_call(fns, x, rounds: int = 5, calls: int = 40) -> list[float]:
  """Milliseconds per call of each fn: the median of its best round, the fns timed in turn each round
  (other work on a small machine stalls torch's threads for a while; one quiet round is enough)."""
  for fn in fns:
    for _ in range(10): fn(x)
  best = [float("inf")] * len(fns)
  for _ in range(rounds):
    for i, fn in enumerate(fns):
      times = []
      for _ in range(calls):
        t0 = time.perf_counter()
        fn(x)
        times.append(time.perf_counter() - t0)
      best[i] = min(best[i], statistics.median(times) * 1e3)
  return best


def main() -> int:
  torch.manual_seed(0)
  model = TinyNet().eval()
  x = torch.randn(32, 64)

  torch_uop.reset_metrics()
  compiled = torch.compile(model, backend="uop")
  with torch.no_grad():
    expected = model(x)
    actual = compiled(x)
    diff = (actual - expected).abs().max().item()
    print(f"max abs diff vs eager: {diff:.3e}")
    try:
      torch.testing.assert_close(actual, expected)
    except AssertionError as e:
      print(f"MISMATCH: {e}")
      return 1
    print("OK: torch.compile(backend='uop') matches eager")

    eager_ms, uop_ms = ms_per_call([model, compiled], x)
  print(f"speed: eager {eager_ms:.3f} ms/call, uop {uop_ms:.3f} ms/call ({eager_ms / uop_ms:.2f}x eager)")

  m = torch_uop.metrics()
  compile_s = m["compile_time_s"].get("total", 0.0)
  fallen = f" {m['nodes_fallen_back']}" if m["nodes_fallen_back"] else ""
  print(f"metrics: {m['graphs_compiled']} graph(s) compiled, {m['graphs_fallen_back']} run whole by torch, "
        f"{m['nodes_lowered']} ATen nodes lowered, {m['fallback_nodes_total']} fell back to ATen{fallen}, "
        f"{m['kernels_compiled']} kernels compiled, {m['kernels_launched']} launched, compile {compile_s:.3f}s")
  return 0


if __name__ == "__main__":
  sys.exit(main())
