"""Snapshots of what the compiler emits for small kernels: the kernel UOp graph and the LLVM IR.

They change whenever codegen, the simplifier or the renderer change; read the diff, and if the new
output is right, refresh with `EXPECTTEST_ACCEPT=1 pytest tests/test_snapshots.py`.
Kernels are built with `torch_uop.debug.compile_graph` (make_fx, no Dynamo), so names are stable.
"""
import torch
import torch.nn.functional as F
import expecttest
import torch_uop
import torch_uop.debug
from torch_uop.core.uop import pretty


def build(fn, *inputs, name):
  g = torch_uop.debug.compile_graph(fn, *inputs, name=name)
  outs = g(*inputs)
  expected = fn(*inputs)
  torch.testing.assert_close(outs[0], expected)
  return g


class TestSnapshots(expecttest.TestCase):
  def test_add_relu(self):
    x, y = torch.randn(4, 5), torch.randn(4, 5)
    g = build(lambda x, y: (x + y).relu(), x, y, name="add_relu")
    self.assertEqual(len(g.kernels), 1)
    k = g.kernels[0]
    self.assertEqual(k.buffers, [2, 0, 1])  # output first, then the inputs as its expression reads them
    self.assertEqual(k.argument_ids, [0, 1, 2])  # the AST numbers them by argument (codegen.canonical_item)
    self.assertExpectedInline(pretty(k.ast), """\
%0 = DEFINE_GLOBAL:float32() 0
%1 = CONST:int64() 20
%2 = RANGE:int64(%1) SPLIT(1)
%3 = DEFINE_GLOBAL:float32() 1
%4 = LOAD:float32(%3, %2)
%5 = DEFINE_GLOBAL:float32() 2
%6 = LOAD:float32(%5, %2)
%7 = ADD:float32(%4, %6)
%8 = CONST:float32() 0.0
%9 = MAX:float32(%7, %8)
%10 = STORE:void(%0, %2, %9)
%11 = SINK:void(%10)""")
    self.assertExpectedInline(g.sources[0], """\
declare float @llvm.maximum.f32(float, float)

define void @add_relu_k0(ptr noalias %b0, ptr noalias %b1, ptr noalias %b2, i64 %lo, i64 %hi) #0 {
entry:
  %r0.addr = alloca i64
  br label %start
start:
  store i64 %lo, ptr %r0.addr
  br label %r0.cond
r0.cond:
  %r0 = load i64, ptr %r0.addr
  %r0.c = icmp slt i64 %r0, %hi
  br i1 %r0.c, label %r0.body, label %r0.exit
r0.body:
  %t1 = getelementptr inbounds float, ptr %b1, i64 %r0
  %t2 = load float, ptr %t1
  %t3 = getelementptr inbounds float, ptr %b2, i64 %r0
  %t4 = load float, ptr %t3
  %t5 = fadd contract float %t2, %t4
  %t6 = call float @llvm.maximum.f32(float %t5, float 0x0000000000000000)
  %t7 = getelementptr inbounds float, ptr %b0, i64 %r0
  store float %t6, ptr %t7
  %r0.next = add nsw i64 %r0, 1
  store i64 %r0.next, ptr %r0.addr
  br label %r0.cond, !llvm.loop !0
r0.exit:
  ret void
}

attributes #0 = { nounwind noinline }
!0 = distinct !{!0, !1}
!1 = !{!"llvm.loop.mustprogress"}
!2 = distinct !{!2, !1, !3}
!3 = !{!"llvm.loop.vectorize.enable", i1 false}
!4 = distinct !{!4, !1, !5}
!5 = !{!"llvm.loop.vectorize.enable", i1 true}
!7 = distinct !{!7, !1, !8}
!8 = !{!"llvm.loop.unroll.disable"}
!9 = distinct !{!9, !1, !3, !8}
""")

  def test_row_sum(self):
    x = torch.randn(4, 5)
    g = build(lambda x: x.sum(-1), x, name="row_sum")
    self.assertEqual(len(g.kernels), 1)
    self.assertExpectedInline(pretty(g.kernels[0].ast), """\
%0 = DEFINE_GLOBAL:float32() 0
%1 = CONST:int64() 4
%2 = RANGE:int64(%1) SPLIT(0)
%3 = DEFINE_GLOBAL:float32() 1
%4 = CONST:int64() 5
%5 = MUL:int64(%2, %4)
%6 = RANGE:int64(%4) REDUCE(1)
%7 = ADD:int64(%5, %6)
%8 = LOAD:float32(%3, %7)
%9 = REDUCE:float32(%8, %6) Ops.ADD
%10 = STORE:void(%0, %2, %9)
%11 = SINK:void(%10)""")
    self.assertExpectedInline(g.sources[0], """\


define void @row_sum_k0(ptr noalias %b0, ptr noalias %b1, i64 %lo, i64 %hi) #0 {
entry:
  %r0.addr = alloca i64
  %acc0 = alloca float
  %r1.addr = alloca i64
  br label %start
start:
  store i64 %lo, ptr %r0.addr
  br label %r0.cond
r0.cond:
  %r0 = load i64, ptr %r0.addr
  %r0.c = icmp slt i64 %r0, %hi
  br i1 %r0.c, label %r0.body, label %r0.exit
r0.body:
  %t1 = mul i64 %r0, 5
  store float 0x0000000000000000, ptr %acc0
  store i64 0, ptr %r1.addr
  br label %r1.cond
r1.cond:
  %r1 = load i64, ptr %r1.addr
  %r1.c = icmp slt i64 %r1, 5
  br i1 %r1.c, label %r1.body, label %r1.exit
r1.body:
  %t2 = add i64 %t1, %r1
  %t3 = getelementptr inbounds float, ptr %b1, i64 %t2
  %t4 = load float, ptr %t3
  %t5 = load float, ptr %acc0
  %t6 = fadd reassoc nsz contract float %t5, %t4
  store float %t6, ptr %acc0
  %r1.next = add nsw i64 %r1, 1
  store i64 %r1.next, ptr %r1.addr
  br label %r1.cond, !llvm.loop !0
r1.exit:
  %t7 = load float, ptr %acc0
  %t8 = getelementptr inbounds float, ptr %b0, i64 %r0
  store float %t7, ptr %t8
  %r0.next = add nsw i64 %r0, 1
  store i64 %r0.next, ptr %r0.addr
  br label %r0.cond, !llvm.loop !9
r0.exit:
  ret void
}

attributes #0 = { nounwind noinline }
!0 = distinct !{!0, !1}
!1 = !{!"llvm.loop.mustprogress"}
!2 = distinct !{!2, !1, !3}
!3 = !{!"llvm.loop.vectorize.enable", i1 false}
!4 = distinct !{!4, !1, !5}
!5 = !{!"llvm.loop.vectorize.enable", i1 true}
!7 = distinct !{!7, !1, !8}
!8 = !{!"llvm.loop.unroll.disable"}
!9 = distinct !{!9, !1, !3, !8}
""")

  def test_pad_flip_gated_load(self):
    # the padded border is a masked-off load: the kernel must gate the read, not read out of bounds
    x = torch.randn(3, 4)
    g = build(lambda x: F.pad(x.flip(1), (1, 0)) * 2, x, name="pad_flip")
    self.assertEqual(len(g.kernels), 1)
    self.assertExpectedInline(pretty(g.kernels[0].ast), """\
%0 = DEFINE_GLOBAL:float32() 0
%1 = CONST:int64() 3
%2 = RANGE:int64(%1) SPLIT(0)
%3 = CONST:int64() 5
%4 = MUL:int64(%2, %3)
%5 = RANGE:int64(%3) GLOBAL(1)
%6 = ADD:int64(%4, %5)
%7 = CONST:int64() 1
%8 = CMPLE:bool(%7, %5)
%9 = DEFINE_GLOBAL:float32() 1
%10 = CONST:int64() 4
%11 = MUL:int64(%2, %10)
%12 = CONST:int64() -1
%13 = MUL:int64(%5, %12)
%14 = ADD:int64(%11, %13)
%15 = ADD:int64(%14, %10)
%16 = LOAD:float32(%9, %15, %8)
%17 = CONST:float32() 0.0
%18 = WHERE:float32(%8, %16, %17)
%19 = CONST:float32() 2.0
%20 = MUL:float32(%18, %19)
%21 = STORE:void(%0, %6, %20)
%22 = SINK:void(%21)""")

  def test_capture_under_torch_compile(self):
    x = torch.randn(6, 7)
    with torch_uop.debug.capture() as graphs:
      out = torch.compile(lambda x: x - x.mean(0, keepdim=True), backend="uop")(x)
    torch.testing.assert_close(out, x - x.mean(0, keepdim=True))
    self.assertEqual(len(graphs), 1)
    self.assertEqual([k.name for k in graphs[0].kernels], ["inference1_k0", "inference1_k1"])
    self.assertEqual(len(graphs[0].sources), 2)
    self.assertEqual(torch_uop.metrics()["kernels_compiled"], 2)
    # outside the block nothing is recorded
    torch.compile(lambda x: x * 3, backend="uop")(x)
    self.assertEqual(len(graphs), 1)


if __name__ == "__main__":
  import unittest
  unittest.main()
