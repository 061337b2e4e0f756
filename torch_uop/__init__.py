"""torch_uop: a torch.compile backend that compiles PyTorch graphs through a tinygrad-style UOp IR.

`torch.compile(model, backend="uop")` — see README.md. Public helpers: `metrics()`, `reset_metrics()`, `reset()`
(what torch._dynamo.reset() also does for this backend).
"""
from torch_uop.counters import metrics, reset_metrics
from torch_uop.dynamo_backend import uop_backend, reset

__all__ = ["metrics", "reset_metrics", "reset", "uop_backend"]
__version__ = "0.1.0"
