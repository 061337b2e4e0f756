"""Index math that keeps div/mod out of inner loops: bounds-based div/mod folding and reduce-loop placement."""
import torch
from torch_uop.core.uop import UOp, Ops, RangeArg, AxisKind
from torch_uop.core.dtypes import dtypes
from torch_uop.core.symbolic import simplify
from torch_uop.core.codegen import _ranges_of
import torch_uop
import torch_uop.debug


def _c(v): return UOp.const(dtypes.index, v)


def _range(axis, size): return UOp(Ops.RANGE, dtypes.index, (_c(size),), RangeArg(axis, AxisKind.GLOBAL))


def test_div_mod_with_one_quotient_over_the_range_fold():
  r = _range(1, 4)  # r*16 + 65 lies in [65, 113]: one quotient, 1
  assert simplify((r * _c(16) + _c(65)) % _c(64)) is simplify(r * _c(16) + _c(1))
  assert simplify((r * _c(16) + _c(65)) // _c(64)) is _c(1)


def test_constant_splits_into_quotient_and_rest():
  i, r = _range(0, 8), _range(1, 4)
  x = i * _c(64) + r * _c(16) + _c(65)
  assert simplify(x % _c(64)) is simplify(r * _c(16) + _c(1))
  assert simplify(x // _c(64)) is simplify(i + _c(1))


def _kernels_of(fn, *args):
  # debug.capture() also keeps the graph cache out, so every graph is compiled here and its kernels have programs
  with torch_uop.debug.capture() as graphs:
    out = fn(*args)
  return out, [k for g in graphs for k in g.kernels]


def test_strided_conv_input_gradient_computes_loop_invariant_div_mod_outside_the_innermost_loop():
  torch.manual_seed(0)
  conv = torch.nn.Conv2d(8, 16, 3, stride=2, padding=1)
  x = torch.randn(2, 8, 12, 12, requires_grad=True)
  compiled = torch.compile(conv, backend="uop")

  def step(x):
    compiled(x).square().sum().backward()
    return x.grad
  got, kernels = _kernels_of(step, x)
  x2 = x.detach().clone().requires_grad_(True)
  conv(x2).square().sum().backward()
  torch.testing.assert_close(got, x2.grad, rtol=1e-4, atol=1e-5)
  checked = 0
  for k in kernels:
    ranges = [n for n in k.program if n.op is Ops.RANGE and n.arg[1].startswith("reduce")]
    if len(ranges) < 2: continue
    start, rcache = k.program.index(ranges[-1]), {}
    end = next(i for i, n in enumerate(k.program) if n.op is Ops.ASSIGN and i > start)
    # the innermost reduce loop is the one fewest div/mods read, and it computes only the ones that move with it
    inner = ranges[-1]
    assert all(inner in _ranges_of(n, rcache) for n in k.program[start:end] if n.op in (Ops.IDIV, Ops.MOD)), k.name
    counts = {r: sum(1 for n in k.program if n.op in (Ops.IDIV, Ops.MOD) and r in _ranges_of(n, rcache)) for r in ranges}
    assert counts[inner] == min(counts.values()), k.name
    checked += 1
  assert checked


def test_index_under_a_mask_uses_the_masks_loop_limits():
  from torch_uop.core.symbolic import simplify_given
  r, t = _range(2, 96), _range(1, 40)
  inside = (_c(32) <= r) & (r < _c(64))  # the middle third of a concatenation along r
  x = t * _c(32) + r + _c(-32)
  # without the mask, r - 32 may be negative or pass 32, so nothing folds
  assert simplify(x // _c(32)).op in (Ops.IDIV, Ops.ADD) and simplify((r + _c(-32)) % _c(32)).op is Ops.MOD
  assert simplify_given(x // _c(32), inside) is simplify(t)
  assert simplify_given((r + _c(-32)) % _c(32), inside) is simplify(r + _c(-32))
  assert simplify_given(r * _c(2) // _c(64), r < _c(32)) is _c(0)
  upcast = r * _c(4) + _c(3)  # an upcast position: r*4 + 3 < 64 means r < 16
  assert simplify_given(upcast // _c(64), upcast < _c(64)) is _c(0)


def test_concatenated_attention_heads_index_without_division_by_sizes():
  # the attention backward's dq/dk/dv concatenated along the feature axis, at sizes that are not powers of two:
  # each third reads its head layout through the concatenation's mask, so the only division left splits a
  # feature into (head, 8 features), never one by the sequence length or the batch stride
  q, k, v = (torch.randn(3, 4, 40, 8) for _ in range(3))
  fn = lambda q, k, v: torch.cat([t.transpose(1, 2).reshape(3, 40, 32) for t in (q, k, v)], -1) * 2
  got, kernels = _kernels_of(lambda *a: torch.compile(fn, backend="uop")(*a), q, k, v)
  torch.testing.assert_close(got, fn(q, k, v))
  divisors = {n.src[1].arg if n.src[1].op is Ops.CONST else None for k in kernels for n in k.program
              if n.op in (Ops.IDIV, Ops.MOD)}
  assert kernels and divisors <= {8}, divisors
