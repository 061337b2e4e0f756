"""Lowering: ATen FX graph -> tensor-level UOp graph.

Importing this package fills the registry: one module per op family.
"""
from torch_uop.lowering import pointwise, reduction, movement, creation, linalg, nn  # noqa: F401  (registers)
from torch_uop.lowering import special  # noqa: F401  (registers)
from torch_uop.lowering import lapack  # noqa: F401  (registers)
from torch_uop.lowering import random  # noqa: F401  (registers)
from torch_uop.lowering import misc  # noqa: F401  (registers)
from torch_uop.lowering import complex, fft  # noqa: F401  (complex tensors, FFTs)
from torch_uop.lowering import orthogonal  # noqa: F401  (registers)
