#!/usr/bin/env bash
# The `gpu`-marked tests given as arguments, with GPU, driver, torch, cupy and bwrap versions in $OUT/gpu.txt.
#   run(command="bash bench/device/pytest_gpu.sh tests/test_bench_gpu.py tests/test_bench_recheck.py tests/test_bench_watch.py",
#       carry=[".device", ".bwrap", ".kb"])
# Arguments go to `pytest -m gpu`; the log is $OUT/pytest_gpu.log. Without arguments it runs every gpu test in one
# process, which does not fit one call: gpu_suite.sh splits them.
source "$(dirname "$0")/preamble.sh"
set -o pipefail
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, cupy; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cupy', cupy.__version__)" | tee -a "$OUT/gpu.txt"
bwrap --version | tee -a "$OUT/gpu.txt"
python3 -m pytest -q -p no:cacheprovider -m gpu "$@" 2>&1 | tee "$OUT/pytest_gpu.log" | tail -40
