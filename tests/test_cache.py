"""The disk cache: a second process compiling the same model takes whole graphs from the graph cache (no
AOTAutograd, lowering, codegen or LLVM); with the graph cache off, it still skips LLVM (kernel objects)."""
import itertools
import os
import subprocess
import sys
import textwrap
import pytest

SCRIPT = textwrap.dedent("""
  import torch, torch_uop
  torch.manual_seed(0)
  m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
  x = torch.randn(8, 16)
  out = torch.compile(m, backend="uop")(x)
  torch.testing.assert_close(out, m(x))
  m = torch_uop.metrics()
  print("HITS", m["cache_hits"], "KERNELS", m["kernels_compiled"], "GRAPHS", m["graph_cache_hits"])
""")


def _run(cache_dir, **env):
  full = {**os.environ, "TORCH_UOP_CACHE_DIR": str(cache_dir), **env}
  out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=full, timeout=300)
  assert out.returncode == 0, out.stderr[-2000:]
  line = [l for l in out.stdout.splitlines() if l.startswith("HITS")][0].split()
  return int(line[1]), int(line[3]), int(line[5])


def test_second_process_hits_the_graph_cache(tmp_path):
  hits, kernels, graphs = _run(tmp_path)
  assert hits == 0 and kernels > 0 and graphs == 0
  assert any(f.endswith(".graph") for _, _, files in os.walk(tmp_path) for f in files)
  hits, kernels2, graphs = _run(tmp_path)
  assert graphs == 1 and kernels2 == kernels, "the whole graph came from the cache, with the same kernels"


def test_second_process_hits_the_kernel_cache(tmp_path):
  hits, kernels, _ = _run(tmp_path, TORCH_UOP_GRAPH_CACHE="0")
  assert hits == 0 and kernels > 0
  assert any(f.endswith(".o") for _, _, files in os.walk(tmp_path) for f in files)
  hits, _, graphs = _run(tmp_path, TORCH_UOP_GRAPH_CACHE="0")
  assert hits >= 1 and graphs == 0


def test_cache_can_be_turned_off(tmp_path):
  _run(tmp_path, TORCH_UOP_CACHE="0")
  hits, _, graphs = _run(tmp_path, TORCH_UOP_CACHE="0")
  assert hits == 0 and graphs == 0
  assert not any(files for _, _, files in os.walk(tmp_path))


# ----- integrity and trust (runtime/cache.py) -----

DAMAGES = {
  "truncated": lambda data: data[:len(data) // 2],
  "bit_flipped": lambda data: data[:-7] + bytes([data[-7] ^ 0x10]) + data[-6:],
  "overwritten": lambda data: b"\x7fELF" + os.urandom(len(data)),
  "empty": lambda data: b"",
}


def _entries(root, suffix):
  return [os.path.join(d, f) for d, _, files in os.walk(root) for f in files if f.endswith(suffix)]


@pytest.mark.parametrize("damage", list(DAMAGES))
@pytest.mark.parametrize("suffix", [".o", ".graph"])
def test_a_damaged_entry_reads_as_a_miss(tmp_path, monkeypatch, suffix, damage):
  """Each kind of damage (what a crash mid-write or a full disk leaves) fails the entry's integrity check."""
  from torch_uop.runtime import cache
  monkeypatch.setenv("TORCH_UOP_CACHE_DIR", str(tmp_path))
  k = cache.key("a damaged entry", suffix)
  cache.store(k, os.urandom(4096), suffix)
  (path,) = _entries(tmp_path, suffix)
  with open(path, "rb") as f: data = f.read()
  with open(path, "wb") as f: f.write(DAMAGES[damage](data))
  assert cache.load(k, suffix) is None


@pytest.mark.parametrize("suffix, env", [(".graph", {}), (".o", {"TORCH_UOP_GRAPH_CACHE": "0"})])
def test_damaged_entries_are_compiled_again_and_replaced(tmp_path, suffix, env):
  """Every entry of a kind damaged at once (the kinds of damage in turn over the entries): the next process
  compiles them again, gives eager's answer (the script asserts it) and stores good entries in their place."""
  _run(tmp_path, **env)
  paths = sorted(_entries(tmp_path, suffix))
  assert paths, f"the first process stored no {suffix} entry"
  originals = {}
  for p, damage in zip(paths, itertools.cycle(DAMAGES.values())):
    with open(p, "rb") as f: originals[p] = f.read()
    with open(p, "wb") as f: f.write(damage(originals[p]))
  hits, kernels, graphs = _run(tmp_path, **env)
  if suffix == ".graph": assert graphs == 0
  if suffix == ".o": assert hits == 0
  for p in paths:  # compiled again and stored whole
    with open(p, "rb") as f: assert f.read() == originals[p] or suffix != ".o"
  _, _, graphs = _run(tmp_path, **env)
  if suffix == ".graph": assert graphs == 1, "the replaced entry is read again"


def test_an_entry_under_another_key_is_a_miss(tmp_path):
  """The digest covers the key: a valid entry copied over another one does not pass as it."""
  from torch_uop.runtime import cache
  os.environ["TORCH_UOP_CACHE_DIR"] = str(tmp_path)
  try:
    cache.store("ab" + "0" * 62, b"payload one")
    cache.store("ab" + "1" * 62, b"payload two")
    assert cache.load("ab" + "0" * 62) == b"payload one"
    a, b = (os.path.join(tmp_path, "ab", "ab" + c * 62 + ".o") for c in "01")
    os.replace(a, b)
    assert cache.load("ab" + "1" * 62) is None
    assert cache.load("ab" + "1" * 62, ".graph") is None
  finally:
    del os.environ["TORCH_UOP_CACHE_DIR"]


def test_a_failed_write_leaves_no_file(tmp_path, monkeypatch):
  """A full disk (ENOSPC) or an interrupt mid-write: no entry and no temp file stay behind; the full-disk case
  is silent, the interrupt reaches the caller."""
  import errno
  from torch_uop.runtime import cache
  monkeypatch.setenv("TORCH_UOP_CACHE_DIR", str(tmp_path))
  real_fdopen = os.fdopen

  class Failing:
    def __init__(self, exc): self.exc = exc
    def __call__(self, fd, mode):
      f = real_fdopen(fd, mode)
      f.write(b"partial")
      f.close()
      raise self.exc

  monkeypatch.setattr(cache.os, "fdopen", Failing(OSError(errno.ENOSPC, "No space left on device")))
  cache.store("cd" + "0" * 62, b"x" * 1000)
  monkeypatch.setattr(cache.os, "fdopen", Failing(KeyboardInterrupt()))
  with pytest.raises(KeyboardInterrupt): cache.store("cd" + "1" * 62, b"x" * 1000)
  assert [f for _, _, files in os.walk(tmp_path) for f in files] == []
  assert cache.load("cd" + "0" * 62) is None


def test_compiles_with_a_full_cache_disk(tmp_path, monkeypatch):
  """Every cache write failing with ENOSPC: compiling and running still give eager's answer."""
  import errno
  import torch
  from torch_uop.runtime import cache
  from helpers import check_against_eager
  monkeypatch.setenv("TORCH_UOP_CACHE_DIR", str(tmp_path))
  def full(*a, **k): raise OSError(errno.ENOSPC, "No space left on device")
  monkeypatch.setattr(cache.tempfile, "mkstemp", full)
  check_against_eager(lambda x: torch.relu(x @ x.T).sum(1), torch.randn(8, 8))
  assert [f for _, _, files in os.walk(tmp_path) for f in files] == []


@pytest.mark.parametrize("what", ["directory", "entry"])
def test_a_cache_others_can_write_is_not_used(tmp_path, what):
  """A cache directory or entry that group or others can write is not read: the process compiles everything,
  warns once naming the path and the fix, and still gives eager's answer."""
  _run(tmp_path)
  if what == "directory": os.chmod(tmp_path, 0o777)
  else:
    for p in _entries(tmp_path, ".graph"): os.chmod(p, 0o666)
  full = {**os.environ, "TORCH_UOP_CACHE_DIR": str(tmp_path)}
  out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=full, timeout=300)
  assert out.returncode == 0, out.stderr[-2000:]
  assert out.stderr.count("not using the disk cache") == 1, out.stderr[-2000:]
  assert str(tmp_path) in out.stderr and "chmod" in out.stderr
  line = [l for l in out.stdout.splitlines() if l.startswith("HITS")][0].split()
  assert line[5] == "0", "no graph came from the untrusted cache"
  assert line[1] == "0", "and no kernel object: the whole disk cache is off for the process"


def test_the_cache_directory_is_created_private(tmp_path):
  from torch_uop.runtime import cache
  d = tmp_path / "fresh" / "torch_uop"
  os.environ["TORCH_UOP_CACHE_DIR"] = str(d)
  try:
    cache.store("ef" + "0" * 62, b"data")
  finally:
    del os.environ["TORCH_UOP_CACHE_DIR"]
  assert os.stat(d).st_mode & 0o777 == 0o700
  assert os.stat(d / "ef").st_mode & 0o777 == 0o700
  assert os.stat(d / "ef" / ("ef" + "0" * 62 + ".o")).st_mode & 0o777 == 0o600


def _damage_all(root, suffix, damage="bit_flipped") -> int:
  paths = _entries(root, suffix)
  for p in paths:
    with open(p, "rb") as f: data = f.read()
    with open(p, "wb") as f: f.write(DAMAGES[damage](data))
  return len(paths)


def test_damaged_device_binaries_are_misses(tmp_path, monkeypatch):
  """OpenCL program binaries and NVRTC's PTX, damaged: compiled again from source, never handed to the driver."""
  import torch
  from conftest import opencl_missing, nvrtc_missing
  monkeypatch.setenv("TORCH_UOP_CACHE_DIR", str(tmp_path))
  checked = 0
  if opencl_missing() is None:
    from helpers import check_against_eager
    fn, x = (lambda x: torch.tanh(x) * 2 + 1), torch.randn(64)
    check_against_eager(fn, x, options={"device": "opencl", "graph_cache": False})
    assert _damage_all(tmp_path, ".clbin") >= 1
    check_against_eager(fn, x, options={"device": "opencl", "graph_cache": False})
    checked += 1
  if nvrtc_missing() is None:
    from torch_uop.runtime.cuda import compile_ptx
    source = 'extern "C" __global__ void k(float* a) { a[threadIdx.x] *= 2.0f; }'
    ptx = compile_ptx(source)
    assert _damage_all(tmp_path, ".ptx") == 1
    assert compile_ptx(source) == ptx
    checked += 1
  if not checked: pytest.skip(f"neither OpenCL ({opencl_missing()}) nor NVRTC ({nvrtc_missing()}) is available")
