"""Real library models through backend="uop": the zoo's "tiny" sizes (torch_uop/testing/zoo.py).

transformers decoders (GPT-2, LLaMA, Qwen2) and encoders (BERT, T5, ViT), a torchvision ResNet, timm's DeiT and
ConvNeXt, and from the models beyond the zoo of record Whisper's encoder, Swin-T, DenseNet-121, R3D-18, DeepLabV3,
SegFormer and wav2vec2, each in inference (no_grad) and one training step (the zoo's loss, backward), compared with
eager: the main output and every parameter gradient, and no ATen fallback. A model whose library
cannot be imported is skipped, saying which.
"""
import copy
import pytest
import torch
import torch_uop
from torch_uop.testing import zoo

# the first-order error of reordered float32 sums, relative to each tensor's largest magnitude
RTOL, ATOL_SCALE = 1e-4, 1e-4

MODELS = ["gpt2", "llama", "qwen2", "bert", "t5_encoder", "vit", "resnet18", "deit_tiny", "convnext_atto",
          # from the "more" set: 1-D convolutions, windows, concats, 3-D convolutions, dilated convolutions and
          # resizes, resizes' gradients, a weight-normed grouped convolution
          "whisper_encoder", "swin_t", "densenet121", "r3d_18", "deeplabv3_mnv3", "segformer", "wav2vec2"]
# (model, mode) -> why it falls back, for a strict xfail; none now
KNOWN_FALLBACKS: dict = {}


def run(mode: str, model, inputs, module=None):
  """(main output, {parameter name: grad} in training) of one call of `model` (a module or its torch.compile)."""
  module = module or model
  if mode == "infer":
    with torch.no_grad(): return zoo.main_output(model(*inputs)), None
  out = model(*inputs)
  zoo.loss_of(out).backward()
  return zoo.main_output(out).detach(), {n: p.grad for n, p in module.named_parameters()}


def cases():
  for name in MODELS:
    for mode in ("infer", "train"):
      reason = KNOWN_FALLBACKS.get((name, mode))
      yield pytest.param(name, mode, id=f"{name}-{mode}",
                         marks=[pytest.mark.xfail(reason=reason, strict=True)] if reason else [])


@pytest.mark.parametrize("name,mode", list(cases()))
def test_zoo_model(name, mode):
  missing = zoo.library_missing(zoo.ZOO[name].library)
  if missing: pytest.skip(missing)
  model, inputs = zoo.build(name, "tiny")
  twin = copy.deepcopy(model)
  expected = run(mode, model, inputs)
  torch._dynamo.reset()
  torch_uop.reset_metrics()
  actual = run(mode, torch.compile(twin, backend="uop"), inputs, twin)
  zoo.assert_matches(actual, expected, RTOL, ATOL_SCALE)
  m = torch_uop.metrics()
  assert m["graphs_compiled"] >= 1, "torch_uop never saw a graph"
  assert m["fallback_nodes_total"] == 0 and m["graphs_fallen_back"] == 0, f"fell back: {m['nodes_fallen_back']}"


def test_zoo_table():
  """Every entry has both sizes described, the kernels say their bytes, and the loss is not constant under a
  final norm (a plain mean square of a LayerNorm's output would be)."""
  for name, entry in zoo.ZOO.items():
    assert set(entry.description) == set(zoo.SIZES), name
    assert (entry.bytes_moved is not None) == (entry.group == "kernels"), name
  y = torch.nn.functional.layer_norm(torch.randn(2, 8, 16), (16,)).requires_grad_()
  zoo.loss_of(y).backward()
  assert y.grad.abs().max() > 1e-3


def test_float64_check_tells_rounding_from_error():
  """bench_zoo.py's check where a backend and eager disagree: a result rounded from a float64 run is no farther from
  float64 than eager's (closer), one with an error in a gradient is farther."""
  import os, sys
  sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
  import bench_zoo
  model, inputs = zoo.build("resnet18", "tiny")
  eager = bench_zoo.detached(bench_zoo.make_call("train", model, inputs)())
  model, inputs = zoo.build("resnet18", "tiny")
  out, grads = bench_zoo.make_call("train", model.double(), tuple(x.double() for x in inputs))()
  rounded = (out.float(), {n: g.float() for n, g in grads.items()})
  assert bench_zoo.float64_check("resnet18", "train", "tiny", rounded, eager)["closer"]
  name = next(iter(eager[1]))
  wrong = (eager[0], {**eager[1], name: eager[1][name] * 1.01})
  check = bench_zoo.float64_check("resnet18", "train", "tiny", wrong, eager)
  assert not check["closer"] and check["backend_at"] == name and check["backend"] > check["eager"]
