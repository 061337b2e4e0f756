"""Smoke tests of benchmarks/bench_suite.py (--quick on one tiny entry, without Inductor) and bench_math.py. Checks the
JSON has every field and the outputs matched eager; no timing assertion (the machine is shared)."""
import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_suite_quick_copy(tmp_path):
  pytest.importorskip("matplotlib", reason="the benchmark chart needs matplotlib: pip install torch_uop[bench]")
  out = tmp_path / "suite.json"
  p = subprocess.run([sys.executable, os.path.join(REPO, "benchmarks", "bench_suite.py"), "--quick", "--only", "copy",
                      "--no-inductor", "--threads", "1", "--out", str(out)], cwd=REPO, capture_output=True, text=True, timeout=120)
  assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
  d = json.loads(out.read_text())
  assert (tmp_path / "suite.png").stat().st_size > 0
  for key in ("machine", "entries", "rows", "geomean_speedup", "total_s"): assert key in d
  rows = {r["backend"]: r for r in d["rows"]}
  assert set(rows) == {"eager", "uop"}
  for r in rows.values():
    for key in ("ms", "peak_mb", "gb_s", "round_medians_ms"): assert key in r, (r["backend"], key)
  u = rows["uop"]
  assert u["match"] is True and u["speedup"] > 0
  assert u["cold_compile_s"] is not None and u["warm_compile_s"] is not None
  warm = u["compile"]["warm"]["uop"]
  assert warm["graph_cache_hits"] >= 1  # the second process found the first one's graph on disk
  assert u["warm_backend_s"] is not None


def test_math_bench_small(tmp_path):
  """bench_math.py on two small cases, two interleave settings: every torch_uop result matched eager."""
  out = tmp_path / "math.json"
  p = subprocess.run([sys.executable, os.path.join(REPO, "benchmarks", "bench_math.py"), "--only", "tanh,softmax",
                      "--n", "8192", "--threads", "1", "--interleave", "0,2", "--out", str(out)],
                     cwd=REPO, capture_output=True, text=True, timeout=180)
  assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
  d = json.loads(out.read_text())
  assert set(d["cases"]) == {"tanh", "softmax"} and d["copy_GBps"] > 0
  for case in d["cases"].values():
    assert set(case) == {"eager", "uop_i0", "uop_i2"}
    for r in case.values(): assert r["matches_eager"] is True and r["ms"] > 0
