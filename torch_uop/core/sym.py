"""Symbolic sizes: `Sym`, an integer size that is an expression of per-call size variables, and the guards
recorded whenever code decides something about one.

Under dynamic shapes a graph's sizes are expressions of size variables (DEFINE_VAR UOps, one per symbol of
PyTorch's ShapeEnv). Lowering, scheduling and codegen use a Sym where they would use an int: arithmetic builds
an index expression, which kernels compute from the variables' values at run time. A comparison is decided
from the variables' ranges when they settle it, and otherwise from the values the variables have in the call
being compiled (the hints), recording a guard: the condition and its outcome. The compiled graph is right for
every call whose variables satisfy all of its guards. Turning a Sym into a Python int (int(), range(), an
index) records that it equals its hint: the graph is then specialized on it, still soundly.

Nothing here knows about torch; lowering/specialize.py makes Syms from PyTorch's SymInts.
"""
from __future__ import annotations
import math
import threading
from fractions import Fraction
from torch_uop.core.uop import UOp, Ops
from torch_uop.core.dtypes import dtypes
from torch_uop.core.symbolic import simplify

IDX = dtypes.index
# a size variable is assumed to lie in [lo, MAX_VAR]; the bound keeps products of a few variables inside int64 (so
# index bounds stay informative), and dispatch checks it like any guard
MAX_VAR = (1 << 24) - 1


class SymbolicSizeError(Exception):
  """A decision about a symbolic size that cannot be made (no size context is active)."""


def size_var(name: str, lo: int = 0, hi: int = MAX_VAR) -> UOp:
  return UOp(Ops.DEFINE_VAR, IDX, (), (name, max(lo, 0), min(hi, MAX_VAR)))


class SizeContext:
  """The hints and the guards of one symbolic compile. Used as `with SizeContext(hints): ...` (per thread)."""
  _local = threading.local()

  def __init__(self, hints: dict):
    self.hints = hints      # size variable name -> its value in the call being compiled
    self.guards: list = []  # (bool UOp over the variables, the value it must have)
    self.pinned: set = set()  # names of variables some code turned into a Python int (the graph is specialized on them)
    self.decided: dict = {}   # condition -> its value (each guard is recorded once)

  @staticmethod
  def _stack() -> list:
    if not hasattr(SizeContext._local, "stack"): SizeContext._local.stack = []
    return SizeContext._local.stack

  def __enter__(self):
    SizeContext._stack().append(self)
    return self

  def __exit__(self, *exc): SizeContext._stack().pop()

  @staticmethod
  def current() -> SizeContext:
    stack = SizeContext._stack()
    if not stack: raise SymbolicSizeError("a decision on a symbolic size outside a symbolic compile")
    return stack[-1]

  def decide(self, cond: UOp) -> bool:
    if cond not in self.decided:
      self.decided[cond] = bool(evaluate(cond, self.hints))
      self.guards.append((cond, self.decided[cond]))
    return self.decided[cond]


def guards_hold(guards: list, values: dict) -> bool:
  return all(bool(evaluate(cond, values)) == want for cond, want in guards)


def evaluate(u: UOp, values: dict) -> int:
  """The value of an index/bool expression over size variables, for the variables' `values`."""
  memo: dict = {}

  def ev(n: UOp):
    if n in memo: return memo[n]
    if n.op is Ops.CONST: out = n.arg
    elif n.op is Ops.DEFINE_VAR: out = values[n.arg[0]]
    elif n.op is Ops.CAST: out = float(ev(n.src[0])) if n.dtype.is_float else bool(ev(n.src[0])) if n.dtype.is_bool else int(ev(n.src[0]))
    else:
      xs = [ev(s) for s in n.src]
      out = _EVAL[n.op](*xs)
    memo[n] = out
    return out
  return ev(u)


def _c_div(a: int, b: int) -> int:  # C semantics, as the kernels compute it
  q = abs(a) // abs(b)
  return q if (a >= 0) == (b > 0) else -q


_EVAL = {
  Ops.ADD: lambda a, b: a + b, Ops.SUB: lambda a, b: a - b, Ops.MUL: lambda a, b: a * b,
  Ops.IDIV: _c_div, Ops.MOD: lambda a, b: a - b * _c_div(a, b),
  Ops.MAX: max, Ops.MIN: min, Ops.NEG: lambda a: -a,
  Ops.CMPLT: lambda a, b: a < b, Ops.CMPLE: lambda a, b: a <= b, Ops.CMPEQ: lambda a, b: a == b,
  Ops.CMPNE: lambda a, b: a != b, Ops.AND: lambda a, b: a and b if isinstance(a, bool) else a & b,
  Ops.OR: lambda a, b: a or b if isinstance(a, bool) else a | b, Ops.NOT: lambda a: not a,
  Ops.WHERE: lambda c, a, b: a if c else b, Ops.FDIV: lambda a, b: a / b if b else math.copysign(math.inf, a) * (b == b),
}


def is_sym(x) -> bool: return isinstance(x, Sym)


def known_equal(a, b) -> bool:
  """Whether two sizes (or tuples of sizes) are equal for every value of the variables, guarding nothing: False
  when it depends on them. For shortcuts whose general path is right either way (a reshape to the same shape)."""
  if isinstance(a, tuple) or isinstance(b, tuple):
    return isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b) and all(map(known_equal, a, b))
  if not isinstance(a, Sym) and not isinstance(b, Sym): return a == b
  ua, ub = _uop_of(a), _uop_of(b)
  if ua is None or ub is None: return False
  return ua is ub or sign_bounds(simplify(ua - ub)) == (0, 0)  # a*b - b*a is 0 as a polynomial


def sym_extreme(op: Ops, a, b):
  """max (op MAX) or min (op MIN) of two sizes, ints or Syms, without deciding which it is."""
  if not isinstance(a, Sym) and not isinstance(b, Sym): return max(a, b) if op is Ops.MAX else min(a, b)
  return Sym.of(UOp(op, IDX, (_uop_of(a), _uop_of(b))))


def hint(x) -> int:
  """A size's value in the call being compiled, for heuristics: decisions that change speed, never results (so
  they guard nothing)."""
  return evaluate(x.uop, SizeContext.current().hints) if isinstance(x, Sym) else x


def concrete(x, values: dict):
  """x with every Sym in it (nested in tuples, lists and dicts) replaced by its value for `values`."""
  if isinstance(x, (Sym, SymF)): return evaluate(x.uop, values)
  if isinstance(x, tuple): return tuple(concrete(v, values) for v in x)
  if isinstance(x, list): return [concrete(v, values) for v in x]
  if isinstance(x, dict): return {k: concrete(v, values) for k, v in x.items()}
  return x


def _uop_of(x):
  if isinstance(x, Sym): return x.uop
  if isinstance(x, bool) or not isinstance(x, int): return None
  return UOp.const(IDX, x)


class _SizeExpr:
  """What Sym and SymF share: arithmetic through `_bin`, and pinning to the hint."""
  __slots__ = ("uop",)

  def __init__(self, uop: UOp): self.uop = uop
  def __hash__(self): return hash(self.uop)
  def __add__(self, x): return self._bin(Ops.ADD, x)
  def __radd__(self, x): return self._bin(Ops.ADD, x, True)
  def __sub__(self, x): return self._bin(Ops.SUB, x)
  def __rsub__(self, x): return self._bin(Ops.SUB, x, True)
  def __mul__(self, x): return self._bin(Ops.MUL, x)
  def __rmul__(self, x): return self._bin(Ops.MUL, x, True)

  def _pin(self):
    """This expression's value in the call being compiled, guarded to stay it (the graph is specialized on it)."""
    ctx = SizeContext.current()
    value = evaluate(self.uop, ctx.hints)
    ctx.decide(UOp(Ops.CMPEQ, dtypes.bool, (self.uop, UOp.const(self.uop.dtype, value))))
    ctx.pinned |= {n.arg[0] for n in self.uop.toposort() if n.op is Ops.DEFINE_VAR}
    return value


class Sym(_SizeExpr):
  """An integer size that is an expression of size variables (see the module docstring)."""
  __slots__ = ()

  @staticmethod
  def of(u: UOp):
    """The simplified expression as a Sym, or a plain int when it is a constant."""
    u = simplify(u)
    return u.arg if u.op is Ops.CONST else Sym(u)

  def __repr__(self): return f"Sym({_show(self.uop)})"
  __hash__ = _SizeExpr.__hash__  # (defining __eq__ below would otherwise drop it)

  def _bin(self, op: Ops, other, reverse: bool = False):
    o = _uop_of(other)
    if o is None: return NotImplemented
    a, b = (o, self.uop) if reverse else (self.uop, o)
    if op in (Ops.IDIV, Ops.MOD) and not (a.vmin >= 0 and b.vmin > 0):
      # Python's floor division and C's truncating one differ for negative operands: decide on the hint
      x, y = (other, int(self)) if reverse else (int(self), other)
      return x // y if op is Ops.IDIV else x % y
    return Sym.of(UOp(op, IDX, (a, b)))

  def __floordiv__(self, x): return self._bin(Ops.IDIV, x)
  def __rfloordiv__(self, x): return self._bin(Ops.IDIV, x, True)
  def __mod__(self, x): return self._bin(Ops.MOD, x)
  def __rmod__(self, x): return self._bin(Ops.MOD, x, True)
  def __neg__(self): return Sym.of(self.uop * UOp.const(IDX, -1))
  def __pos__(self): return self
  def __abs__(self): return self if self.uop.vmin >= 0 else abs(int(self))

  def _cmp(self, op: Ops, other, reverse: bool = False):
    o = _uop_of(other)
    if o is None: return NotImplemented
    a, b = (o, self.uop) if reverse else (self.uop, o)
    if a is b: return op in (Ops.CMPLE, Ops.CMPEQ)
    cond = simplify(UOp(op, dtypes.bool, (a, b)))
    if cond.op is Ops.CONST: return bool(cond.arg)
    diff = simplify(a - b)  # settled by the difference's bounds: s*4 - s*2 >= 0
    lo, hi = sign_bounds(diff)
    settled = {Ops.CMPLT: (hi < 0, lo >= 0), Ops.CMPLE: (hi <= 0, lo > 0),
               Ops.CMPEQ: (lo == hi == 0, lo > 0 or hi < 0), Ops.CMPNE: (lo > 0 or hi < 0, lo == hi == 0)}[op]
    if settled[0]: return True
    if settled[1]: return False
    return SizeContext.current().decide(cond)

  def __lt__(self, x): return self._cmp(Ops.CMPLT, x)
  def __le__(self, x): return self._cmp(Ops.CMPLE, x)
  def __gt__(self, x): return self._cmp(Ops.CMPLT, x, True)
  def __ge__(self, x): return self._cmp(Ops.CMPLE, x, True)
  def __eq__(self, x): return self._cmp(Ops.CMPEQ, x)
  def __ne__(self, x): return self._cmp(Ops.CMPNE, x)
  def __bool__(self): return self._cmp(Ops.CMPNE, 0)

  def __truediv__(self, x): return SymF(SymF.lift(self)) / x
  def __rtruediv__(self, x): return x / SymF(SymF.lift(self))

  def __index__(self) -> int: return self._pin()
  __int__ = __index__
  def __float__(self) -> float: return float(int(self))


class SymF(_SizeExpr):
  """A float computed from sizes (x.shape[0] / 2, BatchNorm's n / (n - 1)): a float64 expression of the size
  variables. It takes part in arithmetic and becomes a kernel's scalar operand (UOp.const); turning it into a
  Python float records that it equals its hint, as for a Sym."""
  __slots__ = ()

  def __repr__(self): return f"SymF({_show(self.uop)})"

  @staticmethod
  def lift(x) -> UOp | None:
    if isinstance(x, SymF): return x.uop
    if isinstance(x, Sym): return x.uop.cast(dtypes.float64)
    if isinstance(x, (int, float)) and not isinstance(x, bool): return UOp.const(dtypes.float64, x)
    return None

  def _bin(self, op: Ops, other, reverse: bool = False):
    o = SymF.lift(other)
    if o is None: return NotImplemented
    a, b = (o, self.uop) if reverse else (self.uop, o)
    return SymF(UOp(op, dtypes.float64, (a, b)))

  def __truediv__(self, x): return self._bin(Ops.FDIV, x)
  def __rtruediv__(self, x): return self._bin(Ops.FDIV, x, True)
  def __neg__(self): return SymF(UOp(Ops.NEG, dtypes.float64, (self.uop,)))
  def __float__(self) -> float: return float(self._pin())


import torch_uop.core.uop as _uop_module  # noqa: E402
_uop_module._symbolic_types = (Sym, SymF)


def sign_bounds(u: UOp) -> tuple:
  """Bounds of an index expression, tighter than interval arithmetic where it is a polynomial: every leaf x (a
  variable, or a div/mod it cannot see into) is written lo(x) + t with t >= 0 and the product expanded. When every
  coefficient is >= 0 the value is at least the constant term; when every one is <= 0, at most it
  (s0*s1 - s0 with s0, s1 >= 2 is 2 + t0 + 2*t1 + t0*t1 > 0, where intervals only say it is >= 4 - MAX_VAR)."""
  lo, hi = u.vmin, u.vmax
  poly = _poly(u)
  if poly is None: return lo, hi
  const = poly.pop((), 0)
  if all(c >= 0 for c in poly.values()): lo = max(lo, const)
  if all(c <= 0 for c in poly.values()): hi = min(hi, const)
  return lo, hi


def _poly(u: UOp, keep: list | None = None) -> dict | None:
  """u as {monomial (sorted leaf ids): coefficient} over leaves shifted by their lower bounds; None if not polynomial.
  x // c and x % c (x >= 0, constant c > 0) share a leaf m = x % c in [0, c): x // c = (x - m) / c, so that
  s - (s // 2)*2 >= 0 is seen (rational coefficients)."""
  keep = [] if keep is None else keep  # nodes whose ids name leaves stay alive while the ids are in use
  if u.op is Ops.CONST: return {(): u.arg}
  if u.op in (Ops.ADD, Ops.MUL):
    a, b = _poly(u.src[0], keep), _poly(u.src[1], keep)
    if a is None or b is None: return None
    if u.op is Ops.ADD:
      for m, c in b.items(): a[m] = a.get(m, 0) + c
      return a
    if len(a) * len(b) > 256: return None
    out: dict = {}
    for ma, ca in a.items():
      for mb, cb in b.items():
        m = tuple(sorted(ma + mb))
        out[m] = out.get(m, 0) + ca * cb
    return out
  if u.op in (Ops.IDIV, Ops.MOD) and u.src[1].op is Ops.CONST and u.src[1].arg > 0 and u.src[0].vmin >= 0:
    mod = UOp(Ops.MOD, u.dtype, u.src)
    keep.append(mod)
    if u.op is Ops.MOD: return {(id(mod),): 1}
    x = _poly(u.src[0], keep)
    if x is None: return None
    c = Fraction(1, u.src[1].arg)
    out = {m: coef * c for m, coef in x.items()}
    out[(id(mod),)] = out.get((id(mod),), 0) - c
    return out
  lo = u.vmin
  if not isinstance(lo, int) or lo <= u.dtype.min(): return None  # no useful lower bound
  keep.append(u)
  return {(id(u),): 1, (): lo}


def _show(u: UOp) -> str:
  if u.op is Ops.CONST: return str(u.arg)
  if u.op is Ops.DEFINE_VAR: return u.arg[0]
  sym = {Ops.ADD: "+", Ops.SUB: "-", Ops.MUL: "*", Ops.IDIV: "//", Ops.MOD: "%"}.get(u.op)
  if sym and len(u.src) == 2: return f"({_show(u.src[0])}{sym}{_show(u.src[1])})"
  return f"{u.op.name.lower()}({', '.join(_show(s) for s in u.src)})"
