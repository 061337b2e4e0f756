"""DistributedDataParallel over a model compiled with backend="uop": two processes (gloo) train for 5 SGD steps;
every step's gradients (averaged across the processes by DDP's all-reduce) equal eager DDP's, and nothing falls
back. Run as a separate script, since it spawns its own processes."""
import ast
import os
import socket
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
  import copy, os, sys, torch, torch.distributed as dist, torch.multiprocessing as mp

  def worker(rank, world, port, queue):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    import torch_uop
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    ref = copy.deepcopy(model)
    ddp = torch.nn.parallel.DistributedDataParallel(torch.compile(model, backend="uop"))
    ddp_ref = torch.nn.parallel.DistributedDataParallel(ref)
    opt, opt_ref = torch.optim.SGD(ddp.parameters(), lr=0.1), torch.optim.SGD(ddp_ref.parameters(), lr=0.1)
    torch.manual_seed(1 + rank)  # each process sees its own batches
    try:
      for step in range(5):
        x, y = torch.randn(8, 16), torch.randn(8, 4)
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        torch.nn.functional.mse_loss(ddp_ref(x), y).backward()
        for p, q in zip(ddp.parameters(), ddp_ref.parameters()): torch.testing.assert_close(p.grad, q.grad)
        opt.step(); opt_ref.step(); opt.zero_grad(); opt_ref.zero_grad()
      for p, q in zip(ddp.parameters(), ddp_ref.parameters()): torch.testing.assert_close(p, q)
      m = torch_uop.metrics()
      queue.put((rank, "ok", m["graphs_compiled"], m["fallback_nodes_total"] + m["graphs_fallen_back"]))
    except Exception as e:
      queue.put((rank, repr(e), 0, 0))
    dist.destroy_process_group()

  if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, 2, int(sys.argv[1]), queue)) for r in range(2)]
    for p in procs: p.start()
    results = sorted(queue.get(timeout=240) for _ in procs)
    for p in procs: p.join(60)
    print("RESULTS", results)
""")


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def test_ddp_over_a_uop_compiled_model_matches_eager_ddp(tmp_path):
  script = tmp_path / "ddp_train.py"
  script.write_text(SCRIPT)
  env = {**os.environ, "TORCH_UOP_CACHE_DIR": str(tmp_path / "cache")}
  p = subprocess.run([sys.executable, str(script), str(_free_port())], capture_output=True, text=True, env=env,
                     timeout=300, cwd=tmp_path)
  assert p.returncode == 0, p.stderr[-3000:]
  line = next(l for l in p.stdout.splitlines() if l.startswith("RESULTS"))
  results = ast.literal_eval(line[len("RESULTS"):].strip())
  for rank, status, graphs, fallbacks in results:
    assert status == "ok", f"rank {rank}: {status}"
    assert graphs == 2 and fallbacks == 0, "a forward and a backward graph per process, all native"
