"""Freezing: an ATen inference graph -> the same graph with the module's weights as constants, folded.

`freeze(gm, params, fake_mode)` takes an inference graph and {input position: tensor} for its inputs that are module
parameters and buffers nobody mutates, and returns a `Frozen`:
- a convolution followed by per-channel affine ops on constants (an inference BatchNorm decomposes to sub, mul, mul,
  add) becomes one convolution with the scaled weight and the shifted bias;
- every node computed from constants alone (no random op, no mutation) is folded: `fold(params)` computes the values
  where the graph reads them, and the graph takes them as new inputs in front of the others. A view of a constant
  (a weight's transpose), a node the graph returns (or returns a view of), and a node bigger than its inputs (an
  expand made dense) stay in the graph, reading the constants they start from;
- the executor is told which inputs are constants (`constant_inputs`): kernels that read only them (a weight laid
  out for the matmul that reads it) run once, not per call (runtime/executor.py, the prologue).
It changes nothing else; it must not fold what depends on a call's inputs.
"""
from __future__ import annotations
import math
import operator
from dataclasses import dataclass
import torch
import torch.fx

aten = torch.ops.aten

# per-channel affine ops a convolution's output may go through before the fold stops: op -> how it combines
_AFFINE = {aten.add.Tensor: "add", aten.sub.Tensor: "sub", aten.mul.Tensor: "mul", aten.div.Tensor: "div"}


@dataclass
class Frozen:
  gm: torch.fx.GraphModule   # inputs: one per folded constant, then the original inputs it still reads (`kept`)
  fold: torch.fx.GraphModule  # params (in `param_positions` order) -> the folded constants
  param_positions: list      # original input positions of the frozen parameters and buffers
  kept: list                 # original input positions the frozen graph still reads, in its input order
  constant_inputs: frozenset  # positions in the frozen graph's inputs whose values are constants (folded or weights)

  def constants(self, args: list) -> list:
    """The folded constants for the parameters among `args` (the original graph's inputs), contiguous."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    with unset_fake_temporarily(), torch.no_grad():
      out = self.fold(*[args[i] for i in self.param_positions])
    return [t.contiguous() for t in out]


def freeze(gm: torch.fx.GraphModule, params: dict, fake_mode) -> Frozen | None:
  """The frozen graph, or None when nothing folds (the graph is then compiled as it is)."""
  graph = torch.fx.Graph()
  env: dict = {}
  out = graph.graph_copy(gm.graph, env)
  graph.output(out)
  placeholders = [n for n in graph.nodes if n.op == "placeholder"]
  const = {placeholders[i] for i in params}
  for node in graph.nodes:
    if _foldable(node, const): const.add(node)
  _fold_conv_affine(_Builder(graph, const, fake_mode))
  graph.eliminate_dead_code()
  materialize = _frontier(graph, const)
  if not materialize: return None
  fold = _fold_program(graph, [placeholders[i] for i in sorted(params)], materialize)
  first = next(iter(graph.nodes))
  with graph.inserting_before(first):
    new_inputs = [graph.placeholder(f"frozen_{k}") for k in range(len(materialize))]
  for ph, node in zip(new_inputs, materialize):
    ph.meta["val"] = _contiguous_fake(node.meta["val"], fake_mode)
    node.replace_all_uses_with(ph, delete_user_cb=lambda user: user not in const)
  graph.eliminate_dead_code()
  kept = [i for i, ph in enumerate(placeholders) if ph.users]
  for i, ph in enumerate(placeholders):
    if not ph.users: graph.erase_node(ph)
  frozen = torch.fx.GraphModule(gm, graph)
  constant_inputs = frozenset(range(len(new_inputs))) | frozenset(len(new_inputs) + k for k, i in enumerate(kept) if i in params)
  return Frozen(frozen, fold, sorted(params), kept, constant_inputs)


def _foldable(node: torch.fx.Node, const: set) -> bool:
  """A node computed from constants alone, the same at every call."""
  if node.op != "call_function" or node in const: return False
  inputs = node.all_input_nodes
  if not inputs or not all(n in const for n in inputs): return False
  if node.target is operator.getitem: return True
  if not isinstance(node.target, torch._ops.OpOverload): return False
  return node.target._schema.is_mutable is False and torch.Tag.nondeterministic_seeded not in node.target.tags


class _Builder:
  """Adds constant nodes to a graph, each with the fake value its op gives (meta["val"], as AOTAutograd's nodes have)."""

  def __init__(self, graph: torch.fx.Graph, const: set, fake_mode):
    self.graph, self.const, self.fake_mode = graph, const, fake_mode

  def __call__(self, target, args: tuple, kwargs: dict | None = None) -> torch.fx.Node:
    kwargs = kwargs or {}
    node = self.graph.call_function(target, args, kwargs)
    fake = lambda a: a.meta["val"] if isinstance(a, torch.fx.Node) else a
    with self.fake_mode:
      node.meta["val"] = target(*torch.fx.node.map_aggregate(args, fake), **kwargs)
    self.const.add(node)
    return node


def _channel_vector(new: _Builder, c, conv: torch.fx.Node):
  """A [C] vector node for an operand that broadcasts along the convolution output's channel dim only (a constant node
  of shape [C,1,1], [1,C,1,1], [1] or [], or a Python number), else None."""
  out = conv.meta["val"]
  channels, ndim = out.shape[1], out.dim()
  if isinstance(c, (int, float)) and not isinstance(c, bool):
    return new(aten.full.default, ([channels], float(c)), {"dtype": out.dtype, "device": out.device})
  if not isinstance(c, torch.fx.Node) or c not in new.const: return None
  val = c.meta.get("val")
  if not isinstance(val, torch.Tensor) or val.dtype != out.dtype or val.dim() > ndim: return None
  shape = [1] * (ndim - val.dim()) + list(val.shape)
  if any(n != 1 for k, n in enumerate(shape) if k != 1) or shape[1] not in (1, channels): return None
  flat = new(aten.reshape.default, (c, [shape[1]]))
  return flat if shape[1] == channels else new(aten.expand.default, (flat, [channels]))


def _fold_conv_affine(new: _Builder) -> None:
  """conv(x, W, b) then per-channel `+ c`, `- c`, `* c`, `/ c` with constant c -> conv(x, W * A, b * A + B), for each
  convolution whose weight (and bias) are constants and whose result only feeds that chain."""
  graph, const = new.graph, new.const
  for conv in [n for n in graph.nodes if n.target is aten.convolution.default]:
    x, weight, bias, *rest = conv.args
    if weight not in const or (bias is not None and bias not in const) or rest[3]: continue  # rest[3]: transposed
    scale = shift = None  # the chain so far is conv * scale + shift ([C] nodes; None: 1 and 0)
    end = conv
    while len(end.users) == 1:
      user = next(iter(end.users))
      kind = _AFFINE.get(user.target)
      if kind is None or user.kwargs.get("alpha", 1) != 1 or len(user.args) != 2: break
      other_first = user.args[1] is end
      if not other_first and user.args[0] is not end: break
      if user.args[0] is end and user.args[1] is end: break
      uval = user.meta.get("val")
      if not isinstance(uval, torch.Tensor) or uval.dtype != conv.meta["val"].dtype or uval.shape != conv.meta["val"].shape: break
      if kind == "div" and other_first: break  # c / conv is not affine
      with graph.inserting_before(user):
        c = _channel_vector(new, user.args[0] if other_first else user.args[1], conv)
        if c is None: break
        scale, shift = _combine(new, kind, other_first, scale, shift, c)
      end = user
    if end is conv: continue
    with graph.inserting_before(end):
      new_weight = weight
      if scale is not None:
        rows = new(aten.reshape.default, (scale, [-1] + [1] * (weight.meta["val"].dim() - 1)))
        new_weight = new(aten.mul.Tensor, (weight, rows))
      new_bias = bias
      if bias is not None and scale is not None: new_bias = new(aten.mul.Tensor, (bias, scale))
      if shift is not None: new_bias = shift if new_bias is None else new(aten.add.Tensor, (new_bias, shift))
      folded = graph.call_function(aten.convolution.default, (x, new_weight, new_bias, *rest))
    folded.meta = dict(end.meta)
    end.replace_all_uses_with(folded)


def _combine(new: _Builder, kind: str, other_first: bool, scale, shift, c):
  """(scale, shift) after one more op of the chain with the [C] vector c (`other_first`: c is the op's first operand)."""
  if kind == "add": return scale, c if shift is None else new(aten.add.Tensor, (shift, c))
  if kind == "sub" and not other_first: return scale, new(aten.neg.default, (c,)) if shift is None else new(aten.sub.Tensor, (shift, c))
  if kind == "sub":  # c - v
    neg_scale = new(aten.neg.default, (scale if scale is not None else new(aten.ones_like.default, (c,)),))
    return neg_scale, c if shift is None else new(aten.sub.Tensor, (c, shift))
  if kind == "div": c = new(aten.reciprocal.default, (c,))
  return (c if scale is None else new(aten.mul.Tensor, (scale, c))), (None if shift is None else new(aten.mul.Tensor, (shift, c)))


def _frontier(graph: torch.fx.Graph, const: set) -> list:
  """The folded nodes the rest of the graph reads: each becomes a constant input. A view, a node the graph returns and
  a node bigger than its constant inputs are not folded (they stay in the graph, and their inputs are read instead)."""
  changed = True
  while changed:
    changed = False
    for node in list(graph.nodes):
      if node not in const or node.op == "placeholder" or all(u in const for u in node.users): continue
      val = node.meta.get("val")
      inputs = sum(_numel(n.meta.get("val")) for n in node.all_input_nodes)
      if not isinstance(val, torch.Tensor) or _returned(node) or _is_view(node) or _numel(val) > max(inputs, 1):
        const.discard(node)
        changed = True
  return [n for n in graph.nodes if n in const and n.op != "placeholder" and any(u not in const for u in n.users)]


def _is_view(node: torch.fx.Node) -> bool:
  return isinstance(node.target, torch._ops.OpOverload) and node.target.is_view


def _returned(node: torch.fx.Node) -> bool:
  """Whether the graph returns the node or a view of it: a folded constant lives across calls, and a caller may
  change what it is handed."""
  stack = list(node.users)
  while stack:
    user = stack.pop()
    if user.op == "output": return True
    if _is_view(user): stack.extend(user.users)
  return False


def _numel(val) -> int:
  return math.prod(val.shape) if isinstance(val, torch.Tensor) else 0


def _fold_program(graph: torch.fx.Graph, params: list, outputs: list) -> torch.fx.GraphModule:
  """A graph module computing `outputs` from `params` (placeholders of `graph`), with the nodes between them."""
  needed, stack = set(), list(outputs)
  while stack:
    n = stack.pop()
    if n in needed: continue
    needed.add(n)
    stack.extend(n.all_input_nodes)
  program = torch.fx.Graph()
  env = {p: program.placeholder(p.name) for p in params}
  for node in graph.nodes:
    if node in needed and node not in env: env[node] = program.node_copy(node, lambda n: env[n])
  program.output(tuple(env[n] for n in outputs))
  return torch.fx.GraphModule(torch.nn.Module(), program)


def _contiguous_fake(val: torch.Tensor, fake_mode):
  """The fake value of a folded constant's input: its shape and dtype, contiguous."""
  with fake_mode:
    return torch.empty(val.shape, dtype=val.dtype, device=val.device)
