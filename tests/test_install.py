"""Installation: `backend="uop"` works through the `torch_dynamo_backends` entry point alone.

Each check runs a script in a fresh interpreter (`sys.executable`, the one running pytest), so no
earlier import of torch_uop in this process can register the backend for it.
"""
import subprocess
import sys

import pytest


def _run(*lines: str) -> str:
  proc = subprocess.run([sys.executable, "-c", "\n".join(lines)], capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, f"script failed (rc={proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
  return proc.stdout


COMPILE_AND_CHECK = (
  "f = torch.compile(lambda x, y: (x * y + 1).relu().sum(-1), backend='uop')",
  "x, y = torch.randn(4, 8), torch.randn(4, 8)",
  "torch.testing.assert_close(f(x, y), (x * y + 1).relu().sum(-1))",
)


def test_entry_point_is_declared():
  from importlib.metadata import entry_points
  eps = entry_points(group="torch_dynamo_backends")
  assert "uop" in eps.names, "torch_uop is installed without its torch_dynamo_backends entry point (pip install -e .)"
  assert eps["uop"].value == "torch_uop.dynamo_backend:uop_backend"


def test_backend_by_name_without_importing_torch_uop():
  out = _run(
    "import sys, torch",
    *COMPILE_AND_CHECK,
    "assert 'torch_uop' in sys.modules, 'the entry point did not load torch_uop'",
    "import torch_uop",
    "m = torch_uop.metrics()",
    "assert m['graphs_compiled'] == 1 and m['kernels_launched'] >= 1, m",
    "assert torch._dynamo.lookup_backend('uop') is torch_uop.uop_backend",
    "print('graphs', m['graphs_compiled'])",
  )
  assert "graphs 1" in out


@pytest.mark.parametrize("before", [
  "import torch_uop",  # the import registers first, the entry point is found later
  "from torch._dynamo import list_backends; assert 'uop' in list_backends(); import torch_uop",  # found, then imported
  "import torch_uop; from torch._dynamo import list_backends; assert 'uop' in list_backends()",  # imported, then found
  "torch._dynamo.lookup_backend('uop'); import torch_uop.dynamo_backend",  # loaded through the entry point, then imported
])
def test_import_and_entry_point_register_once(before):
  """Importing torch_uop registers "uop"; the entry point must not then fail with "duplicate name"."""
  _run(
    "import torch",
    before,
    *COMPILE_AND_CHECK,
    "import torch_uop",
    "assert torch._dynamo.lookup_backend('uop') is torch_uop.uop_backend",
    "assert torch_uop.metrics()['graphs_compiled'] == 1",
  )
