"""Run PyTorch's OpInfo samples through torch.compile(backend="uop") and compare with eager.

`run_op(opinfo, dtype, max_samples)` yields one `SampleResult` per sample: 'native' (matched eager,
no node fell back), 'fallback' (matched eager, some node ran in ATen), 'eager_error' (eager itself
raises: the compiled call must raise too), or 'fail' (mismatch, or an exception eager did not raise).
Used by tests/test_opinfo.py and by `python -m tests.opinfo.harness` for the full report.
"""
from __future__ import annotations
import argparse
import collections
import contextlib
import json
import sys
import time
import warnings
from dataclasses import dataclass
import torch
import torch_uop

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64, torch.bool]


@dataclass
class SampleResult:
  op: str
  variant: str
  dtype: str
  index: int
  status: str
  detail: str = ""
  fallbacks: tuple = ()


# ops whose values eager leaves undefined (uninitialized memory) or draws at random: compare
# shape and dtype only (the statistics of the random ones are tested separately)
UNDEFINED_VALUES = ("empty", "empty_like", "new_empty", "empty_strided", "empty_permuted", "new_empty_strided")
RANDOM_MARKERS = ("rand", "normal", "uniform", "bernoulli", "dropout", "multinomial", "cauchy", "exponential",
                  "geometric", "log_normal", "poisson")


def _values_defined(name: str) -> bool:
  return name not in UNDEFINED_VALUES and not any(m in name for m in RANDOM_MARKERS)


def _same_meta(actual, expected):
  for a, e in zip(_to_tuple(actual), _to_tuple(expected)):
    if isinstance(e, torch.Tensor):
      assert isinstance(a, torch.Tensor) and a.shape == e.shape and a.dtype == e.dtype, f"{a} vs {e}"


def _tolerances(dtype):
  if dtype in (torch.float16, torch.bfloat16): return dict(rtol=1.6e-2, atol=1e-2) if dtype == torch.bfloat16 else dict(rtol=1e-3, atol=1e-3)
  return {}


def _to_tuple(x):
  return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def _upcast(x, dtype):
  if isinstance(x, torch.Tensor) and x.dtype == dtype: return x.to(torch.float64)
  if isinstance(x, (list, tuple)): return type(x)(_upcast(a, dtype) for a in x)
  if isinstance(x, dict): return {k: _upcast(v, dtype) for k, v in x.items()}
  return x


def _rmse(a, b) -> float:
  a, b = a.double(), b.double()
  finite = torch.isfinite(a) & torch.isfinite(b)
  return float(((a - b)[finite] ** 2).mean().sqrt()) if finite.any() else 0.0


def _as_accurate_as_eager(fn, sample, dtype, actual, expected) -> bool:
  """For float32 and half types: eager rounds intermediates (to half where torch_uop computes fused in
  float32) and sums in its own order, so the two can differ by a few ulps. Accept the result when it is
  no further from a float64 reference than eager is (the check inductor's tests use):
  rmse(actual, ref64) <= 2 * rmse(eager, ref64) + 1e-5, with the same non-finite values as eager (or,
  where eager overflowed, the reference's finite values)."""
  if dtype not in (torch.float32, torch.float16, torch.bfloat16): return False
  try:
    ref = fn(_upcast(sample.input, dtype), *_upcast(sample.args, dtype), **_upcast(sample.kwargs, dtype))
  except Exception: return False
  for a, e, r in zip(_to_tuple(actual), _to_tuple(expected), _to_tuple(ref)):
    if not isinstance(e, torch.Tensor) or not e.is_floating_point():
      try: torch.testing.assert_close(a, e, equal_nan=True, check_layout=False)
      except Exception: return False
      continue
    if not isinstance(a, torch.Tensor) or a.shape != e.shape or a.dtype != e.dtype: return False
    fa, fe, fr = torch.isfinite(a), torch.isfinite(e), torch.isfinite(r.to(a.dtype))
    if not ((fa == fe) | (fa == fr)).all(): return False
    # where eager overflowed in half (e.g. an intermediate exp) and torch_uop did not, match the reference
    over = fa & ~fe
    if over.any() and not torch.allclose(a[over].double(), r[over].double(), equal_nan=True, **_tolerances(dtype)): return False
    both = fa & fe
    if _rmse(a[both], r[both]) > 2 * _rmse(e[both], r[both]) + 1e-5: return False
  return True


def _seeded(opinfo) -> bool:
  """op_db wraps the random ops in `wrapper_set_seed(op, ...)`, which seeds torch inside the op."""
  return "wrapper_set_seed" in getattr(getattr(opinfo.op, "__code__", None), "co_names", ())


@contextlib.contextmanager
def _seed_outside_the_graph(seed: int = 42):
  """wrapper_set_seed calls torch.manual_seed, which Dynamo cannot trace (a graph break). For the compiled
  call, seed once outside and let the op's lambda (which looks the wrapper up as a module global at call
  time) call the op directly. Yields a list that receives one bool: whether the call drew from torch's
  default generator (then its values are random: torch_uop's stream is not eager's)."""
  from torch.testing._internal import common_methods_invocations as cmi
  original = cmi.wrapper_set_seed
  cmi.wrapper_set_seed = lambda op, *args, **kwargs: op(*args, **kwargs)
  torch.manual_seed(seed)
  before = torch.get_rng_state()
  drew: list = []
  try: yield drew
  finally:
    cmi.wrapper_set_seed = original
    drew.append(not torch.equal(before, torch.get_rng_state()))


def run_sample(opinfo, sample, dtype, index: int) -> SampleResult:
  name = opinfo.name
  variant = opinfo.variant_test_name
  op = opinfo.op

  def fn(inp, *args, **kwargs): return op(inp, *args, **kwargs)

  try:
    expected = fn(sample.input, *sample.args, **sample.kwargs)
    eager_error = None
  except Exception as e:  # eager rejects this sample: compiled must reject it too
    eager_error = e
  torch._dynamo.reset()
  torch._dynamo.utils.counters.clear()
  torch_uop.reset_metrics()
  compiled = torch.compile(fn, backend="uop")
  try:
    with warnings.catch_warnings(), _seed_outside_the_graph() as drew:
      warnings.simplefilter("ignore")
      actual = compiled(sample.input, *sample.args, **sample.kwargs)
  except Exception as e:
    if eager_error is not None: return SampleResult(name, variant, str(dtype), index, "eager_error", type(e).__name__)
    return SampleResult(name, variant, str(dtype), index, "fail", f"raised {type(e).__name__}: {str(e)[:300]}")
  if eager_error is not None:
    return SampleResult(name, variant, str(dtype), index, "fail", f"eager raised {type(eager_error).__name__}, compiled did not")
  m = torch_uop.metrics()
  # a seeded op whose compiled call drew random numbers (e.g. sdpa with dropout_p > 0): shape and dtype only
  values_defined = _values_defined(name) and not (_seeded(opinfo) and drew[0])
  try:
    if values_defined:
      torch.testing.assert_close(actual, expected, equal_nan=True, check_device=True, check_layout=False, **_tolerances(dtype))
    else: _same_meta(actual, expected)
  except Exception as e:
    if not (values_defined and _as_accurate_as_eager(fn, sample, dtype, actual, expected)):
      return SampleResult(name, variant, str(dtype), index, "fail", f"mismatch: {str(e)[:300]}", tuple(m["nodes_fallen_back"]))
  # a graph break (e.g. AOTAutograd cannot trace a data-dependent decomposition) runs that part in eager
  breaks = tuple(f"graph break: {k[:80]}" for k in torch._dynamo.utils.counters["graph_break"])
  native = m["fallback_nodes_total"] == 0 and m["graphs_fallen_back"] == 0 and not breaks
  return SampleResult(name, variant, str(dtype), index, "native" if native else "fallback", "", tuple(m["nodes_fallen_back"]) + breaks)


@contextlib.contextmanager
def _no_test_fn_lookup():
  """OpInfo's sample iterators look for the running unittest.TestCase with `inspect.stack()`, which reads the
  source of every frame on the stack: about half of this harness's time under pytest. Nothing here runs inside a
  TestCase, so the lookup always finds none; answer None at once while samples are made."""
  from torch.testing._internal import common_utils
  from torch.testing._internal.opinfo import core
  saved = {m: m.extract_test_fn for m in (common_utils, core) if hasattr(m, "extract_test_fn")}
  for m in saved: m.extract_test_fn = lambda: None
  try:
    yield
  finally:
    for m, fn in saved.items(): m.extract_test_fn = fn


def run_op(opinfo, dtype, max_samples: int | None = None):
  if dtype not in opinfo.supported_dtypes("cpu"): return
  try:
    with _no_test_fn_lookup():
      samples = opinfo.sample_inputs("cpu", dtype, requires_grad=False)
    for i, sample in enumerate(samples):
      if max_samples is not None and i >= max_samples: break
      yield run_sample(opinfo, sample, dtype, i)
  except Exception as e:  # sample generation itself failed: not torch_uop's business, report it
    yield SampleResult(opinfo.name, opinfo.variant_test_name, str(dtype), -1, "sample_error", f"{type(e).__name__}: {e}"[:200])


def main(argv=None):
  from torch.testing._internal.common_methods_invocations import op_db
  ap = argparse.ArgumentParser()
  ap.add_argument("--ops", nargs="*", help="op names to run (default all)")
  ap.add_argument("--dtypes", nargs="*", default=[str(d).split(".")[-1] for d in DTYPES])
  ap.add_argument("--max-samples", type=int, default=None)
  ap.add_argument("--json", default=None)
  args = ap.parse_args(argv)
  dtypes = [getattr(torch, d) for d in args.dtypes]
  results = []
  t0 = time.time()
  for opinfo in op_db:
    if args.ops and opinfo.name not in args.ops: continue
    for dt in dtypes:
      for r in run_op(opinfo, dt, args.max_samples):
        results.append(r)
        if r.status == "fail": print(f"FAIL {r.op}.{r.variant} {r.dtype} #{r.index}: {r.detail}", flush=True)
  by = collections.defaultdict(collections.Counter)
  for r in results: by[r.dtype][r.status] += 1
  for dt, c in by.items(): print(dt, dict(c))
  fell = collections.Counter(f for r in results if r.status == "fallback" for f in r.fallbacks)
  print("fallback ops:", fell.most_common())
  print(f"{len(results)} samples in {time.time() - t0:.0f}s")
  if args.json:
    with open(args.json, "w") as f: json.dump([r.__dict__ for r in results], f)


if __name__ == "__main__":
  sys.exit(main())
