"""Robustness: whatever the input, a function compiled with backend="uop" gives eager's answer.

- ops with no lowering run as counted ATen fallback steps between kernels (also multi-result ops,
  backward graphs, and dtypes the IR lacks, which fall back whole);
- dynamic=False recompiles natively per size (dynamic shapes: tests/test_dynamic_shapes.py);
- non-contiguous, strided, offset, overlapping and expanded inputs, and strides that change between calls;
- bad input (wrong shapes, wrong layout handed straight to a compiled graph) raises what eager raises;
- NaN and Inf propagate like eager's;
- options are validated; TORCH_UOP_DEBUG=2 prints the kernel list.
"""
import os
import subprocess
import sys
import pytest
import torch
import torch_uop
import torch_uop.debug
from helpers import check_against_eager, check_grads_against_eager


# ------------------------------------------------------------------ fallback

def test_op_without_lowering_falls_back_and_is_counted():
  # linalg.det decomposes to _linalg_det, lowered natively only up to 16x16 (lapack.MAX_N): a 20x20
  # determinant runs in ATen between two kernels
  fn = lambda x: torch.linalg.det(x * 2 + 1) * 3
  m = check_against_eager(fn, torch.randn(3, 20, 20), expect_native=False)
  assert m["nodes_fallen_back"] == {"_linalg_det.default": 1}
  assert m["graphs_fallen_back"] == 0
  assert m["kernels_compiled"] == 2, "the elementwise work before and after the fallback still compiles"
  assert m["fallback_steps_run"] == 1


@pytest.mark.parametrize("which", ["values", "indices", "both"])
def test_multi_result_fallback_any_result_used(which):
  # _linalg_slogdet of a matrix above the native size limit returns (sign, logabsdet, LU, pivots) from
  # ATen: each result used must land in its own buffer
  def fn(x):
    s = torch.linalg.slogdet(x * 2 + 3 * torch.eye(20))
    return {"values": s.sign + 1, "indices": s.logabsdet * 2, "both": s.sign * s.logabsdet}[which]
  m = check_against_eager(fn, torch.randn(5, 20, 20), expect_native=False)
  assert m["nodes_fallen_back"] == {"_linalg_slogdet.default": 1}


def test_fallback_result_feeds_a_fused_reduction():
  fn = lambda x: torch.linalg.det(x.exp()).reshape(5, 1).expand(5, 7).softmax(-1).sum(0)
  m = check_against_eager(fn, torch.randn(5, 20, 20) * 0.1, expect_native=False)
  assert m["nodes_fallen_back"] == {"_linalg_det.default": 1}


def test_fallback_in_a_training_graph():
  fn = lambda x: torch.linalg.det(0.1 * x.sin() + torch.eye(20)).pow(2)  # well conditioned: det amplifies rounding
  m = check_grads_against_eager(fn, torch.randn(4, 20, 20, requires_grad=True), expect_native=False)
  assert m["nodes_fallen_back"]["_linalg_det.default"] == 1
  assert m["graphs_compiled"] == 2 and m["graphs_fallen_back"] == 0


def test_as_strided_with_absolute_offset_follows_the_input_storage_offset():
  # Dynamo does not recompile for another storage offset of an input view; the compiled graph must notice
  base = torch.arange(20.)
  fn = lambda x: torch.as_strided(x, (2,), (2,), 1) * 1
  compiled = torch.compile(fn, backend="uop")
  torch_uop.reset_metrics()
  for sl in (slice(0, 6), slice(2, 8), slice(4, 10)):
    torch.testing.assert_close(compiled(base[sl]), fn(base[sl]))
  assert torch_uop.metrics()["graph_calls_run_by_torch"] >= 1


def test_data_dependent_shapes_graph_break_and_still_match():
  fn = lambda x: torch.nonzero(x > 0).float().sum() + torch.unique(x.round()).sum() + x.sum()
  check_against_eager(fn, torch.randn(6, 5), expect_native=False)


@pytest.mark.parametrize("case", ["float8_input", "float8_intermediate"])
def test_dtype_without_ir_type_falls_back_whole(case):
  # (complex tensors are held as their view_as_real and run natively: tests/test_ops_complex.py)
  if case == "float8_input": fn, x = (lambda x: (x.float() * 2).abs() + 1), torch.randn(4).to(torch.float8_e4m3fn)
  else: fn, x = (lambda x: (x * 2).to(torch.float8_e5m2).float() + 1), torch.randn(4)
  m = check_against_eager(fn, x, expect_native=False)
  assert m["graphs_fallen_back"] == 1
  assert m["nodes_fallen_back"]["mul.Tensor"] == 1


def test_fallback_whole_graph_option():
  m = check_against_eager(lambda x: x.exp() + 1, torch.randn(3), expect_native=False,
                          options={"fallback_whole_graph": True})
  assert m["graphs_fallen_back"] == 1 and m["kernels_compiled"] == 0
  assert m["nodes_fallen_back"] == {"exp.default": 1, "add.Tensor": 1}


# ------------------------------------------------------------------ dynamic shapes

def test_dynamic_false_recompiles_natively_per_size():
  fn = lambda x: x.exp().sum(-1) * 2
  compiled = torch.compile(fn, backend="uop", dynamic=False)
  for n in [2, 3, 4]:
    x = torch.randn(n, 5)
    torch.testing.assert_close(compiled(x), fn(x))
  m = torch_uop.metrics()
  assert (m["graphs_compiled"], m["graphs_fallen_back"], m["fallback_nodes_total"]) == (3, 0, 0)


# ------------------------------------------------------------------ layouts

BASE = torch.randn(10, 12)


@pytest.mark.parametrize("make", [
  lambda: BASE.t(),                                  # transposed
  lambda: BASE[::2, 1::3],                           # stepped in both dims
  lambda: BASE[2:7, 3:],                             # storage offset and a row stride
  lambda: BASE.t()[1:4],
  lambda: torch.randn(10, 1).expand(10, 4),          # stride 0
  lambda: BASE.reshape(2, 5, 12).permute(2, 0, 1)[:, :, 1],
  lambda: BASE.unfold(1, 4, 2)[:, :, 1],             # overlapping windows view
  lambda: torch.randn(20).as_strided((4, 4), (1, 1)),  # overlapping storage
], ids=["t", "stepped", "offset", "t_slice", "expand", "permuted", "unfold", "overlap"])
def test_non_contiguous_inputs(make):
  x = make()
  assert not x.is_contiguous()
  check_against_eager(lambda x: (x * x.exp()).sum(-1, keepdim=True) + x, x)


def test_non_contiguous_inputs_in_training():
  x = torch.randn(6, 8).t().requires_grad_()
  check_grads_against_eager(lambda x: (x.relu() * x.sigmoid()).sum(0), x)


def test_strides_change_between_calls_static():
  fn = lambda x, y: x * y.exp() + x.sum(0)
  compiled = torch.compile(fn, backend="uop", dynamic=False)
  base = torch.randn(12, 12)
  for x, y in [(base[:4, :5], base[:4, :5]), (base.t()[:4, :5], base[1:5, ::2][:, :5]),
               (base[::3, 1:6], base.t()[3:7, 2:7]), (torch.randn(4, 1).expand(4, 5), base[:4, 5:10]),
               (base[:4, :5].contiguous(), base[:4, :5].contiguous())]:
    torch.testing.assert_close(compiled(x, y), fn(x, y))
  m = torch_uop.metrics()
  assert m["graphs_fallen_back"] == 0 and m["fallback_nodes_total"] == 0


def test_strides_change_between_calls_default():
  fn = lambda x: x * 2 + 1
  compiled = torch.compile(fn, backend="uop")
  base = torch.randn(30)
  for x in [base[:20].view(4, 5), base[:20].view(5, 4).t(), base.as_strided((4, 5), (1, 4), 3),
            base.as_strided((4, 5), (5, 1), 7), base.as_strided((4, 5), (2, 1))]:
    torch.testing.assert_close(compiled(x), fn(x))


def test_compiled_graph_copies_an_unexpected_layout():
  # handed a tensor whose strides differ from the compiled ones, the executor copies it into place
  g = torch_uop.debug.compile_graph(lambda x: x.sum(0) * 2, torch.randn(4, 6))
  x = torch.randn(6, 4).t()
  torch.testing.assert_close(g(x)[0], x.sum(0) * 2)


def test_compiled_graph_refuses_data_an_expanded_layout_cannot_hold():
  # compiled for a stride-0 input, the kernels read one value per row: a dense input cannot be copied into that
  g = torch_uop.debug.compile_graph(lambda x: x * 2, torch.randn(4, 1).expand(4, 5))
  e = torch.randn(4, 1).expand(4, 5)
  torch.testing.assert_close(g(e)[0], e * 2)
  with pytest.raises(RuntimeError, match=r"compiled for strides \(1, 0\), where several elements share one memory"):
    g(torch.randn(4, 5))
  # under torch.compile the stride guard recompiles instead
  fn = lambda x: x * 2
  compiled = torch.compile(fn, backend="uop", dynamic=False)
  for x in (e, torch.randn(4, 5)): torch.testing.assert_close(compiled(x), fn(x))


def test_size_one_dims_ignore_strides():
  g = torch_uop.debug.compile_graph(lambda x: x + 1, torch.randn(1, 5))
  x = torch.randn(5, 1).t()  # strides (1, 1): same layout in every dim that matters
  torch.testing.assert_close(g(x)[0], x + 1)


@pytest.mark.parametrize("fn", [
  lambda x: x.sum(0, keepdim=True).expand(3, 4).clamp(-1, 1).exp(),  # an expand saved for backward (stride 0)
  lambda x: x.sum(0).unsqueeze(0).expand(2, 4).sin(),
  lambda x: x.exp().t().sin(),
  lambda x: x.exp()[1:].sin(),
], ids=["expand_clamp", "unsqueeze_expand", "transpose", "slice"])
def test_saved_activation_layouts_reach_backward(fn):
  # AOTAutograd compiles the backward graph for the strides the forward's saved outputs have in eager
  check_grads_against_eager(fn, torch.randn(3, 4, requires_grad=True))


@pytest.mark.parametrize("fn", [lambda x: x.t() * 2, lambda x: x.sum(0, keepdim=True).expand(3, 4),
                                lambda x: x.permute(1, 0).exp()[1:], lambda x: (x.t() + 1, x.t() + 1)])
def test_outputs_have_eager_strides(fn):
  x = torch.randn(3, 4)
  out, ref = torch.compile(fn, backend="uop")(x), fn(x)
  outs, refs = (out, ref) if isinstance(out, tuple) else ((out,), (ref,))
  for o, r in zip(outs, refs):
    torch.testing.assert_close(o, r)
    assert o.stride() == r.stride()


# ------------------------------------------------------------------ bad input

def test_wrong_shape_raises_like_eager():
  fn = lambda x, y: x + y
  compiled = torch.compile(fn, backend="uop")
  a, b = torch.randn(3, 4), torch.randn(3, 4)
  torch.testing.assert_close(compiled(a, b), a + b)
  bad = torch.randn(5, 4)
  with pytest.raises(RuntimeError, match="must match the size"):
    fn(a, bad)
  with pytest.raises(RuntimeError, match="must match the size"):
    compiled(a, bad)
  # the compiled function is still usable afterwards
  torch.testing.assert_close(compiled(a, b), a + b)


def test_new_valid_shape_recompiles():
  fn = lambda x: x @ x.t()
  compiled = torch.compile(fn, backend="uop", dynamic=False)
  for shape in [(3, 4), (5, 2), (1, 1)]:
    x = torch.randn(shape)
    torch.testing.assert_close(compiled(x), fn(x))


def test_compiled_graph_rejects_wrong_shape_and_dtype():
  g = torch_uop.debug.compile_graph(lambda x: x * 2, torch.randn(3, 4))
  with pytest.raises(RuntimeError, match=r"compiled for \(3, 4\)"):
    g(torch.randn(4, 3))
  with pytest.raises(RuntimeError, match="compiled for"):
    g(torch.randn(3, 4, dtype=torch.float64))
  with pytest.raises(TypeError, match="expected a tensor"):
    g(3.0)


def test_wrong_dtype_recompiles():
  fn = lambda x: (x * 2 + 1).sum(-1)
  compiled = torch.compile(fn, backend="uop")
  for dt in [torch.float32, torch.float64, torch.int32, torch.float16, torch.bfloat16]:
    x = (torch.randn(4, 5) * 3).to(dt)
    torch.testing.assert_close(compiled(x), fn(x))


# ------------------------------------------------------------------ NaN and Inf

NAN, INF = float("nan"), float("inf")
SPECIAL = torch.tensor([[1.0, NAN, 2.0, -1.0], [INF, -INF, 0.0, 1.0], [3.0, -1.0, 3e38, -0.0], [NAN, INF, -INF, NAN]])


@pytest.mark.parametrize("name,fn", [
  ("relu", lambda x: x.relu()),
  ("max", lambda x: x.max(-1).values),
  ("amin", lambda x: x.amin(-1)),
  ("maximum", lambda x: torch.maximum(x, x.flip(-1))),
  ("clamp", lambda x: x.clamp(-1, 1)),
  ("sum_exp", lambda x: x.exp().sum(-1)),
  ("softmax", lambda x: x.softmax(-1)),
  ("overflow", lambda x: x * 1e10),
  ("div_zero", lambda x: x / (x - x.round())),
  ("log", lambda x: torch.log(x) + torch.sqrt(x)),
  ("where_isnan", lambda x: torch.where(torch.isnan(x), torch.zeros_like(x), x)),
  ("nan_to_num", lambda x: torch.nan_to_num(x)),
  ("isinf", lambda x: torch.isinf(x) | torch.isfinite(x)),
])
def test_nan_and_inf_propagate(name, fn):
  check_against_eager(fn, SPECIAL.clone())


def test_nan_in_training():
  x = SPECIAL.clone().requires_grad_()
  fn = lambda x: (x.relu() * 2).sum()
  out = torch.compile(fn, backend="uop")(x)
  out.backward()
  ref_x = SPECIAL.clone().requires_grad_()
  ref = fn(ref_x)
  ref.backward()
  torch.testing.assert_close(out, ref, equal_nan=True)
  torch.testing.assert_close(x.grad, ref_x.grad, equal_nan=True)


# ------------------------------------------------------------------ options and debug output

def test_unknown_option_raises_value_error_naming_it():
  from torch_uop.config import Config
  with pytest.raises(ValueError, match="unknown option 'bogus_opt'"):
    Config.from_options({"bogus_opt": 1})
  compiled = torch.compile(lambda x: x + 1, backend="uop", options={"bogus_opt": 1})
  # Dynamo calls the backend at the first call and wraps what it raises; the ValueError is the cause
  with pytest.raises(Exception, match="unknown option 'bogus_opt'") as err:
    compiled(torch.randn(3))
  inner = getattr(err.value, "inner_exception", err.value)
  assert isinstance(inner, ValueError), type(inner)


@pytest.mark.parametrize("options,match", [({"opt_level": 7}, "opt_level"), ({"device": "tpu"}, "device 'tpu'")])
def test_bad_option_values_raise_value_error(options, match):
  from torch_uop.config import Config
  with pytest.raises(ValueError, match=match):
    Config.from_options(options)


def test_debug_env_var_prints_kernel_list():
  script = ("import torch, torch_uop\n"
            "f = torch.compile(lambda x: x - x.mean(0, keepdim=True), backend='uop')\n"
            "x = torch.randn(4, 5)\n"
            "torch.testing.assert_close(f(x), x - x.mean(0, keepdim=True))\n"
            "print('DONE')\n")
  env = {**os.environ, "TORCH_UOP_DEBUG": "2"}
  r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
  assert r.returncode == 0, r.stderr
  assert "DONE" in r.stdout
  assert "[torch_uop] inference1: 2 kernels, 0 fallback steps" in r.stderr  # the listing names its graph
  assert "inference1_k0: out (1, 5) float32 <- buffers [0]" in r.stderr
  assert "inference1_k1: out (4, 5) float32 <- buffers [0, 1]" in r.stderr
  assert "compiled inference graph" in r.stderr


def test_boolean_option_strings():
  from torch_uop.config import Config
  assert Config.from_options({"fallback_whole_graph": "False"}).fallback_whole_graph is False
  assert Config.from_options({"fallback_whole_graph": "true"}).fallback_whole_graph is True
  with pytest.raises(ValueError, match="fallback_whole_graph"):
    Config.from_options({"fallback_whole_graph": "maybe"})
  with pytest.raises(ValueError, match="opt_level"):
    Config.from_options({"opt_level": "fast"})


def test_functional_view_copies_lower_without_fallback():
  """debug.compile_graph traces functionally: slices, selects, permutes and squeezes arrive as their *_copy forms,
  which lower like the views they copy (no fallback step), results equal to eager."""
  x = torch.randn(2, 16, 8)
  fn = lambda x: torch.cat([x[:, s:s + 4] * 2 for s in range(0, 16, 4)], 1).permute(2, 0, 1)[3].t().unsqueeze(0)
  torch_uop.reset_metrics()
  g = torch_uop.debug.compile_graph(fn, x)
  assert not any(kind == "fallback" for kind, _ in g.plan.steps)
  torch.testing.assert_close(g([x])[0], fn(x))
