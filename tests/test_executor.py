"""The executor's call path: the generated fast path and its fallback to the general one, the arena that
intermediates share, builtin launchers, and the thread count read at each call."""
import os
import subprocess
import sys
import threading
import pytest
import torch
import torch_uop
from torch_uop.debug import capture
from torch_uop.runtime import executor, threads


def compiled(fn, *inputs):
  torch._dynamo.reset()
  with capture() as graphs:
    f = torch.compile(fn, backend="uop")
    f(*inputs)
  return f, graphs


def softmax_chain(x):  # reductions read back through broadcasts: several kernels with intermediates
  y = torch.softmax(x * 2, -1)
  return (torch.softmax(y.exp(), 0) * y).sum(0)


def test_repeated_calls_match_eager_and_outputs_stay_intact():
  x = torch.randn(32, 48)
  f, graphs = compiled(softmax_chain, x)
  g = graphs[-1]
  assert g.arena_offsets and "E" in g.call_source  # intermediates in the arena, kernels through builtin launchers
  first = f(x)
  torch.testing.assert_close(first, softmax_chain(x))
  kept = first.clone()
  for _ in range(3):
    other = torch.randn(32, 48)
    torch.testing.assert_close(f(other), softmax_chain(other))
  assert torch.equal(first, kept)  # the arena is reused, never an output handed out


def test_arena_shares_bytes_only_between_disjoint_lifetimes():
  x = torch.randn(16, 40)
  fn = lambda x: ((x.exp().sum(0, keepdim=True) * x).sin().sum(0, keepdim=True) * x).cos().sum(0, keepdim=True) * x
  _, graphs = compiled(fn, x)
  g = graphs[-1]
  live = {}
  for i, (kind, p) in enumerate(g.steps):
    for s in (p.slots if kind == "kernel" else p.in_slots):
      live.setdefault(s, [i, i])[1] = i
  placed = [(g.arena_offsets[s], g.buffers[s].nbytes, *live[s]) for s in g.arena_offsets]
  assert len(placed) >= 2
  for a, (o1, n1, s1, e1) in enumerate(placed):
    assert o1 % executor.ARENA_ALIGN == 0 and o1 + n1 <= g.arena_bytes
    for o2, n2, s2, e2 in placed[a + 1:]:
      if s1 <= e2 and s2 <= e1: assert o1 + n1 <= o2 or o2 + n2 <= o1
  assert g.arena_bytes < sum(n for _, n, _, _ in placed)  # some reuse happened


def test_per_call_arena(monkeypatch):
  monkeypatch.setattr(executor, "ARENA_KEEP_BYTES", 0)
  x = torch.randn(32, 48)
  f, graphs = compiled(softmax_chain, x)
  assert graphs[-1].arena is None and "base + " in graphs[-1].call_source
  for _ in range(2): torch.testing.assert_close(f(x), softmax_chain(x))


def test_unexpected_layout_takes_the_general_path():
  x = torch.randn(24, 24)
  f, graphs = compiled(lambda x: x * 2 + 1, x)
  t = torch.randn(24, 24).t()  # same shape, other strides: copied into the compiled layout
  torch.testing.assert_close(graphs[-1]([t]), [t * 2 + 1])


def test_calls_from_two_threads():
  x = torch.randn(32, 48)
  f, _ = compiled(softmax_chain, x)
  inputs = [torch.randn(32, 48) for _ in range(8)]
  results, errors = {}, []
  def work(i):
    try:
      for _ in range(20): results[i] = f(inputs[i])
    except Exception as e: errors.append(e)
  ts = [threading.Thread(target=work, args=(i,)) for i in range(len(inputs))]
  for t in ts: t.start()
  for t in ts: t.join()
  assert not errors
  for i, x in enumerate(inputs): torch.testing.assert_close(results[i], softmax_chain(x))


def test_launch_follows_torch_thread_count():
  calls = []
  fn = lambda *a: calls.append(a[-2:])
  before = torch.get_num_threads()
  try:
    torch.set_num_threads(1)
    threads.launch(fn, [0], 100, 4)
    assert calls == [(0, 100)]
    calls.clear()
    torch.set_num_threads(2)
    threads.launch(fn, [0], 100, 4)
    assert sorted(calls) == [(0, 50), (50, 100)]
  finally:
    torch.set_num_threads(before)
  assert threads.max_threads(1, 1 << 30) == 1 and threads.max_threads(64, 10) == 1  # tiny kernels: one thread


def test_big_kernel_correct_with_any_thread_count():
  x = torch.randn(512, 1024)
  f, graphs = compiled(lambda x: (x * 3).sin() + 1, x)
  assert any(p.max_threads > 1 for k, p in graphs[-1].steps if k == "kernel")
  before = torch.get_num_threads()
  try:
    for n in (1, 2):
      torch.set_num_threads(n)
      torch.testing.assert_close(f(x), (x * 3).sin() + 1)
  finally:
    torch.set_num_threads(before)


@pytest.mark.parametrize("shape", [(512, 1024), (509, 1031)])
def test_openmp_launcher_covers_the_split_loop(shape):
  # every thread takes its slice of the split loop (sizes that do not divide evenly, more threads than cores)
  from torch_uop.runtime.cpu import openmp_supported
  x = torch.randn(shape)
  f, graphs = compiled(lambda x: (x * 3).sin() + 1, x)
  steps = [p for k, p in graphs[-1].steps if k == "kernel" and p.max_threads > 1]
  assert steps
  if openmp_supported(): assert all(p.parallel_entry is not None for p in steps), "threaded kernels launch through OpenMP"
  before = torch.get_num_threads()
  try:
    for n in (1, 2, 3):
      torch.set_num_threads(n)
      torch.testing.assert_close(f(x), (x * 3).sin() + 1)
  finally:
    torch.set_num_threads(before)


def test_openmp_can_be_turned_off():
  script = ("import torch, torch_uop.debug as d\n"
            "from torch_uop.runtime.cpu import openmp_supported\n"
            "x = torch.randn(512, 1024)\n"
            "with d.capture() as gs: out = torch.compile(lambda x: (x * 3).sin() + 1, backend='uop')(x)\n"
            "torch.testing.assert_close(out, (x * 3).sin() + 1)\n"
            "assert not openmp_supported() and all(p.parallel_entry is None for k, p in gs[-1].steps if k == 'kernel')\n"
            "print('OK')\n")
  env = {**os.environ, "TORCH_UOP_OPENMP": "0", "TORCH_UOP_CACHE": "0"}
  p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
  assert p.returncode == 0 and "OK" in p.stdout, p.stderr[-2000:]


def test_training_step_matches_eager():
  torch.manual_seed(0)
  model = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
  ref = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
  ref.load_state_dict(model.state_dict())
  torch._dynamo.reset()
  step = torch.compile(lambda m, x: m(x).softmax(-1).square().sum(), backend="uop")
  for _ in range(3):
    x = torch.randn(8, 12)
    step(model, x).backward()
    (lambda m, x: m(x).softmax(-1).square().sum())(ref, x).backward()
  for p, q in zip(model.parameters(), ref.parameters()): torch.testing.assert_close(p.grad, q.grad)
  assert torch_uop.metrics()["kernels_launched"] > 0


def test_a_view_of_an_output_in_its_eager_layout_is_that_buffer():
  """Attention over q, k, v sliced from one projection (timm's layout) gives its output heads-inside in eager, so the
  next layer's rows, out.transpose(1, 2).reshape(B, N, H * D), are a view of it there: with both saved for the
  backward, they are one buffer here too (the view is read through the output's layout; it was a copy kernel and a
  second saved tensor), and the gradients match eager's."""
  torch.manual_seed(0)
  B, H, N, D = 2, 3, 16, 8
  qkv, proj = torch.nn.Linear(H * D, 3 * H * D), torch.nn.Linear(H * D, 5)
  params = list(qkv.parameters()) + list(proj.parameters())

  def step(x):
    q, k, v = qkv(x).reshape(B, N, 3, H, D).permute(2, 0, 3, 1, 4).unbind(0)
    o = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    return proj(o.transpose(1, 2).reshape(B, N, H * D)).square().sum()

  def run(fn):
    storages = set()  # storages of the saved tensors of the attention output's size (q, k and v are the projection's)

    def pack(t):
      if t.numel() == B * H * N * D: storages.add(t.untyped_storage().data_ptr())
      return t

    for p in params: p.grad = None
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
      loss = fn(x)
    loss.backward()
    return storages, [p.grad.clone() for p in params]

  x = torch.randn(B, N, H * D)
  eager_storages, eager_grads = run(step)
  torch._dynamo.reset()
  storages, grads = run(torch.compile(step, backend="uop", options={"graph_cache": False}))
  for g, r in zip(grads, eager_grads): torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-5)
  assert len(storages) == len(eager_storages), (eager_storages, storages)  # (a copy of the rows was one more)


def test_training_forward_saves_weight_views_not_copies():
  """A saved weight's transpose (a forward output that is a strided view of a graph input) is handed out as that
  view of the input, as eager's autograd saves it: no copy kernel, the parameter's own storage. (AOTAutograd's
  default partition saves those transposes; the min-cut one of `recompute` takes them again in the backward.)"""
  torch.manual_seed(0)
  model = torch.nn.Sequential(torch.nn.Linear(16, 24), torch.nn.GELU(), torch.nn.Linear(24, 8))
  x = torch.randn(6, 16)
  torch._dynamo.reset()
  with capture() as graphs:
    step = torch.compile(lambda x: model(x).square().sum(), backend="uop", options={"recompute": False})
    step(x).backward()
  grads = [p.grad.clone() for p in model.parameters()]
  forward = graphs[0]
  input_slots = {spec.slot for spec in forward.inputs if spec is not None}
  # (an alias of a computed buffer, a view of the forward's own result, is not a weight's)
  aliases = [v for kind, v, _ in forward.outputs if kind == "alias" and v[0] in input_slots]
  weights = {p.data_ptr() for p in model.parameters() if p.dim() == 2}
  assert aliases  # the transposed weights the backward reads
  for p in model.parameters(): p.grad = None
  (lambda x: model(x).square().sum())(x).backward()
  for g, p in zip(grads, model.parameters()): torch.testing.assert_close(g, p.grad)
  # the general call path hands out the same views
  for p in model.parameters(): p.grad = None
  with torch_uop.debug.profile(): step(x).backward()
  for g, p in zip(grads, model.parameters()): torch.testing.assert_close(g, p.grad)
  # called directly (AOTAutograd's primals: the parameters and the input, in the order the graph uses them), each
  # alias is a parameter's storage
  pool = [p.detach() for p in model.parameters()] + [x]
  args = [next(a for a in pool if tuple(a.shape) == spec.shape) for spec in forward.inputs]
  outs = forward(list(args))
  shared = [outs[i].untyped_storage().data_ptr() for i, (kind, v, _) in enumerate(forward.outputs)
            if kind == "alias" and v[0] in input_slots]
  assert len(shared) == len(aliases) and set(shared) <= weights


def test_large_outputs_get_huge_page_advice(monkeypatch):
  """Buffers of HUGE_PAGE_MIN_BYTES or more are advised (whole 2 MB pages inside them) before a kernel writes
  them; the values are eager's whether or not the kernel grants huge pages."""
  from torch_uop.runtime import memory
  calls = []
  monkeypatch.setattr(executor, "huge_page_advisor", lambda: True)
  monkeypatch.setattr(executor, "advise_huge_pages", lambda ptr, n: calls.append((ptr, n)))
  x = torch.randn(1 << 21)  # 8 MB in, 8 MB out
  f, _ = compiled(lambda x: x * 2 + 1, x)
  calls.clear()
  out = f(x)
  torch.testing.assert_close(out, x * 2 + 1)
  assert calls == [(out.data_ptr(), out.nbytes)]
  small = torch.randn(1000)
  calls.clear()
  f2, _ = compiled(lambda x: x * 3, small)
  f2(small)
  assert calls == []
  memory.advise_huge_pages(x.data_ptr() + 1, 5 << 20)  # the real call, unaligned: never raises
  memory.advise_huge_pages(x.data_ptr(), 100)  # no whole huge page inside: nothing to do


# ------------------------------------------------------------------ LLVM modules compiled side by side

def test_modules_to_compile_go_in_balanced_batches():
  from torch_uop.runtime.cpu import balanced_batches
  sizes = [("a", 50_000), ("b", 30_000), ("c", 20_000), ("d", 20_000), ("e", 10_000), ("f", 5_000)]
  batches = balanced_batches(sizes, 3)
  assert len(batches) == 3 and sorted(x for b in batches for x in b) == sorted(x for x, _ in sizes)
  totals = sorted(sum(dict(sizes)[x] for x in b) for b in batches)
  assert totals[-1] - totals[0] <= 20_000
  assert len(balanced_batches(sizes[-2:], 3)) == 1, "a little IR compiles in one piece"
  assert balanced_batches([], 3) == []


@pytest.fixture
def own_workers(monkeypatch):
  """A fresh set of helper processes for the test, closed after it."""
  from torch_uop.runtime import cpu
  monkeypatch.setattr(cpu, "_workers", None)
  yield
  if cpu._workers is not None: cpu._workers.close()


def _transformer_graphs(monkeypatch, workers: int, tmp_path):
  """The inference graph of the transformer block (about 90 KB of LLVM IR), compiled with `workers` helpers."""
  from torch_uop.runtime import cpu
  from torch_uop.testing.models import Block
  monkeypatch.setenv("TORCH_UOP_COMPILE_WORKERS", str(workers))
  monkeypatch.setenv("TORCH_UOP_CACHE_DIR", str(tmp_path))  # nothing from the disk cache: every part is compiled
  torch.manual_seed(0)
  model, ids = Block().eval(), torch.randint(0, 100, (2, 16))
  with torch.no_grad():
    f, graphs = compiled(model, ids)
    torch.testing.assert_close(f(ids), model(ids), rtol=1e-4, atol=1e-5)
  return graphs[-1], cpu.compile_workers()


def _optimized_here(g) -> int:
  """How many of the graph's kernel functions this process optimized (the others came from a helper)."""
  here = g.program.optimized_ir or ""
  return sum(1 for kind, step in g.plan.steps if kind == "kernel" and f"@{step.name}(" in here)


def test_module_parts_compiled_by_a_helper_process(monkeypatch, tmp_path, own_workers):
  g, workers = _transformer_graphs(monkeypatch, 1, tmp_path)
  assert len(workers.procs) == 1 and workers.procs[0].poll() is None, "one helper process, still serving"
  assert _optimized_here(g) == 0, "this process optimized nothing (LLVM keeps memory after each optimization)"


def test_helpers_compile_while_codegen_goes_on(monkeypatch, tmp_path, own_workers):
  """Modules go to an idle helper as soon as PARALLEL_MIN_BYTES of them are generated, not after the last kernel is
  built; each helper holds one request at a time, and the objects come back in the kernels' order (the graph's
  output matches eager in _transformer_graphs)."""
  from torch_uop import pipeline
  from torch_uop.runtime import cpu
  built, at_submit, in_flight = [0], [], []
  original_build, original_submit, original_run = pipeline.build_kernel, cpu.CompileWorkers.submit, cpu.CompileWorkers._run
  def counting_build(*a, **kw):
    built[0] += 1
    return original_build(*a, **kw)
  def recording_submit(self, requests):
    at_submit.append(built[0])
    return original_submit(self, requests)
  def one_at_a_time(self, proc, request, pending, i):
    assert proc not in in_flight, "a helper was handed a second request before it answered the first"
    in_flight.append(proc)
    try: original_run(self, proc, request, pending, i)
    finally: in_flight.remove(proc)
  monkeypatch.setattr(pipeline, "build_kernel", counting_build)
  monkeypatch.setattr(cpu.CompileWorkers, "submit", recording_submit)
  monkeypatch.setattr(cpu.CompileWorkers, "_run", one_at_a_time)
  g, workers = _transformer_graphs(monkeypatch, 2, tmp_path)
  assert at_submit and at_submit[0] < built[0], (at_submit, built)
  assert _optimized_here(g) == 0


def test_a_helper_is_replaced_after_its_share_of_modules(monkeypatch, tmp_path, own_workers):
  from torch_uop.runtime import cpu
  monkeypatch.setattr(cpu.CompileWorkers, "RECYCLE_MODULES", 2)
  g, workers = _transformer_graphs(monkeypatch, 1, tmp_path)
  assert _optimized_here(g) == 0
  first = dict(workers.compiled)
  assert any(n >= 2 for n in first.values()), "a helper compiled its share"
  # codegen hands modules over in batches as it goes, so a fresh helper may already hold the last batch
  serving = {p.pid for p in workers.procs}
  assert not [pid for pid, n in first.items() if n >= 2 and pid in serving], "every helper that compiled its share was retired"
  g, workers = _transformer_graphs(monkeypatch, 1, tmp_path / "again")
  assert _optimized_here(g) == 0 and set(workers.compiled) - set(first), "a fresh helper compiled the next graph"


def test_dropped_graphs_release_their_kernels(tmp_path, monkeypatch):
  """torch._dynamo.reset() drops every compiled graph: its plan, program and JIT code are freed."""
  import gc
  import weakref
  monkeypatch.setenv("TORCH_UOP_CACHE_DIR", str(tmp_path))
  refs = []
  for n in range(4, 12):  # distinct graphs: new kernels each time
    x = torch.randn(n, 8)
    f, graphs = compiled(lambda x: (x @ x.T).relu().sum(0), x)
    f(x)
    refs += [weakref.ref(g) for g in graphs] + [weakref.ref(g.program) for g in graphs]
    del f, graphs
  torch._dynamo.reset()
  gc.collect()
  from torch_uop.core import symbolic
  assert not symbolic._memo, "the reset also dropped the simplifier's memo"
  alive = [r() for r in refs if r() is not None]
  assert not alive, f"{len(alive)} graphs or programs outlived torch._dynamo.reset(): {[type(a).__name__ for a in alive]}"


def test_without_helpers_everything_compiles_here(monkeypatch, tmp_path, own_workers):
  g, workers = _transformer_graphs(monkeypatch, 0, tmp_path)
  assert workers.procs == [] and _optimized_here(g) == g.n_kernels


def test_a_failing_helper_leaves_its_part_to_this_process(monkeypatch, tmp_path, own_workers):
  from torch_uop.runtime import cpu
  original = cpu.CompileWorkers._run
  def crash_first(self, proc, request, pending, i):
    proc.kill()
    proc.wait()
    original(self, proc, request, pending, i)
  monkeypatch.setattr(cpu.CompileWorkers, "_run", crash_first)
  g, workers = _transformer_graphs(monkeypatch, 1, tmp_path)
  assert _optimized_here(g) == g.n_kernels, "the helper's batch was compiled here"


def test_equal_kernels_share_one_function_and_cached_object(tmp_path, monkeypatch):
  # the same weight-shaped kernels appear at every batch size: the second size takes their objects from the cache
  monkeypatch.setenv("TORCH_UOP_CACHE_DIR", str(tmp_path))
  monkeypatch.setenv("TORCH_UOP_GRAPH_CACHE", "0")
  fn = lambda x, w: (x @ w).relu() + w.t().sum(0)  # w.t().sum(0) does not depend on the batch size
  w = torch.randn(16, 16)
  hits = []
  for n in (4, 6):
    torch_uop.reset_metrics()
    x = torch.randn(n, 16)
    f, graphs = compiled(fn, x, w)
    torch.testing.assert_close(f(x, w), fn(x, w))
    hits.append(torch_uop.metrics()["cache_hits"])
  assert hits[0] == 0 and hits[1] >= 1
  g = graphs[-1]
  assert len(g.plan.signatures) <= g.n_kernels and all(s.startswith("k_") for s in g.plan.signatures)


def test_helpers_that_cannot_start_are_given_up(monkeypatch, tmp_path, own_workers):
  # an interpreter that cannot run the helper: every batch compiles here, and after a few failures no more
  # helper processes are started
  from torch_uop.runtime import cpu
  monkeypatch.setattr(cpu.sys, "executable", "/bin/false")
  for _ in range(cpu.CompileWorkers.MAX_FAILURES):
    g, workers = _transformer_graphs(monkeypatch, 1, tmp_path / str(_))
    assert _optimized_here(g) == g.n_kernels
  assert workers.n == 0 and workers.failures == cpu.CompileWorkers.MAX_FAILURES


def test_bfloat16_narrowing_that_llvm_leaves_to_a_library_call():
  """On a CPU without native bfloat16 (AVX2), LLVM narrows some bfloat16 values through __truncsfbf2, which older
  libgcc lacks (runtime/cpu.py provides it, or the call jumps to address 0). It rounds as torch does: to nearest
  even, NaN kept a NaN. exponential_ on bfloat16 made such a call in a launcher (OpInfo's sample crashed the process)."""
  import ctypes
  import struct
  import llvmlite.binding as llvm
  from torch_uop.runtime import cpu
  cpu._init_llvm()
  narrow = ctypes.CFUNCTYPE(ctypes.c_float, ctypes.c_float)(llvm.address_of_symbol("__truncsfbf2"))  # bfloat in xmm0
  torch.manual_seed(0)
  values = torch.cat([torch.randn(2000) * 10.0 ** torch.randint(-40, 38, (2000,)).float(),
                      torch.tensor([float("inf"), -float("inf"), 0.0, -0.0, 1e-45, 3.3961e38, 1.00390625, 1.01171875])])
  got = [struct.unpack("<I", struct.pack("<f", narrow(v)))[0] & 0xFFFF for v in values.tolist()]
  assert got == (values.to(torch.bfloat16).view(torch.int16).to(torch.int32) & 0xFFFF).tolist()
  assert struct.unpack("<I", struct.pack("<f", narrow(float("nan"))))[0] & 0x7FC0 == 0x7FC0
  x = torch.randn(10).to(torch.bfloat16)
  torch._dynamo.reset()
  out = torch.compile(lambda x: x.exponential_(0.5), backend="uop")(x.clone())
  assert out.dtype == torch.bfloat16 and out.shape == x.shape and bool((out >= 0).all()) and bool(out.isfinite().all())


def test_kernels_of_one_structure_are_built_once(monkeypatch):
  """Layers that differ only in their weights share one built and rendered kernel, launched with each layer's own
  buffers; kernels that read an input with other strides are built each for itself."""
  from torch_uop import pipeline
  built = []
  real_build = pipeline.build_kernel
  monkeypatch.setattr(pipeline, "build_kernel", lambda item, name, *a, **k: built.append(name) or real_build(item, name, *a, **k))
  torch.manual_seed(0)
  params = [torch.randn(48, 48) for _ in range(3)] + [torch.randn(48) for _ in range(3)]

  def mlp(x, *params):
    for w, b in zip(params[0:3], params[3:6]): x = torch.tanh(x @ w + b)
    return x
  x = torch.randn(16, 48)
  g = torch_uop.debug.compile_graph(mlp, x, *params)
  torch.testing.assert_close(g(x, *params)[0], mlp(x, *params), rtol=1e-4, atol=1e-4)
  groups: dict = {}
  for k, src in zip(g.kernels, g.sources): groups.setdefault(src.replace(f"@{k.name}(", "@k("), []).append(k)
  assert max(len(ks) for ks in groups.values()) >= 3  # one per layer
  for ks in groups.values():
    assert ks[0].name in built
    assert len({tuple(k.buffers) for k in ks}) == len(ks)  # each launched with its own buffers
  # (x @ w, then + b and tanh, per layer) the first product reads the graph input, the others an intermediate: of six
  # kernels, the first three are built
  assert built == [k.name for k in g.kernels[:3]] and len(g.kernels) == 6

  built.clear()
  a, b = torch.randn(32, 32), torch.randn(32, 32)
  g = torch_uop.debug.compile_graph(lambda a, b, c: (a * 2 + b, a * 2 + c), a, b, b.t())
  for out, want in zip(g(a, b, b.t()), (a * 2 + b, a * 2 + b.t())): torch.testing.assert_close(out, want)
  assert len(g.kernels) == 2 and built == [k.name for k in g.kernels]


@pytest.mark.parametrize("m,k,n", [(128, 768, 3072), (64, 9216, 128)])
def test_profile_work_counts_each_product_once(m, k, n):
  """debug.kernel_work's FLOPs for a GEMM are 2*M*K*N, whether its weight panels are copied inside the kernel
  (the copy's loops must not multiply the product's count) or read from a packed buffer (K past the stage budget)."""
  x, w = torch.randn(m, k), torch.randn(n, k)
  graph = torch_uop.debug.compile_graph(lambda x, w: torch.relu(x @ w.T), x, w)
  flops = [f for _, f in torch_uop.debug.kernel_work(graph).values()]
  assert max(flops) == 2 * m * k * n
  torch.testing.assert_close(graph(x, w)[0], torch.relu(x @ w.T), rtol=1e-4, atol=1e-3)
