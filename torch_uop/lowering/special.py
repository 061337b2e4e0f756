"""Special functions that eager evaluates with loops or long rational approximations.

- Orthogonal polynomials with a tensor degree n (Chebyshev T/U/V/W and their shifted forms, Hermite H/He,
  Laguerre L, Legendre P): eager's special cases, then its three-term recurrence with n steps, run by
  `LT.loop` (a kernel loop whose trip count is each element's n), in the computation dtype, op for op.
- gcd / lcm of integers: Euclid's algorithm, also by `LT.loop` (it stops when the remainder is 0).

Nothing here falls back for particular values: every input is computed as eager computes it.
"""
from __future__ import annotations
import torch
from torch_uop.core.dtypes import dtypes
from torch_uop.core.uop import Ops
from torch_uop.lowering.registry import register, Unsupported
from torch_uop.lowering.tensor import LT
from torch_uop.lowering.pointwise import elementwise, INT_TO_FLOAT, DEFAULT

aten = torch.ops.aten


# ---------------------------------------------------------------- orthogonal polynomials

def _degree(n: LT) -> LT:
  """eager's static_cast<int64_t>(n): NaN, inf and out-of-range values give INT64_MIN on x86 (a negative
  degree, which every polynomial maps to 0); -1 stands for them here (LLVM's fptosi would give poison)."""
  if not n.dtype.is_float: return n.cast(dtypes.int64)
  ok = n.math("abs") < 2.0 ** 63
  return ok.where(n, n.const_like(-1.0)).cast(dtypes.int64)


def _recurrence(steps: LT, p: LT, q: LT, step, stop_at_nan: bool) -> LT:
  """Run (p, q) -> (q, step(k, p, q)) for k = 1..steps; eager's loops stop early once q is NaN."""
  def body(k, state):
    p, q = state
    return [q, step(k + 1, p, q)]
  keep_going = (lambda state: state[1].eq(state[1])) if stop_at_nan else None
  return LT.loop(steps, [p, q], body, keep_going)[1]


# kind -> (degree above which |y| < 1 uses the trig form, value at y = 1, value at y = -1 for even n, for odd n)
_CHEBYSHEV = {"t": (6, "1", "1", "-1"), "u": (8, "n+1", "n+1", "-(n+1)"),
              "v": (8, "1", "2n+1", "-(2n+1)"), "w": (8, "2n+1", "1", "-1")}
_SHIFTED_THRESHOLD = {"t": 6, "u": 6, "v": 6, "w": 4}


def _chebyshev(kind: str, shifted: bool):
  """Chebyshev polynomials of the four kinds in y = x (or the shifted y = 2x - 1), as eager: the edge
  values at y = +-1, the trig closed form for large n inside (-1, 1), then the recurrence
  r = 2y q - p from (1, q0) with q0 = y, 2y, 2y - 1, 2y + 1."""
  threshold, at_one, at_minus_even, at_minus_odd = _CHEBYSHEV[kind]
  if shifted: threshold = _SHIFTED_THRESHOLD[kind]

  def f(x: LT, n: LT) -> LT:
    ni = _degree(n)
    nf = ni.cast(x.dtype)
    ints = {"1": nf.const_like(1.0), "-1": nf.const_like(-1.0), "n+1": (ni + 1).cast(x.dtype),
            "-(n+1)": (-(ni + 1)).cast(x.dtype), "2n+1": (ni + ni + 1).cast(x.dtype), "-(2n+1)": (-(ni + ni + 1)).cast(x.dtype)}
    even = (ni & 1).eq(0)
    y = x + x - 1.0 if shifted else x
    if shifted: at_plus, at_minus = x.eq(1.0), x.eq(0.0)
    else: at_plus, at_minus = x.math("abs").eq(1.0) & (x > 0.0), x.math("abs").eq(1.0) & (x <= 0.0)
    edge_minus = even.where(ints[at_minus_even], ints[at_minus_odd])
    theta = y.math("acos")
    if kind == "t": trig = (nf * theta).math("cos")
    elif kind == "u":
      s, m = theta.math("sin"), (ni + 1).cast(x.dtype)
      trig = s.ne(0.0).where((m * theta).math("sin") / s, m * (m * theta).math("cos") / y)
    elif kind == "v":
      trig = (theta / 2.0).math("sin").ne(1.0).where(((nf + 0.5) * theta).math("cos") / (theta / 2.0).math("cos"), edge_minus)
    else:
      at_zero_angle = even.where(ints["1"], ints["-1"]) if shifted else ints["2n+1"]
      trig = (theta / 2.0).math("cos").ne(1.0).where(((nf + 0.5) * theta).math("sin") / (theta / 2.0).math("sin"), at_zero_angle)
    q0 = {"t": y, "u": y + y, "v": y + y - 1.0, "w": y + y + 1.0}[kind]
    use_trig = (ni > threshold) & (y.math("abs") < 1.0)
    use_edge = at_plus | at_minus
    recur = use_trig.logical_not() & use_edge.logical_not() & (ni >= 2)
    two_y = y + y
    r = _recurrence(recur.where(ni - 1, ni.const_like(0)), nf.const_like(1.0), q0, lambda k, p, q: two_y * q - p, True)
    out = ni.eq(0).where(nf.const_like(1.0), r)   # n == 1 leaves q0 (no step)
    out = use_trig.where(trig, out)
    out = at_minus.where(edge_minus, at_plus.where(ints[at_one], out))
    return (ni < 0).where(nf.const_like(0.0), out)
  return f


def _hermite(physicists: bool):
  """H_n (r = 2x q - 2k p from q = 2x) or He_n (r = x q - k p from q = x); NaN above eager's degree
  limit (128 for float, 512 for double)."""
  def f(x: LT, n: LT) -> LT:
    ni = _degree(n)
    limit = 128 if x.dtype == dtypes.float32 else 512
    q0 = x + x if physicists else x
    if physicists: step = lambda k, p, q: (x + x) * q - (k + k).cast(x.dtype) * p
    else: step = lambda k, p, q: x * q - k.cast(x.dtype) * p
    recur = (ni >= 2) & (ni <= limit)
    r = _recurrence(recur.where(ni - 1, ni.const_like(0)), x.const_like(1.0), q0, step, False)
    out = (ni > limit).where(x.const_like(float("nan")), r)
    out = ni.eq(0).where(x.const_like(1.0), out)
    return (ni < 0).where(x.const_like(0.0), out)
  return f


def _laguerre(x: LT, n: LT) -> LT:
  """L_n: r = ((2k + 1 - x) q - k p) / (k + 1) from q = 1 - x; 1 at x = 0."""
  ni = _degree(n)
  one_minus_x = -x + 1.0
  def step(k, p, q):
    kf = k.cast(x.dtype)
    return (((k + k).cast(x.dtype) + one_minus_x) * q - kf * p) / (k + 1).cast(x.dtype)
  recur = (ni >= 2) & x.math("abs").ne(0.0)
  r = _recurrence(recur.where(ni - 1, ni.const_like(0)), x.const_like(1.0), one_minus_x, step, True)
  out = (ni.eq(0) | x.math("abs").eq(0.0)).where(x.const_like(1.0), r)
  return (ni < 0).where(x.const_like(0.0), out)


def _legendre(x: LT, n: LT) -> LT:
  """P_n: r = ((2k + 1) x q - k p) / (k + 1) from q = x; +-1 at x = +-1."""
  ni = _degree(n)
  def step(k, p, q):
    return ((k + k + 1).cast(x.dtype) * x * q - k.cast(x.dtype) * p) / (k + 1).cast(x.dtype)
  edge = x.math("abs").eq(1.0)
  recur = (ni >= 2) & edge.logical_not()
  r = _recurrence(recur.where(ni - 1, ni.const_like(0)), x.const_like(1.0), x, step, True)
  out = ni.eq(0).where(x.const_like(1.0), r)
  out = edge.where(((x > 0.0) | (ni & 1).eq(0)).where(x.const_like(1.0), x.const_like(-1.0)), out)
  return (ni < 0).where(x.const_like(0.0), out)


def _polynomial(fn):
  def lower(ctx, x, n):
    if ctx.dtype not in (dtypes.float32, dtypes.float64): raise Unsupported("eager has no half-precision kernel")
    return elementwise(ctx, INT_TO_FLOAT, fn, x, n)
  return lower


_POLYNOMIALS = {f"chebyshev_polynomial_{k}": _chebyshev(k, False) for k in "tuvw"}
_POLYNOMIALS.update({f"shifted_chebyshev_polynomial_{k}": _chebyshev(k, True) for k in "tuvw"})
_POLYNOMIALS.update(hermite_polynomial_h=_hermite(True), hermite_polynomial_he=_hermite(False),
                    laguerre_polynomial_l=_laguerre, legendre_polynomial_p=_legendre)
for _name, _fn in _POLYNOMIALS.items():
  register(getattr(aten, "special_" + _name))(_polynomial(_fn))


# ---------------------------------------------------------------- gcd / lcm

def _abs_int(x: LT) -> LT: return x if x.dtype.is_unsigned else (x < 0).where(-x, x)


def _gcd(a: LT, b: LT) -> LT:
  """eager's calc_gcd: a, b = |a|, |b|; while a != 0: a, b = b % a, a. Euclid needs fewer than
  1.45 * bits steps (consecutive Fibonacci numbers are the worst case); the loop stops at a == 0."""
  bits = 8 * a.dtype.itemsize
  count = LT.full(a.shape, 2 * bits + 4, dtypes.int64)
  state = LT.loop(count, [_abs_int(a), _abs_int(b)], lambda k, s: [_safe_mod(s[1], s[0]), s[0]],
                  keep_going=lambda s: s[0].ne(0))
  return state[1]


def _safe_mod(x: LT, y: LT) -> LT:
  """x % y for y != 0 without the hardware trap of INT_MIN % -1 (any x % -1 is 0)."""
  if x.dtype.is_unsigned: return x.alu(Ops.MOD, y)
  return x.alu(Ops.MOD, y.eq(-1).where(y.const_like(1), y))


def _lcm(a: LT, b: LT) -> LT:
  """g = gcd(a, b); 0 if g == 0 else |a / g * b|, in C's int arithmetic (int8/int16 are promoted to int)."""
  wide = dtypes.int32 if a.dtype.itemsize < 4 else a.dtype
  g = _gcd(a, b).cast(wide)
  a, b = a.cast(wide), b.cast(wide)
  # g == -1 happens (gcd(INT_MIN, INT_MAX)): eager traps on INT_MIN / -1; a / -1 is -a (wrapping) here
  safe_g = (g.eq(0) | g.eq(-1)).where(g.const_like(1), g)
  quotient = g.eq(-1).where(-a, a.alu(Ops.IDIV, safe_g))
  return g.eq(0).where(g.const_like(0), _abs_int(quotient * b))


def _integer_binary(fn):
  def lower(ctx, a, b):
    if not ctx.dtype.is_int or ctx.dtype.is_bool: raise Unsupported("gcd/lcm are defined for integers only")
    return elementwise(ctx, DEFAULT, fn, a, b)
  return lower


register(aten.gcd.default)(_integer_binary(_gcd))
register(aten.lcm.default)(_integer_binary(_lcm))
