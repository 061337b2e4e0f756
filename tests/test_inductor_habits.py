"""What users bring from Inductor: `mode=`, kernels in torch.profiler traces, logging, progress, reset, freezing.

Every compiled result is compared with eager PyTorch."""
import json
import logging
import os
import re
import subprocess
import sys

import pytest
import torch
import torch._dynamo
import torch.nn.functional as F

import torch_uop
import torch_uop.debug
from torch_uop import progress
from torch_uop.config import Config, MODES, MAX_AUTOTUNE_BEAM
from torch_uop.runtime import executor


@pytest.fixture
def records():
  """The log records of the torch_uop loggers while the test runs (at whatever levels the test sets)."""
  got = []

  class Keep(logging.Handler):
    def emit(self, record): got.append(record)

  handler, logger = Keep(logging.DEBUG), logging.getLogger("torch_uop")
  logger.addHandler(handler)
  yield got
  logger.removeHandler(handler)


@pytest.fixture
def at_info():
  """The torch_uop logger at INFO for the test."""
  logger = logging.getLogger("torch_uop")
  old = logger.level
  logger.setLevel(logging.INFO)
  yield
  logger.setLevel(old)


@pytest.fixture(autouse=True)
def _fresh():
  torch._dynamo.reset()
  torch_uop.reset_metrics()
  yield
  torch._dynamo.reset()


def _conv_bn_model():
  torch.manual_seed(0)
  m = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                          torch.nn.Conv2d(8, 8, 3, bias=False), torch.nn.BatchNorm2d(8), torch.nn.Flatten(),
                          torch.nn.Linear(8 * 6 * 6, 5))
  with torch.no_grad():  # BatchNorm statistics that are not the identity, so a wrong fold shows
    for bn in (m[1], m[4]):
      bn.running_mean.normal_()
      bn.running_var.uniform_(0.5, 2.0)
      bn.weight.normal_()
      bn.bias.normal_()
  return m.eval()


# ----- modes -----

@pytest.mark.parametrize("mode", sorted(MODES))
def test_every_mode_compiles_and_matches_eager(mode):
  m = _conv_bn_model()
  x = torch.randn(2, 3, 8, 8)
  f = torch.compile(m, backend="uop", mode=mode)
  with torch.no_grad():
    torch.testing.assert_close(f(x), m(x))
    torch.testing.assert_close(f(x), m(x))
  assert torch_uop.metrics()["kernels_compiled"] > 0


@pytest.mark.parametrize("mode", ["max-autotune", "max-autotune-no-cudagraphs"])
def test_max_autotune_searches(monkeypatch, mode):
  monkeypatch.setenv("TORCH_UOP_GRAPH_CACHE", "0")  # a cached graph would skip the search
  fn = lambda a, b: (a @ b).relu()
  a, b = torch.randn(128, 128), torch.randn(128, 128)
  torch.testing.assert_close(torch.compile(fn, backend="uop", mode=mode)(a, b), fn(a, b))
  m = torch_uop.metrics()
  assert m["kernels_searched"] + m["search_cache_hits"] > 0, m


def test_mode_presets_and_options_over_them():
  assert Config.from_options(None, "max-autotune").beam == MAX_AUTOTUNE_BEAM
  assert Config.from_options(None, "max-autotune-no-cudagraphs").beam == MAX_AUTOTUNE_BEAM
  assert Config.from_options(None, "reduce-overhead").keep_arena
  assert Config.from_options({"beam": 2}, "max-autotune").beam == 2  # called directly: options win over the mode
  with pytest.raises(ValueError, match="unknown mode 'fastest'"):
    Config.from_options(None, "fastest")


def test_mode_and_options_together_fail_as_for_inductor():
  with pytest.raises(RuntimeError, match="Either mode or options"):
    torch.compile(lambda x: x + 1, backend="uop", mode="max-autotune", options={"beam": 2})


def test_reduce_overhead_keeps_a_big_arena(monkeypatch):
  monkeypatch.setattr(executor, "ARENA_KEEP_BYTES", 0)  # every arena counts as big
  fn = lambda x: (x.exp() @ x).relu() @ x  # intermediates only kernels touch: an arena
  x = torch.randn(64, 64) / 8
  for mode, kept in (("default", False), ("reduce-overhead", True)):
    torch._dynamo.reset()
    with torch_uop.debug.capture() as graphs:
      f = torch.compile(fn, backend="uop", mode=mode, dynamic=False)
      torch.testing.assert_close(f(x), fn(x))
      torch.testing.assert_close(f(x), fn(x))
    g = next(g for g in graphs if g.arena_bytes > 0)
    assert (g.arena is not None) is kept, mode


# ----- profiler -----

def test_kernels_and_fallbacks_are_named_in_profiler_traces(tmp_path):
  lib = torch.library.Library("uop_habits", "FRAGMENT")  # an op torch_uop has no lowering for: a fallback step
  lib.define("twice(Tensor x) -> Tensor")
  lib.impl("twice", lambda x: x * 2, "CPU")
  lib.impl("twice", lambda x: torch.empty_like(x), "Meta")

  def fn(x, w):
    return torch.softmax(torch.ops.uop_habits.twice(x @ w) * 0.125, dim=-1)

  x, w = torch.randn(16, 32), torch.randn(32, 24)
  with torch_uop.debug.capture() as graphs:
    f = torch.compile(fn, backend="uop")
    torch.testing.assert_close(f(x, w), fn(x, w))
  with torch.profiler.profile() as prof:
    out = f(x, w)
  torch.testing.assert_close(out, fn(x, w))
  trace = tmp_path / "trace.json"
  prof.export_chrome_trace(str(trace))
  names = [e["name"] for e in json.loads(trace.read_text())["traceEvents"] if str(e.get("name", "")).startswith("uop:")]
  kernels = [n for n in names if re.fullmatch(r"uop:inference1:k\d+ \S+\[[0-9x]+\]", n)]
  assert len(kernels) >= 2, names
  assert any("mm" in n for n in kernels) and any(n.endswith("[16x24]") for n in kernels), kernels
  assert "uop:inference1:fallback twice.default" in names, names
  # outside a profiler, calls take the generated call path, which records nothing
  torch.testing.assert_close(f(x, w), fn(x, w))
  assert graphs[0].call_source is not None and "record" not in graphs[0].call_source


# ----- logging -----

def test_a_fallback_warns_once_per_process(records):
  lib = torch.library.Library("uop_habits_log", "FRAGMENT")
  lib.define("plus_one(Tensor x) -> Tensor")
  lib.impl("plus_one", lambda x: x + 1, "CPU")
  lib.impl("plus_one", lambda x: torch.empty_like(x), "Meta")
  fn = lambda x: torch.ops.uop_habits_log.plus_one(x.sin()).cos()
  x = torch.randn(8)
  torch.testing.assert_close(torch.compile(fn, backend="uop")(x), fn(x))
  torch._dynamo.reset()
  torch.testing.assert_close(torch.compile(fn, backend="uop")(x), fn(x))
  mine = [r for r in records if r.name == "torch_uop.fallback" and "plus_one" in r.getMessage()]
  assert len(mine) == 1, [r.getMessage() for r in records]
  assert mine[0].levelno == logging.WARNING and "no lowering registered" in mine[0].getMessage()


_SCRIPT = ("import torch, torch_uop\n"
           "f = torch.compile(lambda x: (x * 2).relu(), backend='uop')\n"
           "x = torch.randn(8)\n"
           "torch.testing.assert_close(f(x), (x * 2).relu())\n")


@pytest.mark.parametrize("env,shows,hides", [
  ({"TORCH_UOP_DEBUG": "1"}, ["[torch_uop] compiled inference graph inference1"], ["inference1_k0: out"]),
  ({"TORCH_UOP_DEBUG": "2"}, ["compiled inference graph", "inference1_k0: out (8,) float32"], []),
  ({"TORCH_LOGS": "+torch_uop"}, ["compiled inference graph", "inference1_k0: out (8,) float32"], []),
  ({}, [], ["compiled inference graph"]),
])
def test_debug_levels_and_torch_logs_reach_the_logger(env, shows, hides):
  env = {**{k: v for k, v in os.environ.items() if k not in ("TORCH_UOP_DEBUG", "TORCH_LOGS")}, **env,
         "TORCH_UOP_GRAPH_CACHE": "0"}  # (a graph from the graph cache is logged as such)
  r = subprocess.run([sys.executable, "-c", _SCRIPT], env=env, capture_output=True, text=True, timeout=180)
  assert r.returncode == 0, r.stderr[-2000:]
  for s in shows: assert s in r.stderr, r.stderr[-2000:]
  for s in hides: assert s not in r.stderr, r.stderr[-2000:]


@pytest.mark.parametrize("after,shows,hides", [
  ("schedule,steps", ["inference1 after schedule:", "mul+relu[8]", "inference1 after steps:", "step 0: kernel inference1_k0"],
   ["after codegen:", "define void"]),
  ("codegen", ["inference1 after codegen:", "define void @inference1_k0("], ["after schedule:"]),
  ("all", [f"inference1 after {name}:" for name in ("outputs", "schedule", "search", "codegen", "compile", "steps")], []),
])
def test_debug_after_logs_what_a_named_pass_made(after, shows, hides):
  """TORCH_UOP_DEBUG_AFTER names pipeline passes (torch_uop/pipeline.py PASSES); what each made is logged, in pass
  order, and the graph still matches eager."""
  env = {**{k: v for k, v in os.environ.items() if k not in ("TORCH_UOP_DEBUG", "TORCH_LOGS")}, "TORCH_UOP_DEBUG_AFTER": after}
  r = subprocess.run([sys.executable, "-c", _SCRIPT], env=env, capture_output=True, text=True, timeout=180)
  assert r.returncode == 0, r.stderr[-2000:]
  for s in shows: assert s in r.stderr, r.stderr[-3000:]
  for s in hides: assert s not in r.stderr, r.stderr[-3000:]
  at = [r.stderr.index(s) for s in shows if " after " in s]
  assert at == sorted(at)


def test_pipeline_lists_its_passes_and_refuses_unknown_ones():
  """`python -m torch_uop.debug pipeline` prints the passes in the order they run; an unknown pass name in
  debug_after is an error that lists them, not a silent no-op."""
  from torch_uop.pipeline import PASS_NAMES
  r = subprocess.run([sys.executable, "-m", "torch_uop.debug", "pipeline"], capture_output=True, text=True, timeout=120)
  assert r.returncode == 0, r.stderr[-2000:]
  lines = [line.split()[1] for line in r.stdout.splitlines() if re.match(r"\d+\. ", line)]
  assert tuple(lines) == PASS_NAMES and "schedule" in lines and "codegen" in lines
  with pytest.raises(ValueError, match="passes: outputs, schedule"):
    Config.from_options({"debug_after": "schedule,fusion"})


def test_set_logs_routes_torch_uop_messages(records, monkeypatch):
  monkeypatch.setenv("TORCH_UOP_GRAPH_CACHE", "0")
  torch._logging.set_logs(modules={"torch_uop": logging.INFO})
  try:
    f = torch.compile(lambda x: x.exp() + 1, backend="uop")
    x = torch.randn(4)
    torch.testing.assert_close(f(x), x.exp() + 1)
  finally:
    torch._logging.set_logs()
  assert any(r.name == "torch_uop.compile" and "compiled inference graph" in r.getMessage() for r in records)


# ----- progress -----

class _Terminal:
  def __init__(self, tty: bool): self.tty, self.text = tty, []
  def isatty(self): return self.tty
  def write(self, s): self.text.append(s)
  def flush(self): pass


@pytest.mark.parametrize("tty", [True, False])
def test_progress_shows_on_a_terminal_only(monkeypatch, records, at_info, tty):
  term = _Terminal(tty)
  monkeypatch.setattr(sys, "stderr", term)
  monkeypatch.setattr(progress, "DELAY_S", 0.0)
  monkeypatch.delenv("TORCH_UOP_PROGRESS", raising=False)
  with progress.steps("graph1: BEAM search", 3) as done:
    for _ in range(3): done.update()
  drawn = "".join(term.text)
  assert ("torch_uop graph1: BEAM search" in drawn) is tty, drawn
  assert any("3 of 3 done" in r.getMessage() for r in records)


def test_beam_search_reports_progress(monkeypatch, records, at_info):
  monkeypatch.setattr(progress, "DELAY_S", 0.0)
  fn = lambda a, b: (a @ b).relu()
  a, b = torch.randn(32, 32), torch.randn(32, 32)
  f = torch.compile(fn, backend="uop", options={"beam": 2, "graph_cache": False})
  torch.testing.assert_close(f(a, b), fn(a, b))
  assert any("BEAM search" in r.getMessage() for r in records), [r.getMessage() for r in records]


# ----- reset -----

@pytest.mark.parametrize("reset", [torch._dynamo.reset, torch.compiler.reset])
def test_dynamo_reset_drops_torch_uop_memo_tables(reset, monkeypatch):
  monkeypatch.setenv("TORCH_UOP_GRAPH_CACHE", "0")  # the memo tables fill while a graph compiles
  from torch_uop.core import symbolic
  from torch_uop.core.shapetracker import View
  f = torch.compile(lambda x: x.t().contiguous()[1:, ::2] * 2, backend="uop")
  x = torch.randn(6, 8)
  torch.testing.assert_close(f(x), x.t().contiguous()[1:, ::2] * 2)
  assert symbolic._memo and View.contiguous.cache_info().currsize > 0
  reset()
  assert not symbolic._memo and View.contiguous.cache_info().currsize == 0
  torch.testing.assert_close(f(x), x.t().contiguous()[1:, ::2] * 2)  # compiles again, same answer


# ----- freezing -----

def _frozen(model):
  return torch.compile(model, backend="uop", options={"freezing": True})


def test_freezing_folds_batchnorm_into_the_convolution():
  m = _conv_bn_model()
  x = torch.randn(2, 3, 8, 8)
  with torch.no_grad():
    ref = m(x)
    torch.testing.assert_close(torch.compile(m, backend="uop")(x), ref)
    plain = torch_uop.metrics()["nodes_lowered"]
    torch._dynamo.reset()
    torch_uop.reset_metrics()
    with torch_uop.debug.capture() as graphs:
      out = _frozen(m)(x)
  torch.testing.assert_close(out, ref)
  frozen = torch_uop.metrics()["nodes_lowered"]
  assert frozen < plain / 2, (frozen, plain)  # BatchNorm's sub/mul/mul/add and the statistics' math are gone
  names = [n for g in graphs for n in g.step_names]
  assert not any("sub" in n or "sqrt" in n for n in names), names


@pytest.mark.parametrize("change", ["in_place", "new_parameter", "data"])
def test_a_frozen_graph_never_uses_stale_weights(change):
  m = _conv_bn_model()
  x = torch.randn(2, 3, 8, 8)
  f = _frozen(m)
  with torch.no_grad():
    torch.testing.assert_close(f(x), m(x))
    if change == "in_place":
      m[0].weight.mul_(-0.5)
      m[1].running_var.add_(1.0)
    elif change == "new_parameter":
      m[6].weight = torch.nn.Parameter(torch.randn_like(m[6].weight))
    else:
      m[3].weight.data = torch.randn_like(m[3].weight)
    torch.testing.assert_close(f(x), m(x))
    torch.testing.assert_close(f(x), m(x))
  assert torch_uop.metrics()["frozen_refolds"] == 1


def test_freezing_lays_weights_out_once_and_again_after_a_change():
  torch.manual_seed(0)
  m = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 10)).eval()
  x = torch.randn(32, 64)
  with torch_uop.debug.capture() as graphs, torch.no_grad():
    f = _frozen(m)
    torch.testing.assert_close(f(x), m(x))
    torch.testing.assert_close(f(x), m(x))
    g = graphs[0]
    assert g.prologue, g.step_names  # a kernel that reads only weights (a transposed copy) runs once
    m[0].weight.add_(1.0)
    torch.testing.assert_close(f(x), m(x))
    torch.testing.assert_close(f(x), m(x))


def test_freezing_leaves_training_and_mutated_buffers_alone():
  m = _conv_bn_model().train()
  ref = _conv_bn_model().train()
  x = torch.randn(2, 3, 8, 8)
  f = _frozen(m)
  out = f(x)  # grad enabled: forward and backward graphs, not frozen
  expect = ref(x)
  torch.testing.assert_close(out, expect)
  out.sum().backward()
  expect.sum().backward()
  torch.testing.assert_close(m[0].weight.grad, ref[0].weight.grad)
  torch._dynamo.reset()
  with torch.no_grad():  # inference graph, but BatchNorm in training mode updates its running statistics
    torch.testing.assert_close(f(x), ref(x))
  torch.testing.assert_close(m[1].running_mean, ref[1].running_mean)
  torch.testing.assert_close(m[4].running_var, ref[4].running_var)


def test_freezing_a_model_that_returns_a_weight():
  class M(torch.nn.Module):
    def __init__(self):
      super().__init__()
      self.lin = torch.nn.Linear(4, 3)

    def forward(self, x):
      tripled = self.lin.weight * 3  # returned only as a view: folding it would hand out a view of a constant
      return self.lin(x), self.lin.weight * 2, self.lin.bias, x @ tripled.t(), tripled.t()

  m = M().eval()
  x = torch.randn(5, 4)
  with torch.no_grad():
    f = _frozen(m)
    for got, want in zip(f(x), m(x)): torch.testing.assert_close(got, want)
    got = f(x)
    got[1].zero_()  # a caller changing what it was handed must not change later results
    got[4].mul_(3)  # (a view of a folded value, too)
    for got, want in zip(f(x), m(x)): torch.testing.assert_close(got, want)


def test_inductors_freezing_flag_turns_freezing_on():
  import torch._inductor.config as inductor_config
  m = _conv_bn_model()
  x = torch.randn(2, 3, 8, 8)
  with torch.no_grad(), inductor_config.patch(freezing=False):
    torch.testing.assert_close(torch.compile(m, backend="uop")(x), m(x))
    plain = torch_uop.metrics()["nodes_lowered"]
  torch._dynamo.reset()
  torch_uop.reset_metrics()
  with torch.no_grad(), inductor_config.patch(freezing=True):  # Dynamo then passes the weights as graph attributes
    f = torch.compile(m, backend="uop")
    torch.testing.assert_close(f(x), m(x))
    assert torch_uop.metrics()["nodes_lowered"] < plain / 2
    m[1].running_mean.add_(0.5)
    torch.testing.assert_close(f(x), m(x))
  assert torch_uop.metrics()["frozen_refolds"] == 1


def test_freezing_with_dynamic_shapes_compiles_unfrozen_and_right():
  m = _conv_bn_model()
  f = torch.compile(m, backend="uop", dynamic=True, options={"freezing": True})
  with torch.no_grad():
    for n in (2, 3, 5):
      x = torch.randn(n, 3, 8, 8)
      torch.testing.assert_close(f(x), m(x))
    m[0].weight.mul_(2.0)  # not frozen: the new weight is read at the next call
    torch.testing.assert_close(f(x), m(x))


def _saved_activation_bytes(model, x, compiled) -> tuple[int, dict, torch.Tensor]:
  """Bytes the forward saves for the backward (parameters left out), the parameter gradients, the output."""
  params = {p.data_ptr() for p in model.parameters()}
  saved = []

  def pack(t):
    if t.data_ptr() not in params: saved.append(t.nbytes)
    return t

  for p in model.parameters(): p.grad = None
  with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
    out = compiled(x)
  out.pow(2).mean().backward()
  return sum(saved), {n: p.grad.clone() for n, p in model.named_parameters()}, out.detach()


RECOMPUTED = {  # a normalization and an activation between two layers (a transformer's MLP, a UNet's block)
  "layer_norm_gelu": (lambda: torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.LayerNorm(256), torch.nn.GELU(),
                                                  torch.nn.Linear(256, 64)), (32, 64)),
  "group_norm_silu": (lambda: torch.nn.Sequential(torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.GroupNorm(4, 16),
                                                  torch.nn.SiLU(), torch.nn.Conv2d(16, 8, 3, padding=1)), (2, 8, 16, 16)),
}


@pytest.mark.parametrize("case", list(RECOMPUTED))
def test_recompute_saves_less_than_eager_and_matches_it(case):
  """With `recompute` (the default) the forward saves one hidden activation fewer than eager (the normalization's
  output; the backward recomputes it and the activation from the layer's output), as Inductor's partitioner does,
  with eager's gradients. With recompute off, AOTAutograd's default partition saves what eager saves."""
  torch.manual_seed(0)
  build, shape = RECOMPUTED[case]
  model, x = build(), torch.randn(*shape)
  eager_bytes, eager_grads, eager_out = _saved_activation_bytes(model, x, model)
  saved = {}
  for recompute in (True, False):
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="uop", options={"recompute": recompute, "graph_cache": False})
    saved[recompute], grads, out = _saved_activation_bytes(model, x, compiled)
    torch.testing.assert_close(out, eager_out, rtol=1e-4, atol=1e-5)
    for n, g in grads.items(): torch.testing.assert_close(g, eager_grads[n], rtol=1e-4, atol=1e-4)
  hidden = 32 * 256 * 4  # one hidden activation: (32, 256) or (2, 16, 16, 16) floats
  assert saved[True] <= eager_bytes - hidden, (saved, eager_bytes)
  assert saved[False] == eager_bytes, (saved, eager_bytes)


def test_recompute_option_and_environment(monkeypatch):
  assert Config.from_options().recompute
  monkeypatch.setenv("TORCH_UOP_RECOMPUTE", "0")
  assert not Config.from_options().recompute
  assert Config.from_options({"recompute": True}).recompute


def test_no_garbage_collection_while_compiling(monkeypatch):
  """While torch_uop compiles a graph (inside the AOT trace, forward and backward alike) the cyclic collector does not
  run on its own and the heap from before is frozen (dynamo_backend._no_collections_while_compiling); after, it runs
  again with nothing left frozen, and a user who had turned it off finds it off. Results match eager."""
  import gc
  import types
  from torch_uop import dynamo_backend
  from torch_uop.lowering import graph as lowering_graph
  # gc.get_freeze_count() counts the frozen heap object by object: only the outermost compile may ask it
  counted = []
  proxy = types.SimpleNamespace(**{n: getattr(gc, n) for n in dir(gc) if not n.startswith("_")})
  proxy.get_freeze_count = lambda: counted.append(1) or gc.get_freeze_count()
  monkeypatch.setattr(dynamo_backend, "gc", proxy)
  seen = []
  lower = lowering_graph.lower_graph
  monkeypatch.setattr(lowering_graph, "lower_graph", lambda *a, **k: seen.append((gc.isenabled(), gc.get_freeze_count() > 0)) or lower(*a, **k))
  torch.manual_seed(0)
  model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
  x = torch.randn(5, 8)
  for user_disabled in (False, True):
    torch._dynamo.reset()
    seen.clear()
    counted.clear()
    if user_disabled: gc.disable()
    try:
      out = torch.compile(model, backend="uop", options={"graph_cache": False})(x)
      out.sum().backward()
      grads = [p.grad.clone() for p in model.parameters()]
      enabled_after = gc.isenabled()
    finally: gc.enable()
    model.zero_grad()
    model(x).sum().backward()
    for g, p in zip(grads, model.parameters()): torch.testing.assert_close(g, p.grad, rtol=1e-5, atol=1e-5)
    model.zero_grad()
    assert len(seen) == 2  # the forward graph and the backward graph
    # the AOT trace (the forward's graph compiled inside it) and the backward's compile; none where the user turned
    # collections off
    assert len(counted) == (0 if user_disabled else 2)
    assert all(not enabled for enabled, _ in seen)
    assert all(frozen for _, frozen in seen) == (not user_disabled)  # (left alone where the user turned it off)
    assert enabled_after == (not user_disabled) and gc.get_freeze_count() == 0


def test_lowering_scope_is_per_thread_and_restored():
  """The graph being lowered (its device, vector registers, symbolic sizes) is a GraphScope held per thread while
  lower_graph runs: another thread meanwhile sees the default (the CPU), a nested scope is undone when it ends, and
  a `device=` argument is judged against the scope's device."""
  import threading
  from torch_uop.lowering.registry import on_graph_device
  from torch_uop.lowering.scope import GraphScope, graph_scope, lowering_scope
  seen = {}
  with lowering_scope(GraphScope(torch.device("cuda", 1), vectors="registers")):
    worker = threading.Thread(target=lambda: seen.update(other=graph_scope()))
    worker.start(); worker.join()
    seen["gpu"] = (on_graph_device("cuda:1"), on_graph_device("cuda"), on_graph_device("cuda:0"), on_graph_device("cpu"))
    with lowering_scope(GraphScope()): seen["inner"] = on_graph_device("cpu")
    seen["after"] = graph_scope()
  assert seen["other"] == GraphScope() and seen["other"].device.type == "cpu"
  assert seen["gpu"] == (True, True, False, False) and seen["inner"]
  assert seen["after"].vectors == "registers" and graph_scope() == GraphScope()


def test_kernel_ir_spec_admits_real_kernels_and_rejects_broken_ones(monkeypatch):
  """With the `spec` option every kernel's AST and program is checked against core/spec.py after codegen: the
  kernels of a padded convolution block, a softmax, a GEMM with a bias and an integer scatter all pass and still
  match eager; a node that breaks the spec (a select on a float condition, a load whose gate is not a bool, a
  RANGE whose arg is not a RangeArg) raises SpecError naming the pass."""
  from torch_uop.core.spec import SpecError, check_kernel
  from torch_uop.core.uop import UOp, Ops, RangeArg, AxisKind
  from torch_uop.core.dtypes import dtypes
  torch.manual_seed(0)
  cases = [
    (lambda x, w: F.silu(F.conv2d(x, w, padding=1, groups=4)) * 2, (torch.randn(1, 8, 9, 11), torch.randn(8, 2, 3, 3))),
    (lambda x: torch.softmax(x * 0.125, -1), (torch.randn(6, 50),)),
    (lambda a, w, b: F.gelu(F.linear(a, w, b)), (torch.randn(5, 40), torch.randn(24, 40), torch.randn(24))),
    (lambda i, v: torch.zeros(10, dtype=torch.int64).scatter_add(0, i, v), (torch.randint(0, 10, (30,)), torch.arange(30))),
  ]
  for fn, args in cases:
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="uop", options={"spec": True, "graph_cache": False})
    torch.testing.assert_close(compiled(*args), fn(*args))
  i = UOp(Ops.RANGE, dtypes.index, (UOp.const(dtypes.index, 4),), RangeArg(0, AxisKind.GLOBAL))
  buf = UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), 0)
  x = UOp(Ops.LOAD, dtypes.float32, (buf, i))
  broken = [
    UOp(Ops.WHERE, dtypes.float32, (x, x, x)),
    UOp(Ops.LOAD, dtypes.float32, (buf, i, x)),
    UOp(Ops.RANGE, dtypes.index, (UOp.const(dtypes.index, 4),), (0, "global")),
  ]
  for bad in broken:
    ast = UOp(Ops.SINK, dtypes.void, (UOp(Ops.STORE, dtypes.void, (buf, i, bad if bad.dtype == dtypes.float32 else x + bad.cast(dtypes.float32))),))
    with pytest.raises(SpecError, match=f"after pass codegen: {bad.op.name}"): check_kernel(ast, [], "codegen")
  check_kernel(UOp(Ops.SINK, dtypes.void, (UOp(Ops.STORE, dtypes.void, (buf, i, x * 2.0)),)), [], "codegen")
