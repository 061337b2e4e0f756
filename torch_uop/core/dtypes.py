"""Scalar data types of the UOp IR and their mapping to torch dtypes and LLVM types.

Takes nothing; defines `DType`, the `dtypes` namespace and the torch <-> IR conversion helpers.
Storage types and compute types can differ: bool is stored as one byte but computed as i1.
"""
from __future__ import annotations
from dataclasses import dataclass
import math
import torch


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

_TORCH_TO_IR = {
  torch.bool: dtypes.bool, torch.int8: dtypes.int8, torch.uint8: dtypes.uint8, torch.int16: dtypes.int16,
  torch.int32: dtypes.int32, torch.int64: dtypes.int64, torch.float16: dtypes.float16,
  torch.bfloat16: dtypes.bfloat16, torch.float32: dtypes.float32, torch.float64: dtypes.float64,
}
_IR_TO_TORCH = {v: k for k, v in _TORCH_TO_IR.items()}


class UnsupportedDType(NotImplementedError):
  pass


def from_torch(dt: torch.dtype) -> DType:
  if dt not in _TORCH_TO_IR: raise UnsupportedDType(f"torch_uop has no IR dtype for {dt}")
  return _TORCH_TO_IR[dt]


def to_torch(dt: DType) -> torch.dtype: return _IR_TO_TORCH[dt]


# a complex tensor is held in the IR as its view_as_real: a real tensor with a trailing dim of 2 (real, imag)
_COMPLEX_PART = {torch.complex32: torch.float16, torch.complex64: torch.float32, torch.complex128: torch.float64}
_PART_COMPLEX = {v: k for k, v in _COMPLEX_PART.items()}


def complex_part(dt: torch.dtype) -> torch.dtype | None:
  """The real dtype of each half of a complex dtype; None for a dtype that is not complex."""
  return _COMPLEX_PART.get(dt)


def complex_of(part: torch.dtype) -> torch.dtype: return _PART_COMPLEX[part]


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
