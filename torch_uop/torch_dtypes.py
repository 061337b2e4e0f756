"""The IR's dtypes (core/dtypes.py) and torch's: the one place the two meet.

`from_torch` / `to_torch` convert a dtype (a torch dtype without an IR one raises `UnsupportedDType`); a complex tensor is held in the IR as its view_as_real, `complex_part` / `complex_of` map
between a complex dtype and the real dtype of its halves.
"""
from __future__ import annotations
import torch
from torch_uop.core.dtypes import DType, dtypes


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
