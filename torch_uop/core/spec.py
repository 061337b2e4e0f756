"""The shape of kernel-level IR, checked between passes when asked (option `spec`, TORCH_UOP_SPEC=1).

`KERNEL_SPEC` is a PatternMatcher whose rules return whether a node is well formed: a node that some rule takes
and finds wrong, or that no rule takes, is an error. It covers what the op comments in core/uop.py promise of a
kernel's AST (codegen.build_kernel's `ast`) and its linear program (`program`): source counts, what a load or store
addresses, index and mask dtypes, operand dtypes of arithmetic and comparisons, RANGE and LOOP_VAR args.
`check_kernel(ast, program, where)` raises SpecError naming the pass and the first bad node (with its sources). The
check walks every node once: it is meant for debugging the compiler, not for every compile.
"""
from __future__ import annotations
from torch_uop.core.uop import UOp, Ops, UPat, PatternMatcher, RangeArg, KernelLoopVar, UNARY, BINARY, COMPARISON, pretty
from torch_uop.core.dtypes import dtypes

_ADDRESSED = (Ops.DEFINE_GLOBAL, Ops.DEFINE_LOCAL, Ops.AFTER)
_SAME_TYPED = (BINARY - COMPARISON - {Ops.SHL, Ops.SHR}) | {Ops.NEG, Ops.NOT}


class SpecError(AssertionError):
  """Kernel IR that breaks its spec: a compiler bug, reported with the pass after which it was found."""


def _index(u: UOp) -> bool: return u.dtype.is_int  # (dtypes.index is int64)


def _load(x: UOp) -> bool:
  buf, idx = x.src[0], x.src[1]
  return buf.op in _ADDRESSED and _index(idx) and (len(x.src) == 2 or x.src[2].dtype == dtypes.bool)


def _store(x: UOp) -> bool:
  return x.dtype == dtypes.void and x.src[0].op in (Ops.DEFINE_GLOBAL, Ops.DEFINE_LOCAL) and _index(x.src[1])


KERNEL_SPEC = PatternMatcher([
  # leaves
  (UPat((Ops.CONST, Ops.DEFINE_GLOBAL), name="x"), lambda x: not x.src),
  (UPat(Ops.DEFINE_LOCAL, name="x"), lambda x: not x.src and isinstance(x.arg, tuple) and len(x.arg) == 2),
  (UPat(Ops.DEFINE_VAR, name="x"), lambda x: isinstance(x.arg, tuple) and isinstance(x.arg[0], str)),
  # loops
  (UPat(Ops.RANGE, src=(UPat.var("n"),), name="x"), lambda x, n: isinstance(x.arg, RangeArg) and _index(n) and _index(x)),
  (UPat(Ops.ENDRANGE, src=(UPat(Ops.RANGE),), name="x"), lambda x: x.dtype == dtypes.void),
  (UPat(Ops.BREAK_UNLESS, src=(UPat.var("c"), UPat(Ops.RANGE)), name="x"), lambda x, c: c.dtype == dtypes.bool),
  (UPat(Ops.LOOP_VAR, name="x"), lambda x: not x.src and isinstance(x.arg, KernelLoopVar)),
  (UPat(Ops.LOOP, name="x"), lambda x: len(x.src) >= 2 and x.src[0].op is Ops.RANGE and x.src[1].dtype == dtypes.bool),
  # memory
  (UPat(Ops.LOAD, name="x"), lambda x: len(x.src) in (2, 3) and _load(x)),
  (UPat(Ops.STORE, name="x"), lambda x: len(x.src) == 3 and _store(x)),
  (UPat(Ops.AFTER, name="x"), lambda x: len(x.src) >= 1 and x.src[0].op is Ops.DEFINE_LOCAL),
  # reductions and accumulators
  (UPat(Ops.REDUCE, name="x"), lambda x: len(x.src) >= 2 and all(r.op is Ops.RANGE for r in x.src[1:]) and isinstance(x.arg, Ops)),
  (UPat(Ops.DEFINE_ACC, name="x"), lambda x: 1 <= len(x.src) <= 2),
  (UPat(Ops.ASSIGN, name="x"), lambda x: len(x.src) == 2 and x.src[0].op is Ops.DEFINE_ACC),
  (UPat(Ops.SINK, name="x"), lambda x: x.dtype == dtypes.void),
  # arithmetic: operands of the result's dtype, comparisons of two equal dtypes to bool, a bool select
  (UPat(tuple(_SAME_TYPED), name="x"), lambda x: all(s.dtype == x.dtype for s in x.src) and len(x.src) == (1 if x.op in UNARY else 2)),
  (UPat(tuple(COMPARISON), name="x"), lambda x: x.dtype == dtypes.bool and len(x.src) == 2 and x.src[0].dtype == x.src[1].dtype),
  (UPat((Ops.SHL, Ops.SHR), name="x"), lambda x: len(x.src) == 2 and x.src[0].dtype == x.dtype and x.dtype.is_int),
  (UPat(Ops.RECIP, name="x"), lambda x: len(x.src) == 1 and x.src[0].dtype == x.dtype and x.dtype.is_float),
  (UPat(Ops.WHERE, src=(UPat.var("c"), UPat.var("a"), UPat.var("b")), name="x"),
   lambda x, c, a, b: c.dtype == dtypes.bool and a.dtype == b.dtype == x.dtype),
  (UPat((Ops.CAST, Ops.BITCAST), name="x"), lambda x: len(x.src) == 1),
  (UPat(Ops.MATH, name="x"), lambda x: isinstance(x.arg, str) and 1 <= len(x.src) <= 2),
])


def check_kernel(ast: UOp, program: list[UOp], where: str) -> None:
  """Raise SpecError for the first node of `ast` or `program` (a kernel's) that KERNEL_SPEC does not admit."""
  for u in (*ast.toposort(), *program):
    if KERNEL_SPEC.rewrite(u) is not True:
      detail = "\n".join(f"  src {i}: {s.op.name}:{s.dtype.name} {s.arg!r}" for i, s in enumerate(u.src))
      raise SpecError(f"after pass {where}: {u.op.name}:{u.dtype.name} {u.arg!r} breaks the kernel IR spec\n{detail}\n"
                      f"{pretty(u, limit=40)}")
