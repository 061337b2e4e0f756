"""Symbolic integer algebra for index math: value bounds and the simplifying rewrite rules.

`bounds(u)` gives (vmin, vmax) of an integer/bool UOp from its loop ranges and constants.
`symbolic` is a PatternMatcher that folds constants, removes identities and simplifies div/mod
using those bounds, so views compose into the short index expressions a person would write.
It only rewrites integer and boolean arithmetic (floats are left exactly as lowering built them).
"""
from __future__ import annotations
import math
from torch_uop.core.uop import UOp, Ops, UPat, PatternMatcher, graph_rewrite, substitute, AxisKind, LimitedRange
from torch_uop.core.dtypes import dtypes

_INF = math.inf


def bounds(u: UOp):
  """Smallest and largest value u can take (conservative)."""
  lo, hi = _bounds(u)
  # integer arithmetic wraps: a range past the dtype's says nothing (and would overflow the float math here)
  if u.dtype.is_int and (lo < u.dtype.min() or hi > u.dtype.max()): return u.dtype.min(), u.dtype.max()
  return lo, hi


def _bounds(u: UOp):
  if u.op is Ops.CONST: return u.arg, u.arg
  if u.op is Ops.DEFINE_VAR: return u.arg[1], u.arg[2]
  if u.dtype.is_float: return -_INF, _INF
  lo_t, hi_t = u.dtype.min(), u.dtype.max()
  if u.op is Ops.RANGE:
    size = u.src[0]
    return 0, size.vmax - 1
  if u.op in (Ops.ADD, Ops.SUB, Ops.MUL, Ops.MAX, Ops.MIN, Ops.IDIV, Ops.MOD) and len(u.src) == 2:
    (a0, a1), (b0, b1) = u.src[0]._bounds(), u.src[1]._bounds()
    if u.op is Ops.ADD: return a0 + b0, a1 + b1
    if u.op is Ops.SUB: return a0 - b1, a1 - b0
    if u.op is Ops.MUL:
      vals = [x * y for x in (a0, a1) for y in (b0, b1) if not (math.isinf(x) or math.isinf(y))]
      if len(vals) == 4: return min(vals), max(vals)
    if u.op is Ops.MAX: return max(a0, b0), max(a1, b1)
    if u.op is Ops.MIN: return min(a0, b0), min(a1, b1)
    if u.op is Ops.IDIV and b0 == b1 and b0 > 0 and a0 >= 0: return a0 // b0, a1 // b0
    if u.op is Ops.MOD and b0 == b1 and b0 > 0:
      if a0 >= 0: return (a0, a1) if a1 < b0 else (0, b0 - 1)
      return -(b0 - 1), b0 - 1
    # a symbolic divisor (a size variable): its smallest and largest values bound the result
    if u.op is Ops.IDIV and b0 > 0 and a0 >= 0 and not math.isinf(b1): return a0 // b1, a1 // b0
    if u.op is Ops.MOD and b0 > 0 and a0 >= 0 and not math.isinf(b1): return 0, min(a1, b1 - 1)
  if u.op is Ops.CAST and u.src[0].dtype.is_int | u.src[0].dtype.is_bool:
    lo, hi = u.src[0]._bounds()
    if lo >= lo_t and hi <= hi_t: return lo, hi
  if u.op is Ops.WHERE:
    (a0, a1), (b0, b1) = u.src[1]._bounds(), u.src[2]._bounds()
    return min(a0, b0), max(a1, b1)
  if u.dtype.is_bool and u.op in (Ops.CMPLT, Ops.CMPLE, Ops.CMPEQ, Ops.CMPNE):
    (a0, a1), (b0, b1) = u.src[0]._bounds(), u.src[1]._bounds()
    if u.op is Ops.CMPLT: return (a1 < b0, a0 < b1)
    if u.op is Ops.CMPLE: return (a1 <= b0, a0 <= b1)
    if u.op is Ops.CMPNE and (a1 < b0 or b1 < a0): return True, True
    if u.op is Ops.CMPEQ and (a1 < b0 or b1 < a0): return False, False
    return False, True
  if u.op is Ops.AND and u.dtype.is_bool:
    (a0, a1), (b0, b1) = u.src[0]._bounds(), u.src[1]._bounds()
    return a0 and b0, a1 and b1
  return lo_t, hi_t


def _is_index(u: UOp) -> bool: return u.dtype.is_int or u.dtype.is_bool


def _fold(op: Ops, a, b):
  if op is Ops.ADD: return a + b
  if op is Ops.SUB: return a - b
  if op is Ops.MUL: return a * b
  if op is Ops.MAX: return max(a, b)
  if op is Ops.MIN: return min(a, b)
  if op is Ops.IDIV: return None if b == 0 else int(a / b) if abs(a) < 2**52 and abs(b) < 2**52 else None
  if op is Ops.MOD: return None if b == 0 else a - b * int(a / b) if abs(a) < 2**52 and abs(b) < 2**52 else None
  if op is Ops.CMPLT: return a < b
  if op is Ops.CMPLE: return a <= b
  if op is Ops.CMPEQ: return a == b
  if op is Ops.CMPNE: return a != b
  if op is Ops.AND: return a & b if not isinstance(a, bool) else (a and b)
  if op is Ops.OR: return a | b if not isinstance(a, bool) else (a or b)
  return None


def _const_fold(x: UOp):
  if not _is_index(x) or not all(s.op is Ops.CONST for s in x.src): return None
  if len(x.src) == 2:
    v = _fold(x.op, x.src[0].arg, x.src[1].arg)
    return None if v is None else UOp.const(x.dtype, v)
  if x.op is Ops.WHERE: return x.src[1] if x.src[0].arg else x.src[2]
  if x.op is Ops.CAST and x.dtype.is_int: return UOp.const(x.dtype, x.src[0].arg)
  if x.op is Ops.NEG: return UOp.const(x.dtype, -x.src[0].arg)
  return None


def _bounds_fold(x: UOp):
  """A value whose bounds collapse to one number is that number."""
  if not _is_index(x) or x.op in (Ops.CONST, Ops.LOAD, Ops.RANGE, Ops.DEFINE_VAR): return None
  lo, hi = x.vmin, x.vmax
  if lo == hi and not isinstance(lo, float): return UOp.const(x.dtype, lo)
  return None


def _split_terms(x: UOp) -> list[UOp]:
  return _split_terms(x.src[0]) + _split_terms(x.src[1]) if x.op is Ops.ADD else [x]


def base_and_offset(index: UOp) -> tuple[tuple, int]:
  """An index as (its non-constant addends, in a canonical order; the sum of its constant addends): indices with the
  same addends are their offsets' difference apart (the renderers' vector accesses group consecutive ones)."""
  terms = _split_terms(index)
  base = tuple(sorted((t for t in terms if t.op is not Ops.CONST), key=id))
  return base, sum(t.arg for t in terms if t.op is Ops.CONST)


def _factor(t: UOp):
  """term -> (coefficient, base) with base None for constants."""
  if t.op is Ops.CONST: return t.arg, None
  if t.op is Ops.MUL and t.src[1].op is Ops.CONST: return t.src[1].arg, t.src[0]
  if t.op is Ops.MUL and t.dtype.is_int:  # a product with a constant inside: r * (s * 128) is 128 * (r * s)
    c, nodes = _factors(t)
    if c != 1 and nodes: return c, _product(nodes, t.dtype)
  return 1, t


def _factors(t: UOp) -> tuple[int, list]:
  """A product as (its constant, its other factors): r * (s * 128) -> (128, [r, s])."""
  if t.op is Ops.CONST: return t.arg, []
  if t.op is not Ops.MUL: return 1, [t]
  (ca, na), (cb, nb) = _factors(t.src[0]), _factors(t.src[1])
  return ca * cb, na + nb


def _product(nodes: list, dtype) -> UOp:
  out = nodes[0]
  for n in nodes[1:]: out = out * n
  return out


def _divide_term(t: UOp, divisor: tuple[int, list]) -> UOp | None:
  """t / divisor when the divisor's constant and factors are all in t's (a symbolic multiple), else None."""
  (tc, tn), (dc, dn) = _factors(t), divisor
  if dc == 0 or tc % dc: return None
  rest = list(tn)
  for n in dn:
    if n not in rest: return None
    rest.remove(n)
  q = UOp.const(t.dtype, tc // dc)
  return q if not rest else _product(rest, t.dtype) * q if tc // dc != 1 else _product(rest, t.dtype)


def upper_bound(u: UOp) -> UOp | None:
  """An expression u never exceeds, over the size variables (a loop range is below its trip count, which may be
  symbolic); None if there is none to tell. Numeric bounds (vmax) only know the variables' largest values."""
  if "upper" in u._props: return u._props["upper"]
  out = None
  if u.op in (Ops.CONST, Ops.DEFINE_VAR): out = u
  elif u.op is Ops.RANGE and u.src and u.src[0].op in (Ops.CONST, Ops.DEFINE_VAR, Ops.ADD, Ops.MUL, Ops.IDIV):
    out = u.src[0] + UOp.const(u.dtype, -1)
  elif u.op is Ops.ADD and (a := upper_bound(u.src[0])) is not None and (b := upper_bound(u.src[1])) is not None: out = a + b
  elif u.op is Ops.MUL and u.src[0].vmin >= 0 and u.src[1].vmin >= 0 and (a := upper_bound(u.src[0])) is not None \
       and (b := upper_bound(u.src[1])) is not None: out = a * b
  elif u.op is Ops.IDIV and u.src[0].vmin >= 0 and u.src[1].vmin > 0 and (a := upper_bound(u.src[0])) is not None:
    out = a // u.src[1] if u.src[1].op is Ops.CONST else a
  elif u.op is Ops.MOD and u.src[0].vmin >= 0 and u.src[1].vmin > 0 and not _has_range(u.src[1]):
    out = u.src[1] + UOp.const(u.dtype, -1)
  u._props["upper"] = out
  return out


_LOOP_OR_DATA = (Ops.RANGE, Ops.LOAD, Ops.LOOP_VAR)


def _loop_or_data_ops(u: UOp) -> frozenset:
  """Which of RANGE, LOAD and LOOP_VAR occur in u (cached on the node: rewrite rules ask it of every candidate)."""
  stack = [(u, False)]
  while stack:  # iterative post-order, stopping at nodes already known (index expressions can be deep)
    n, ready = stack.pop()
    if "loop_or_data" in n._props: continue
    if not ready:
      stack.append((n, True))
      stack.extend((x, False) for x in n.src if "loop_or_data" not in x._props)
      continue
    found = frozenset([n.op]) if n.op in _LOOP_OR_DATA else frozenset()
    for x in n.src: found |= x._props["loop_or_data"]
    n._props["loop_or_data"] = found
  return u._props["loop_or_data"]


def _has_range(u: UOp) -> bool: return bool(_loop_or_data_ops(u) & {Ops.RANGE, Ops.LOAD})


def _provably_below(x: UOp, k: UOp) -> bool:
  """x < k for every value of the size variables (x >= 0), shown through x's symbolic upper bound."""
  if x.vmax < k.vmin: return True
  if (ub := upper_bound(x)) is None: return False
  from torch_uop.core.sym import sign_bounds
  return sign_bounds(simplify(k - ub))[0] > 0


def _div_mod_by_symbol(x: UOp, k: UOp, is_mod: bool):
  """x // k and x % k for a symbolic k > 0 and x >= 0: x when it stays below k; otherwise the terms of x that are
  multiples of k leave (r0*(T*32) + r1*32 + r3) // (T*32) -> r0 when r1*32 + r3 < T*32."""
  if not x.dtype.is_int or k.op is Ops.CONST or k.vmin <= 0 or x.vmin < 0: return None
  if _provably_below(x, k): return x if is_mod else UOp.const(x.dtype, 0)
  divisor = _factors(k)
  c = divisor[0]
  if c > 1:  # (y*c + b) // (k'*c) -> y // k' and (y*c + b) % (k'*c) -> (y % k')*c + b, for 0 <= b < c
    terms = [_factor(t) for t in _split_terms(x)]
    y = [(coef // c, base) for coef, base in terms if coef % c == 0 and base is not None]
    b = [(coef, base) for coef, base in terms if not (coef % c == 0 and base is not None)]
    b_sum = _sum_terms(b, x.dtype) if b else UOp.const(x.dtype, 0)
    if y and b_sum.vmin >= 0 and b_sum.vmax < c:
      y_sum, k_rest = _sum_terms(y, x.dtype), _product(divisor[1], x.dtype)
      if y_sum.vmin >= 0:
        return (y_sum % k_rest) * UOp.const(x.dtype, c) + b_sum if is_mod else y_sum // k_rest
  quotient, rest = [], []
  for t in _split_terms(x):
    q = _divide_term(t, divisor)
    if q is None: rest.append(t)
    else: quotient.append(q)
  if not quotient: return None
  rest_sum = _sum_terms([(1, t) for t in rest], x.dtype) if rest else UOp.const(x.dtype, 0)
  q_sum = _sum_terms([(1, t) for t in quotient], x.dtype)
  if rest_sum.vmin < 0 or q_sum.vmin < 0: return None
  return rest_sum % k if is_mod else q_sum + rest_sum // k


def _sum_terms(terms: list[tuple[int, UOp | None]], dtype) -> UOp:
  out = None
  const = sum(c for c, b in terms if b is None)
  for c, b in terms:
    if b is None or c == 0: continue
    t = b if c == 1 else b * UOp.const(dtype, c)
    out = t if out is None else out + t
  if out is None: return UOp.const(dtype, const)
  return out if const == 0 else out + UOp.const(dtype, const)


def _combine_terms(x: UOp):
  """Flatten a sum, merge like terms and constants: (a*2 + 3) + (a + 1) -> a*3 + 4."""
  if not x.dtype.is_int: return None
  terms = _split_terms(x)
  if len(terms) < 2: return None
  merged: dict = {}
  order = []
  for t in terms:
    c, b = _factor(t)
    if b not in merged: order.append(b); merged[b] = 0
    merged[b] += c
  combined = [(merged[b], b) for b in order]
  # only a real simplification is taken: fewer terms, or the constant moved last (checked before building the sum:
  # most sums visited are already in this form)
  fewer = len([1 for c, b in combined if c != 0]) < len(terms)
  if not fewer and not (None in merged and order[-1] is not None): return None
  new = _sum_terms(combined, x.dtype)
  return new if fewer or new is not x else None


def _div_mod_by_const(x: UOp, c: UOp, is_mod: bool):
  """Simplify x // c and x % c for c > 0 and x >= 0 by pulling out multiples of c."""
  if not x.dtype.is_int: return None
  d = c.arg
  if d <= 0 or x.vmin < 0: return None
  if d == 1: return UOp.const(x.dtype, 0) if is_mod else x
  if x.vmax < d: return x if is_mod else UOp.const(x.dtype, 0)
  if x.vmin // d == x.vmax // d:  # one quotient over x's whole range: (r*16 + 65) % 64 -> r*16 + 1 for r < 3
    q = x.vmin // d
    return x + UOp.const(x.dtype, -q * d) if is_mod else UOp.const(x.dtype, q)
  terms = [_factor(t) for t in _split_terms(x)]
  quotient, rest = [], []
  for coef, base in terms:
    if coef % d == 0: quotient.append((coef // d, base))
    elif base is None and coef >= d:  # a constant's multiples of d join the quotient: 65 = 1*64 + 1
      quotient.append((coef // d, None)); rest.append((coef % d, None))
    else: rest.append((coef, base))
  if not quotient:
    # (a % (d*k)) % d -> a % d ;  (a // k) // d -> a // (k*d)
    if len(terms) == 1 and x.op is Ops.MOD and x.src[1].op is Ops.CONST and x.src[1].arg % d == 0 and is_mod:
      return x.src[0] % c
    if len(terms) == 1 and x.op is Ops.IDIV and x.src[1].op is Ops.CONST and not is_mod and x.src[0].vmin >= 0:
      return x.src[0] // UOp.const(x.dtype, x.src[1].arg * d)
    # (a*c + b) // d -> a // (d/c) and (a*c + b) % d -> (a % (d/c))*c + b, when c divides d and 0 <= b < c
    for n, (coef, base) in enumerate(terms):
      if base is None or coef <= 1 or d % coef or base.vmin < 0: continue
      rest_sum = _sum_terms([t for m, t in enumerate(terms) if m != n], x.dtype)
      if rest_sum.vmin < 0 or rest_sum.vmax >= coef: continue
      inner = UOp.const(x.dtype, d // coef)
      return (base % inner) * UOp.const(x.dtype, coef) + rest_sum if is_mod else base // inner
    # gcd: (a*4 + b*8) // 2 ... handled only when all coefficients share a factor with d
    g = d
    for coef, base in terms: g = math.gcd(g, coef)
    if g > 1 and not is_mod:
      inner = _sum_terms([(coef // g, base) for coef, base in terms], x.dtype)
      return inner // UOp.const(x.dtype, d // g)
    return None
  rest_sum = _sum_terms(rest, x.dtype) if rest else UOp.const(x.dtype, 0)
  if rest_sum.vmin < 0: return None
  if is_mod: return rest_sum % c
  return _sum_terms(quotient, x.dtype) + rest_sum // c


def _recombine_div_mod(x: UOp):
  """Undo an unflatten inside a sum, in any term order and scaled by any k:
  k*(a % c) + k*c*(a // c) -> k*a  and, for a >= 0,  k*(a % c) + k*c*((a // c) % b) -> k*(a % (c*b))."""
  if not x.dtype.is_int: return None
  terms = _split_terms(x)
  if len(terms) < 2: return None
  factored = [_factor(t) for t in terms]
  for i, (k, t) in enumerate(factored):
    if t is None or t.op is not Ops.MOD or t.src[1].op is not Ops.CONST or t.src[1].arg <= 0: continue
    a, c = t.src[0], t.src[1].arg
    for j, (coef, base) in enumerate(factored):
      if j == i or base is None or coef != k * c: continue
      if base.op is Ops.IDIV and base.src[0] is a and base.src[1].op is Ops.CONST and base.src[1].arg == c:
        merged = a
      elif base.op is Ops.MOD and base.src[1].op is Ops.CONST and base.src[1].arg > 0 and a.vmin >= 0 \
           and (q := base.src[0]).op is Ops.IDIV and q.src[0] is a and q.src[1].op is Ops.CONST and q.src[1].arg == c:
        merged = a % UOp.const(x.dtype, c * base.src[1].arg)
      else: continue
      rest = [(cf, b) for n, (cf, b) in enumerate(factored) if n not in (i, j)]
      return _sum_terms([(k, merged)] + rest, x.dtype)
  return None


def _mul_assoc(x: UOp, c1: UOp, c2: UOp):
  return x * UOp.const(x.dtype, c1.arg * c2.arg) if x.dtype.is_int else None


def _distribute_const_mul(a: UOp, b: UOp, c: UOp):
  return (a * c + b * c) if a.dtype.is_int else None


symbolic = PatternMatcher([
  (UPat({Ops.ADD, Ops.SUB, Ops.MUL, Ops.MAX, Ops.MIN, Ops.IDIV, Ops.MOD, Ops.CMPLT, Ops.CMPLE, Ops.CMPEQ, Ops.CMPNE,
         Ops.AND, Ops.OR, Ops.WHERE, Ops.CAST, Ops.NEG}, name="x"), _const_fold),
  # identities on integers/bools
  (UPat(Ops.ADD, src=[UPat.var("x"), UPat.cvar("c")]), lambda x, c: x if c.arg == 0 and _is_index(x) else None),
  (UPat(Ops.MUL, src=[UPat.var("x"), UPat.cvar("c")]),
   lambda x, c: (x if c.arg == 1 else UOp.const(x.dtype, 0) if c.arg == 0 else None) if _is_index(x) else None),
  (UPat(Ops.SUB, src=(UPat.var("x"), UPat.cvar("c"))), lambda x, c: x + UOp.const(x.dtype, -c.arg) if x.dtype.is_int else None),
  (UPat(Ops.SUB, src=(UPat.var("x"), UPat.var("y"))), lambda x, y: x + y * UOp.const(x.dtype, -1) if x.dtype.is_int else None),
  # canonical order: constants on the right
  (UPat(Ops.ADD, src=(UPat.cvar("c"), UPat.var("x"))), lambda c, x: x + c if x.op is not Ops.CONST else None),
  (UPat(Ops.MUL, src=(UPat.cvar("c"), UPat.var("x"))), lambda c, x: x * c if x.op is not Ops.CONST and _is_index(x) else None),
  ((UPat.var("x") * UPat.cvar("c1")) * UPat.cvar("c2"), _mul_assoc),
  (UPat(Ops.MUL, src=(UPat(Ops.ADD, src=(UPat.var("a"), UPat.var("b"))), UPat.cvar("c"))), _distribute_const_mul),
  # a symbolic stride distributes over loop index terms too, so like terms meet: (r + 1)*s + s*-1 -> r*s (sums of
  # sizes alone stay factored: (s + 2)*(s + 2) is a divisor div/mod rules must recognize)
  (UPat(Ops.MUL, src=[UPat(Ops.ADD, src=(UPat.var("a"), UPat.var("b"))), UPat.var("x")]),
   lambda a, b, x: a * x + b * x if a.dtype.is_int and _is_size_expr(x) and (_has_range(a) or _has_range(b)) else None),
  (UPat(Ops.ADD, name="x"), _combine_terms),
  (UPat(Ops.ADD, name="x"), _recombine_div_mod),
  (UPat(Ops.IDIV, src=(UPat.var("x"), UPat.cvar("c"))), lambda x, c: _div_mod_by_const(x, c, False)),
  (UPat(Ops.MOD, src=(UPat.var("x"), UPat.cvar("c"))), lambda x, c: _div_mod_by_const(x, c, True)),
  (UPat(Ops.IDIV, src=(UPat.var("x"), UPat.var("k"))), lambda x, k: _div_mod_by_symbol(x, k, False)),
  (UPat(Ops.MOD, src=(UPat.var("x"), UPat.var("k"))), lambda x, k: _div_mod_by_symbol(x, k, True)),
  # max/min that bounds settle: max(x, 1) is x when x >= 1
  (UPat(Ops.MAX, src=(UPat.var("x"), UPat.var("y"))),
   lambda x, y: (x if x.vmin >= y.vmax else y if y.vmin >= x.vmax else None) if x.dtype.is_int else None),
  (UPat(Ops.MIN, src=(UPat.var("x"), UPat.var("y"))),
   lambda x, y: (x if x.vmax <= y.vmin else y if y.vmax <= x.vmin else None) if x.dtype.is_int else None),
  # boolean identities
  (UPat(Ops.AND, src=[UPat.var("x"), UPat.cvar("c")]), lambda x, c: (x if c.arg else c) if x.dtype.is_bool else None),
  (UPat(Ops.WHERE, src=(UPat.cvar("c"), UPat.var("a"), UPat.var("b"))), lambda c, a, b: a if c.arg else b),
  (UPat(Ops.WHERE, src=(UPat.var(), UPat.var("a"), UPat.var("b"))), lambda a, b: a if a is b else None),
  # last, for any op: a value whose bounds collapse to one number (computing bounds is the costliest test)
  (UPat(name="x"), _bounds_fold),
])


# every simplification shares one memo: index expressions repeat across views, kernels and graphs.
# It is dropped when it grows large, so a long-lived process does not keep every expression alive.
_memo: dict = {}
_MEMO_LIMIT = 1 << 19


def simplify(u: UOp) -> UOp:
  if len(_memo) > _MEMO_LIMIT: _memo.clear()
  return graph_rewrite(u, symbolic, memo=_memo)


# ----- simplifying under a condition -----

def _affine_in_one_range(e: UOp):
  """(r, f, o) when e is r*f + o for a loop range r, f > 0 and constant o; else None."""
  o = 0
  if e.op is Ops.ADD and e.src[1].op is Ops.CONST: e, o = e.src[0], e.src[1].arg
  f = 1
  if e.op is Ops.MUL and e.src[1].op is Ops.CONST: e, f = e.src[0], e.src[1].arg
  return (e, f, o) if e.op is Ops.RANGE and f > 0 else None


def _is_size_expr(u: UOp) -> bool:
  """A non-constant index expression of size variables only (no loop range, no data): a symbolic bound."""
  return u.op is not Ops.CONST and u.dtype.is_int and not _loop_or_data_ops(u)


def range_limits(valid: UOp) -> dict:
  """Loop range -> [lo, hi) that the conjunction `valid` implies for it, from its clauses of the form
  c <= r*f + o and r*f + o < c (the masks of padded, sliced and concatenated views). A bound is an int, or, from
  a clause r + o < c whose c is an expression of size variables, a UOp (then only one clause per side is used)."""
  limits: dict = {}
  clauses, stack = [], [valid]
  while stack:
    c = stack.pop()
    if c.op is Ops.AND and c.dtype.is_bool: stack.extend(c.src)
    else: clauses.append(c)
  const = lambda v: UOp.const(dtypes.index, v)
  for c in clauses:
    if c.op not in (Ops.CMPLT, Ops.CMPLE): continue
    a, b = c.src
    if b.op is Ops.CONST and (t := _affine_in_one_range(a)):  # r*f + o < b  (or <=)
      r, f, o = t
      bound = b.arg - o + (1 if c.op is Ops.CMPLE else 0)   # r*f < bound
      lo, hi = limits.get(r, (0, None))
      new = -(-bound // f)
      limits[r] = (lo, new if hi is None or isinstance(hi, UOp) else min(hi, new))
    elif a.op is Ops.CONST and (t := _affine_in_one_range(b)):  # a < r*f + o  (or <=)
      r, f, o = t
      bound = a.arg - o + (1 if c.op is Ops.CMPLT else 0)    # r*f >= bound
      lo, hi = limits.get(r, (0, None))
      new = -(-bound // f)
      limits[r] = (new if isinstance(lo, UOp) else max(lo, new), hi)
    elif _is_size_expr(b) and (t := _affine_in_one_range(a)) and t[1] == 1:  # r + o < B, B symbolic
      r, _, o = t
      lo, hi = limits.get(r, (0, None))
      if hi is None: limits[r] = (lo, simplify(b + const(1 - o if c.op is Ops.CMPLE else -o)))
    elif _is_size_expr(a) and (t := _affine_in_one_range(b)) and t[1] == 1:  # A <= r + o, A symbolic
      r, _, o = t
      lo, hi = limits.get(r, (0, None))
      if lo == 0: limits[r] = (simplify(a + const((1 if c.op is Ops.CMPLT else 0) - o)), hi)
  out = {}
  for r, (lo, hi) in limits.items():
    if hi is None: hi = r.src[0] if r.src[0].op is not Ops.CONST else r.vmax + 1
    if isinstance(lo, int) and isinstance(hi, int) and ((lo, hi) == (0, r.vmax + 1) or lo >= hi): continue
    if isinstance(lo, int) and lo == 0 and hi is r.src[0]: continue
    out[r] = (lo, hi)
  return out


def simplify_given(u: UOp, valid: UOp) -> UOp:
  """simplify(u), also using the loop limits that `valid` implies: right wherever valid holds, which is all a
  gated load's index must be. (r + 32) % 64 with r < 96 stays; with valid = r < 32 it becomes r + 32."""
  return simplify_within(u, range_limits(valid) if valid.op is not Ops.CONST else {})


def simplify_within(u: UOp, limits: dict) -> UOp:
  """simplify(u) with each range r of `limits` (from range_limits) known to lie in [lo, hi): r is replaced by a
  fresh range of hi - lo iterations plus lo, simplified, and put back."""
  if not limits: return simplify(u)
  ix = lambda v: v if isinstance(v, UOp) else UOp.const(dtypes.index, v)  # a bound may be a symbolic size
  fresh = {r: UOp(Ops.RANGE, r.dtype, (simplify(ix(hi) - ix(lo)),), LimitedRange(r.arg, AxisKind.LIMITED, lo)) for r, (lo, hi) in limits.items()}
  narrowed = simplify(substitute(u, {r: fresh[r] + ix(lo) for r, (lo, _) in limits.items()}))
  return simplify(substitute(narrowed, {fresh[r]: r - ix(lo) for r, (lo, _) in limits.items()}))
