"""Scalar data types of the UOp IR and their LLVM types.

Takes nothing; defines `DType` and the `dtypes` namespace (torch_uop/torch_dtypes.py maps them to torch's).
Storage types and compute types can differ: bool is stored as one byte but computed as i1.
"""
from __future__ import annotations
from dataclasses import dataclass
import math


@dataclass(frozen=True, order=True)
class DType:
  name: str
  itemsize: int
  kind: str  # 'f' float, 'i' signed int, 'u' unsigned int, 'b' bool
  priority: int = 0

  def __repr__(self): return f"dtypes.{self.name}"
  # every DType is one of the `dtypes` below (unpickling returns that one too), so identity is equality: hashing by
  # identity, in C, keeps Python code out of node construction's dict lookups, the compiler's hottest path
  __hash__ = object.__hash__
  def __reduce__(self): return getattr, (dtypes, self.name)

  @property
  def is_float(self) -> bool: return self.kind == 'f'
  @property
  def is_int(self) -> bool: return self.kind in 'iu'
  @property
  def is_unsigned(self) -> bool: return self.kind == 'u'
  @property
  def is_bool(self) -> bool: return self.kind == 'b'

  def min(self):
    if self.is_bool: return False
    if self.is_float: return -math.inf
    return 0 if self.is_unsigned else -(1 << (8 * self.itemsize - 1))

  def max(self):
    if self.is_bool: return True
    if self.is_float: return math.inf
    return (1 << (8 * self.itemsize)) - 1 if self.is_unsigned else (1 << (8 * self.itemsize - 1)) - 1


class dtypes:
  bool = DType("bool", 1, 'b', 0)
  int8 = DType("int8", 1, 'i', 1)
  uint8 = DType("uint8", 1, 'u', 2)
  int16 = DType("int16", 2, 'i', 3)
  int32 = DType("int32", 4, 'i', 5)
  int64 = DType("int64", 8, 'i', 7)
  float16 = DType("float16", 2, 'f', 9)
  bfloat16 = DType("bfloat16", 2, 'f', 10)
  float32 = DType("float32", 4, 'f', 11)
  float64 = DType("float64", 8, 'f', 12)
  # index arithmetic is always done in 64-bit integers
  index = int64
  void = DType("void", 0, 'v', -1)


_INT_RANGE = {dt: (dt.min(), dt.max()) for dt in vars(dtypes).values() if isinstance(dt, DType) and dt.kind in 'iu'}

def python_type_dtype(value) -> DType:
  """The IR dtype a bare Python scalar would take in a kernel (before any promotion)."""
  if isinstance(value, bool): return dtypes.bool
  if isinstance(value, int): return dtypes.int64
  return dtypes.float64


def cast_python_value(value, dt: DType):
  """Normalize a Python constant to the Python type that matches dt (integers wrap around as in dt)."""
  kind = dt.kind
  if kind == 'f': return float(value)
  if kind == 'b': return bool(value)
  v = int(value)
  lo, hi = _INT_RANGE[dt]
  if lo <= v <= hi: return v  # the common case: index math
  bits = 8 * dt.itemsize
  v &= (1 << bits) - 1
  if kind == 'i' and v >= 1 << (bits - 1): v -= 1 << bits
  return v
