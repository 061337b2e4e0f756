"""The model zoo: real models from transformers, torchvision, timm and diffusers, built from their
libraries' own code with random weights (no downloads), plus two memory-bound kernels, and (group "more", `MORE`)
models beyond the zoo of record that check speed on architectures and sizes nothing was tuned on.

`ZOO` maps a name to a `ZooEntry`; `build(name, size)` returns (model in eval mode, example inputs
tuple), seeded so two builds are identical. Sizes: "real" keeps a model's widths, channels, image and
sequence sizes (transformers cut to 2 layers, vision nets whole; batch 1, sequence 128, images 224),
"tiny" is 1 layer, width 32-64 and small images, for tests. `loss_of(output)` is the scalar a
training step backpropagates: a fixed weighted mean of `main_output(output)` (a transformers model's
last_hidden_state, a UNet's sample). benchmarks/bench_zoo.py measures these; tests/test_zoo.py checks
the tiny ones. This module only builds models: it does not compile or time them.
"""
from __future__ import annotations
import importlib
import sys
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn as nn

SIZES = ("real", "tiny")
SEQ = {"real": 128, "tiny": 16}


@dataclass(frozen=True)
class ZooEntry:
  name: str
  library: str                     # the package the model comes from ("torch" for the kernels)
  group: str                       # "models" (the zoo of record, in its geomean), "more" (models beyond it) or "kernels"
  build: Callable                  # size -> (nn.Module, inputs tuple)
  description: dict                # size -> one line
  bytes_moved: Callable | None = None  # kernels: size -> bytes one call reads and writes


# ----- packages -----

_torchvision_ops = None  # the stand-in operator library, kept alive while torchvision is in use


def import_torchvision():
  """`import torchvision`, also where its compiled `_C` does not match the installed (CPU) torch: such a wheel
  fails at import with "operator torchvision::nms does not exist"; declaring the two operators it registers fake
  kernels for lets its Python side (models, transforms) load. transformers imports torchvision too."""
  global _torchvision_ops
  try:
    return importlib.import_module("torchvision")
  except RuntimeError as e:
    if "torchvision::" not in str(e): raise
  for mod in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]: del sys.modules[mod]
  if _torchvision_ops is None:
    _torchvision_ops = torch.library.Library("torchvision", "FRAGMENT")
    _torchvision_ops.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _torchvision_ops.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
  return importlib.import_module("torchvision")


def library_missing(library: str) -> str | None:
  """Why `library` cannot be used here (None: it can)."""
  if library == "torch": return None
  try:
    try: import_torchvision()  # transformers (also under diffusers) and timm import it where it is installed
    except ImportError:
      if library in ("torchvision", "timm"): raise
    importlib.import_module(library)
  except Exception as e:  # an ImportError, or a broken install
    return f"{library} cannot be imported ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
  return None


# ----- outputs and loss -----

def main_output(out) -> torch.Tensor:
  """The tensor a model's output stands for: a transformers model's last_hidden_state, a diffusers UNet's
  sample, the first element of a tuple (or of a dict: a torchvision segmentation model's "out"), or the tensor itself."""
  if isinstance(out, torch.Tensor): return out
  for key in ("last_hidden_state", "sample"):
    value = getattr(out, key, None)
    if isinstance(value, torch.Tensor): return value
  if isinstance(out, (tuple, list)) or hasattr(out, "to_tuple"): return main_output(out[0])
  if isinstance(out, dict) and out: return main_output(next(iter(out.values())))  # torchvision segmentation's "out"
  raise TypeError(f"no main output tensor in a {type(out).__name__}")


def loss_of(out) -> torch.Tensor:
  """The scalar a training step backpropagates: the mean of the main output weighted by a fixed ramp from -1 to 1.
  (Not its mean or mean square: after a final LayerNorm or RMSNorm those are constant, and every gradient
  upstream of the norm would be rounding noise.)"""
  y = main_output(out).float()
  return (y * torch.linspace(-1.0, 1.0, y.numel()).reshape(y.shape)).mean()


def assert_matches(actual: tuple, expected: tuple, rtol: float, atol_scale: float) -> None:
  """Compare (main output, {parameter name: grad} or None) with a reference, each tensor with
  torch.testing.assert_close at `rtol` and an absolute tolerance of `atol_scale` times its reference's largest
  magnitude. A gradient's absolute tolerance is at least `atol_scale` x 1e-3 x the largest gradient of the model:
  a gradient that is zero in exact arithmetic (an attention key bias's) is rounding noise on both sides."""
  out, grads = actual
  ref_out, ref_grads = expected

  def close(got, ref, what, floor=0.0):
    atol = max(atol_scale * ref.detach().abs().max().item() if ref.numel() else 0.0, floor, 1e-30)
    torch.testing.assert_close(got, ref, rtol=rtol, atol=atol, msg=lambda m: f"{what}: {m}")
  close(out, ref_out, "output")
  if not ref_grads: return
  largest = max((g.abs().max().item() for g in ref_grads.values() if g is not None and g.numel()), default=0.0)
  for name, ref in ref_grads.items():
    got = grads.get(name)
    if ref is None and got is None: continue
    if ref is None or got is None: raise AssertionError(f"grad of {name}: {'missing' if got is None else 'not in eager'}")
    close(got, ref, f"grad of {name}", atol_scale * 1e-3 * largest)


# ----- inputs -----

def _tokens(vocab: int, size: str, batch: int = 1, seq: int | None = None, low: int = 0) -> torch.Tensor:
  return torch.randint(low, vocab, (batch, seq or SEQ[size]))


def _image(size: str, real_px: int = 224, tiny_px: int = 32, batch: int = 1) -> torch.Tensor:
  px = real_px if size == "real" else tiny_px
  return torch.randn(batch, 3, px, px)


# ----- transformers -----

TINY_TEXT = dict(vocab_size=256, max_position_embeddings=64)


def _gpt2(size):
  from transformers import GPT2Config, GPT2Model
  cfg = dict(n_embd=768, n_head=12, n_layer=2) if size == "real" else dict(n_embd=64, n_head=2, n_layer=1, vocab_size=256, n_positions=64, bos_token_id=0, eos_token_id=0)
  model = GPT2Model(GPT2Config(**cfg, use_cache=False, attn_implementation="sdpa"))
  return model, (_tokens(model.config.vocab_size, size),)


def _bert_config(size):
  from transformers import BertConfig
  if size == "real": return BertConfig(num_hidden_layers=2, attn_implementation="sdpa")  # bert-base widths
  return BertConfig(hidden_size=64, num_hidden_layers=1, num_attention_heads=2, intermediate_size=128, **TINY_TEXT,
                    attn_implementation="sdpa")


def _bert(size, seq=None):
  from transformers import BertModel
  model = BertModel(_bert_config(size), add_pooling_layer=False)
  return model, (_tokens(model.config.vocab_size, size, seq=seq),)


def _bert_s512(size):
  return _bert(size, seq=512 if size == "real" else 64)


def _roberta(size):
  from transformers import RobertaConfig, RobertaModel
  common = dict(type_vocab_size=1, pad_token_id=1, layer_norm_eps=1e-5, attn_implementation="sdpa")
  if size == "real": cfg = RobertaConfig(vocab_size=50265, max_position_embeddings=514, num_hidden_layers=2, **common)
  else: cfg = RobertaConfig(hidden_size=64, num_hidden_layers=1, num_attention_heads=2, intermediate_size=128,
                            vocab_size=256, max_position_embeddings=66, **common)
  model = RobertaModel(cfg, add_pooling_layer=False)
  return model, (_tokens(cfg.vocab_size, size, low=3),)  # no padding tokens (id 1)


def _llama(size):
  from transformers import LlamaConfig, LlamaModel
  if size == "real":  # SmolLM-135M widths
    cfg = LlamaConfig(hidden_size=576, intermediate_size=1536, num_attention_heads=9, num_key_value_heads=3,
                      vocab_size=49152, max_position_embeddings=2048, rms_norm_eps=1e-5, num_hidden_layers=2)
  else:
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                      num_hidden_layers=1, **TINY_TEXT)
  cfg.use_cache, cfg._attn_implementation = False, "sdpa"
  model = LlamaModel(cfg)
  return model, (_tokens(cfg.vocab_size, size),)


def _qwen2(size):
  from transformers import Qwen2Config, Qwen2Model
  if size == "real":  # Qwen2-0.5B widths
    cfg = Qwen2Config(hidden_size=896, intermediate_size=4864, num_attention_heads=14, num_key_value_heads=2,
                      vocab_size=151936, max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=1e6,
                      num_hidden_layers=2)
  else:
    cfg = Qwen2Config(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                      num_hidden_layers=1, **TINY_TEXT)
  cfg.use_cache, cfg._attn_implementation = False, "sdpa"
  model = Qwen2Model(cfg)
  return model, (_tokens(cfg.vocab_size, size),)


def _t5_encoder(size):
  from transformers import T5Config, T5EncoderModel
  if size == "real":  # t5-small widths
    cfg = T5Config(d_model=512, d_kv=64, d_ff=2048, num_heads=8, num_layers=2, vocab_size=32128, feed_forward_proj="relu")
  else:
    cfg = T5Config(d_model=64, d_kv=16, d_ff=128, num_heads=4, num_layers=1, vocab_size=256, feed_forward_proj="relu")
  cfg.use_cache, cfg._attn_implementation = False, "sdpa"
  model = T5EncoderModel(cfg)
  return model, (_tokens(cfg.vocab_size, size),)


def _vit(size):
  from transformers import ViTConfig, ViTModel
  if size == "real": cfg = ViTConfig(num_hidden_layers=2, image_size=224, patch_size=16)  # ViT-base widths
  else: cfg = ViTConfig(hidden_size=64, num_hidden_layers=1, num_attention_heads=2, intermediate_size=128, image_size=32, patch_size=8)
  cfg._attn_implementation = "sdpa"
  model = ViTModel(cfg, add_pooling_layer=False)
  return model, (_image(size),)


# ----- torchvision -----

def _resnet18(size):
  models = import_torchvision().models
  if size == "real": return models.resnet18(), (_image(size),)
  return models.resnet.ResNet(models.resnet.BasicBlock, [1, 1, 1, 1], num_classes=10), (_image(size),)


def _mobilenet_v3_small(size):
  models = import_torchvision().models
  if size == "real": return models.mobilenet_v3_small(), (_image(size),)
  return models.mobilenet_v3_small(width_mult=0.25, num_classes=10), (_image(size, tiny_px=64),)


def _efficientnet_b0(size):
  models = import_torchvision().models
  return models.efficientnet_b0(num_classes=1000 if size == "real" else 10), (_image(size),)


# ----- timm -----

def _timm(name: str, tiny: dict, tiny_px: int = 32):
  def build(size):
    import_torchvision()
    import timm
    model = timm.create_model(name, pretrained=False, **({} if size == "real" else dict(num_classes=10, **tiny)))
    return model, (_image(size, tiny_px=tiny_px),)
  return build


# ----- diffusers -----

def _unet(size):
  from diffusers import UNet2DConditionModel
  if size == "real":
    cfg = dict(block_out_channels=(128, 256), layers_per_block=1, cross_attention_dim=768, attention_head_dim=8)
    latent, tokens, width = 32, 8, 768
  else:
    cfg = dict(block_out_channels=(32, 64), layers_per_block=1, cross_attention_dim=32, attention_head_dim=4, norm_num_groups=8)
    latent, tokens, width = 8, 4, 32
  model = UNet2DConditionModel(sample_size=latent, in_channels=4, out_channels=4,
                               down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                               up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), **cfg)
  return model, (torch.randn(1, 4, latent, latent), torch.tensor([500]), torch.randn(1, tokens, width))


# ----- more models: beyond the zoo of record, for checking that speed holds on shapes it was not tuned on -----

def _whisper_encoder(size):
  import_torchvision()  # (transformers' Whisper modules import torchvision's image code)
  from transformers import WhisperConfig, WhisperModel
  if size == "real":  # whisper-tiny widths; 2 layers; 30 s of 80-bin log-mel frames
    cfg, frames = WhisperConfig(d_model=384, encoder_attention_heads=6, encoder_ffn_dim=1536, encoder_layers=2, decoder_layers=1), 3000
  else:
    cfg, frames = WhisperConfig(d_model=64, encoder_attention_heads=2, encoder_ffn_dim=128, encoder_layers=1, decoder_layers=1,
                                decoder_attention_heads=2, decoder_ffn_dim=128,
                                num_mel_bins=16, max_source_positions=32), 64
  cfg._attn_implementation = "sdpa"
  return WhisperModel(cfg).get_encoder(), (torch.randn(1, cfg.num_mel_bins, frames),)


def _distilbert(size):
  import_torchvision()
  from transformers import DistilBertConfig, DistilBertModel
  if size == "real": cfg = DistilBertConfig(n_layers=2)  # distilbert-base widths
  else: cfg = DistilBertConfig(dim=64, n_heads=2, hidden_dim=128, n_layers=1, vocab_size=256, max_position_embeddings=64)
  cfg._attn_implementation = "sdpa"
  return DistilBertModel(cfg), (_tokens(cfg.vocab_size, size),)


def _gemma(size):
  import_torchvision()
  from transformers import GemmaConfig, GemmaModel
  if size == "real":  # one key/value head, GeGLU feed-forward
    cfg = GemmaConfig(hidden_size=512, intermediate_size=2048, num_attention_heads=8, num_key_value_heads=1, head_dim=64,
                      num_hidden_layers=2, vocab_size=32000)
  else:
    cfg = GemmaConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=1, head_dim=16,
                      num_hidden_layers=1, **TINY_TEXT)
  cfg.use_cache, cfg._attn_implementation = False, "sdpa"
  return GemmaModel(cfg), (_tokens(cfg.vocab_size, size),)


def _torchvision(name: str, real_px: int = 224):
  def build(size):
    models = import_torchvision().models
    return getattr(models, name)(**({} if size == "real" else dict(num_classes=10))), (_image(size, real_px),)
  return build


def _unet64(size):
  if size == "tiny": return _unet(size)
  model, (_, t, _) = _unet(size)
  return model, (torch.randn(1, 4, 64, 64), t, torch.randn(1, 77, 768))  # 4096 latent pixels, a 77-token prompt


def _r3d_18(size):  # a video ResNet: 3-D convolutions throughout
  models = import_torchvision().models.video
  frames, px = (8, 112) if size == "real" else (4, 32)
  return models.r3d_18(**({} if size == "real" else dict(num_classes=10))), (torch.randn(1, 3, frames, px, px),)


def _deeplab(size):  # dilated convolutions (ASPP rates 12, 24, 36 over a 16x16 map at 256 px), bilinear resizes
  models = import_torchvision().models.segmentation
  model = models.deeplabv3_mobilenet_v3_large(weights=None, weights_backbone=None, num_classes=21 if size == "real" else 4)
  return model, (_image(size, 256, 64),)


def _segformer(size):
  import_torchvision()
  from transformers import SegformerConfig, SegformerForSemanticSegmentation
  if size == "real": cfg = SegformerConfig()  # mit-b0 widths
  else: cfg = SegformerConfig(hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1], num_attention_heads=[1, 1, 2, 4],
                              decoder_hidden_size=64, num_labels=4)
  return SegformerForSemanticSegmentation(cfg), (_image(size, 256, 64),)


def _wav2vec2(size):
  import_torchvision()
  from transformers import Wav2Vec2Config, Wav2Vec2Model
  if size == "real": cfg, samples = Wav2Vec2Config(num_hidden_layers=2), 16000  # wav2vec2-base widths, 1 s of audio
  else:
    cfg, samples = Wav2Vec2Config(hidden_size=64, num_hidden_layers=1, num_attention_heads=2, intermediate_size=128,
                                  conv_dim=(32,) * 7, num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4), 4000
  return Wav2Vec2Model(cfg), (torch.randn(1, samples),)


# ----- kernels -----

class ScaledSoftmax(nn.Module):
  def forward(self, x): return torch.softmax(x * 0.125, dim=-1)


class PointwiseMix(nn.Module):
  def forward(self, a, b): return torch.tanh(a) * torch.sigmoid(b) + torch.sqrt(torch.abs(a - b)) * 0.5


SOFTMAX_SHAPE = {"real": (4096, 1024), "tiny": (64, 128)}
POINTWISE_N = {"real": 1 << 22, "tiny": 4096}


def _softmax(size): return ScaledSoftmax(), (torch.randn(*SOFTMAX_SHAPE[size]),)
def _pointwise(size): return PointwiseMix(), (torch.randn(POINTWISE_N[size]), torch.randn(POINTWISE_N[size]))


# ----- the table -----

def _entry(name, library, build, real, tiny, group="models", bytes_moved=None):
  return name, ZooEntry(name, library, group, build, {"real": real, "tiny": tiny}, bytes_moved)


ZOO: dict[str, ZooEntry] = dict([
  _entry("gpt2", "transformers", _gpt2, "GPT2Model d=768, 12 heads, 2 layers, 1x128 tokens", "1 layer, d=64"),
  _entry("bert", "transformers", _bert, "BertModel (bert-base widths) d=768, 12 heads, ffn 3072, 2 layers, 1x128 tokens", "1 layer, d=64"),
  _entry("roberta", "transformers", _roberta, "RobertaModel (roberta-base widths), 2 layers, 1x128 tokens", "1 layer, d=64"),
  _entry("llama", "transformers", _llama, "LlamaModel (SmolLM-135M widths) d=576, ffn 1536, 9 heads / 3 kv heads, 2 layers, 1x128 tokens",
         "1 layer, d=64, 4 heads / 2 kv heads"),
  _entry("qwen2", "transformers", _qwen2, "Qwen2Model (Qwen2-0.5B widths) d=896, ffn 4864, 14 heads / 2 kv heads, 2 layers, 1x128 tokens",
         "1 layer, d=64, 4 heads / 2 kv heads"),
  _entry("t5_encoder", "transformers", _t5_encoder, "T5EncoderModel (t5-small widths) d=512, ffn 2048, 8 heads, 2 layers, 1x128 tokens",
         "1 layer, d=64"),
  _entry("vit", "transformers", _vit, "ViTModel (ViT-base widths) d=768, 12 heads, 2 layers, 1x3x224x224", "1 layer, d=64, 32px"),
  _entry("bert_s512", "transformers", _bert_s512, "BertModel (bert-base widths), 2 layers, 1x512 tokens (attention-heavy)",
         "1 layer, d=64, 64 tokens"),
  _entry("resnet18", "torchvision", _resnet18, "torchvision resnet18, 1x3x224x224", "ResNet, 1 block per stage, 32px"),
  _entry("mobilenet_v3_small", "torchvision", _mobilenet_v3_small, "torchvision mobilenet_v3_small, 1x3x224x224", "width 0.25, 64px"),
  _entry("efficientnet_b0", "torchvision", _efficientnet_b0, "torchvision efficientnet_b0, 1x3x224x224", "whole net, 32px"),
  _entry("convnext_atto", "timm", _timm("convnext_atto", dict(depths=(1, 1, 1, 1), dims=(16, 32, 64, 128))),
         "timm convnext_atto, 1x3x224x224", "1 block per stage, dims 16-128, 32px"),
  _entry("deit_tiny", "timm", _timm("deit_tiny_patch16_224", dict(img_size=32, patch_size=8, depth=1, embed_dim=64, num_heads=2)),
         "timm deit_tiny_patch16_224 (12 layers, d=192), 1x3x224x224", "1 layer, d=64, 32px"),
  _entry("resnet50", "timm", _timm("resnet50", dict(layers=[1, 1, 1, 1])), "timm resnet50, 1x3x224x224", "1 block per stage, 32px"),
  _entry("unet", "diffusers", _unet, "UNet2DConditionModel, channels (128, 256), 1 layer per block, cross attention (768), "
         "1x4x32x32 latents, 8 text tokens", "channels (32, 64), 1 layer per block, 8x8 latents"),
  _entry("whisper_encoder", "transformers", _whisper_encoder, "WhisperModel encoder (whisper-tiny widths) d=384, 6 heads, "
         "2 layers, 1x80x3000 frames (two 1-D convolutions, 1500-token attention)", "1 layer, d=64, 16x64 frames", "more"),
  _entry("distilbert", "transformers", _distilbert, "DistilBertModel d=768, 12 heads, 2 layers, 1x128 tokens", "1 layer, d=64", "more"),
  _entry("gemma", "transformers", _gemma, "GemmaModel d=512, 8 heads / 1 kv head, GeGLU ffn 2048, 2 layers, 1x128 tokens",
         "1 layer, d=64", "more"),
  _entry("swin_t", "torchvision", _torchvision("swin_t"), "torchvision swin_t (shifted windows), 1x3x224x224", "whole net, 32px", "more"),
  _entry("densenet121", "torchvision", _torchvision("densenet121", 160), "torchvision densenet121 (concats of up to 32 parts), 1x3x160x160",
         "whole net, 32px", "more"),
  _entry("regnet_y_400mf", "torchvision", _torchvision("regnet_y_400mf"), "torchvision regnet_y_400mf (grouped convs, SE), 1x3x224x224",
         "whole net, 32px", "more"),
  _entry("mobilevit_xxs", "timm", _timm("mobilevit_xxs", {}, tiny_px=64), "timm mobilevit_xxs (unfolded patches, attention), 1x3x224x224",
         "whole net, 64px", "more"),
  _entry("unet_64", "diffusers", _unet64, "the zoo's UNet at 1x4x64x64 latents, 77 text tokens (4096-token self-attention)",
         "as the zoo's tiny UNet", "more"),
  _entry("r3d_18", "torchvision", _r3d_18, "torchvision video r3d_18 (3-D convolutions), 1x3x8x112x112", "4 frames, 32px", "more"),
  _entry("deeplabv3_mnv3", "torchvision", _deeplab, "torchvision deeplabv3_mobilenet_v3_large (dilated ASPP), 1x3x256x256",
         "4 classes, 64px", "more"),
  _entry("segformer", "transformers", _segformer, "SegformerForSemanticSegmentation (mit-b0 widths; bilinear resizes), "
         "1x3x256x256", "1 block per stage, dims 16-128, 64px", "more"),
  _entry("wav2vec2", "transformers", _wav2vec2, "Wav2Vec2Model (wav2vec2-base widths), 2 layers, 1 s of 16 kHz audio "
         "(7 strided 1-D convolutions, a weight-normed grouped one)", "1 layer, d=64, 4000 samples", "more"),
  _entry("softmax", "torch", _softmax, "softmax(x*0.125, -1) over 4096x1024 float32", "64x128", "kernels",
         lambda size: 2 * 4 * SOFTMAX_SHAPE[size][0] * SOFTMAX_SHAPE[size][1]),
  _entry("pointwise", "torch", _pointwise, "tanh(a)*sigmoid(b)+sqrt(abs(a-b))*0.5 over 4M float32", "4096 float32", "kernels",
         lambda size: 3 * 4 * POINTWISE_N[size]),
])

MODELS = [n for n, e in ZOO.items() if e.group == "models"]
MORE = [n for n, e in ZOO.items() if e.group == "more"]  # not in the default run or its geomeans (bench_zoo.py --set more)
KERNELS = [n for n, e in ZOO.items() if e.group == "kernels"]


def build(name: str, size: str = "real", seed: int = 0) -> tuple[nn.Module, tuple]:
  """(model in eval mode, example inputs) for a zoo entry; the same seed gives the same weights and inputs."""
  if name not in ZOO: raise ValueError(f"unknown zoo entry {name!r}; choose from {', '.join(ZOO)}")
  if size not in SIZES: raise ValueError(f"unknown size {size!r}; choose from {', '.join(SIZES)}")
  entry = ZOO[name]
  reason = library_missing(entry.library)
  if reason: raise ImportError(reason)
  torch.manual_seed(seed)
  model, inputs = entry.build(size)
  return model.eval(), inputs
