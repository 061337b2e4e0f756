"""The reference models torch_uop is checked and measured on: an MLP, a small CNN and a
transformer block. tests/test_models.py and benchmarks/bench_models.py both use these definitions,
so a test and a benchmark always mean the same model."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class MLP(nn.Module):
  def __init__(self):
    super().__init__()
    self.net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 10))

  def forward(self, x): return self.net(x)


class CNN(nn.Module):
  def __init__(self):
    super().__init__()
    self.c1, self.b1 = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
    self.c2, self.b2 = nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.BatchNorm2d(16)
    self.pool, self.gap, self.fc = nn.MaxPool2d(2), nn.AdaptiveAvgPool2d(1), nn.Linear(16, 10)

  def forward(self, x):
    x = self.pool(F.relu(self.b1(self.c1(x))))
    x = F.relu(self.b2(self.c2(x)))
    return self.fc(torch.flatten(self.gap(x), 1))


class Block(nn.Module):
  def __init__(self, d=32, h=4, v=100):
    super().__init__()
    self.emb, self.ln1 = nn.Embedding(v, d), nn.LayerNorm(d)
    self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
    self.ln2, self.mlp = nn.LayerNorm(d), nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
    self.head, self.h = nn.Linear(d, v), h

  def forward(self, ids):
    x = self.emb(ids)
    B, T, D = x.shape
    q, k, v = self.qkv(self.ln1(x)).split(D, dim=-1)
    q, k, v = (t.view(B, T, self.h, D // self.h).transpose(1, 2) for t in (q, k, v))
    a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, D)
    x = x + self.proj(a)
    x = x + self.mlp(self.ln2(x))
    return self.head(x)
