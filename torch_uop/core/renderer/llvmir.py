"""LLVM IR renderer: linear UOp program -> text of one LLVM function.

`LLVMRenderer` is a renderer/base.py Renderer: the shared driver walks the program and calls its hooks. The
function takes one pointer per buffer (`ptr noalias`), in Kernel.argument_ids order, then the bounds `[lo, hi)` of
its thread-split loop (see core/opt.py). Loops are rendered with their counters and accumulators in allocas; LLVM's
mem2reg/SROA turn them into phis, and its loop passes vectorize. Elementwise ops are table-driven: `_binary`'s
tables for instructions, `MATH_FUNCTIONS` for intrinsics and libm calls. Bool is i1 in registers and i8 in memory. It writes vectors itself
in two places: the nodes a SIMD lane reaches (codegen.vector_lane) are LLVM vectors, their accesses vector loads and
stores at the index of lane 0, scalar operands broadcast and libm functions called lane by lane; and a transposing
tile (renderer/transpose.py) is vector loads, shuffles, and for a plain copy vector stores.
It does not compile or run anything.
"""
from __future__ import annotations
import math
import struct
from torch_uop.core.uop import UOp, Ops, UPat, AxisKind
from torch_uop.core.dtypes import DType, dtypes
from torch_uop.core.codegen import affine_terms, vector_widths, is_vector_lane, whole_block
from torch_uop.core.renderer.transpose import find_transpose_tiles, butterfly_masks
from torch_uop.core.symbolic import base_and_offset
from torch_uop.core.renderer.base import KernelText, Renderer

LLVM_TYPE = {
  dtypes.bool: "i1", dtypes.int8: "i8", dtypes.uint8: "i8", dtypes.int16: "i16", dtypes.int32: "i32",
  dtypes.int64: "i64", dtypes.float16: "half", dtypes.bfloat16: "bfloat", dtypes.float32: "float",
  dtypes.float64: "double",
}
_FSUFFIX = {dtypes.float16: "f16", dtypes.bfloat16: "bf16", dtypes.float32: "f32", dtypes.float64: "f64"}

# name -> (llvm intrinsic base or None, libm name for double); float32 libm adds 'f'
MATH_FUNCTIONS = {
  "sqrt": ("llvm.sqrt", "sqrt"), "exp": ("llvm.exp", "exp"), "exp2": ("llvm.exp2", "exp2"),
  "log": ("llvm.log", "log"), "log2": ("llvm.log2", "log2"), "log10": ("llvm.log10", "log10"),
  "sin": ("llvm.sin", "sin"), "cos": ("llvm.cos", "cos"), "tan": (None, "tan"),
  "abs": ("llvm.fabs", "fabs"), "floor": ("llvm.floor", "floor"), "ceil": ("llvm.ceil", "ceil"),
  "trunc": ("llvm.trunc", "trunc"), "round": ("llvm.roundeven", "roundeven"),
  "tanh": (None, "tanh"), "erf": (None, "erf"), "erfc": (None, "erfc"), "asin": (None, "asin"),
  "acos": (None, "acos"), "atan": (None, "atan"), "sinh": (None, "sinh"), "cosh": (None, "cosh"),
  "asinh": (None, "asinh"), "acosh": (None, "acosh"), "atanh": (None, "atanh"), "expm1": (None, "expm1"),
  "log1p": (None, "log1p"), "lgamma": (None, "lgamma"), "cbrt": (None, "cbrt"),
  "pow": ("llvm.pow", "pow"), "atan2": (None, "atan2"), "fmod": (None, "fmod"),
  "copysign": ("llvm.copysign", "copysign"), "nextafter": (None, "nextafter"), "hypot": (None, "hypot"),
}


def _fconst(v: float, dt: DType) -> str:
  # LLVM wants half/bfloat constants as hex of the exact value in their own format
  if dt == dtypes.float16: return f"0xH{_half_bits(v):04X}"
  if dt == dtypes.bfloat16: return f"0xR{_bfloat16_bits(v):04X}"
  if dt == dtypes.float32: v = struct.unpack("f", struct.pack("f", v))[0] if math.isfinite(v) else v
  return "0x" + struct.pack(">d", v).hex().upper()


def _as_float32(v: float) -> float:
  """v rounded to float32 (past its range: +-inf), as torch first converts a Python float for a 16-bit dtype."""
  try: return struct.unpack("<f", struct.pack("<f", v))[0]
  except OverflowError: return math.copysign(math.inf, v)


def _half_bits(v: float) -> int:
  """IEEE half bits of v as torch converts a Python float: to float32, then to nearest even (overflow to +-inf)."""
  f = _as_float32(v)
  try: return struct.unpack("<H", struct.pack("<e", f))[0]
  except OverflowError: return 0x7C00 | (0x8000 if f < 0 else 0)


def _bfloat16_bits(v: float) -> int:
  """bfloat16 bits of v as torch converts a Python float: to float32, then to nearest even on its bits (NaN: 0x7FC0)."""
  if math.isnan(v): return 0x7FC0
  f32 = struct.unpack("<I", struct.pack("<f", _as_float32(v)))[0]
  return ((f32 + 0x7FFF + ((f32 >> 16) & 1)) >> 16) & 0xFFFF


def render_const(v, dt: DType) -> str:
  if dt.is_bool: return "true" if v else "false"
  if dt.is_int: return str(int(v))
  return _fconst(float(v), dt)


def _vtype(dt: DType, w: int = 0) -> str:
  """The LLVM type of a dtype's value, or of a vector of w of them."""
  return f"<{w} x {LLVM_TYPE[dt]}>" if w else LLVM_TYPE[dt]


def _suffix(dt: DType, w: int = 0) -> str:
  """An overloaded intrinsic's type suffix (f32, i64; v16f32 for a vector)."""
  base = _FSUFFIX[dt] if dt.is_float else LLVM_TYPE[dt]
  return f"v{w}{base}" if w else base


def _binary(op: Ops, dt: DType, a: str, b: str, w: int = 0, reassociate: bool = False) -> str:
  """A binary op's instruction; `dt` is its operands' dtype. `reassociate`: a float add or multiply that LLVM may
  reorder with the ones around it (a reduction's step; nsz: the sign of a zero sum may differ)."""
  t = _vtype(dt, w)
  if dt.is_float:
    # contract: a multiply feeding an add may become one fused multiply-add (one rounding, as BLAS does)
    flags = "reassoc nsz contract" if reassociate else "contract"
    ins = {Ops.ADD: f"fadd {flags}", Ops.SUB: "fsub contract", Ops.MUL: f"fmul {flags}", Ops.FDIV: "fdiv",
           Ops.MOD: "frem"}.get(op)
    if ins: return f"{ins} {t} {a}, {b}"
    cmp = {Ops.CMPLT: "olt", Ops.CMPLE: "ole", Ops.CMPEQ: "oeq", Ops.CMPNE: "une"}.get(op)
    if cmp: return f"fcmp {cmp} {t} {a}, {b}"
    if op in (Ops.MAX, Ops.MIN):
      return f"call {t} @llvm.{'maximum' if op is Ops.MAX else 'minimum'}.{_suffix(dt, w)}({t} {a}, {t} {b})"
  else:
    u = dt.is_unsigned or dt.is_bool
    ins = {Ops.ADD: "add", Ops.SUB: "sub", Ops.MUL: "mul", Ops.IDIV: "udiv" if u else "sdiv",
           Ops.MOD: "urem" if u else "srem", Ops.AND: "and", Ops.OR: "or", Ops.XOR: "xor", Ops.SHL: "shl",
           Ops.SHR: "lshr" if u else "ashr"}.get(op)
    if dt.is_bool and op in (Ops.ADD, Ops.MAX): ins = "or"
    if dt.is_bool and op in (Ops.MUL, Ops.MIN): ins = "and"
    if ins: return f"{ins} {t} {a}, {b}"
    cmp = {Ops.CMPLT: "ult" if u else "slt", Ops.CMPLE: "ule" if u else "sle", Ops.CMPEQ: "eq", Ops.CMPNE: "ne"}.get(op)
    if cmp: return f"icmp {cmp} {t} {a}, {b}"
    if op in (Ops.MAX, Ops.MIN):
      name = ("u" if u else "s") + ("max" if op is Ops.MAX else "min")
      return f"call {t} @llvm.{name}.{_suffix(dt, w)}({t} {a}, {t} {b})"
  raise NotImplementedError(f"LLVM renderer: {op} on {dt}")


def _cast(src: DType, dst: DType, x: str, w: int = 0) -> str:
  ts, td = _vtype(src, w), _vtype(dst, w)
  if src == dst: return f"bitcast {ts} {x} to {td}" if ts == td else None
  if dst.is_bool:
    zero = "zeroinitializer" if w else _fconst(0.0, src) if src.is_float else "0"
    return f"fcmp une {ts} {x}, {zero}" if src.is_float else f"icmp ne {ts} {x}, {zero}"
  if src.is_float and dst.is_float:
    return f"{'fpext' if src.itemsize < dst.itemsize or (src, dst) == (dtypes.bfloat16, dtypes.float16) else 'fptrunc'} {ts} {x} to {td}"
  if src.is_float: return f"{'fptoui' if dst.is_unsigned else 'fptosi'} {ts} {x} to {td}"
  if dst.is_float: return f"{'uitofp' if src.is_unsigned or src.is_bool else 'sitofp'} {ts} {x} to {td}"
  if src.itemsize == dst.itemsize and not src.is_bool: return f"bitcast {ts} {x} to {td}"
  if dst.itemsize < src.itemsize and not src.is_bool: return f"trunc {ts} {x} to {td}"
  return f"{'zext' if src.is_unsigned or src.is_bool else 'sext'} {ts} {x} to {td}"


# the loop metadata LLVMKernel's loops name (_loop_ids); FORCED_SIMD_INTERLEAVE is read as each kernel is rendered
def _loop_metadata() -> str:
  return ("!0 = distinct !{!0, !1}\n!1 = !{!\"llvm.loop.mustprogress\"}\n"
          "!2 = distinct !{!2, !1, !3}\n!3 = !{!\"llvm.loop.vectorize.enable\", i1 false}\n"
          + ("!4 = distinct !{!4, !1, !5}\n" if FORCED_SIMD_INTERLEAVE is None else
             f"!4 = distinct !{{!4, !1, !5, !6}}\n!6 = !{{!\"llvm.loop.interleave.count\", i32 {FORCED_SIMD_INTERLEAVE}}}\n")
          + "!5 = !{!\"llvm.loop.vectorize.enable\", i1 true}\n"
          "!7 = distinct !{!7, !1, !8}\n!8 = !{!\"llvm.loop.unroll.disable\"}\n!9 = distinct !{!9, !1, !3, !8}\n")


class LLVMKernel(KernelText):
  """One LLVM function being rendered: KernelText's state, plus its allocas and declarations, the vector width of
  each node of a SIMD tile (codegen.vector_widths), the block being written (a phi names its predecessors), and
  what LLVMRenderer.begin found about its loops and accesses."""
  tmp_prefix = "%t"

  def __init__(self, *args):
    super().__init__(*args)
    self.allocas: list[str] = []
    self.declares: set[str] = set()
    self.width: dict[UOp, int] = {}  # node -> lanes, for the vectors of a SIMD tile (codegen.vector_widths)
    self.splats: dict = {}  # (scalar name, lanes) -> its vector, in the current block
    self.block = "start"  # the basic block being emitted
    self.loops: dict[UOp, str] = {}  # RANGE -> its label stem

  def label(self, name: str):
    self.lines.append(f"{name}:")
    self.block = name
    self.splats.clear()  # (a block's values may not reach the next)

  def value(self, u: UOp) -> str:
    if u.op is Ops.CONST: return render_const(u.arg, u.dtype)
    if is_vector_lane(u): return "<" + ", ".join(f"i64 {i}" for i in range(u.src[0].arg)) + ">"
    return self.names[u]

  def operand(self, u: UOp, w: int) -> str:
    """u's value where a vector of w lanes is wanted (w 0: a scalar): a scalar is broadcast to every lane."""
    if not w or u in self.width: return self.value(u)
    t = LLVM_TYPE[u.dtype]
    if u.op is Ops.CONST: return "<" + ", ".join([f"{t} {render_const(u.arg, u.dtype)}"] * w) + ">"
    key = (self.names[u], w)
    if key not in self.splats:
      one, out = self.tmp(), self.tmp()
      self.emit(f"{one} = insertelement <{w} x {t}> poison, {t} {self.names[u]}, i32 0")
      self.emit(f"{out} = shufflevector <{w} x {t}> {one}, <{w} x {t}> poison, <{w} x i32> zeroinitializer")
      self.splats[key] = out
    return self.splats[key]

  def ty(self, u: UOp) -> str: return _vtype(u.dtype, self.width.get(u, 0))

  def declare(self, sig: str): self.declares.add(sig)


def _tile_load(k: LLVMKernel, u: UOp) -> str | None:
  """A load a transposing tile reads (renderer/transpose.py): its lane of the tile's transposed vectors."""
  if u not in k.tile_loads: return None
  at = k.tile_loads[u]
  if at.tile not in k.columns: k.columns[at.tile] = _render_transpose(k, at.tile)
  out = k.tmp()
  k.emit(f"{out} = extractelement <{at.tile.lanes} x {LLVM_TYPE[u.dtype]}> {k.columns[at.tile][at.column]}, i32 {at.lane}")
  return out


def _tile_store(k: LLVMKernel, u: UOp) -> str | None:
  """A store of a run a transposing copy stores as one vector: the run's last store writes the vector."""
  if u not in k.vector_stored: return None
  if u in k.vector_store_at:
    tile, j, run = k.vector_store_at[u]
    t = LLVM_TYPE[u.src[2].dtype]
    ptr = k.tmp()
    k.emit(f"{ptr} = getelementptr inbounds {t}, ptr {k.value(run[0].src[0])}, i64 {k.value(run[0].src[1])}")
    k.emit(f"store <{tile.lanes} x {t}> {k.columns[tile][j]}, ptr {ptr}, align {u.src[2].dtype.itemsize}")
  return ""


class LLVMRenderer(Renderer):
  """LLVM IR, one function per kernel (see the module's docstring)."""
  name = "llvm"
  kernel_class = LLVMKernel
  symbol_prefix = "@"
  dialect_rules = [(UPat(Ops.LOAD, name="u"), _tile_load), (UPat(Ops.STORE, name="u"), _tile_store)]

  def render(self, kernel) -> str:
    """A codegen.Kernel's LLVM function. A kernel whose output loops were reordered (opt.KernelOpts.loop_order) has
    its SIMD on the innermost loop only: LLVM would otherwise unroll that loop fully and vectorize the one around
    it, with gathers and scatters."""
    return self.render_kernel(kernel.name, kernel.program, kernel.argument_ids,
                              innermost_simd=bool(kernel.opts and kernel.opts.loop_order))

  def begin(self, k: LLVMKernel, innermost_simd: bool = False) -> LLVMKernel:
    program = k.program
    k.width = vector_widths(program)
    # SIMD across upcast outputs (a serial reduce loop, or an output stored as vectors): no loop of the kernel is for
    # LLVM to vectorize (a staged slab's copy loops aside)
    serial = any(u.op is Ops.RANGE and u.arg.kind == AxisKind.REDUCE_SERIAL or u.op is Ops.STORE and u in k.width and
                 u.src[0].op is Ops.DEFINE_GLOBAL for u in program)
    innermost = [u for u in program if u.op is Ops.RANGE][-1:] if innermost_simd else []
    # (a staged slab's copy loops are LLVM's to vectorize whatever the kernel around them does)
    scalar_loops = {u for u in program if u.op is Ops.RANGE and u.arg.kind != AxisKind.STAGE and
                    (u.arg.kind in (AxisKind.REDUCE_SERIAL, AxisKind.LOOP) or serial or (innermost_simd and u not in innermost))}
    k.loop_ids = _loop_ids(program, scalar_loops, _forced_simd_loops(program, scalar_loops))
    # a vector load's or store's index, ADD(its first element's index, the lane), is read for its first operand only
    operands = {s for u in program for i, s in enumerate(u.src) if i != 1 or u.op not in (Ops.LOAD, Ops.STORE)}
    k.skip = {u.src[1] for u in program if u.op in (Ops.LOAD, Ops.STORE) and u.src[1] in k.width} - operands
    # (transposing copies are scalar: a staged slab's copy beside the vector tile)
    k.tile_loads = find_transpose_tiles([u for u in program if u not in k.width] if k.width else program)
    k.lane_columns = _strided_columns(program, k.width)
    k.column_vectors = {}  # a strided group's first load -> its transposed vectors' names
    k.columns = {}  # TransposeTile -> its transposed vectors' names
    k.vector_store_at = {}  # the last store of a run stored as one vector -> (tile, column, the run)
    position = {u: i for i, u in enumerate(program)} if k.tile_loads else {}
    for tile in {id(at.tile): at.tile for at in k.tile_loads.values()}.values():
      for j, run in tile.vector_stores.items(): k.vector_store_at[max(run, key=position.__getitem__)] = (tile, j, run)
    k.vector_stored = {s for _, _, run in k.vector_store_at.values() for s in run}
    return k

  def buffer(self, k: LLVMKernel, u: UOp, position: int) -> str: return f"%b{position}"

  def local_buffer(self, k: LLVMKernel, u: UOp) -> str:
    k.allocas.append(f"%l{u.arg[0]} = alloca [{u.arg[1]} x {'i8' if u.dtype.is_bool else LLVM_TYPE[u.dtype]}], align 64")
    return f"%l{u.arg[0]}"

  def size_var(self, k: LLVMKernel, u: UOp) -> str:
    """A size variable: element arg[3] of the kernel's size-variable buffer (src[0])."""
    ptr, val = k.tmp(), k.tmp()
    k.emit(f"{ptr} = getelementptr inbounds i64, ptr {k.value(u.src[0])}, i64 {u.arg[3]}")
    k.emit(f"{val} = load i64, ptr {ptr}")
    return val

  def open_loop(self, k: LLVMKernel, r: UOp) -> str:
    lid = k.loops[r] = f"r{len(k.loops)}"
    split = r.arg.kind == AxisKind.SPLIT  # the thread-split loop runs [lo, hi), given by the caller
    k.allocas.append(f"%{lid}.addr = alloca i64")
    k.emit(f"store i64 {'%lo' if split else 0}, ptr %{lid}.addr")
    k.emit(f"br label %{lid}.cond")
    k.label(f"{lid}.cond")
    k.emit(f"%{lid} = load i64, ptr %{lid}.addr")
    k.emit(f"%{lid}.c = icmp slt i64 %{lid}, {'%hi' if split else k.value(r.src[0])}")
    k.emit(f"br i1 %{lid}.c, label %{lid}.body, label %{lid}.exit")
    k.label(f"{lid}.body")
    return f"%{lid}"

  def close_loop(self, k: LLVMKernel, r: UOp) -> None:
    lid = k.loops[r]
    k.emit(f"%{lid}.next = add nsw i64 %{lid}, 1")
    k.emit(f"store i64 %{lid}.next, ptr %{lid}.addr")
    k.emit(f"br label %{lid}.cond, !llvm.loop !{k.loop_ids[r]}")
    k.label(f"{lid}.exit")

  def break_unless(self, k: LLVMKernel, cond: UOp, r: UOp) -> None:
    go = k.tmp()[1:]
    k.emit(f"br i1 {k.value(cond)}, label %{go}, label %{k.loops[r]}.exit")
    k.label(go)

  def accumulator(self, k: LLVMKernel, u: UOp, owner: UOp, start: UOp) -> str:
    t, w = k.ty(u), k.width.get(u, 0)
    a = f"%acc{len(k.accs)}"
    k.allocas.append(f"{a} = alloca {t}")
    k.emit(f"store {t} {k.operand(start, w)}, ptr {a}")
    if _nan_tracked(owner):
      k.allocas.append(f"{a}.nan = alloca {_vtype(dtypes.bool, w)}")
      k.emit(f"store {_vtype(dtypes.bool, w)} {'zeroinitializer' if w else 'false'}, ptr {a}.nan")
    return a

  def set_state(self, k: LLVMKernel, u: UOp, acc: str, value: UOp) -> None:
    k.emit(f"store {LLVM_TYPE[u.dtype]} {k.value(value)}, ptr {acc}")

  def read_state(self, k: LLVMKernel, u: UOp, acc: str) -> str:
    r = k.tmp()
    k.emit(f"{r} = load {LLVM_TYPE[u.dtype]}, ptr {acc}")
    return r

  def accumulate(self, k: LLVMKernel, u: UOp, acc: str, value: UOp) -> None:
    t, w = k.ty(u), k.width.get(u, 0)
    if _nan_tracked(u.src[0].src[0]):
      # a float max/min: maxnum/minnum (LLVM vectorizes those reductions; maximum it does not) and an OR of
      # "this value is NaN", which the result reads: NaN propagates as in eager
      v, bt = k.operand(value, w), _vtype(dtypes.bool, w)
      fn = f"llvm.{'maxnum' if u.arg is Ops.MAX else 'minnum'}.{_suffix(u.dtype, w)}"
      k.declare(f"declare {t} @{fn}({t}, {t})")
      old, new, isnan, seen, seen2 = k.tmp(), k.tmp(), k.tmp(), k.tmp(), k.tmp()
      k.emit(f"{old} = load {t}, ptr {acc}")
      # nnan: a NaN input makes the running value poison, but then the flag is set and the result is NaN itself;
      # nsz: -0 and +0 tie either way (they compare equal). With both, LLVM vectorizes the reduction
      k.emit(f"{new} = call nnan nsz {t} @{fn}({t} {old}, {t} {v})")
      k.emit(f"store {t} {new}, ptr {acc}")
      k.emit(f"{isnan} = fcmp uno {t} {v}, {v}")
      k.emit(f"{seen} = load {bt}, ptr {acc}.nan")
      k.emit(f"{seen2} = or {bt} {seen}, {isnan}")
      k.emit(f"store {bt} {seen2}, ptr {acc}.nan")
      return
    old, new = k.tmp(), k.tmp()
    k.emit(f"{old} = load {t}, ptr {acc}")
    # reassociate: LLVM may reorder a float sum or product so the reduce loop vectorizes (as eager's and Inductor's do)
    k.emit(f"{new} = {_binary(u.arg, u.dtype, old, k.operand(value, w), w, reassociate=True)}")
    k.emit(f"store {t} {new}, ptr {acc}")
    _maybe_declare_minmax(k, u.arg, u.dtype, w)

  def reduce_result(self, k: LLVMKernel, u: UOp, acc: str) -> str:
    r, t, w = k.tmp(), k.ty(u), k.width.get(u, 0)
    k.emit(f"{r} = load {t}, ptr {acc}")
    if not _nan_tracked(u): return r
    seen, out, bt = k.tmp(), k.tmp(), _vtype(dtypes.bool, w)
    k.emit(f"{seen} = load {bt}, ptr {acc}.nan")
    k.emit(f"{out} = select {bt} {seen}, {t} {k.operand(UOp.const(u.dtype, math.nan), w)}, {t} {r}")
    return out

  def load(self, k: LLVMKernel, u: UOp) -> str:
    w = k.width.get(u, 0)
    if w and _lane_step(u) != 1: return _strided_load(k, u, w, k.lane_columns.get(u), k.column_vectors)
    buf, idx = k.value(u.src[0]), _first_index(k, u, w)
    mem_t = "i8" if u.dtype.is_bool else LLVM_TYPE[u.dtype]
    vt = f"<{w} x {mem_t}>" if w else mem_t
    ptr, val = k.tmp(), k.tmp()
    if len(u.src) == 3 and not w:
      # a gated scalar read as a branch around the load, its value 0 where the gate is false: the loop
      # vectorizer turns that into a masked vector load where the index is contiguous (a padded row) and a
      # gather only where it is not; a select of the index would make every contiguous read a gather
      before, taken, join = k.block, k.tmp()[1:], k.tmp()[1:]
      k.emit(f"br i1 {k.value(u.src[2])}, label %{taken}, label %{join}")
      k.label(taken)
      k.emit(f"{ptr} = getelementptr inbounds {mem_t}, ptr {buf}, i64 {idx}")
      loaded = k.tmp()
      k.emit(f"{loaded} = load {vt}, ptr {ptr}")
      k.emit(f"br label %{join}")
      k.label(join)
      k.emit(f"{val} = phi {vt} [{loaded}, %{taken}], [{'0' if u.dtype.is_bool else render_const(0, u.dtype)}, %{before}]")
    else:
      if len(u.src) == 3:
        safe = k.tmp()
        k.emit(f"{safe} = select i1 {k.value(u.src[2])}, i64 {idx}, i64 0")
        idx = safe
      k.emit(f"{ptr} = getelementptr inbounds {mem_t}, ptr {buf}, i64 {idx}")
      k.emit(f"{val} = load {vt}, ptr {ptr}" + (f", align {max(1, u.dtype.itemsize)}" if w else ""))
    if u.dtype.is_bool:
      b = k.tmp()
      k.emit(f"{b} = icmp ne {vt} {val}, {'zeroinitializer' if w else 0}")
      val = b
    return val

  def store(self, k: LLVMKernel, u: UOp) -> None:
    buf, _, val = u.src
    w = k.width.get(u, 0)
    v = k.operand(val, w)
    mem_t = LLVM_TYPE[val.dtype]
    if val.dtype.is_bool:
      z = k.tmp()
      k.emit(f"{z} = zext {_vtype(dtypes.bool, w)} {v} to {f'<{w} x i8>' if w else 'i8'}")
      v, mem_t = z, "i8"
    ptr = k.tmp()
    k.emit(f"{ptr} = getelementptr inbounds {mem_t}, ptr {k.value(buf)}, i64 {_first_index(k, u, w)}")
    k.emit(f"store {f'<{w} x {mem_t}>' if w else mem_t} {v}, ptr {ptr}" + (f", align {max(1, val.dtype.itemsize)}" if w else ""))

  def alu(self, k: LLVMKernel, u: UOp) -> str: return _render_alu(k, u)

  def finish(self, k: LLVMKernel) -> str:
    body = "\n".join(k.lines)
    allocas = "\n".join("  " + a for a in k.allocas)
    args = ", ".join([f"ptr noalias %b{i}" for i in range(k.n_buffers)] + ["i64 %lo", "i64 %hi"])
    decls = "\n".join(sorted(k.declares))
    # noinline: the launchers (runtime/cpu.py) call the kernel; inlined into each of them, LLVM would optimize and
    # emit the body three times, the single-thread launcher's copy with constant loop bounds that it unrolls in full
    return (f"{decls}\n\ndefine void @{k.name}({args}) #0 {{\nentry:\n{allocas}\n  br label %start\nstart:\n{body}\n"
            f"  ret void\n}}\n\nattributes #0 = {{ nounwind noinline }}\n" + _loop_metadata())


def _render_transpose(f: LLVMKernel, tile) -> list:
  """A transpose tile's rows as vector loads, transposed by shuffles (renderer/transpose.py): the names of the
  transposed vectors, vector j holding position j of every row."""
  t = LLVM_TYPE[tile.rows[0].dtype]
  vt = f"<{tile.lanes} x {t}>"
  vectors = []
  for row in tile.rows:
    _ensure_rendered(f, row.src[1])
    ptr, vec = f.tmp(), f.tmp()
    f.emit(f"{ptr} = getelementptr inbounds {t}, ptr {f.value(row.src[0])}, i64 {f.value(row.src[1])}")
    f.emit(f"{vec} = load {vt}, ptr {ptr}, align {tile.rows[0].dtype.itemsize}")
    vectors.append(vec)
  return _butterfly(f, vectors, vt, tile.lanes)


def _butterfly(f: LLVMKernel, vectors: list, vt: str, lanes: int) -> list:
  """`lanes` vectors of `lanes` elements (type vt) transposed by shuffles: vector j of the result holds element j of
  every input, in input order."""
  for stage in butterfly_masks(lanes):
    new = list(vectors)
    for i, j, low, high in stage:
      for dst, mask in ((i, low), (j, high)):
        new[dst] = f.tmp()
        m = ", ".join(f"i32 {c}" for c in mask)
        f.emit(f"{new[dst]} = shufflevector {vt} {vectors[i]}, {vt} {vectors[j]}, <{lanes} x i32> <{m}>")
    vectors = new
  return vectors


def _ensure_rendered(f: LLVMKernel, u: UOp) -> None:
  """Render an index expression (arithmetic over values already rendered) ahead of its place in the program."""
  if u.op is Ops.CONST or u in f.names: return
  for s in u.src: _ensure_rendered(f, s)
  f.names[u] = _render_alu(f, u)


def _loop_ids(program: list, scalar_loops: set, forced: set) -> dict:
  """Each loop's !llvm.loop metadata: !0 LLVM may vectorize it; !2 keep it scalar (SIMD runs across upcast outputs
  instead); !4 vectorize it (_forced_simd_loops); !7 and !9 (scalar) for a loop around other loops: LLVM must not
  unroll it, and must not vectorize it where it steps a load or store by more than one element. Unrolled in full, a
  few short loops (a channel's 7x7 pixels, a 5x5 window around a reduction) would copy every loop inside it, and the
  loop around them would become the innermost: vectorized across channels, each lane a scalar load. Such modules took
  LLVM 0.2-0.5 s each."""
  nested, open_loops = set(), []
  for u in program:
    if u.op is Ops.RANGE:
      nested.update(open_loops)
      open_loops.append(u)
    elif u.op is Ops.ENDRANGE: open_loops.remove(u.src[0])
  memo: dict = {}
  strided = {r for u in program if u.op in (Ops.LOAD, Ops.STORE)
             for r, step in _steps(u.src[1], memo).items() if r in nested and (step is None or abs(step) > 1)}
  ids = {}
  for u in program:
    if u.op is not Ops.RANGE: continue
    if u in nested: ids[u] = 9 if u in scalar_loops or u in strided else 7
    else: ids[u] = 2 if u in scalar_loops else 4 if u in forced else 0
  return ids


def _steps(u: UOp, memo: dict) -> dict:
  """How far an index moves per iteration of each loop it depends on; None where it does not move by a constant
  (a loop read through a division, a minimum, a loaded value)."""
  return affine_terms(u, memo, free=lambda v: {r: None for s in v.src for r in _steps(s, memo)})


FORCED_SIMD_MIN_FLOAT_OPS = 16  # an elementwise kernel with this much float math per element vectorizes whatever it reads
# Vector iterations a forced-SIMD loop runs side by side (None: LLVM's cost model decides, which for bodies this large
# interleaves none). Such a loop's element is a long dependency chain (range reduction, a polynomial, scaling, blends);
# on a Zen 1 two iterations at a time made exp, sigmoid and tanh 5-11% faster but erf and GELU 10-19% slower (more
# constants than registers), so it stays LLVM's until measured on more CPUs (benchmarks/bench_math.py --interleave).
FORCED_SIMD_INTERLEAVE: int | None = None


def _forced_simd_loops(program: list, scalar_loops: set) -> set:
  """The innermost loop of a kernel without reductions whose element computes at least FORCED_SIMD_MIN_FLOAT_OPS
  float operations (an erf, an exp, GELU's backward), marked for LLVM to vectorize whatever its cost model says: where
  a load or the store is strided (a transposing kernel, ConvNeXt's GELU backward from channels-last into NCHW) the
  model would leave the loop scalar, every transcendental a scalar polynomial, where gathers cost far less than that."""
  if any(u.op in (Ops.REDUCE, Ops.DEFINE_ACC) for u in program): return set()
  loops = [u for u in program if u.op is Ops.RANGE]
  if not loops or loops[-1] in scalar_loops: return set()
  float_ops = sum(1 for u in program if u.op not in (Ops.LOAD, Ops.CONST) and u.dtype.is_float and u.src)
  return {loops[-1]} if float_ops >= FORCED_SIMD_MIN_FLOAT_OPS else set()


def _nan_tracked(owner: UOp) -> bool:
  """A float max/min reduction: accumulated with maxnum/minnum plus a NaN flag (see the ASSIGN case)."""
  return owner.op is Ops.REDUCE and owner.arg in (Ops.MAX, Ops.MIN) and owner.dtype.is_float


def _first_index(f: LLVMKernel, access: UOp, w: int) -> str:
  """The element index a load or store starts at: for a vector access (w lanes), its index's first operand
  (codegen._vector_accesses gives it as ADD(that, the lane) or ADD(that, MUL(lane, step)))."""
  idx = access.src[1]
  if not w: return f.value(idx)
  _lane_step(access)  # (asserts that form)
  return f.value(idx.src[0])


def _lane_step(access: UOp) -> int:
  """How many elements a vector access moves per lane (its index: ADD(base, lane) or ADD(base, MUL(lane, step)))."""
  moved = access.src[1].src[1] if access.src[1].op is Ops.ADD else None
  if moved is not None and is_vector_lane(moved): return 1
  assert moved is not None and moved.op is Ops.MUL and is_vector_lane(moved.src[0]), "a vector access is base + lane * step"
  return moved.src[1].arg


def _strided_columns(program: list, width: dict) -> dict:
  """{strided vector load: (its group's first load, column, the block's offset from the first load's index)} for the
  strided loads (a lane moves them by a step other than one) that come in whole groups (codegen.whole_block): `w` loads of one buffer in one straight stretch of the program, with the same
  step and index terms and consecutive offsets c0 .. c0 + w - 1. Such a group reads a w x w block whose rows (one per
  lane, `step` apart) are contiguous: load k of the group is column k of the block, so the renderer loads the rows as
  vectors and transposes them in registers (a transposing copy's tile: NCHW <-> NHWC, a weight transposed)."""
  groups: dict = {}
  stretch = 0
  for u in program:
    if u.op in (Ops.RANGE, Ops.ENDRANGE, Ops.BREAK_UNLESS): stretch += 1
    if u.op is not Ops.LOAD or u not in width or _lane_step(u) == 1: continue
    terms, offset = base_and_offset(u.src[1].src[0])
    groups.setdefault((stretch, u.src[0], terms, _lane_step(u)), []).append((offset, u))
  out: dict = {}
  for members in groups.values():
    offsets = [o for o, _ in members]
    if not whole_block(offsets, width[members[0][1]]): continue
    start, first = min(offsets), members[0][1]  # (the first in program order: rendered first)
    for o, u in members: out[u] = (first, o - start, start - members[0][0])
  return out


def _strided_load(f: LLVMKernel, u: UOp, w: int, column, column_vectors: dict) -> str:
  """A vector load whose lanes are `step` elements apart: a column of its group's transposed block (_strided_columns),
  or where it has no whole group, one scalar load per lane."""
  t = "i8" if u.dtype.is_bool else LLVM_TYPE[u.dtype]
  step, buf = _lane_step(u), f.value(u.src[0])
  if column is None:
    vec = "poison"
    for k in range(w):
      at, ptr, val, nxt = f.tmp(), f.tmp(), f.tmp(), f.tmp()
      f.emit(f"{at} = add i64 {_first_index(f, u, w)}, {k * step}")
      f.emit(f"{ptr} = getelementptr inbounds {t}, ptr {buf}, i64 {at}")
      f.emit(f"{val} = load {t}, ptr {ptr}")
      f.emit(f"{nxt} = insertelement <{w} x {t}> {vec}, {t} {val}, i32 {k}")
      vec = nxt
  else:
    first, col, shift = column
    if first not in column_vectors:  # u is the group's first load: its index and the block's differ by `shift`
      rows = []
      for k in range(w):
        at, ptr, row = f.tmp(), f.tmp(), f.tmp()
        f.emit(f"{at} = add i64 {_first_index(f, u, w)}, {shift + k * step}")
        f.emit(f"{ptr} = getelementptr inbounds {t}, ptr {buf}, i64 {at}")
        f.emit(f"{row} = load <{w} x {t}>, ptr {ptr}, align {max(1, u.dtype.itemsize)}")
        rows.append(row)
      column_vectors[first] = _butterfly(f, rows, f"<{w} x {t}>", w)
    vec = column_vectors[first][col]
  if u.dtype.is_bool:
    b = f.tmp()
    f.emit(f"{b} = icmp ne <{w} x i8> {vec}, zeroinitializer")
    vec = b
  return vec


def _maybe_declare_minmax(f: LLVMKernel, op: Ops, dt: DType, w: int = 0):
  if op not in (Ops.MAX, Ops.MIN) or dt.is_bool: return
  t = _vtype(dt, w)
  if dt.is_float: name = f"llvm.{'maximum' if op is Ops.MAX else 'minimum'}.{_suffix(dt, w)}"
  else: name = f"llvm.{'u' if dt.is_unsigned else 's'}{'max' if op is Ops.MAX else 'min'}.{_suffix(dt, w)}"
  f.declare(f"declare {t} @{name}({t}, {t})")


def _render_alu(f: LLVMKernel, u: UOp) -> str:
  """An elementwise node; a vector one (f.width) on vectors, its scalar operands broadcast."""
  out = f.tmp()
  op, dt, w = u.op, u.dtype, f.width.get(u, 0)
  t = _vtype(dt, w)
  vals = [f.operand(s, w) for s in u.src]
  if op is Ops.WHERE:
    cond = u.src[0]  # (a scalar condition selects whole vectors)
    f.emit(f"{out} = select {f.ty(cond)} {f.value(cond)}, {t} {vals[1]}, {t} {vals[2]}")
  elif op is Ops.CAST:
    line = _cast(u.src[0].dtype, dt, vals[0], w)
    if line is None: return vals[0]
    f.emit(f"{out} = {line}")
  elif op is Ops.BITCAST:
    f.emit(f"{out} = bitcast {_vtype(u.src[0].dtype, w)} {vals[0]} to {t}")
  elif op is Ops.NEG:
    f.emit(f"{out} = fneg {t} {vals[0]}" if dt.is_float else f"{out} = sub {t} {'zeroinitializer' if w else 0}, {vals[0]}")
  elif op is Ops.RECIP:
    f.emit(f"{out} = fdiv {t} {f.operand(UOp.const(dt, 1.0), w)}, {vals[0]}")
  elif op is Ops.NOT:
    f.emit(f"{out} = xor {t} {vals[0]}, {f.operand(UOp.const(dt, True if dt.is_bool else -1), w)}")
  elif op is Ops.MATH:
    st = LLVM_TYPE[dt]
    intrinsic, libm = MATH_FUNCTIONS[u.arg]
    if intrinsic is not None: fn = f"{intrinsic}.{_suffix(dt, w)}"
    elif dt == dtypes.float64: fn = libm
    elif dt == dtypes.float32: fn = libm + "f"
    else: raise NotImplementedError(f"{u.arg} on {dt}: lowering computes half types in float32")
    if intrinsic is None and w: return _scalar_calls(f, fn, st, vals, w)
    f.declare(f"declare {t} @{fn}({', '.join([t] * len(vals))})")
    f.emit(f"{out} = call {t} @{fn}({', '.join(f'{t} {v}' for v in vals)})")
  elif op in (Ops.CMPLT, Ops.CMPLE, Ops.CMPEQ, Ops.CMPNE):
    f.emit(f"{out} = {_binary(op, u.src[0].dtype, vals[0], vals[1], w)}")
  else:
    _maybe_declare_minmax(f, op, dt, w)
    f.emit(f"{out} = {_binary(op, dt, vals[0], vals[1], w)}")
  return out


def _scalar_calls(f: LLVMKernel, fn: str, t: str, vals: list, w: int) -> str:
  """A libm function (no vector form) on vectors of w lanes: one call per lane."""
  f.declare(f"declare {t} @{fn}({', '.join([t] * len(vals))})")
  vec = "poison"
  for i in range(w):
    args = []
    for v in vals:
      args.append(f.tmp())
      f.emit(f"{args[-1]} = extractelement <{w} x {t}> {v}, i32 {i}")
    r, nxt = f.tmp(), f.tmp()
    f.emit(f"{r} = call {t} @{fn}({', '.join(f'{t} {a}' for a in args)})")
    f.emit(f"{nxt} = insertelement <{w} x {t}> {vec}, {t} {r}, i32 {i}")
    vec = nxt
  return vec
