#!/usr/bin/env bash
# One nvidia-h200 call: `python -m bench.system.suite --quick` (issue 6's system report, with the machine
# it ran on) and a profiled bench.system.learner update of the 1.5B model at 16k tokens without activation
# checkpointing (issue 4's MFU: session 4's best configuration, 34.7%; needs the H200's memory).
#   run(command="bash bench/device/system.sh", kind="nvidia-h200", carry=[".device", ".bwrap", ".kb"])
set -u
OUT=${OUT:-$PWD/device-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps .device/*.whl 2>&1 | tail -1
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 PATH=$PWD/.bwrap/usr/bin:$PATH
export LD_LIBRARY_PATH=$PWD/.bwrap/lib/x86_64-linux-gnu:$PWD/.bwrap/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
export KERNELBENCH_PROBLEMS=$PWD/.kb/problems.jsonl
T0=$SECONDS
timeout ${SYS_LIMIT:-330} python3 -m bench.system.suite --quick --out /tmp/sys > $OUT/system.log 2>&1
echo "bench.system.suite rc $? at $((SECONDS-T0)) s"
timeout ${LEARNER_LIMIT:-200} python3 -m bench.system.learner --sizes 1.5b --tokens 16384 --compile-blocks --no-ac --steps 2 \
  --warmup 2 --profile /tmp/prof --out /tmp/sys/learner_15b_16k_noac.json > $OUT/learner.log 2>&1
echo "bench.system.learner 1.5b rc $? at $((SECONDS-T0)) s"
tar czf $OUT/system.tgz -C /tmp sys prof 2>/dev/null
tail -4 $OUT/learner.log
grep -A40 "^## " /tmp/sys/system_report.md 2>/dev/null | head -60
