"""Progress of long compile steps: kernels done of total, and time left.

`steps(what, total)` is a context manager whose `.update(n)` counts work done. On a terminal (stderr is a TTY), a
step still running after DELAY_S seconds shows a tqdm bar, removed when it ends; elsewhere nothing is drawn. A step
that took longer than DELAY_S is logged at INFO on `torch_uop.progress` either way. TORCH_UOP_PROGRESS=0 turns the
bar off.
"""
from __future__ import annotations
import contextlib
import os
import sys
import time
from torch_uop import log

DELAY_S = 2.0
_log = log.get("progress")


class _Steps:
  def __init__(self, what: str, total: int, unit: str):
    self.what, self.total, self.done, self.t0 = what, total, 0, time.perf_counter()
    self.bar = None
    if total > 1 and _bar_wanted():
      try:
        from tqdm import tqdm
      except ImportError:  # pragma: no cover - tqdm is a dependency; without it only the log line remains
        return
      self.bar = tqdm(total=total, desc=f"torch_uop {what}", unit=unit, delay=DELAY_S, leave=False, file=sys.stderr,
                      dynamic_ncols=True)

  def update(self, n: int = 1) -> None:
    self.done += n
    if self.bar is not None: self.bar.update(n)

  def close(self) -> None:
    if self.bar is not None: self.bar.close()
    seconds = time.perf_counter() - self.t0
    if seconds > DELAY_S: _log.info("%s: %d of %d done in %.1fs", self.what, self.done, self.total, seconds)


def _bar_wanted() -> bool:
  if os.environ.get("TORCH_UOP_PROGRESS", "1").strip().lower() in ("0", "false", "no", "off"): return False
  try: return sys.stderr.isatty()
  except (AttributeError, ValueError): return False  # a replaced or closed stderr


@contextlib.contextmanager
def steps(what: str, total: int, unit: str = "kernel"):
  s = _Steps(what, total, unit)
  try: yield s
  finally: s.close()
