"""Diagnostics through Python's `logging`: the `torch_uop` logger and one child per stage.

Children: `torch_uop.compile` (a graph compiled, specialized or taken from the graph cache), `torch_uop.pipeline`
(what a named pass made, TORCH_UOP_DEBUG_AFTER), `torch_uop.fallback`
(an op or a whole graph run by torch), `torch_uop.kernels` (kernel lists and sources), `torch_uop.search` (BEAM),
`torch_uop.cache` (the disk cache), `torch_uop.freezing`, `torch_uop.progress`.

Levels: WARNING for what makes a program slower or cached state unusable without failing it (each fallback
once per process, with its reason); INFO for one line per compiled graph; DEBUG for kernel lists and sources.
`TORCH_UOP_DEBUG=N` (or `options={"debug": N}`) maps onto them: N >= 1 shows INFO, N >= 2 DEBUG, and it adds a
stderr handler when nothing else handles the logger. PyTorch's switches work too, since `torch_uop` is a module:
`TORCH_LOGS="+torch_uop"` or `torch._logging.set_logs(modules={"torch_uop": logging.DEBUG})`.
"""
from __future__ import annotations
import logging
import sys

ROOT = "torch_uop"


def get(stage: str) -> logging.Logger:
  """The logger of one stage: `torch_uop.<stage>`."""
  return logging.getLogger(f"{ROOT}.{stage}")


class _StderrHandler(logging.StreamHandler):
  """Writes to whatever sys.stderr is when a record comes (pytest and contextlib.redirect_stderr replace it)."""

  @property
  def stream(self): return sys.stderr

  @stream.setter
  def stream(self, value): pass


_handler: logging.Handler | None = None


def show_debug_output(debug: int) -> None:
  """What TORCH_UOP_DEBUG=debug asks for: the torch_uop logger at INFO (1) or DEBUG (2 and more), never raising a
  level someone set lower, and a stderr handler when no handler of its own or an ancestor's would print it."""
  global _handler
  if debug < 1: return
  root = logging.getLogger(ROOT)
  want = logging.INFO if debug == 1 else logging.DEBUG
  if root.level == logging.NOTSET or root.level > want: root.setLevel(want)
  if _handler is None and not _has_handler(root):
    _handler = _StderrHandler()
    _handler.setFormatter(logging.Formatter("[torch_uop] %(message)s"))
    root.addHandler(_handler)


def _has_handler(logger: logging.Logger) -> bool:
  while logger is not None:
    if logger.handlers: return True
    if not logger.propagate: return False
    logger = logger.parent
  return False


_warned: set = set()


def warn_once(stage: str, key: str, message: str, *args) -> None:
  """Log `message` at WARNING on `torch_uop.<stage>` the first time `key` is seen in this process."""
  if key in _warned: return
  _warned.add(key)
  get(stage).warning(message, *args)
