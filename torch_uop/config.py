"""Options and environment variables, read in one place.

torch.compile(..., options={...}) keys: `debug` (int), `opt_level` (0-3, LLVM pipeline level),
`device` ("cpu", or "opencl": OpenCL kernels on CPU tensors' memory; graphs on CUDA tensors run as CUDA kernels
whatever this says), `fallback_whole_graph` (bool: run the FX graph eagerly, for bisecting), `beam` (int:
width of the BEAM search over each kernel's opts, runtime/tuning.py; 0 = the heuristic), `graph_cache` (bool: reuse
whole compiled graphs from the disk cache, runtime/graph_cache.py; default on), `symbolic_shapes` (bool: compile a
graph with symbolic sizes once, with size variables in its kernels; off: a static copy per size; default on).
`freezing` (bool: inference graphs take the module's parameters and buffers as constants, folded at compile time,
lowering/freezing.py; default off), `keep_arena` (bool: every graph keeps its intermediates' memory between calls,
not only small ones; default off), `recompute` (bool: training graphs are split by the min-cut partitioner, as
Inductor's are, so the backward recomputes cheap pointwise ops instead of the forward saving their results;
default on), `debug_after` (str: pipeline passes whose result is logged, "schedule,codegen" or "all";
torch_uop/pipeline.py), `spec` (bool: check every kernel's IR against core/spec.py after codegen; default off).
Environment: TORCH_UOP_DEBUG=N, TORCH_UOP_DEBUG_AFTER=passes, TORCH_UOP_SPEC=1, TORCH_UOP_OPT_LEVEL=N, TORCH_UOP_DEVICE=cpu|opencl (TORCH_UOP_OPENCL_DEVICE picks
the OpenCL device, runtime/opencl.py), TORCH_UOP_BEAM=N, TORCH_UOP_GRAPH_CACHE=0,
TORCH_UOP_SYMBOLIC_SHAPES=0, TORCH_UOP_FREEZING=1, TORCH_UOP_RECOMPUTE=0; the
kernel disk cache reads TORCH_UOP_CACHE_DIR and TORCH_UOP_CACHE=0 (runtime/cache.py). Options win over
environment variables.

torch.compile's `mode=` picks a preset of these options (MODES); torch.compile itself refuses a mode together with
`options=`. Called directly, the backend applies the mode's preset first and `options` over it.
"""
from __future__ import annotations
import os
from dataclasses import dataclass, fields

DEVICES = ("cpu", "opencl")  # for CPU tensors; graphs on a CUDA device always run as CUDA kernels

# the BEAM width "max-autotune" searches with (each kernel times a few dozen candidates; winners go to the disk cache)
MAX_AUTOTUNE_BEAM = 4

# torch.compile(mode=...) -> the options it sets. torch_uop builds no CUDA graphs, so "reduce-overhead" means, on every
# device, the call path that allocates nothing but outputs (each graph's intermediates stay allocated between calls),
# and "max-autotune" and "max-autotune-no-cudagraphs" are the same search.
MODES = {
  "default": {},
  "reduce-overhead": {"keep_arena": True},
  "max-autotune": {"beam": MAX_AUTOTUNE_BEAM},
  "max-autotune-no-cudagraphs": {"beam": MAX_AUTOTUNE_BEAM},
}


def _coerce(name: str, value, kind: type):
  """An option's value as its declared type; strings like "False"/"0" mean False for booleans."""
  if kind is bool and isinstance(value, str):
    low = value.strip().lower()
    if low in ("1", "true", "yes", "on"): return True
    if low in ("0", "false", "no", "off", ""): return False
    raise ValueError(f"torch_uop: option {name!r} expects a boolean, got {value!r}")
  try:
    return kind(value)
  except (TypeError, ValueError):
    raise ValueError(f"torch_uop: option {name!r} expects {kind.__name__}, got {value!r}") from None


@dataclass
class Config:
  debug: int = 0
  opt_level: int = 3
  device: str = "cpu"
  fallback_whole_graph: bool = False
  beam: int = 0
  graph_cache: bool = True
  symbolic_shapes: bool = True
  freezing: bool = False
  keep_arena: bool = False
  recompute: bool = True
  debug_after: str = ""
  spec: bool = False

  @staticmethod
  def from_options(options: dict | None = None, mode: str | None = None) -> Config:
    cfg = Config(debug=int(os.environ.get("TORCH_UOP_DEBUG", "0") or 0),
                 opt_level=int(os.environ.get("TORCH_UOP_OPT_LEVEL", "3") or 3),
                 device=os.environ.get("TORCH_UOP_DEVICE", "cpu"),
                 beam=_coerce("TORCH_UOP_BEAM", os.environ.get("TORCH_UOP_BEAM", "0") or 0, int),
                 graph_cache=_coerce("TORCH_UOP_GRAPH_CACHE", os.environ.get("TORCH_UOP_GRAPH_CACHE", "1"), bool),
                 symbolic_shapes=_coerce("TORCH_UOP_SYMBOLIC_SHAPES", os.environ.get("TORCH_UOP_SYMBOLIC_SHAPES", "1"), bool),
                 freezing=_coerce("TORCH_UOP_FREEZING", os.environ.get("TORCH_UOP_FREEZING", "0"), bool),
                 recompute=_coerce("TORCH_UOP_RECOMPUTE", os.environ.get("TORCH_UOP_RECOMPUTE", "1"), bool),
                 debug_after=os.environ.get("TORCH_UOP_DEBUG_AFTER", ""),
                 spec=_coerce("TORCH_UOP_SPEC", os.environ.get("TORCH_UOP_SPEC", "0"), bool))
    if mode is not None and mode not in MODES:
      raise ValueError(f"torch_uop: unknown mode {mode!r}; modes: {sorted(MODES)}")
    known = {f.name for f in fields(Config)}
    for k, v in {**MODES[mode or "default"], **(options or {})}.items():
      if k not in known: raise ValueError(f"torch_uop: unknown option {k!r}; known options: {sorted(known)}")
      setattr(cfg, k, _coerce(k, v, type(getattr(cfg, k))))
    if cfg.device not in DEVICES: raise ValueError(f"torch_uop: device {cfg.device!r} is not available; choose from {DEVICES}")
    if cfg.device == "opencl":  # asked for by name: missing pyopencl or driver is an error that says so
      from torch_uop.runtime.opencl import opencl_device
      opencl_device()
    if not 0 <= cfg.opt_level <= 3: raise ValueError(f"torch_uop: opt_level must be 0..3, got {cfg.opt_level}")
    if cfg.beam < 0: raise ValueError(f"torch_uop: beam must be >= 0 (0: no search), got {cfg.beam}")
    if cfg.debug_after:
      from torch_uop.pipeline import parse_debug_after
      parse_debug_after(cfg.debug_after)  # an unknown pass name is an error here, not a silent no-op
    return cfg
