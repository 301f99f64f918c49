#!/usr/bin/env bash
# The learner's GPU checks of session 5's CPU-only work, in one device call (one H200, < 9 min):
#   run(command="bash bench/device/learner.sh", kind="nvidia-h200", carry=[".device", ".bwrap", ".kb"])
# The head-on-actions GPU tests, `cuda-agent smoke` (its default), bench.system.learner with and without it.
set -u
OUT=${OUT:-$PWD/device-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps .device/*.whl 2>&1 | tail -1
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 PATH=$PWD/.bwrap/usr/bin:$PATH
export LD_LIBRARY_PATH=$PWD/.bwrap/lib/x86_64-linux-gnu:$PWD/.bwrap/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
export KERNELBENCH_PROBLEMS=$PWD/.kb/problems.jsonl
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
