#!/usr/bin/env bash
# Issue 6's GPU tests in one call (the last thing between issue 6 and `resolved`):
#   run(command="bash bench/device/bench_tests.sh", kind="nvidia-h100-x1", carry=[".device", ".bwrap", ".kb"])
# replay of three demos + five wrappers through the real tools (and its resume), the baseline
# recheck's real jobs, the checkpoint watcher with the real runner.
set -u
OUT=${OUT:-$PWD/device-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps .device/*.whl 2>&1 | tail -1
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 PATH=$PWD/.bwrap/usr/bin:$PATH
export LD_LIBRARY_PATH=$PWD/.bwrap/lib/x86_64-linux-gnu:$PWD/.bwrap/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
export KERNELBENCH_PROBLEMS=$PWD/.kb/problems.jsonl
T0=$SECONDS
timeout ${LIMIT:-540} python3 -m pytest -q -s -p no:cacheprovider -m gpu tests/test_bench_gpu.py tests/test_bench_recheck.py \
  tests/test_bench_watch.py > $OUT/bench_gpu_tests.log 2>&1
echo "bench GPU tests rc $? at $((SECONDS-T0)) s"
grep -E "passed|failed|error|^\(" $OUT/bench_gpu_tests.log | tail -20 | cut -c1-300
