"""The renderer base (core/renderer/base.py): one driver walks a kernel's program for every dialect, and targets
are found by name (runtime/devices.py)."""
import pickle
import pytest
import torch
import torch_uop
from torch_uop.core.uop import Ops
from torch_uop.core.renderer.base import Renderer
from torch_uop.core.renderer.llvmir import LLVMRenderer
from torch_uop.core.renderer.cstyle import OpenCLRenderer, CUDARenderer
from torch_uop.runtime.devices import Target, CPUTarget, OpenCLTarget, CUDATarget, TARGETS


class TraceRenderer(Renderer):
  """A dialect that writes one line per hook call: what the shared driver hands each hook."""
  name = "trace"

  def finish(self, k): return "\n".join(k.lines)
  def buffer(self, k, u, position): return f"b{position}"
  def local_buffer(self, k, u): return f"l{u.arg[0]}"
  def size_var(self, k, u): return k.tmp("v")
  def open_loop(self, k, r):
    k.emit(f"open {k.tmp('r')}")
    return f"r{k.counter}"
  def close_loop(self, k, r): k.emit(f"close {k.names[r]}")
  def break_unless(self, k, cond, r): k.emit(f"break {k.names[r]}")
  def accumulator(self, k, u, owner, start):
    a = k.tmp("acc")
    k.emit(f"acc {a} {owner.op.name} start={start.arg if start.op is Ops.CONST else k.names[start]}")
    return a
  def set_state(self, k, u, acc, value): k.emit(f"set {acc}")
  def accumulate(self, k, u, acc, value): k.emit(f"step {acc} {u.arg.name}")
  def read_state(self, k, u, acc): return k.tmp()
  def reduce_result(self, k, u, acc):
    k.emit(f"result {acc}")
    return k.tmp()
  def load(self, k, u): return k.tmp()
  def store(self, k, u): k.emit(f"store {k.names[u.src[0]]}")
  def alu(self, k, u): return k.tmp()


def _kernels(fn, *inputs):
  with torch_uop.debug.capture() as graphs:
    torch.testing.assert_close(torch.compile(fn, backend="uop")(*inputs), fn(*inputs))
  return [k for g in graphs for k in g.kernels]


def test_one_driver_hands_every_node_to_its_dialect_hook():
  """Loops close in the order they opened, every reduction steps and reads the accumulator its DEFINE_ACC made
  (started from the reduction's identity), and each store follows its kernel's loops: for real kernels of a softmax
  and a max reduction, through a dialect written only from the hooks."""
  x = torch.randn(33, 70)
  kernels = _kernels(lambda x: (torch.softmax(x, -1), x.amax(0)), x)
  assert kernels
  for k in kernels:
    lines = TraceRenderer().render(k).splitlines()
    opened, accs = [], {}
    for line in (s.strip() for s in lines):
      op, *rest = line.split()
      if op == "open": opened.append(rest[0])
      elif op == "close": assert rest[0] == opened.pop(), lines
      elif op == "acc":
        accs[rest[0]] = rest
        if rest[1] == "REDUCE": assert float(rest[2].split("=")[1]) in (0.0, float("-inf")), lines
      elif op in ("step", "result"): assert rest[0] in accs, lines
    assert not opened, lines
    reduces = [u for u in k.program if u.op is Ops.REDUCE]
    assert sum(line.strip().startswith("result") for line in lines) == len(reduces)


def test_a_dialect_without_a_hook_says_which():
  class NoLoads(TraceRenderer):
    name = "noloads"
    load = Renderer.load
  k = _kernels(lambda x: x.sum(0), torch.randn(8, 5))[0]
  with pytest.raises(NotImplementedError, match="noloads renderer: loads"):
    NoLoads().render(k)


def test_renderers_rename_their_own_function_spelling():
  k = _kernels(lambda x: x * 2 + 1, torch.randn(100))[0]
  src = LLVMRenderer().render(k)
  assert f"@{k.name}(" in src and "@other(" in LLVMRenderer.rename(src, k.name, "other")
  c = CUDARenderer().render_kernel("kern", [u for u in k.program], k.argument_ids)
  assert " kern(" in c and CUDARenderer.rename(c, "kern", "other").count(" other(") == 1


def test_targets_are_found_by_name():
  assert type(Target("cpu")) is CPUTarget and type(Target("opencl")) is OpenCLTarget
  assert type(Target("cuda", 1)) is CUDATarget and Target("cuda", 1).torch_device == torch.device("cuda", 1)
  assert isinstance(Target("cpu").renderer(), LLVMRenderer) and isinstance(Target("opencl").renderer(), OpenCLRenderer)
  assert Target("cpu").kind == "cpu" and Target("opencl").kind == Target("cuda").kind == "gpu"
  assert Target("cuda", 1) == pickle.loads(pickle.dumps(Target("cuda", 1))) != Target("cuda", 0)
  assert set(TARGETS) >= {"cpu", "opencl", "cuda"}
  with pytest.raises(ValueError, match="no target 'tpu'; targets: cpu, opencl, cuda"):
    Target("tpu")
