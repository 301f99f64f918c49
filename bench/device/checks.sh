#!/usr/bin/env bash
# Issue 3's last GPU checks with the zygote launcher as the default, in one device call (one
# H100/H200, under 9 min):  run(command="bash bench/device/checks.sh", carry=[".device", ".bwrap", ".kb"])
# The timer tests, the real-jobs queue test, and bench.system.timing (5 fresh processes + do_bench).
set -u
OUT=${OUT:-$PWD/device-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps .device/*.whl 2>&1 | tail -1
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 PATH=$PWD/.bwrap/usr/bin:$PATH
export LD_LIBRARY_PATH=$PWD/.bwrap/lib/x86_64-linux-gnu:$PWD/.bwrap/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
export KERNELBENCH_PROBLEMS=$PWD/.kb/problems.jsonl
timeout 300 python3 -m pytest -v -p no:cacheprovider -m gpu tests/test_timing_gpu.py tests/test_bench_gpu_queue_real.py \
  > $OUT/pytest.log 2>&1; echo "pytest rc $?"
timeout 200 python3 -m bench.system.timing --runs 5 --out $OUT/timing.json > $OUT/timing.log 2>&1; echo "bench.system.timing rc $?"
grep -E "PASSED|FAILED|ERROR" $OUT/pytest.log | cut -c1-150; tail -1 $OUT/pytest.log
tail -25 $OUT/timing.log
