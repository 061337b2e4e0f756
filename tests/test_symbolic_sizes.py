"""Symbolic sizes (core/sym.py) and graphs compiled once for every size: decisions the variables' ranges settle
guard nothing, the others are guarded on the first call's sizes, and a size that fails a guard gets its own
compile. Every result is checked against eager."""
import pytest
import torch
import torch_uop
from torch_uop.core.sym import Sym, SymF, SizeContext, SymbolicSizeError, size_var, evaluate, guards_hold, known_equal
from helpers import fresh_compiled, assert_ran_natively


def _vars():
  return Sym(size_var("a", 2)), Sym(size_var("b", 2))


def test_arithmetic_builds_expressions_and_folds_constants():
  a, b = _vars()
  assert (a * 0) == 0 and isinstance(a * 0, int)
  e = (a + 3) * b - b * 3
  assert evaluate(e.uop, {"a": 5, "b": 7}) == 35
  assert evaluate((a * b // b).uop, {"a": 9, "b": 4}) == 9
  assert isinstance(a / 2, SymF) and evaluate((a / b).uop, {"a": 3, "b": 4}) == 0.75


def test_decisions_the_ranges_settle_need_no_guard():
  a, b = _vars()
  with SizeContext({"a": 4, "b": 6}) as ctx:
    assert a != 1 and a > 0 and a * b != 0
    assert a * b > a  # a*b - a = a*(b - 1) >= 2: the polynomial bound, where intervals cannot tell
    assert not (a * b == a)
    assert known_equal((a * b, 3), (b * a, 3)) and not known_equal((a,), (b,)) and not known_equal((a,), (a, 1))
  assert ctx.guards == []


def test_other_decisions_are_guarded_on_the_hints():
  a, b = _vars()
  with SizeContext({"a": 4, "b": 6}) as ctx:
    assert a < b
    assert a % 2 == 0
    assert int(a + b) == 10 and ctx.pinned == {"a", "b"}
  assert len(ctx.guards) == 3
  assert guards_hold(ctx.guards, {"a": 4, "b": 6})
  assert not guards_hold(ctx.guards, {"a": 6, "b": 4})   # a < b fails
  assert not guards_hold(ctx.guards, {"a": 3, "b": 7})   # a % 2 == 0 fails


def test_a_decision_outside_a_compile_is_an_error():
  a, b = _vars()
  with pytest.raises(SymbolicSizeError):
    bool(a < b)


def test_new_sizes_reuse_the_kernels():
  fn = lambda x, w: torch.softmax(x @ w, -1) * x.shape[0]
  w = torch.randn(12, 20)
  compiled = fresh_compiled(fn, dynamic=True)
  for n in (3, 5):  # the second size compiles the graph again with the sizes that stayed (12, 20) pinned
    x = torch.randn(n, 12)
    torch.testing.assert_close(compiled(x, w), fn(x, w))
  after_second = torch_uop.metrics()
  for n in (17, 64, 2):
    x = torch.randn(n, 12)
    torch.testing.assert_close(compiled(x, w), fn(x, w))
  m = assert_ran_natively()
  assert m["symbolic_graphs"] == 2 and m["size_specializations"] == 0
  assert m["kernels_compiled"] == after_second["kernels_compiled"], "no kernel is compiled for a new size"
  assert m["compile_time_s"].get("llvm", 0) == after_second["compile_time_s"].get("llvm", 0)
  # a width of another size fails the pinned graph's guard: the first graph serves it
  w2, x = torch.randn(7, 20), torch.randn(4, 7)
  torch.testing.assert_close(compiled(x, w2), fn(x, w2))
  assert torch_uop.metrics()["kernels_compiled"] == after_second["kernels_compiled"]


def test_a_size_that_fails_a_guard_gets_its_own_compile():
  # the slice's length s // 2 is guarded != 1 at the first sizes; a width of 3 makes it 1
  fn = lambda x: x[:, : x.shape[1] // 2] * 2
  compiled = fresh_compiled(fn, dynamic=True)
  for n, m in [(4, 6), (5, 8), (7, 3), (2, 10)]:
    x = torch.randn(n, m)
    torch.testing.assert_close(compiled(x), fn(x))
  m = assert_ran_natively()
  assert m["symbolic_graphs"] == 2 and m["size_specializations"] == 0


def test_a_split_reduction_is_guarded_on_divisibility():
  # a long sum is cut into 64 parts only when 64 divides its length: another length must not reuse those kernels
  fn = lambda x: x.sum() + x.max()
  compiled = fresh_compiled(fn, dynamic=True)
  for n in (1 << 18, (1 << 18) + 64, (1 << 18) + 1, (1 << 18) + 7):
    x = torch.randn(n)
    torch.testing.assert_close(compiled(x), fn(x), rtol=1e-4, atol=1e-3)
  m = assert_ran_natively()
  assert m["symbolic_graphs"] == 2 and m["size_specializations"] == 0


def test_symbolic_strides_and_layouts():
  # transposed and sliced inputs of one dynamic graph: strides are expressions too, and checked at each call
  fn = lambda x: (x.exp() + 1).sum(0)
  compiled = fresh_compiled(fn, dynamic=True)
  a = torch.randn(6, 9)
  for x in (a, torch.randn(4, 3), a.t(), a[:, ::2], torch.randn(7, 5).t()):
    torch.testing.assert_close(compiled(x), fn(x))
  assert_ran_natively()


def test_option_off_compiles_static_copies():
  fn = lambda x: x.relu() + x.shape[0]
  compiled = fresh_compiled(fn, {"symbolic_shapes": False}, dynamic=True)
  for n in (3, 5):
    x = torch.randn(n, 4)
    torch.testing.assert_close(compiled(x), fn(x))
  m = assert_ran_natively()
  assert m["symbolic_graphs"] == 0 and m["size_specializations"] == 2


def test_a_symbolic_axis_upcast_is_guarded_on_divisibility():
  # a convolution's output width, symbolic under dynamic=True, is its SIMD axis when 16 divides the first width
  # (the width is written 16 * w16 in the kernel): a width 16 does not divide gets a symbolic compile of its own
  torch.manual_seed(0)
  conv = torch.nn.Conv2d(3, 8, 3, padding=1).eval()
  compiled = fresh_compiled(conv, dynamic=True)
  with torch.no_grad():
    for n, hw in [(2, 32), (3, 48), (2, 20), (4, 32)]:
      x = torch.randn(n, 3, hw, hw)
      torch.testing.assert_close(compiled(x), conv(x), rtol=1e-4, atol=1e-4)
  m = assert_ran_natively()
  # the first compile (guarded: 16 divides the width) serves 32 and 48; 20 fails that guard and gets a compile
  # whose kernels do not upcast the width, so it guards nothing; batch and width both changed at the second
  # size, so nothing was pinned
  assert m["symbolic_graphs"] == 2 and m["size_specializations"] == 0
