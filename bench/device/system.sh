#!/usr/bin/env bash
# The system report on a GPU machine (bench.system.suite --quick) and a profiled 1.5B learner update, 16k, no AC.
#   run(command="bash bench/device/system.sh", kind="nvidia-h200", carry=[".device", ".bwrap", ".kb"])
# The 1.5B update without activation checkpointing needs an H200's memory. SYS_LIMIT (330) and LEARNER_LIMIT (200):
# seconds for each part; the report, the learner JSON and the torch.profiler trace come back in $OUT/system.tgz.
source "$(dirname "$0")/preamble.sh"
T0=$SECONDS
timeout ${SYS_LIMIT:-330} python3 -m bench.system.suite --quick --out /tmp/sys > $OUT/system.log 2>&1
echo "bench.system.suite rc $? at $((SECONDS-T0)) s"
timeout ${LEARNER_LIMIT:-200} python3 -m bench.system.learner --sizes 1.5b --tokens 16384 --compile-blocks --no-ac --steps 2 \
  --warmup 2 --profile /tmp/prof --out /tmp/sys/learner_15b_16k_noac.json > $OUT/learner.log 2>&1
echo "bench.system.learner 1.5b rc $? at $((SECONDS-T0)) s"
tar czf $OUT/system.tgz -C /tmp sys prof 2>/dev/null
tail -4 $OUT/learner.log
grep -A40 "^## " /tmp/sys/system_report.md 2>/dev/null | head -60
