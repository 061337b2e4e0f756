"""The renderer base: a kernel's linear program -> the text of its function, one driver for every dialect.

`Renderer.render_kernel` walks the program (codegen's Kernel.program) once, in order, and hands each node to the
renderer's `matcher`: a PatternMatcher whose rules take the kernel being rendered (a `KernelText`) and the node,
write the node's lines and return its value's name ("" for a statement). A node that already has a name (an index
a dialect rendered ahead of its place) or that the dialect renders inside another (`KernelText.skip`) is passed by.

`CONTROL_RULES` are shared by every dialect: they keep each reduction's and each loop state's accumulator (what a
DEFINE_ACC starts from, which accumulator an ASSIGN, LOOP_VAR, LOOP or REDUCE reads), and hand loops, breaks,
buffers, loads, stores and arithmetic to the dialect's hooks below. A dialect (llvmir.LLVMRenderer; cstyle's
OpenCLRenderer and CUDARenderer) writes the hooks and its spelling tables, and may put rules of its own before the
shared ones (`dialect_rules`: a vector load group, a transposing tile); a dialect rule that returns None passes the
node on to the next rule. It does not compile or run anything.
"""
from __future__ import annotations
from torch_uop.core.uop import UOp, Ops, UPat, PatternMatcher, KernelLoopVar
from torch_uop.core.codegen import reduce_identity


class KernelText:
  """One kernel being rendered: its program, each rendered node's value name, the accumulator of each reduction
  and loop state (`accs`, by the REDUCE or LOOP_VAR that owns it), the lines written so far, and each buffer's
  argument position (`arg_of`, by slot). A dialect subclasses it for what it keeps per kernel."""
  tmp_prefix = "t"
  indent_unit = "  "

  def __init__(self, renderer: Renderer, name: str, program: list[UOp], buffer_slots: list[int], local_size: int = 0):
    self.renderer, self.name, self.program, self.local_size = renderer, name, program, local_size
    self.arg_of = {slot: i for i, slot in enumerate(buffer_slots)}
    self.n_buffers = len(buffer_slots)
    self.names: dict[UOp, str] = {}
    self.accs: dict[UOp, str] = {}
    self.lines: list[str] = []
    self.skip: set[UOp] = set()
    self.counter = 0
    self.depth = 1  # the indentation of the next line

  def tmp(self, prefix: str | None = None) -> str:
    self.counter += 1
    return f"{self.tmp_prefix if prefix is None else prefix}{self.counter}"

  def emit(self, line: str) -> None: self.lines.append(self.indent_unit * self.depth + line)


def _loop_state(u: UOp) -> UOp:
  """The LOOP_VAR whose accumulator a LOOP_VAR or LOOP node reads (a LOOP is the state after its loop)."""
  return u if u.op is Ops.LOOP_VAR else UOp(Ops.LOOP_VAR, u.dtype, (), KernelLoopVar(*u.arg))


def _accumulator(k: KernelText, u: UOp) -> str:
  owner = u.src[0]  # a REDUCE, or the LOOP_VAR of a loop's state (src[1]: its initial value)
  start = u.src[1] if owner.op is Ops.LOOP_VAR else UOp.const(u.dtype, reduce_identity(owner.arg, u.dtype))
  k.accs[owner] = k.renderer.accumulator(k, u, owner, start)
  return ""


def _assign(k: KernelText, u: UOp) -> str:
  acc = k.accs[u.src[0].src[0]]
  if u.arg is None: k.renderer.set_state(k, u, acc, u.src[1])  # a loop state's update
  else: k.renderer.accumulate(k, u, acc, u.src[1])             # a reduction's step
  return ""


CONTROL_RULES = PatternMatcher([
  (UPat((Ops.CONST, Ops.SINK)), lambda k: ""),  # (constants are spelled where they are used)
  (UPat(Ops.DEFINE_GLOBAL, name="u"), lambda k, u: k.renderer.buffer(k, u, k.arg_of[u.arg])),
  (UPat(Ops.DEFINE_LOCAL, name="u"), lambda k, u: k.renderer.local_buffer(k, u)),
  (UPat(Ops.AFTER, name="u"), lambda k, u: k.names[u.src[0]]),
  (UPat(Ops.DEFINE_VAR, name="u"), lambda k, u: k.renderer.size_var(k, u)),
  (UPat(Ops.RANGE, name="u"), lambda k, u: k.renderer.open_loop(k, u) or ""),
  (UPat(Ops.ENDRANGE, name="u"), lambda k, u: k.renderer.close_loop(k, u.src[0]) or ""),
  (UPat(Ops.BREAK_UNLESS, name="u"), lambda k, u: k.renderer.break_unless(k, u.src[0], u.src[1]) or ""),
  (UPat(Ops.DEFINE_ACC, name="u"), _accumulator),
  (UPat(Ops.ASSIGN, name="u"), _assign),
  (UPat((Ops.LOOP_VAR, Ops.LOOP), name="u"), lambda k, u: k.renderer.read_state(k, u, k.accs[_loop_state(u)])),
  (UPat(Ops.REDUCE, name="u"), lambda k, u: k.renderer.reduce_result(k, u, k.accs[u])),
  (UPat(Ops.LOAD, name="u"), lambda k, u: k.renderer.load(k, u)),
  (UPat(Ops.STORE, name="u"), lambda k, u: k.renderer.store(k, u) or ""),
  (UPat(name="u"), lambda k, u: k.renderer.alu(k, u)),  # arithmetic, comparisons, casts, math functions
])


class Renderer:
  """The shared driver. A dialect sets `name`, `kernel_class`, `dialect_rules`, and writes the hooks."""
  name = "base"
  kernel_class = KernelText
  dialect_rules: list = []
  symbol_prefix = " "  # what comes before a function's name where it is defined (LLVM: "@")

  @classmethod
  def rename(cls, source: str, old: str, new: str) -> str:
    """A rendered function's text under another name."""
    return source.replace(f"{cls.symbol_prefix}{old}(", f"{cls.symbol_prefix}{new}(", 1)

  def __init_subclass__(cls, **kw):
    super().__init_subclass__(**kw)
    cls.matcher = PatternMatcher(list(cls.dialect_rules)) + CONTROL_RULES

  def render(self, kernel) -> str:
    """A codegen.Kernel's function."""
    return self.render_kernel(kernel.name, kernel.program, kernel.argument_ids, kernel.local_size)

  def render_kernel(self, name: str, program: list[UOp], buffer_slots: list[int], local_size: int = 0, **options) -> str:
    """The function `name(buffers in buffer_slots order)`; `local_size` work-items per group on a GPU-style device."""
    k = self.begin(self.kernel_class(self, name, program, buffer_slots, local_size), **options)
    for u in program:
      if u in k.names or u in k.skip: continue
      out = self.matcher.translate(u, k)
      if out is None: raise NotImplementedError(f"{self.name} renderer: no rule for {u.op}")
      if out: k.names[u] = out
    return self.finish(k)

  # ----------------------------------------------------------------- hooks (dialect)
  def begin(self, k: KernelText, **options) -> KernelText:
    """Per-kernel analysis before the walk (what to vectorize, which accesses group); returns k."""
    return k

  def finish(self, k: KernelText) -> str:
    """The function's text: signature, declarations, k.lines."""
    raise NotImplementedError

  def _missing(self, what: str): raise NotImplementedError(f"{self.name} renderer: {what}")
  def buffer(self, k: KernelText, u: UOp, position: int) -> str: self._missing("buffers")
  def local_buffer(self, k: KernelText, u: UOp) -> str: self._missing("kernel-local buffers")
  def size_var(self, k: KernelText, u: UOp) -> str: self._missing("size variables")
  def open_loop(self, k: KernelText, r: UOp) -> str | None: self._missing("loops")
  def close_loop(self, k: KernelText, r: UOp) -> None: self._missing("loops")
  def break_unless(self, k: KernelText, cond: UOp, r: UOp) -> None: self._missing("breaks")
  def accumulator(self, k: KernelText, u: UOp, owner: UOp, start: UOp) -> str: self._missing("accumulators")
  def set_state(self, k: KernelText, u: UOp, acc: str, value: UOp) -> None: self._missing("loop state")
  def accumulate(self, k: KernelText, u: UOp, acc: str, value: UOp) -> None: self._missing("reductions")
  def read_state(self, k: KernelText, u: UOp, acc: str) -> str: self._missing("loop state")
  def reduce_result(self, k: KernelText, u: UOp, acc: str) -> str: self._missing("reductions")
  def load(self, k: KernelText, u: UOp) -> str: self._missing("loads")
  def store(self, k: KernelText, u: UOp) -> None: self._missing("stores")
  def alu(self, k: KernelText, u: UOp) -> str: self._missing(f"{u.op}")
