"""Per-call overhead of a one-kernel graph (`x + 1` on 16 elements): eager, Inductor and torch_uop.

Prints µs per call (median of interleaved rounds) and, for torch_uop, the time inside
CompiledGraph.__call__ and a bare launch of its kernel. Run from the repository root:
`PYTHONPATH=. python benchmarks/bench_overhead.py [--no-inductor]` (ROUNDS=15 by default).
"""
import os, sys, time, statistics
import torch
import torch_uop  # noqa: F401
from torch_uop.debug import capture  # noqa: F401


def per_call_us(fn, x, n=2000):
  t0 = time.perf_counter()
  for _ in range(n): fn(x)
  return (time.perf_counter() - t0) / n * 1e6


def main():
  torch._dynamo.config.cache_size_limit = 64
  x = torch.randn(16)
  f = lambda x: x + 1
  fns = {"eager": f}
  if "--no-inductor" not in sys.argv: fns["inductor"] = torch.compile(f, backend="inductor")
  from torch_uop.runtime import executor
  seen = []
  executor._observers.append(seen)
  fns["uop"] = torch.compile(lambda x: x + 1, backend="uop")
  with torch.no_grad():
    for fn in fns.values():
      for _ in range(200): fn(x)
  executor._observers.remove(seen)
  g = seen[-1]
  fns["uop CompiledGraph.__call__"] = lambda x: g([x])
  if hasattr(g, "_call_general"): fns["uop general call path"] = lambda x: g._call_general([x])
  # the linked kernel step (executor.LinkedKernel): its ctypes function and builtin launcher
  step = next(s for kind, s in g.steps if kind == "kernel")
  prog, entry = step.fn, step.entry
  out = torch.empty(16)
  ptrs = [out.data_ptr(), x.data_ptr()]
  fns["uop kernel only (ctypes)"] = lambda x: prog(*ptrs, 0, 16)
  if entry is not None: fns["uop kernel only (builtin launcher)"] = lambda x: entry(*ptrs)
  fns["torch.empty(16)"] = lambda x: torch.empty(16)
  res = {k: [] for k in fns}
  with torch.no_grad():
    for _ in range(int(os.environ.get("ROUNDS", 15))):
      for name, fn in fns.items(): res[name].append(per_call_us(fn, x))
  print(f"load: {os.getloadavg()}")
  base = statistics.median(res["inductor"]) if "inductor" in res else None
  for name, r in res.items():
    m = statistics.median(r)
    print(f"{name:32s} {m:7.2f} us  min {min(r):7.2f}" + (f"  x inductor {m / base:.2f}" if base else ""))


if __name__ == "__main__": main()
