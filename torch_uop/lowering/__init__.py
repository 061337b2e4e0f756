"""Lowering: ATen FX graph -> tensor-level UOp graph.

Importing this package fills the registry: one module per op family.
"""
from torch_uop.lowering import pointwise, reduction, movement, creation, linalg, nn  # noqa: F401  (registers)
from torch_uop.lowering import orthogonal  # noqa: F401  (registers)
