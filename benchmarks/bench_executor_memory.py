"""Bytes the executor allocates in one training step of the CNN and the transformer block, per compiled graph:
the peak of live buffers with each freed after its last use (before the arena) and with kernel-only
intermediates in the planned arena (after), and the arena bytes a graph keeps between calls."""
import torch
import torch.nn.functional as F
import torch_uop  # noqa: F401
from torch_uop.debug import capture
from torch_uop.testing.models import CNN, Block


def main():
  cases = {"cnn": (CNN(), torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))),
           "tf": (Block(), torch.randint(0, 100, (4, 32)), torch.randint(0, 100, (4 * 32,)))}
  for name, (model, x, y) in cases.items():
    torch._dynamo.reset()
    step = torch.compile(lambda m, x, y: F.cross_entropy(m(x).reshape(y.shape[0], -1), y), backend="uop")
    with capture() as graphs:
      step(model, x, y).backward()
    before = after = kept = 0
    for g in graphs:
      print(f"{name} {len(g.kernels):3d} kernels: arena {g.arena_bytes / 1024:8.1f} KiB for {len(g.arena_offsets)} buffers "
            f"(of {sum(g.buffers[s].nbytes for s in g.arena_offsets) / 1024:8.1f} KiB), peak {g.peak_bytes_unplanned / 1024:8.1f} "
            f"-> {g.peak_bytes / 1024:8.1f} KiB")
      before += g.peak_bytes_unplanned; after += g.peak_bytes; kept += g.arena_bytes
    print(f"{name} total over graphs: peak {before / 1024:.1f} KiB -> {after / 1024:.1f} KiB; kept between calls {kept / 1024:.1f} KiB")


if __name__ == "__main__": main()
