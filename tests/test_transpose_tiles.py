"""Transposing copies through vector loads and shuffles (core/renderer/transpose.py): the results equal eager's
element for element, the LLVM source transposes in registers where a tile is whole, and the shuffle stages are a
transpose for every vector width."""
import pytest
import torch
import torch_uop
import torch_uop.debug
from torch_uop.core.renderer.transpose import butterfly_masks

FRESH = {"graph_cache": False}


def _compiled_sources(fn, *args):
  torch._dynamo.reset()
  with torch_uop.debug.capture() as graphs:
    got = torch.compile(fn, backend="uop", options=FRESH)(*args)
  return got, [src for g in graphs for src in g.sources]


CASES = [
  ("2-D", lambda x: x.t().contiguous(), (96, 64), torch.float32),
  ("ragged last tile", lambda x: x.transpose(-1, -2).contiguous(), (3, 197, 197), torch.float32),
  ("keys transposed", lambda x: x.transpose(-1, -2).contiguous(), (2, 6, 40, 64), torch.float32),
  ("NCHW to NHWC", lambda x: x.permute(0, 2, 3, 1).contiguous(), (2, 24, 9, 16), torch.float32),
  ("float64", lambda x: x.t().contiguous(), (40, 24), torch.float64),
  ("int32", lambda x: x.t().contiguous(), (48, 32), torch.int32),
  ("with arithmetic", lambda x: x.transpose(-1, -2).contiguous() * 2.0 + 1.0, (64, 80), torch.float32),
]


@pytest.mark.parametrize("vector", [True, False], ids=["vector tile", "scalar tile"])
@pytest.mark.parametrize("name,fn,shape,dtype", CASES, ids=[c[0] for c in CASES])
def test_transposing_copy_matches_eager_through_register_transposes(monkeypatch, name, fn, shape, dtype, vector):
  """Built as vectors along the store's axis (codegen.vector_lane: a tile of the vector unit's lanes on each side, its
  strided loads a block transposed by the renderer) or one scalar per position (renderer/transpose.py finds the tile:
  32-byte vectors)."""
  from torch_uop.core import codegen
  from torch_uop.runtime import cpu
  monkeypatch.setattr(codegen, "VECTOR_TILES", vector)
  torch.manual_seed(0)
  x = (torch.randn(shape) * 100).to(dtype)
  got, sources = _compiled_sources(fn, x)
  want = fn(x)
  assert got.shape == want.shape and torch.equal(got.contiguous(), want.contiguous())
  lanes = cpu.vector_unit().lanes if vector else 32 // x.element_size()
  llvm_type = {torch.float32: "float", torch.float64: "double", torch.int32: "i32"}[dtype]
  text = "\n".join(sources)
  assert f"load <{lanes} x {llvm_type}>" in text and "shufflevector" in text
  if vector or name != "with arithmetic": assert f"store <{lanes} x {llvm_type}>" in text  # whole vectors stored


def test_copies_that_do_not_transpose_keep_scalar_code():
  """Copies that read and write in the same order (attention's heads split keeps rows of 64 together), and a
  transposing one too small for a tile, form no tile."""
  for fn, shape in ((lambda x: x * 2.0, (64, 64)), (lambda x: x.permute(0, 2, 1, 3).contiguous(), (2, 40, 6, 64)),
                    (lambda x: x.t().contiguous(), (5, 7))):
    x = torch.randn(shape)
    got, sources = _compiled_sources(fn, x)
    assert torch.equal(got, fn(x))
    assert "shufflevector" not in "\n".join(sources)


def test_transposing_copy_of_a_gradient_in_training_matches_eager():
  """A transposing copy in a training graph: values and gradients equal eager's."""
  torch.manual_seed(0)
  w = torch.randn(64, 48, requires_grad=True)
  fn = lambda w: w.t().contiguous() * 3.0
  torch._dynamo.reset()
  with torch_uop.debug.capture() as graphs:
    got = torch.compile(fn, backend="uop", options=FRESH)(w)
    want = fn(w)
    g = torch.randn_like(want)
    grad = torch.autograd.grad(got, w, g)[0]
  assert any("shufflevector" in src for src in graphs[0].sources)  # the forward (the backward returns a view)
  torch.testing.assert_close(got, want)
  torch.testing.assert_close(grad, torch.autograd.grad(want, w, g)[0])


@pytest.mark.parametrize("lanes", [2, 4, 8, 16])
def test_butterfly_masks_transpose(lanes):
  rows = [[(r, c) for c in range(lanes)] for r in range(lanes)]
  for stage in butterfly_masks(lanes):
    new = list(rows)
    for i, j, low, high in stage:
      both = rows[i] + rows[j]
      new[i], new[j] = [both[m] for m in low], [both[m] for m in high]
    rows = new
  assert rows == [[(r, c) for r in range(lanes)] for c in range(lanes)]


def test_strided_vector_loads_without_their_block_are_gathered(monkeypatch):
  """A vector tile's strided load that the renderer finds no whole block for (llvmir._strided_columns) is read one
  element per lane: the results still equal eager's."""
  from torch_uop.core.renderer import llvmir
  monkeypatch.setattr(llvmir, "_strided_columns", lambda program, width: {})
  torch.manual_seed(0)
  for fn, shape in ((lambda x: x.t().contiguous() * 2.0, (96, 64)), (lambda x: x.permute(0, 2, 3, 1).contiguous(), (2, 24, 9, 16))):
    x = torch.randn(shape)
    got, sources = _compiled_sources(fn, x)
    assert torch.equal(got, fn(x))
    text = "\n".join(sources)
    assert "insertelement" in text and "shufflevector" not in text
