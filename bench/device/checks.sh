#!/usr/bin/env bash
# GPU timing precision: the timer tests, the real-jobs queue test, bench.system.timing against do_bench.
#   run(command="bash bench/device/checks.sh", carry=[".device", ".bwrap", ".kb"])   # one H100/H200, < 9 min
# bench.system.timing runs 5 fresh processes; logs and timing.json go to $OUT.
source "$(dirname "$0")/preamble.sh"
timeout 300 python3 -m pytest -v -p no:cacheprovider -m gpu tests/test_timing_gpu.py tests/test_bench_gpu_queue_real.py \
  > $OUT/pytest.log 2>&1; echo "pytest rc $?"
timeout 200 python3 -m bench.system.timing --runs 5 --out $OUT/timing.json > $OUT/timing.log 2>&1; echo "bench.system.timing rc $?"
grep -E "PASSED|FAILED|ERROR" $OUT/pytest.log | cut -c1-150; tail -1 $OUT/pytest.log
tail -25 $OUT/timing.log
