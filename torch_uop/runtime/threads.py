"""Run one kernel across CPU threads.

Every kernel takes the bounds `[lo, hi)` of its thread-split loop (core/opt.py). `launch` cuts that
loop into one chunk per thread torch may use (`torch.get_num_threads()`, read at each launch, so
`torch.set_num_threads` takes effect on compiled graphs at once). Where the kernel has an OpenMP
launcher (runtime/cpu.py `parallel_entry_ir`), torch's own OpenMP threads run the chunks; otherwise the
first chunk runs on the calling thread and the others on a persistent pool (ctypes releases the GIL for
the call, so the chunks really run in parallel; a handoff costs tens of microseconds). Small kernels run
whole on the calling thread.
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


def max_threads(split_size: int, work: int) -> int:
  """The most threads a kernel with this split-loop size and total work is worth, before torch's thread count."""
  if split_size < 2: return 1
  return max(1, min(split_size, work // MIN_WORK_PER_THREAD))


def launch(fn, ptrs, split_size: int, max_threads: int, entry=None, parallel_entry=None, split_arg: bool = False) -> None:
  """Run `fn` over `[0, split_size)` on min(max_threads, torch.get_num_threads()) threads, read at each call;
  `entry` (optional) runs the whole loop on this thread through the kernel's builtin launcher, `parallel_entry`
  (optional) on OpenMP threads (runtime/cpu.py parallel_entry_ir); without it, on this module's pool.
  `split_arg`: the launchers take the split size as an argument (a kernel with a symbolic one)."""
  n_threads = min(max_threads, torch.get_num_threads())
  if n_threads <= 1:
    if entry is not None:
      if split_arg: entry(*ptrs, max(split_size, 1))
      else: entry(*ptrs)
    else: fn(*ptrs, 0, max(split_size, 1))
    return
  if parallel_entry is not None:
    if split_arg: parallel_entry(*ptrs, split_size, n_threads)
    else: parallel_entry(*ptrs, n_threads)
    return
  bounds = [split_size * i // n_threads for i in range(n_threads + 1)]
  pool = _get_pool(n_threads - 1)
  futures = [pool.submit(fn, *ptrs, lo, hi) for lo, hi in zip(bounds[1:-1], bounds[2:])]
  fn(*ptrs, bounds[0], bounds[1])
  for fut in futures: fut.result()
