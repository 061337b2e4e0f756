"""Run one kernel across CPU threads.

Every kernel takes the bounds `[lo, hi)` of its thread-split loop (core/opt.py). `launch` cuts that
loop into one chunk per thread torch may use (`torch.get_num_threads()`), runs the first chunk on
the calling thread and the others on a persistent pool; ctypes releases the GIL for the call, so
the chunks really run in parallel. Small kernels run whole on the calling thread: a handoff costs
tens of microseconds.
"""
from __future__ import annotations
import concurrent.futures
import torch

# below this many scalar operations a kernel is not worth a thread handoff
MIN_WORK_PER_THREAD = 1 << 16

_pool: concurrent.futures.ThreadPoolExecutor | None = None
_pool_size = 0


def _get_pool(n: int) -> concurrent.futures.ThreadPoolExecutor:
  global _pool, _pool_size
  if _pool is None or _pool_size < n:
    if _pool is not None: _pool.shutdown(wait=False)
    _pool = concurrent.futures.ThreadPoolExecutor(max_workers=n, thread_name_prefix="torch_uop")
    _pool_size = n
  return _pool


def threads_for(split_size: int, work: int) -> int:
  """How many threads a kernel with this split-loop size and total work should use."""
  if split_size < 2: return 1
  return max(1, min(torch.get_num_threads(), split_size, work // MIN_WORK_PER_THREAD))


def launch(fn, ptrs: list, split_size: int, n_threads: int) -> None:
  if n_threads <= 1:
    fn(*ptrs, 0, max(split_size, 1))
    return
  bounds = [split_size * i // n_threads for i in range(n_threads + 1)]
  pool = _get_pool(n_threads - 1)
  futures = [pool.submit(fn, *ptrs, lo, hi) for lo, hi in zip(bounds[1:-1], bounds[2:])]
  fn(*ptrs, bounds[0], bounds[1])
  for fut in futures: fut.result()
