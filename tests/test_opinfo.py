"""Every OpInfo entry of PyTorch's op_db, per dtype, through torch.compile(backend="uop") vs eager.

For each dtype, the first MAX_SAMPLES samples of every op that supports it run through
tests/opinfo/harness.py. A sample 'fail's when the compiled result differs from eager or raises
where eager does not; no fail is allowed beyond EXPECTED_FAILURES. The share of samples that ran
entirely as generated kernels ('native', no ATen fallback) must stay at or above NATIVE_FRACTION
(the coverage reached; raise it when coverage grows). `python -m tests.opinfo.harness` gives the
full report with more samples.
"""
from __future__ import annotations
import collections
import pytest
import torch
from tests.opinfo.harness import run_op

pytest.importorskip("expecttest")  # op_db imports it

MAX_SAMPLES = 1

# (op name, variant, dtype) -> why that sample cannot match eager. Keep this tiny.
EXPECTED_FAILURES: dict[tuple[str, str, str], str] = {}

# per dtype: the native share of non-eager-error samples reached (measured with MAX_SAMPLES above)
# (measured: float32 95.4%, float64 95.4%, float16 95.4%, bfloat16 95.4%, int32 95.4%, int64 95.2%, bool 95.3%)
NATIVE_FRACTION = {
  "float32": 0.95, "float64": 0.95, "float16": 0.95, "bfloat16": 0.95, "int32": 0.95, "int64": 0.95, "bool": 0.95,
}


@pytest.mark.parametrize("dtype", list(NATIVE_FRACTION))
def test_opinfo(dtype):
  from torch.testing._internal.common_methods_invocations import op_db
  dt = getattr(torch, dtype)
  counts = collections.Counter()
  fails, fallbacks = [], collections.Counter()
  for opinfo in op_db:
    for r in run_op(opinfo, dt, MAX_SAMPLES):
      counts[r.status] += 1
      if r.status == "fail" and (r.op, r.variant, dtype) not in EXPECTED_FAILURES:
        fails.append(f"{r.op}.{r.variant} #{r.index}: {r.detail[:200]}")
      if r.status == "fallback": fallbacks.update(r.fallbacks)
  torch._dynamo.reset()
  judged = counts["native"] + counts["fallback"] + counts["fail"]
  frac = counts["native"] / max(judged, 1)
  print(f"\n{dtype}: {dict(counts)} native {frac:.1%}; falling back: {fallbacks.most_common(15)}")
  assert not fails, f"{len(fails)} samples differ from eager:\n" + "\n".join(fails)
  assert frac >= NATIVE_FRACTION[dtype], f"native share {frac:.1%} < {NATIVE_FRACTION[dtype]:.0%}"
