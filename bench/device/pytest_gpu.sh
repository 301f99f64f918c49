#!/usr/bin/env bash
# Runs the GPU parts on a lent GPU machine (the device tool), from the repository root:
#   bash bench/device/pytest_gpu.sh [pytest-args...]
# with `.device` (wheels) and `.bwrap` (bubblewrap unpacked from ../shared/device/debs) carried.
# Writes logs and JSON figures under $OUT (or ./device-out).
set -uo pipefail
OUT=${OUT:-$PWD/device-out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps .device/*.whl 2>&1 | tail -1
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
export PATH=$PWD/.bwrap/usr/bin:$PATH
export LD_LIBRARY_PATH=$PWD/.bwrap/lib/x86_64-linux-gnu:$PWD/.bwrap/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, cupy; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cupy', cupy.__version__)" | tee -a "$OUT/gpu.txt"
bwrap --version | tee -a "$OUT/gpu.txt"
python3 -m pytest -q -p no:cacheprovider -m gpu "$@" 2>&1 | tee "$OUT/pytest_gpu.log" | tail -40
