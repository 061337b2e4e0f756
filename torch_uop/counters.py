"""Counters a user reads with `torch_uop.metrics()` and clears with `torch_uop.reset_metrics()`."""
from __future__ import annotations
import collections
import copy
from torch_uop import log

_fresh = lambda: {
  "graphs_compiled": 0,          # FX graphs handed to torch_uop (forward, backward and inference count apart)
  "graphs_fallen_back": 0,       # graphs run whole by torch (e.g. inputs on another device)
  "symbolic_graphs": 0,          # graphs with symbolic sizes compiled once, with size variables in their kernels
  "size_specializations": 0,     # static copies compiled for one call's sizes of a graph with symbolic sizes
  "nodes_lowered": 0,            # ATen nodes translated to UOps
  "nodes_fallen_back": collections.Counter(),  # ATen op name -> nodes run by torch inside a compiled graph
  "kernels_compiled": 0,         # kernels in the graphs handed out, built or loaded from the graph cache
  "kernels_launched": 0,
  "fallback_steps_run": 0,
  "graph_calls_run_by_torch": 0,  # calls of a compiled graph that a run-time guard sent to torch (e.g. another storage offset)
  "compile_time_s": collections.Counter(),     # stage -> seconds
  "cache_hits": 0,               # kernel modules whose native object came from the disk cache (LLVM skipped)
  "graph_cache_hits": 0,         # graphs whose whole plan came from the graph cache (no lowering, codegen or LLVM)
  "kernels_searched": 0,         # kernels whose opts a BEAM search chose (TORCH_UOP_BEAM)
  "search_cache_hits": 0,        # kernels whose BEAM winner came from the disk cache
  "frozen_refolds": 0,           # calls of a frozen graph that found its weights changed and folded them again
}
_state = _fresh()


def metrics() -> dict:
  """A snapshot of the counters."""
  out = copy.deepcopy(_state)
  out["nodes_fallen_back"] = dict(out["nodes_fallen_back"])
  out["compile_time_s"] = {k: round(v, 6) for k, v in out["compile_time_s"].items()}
  out["fallback_nodes_total"] = sum(out["nodes_fallen_back"].values())
  return out


def reset_metrics() -> None:
  global _state
  _state = _fresh()


def state() -> dict: return _state


def report_fallback(what: str, reason: str, key: str | None = None) -> None:
  """Log, at WARNING and once per process for each `key` (default: `what`, e.g. an op's name), that `what` runs in
  torch instead of as torch_uop kernels, and why: correct, but slower."""
  log.warn_once("fallback", key or what, "%s runs in torch, not as torch_uop kernels: %s", what, reason)
