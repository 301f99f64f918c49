#!/usr/bin/env bash
# Shared set-up of the device scripts, sourced first by each: source "$(dirname "$0")/preamble.sh"
# Run from the repository root. Installs the wheels carried in .device/, puts the repository on
# PYTHONPATH and bubblewrap unpacked in .bwrap/ on PATH, points KERNELBENCH_PROBLEMS at .kb/ when
# it is carried (else the package's own copy is used), makes $OUT (default ./device-out) and
# prints the GPUs.
set -u
OUT=${OUT:-$PWD/device-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps .device/*.whl 2>&1 | tail -1
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 PATH=$PWD/.bwrap/usr/bin:$PATH
export LD_LIBRARY_PATH=$PWD/.bwrap/lib/x86_64-linux-gnu:$PWD/.bwrap/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
if [ -f .kb/problems.jsonl ]; then export KERNELBENCH_PROBLEMS=$PWD/.kb/problems.jsonl; fi
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader || true
