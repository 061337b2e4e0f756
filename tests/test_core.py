"""Unit tests of the core IR, without torch.compile.

- symbolic: constant folding, identities, bounds (vmin/vmax) and div/mod simplification of index math;
- ShapeTracker: every movement op's index map, evaluated for all indices, against torch itself
  (torch.as_strided and real movement ops on an arange tensor), including masks and multi-view chains;
- UPat / PatternMatcher / graph_rewrite semantics;
- UOp hash-consing.
"""
import math
import pytest
import torch
import torch.nn.functional as F
from torch_uop.core.uop import UOp, Ops, UPat, PatternMatcher, graph_rewrite, toposort, RangeArg, AxisKind
from torch_uop.core.dtypes import dtypes
from torch_uop.core.symbolic import simplify, bounds
from torch_uop.core.shapetracker import ShapeTracker

IDX = dtypes.index


def c(v, dt=IDX) -> UOp: return UOp.const(dt, v)
def rng(n: int, axis: int = 0) -> UOp: return UOp(Ops.RANGE, IDX, (c(n),), RangeArg(axis, AxisKind.GLOBAL))


# ------------------------------------------------------------------ a reference evaluator for index UOps

def evaluate(u: UOp, env: dict):
  """Evaluate an integer/bool UOp with RANGEs bound to broadcastable int64 tensors (C div/mod semantics)."""
  memo = {}
  for n in toposort([u]):
    s = [memo[x] for x in n.src]
    if n.op is Ops.CONST: v = torch.tensor(n.arg)
    elif n.op is Ops.RANGE: v = env[n]
    elif n.op is Ops.ADD: v = s[0] + s[1]
    elif n.op is Ops.SUB: v = s[0] - s[1]
    elif n.op is Ops.MUL: v = s[0] * s[1]
    elif n.op is Ops.IDIV: v = torch.div(s[0], s[1], rounding_mode="trunc")
    elif n.op is Ops.MOD: v = torch.fmod(s[0], s[1])
    elif n.op is Ops.MAX: v = torch.maximum(s[0], s[1])
    elif n.op is Ops.MIN: v = torch.minimum(s[0], s[1])
    elif n.op is Ops.CMPLT: v = s[0] < s[1]
    elif n.op is Ops.CMPLE: v = s[0] <= s[1]
    elif n.op is Ops.CMPEQ: v = s[0] == s[1]
    elif n.op is Ops.CMPNE: v = s[0] != s[1]
    elif n.op is Ops.AND: v = s[0] & s[1]
    elif n.op is Ops.OR: v = s[0] | s[1]
    elif n.op is Ops.WHERE: v = torch.where(s[0], s[1], s[2])
    elif n.op is Ops.NEG: v = -s[0]
    elif n.op is Ops.CAST: v = s[0].to(torch.int64) if n.dtype.is_int else s[0].to(torch.bool)
    else: raise NotImplementedError(n.op)
    memo[n] = v
  return memo[u]


def grid(shape):
  """RANGE UOps for a shape and the matching broadcastable arange tensors."""
  ranges = [rng(s, d) for d, s in enumerate(shape)]
  env = {}
  for d, (r, s) in enumerate(zip(ranges, shape)):
    env[r] = torch.arange(s).reshape([s if i == d else 1 for i in range(len(shape))])
  return ranges, env


# ------------------------------------------------------------------ symbolic

class TestSymbolic:
  def test_div_mod_of_split_index(self):
    i, j = rng(4, 0), rng(3, 1)
    assert simplify((i * c(3) + j) // c(3)) is i
    assert simplify((i * c(3) + j) % c(3)) is j
    # the order of terms does not matter
    assert simplify((j + i * c(3)) // c(3)) is i
    assert simplify((j + c(3) * i) % c(3)) is j

  def test_recombine_div_and_mod(self):
    x = rng(24, 0)
    assert simplify((x // c(6)) * c(6) + x % c(6)) is x
    assert simplify(x % c(6) + (x // c(6)) * c(6)) is x
    # scaled, and through an inner mod: k*(x%3) + k*3*((x//3)%4) -> k*(x%12)
    assert simplify((x % c(3)) * c(2) + ((x // c(3)) % c(4)) * c(6) + c(5)) is simplify((x % c(12)) * c(2) + c(5))
    assert simplify(x % c(3) + ((x // c(3)) % c(4)) * c(3)) is simplify(x % c(12))

  def test_div_mod_with_offset_stays_correct(self):
    # j + 1 can reach 3: the quotient may not be dropped
    i, j = rng(4, 0), rng(3, 1)
    e = (i * c(3) + j + c(1)) // c(3)
    s = simplify(e)
    env = {i: torch.arange(4).reshape(4, 1), j: torch.arange(3).reshape(1, 3)}
    assert torch.equal(evaluate(s, env), evaluate(e, env))

  def test_nested_div_and_mod(self):
    x = rng(60, 0)
    assert simplify((x % c(12)) % c(4)) is simplify(x % c(4))
    assert simplify((x // c(3)) // c(4)) is simplify(x // c(12))

  def test_small_value_div_mod(self):
    j = rng(5, 0)
    assert simplify(j // c(5)) is c(0)
    assert simplify(j % c(5)) is j
    assert simplify(j % c(1)) is c(0)
    assert simplify(j // c(1)) is j

  def test_constant_folding(self):
    assert simplify(c(2) + c(3) * c(4)) is c(14)
    assert simplify(c(7) // c(2)) is c(3)
    assert simplify(c(-7) // c(2)) is c(-3), "C (truncating) division"
    assert simplify(c(-7) % c(2)) is c(-1), "C remainder takes the dividend's sign"
    assert simplify(c(3) < c(4)) is UOp.const(dtypes.bool, True)
    assert simplify(c(5).maximum(c(9))) is c(9)
    assert simplify((c(3) < c(4)).where(c(1), c(2))) is c(1)

  def test_identities(self):
    x = rng(10)
    assert simplify(x + c(0)) is x
    assert simplify(c(0) + x) is x
    assert simplify(x * c(1)) is x
    assert simplify(x * c(0)) is c(0)
    assert simplify(x - x) is c(0)
    assert simplify(UOp.const(dtypes.bool, True) & (x < c(5))) is simplify(x < c(5))
    assert simplify((x < c(5)).where(x, x)) is x

  def test_combine_like_terms(self):
    x, y = rng(10, 0), rng(7, 1)
    e = simplify((x * c(2) + c(3)) + (x + c(1)) + y - y)
    assert e is simplify(x * c(3) + c(4))

  def test_float_math_is_left_alone(self):
    f = UOp(Ops.LOAD, dtypes.float32, (UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), 0), c(0)))
    for e in (f + UOp.const(dtypes.float32, 0.0), f * UOp.const(dtypes.float32, 1.0), f - f):
      assert simplify(e) is e, "x+0.0, x*1.0 and x-x are not identities for floats (-0.0, NaN, inf)"

  def test_bounds(self):
    i, j = rng(4, 0), rng(3, 1)
    assert (i.vmin, i.vmax) == (0, 3)
    assert bounds(i * c(3) + j) == (0, 11)
    assert bounds(i - j) == (-2, 3)
    assert bounds(i * c(-2)) == (-6, 0)
    assert bounds((i * c(3) + j) // c(2)) == (0, 5)
    assert bounds(i % c(2)) == (0, 1)
    assert bounds(i % c(10)) == (0, 3)
    assert bounds(i.maximum(c(2))) == (2, 3)
    assert bounds(i < c(4)) == (True, True)
    assert bounds(i < c(0)) == (False, False)
    assert bounds(i < c(2)) == (False, True)
    assert bounds((i < c(2)).where(c(10), j)) == (0, 10)
    f = UOp(Ops.LOAD, dtypes.float32, (UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), 0), c(0)))
    assert bounds(f) == (-math.inf, math.inf)
    assert bounds(UOp(Ops.LOAD, dtypes.int8, (UOp(Ops.DEFINE_GLOBAL, dtypes.int8, (), 0), c(0)))) == (-128, 127)

  def test_bounds_fold_decided_comparisons(self):
    i = rng(4)
    assert simplify(i < c(4)) is UOp.const(dtypes.bool, True)
    assert simplify(c(0) <= i) is UOp.const(dtypes.bool, True)
    assert simplify(i < c(0)) is UOp.const(dtypes.bool, False)
    # a range of size 1 is the constant 0
    assert simplify(rng(1) * c(5) + c(2)) is c(2)

  @pytest.mark.parametrize("shape", [(4, 3), (2, 5, 3), (6, 1, 4)])
  def test_unflatten_then_flatten_is_identity(self, shape):
    # the index a contiguous view round-trip produces must simplify back to the plain flat index
    from torch_uop.core.shapetracker import unflatten, contiguous_strides
    x = rng(math.prod(shape))
    idxs = unflatten(x, shape)
    flat = c(0)
    for i, st in zip(idxs, contiguous_strides(shape)): flat = flat + i * c(st)
    assert simplify(flat) is x

  @pytest.mark.parametrize("seed", range(2))
  def test_random_expressions_keep_their_value(self, seed):
    # random integer expressions over three ranges (negative constants and divisors, comparisons, WHERE):
    # simplification keeps every value, and bounds before and after contain every value
    g = torch.Generator().manual_seed(seed)
    rand = lambda n: int(torch.randint(n, (1,), generator=g))
    i, j, k = rng(5, 0), rng(4, 1), rng(7, 2)
    env = {i: torch.arange(5).reshape(5, 1, 1), j: torch.arange(4).reshape(1, 4, 1), k: torch.arange(7).reshape(1, 1, 7)}

    def rand_expr(depth):
      if depth == 0 or rand(5) == 0: return [i, j, k][rand(3)] if rand(10) < 7 else c(rand(13) - 4)
      op = [Ops.ADD, Ops.MUL, Ops.IDIV, Ops.MOD, Ops.SUB, Ops.MAX, Ops.MIN, Ops.WHERE, Ops.ADD, Ops.MUL][rand(10)]
      a = rand_expr(depth - 1)
      if op in (Ops.IDIV, Ops.MOD): return a.alu(op, c((rand(9) + 1) * (1 if rand(4) else -1)))
      if op is Ops.WHERE:
        cond = rand_expr(depth - 1).alu([Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ, Ops.CMPLE][rand(4)], rand_expr(depth - 1))
        return cond.where(a, rand_expr(depth - 1))
      return a.alu(op, rand_expr(depth - 1))

    for _ in range(250):
      e = rand_expr(5)
      s = simplify(e)
      v = evaluate(e, env).expand(5, 4, 7)
      assert torch.equal(evaluate(s, env).expand(5, 4, 7), v), f"{e}\n->\n{s}"
      lo, hi = v.min().item(), v.max().item()
      for x in (e, s):
        b = bounds(x)
        assert b[0] <= lo and hi <= b[1], f"bounds {b} miss [{lo}, {hi}] of\n{x}"


# ------------------------------------------------------------------ ShapeTracker

def index_map(st: ShapeTracker, pad_value: int = -1) -> torch.Tensor:
  """For every output index of st: the flat source index it reads, or pad_value where masked off."""
  ranges, env = grid(st.shape)
  flat, valid = st.to_indexed(ranges)
  flat, valid = simplify(flat), simplify(valid)
  f = evaluate(flat, env).expand(st.shape)
  v = evaluate(valid, env).expand(st.shape)
  return torch.where(v, f, torch.full_like(f, pad_value))


def check(st: ShapeTracker, expected: torch.Tensor):
  assert st.shape == tuple(expected.shape)
  torch.testing.assert_close(index_map(st), expected, rtol=0, atol=0)


def base(*shape):
  return ShapeTracker.from_shape(shape), torch.arange(math.prod(shape)).reshape(shape)


class TestShapeTracker:
  def test_contiguous(self):
    st, t = base(3, 4, 5)
    assert st.is_contiguous
    check(st, t)

  @pytest.mark.parametrize("shape,strides,offset", [((3, 4), (4, 1), 0), ((4, 3), (1, 4), 0), ((2, 3), (6, 2), 1),
                                                    ((3, 3), (0, 1), 2), ((2, 2, 2), (1, 6, 3), 0), ((5,), (-1,), 4)])
  def test_from_strides_matches_as_strided(self, shape, strides, offset):
    flat = torch.arange(12)
    st = ShapeTracker.from_strides(shape, strides, offset)
    if any(s < 0 for s in strides):  # torch has no negative strides: flip instead
      expected = flat[offset - 4:offset + 1].flip(0)
    else: expected = torch.as_strided(flat, shape, strides, offset)
    check(st, expected)

  @pytest.mark.parametrize("new_shape", [(12, 5), (60,), (3, 2, 2, 5), (1, 3, 1, 20), (5, 12)])
  def test_reshape(self, new_shape):
    st, t = base(3, 4, 5)
    check(st.reshape(new_shape), t.reshape(new_shape))

  @pytest.mark.parametrize("order", [(1, 0, 2), (2, 0, 1), (2, 1, 0)])
  def test_permute(self, order):
    st, t = base(3, 4, 5)
    check(st.permute(order), t.permute(order))

  def test_expand(self):
    st, t = base(3, 1, 5)
    check(st.expand((3, 4, 5)), t.expand(3, 4, 5))
    st, t = base(1, 1)
    check(st.expand((2, 6)), t.expand(2, 6))

  def test_shrink(self):
    st, t = base(6, 7)
    check(st.shrink(((1, 4), (2, 7))), t[1:4, 2:7])

  def test_flip(self):
    st, t = base(3, 4, 5)
    check(st.flip((0, 2)), t.flip(0, 2))
    check(st.permute((2, 0, 1)).flip((1,)), t.permute(2, 0, 1).flip(1))

  @pytest.mark.parametrize("steps", [(2, 1), (1, 3), (3, 2)])
  def test_stride_step(self, steps):
    st, t = base(7, 8)
    check(st.stride_step(steps), t[::steps[0], ::steps[1]])

  def test_stride_step_after_shrink_and_flip(self):
    st, t = base(9, 4)
    check(st.shrink(((1, 8), (0, 4))).flip((0,)).stride_step((3, 2)), t[1:8].flip(0)[::3, ::2])

  def test_pad_has_mask(self):
    st, t = base(3, 4)
    p = st.pad(((1, 2), (0, 3)))
    assert p.views[-1].mask is not None
    check(p, F.pad(t, (0, 3, 1, 2), value=-1))

  def test_pad_then_shrink_inside_drops_mask(self):
    st, t = base(3, 4)
    p = st.pad(((1, 1), (1, 1))).shrink(((1, 4), (1, 5)))
    assert p.views[-1].mask is None
    check(p, t)

  def test_pad_then_shrink_across_the_border(self):
    st, t = base(3, 4)
    check(st.pad(((2, 0), (1, 1))).shrink(((1, 4), (0, 3))), F.pad(t, (1, 1, 2, 0), value=-1)[1:4, 0:3])

  def test_pad_flip_and_stride(self):
    st, t = base(5, 3)
    e = F.pad(t, (1, 2, 2, 1), value=-1).flip(0)[::2, ::3]
    check(st.pad(((2, 1), (1, 2))).flip((0,)).stride_step((2, 3)), e)

  def test_pad_expand_of_size_one_dim(self):
    st, t = base(1, 4)
    check(st.pad(((0, 0), (1, 1))).expand((3, 6)), F.pad(t, (1, 1), value=-1).expand(3, 6))

  def test_masked_reshape_adding_unit_dims(self):
    st, t = base(3, 4)
    p = st.pad(((1, 0), (0, 1))).reshape((1, 4, 1, 5))
    check(p, F.pad(t, (0, 1, 1, 0), value=-1).reshape(1, 4, 1, 5))

  def test_permute_then_reshape_needs_a_second_view(self):
    st, t = base(3, 4, 5)
    s2 = st.permute((2, 0, 1)).reshape((5, 12)).reshape((60,))
    assert len(s2.views) == 2
    check(s2, t.permute(2, 0, 1).reshape(60))

  def test_chain_that_needs_a_second_view(self):
    st, t = base(4, 6)
    s2 = st.permute((1, 0)).reshape((3, 2, 4)).shrink(((0, 3), (1, 2), (0, 4))).reshape((3, 4)).expand((3, 4))
    e = t.permute(1, 0).reshape(3, 2, 4)[:, 1:2].reshape(3, 4)
    check(s2, e)
    s3 = st.permute((1, 0)).reshape((24,)).shrink(((3, 21),)).reshape((3, 6)).flip((1,))
    assert len(s3.views) == 2
    check(s3, t.permute(1, 0).reshape(24)[3:21].reshape(3, 6).flip(1))

  def test_padded_then_reshaped_needs_a_second_view(self):
    st, t = base(2, 3)
    s2 = st.pad(((0, 0), (1, 1))).reshape((10,))
    assert len(s2.views) == 2
    check(s2, F.pad(t, (1, 1), value=-1).reshape(10))

  def test_expand_then_reshape(self):
    st, t = base(3, 1)
    s2 = st.expand((3, 4)).reshape((12,))
    check(s2, t.expand(3, 4).reshape(12))

  def test_as_strided_on_a_view(self):
    st, t = base(4, 5)
    s2 = st.permute((1, 0)).as_strided((3, 3), (1, 4), 2)
    check(s2, torch.as_strided(t.permute(1, 0).contiguous(), (3, 3), (1, 4), 2))

  def test_compose_trackers(self):
    st, t = base(4, 6)
    top = ShapeTracker.from_shape((6, 4)).permute((1, 0)).flip((0,))
    check(st.reshape((6, 4)) + top, t.reshape(6, 4).permute(1, 0).flip(0))

  @pytest.mark.parametrize("seed", range(4))
  def test_random_chains_against_torch(self, seed):
    # t holds the index map with pad -1, so masking composes exactly like F.pad with value -1
    g = torch.Generator().manual_seed(seed)
    rand = lambda n: int(torch.randint(n, (1,), generator=g))
    starts = [(2, 3, 4), (6, 4), (4, 1, 6), (12,)]
    for _ in range(40):
      st, t = base(*starts[rand(len(starts))])
      for _ in range(6):
        k = rand(7)
        if k == 0:
          order = torch.randperm(t.dim(), generator=g).tolist()
          st, t = st.permute(order), t.permute(order)
        elif k == 1:
          d = rand(t.dim())
          st, t = st.flip((d,)), t.flip(d)
        elif k == 2:
          d = rand(t.dim()); s = t.shape[d]
          if s > 1:
            lo = rand(s - 1); hi = lo + 1 + rand(s - lo)
            b = [(0, n) for n in t.shape]; b[d] = (lo, hi)
            st, t = st.shrink(b), t.narrow(d, lo, hi - lo)
        elif k == 3:
          d = rand(t.dim()); a, b_ = rand(3), rand(3)
          pads = [(0, 0)] * t.dim(); pads[d] = (a, b_)
          flat_pads = [p for pr in reversed(pads) for p in pr]
          st, t = st.pad(pads), F.pad(t, flat_pads, value=-1)
        elif k == 4:
          d = rand(t.dim()); step = 1 + rand(3)
          steps = [1] * t.dim(); steps[d] = step
          sl = [slice(None)] * t.dim(); sl[d] = slice(None, None, step)
          st, t = st.stride_step(steps), t[tuple(sl)]
        elif k == 5:
          ones = [d for d in range(t.dim()) if t.shape[d] == 1]
          if ones:
            new = list(t.shape); new[ones[rand(len(ones))]] = 1 + rand(4)
            st, t = st.expand(tuple(new)), t.expand(*new)
        else:
          shapes = _reshape_candidates(tuple(t.shape))
          new = shapes[rand(len(shapes))]
          st, t = st.reshape(new), t.reshape(new)
        check(st, t)


def _reshape_candidates(shape):
  """Reshapes that split a dim in two, merge two neighbours, add or drop a unit dim, or flatten."""
  out = [(math.prod(shape),)]
  for d, s in enumerate(shape):
    out += [shape[:d] + (f, s // f) + shape[d + 1:] for f in range(2, s) if s % f == 0]
    out.append(shape[:d] + (1,) + shape[d:])
    if d + 1 < len(shape): out.append(shape[:d] + (s * shape[d + 1],) + shape[d + 2:])
    if s == 1 and len(shape) > 1: out.append(shape[:d] + shape[d + 1:])
  return out


# ------------------------------------------------------------------ patterns and rewriting

class TestPatterns:
  def test_upat_binds_names_and_checks_op_dtype_arg(self):
    x = rng(4)
    e = x + c(3)
    binds = UPat(Ops.ADD, src=(UPat.var("a"), UPat.cvar("k"))).match(e, {})
    assert binds == [{"a": x, "k": c(3)}]
    assert UPat(Ops.MUL).match(e, {}) == []
    assert UPat(Ops.ADD, dtype=dtypes.float32).match(e, {}) == []
    assert UPat(Ops.ADD, dtype={dtypes.int32, dtypes.int64}).match(e, {}) != []
    assert UPat(Ops.CONST, arg=3).match(c(3), {}) != []
    assert UPat(Ops.CONST, arg=4).match(c(3), {}) == []

  def test_ordered_src_vs_commutative_list(self):
    x = rng(4)
    e = c(3) + x
    assert UPat(Ops.ADD, src=(UPat.var("a"), UPat.cvar("k"))).match(e, {}) == []
    assert UPat(Ops.ADD, src=[UPat.var("a"), UPat.cvar("k")]).match(e, {}) == [{"a": x, "k": c(3)}]
    # the builder sugar makes commutative ops match either order
    assert (UPat.var("a") * UPat.cvar("k")).match(c(2) * x, {}) == [{"a": x, "k": c(2)}]

  def test_same_name_must_bind_same_node(self):
    x, y = rng(4, 0), rng(5, 1)
    pat = UPat(Ops.ADD, src=(UPat.var("a"), UPat.var("a")))
    assert pat.match(x + x, {}) != []
    assert pat.match(x + y, {}) == []

  def test_allow_any_len(self):
    r = UOp(Ops.REDUCE, dtypes.float32, (UOp.const(dtypes.float32, 1.0), rng(3), rng(4, 1)), Ops.ADD)
    assert UPat(Ops.REDUCE, src=(UPat.cvar("v"),)).match(r, {}) == []
    assert UPat(Ops.REDUCE, src=(UPat.cvar("v"),), allow_any_len=True).match(r, {}) != []

  def test_first_rule_returning_a_uop_wins(self):
    x = rng(4)
    calls = []
    pm = PatternMatcher([
      (UPat(Ops.ADD, name="e"), lambda e: calls.append("none") or None),  # declines
      (UPat(Ops.ADD, name="e"), lambda e: c(1)),
      (UPat(Ops.ADD, name="e"), lambda e: c(2)),
    ])
    assert pm.rewrite(x + c(5)) is c(1)
    assert calls == ["none"]
    assert pm.rewrite(x) is None

  def test_a_rule_for_any_op_keeps_its_place_in_the_list(self):
    # rules are tried in list order whatever their root: one for any op before an op-specific one is tried first,
    # one after it only when the op-specific one declines
    x = rng(4)
    first = PatternMatcher([(UPat(name="e"), lambda e: c(7) if e.op is Ops.ADD else None),
                            (UPat(Ops.ADD, name="e"), lambda e: c(1))])
    assert first.rewrite(x + c(5)) is c(7)
    last = PatternMatcher([(UPat(Ops.ADD, name="e"), lambda e: c(1) if e.src[1].arg == 5 else None),
                           (UPat(name="e"), lambda e: c(7) if e.op is Ops.ADD else None)])
    assert last.rewrite(x + c(5)) is c(1) and last.rewrite(x + c(6)) is c(7)
    assert last.rewrite(x * c(6)) is None

  def test_translate_takes_any_result_and_rewrite_only_a_new_node(self):
    # translate (codegen's EVALUATE, the renderers) accepts a rule's result even when it is the node itself; rewrite
    # passes such a rule by. A pattern that checks a dtype or an arg still checks it when it has no sources.
    x = rng(4)
    pm = PatternMatcher([(UPat(Ops.ADD, dtype=dtypes.float32, name="e"), lambda e: "float add"),
                         (UPat(Ops.ADD, name="e"), lambda e: e),
                         (UPat(Ops.ADD, name="e"), lambda e: f"add of {len(e.src)}")])
    assert pm.translate(x + c(1)) is x + c(1)
    assert pm.rewrite(x + c(1)) == "add of 2"
    assert pm.translate(x * c(2)) is None

  def test_ctx_is_passed_when_given(self):
    pm = PatternMatcher([(UPat(Ops.CONST, name="k"), lambda ctx, k: ctx.append(k.arg) or None)])
    seen = []
    graph_rewrite(c(1) + c(2), pm, ctx=seen)
    assert sorted(seen) == [1, 2]

  def test_graph_rewrite_is_bottom_up_to_a_fixed_point(self):
    # x*2 -> x+x ; x+x -> x<<1 ... expressed with constants: fold MUL by 2 into ADD, then ADD of equal into SHL
    x = rng(8)
    pm = PatternMatcher([
      (UPat(Ops.MUL, src=(UPat.var("a"), UPat.cvar("k"))), lambda a, k: a + a if k.arg == 2 else None),
      (UPat(Ops.ADD, src=(UPat.var("a"), UPat.var("a"))), lambda a: a.alu(Ops.SHL, c(1))),
    ])
    out = graph_rewrite((x * c(2)) * c(2), pm)
    assert out is (x.alu(Ops.SHL, c(1))).alu(Ops.SHL, c(1))

  def test_rewrite_rebuilds_parents_and_keeps_sharing(self):
    x = rng(8)
    shared = x * c(3)
    e = (shared + c(1)) + shared
    pm = PatternMatcher([(UPat(Ops.MUL, src=(UPat.var("a"), UPat.cvar("k"))), lambda a, k: a.alu(Ops.SHL, k))])
    out = graph_rewrite(e, pm)
    new_shared = x.alu(Ops.SHL, c(3))
    assert out is (new_shared + c(1)) + new_shared
    assert sum(1 for n in toposort([out]) if n.op is Ops.SHL) == 1

  def test_non_converging_rewrite_raises(self):
    pm = PatternMatcher([(UPat(Ops.CONST, name="k"), lambda k: c(k.arg + 1))])
    with pytest.raises(RuntimeError, match="converge"):
      graph_rewrite(c(0), pm)


# ------------------------------------------------------------------ hash-consing

class TestHashConsing:
  def test_equal_construction_is_the_same_object(self):
    a = UOp(Ops.ADD, IDX, (rng(4), c(1)))
    b = UOp(Ops.ADD, IDX, (rng(4), c(1)))
    assert a is b
    assert rng(4) + c(1) is a
    assert a.replace(arg=None) is a

  def test_different_parts_are_different_objects(self):
    assert rng(4) is not rng(5)
    assert rng(4, 0) is not rng(4, 1)
    assert c(1) is not c(1, dtypes.int32)
    assert UOp(Ops.ADD, IDX, (rng(4), c(1))) is not UOp(Ops.ADD, IDX, (c(1), rng(4)))

  def test_signed_zero_and_bool_constants_are_distinct(self):
    pz, nz = UOp.const(dtypes.float32, 0.0), UOp.const(dtypes.float32, -0.0)
    assert pz is not nz
    assert math.copysign(1.0, nz.arg) == -1.0
    assert UOp.const(dtypes.float32, 0.0) is pz
    assert UOp(Ops.CONST, IDX, (), 1) is not UOp(Ops.CONST, IDX, (), True)
    nan1, nan2 = UOp.const(dtypes.float32, float("nan")), UOp.const(dtypes.float32, float("nan"))
    assert nan1 is nan2, "NaN constants with the same bits are one node"

  def test_consts_are_cast_to_their_dtype(self):
    assert c(3.0).arg == 3 and isinstance(c(3.0).arg, int)
    assert UOp.const(dtypes.float32, 2).arg == 2.0 and isinstance(UOp.const(dtypes.float32, 2).arg, float)
    assert UOp.const(dtypes.bool, 5).arg is True

  def test_nodes_are_freed_when_unreferenced(self):
    import gc
    from torch_uop.core.uop import _live
    u = UOp(Ops.CONST, IDX, (), 987654321)
    key_count = len(_live)
    del u
    gc.collect()
    assert len(_live) < key_count
    assert UOp(Ops.CONST, IDX, (), 987654321).arg == 987654321  # made again after its entry went

  def test_pickle_round_trip_is_hash_consed(self):
    import pickle
    e = (rng(4) * c(3) + rng(3, 1)) // c(3)
    assert pickle.loads(pickle.dumps(e)) is e
    # dtypes hash by identity, so a copy must be the dtype itself
    import copy
    for dt in (dtypes.bool, dtypes.int8, dtypes.int64, dtypes.bfloat16, dtypes.float32, dtypes.void):
      assert pickle.loads(pickle.dumps(dt)) is dt and copy.deepcopy(dt) is dt


def test_vectorizable_exp_matches_eager_within_one_ulp():
  """core/transcendental.py's float32 exp: <= 1 ulp from eager in the normal range; inf, 0, NaN edges."""
  import torch_uop.debug
  x = torch.cat([torch.randn(20000) * 30, torch.tensor([0., -0., 88.7, 88.8, -87.3, -103.9, -104.5, float("inf"),
                                                          -float("inf"), float("nan"), 1e-8, -1e-30])])
  y = torch_uop.debug.compile_graph(lambda a: a.exp(), x)([x])[0]
  ref = x.exp()
  torch.testing.assert_close(y, ref, rtol=1.3e-6, atol=1e-40, equal_nan=True)
  normal = ref.abs() > 1.2e-38
  assert (y.view(torch.int32).long() - ref.view(torch.int32).long()).abs()[normal].max() <= 1


def test_vectorizable_erf_within_three_ulp_of_the_exact_value():
  """core/transcendental.py's float32 erf (GELU's): both polynomial pieces and their seam at |x| = 1, the tail up to
  where erf rounds to +-1, tiny and subnormal inputs (sign kept), inf and NaN; measured against float64's erf."""
  import numpy as np
  import torch_uop.debug
  edges = [0., -0., 1e-30, -1e-40, 0.9999999, 1.0, 1.0000001, -1.0, 3.9999, 4.0, 9.0, float("inf"), -float("inf"),
           float("nan")]
  x = torch.cat([torch.linspace(-6, 6, 100001), torch.logspace(-38, 0.7, 2000), -torch.logspace(-38, 0.7, 2000),
                 torch.tensor(edges)])
  graph = torch_uop.debug.compile_graph(lambda a: torch.erf(a), x)
  assert graph.kernels and not any("erf" in src for src in graph.sources), "no scalar libm call left to stop SIMD"
  y = graph([x])[0]
  torch.testing.assert_close(y, torch.erf(x), equal_nan=True)
  exact = torch.erf(x.double())
  finite = exact.isfinite()
  ulp = torch.from_numpy(np.spacing(exact.abs().float().numpy())).double()
  assert ((y.double() - exact).abs() / ulp)[finite].max() <= 3
  assert torch.equal(torch.signbit(y[-14:-11]), torch.tensor([False, True, False]))


def test_core_imports_no_torch_and_no_outer_layer():
  """core/ is the device-independent compiler: none of its modules imports torch, or torch_uop's lowering, runtime,
  pipeline or backend, at module level or inside a function (torch_uop/torch_dtypes.py maps dtypes to torch's)."""
  import ast
  import pathlib
  import torch_uop
  outer = ("torch_uop.lowering", "torch_uop.runtime", "torch_uop.pipeline", "torch_uop.dynamo_backend",
           "torch_uop.config", "torch_uop.debug", "torch_uop.torch_dtypes", "torch_uop.testing")
  found = []
  core = pathlib.Path(torch_uop.__file__).parent / "core"
  assert (core / "uop.py").exists()
  for path in sorted(core.rglob("*.py")):
    for node in ast.walk(ast.parse(path.read_text())):
      names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
          [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
      found += [f"{path.name}:{node.lineno} {m}" for m in names if m.split(".")[0] == "torch" or m.startswith(outer)]
  assert not found, found


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_and_bfloat16_constants_are_torchs_rounding(dtype):
  """The LLVM renderer writes a 16-bit float constant's bits without torch: as torch rounds a Python float (to
  float32 first, then to nearest even; overflow to inf; a value halfway after the first rounding, -37871.99988...)."""
  import random
  from torch_uop.core.renderer.llvmir import _half_bits, _bfloat16_bits
  bits_of = _half_bits if dtype is torch.float16 else _bfloat16_bits
  random.seed(0)
  values = [0.0, -0.0, 1.0, 0.1, 1 / 3, 65504.0, 65519.0, 65520.0, -1e6, 1e300, -1e300, 3.4028235677973366e38, math.inf,
            -math.inf, 1e-8, 2.98e-8, 1e-40, 1e-46, 2.0 ** -133, -37871.99988425232, 1.00390625, 1.01171875]
  values += [math.ldexp(random.random(), random.randint(-150, 130)) * random.choice((-1, 1)) for _ in range(3000)]
  for v in values:
    assert bits_of(v) == torch.tensor([v], dtype=dtype).view(torch.int16).item() & 0xFFFF, v
  assert bits_of(math.nan) in (0x7E00, 0x7FC0)
