#!/usr/bin/env bash
# KernelBench replay of all 250 L1-L3 problems (demos + reference wrappers) with the baseline recheck, all GPUs.
#   run(command="LIMIT=300 bash bench/device/replay.sh", kind="nvidia-h200-x4", carry=[".device", ".bwrap", ".kb", ".dev"])
# Resumes from .dev/b250.tgz (a previous call's $OUT/b250.tgz) when there is one. LIMIT: bench seconds (530);
# PRECHECK=1 runs the recheck's GPU test first and stops if it fails.
source "$(dirname "$0")/preamble.sh"
B=/tmp/b250
if [ ! -d $B ] && [ -f .dev/b250.tgz ]; then mkdir -p $B; tar xzf .dev/b250.tgz -C $B; echo "resumed: $(wc -l < $B/baseline_recheck.jsonl) recheck rows"; fi
if [ -n "${PRECHECK:-}" ]; then
  timeout 150 python3 -m pytest -q -x -m gpu tests/test_bench_recheck.py 2>&1 | tail -3 | cut -c1-400
  [ ${PIPESTATUS[0]} -eq 0 ] || { echo "recheck GPU test failed: not running the bench"; exit 1; }
fi
GPUS=$(python3 -c "import torch; print(','.join(map(str, range(torch.cuda.device_count()))))")
nvidia-smi --query-gpu=index,utilization.gpu --format=csv,noheader,nounits -l 2 > $OUT/smi.csv 2>/dev/null &
T0=$SECONDS
timeout -s TERM ${LIMIT:-530} python3 -m agentcore.cli bench --suite kernelbench --levels 1,2,3 --replay rl/demos \
  --wrappers --no-replay-checks --workers 64 --gpus $GPUS --recheck-baselines --out $B > $OUT/b250.log 2>&1
echo "bench rc $? at $((SECONDS-T0)) s on GPUs $GPUS"
kill %1 2>/dev/null
tar czf $OUT/b250.tgz --exclude=./recheck-compile-cache --exclude=./workspaces -C $B .
grep -v "recheck L\|INFO" $OUT/b250.log | tail -8 | cut -c1-300
python3 - <<'PY'
from bench.kernelbench.recheck import read_recheck, summarize_recheck
rows = read_recheck("/tmp/b250/baseline_recheck.jsonl")
print(summarize_recheck(rows))
for r in [r for r in rows if r.error][:5]:
    print("not yet / failed:", r.level, r.name, r.error[-200:].replace("\n", " "))
PY
