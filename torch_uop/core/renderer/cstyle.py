"""C-style renderers: linear UOp program -> source of one GPU-style kernel (OpenCL C or CUDA C).

`CStyleRenderer` is a renderer/base.py Renderer: the shared driver walks the program and calls its hooks, which
hold everything the two languages share; its own rules (before the shared ones) write a group of four contiguous
accesses as one vector load or store. `OpenCLRenderer` and `CUDARenderer` only say how their dialect spells ids,
qualifiers, types, barriers and half-precision conversions.

How a kernel maps onto work-items:
- The output loops (RANGEs of kind "global"/"split") become one flat work-item id over their product
  (`launch_items`): `gid` is split back into loop indices by division. One flat id has no per-dimension limits.
- Without a group, each work-item computes one output position; reduce loops and LT.loop loops are C loops.
- With a group of L work-items (`local_size`, core/opt.py gpu_opts), a work-group computes one output position:
  work-item `lid` runs the outermost reduce loop from `lid` in steps of L, the partial accumulators meet in
  local (shared) memory, a tree of barriers combines them, and work-item 0 finishes the kernel (epilogue, store).
Half and bfloat16 values live in float registers: loads and stores convert, and every half-typed result is
rounded to its type (as a half-precision ALU would). Bool is one byte in memory. Float max/min propagate NaN.
It does not compile or run anything.
"""
from __future__ import annotations
import math
import struct
from torch_uop.core.uop import UOp, Ops, UPat, AxisKind
from torch_uop.core.dtypes import DType, dtypes
from torch_uop.core.renderer.base import KernelText, Renderer

OUTER_KINDS = (AxisKind.GLOBAL, AxisKind.SPLIT)
HALF_TYPES = (dtypes.float16, dtypes.bfloat16)

# MATH names -> C library names (float64 spelling; float32 adds the dialect's suffix where it needs one)
C_MATH = {"abs": "fabs", "round": "rint"}


def launch_items(program: list[UOp]):
  """How many output positions (work-items, or work-groups with a group) a kernel runs: the product of its output
  loops' trip counts, a core.sym.Sym when one is symbolic."""
  from torch_uop.core.sym import Sym
  n = 1
  for u in program:
    if u.op is Ops.RANGE and u.arg.kind in OUTER_KINDS: n = n * (u.src[0].arg if u.src[0].op is Ops.CONST else Sym(u.src[0]))
  return n


class CKernel(KernelText):
  """One C-style kernel being rendered: KernelText's state, plus its parameters and local-memory declarations, its
  output loops and group (CStyleRenderer.begin), its vector access groups, and whether the prologue is written."""
  def __init__(self, *args):
    super().__init__(*args)
    self.params: dict[int, str] = {}
    self.local_decls: list[str] = []
    self.vector_of: dict = {}  # the first LOAD of a vector group -> the vector's name
    self.prologue_done = False

  def value(self, u: UOp) -> str:
    if u.op is Ops.CONST:
      self.renderer.used.add(u.dtype)
      return self.renderer.const(u.arg, u.dtype)
    return self.names[u]

  def define(self, u: UOp, expr: str) -> str:
    """A register of u's type holding expr: its name."""
    n = self.tmp()
    self.renderer.used.add(u.dtype)
    self.emit(f"{self.renderer.reg_type(u.dtype)} {n} = {expr};")
    return n


def _vector_load_lane(k: CKernel, u: UOp) -> str | None:
  """One lane of a vector load (made at the group's first load)."""
  if u not in k.load_groups: return None
  r = k.renderer
  group, lane = k.load_groups[u]
  if group[0] not in k.vector_of:
    base = f"({k.value(u.src[1])} - {lane})" if lane else k.value(u.src[1])
    v = k.vector_of[group[0]] = k.tmp("v")
    r.used.add(u.dtype)
    k.emit(f"{r.vector_type(u.dtype)} {v} = {r.vector_load(u.dtype, k.value(u.src[0]), base)};")
  return f"{k.vector_of[group[0]]}.{'xyzw'[lane]}"


def _vector_store(k: CKernel, u: UOp) -> str | None:
  """A store of a vector group: the group's first store writes all lanes; the others were folded into it."""
  if u not in k.store_groups: return None
  r = k.renderer
  r.prologue(k)
  lanes = k.store_groups[u]
  if lanes:
    k.emit(r.vector_store(u.src[2].dtype, k.value(lanes[0].src[0]), k.value(lanes[0].src[1]), [k.value(s.src[2]) for s in lanes]) + ";")
  return ""


class CStyleRenderer(Renderer):
  """The shared C renderer. A dialect sets the class attributes and the few methods marked 'dialect'."""
  name = "c"
  kernel_class = CKernel
  dialect_rules = [(UPat(Ops.LOAD, name="u"), _vector_load_lane), (UPat(Ops.STORE, name="u"), _vector_store)]
  kernel_prefix = ""
  buffer_qualifier = ""
  local_qualifier = ""
  barrier = ""
  restrict = "restrict"
  int64_suffix = "L"
  index_type = "long"     # C type of index math (int64)
  byte_type = "uchar"     # a bool in memory
  types: dict = {}
  float32_math_suffix = ""
  unsigned_of: dict = {}  # int32/int64 -> the unsigned type of their width (wrapping arithmetic)

  # ----------------------------------------------------------------- dialect
  def preamble(self, used: set) -> str: return ""
  def ids(self, grouped: bool) -> tuple[str, str]: raise NotImplementedError  # (flat output position, local id)
  def load_half(self, dt: DType, ptr: str, idx: str) -> str: raise NotImplementedError
  def store_half(self, dt: DType, ptr: str, idx: str, val: str) -> str: raise NotImplementedError
  def bitcast(self, src: DType, dst: DType, x: str) -> str: raise NotImplementedError
  def special_float(self, v: float, double: bool) -> str: raise NotImplementedError  # inf, -inf, nan

  # ----------------------------------------------------------------- shared
  def reg_type(self, dt: DType) -> str: return "float" if dt in HALF_TYPES else self.types[dt]
  def mem_type(self, dt: DType) -> str: return self.byte_type if dt.is_bool else self.types[dt]
  def local_type(self, dt: DType) -> str: return "int" if dt.is_bool else self.reg_type(dt)

  def const(self, v, dt: DType) -> str:
    if dt.is_bool: return "true" if v else "false"
    if dt.is_int:
      v = int(v)
      if dt.itemsize == 8:
        if v == dtypes.int64.min(): return f"(-9223372036854775807{self.int64_suffix}-1)"
        return f"{v}{self.int64_suffix}"
      if dt == dtypes.int32 and v == dtypes.int32.min(): return "(-2147483647-1)"
      return str(v) if dt == dtypes.int32 else f"(({self.types[dt]}){v})"
    v = float(v)
    double = dt == dtypes.float64
    if not math.isfinite(v): return self.special_float(v, double)
    if not double:
      v = struct.unpack("f", struct.pack("f", v))[0]  # a float32 constant holds the float32 value
    return f"{v.hex()}" + ("" if double else "f")

  def math_fn(self, name: str, dt: DType) -> str:
    fn = C_MATH.get(name, name)
    return fn + (self.float32_math_suffix if dt != dtypes.float64 else "")

  def round_to(self, dt: DType, x: str) -> str:
    """A float register value rounded to a half type (identity for other types)."""
    if dt == dtypes.float16: return f"tu_round_half({x})"
    if dt == dtypes.bfloat16: return f"tu_bf16_to_float(tu_float_to_bf16({x}))"
    return x

  def expression(self, u: UOp, v: list[str]) -> str:
    """An elementwise node's C expression over its operands' spellings `v`."""
    op, dt = u.op, u.dtype
    if op is Ops.WHERE: return f"({v[0]} ? {v[1]} : {v[2]})"
    if op is Ops.CAST: return self.cast(u.src[0].dtype, dt, v[0])
    if op is Ops.BITCAST: return self.bitcast(u.src[0].dtype, dt, v[0])
    if op is Ops.NEG: return f"(-{v[0]})"
    if op is Ops.NOT: return f"(!{v[0]})" if dt.is_bool else f"(~{v[0]})"
    if op is Ops.RECIP: return f"({self.const(1.0, dt)} / {v[0]})"
    if op is Ops.MATH:
      if dt not in (dtypes.float32, dtypes.float64) and dt not in HALF_TYPES: raise NotImplementedError(f"{u.arg} on {dt}")
      call = f"{self.math_fn(u.arg, dt)}({', '.join(v)})"
      if u.arg == "tanh":  # saturate exactly: a device tanh may return 1 - ulp where the rounded value is 1
        x = v[0]
        return f"(fabs({x}) > {self.const(19.5 if dt == dtypes.float64 else 9.5, dt)} ? copysign({self.const(1.0, dt)}, {x}) : {call})"
      return call
    c = u.src[1]
    return self.binary(op, dt, v[0], v[1], c.op is Ops.CONST and not (isinstance(c.arg, float) and math.isnan(c.arg)))

  def binary(self, op: Ops, dt: DType, a: str, b: str, b_not_nan: bool = False) -> str:
    """A binary op's expression; `dt` is its result's dtype (its operands', but for a comparison)."""
    if op in (Ops.CMPLT, Ops.CMPLE, Ops.CMPEQ, Ops.CMPNE):
      return f"({a} {({Ops.CMPLT: '<', Ops.CMPLE: '<=', Ops.CMPEQ: '==', Ops.CMPNE: '!='})[op]} {b})"
    if dt.is_bool:
      if op in (Ops.ADD, Ops.MAX, Ops.OR): return f"({a} || {b})"
      if op in (Ops.MUL, Ops.MIN, Ops.AND): return f"({a} && {b})"
      if op in (Ops.XOR, Ops.CMPNE): return f"({a} != {b})"
    if op in (Ops.MAX, Ops.MIN): return self.max_min(op, dt, a, b, b_not_nan)
    if op is Ops.MOD and dt.is_float: return f"{self.math_fn('fmod', dt)}({a}, {b})"
    sym = {Ops.ADD: "+", Ops.SUB: "-", Ops.MUL: "*", Ops.FDIV: "/", Ops.IDIV: "/", Ops.MOD: "%", Ops.AND: "&",
           Ops.OR: "|", Ops.XOR: "^", Ops.SHL: "<<", Ops.SHR: ">>"}.get(op)
    if sym is None: raise NotImplementedError(f"C renderer: {op} on {dt}")
    if op in (Ops.ADD, Ops.SUB, Ops.MUL, Ops.SHL) and dt in self.unsigned_of:
      # signed overflow is undefined in C (a compiler may fold (t*4)/4 to t): wrap as eager does, in unsigned
      u_t = self.unsigned_of[dt]
      return f"(({self.types[dt]})(({u_t}){a} {sym} ({u_t}){b}))"
    return f"({a} {sym} {b})"

  def max_min(self, op: Ops, dt: DType, a: str, b: str, b_not_nan: bool = False) -> str:
    gt = ">" if op is Ops.MAX else "<"
    if not dt.is_float: return f"(({a} {gt} {b}) ? {a} : {b})"
    # NaN wins, and max(-0, +0) is +0 (min: -0), as eager and LLVM's maximum/minimum
    keep_a_on_tie = f"signbit({a})" if op is Ops.MIN else f"!signbit({a})"
    b_wins = f"{b} {gt} {a}" if b_not_nan else f"({b} {gt} {a} || {b} != {b})"
    return f"(({a} {gt} {b} || {a} != {a}) ? {a} : {b_wins} ? {b} : ({keep_a_on_tie} ? {a} : {b}))"

  def reduce_update(self, op: Ops, dt: DType, acc: str, v: str) -> str:
    """acc = op(acc, v) as one statement (a float max/min keeps a NaN once it saw one)."""
    if dt.is_float and op in (Ops.MAX, Ops.MIN):
      gt = ">" if op is Ops.MAX else "<"
      return f"{acc} = ({v} {gt} {acc} || {v} != {v}) ? {v} : {acc};"
    return f"{acc} = {self.round_to(dt, self.binary(op, dt, acc, v))};"

  def cast(self, src: DType, dst: DType, x: str) -> str:
    if dst.is_bool: return f"({x} != 0)"
    if dst in HALF_TYPES:
      if src == dst: return x
      return self.round_to(dst, x if src in HALF_TYPES or src == dtypes.float32 else f"(float)({x})")
    if src in HALF_TYPES and dst == dtypes.float32: return x
    return f"(({self.reg_type(dst)})({x}))"

  def __init__(self): self.used: set = set()  # dtypes the kernels rendered so far use (what the preamble declares)

  def program_source(self, functions: list[str]) -> str:
    """One compilable source: the preamble the rendered kernels need, then their functions."""
    return self.preamble(self.used) + "".join(functions)

  def render_program(self, kernel) -> str:
    """One codegen.Kernel as a whole source (preamble included)."""
    return self.program_source([self.render(kernel)])

  def begin(self, k: CKernel, **options) -> CKernel:
    program = k.program
    k.grouped = k.local_size > 1
    k.outer = [u for u in program if u.op is Ops.RANGE and u.arg.kind in OUTER_KINDS]
    reduce_ranges = [u for u in program if u.op is Ops.RANGE and u.arg.kind in (AxisKind.REDUCE, AxisKind.REDUCE_SERIAL)]
    k.group_range = reduce_ranges[0] if k.grouped and reduce_ranges else None
    k.reduces = [u for u in program if u.op is Ops.REDUCE]
    k.load_groups, k.store_groups = self.vector_groups(program)
    k.gid, k.lid = self.ids(k.grouped)
    return k

  def prologue(self, k: CKernel) -> None:
    """The flat output position, the guard past the last one, and each output loop's index from it."""
    if k.prologue_done: return
    k.prologue_done = True
    ix = self.index_type
    k.emit(f"{ix} gid = {k.gid};")
    if k.grouped: k.emit(f"int lid = {k.lid};")
    sizes = [k.value(r.src[0]) for r in k.outer]
    total = " * ".join(f"({ix})({s})" for s in sizes) or "1"
    k.emit(f"if (gid >= {total}) return;")
    stride = "1"
    for i, (r, s) in reversed(list(enumerate(zip(k.outer, sizes)))):
      n = k.names[r] = k.tmp("r")
      # below the guard, gid / stride of the outermost loop is already below its size: no modulo
      index = "gid" if stride == "1" else f"(gid / ({stride}))"
      k.emit(f"{ix} {n} = {index};" if i == 0 else f"{ix} {n} = {index} % ({s});")
      stride = f"{stride} * ({s})" if stride != "1" else f"({ix})({s})"

  def buffer(self, k: CKernel, u: UOp, position: int) -> str:
    self.used.add(u.dtype)
    k.params[position] = f"{self.buffer_qualifier}{self.mem_type(u.dtype)}* {self.restrict} b{position}"
    return f"b{position}"

  def size_var(self, k: CKernel, u: UOp) -> str:
    n = f"v{u.arg[3]}"
    k.emit(f"{self.index_type} {n} = {k.value(u.src[0])}[{u.arg[3]}];")
    return n

  def open_loop(self, k: CKernel, r: UOp) -> str:
    self.prologue(k)
    if r.arg.kind in OUTER_KINDS: return ""  # (the prologue named it)
    n, ix = k.tmp("r"), self.index_type
    if r is k.group_range: k.emit(f"for ({ix} {n} = lid; {n} < {k.value(r.src[0])}; {n} += {k.local_size}) {{")
    else: k.emit(f"for ({ix} {n} = 0; {n} < {k.value(r.src[0])}; {n}++) {{")
    k.depth += 1
    return n

  def close_loop(self, k: CKernel, r: UOp) -> None:
    if r.arg.kind in OUTER_KINDS: return
    k.depth -= 1
    k.emit("}")

  def break_unless(self, k: CKernel, cond: UOp, r: UOp) -> None: k.emit(f"if (!({k.value(cond)})) break;")

  def accumulator(self, k: CKernel, u: UOp, owner: UOp, start: UOp) -> str:
    a = k.tmp("acc")
    self.used.add(u.dtype)
    k.emit(f"{self.reg_type(u.dtype)} {a} = {k.value(start)};")
    return a

  def set_state(self, k: CKernel, u: UOp, acc: str, value: UOp) -> None: k.emit(f"{acc} = {k.value(value)};")
  def accumulate(self, k: CKernel, u: UOp, acc: str, value: UOp) -> None:
    k.emit(self.reduce_update(u.arg, u.dtype, acc, k.value(value)))
  # a copy of the state: later updates in the step must not show
  def read_state(self, k: CKernel, u: UOp, acc: str) -> str: return k.define(u, acc)

  def reduce_result(self, k: CKernel, u: UOp, acc: str) -> str:
    if k.grouped and u is k.reduces[0]: self._combine_group(k)
    return k.define(u, acc)

  def load(self, k: CKernel, u: UOp) -> str:
    buf, idx = k.value(u.src[0]), k.value(u.src[1])
    if len(u.src) == 3: idx = f"({k.value(u.src[2])} ? {idx} : 0)"
    if u.dtype in HALF_TYPES: expr = self.load_half(u.dtype, buf, idx)
    elif u.dtype.is_bool: expr = f"({buf}[{idx}] != 0)"
    else: expr = f"{buf}[{idx}]"
    return k.define(u, expr)

  def store(self, k: CKernel, u: UOp) -> None:
    self.prologue(k)
    buf, idx, value = (k.value(s) for s in u.src)
    dt = u.src[2].dtype
    if dt in HALF_TYPES: k.emit(self.store_half(dt, buf, idx, value) + ";")
    elif dt.is_bool: k.emit(f"{buf}[{idx}] = {value} ? 1 : 0;")
    else: k.emit(f"{buf}[{idx}] = {value};")

  def alu(self, k: CKernel, u: UOp) -> str:
    expr = self.expression(u, [k.value(s) for s in u.src])
    if u.dtype in HALF_TYPES and u.op not in (Ops.CAST, Ops.BITCAST, Ops.WHERE): expr = self.round_to(u.dtype, expr)
    return k.define(u, expr)

  def finish(self, k: CKernel) -> str:
    body = "\n".join(k.lines)
    # a buffer the kernel does not read (simplified away) is still an argument: launchers pass every buffer
    args = ", ".join(k.params.get(i, f"{self.buffer_qualifier}{self.byte_type}* b{i}") for i in range(k.n_buffers))
    locals_ = "".join(f"  {d}\n" for d in k.local_decls)
    return f"{self.kernel_prefix}void {k.name}({args}) {{\n{locals_}{body}\n}}\n"

  # ----------------------------------------------------------------- vector accesses
  VECTOR_WIDTH = 4
  vector_load_dtypes: tuple = ()   # dtypes the dialect loads as vectors (any element-aligned address)
  vector_store_dtypes: tuple = ()  # dtypes the dialect stores as vectors
  store_alignment_lanes = 1        # a vector store's first index must be a multiple of this (CUDA: the vector's size)

  def vector_type(self, dt: DType) -> str: raise NotImplementedError
  def vector_load(self, dt: DType, ptr: str, idx: str) -> str: raise NotImplementedError
  def vector_store(self, dt: DType, ptr: str, idx: str, vals: list[str]) -> str: raise NotImplementedError

  def vector_groups(self, program: list[UOp]) -> tuple[dict, dict]:
    """Accesses of 4 consecutive elements of one buffer (an upcast along a contiguous axis) done as one vector
    access: ({LOAD: (its group in program order, its lane)}, {STORE: its group for the first, [] for the others})."""
    from torch_uop.core.symbolic import simplify, base_and_offset
    width = self.VECTOR_WIDTH

    def groups(accesses: list, dtype_of) -> list[list]:
      by_base: dict = {}
      for a in accesses:
        terms, offset = base_and_offset(a.src[1])
        by_base.setdefault((a.src[0], dtype_of(a), terms), {})[offset] = a
      out = []
      for (_, _, base), at in by_base.items():
        for off in sorted(at):
          lanes = [at.get(off + k) for k in range(width)]
          if any(x is None for x in lanes) or any(x in taken for x in lanes): continue
          out.append(lanes)
          taken.update(lanes)
      return out

    taken: set = set()
    order = {u: i for i, u in enumerate(program)}
    loads = [u for u in program if u.op is Ops.LOAD and len(u.src) == 2 and u.dtype in self.vector_load_dtypes]
    load_groups = {}
    for lanes in groups(loads, lambda u: u.dtype):
      first = min(lanes, key=order.get)
      ordered = [first] + [x for x in lanes if x is not first]
      for lane, x in enumerate(lanes): load_groups[x] = (ordered, lane)
    stores = [u for u in program if u.op is Ops.STORE and u.src[2].dtype in self.vector_store_dtypes]
    store_groups = {}
    for lanes in groups(stores, lambda u: u.src[2].dtype):
      if self.store_alignment_lanes > 1:  # the first index must be provably aligned
        rem = simplify(lanes[0].src[1] % UOp.const(lanes[0].src[1].dtype, self.store_alignment_lanes))
        if not (rem.op is Ops.CONST and rem.arg == 0): continue
      # one vector store at the group's first store in the program, with lane 0's index; codegen puts every
      # store after the values and indices it writes (linearize), so all lanes' operands exist there
      first = min(lanes, key=order.get)
      if any(order.get(x.src[k], -1) > order[first] for x in lanes for k in (1, 2)): continue
      for x in lanes: store_groups[x] = []
      store_groups[first] = lanes
    return load_groups, store_groups

  def _combine_group(self, k: CKernel) -> None:
    """Every work-item's partial accumulators into local memory, a tree of barriers combining them, then only
    work-item 0 goes on (with the totals in its accumulators)."""
    size, emit = k.local_size, k.emit
    for i, r in enumerate(k.reduces):
      k.local_decls.append(f"{self.local_qualifier}{self.local_type(r.dtype)} red{i}[{size}];")
      emit(f"red{i}[lid] = {k.accs[r]};")
    emit(self.barrier)
    emit(f"for (int s = {size // 2}; s > 0; s >>= 1) {{")
    emit("  if (lid < s) {")
    for i, r in enumerate(k.reduces):
      emit("    " + self.reduce_update(r.arg, r.dtype, f"red{i}[lid]", f"red{i}[lid + s]"))  # (bools held as int)
    emit("  }")
    emit(f"  {self.barrier}")
    emit("}")
    emit("if (lid != 0) return;")
    for i, r in enumerate(k.reduces): emit(f"{k.accs[r]} = red{i}[0];")


class OpenCLRenderer(CStyleRenderer):
  name = "opencl"
  kernel_prefix = "__kernel "
  buffer_qualifier = "__global "
  local_qualifier = "__local "
  barrier = "barrier(CLK_LOCAL_MEM_FENCE);"
  types = {dtypes.bool: "bool", dtypes.int8: "char", dtypes.uint8: "uchar", dtypes.int16: "short", dtypes.int32: "int",
           dtypes.int64: "long", dtypes.float16: "half", dtypes.bfloat16: "ushort", dtypes.float32: "float",
           dtypes.float64: "double"}
  unsigned_of = {dtypes.int32: "uint", dtypes.int64: "ulong"}

  def ids(self, grouped: bool): return ("get_group_id(0)", "get_local_id(0)") if grouped else ("get_global_id(0)", "")

  def special_float(self, v, double):
    x = "NAN" if math.isnan(v) else "INFINITY" if v > 0 else "(-INFINITY)"
    return f"((double){x})" if double else x

  def preamble(self, used: set) -> str:
    out = "#pragma OPENCL EXTENSION cl_khr_fp64 : enable\n" if dtypes.float64 in used else ""
    # half as storage only (vload_half/vstore_half are core OpenCL; arithmetic on half needs cl_khr_fp16)
    out += ("inline float tu_round_half(float x) { ushort h; vstore_half_rte(x, 0, (__private half*)&h); "
            "return vload_half(0, (__private half*)&h); }\n"
            "inline ushort tu_half_bits(float x) { ushort h; vstore_half_rte(x, 0, (__private half*)&h); return h; }\n"
            "inline float tu_half_from_bits(ushort h) { return vload_half(0, (__private half*)&h); }\n"
            "inline float tu_bf16_to_float(ushort b) { return as_float(((uint)b) << 16); }\n"
            "inline ushort tu_float_to_bf16(float f) { uint u = as_uint(f); "
            "if ((u & 0x7fffffffu) > 0x7f800000u) return (ushort)((u >> 16) | 0x40u); "
            "return (ushort)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16); }\n")
    return out

  vector_load_dtypes = (dtypes.float32, dtypes.float16)
  vector_store_dtypes = (dtypes.float32, dtypes.float16)

  def vector_type(self, dt): return "float4"  # half lanes are float in registers too

  def vector_load(self, dt, ptr, idx):  # vloadn needs only an element-aligned address
    return f"vload_half4(0, {ptr} + {idx})" if dt == dtypes.float16 else f"vload4(0, {ptr} + {idx})"

  def vector_store(self, dt, ptr, idx, vals):
    v = f"(float4)({', '.join(vals)})"
    return f"vstore_half4_rte({v}, 0, {ptr} + {idx})" if dt == dtypes.float16 else f"vstore4({v}, 0, {ptr} + {idx})"

  def load_half(self, dt, ptr, idx):
    return f"vload_half({idx}, {ptr})" if dt == dtypes.float16 else f"tu_bf16_to_float({ptr}[{idx}])"

  def store_half(self, dt, ptr, idx, val):
    return f"vstore_half_rte({val}, {idx}, {ptr})" if dt == dtypes.float16 else f"{ptr}[{idx}] = tu_float_to_bf16({val})"

  def bitcast(self, src, dst, x):
    if src in HALF_TYPES: x = f"tu_half_bits({x})" if src == dtypes.float16 else f"tu_float_to_bf16({x})"
    if dst == dtypes.float16: return f"tu_half_from_bits(as_ushort({x}))"
    if dst == dtypes.bfloat16: return f"tu_bf16_to_float(as_ushort({x}))"
    return f"as_{self.types[dst]}({x})"


class CUDARenderer(CStyleRenderer):
  name = "cuda"
  kernel_prefix = 'extern "C" __global__ '
  local_qualifier = "__shared__ "
  barrier = "__syncthreads();"
  restrict = "__restrict__"
  int64_suffix = "LL"
  index_type = "long long"
  byte_type = "unsigned char"
  float32_math_suffix = "f"
  types = {dtypes.bool: "bool", dtypes.int8: "signed char", dtypes.uint8: "unsigned char", dtypes.int16: "short",
           dtypes.int32: "int", dtypes.int64: "long long", dtypes.float16: "__half", dtypes.bfloat16: "__nv_bfloat16",
           dtypes.float32: "float", dtypes.float64: "double"}
  unsigned_of = {dtypes.int32: "unsigned int", dtypes.int64: "unsigned long long"}
  BLOCK = 128  # work-items per block without a group

  def ids(self, grouped: bool):
    if grouped: return "(long long)blockIdx.x", "(int)threadIdx.x"
    return f"(long long)blockIdx.x * {self.BLOCK} + threadIdx.x", ""

  def special_float(self, v, double):
    if double: bits = "0x7ff8000000000000LL" if math.isnan(v) else "0x7ff0000000000000LL"
    else: bits = "0x7fc00000" if math.isnan(v) else "0x7f800000"
    x = f"__longlong_as_double({bits})" if double else f"__int_as_float({bits})"
    return x if math.isnan(v) or v > 0 else f"(-{x})"

  def preamble(self, used: set) -> str:
    out = ""
    if dtypes.float16 in used: out += "#include <cuda_fp16.h>\n"
    if dtypes.bfloat16 in used: out += "#include <cuda_bf16.h>\n"
    out += ("template <class T, class F> __device__ inline T tu_bitcast(F x) { union { F f; T t; } u; u.f = x; return u.t; }\n")
    if dtypes.float16 in used:
      out += "__device__ inline float tu_round_half(float x) { return __half2float(__float2half_rn(x)); }\n"
    if dtypes.bfloat16 in used:
      out += ("__device__ inline __nv_bfloat16 tu_float_to_bf16(float x) { return __float2bfloat16_rn(x); }\n"
              "__device__ inline float tu_bf16_to_float(__nv_bfloat16 x) { return __bfloat162float(x); }\n")
    return out

  # stores only: an output is torch's allocation (or an arena slot, 64-byte aligned), so an index that is a multiple
  # of 4 is a 16-byte (float4) / 8-byte (two half2) aligned address; an input may be a view at any offset
  vector_store_dtypes = (dtypes.float32, dtypes.float16)
  store_alignment_lanes = 4

  def vector_store(self, dt, ptr, idx, vals):
    if dt == dtypes.float32: return f"*(float4*)({ptr} + {idx}) = make_float4({', '.join(vals)})"
    a, b, c, d = vals
    return (f"((__half2*)({ptr} + {idx}))[0] = __floats2half2_rn({a}, {b}); "
            f"((__half2*)({ptr} + {idx}))[1] = __floats2half2_rn({c}, {d})")

  def load_half(self, dt, ptr, idx):
    return f"__half2float({ptr}[{idx}])" if dt == dtypes.float16 else f"__bfloat162float({ptr}[{idx}])"

  def store_half(self, dt, ptr, idx, val):
    return f"{ptr}[{idx}] = __float2half_rn({val})" if dt == dtypes.float16 else f"{ptr}[{idx}] = __float2bfloat16_rn({val})"

  def bitcast(self, src, dst, x):
    if src == dtypes.float16: x = f"__half_as_ushort(__float2half_rn({x}))"
    elif src == dtypes.bfloat16: x = f"__bfloat16_as_ushort(__float2bfloat16_rn({x}))"
    if dst == dtypes.float16: return f"__half2float(__ushort_as_half((unsigned short)({x})))"
    if dst == dtypes.bfloat16: return f"__bfloat162float(__ushort_as_bfloat16((unsigned short)({x})))"
    return f"tu_bitcast<{self.types[dst]}>({x})"

