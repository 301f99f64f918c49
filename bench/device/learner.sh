#!/usr/bin/env bash
# The LM head on action positions only: its GPU tests, `cuda-agent smoke` with it, and 1.5B MFU with and without it.
#   run(command="bash bench/device/learner.sh", kind="nvidia-h200", carry=[".device", ".bwrap", ".kb"])   # < 9 min
# bench.system.learner 1.5B, 16k tokens per micro-batch, compiled blocks: head on actions (the default), then --full-head.
source "$(dirname "$0")/preamble.sh"
T0=$SECONDS
timeout 90 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_head_actions.py tests/test_models.py > $OUT/pytest.log 2>&1
echo "head GPU tests rc $? at $((SECONDS-T0)) s"; tail -1 $OUT/pytest.log
timeout 220 python3 -m agentcore.cli smoke --out /tmp/smoke > $OUT/smoke.log 2>&1; echo "smoke rc $? at $((SECONDS-T0)) s"
cp /tmp/smoke/metrics.jsonl $OUT/smoke_metrics.jsonl 2>/dev/null
for head in actions full; do
  flag=""; [ $head = full ] && flag="--full-head"
  timeout 120 python3 -m bench.system.learner --sizes 1.5b --tokens 16384 --compile-blocks --steps 3 --warmup 2 $flag \
    --out $OUT/learner_head_$head.json > $OUT/learner_head_$head.log 2>&1; echo "bench.system.learner $head rc $? at $((SECONDS-T0)) s"
done
grep -v "^\s" $OUT/smoke.log | grep -v "^\[step" | tail -4 | cut -c1-250
for head in actions full; do tail -4 $OUT/learner_head_$head.log; done
