"""Disk cache of compiled kernel objects, graph plans, tuning results and device binaries, so a second process
compiling the same graph skips LLVM, the BEAM search or the whole compile.

Entries are bytes under a key (`key`, the SHA-256 of what the entry depends on) and a suffix that says what they
hold (`.o` native objects, `.graph` pickled plans, `.tune.json` BEAM winners, `.clbin` OpenCL binaries, `.ptx` /
`.cubin`); `load` / `store`. The directory is `TORCH_UOP_CACHE_DIR` (default `$XDG_CACHE_HOME/torch_uop` or
`~/.cache/torch_uop`); `TORCH_UOP_CACHE=0` turns it off.

What an entry must pass before its bytes reach a parser, pickle, LLVM or a driver:
- integrity: each file is a header (magic, format version, payload length, SHA-256 of key, suffix and payload)
  and the payload. A truncated, bit-flipped, foreign or renamed file fails the check and is a miss (reported once
  at debug level); the compile that follows replaces it. Writes are atomic (temp file + rename), and a failed or
  interrupted write leaves no entry behind.
- trust: an entry is code this process will run, so only the user's own, private cache is read. The directory
  is created 0700; a cache directory or entry that another user owns, or that group or others can write, turns
  the disk cache off for the process, with one warning naming the path and the fix.
An unreadable, unwritable or full cache is ignored, never an error.
"""
from __future__ import annotations
import hashlib
import logging
import os
import stat
import struct
import tempfile

FORMAT_VERSION = 2
MAGIC = b"TUOPCACHE"
_HEADER = struct.Struct(f"<{len(MAGIC)}sHQ32s")  # magic, format version, payload length, digest

log = logging.getLogger("torch_uop.cache")
_untrusted: set = set()        # directories found untrusted (warned once each); the cache stays off for them
_trusted_dirs: set = set()     # directories checked (or created) and found private
_damaged_reported = False


def cache_dir() -> str | None:
  """The cache directory, created private if missing; None when the cache is off or not to be trusted."""
  if os.environ.get("TORCH_UOP_CACHE", "1") == "0": return None
  d = os.environ.get("TORCH_UOP_CACHE_DIR")
  if not d:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    d = os.path.join(base, "torch_uop")
  if d in _untrusted: return None  # (also when one of its entries was found untrusted after the directory passed)
  if d in _trusted_dirs: return d
  try:
    os.makedirs(d, mode=0o700, exist_ok=True)
    st = os.stat(d)
  except OSError:
    return d  # unreadable or uncreatable: every load misses and every store is skipped
  if not _trusted(st, d, "directory"): return None
  _trusted_dirs.add(d)
  return d


def _trusted(st: os.stat_result, path: str, what: str) -> bool:
  problem = None
  if hasattr(os, "geteuid") and st.st_uid != os.geteuid(): problem = f"owned by uid {st.st_uid}, not by this user"
  elif st.st_mode & (stat.S_IWGRP | stat.S_IWOTH): problem = f"writable by {'group' if st.st_mode & stat.S_IWGRP else 'others'}"
  if problem is None: return True
  root = path if what == "directory" else os.path.dirname(os.path.dirname(path))
  if root not in _untrusted:
    _untrusted.add(root)
    log.warning("torch_uop: not using the disk cache at %s: the %s %s is %s, and its entries are code this process "
                "would run. Fix: `chmod -R go-w %s` (and chown it to this user), or point TORCH_UOP_CACHE_DIR at a "
                "directory of your own.", root, what, path, problem, root)
  return False


def key(*parts: str) -> str:
  h = hashlib.sha256(str(FORMAT_VERSION).encode())
  for p in parts: h.update(b"\0" + p.encode())
  return h.hexdigest()


def _digest(k: str, suffix: str, payload: bytes) -> bytes:
  return hashlib.sha256(f"{k}{suffix}\0".encode() + payload).digest()


def _path(d: str, k: str, suffix: str) -> str: return os.path.join(d, k[:2], k + suffix)


def load(k: str, suffix: str = ".o") -> bytes | None:
  """The payload stored under (k, suffix), or None: no entry, an unreadable one, one that fails its integrity
  check, or one this process must not trust."""
  d = cache_dir()
  if d is None: return None
  path = _path(d, k, suffix)
  try:
    with open(path, "rb") as f:
      if not _trusted(os.fstat(f.fileno()), path, "entry"): return None
      data = f.read()
  except OSError:
    return None
  payload = _unwrap(k, suffix, data)
  if payload is None: _report_damaged(path)
  return payload


def _unwrap(k: str, suffix: str, data: bytes) -> bytes | None:
  if len(data) < _HEADER.size: return None
  magic, version, length, digest = _HEADER.unpack_from(data)
  payload = data[_HEADER.size:]
  if magic != MAGIC or version != FORMAT_VERSION or length != len(payload) or digest != _digest(k, suffix, payload):
    return None
  return payload


def _report_damaged(path: str) -> None:
  global _damaged_reported
  if not _damaged_reported:
    _damaged_reported = True
    log.debug("torch_uop: ignoring the damaged or foreign cache entry %s (it is compiled again and replaced); "
              "further ones are ignored silently", path)


def store(k: str, data: bytes, suffix: str = ".o") -> None:
  d = cache_dir()
  if d is None: return
  sub = os.path.join(d, k[:2])
  tmp = None
  try:
    os.makedirs(sub, mode=0o700, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=sub, suffix=".tmp")  # mode 0600
    with os.fdopen(fd, "wb") as f:
      f.write(_HEADER.pack(MAGIC, FORMAT_VERSION, len(data), _digest(k, suffix, data)))
      f.write(data)
    os.replace(tmp, _path(d, k, suffix))
    tmp = None
  except OSError:
    pass  # a full or read-only disk: the entry is not stored
  finally:
    if tmp is not None:  # the write failed or was interrupted: no half-written file stays behind
      try: os.unlink(tmp)
      except OSError: pass


def load_tuning(k: str) -> str | None:
  data = load(k, ".tune.json")
  try:
    return None if data is None else data.decode()
  except UnicodeDecodeError:
    return None


def store_tuning(k: str, text: str) -> None: store(k, text.encode(), ".tune.json")
