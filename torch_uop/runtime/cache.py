"""Disk cache of compiled kernel objects and of tuning results, so a second process compiling the same
graph skips LLVM and the BEAM search.

Keyed by the SHA-256 of the LLVM IR text, the target (CPU name and features), the optimization level
and the llvmlite version; each entry is one native object file (`load`/`store`). BEAM winners
(core/search.py) are small JSON texts under their own keys (`load_tuning`/`store_tuning`). The directory is
`TORCH_UOP_CACHE_DIR` (default `$XDG_CACHE_HOME/torch_uop` or `~/.cache/torch_uop`); set
`TORCH_UOP_CACHE=0` to turn it off. Writes are atomic (temp file + rename); an unreadable or
unwritable cache is ignored, never an error.
"""
from __future__ import annotations
import hashlib
import os
import tempfile

FORMAT_VERSION = "1"


def cache_dir() -> str | None:
  if os.environ.get("TORCH_UOP_CACHE", "1") == "0": return None
  d = os.environ.get("TORCH_UOP_CACHE_DIR")
  if not d:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    d = os.path.join(base, "torch_uop")
  return d


def key(*parts: str) -> str:
  h = hashlib.sha256(FORMAT_VERSION.encode())
  for p in parts: h.update(b"\0" + p.encode())
  return h.hexdigest()


def load(k: str, suffix: str = ".o") -> bytes | None:
  d = cache_dir()
  if d is None: return None
  try:
    with open(os.path.join(d, k[:2], k + suffix), "rb") as f: return f.read()
  except OSError:
    return None


def store(k: str, data: bytes, suffix: str = ".o") -> None:
  d = cache_dir()
  if d is None: return
  try:
    sub = os.path.join(d, k[:2])
    os.makedirs(sub, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=sub, suffix=".tmp")
    with os.fdopen(fd, "wb") as f: f.write(data)
    os.replace(tmp, os.path.join(sub, k + suffix))
  except OSError:
    pass


def load_tuning(k: str) -> str | None:
  data = load(k, ".tune.json")
  try:
    return None if data is None else data.decode()
  except UnicodeDecodeError:
    return None


def store_tuning(k: str, text: str) -> None: store(k, text.encode(), ".tune.json")
