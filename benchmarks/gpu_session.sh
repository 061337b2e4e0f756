#!/usr/bin/env bash
# The one prepared script for a session with a CUDA GPU: the CUDA tests, then bench_gpu.py (eager, Inductor and
# torch_uop on CUDA tensors: elementwise bandwidth against a device-to-device copy, float16 GEMM at 4096^3 against
# torch.mm, softmax, layer norm, a full sum, the MLP and transformer block).
#
# Packages the GPU machine lacks travel as wheels in .whl/ (see /work/.library/device/README.md: pip download
# --python-version 3.12 ... llvmlite expecttest pytest pluggy iniconfig packaging); they are installed into /tmp/site.
# Results (JSON and the log) go to $OUT when it is set (the device tool brings that folder back), else benchmarks/results.
set -uo pipefail
cd "$(dirname "$0")/.."
OUTDIR="${OUT:-benchmarks/results}"
mkdir -p "$OUTDIR"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && \
    export PYTHONPATH="/tmp/site:${PYTHONPATH:-}"
fi
export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 | tee "$OUTDIR/gpu.txt"
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())" | tee -a "$OUTDIR/gpu.txt"
echo "== CUDA tests"
timeout 240 python3 -m pytest tests/test_devices.py -q -k "cuda" -p no:cacheprovider 2>&1 | tail -30 | tee "$OUTDIR/tests.txt"
echo "== bench_gpu (CUDA)"
timeout 300 python3 benchmarks/bench_gpu.py --device cuda --out "$OUTDIR/gpu_cuda.json" 2>&1 | tee "$OUTDIR/bench.txt"
