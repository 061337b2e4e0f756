"""Graphs with symbolic sizes -> static graphs for the sizes of one call.

Under `torch.compile(dynamic=True)`, `torch._dynamo.mark_dynamic` or Dynamo's automatic dynamic shapes,
AOTAutograd hands the backend one graph whose sizes are SymInts: SymInt placeholders (the sizes
themselves, passed at each call), tensors with symbolic shapes, and integer arithmetic on sizes
(`operator.mul(s0, s1)`, `aten.sym_size`). Dynamo's guards make that graph valid for every size in
their range, so it is traced and handed over once.

`specialize` takes such a graph and the arguments of one call, and returns a copy in which every
size is that call's: shapes and strides re-propagated by PyTorch's own meta functions (a fresh,
static FakeTensorMode), size arithmetic folded into constants, SymInt placeholders removed. The
copy is an ordinary static graph for the rest of the pipeline. It must not change the original.
"""
from __future__ import annotations
import torch
from torch.fx.node import map_arg

_SYM = (torch.SymInt, torch.SymFloat, torch.SymBool)
_SCALAR = (int, float, bool)


def is_symbolic(v) -> bool:
  """Whether a meta value (or an example input) holds a symbolic size: a SymInt/SymFloat/SymBool, or a tensor
  whose shape, strides or storage offset are symbolic."""
  if isinstance(v, _SYM): return True
  if isinstance(v, torch.Tensor):
    return any(isinstance(s, torch.SymInt) for s in (*v.shape, *v.stride(), v.storage_offset()))
  if isinstance(v, (list, tuple)): return any(is_symbolic(x) for x in v)
  return False


def has_symbolic_sizes(gm: torch.fx.GraphModule) -> bool:
  return any(is_symbolic(n.meta.get("val")) for n in gm.graph.nodes if n.op == "placeholder")


def signature_positions(gm: torch.fx.GraphModule) -> tuple[list[int], list[int]]:
  """Which arguments decide a graph's sizes: the positions of its size (SymInt/SymFloat/SymBool) placeholders and
  of its tensors with symbolic sizes or strides. A tensor with static ones has them guarded by Dynamo (or made
  by the static copy of the graph before), and the compiled graph re-checks every layout anyway."""
  vals = [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]
  return ([i for i, v in enumerate(vals) if isinstance(v, _SYM)],
          [i for i, v in enumerate(vals) if isinstance(v, torch.Tensor) and is_symbolic(v)])


def call_signature(args, scalars: list[int], tensors: list[int]) -> tuple:
  """What a static copy is specialized on: the size arguments' values and the symbolic tensors' shapes and strides."""
  return tuple(args[i] for i in scalars) + tuple((args[i].shape, args[i].stride()) for i in tensors)


def specialize(gm: torch.fx.GraphModule, args: list) -> tuple[torch.fx.GraphModule, list[int]]:
  """A static copy of `gm` for the sizes of `args` (real tensors and ints), and the positions of the arguments
  the copy still takes (the scalar size arguments become constants)."""
  from torch._subclasses.fake_tensor import FakeTensorMode, unset_fake_temporarily
  from torch.fx.passes.fake_tensor_prop import FakeTensorProp
  graph = torch.fx.Graph()
  env: dict = {}
  out = graph.graph_copy(gm.graph, env)  # node metas are shallow copies: the original keeps its own "val"s
  graph.output(out)
  static = torch.fx.GraphModule(gm, graph)  # shares gm's parameters and constants
  with unset_fake_temporarily():
    mode = FakeTensorMode(allow_non_fake_inputs=True)  # no ShapeEnv: every size is a plain int
    fake_args = [mode.from_tensor(a, static_shapes=True) if isinstance(a, torch.Tensor) else a for a in args]
    FakeTensorProp(static, mode).propagate_dont_convert_inputs(*fake_args)
  placeholders = [n for n in static.graph.nodes if n.op == "placeholder"]
  kept = [i for i, n in enumerate(placeholders) if not isinstance(n.meta.get("val"), _SCALAR)]
  for node in list(static.graph.nodes):
    val = node.meta.get("val")
    if node.op not in ("placeholder", "call_function") or not isinstance(val, _SCALAR): continue
    # a size, or arithmetic on sizes: its users read the number instead
    for user in list(node.users):
      user.args = map_arg(user.args, lambda n: val if n is node else n)
      user.kwargs = map_arg(user.kwargs, lambda n: val if n is node else n)
    static.graph.erase_node(node)
  static.recompile()
  return static, kept
