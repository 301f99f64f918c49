#!/usr/bin/env bash
#   run(command="LIMIT=300 bash bench/device/replay.sh", kind="nvidia-h200-x4", carry=[".device", ".bwrap", ".kb", ".dev"])
# Issue 6: replay of all 250 L1-L3 problems (12 honest demos + reference wrappers) with the
# baseline recheck, on every GPU of the machine; resumable from .dev/b250.tgz (a previous call's OUT).
set -u
OUT=${OUT:-$PWD/device-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps .device/*.whl 2>&1 | tail -1
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 PATH=$PWD/.bwrap/usr/bin:$PATH
export LD_LIBRARY_PATH=$PWD/.bwrap/lib/x86_64-linux-gnu:$PWD/.bwrap/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
export KERNELBENCH_PROBLEMS=$PWD/.kb/problems.jsonl
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
  --wrappers --no-replay-checks --concurrency 64 --gpus $GPUS --recheck-baselines --out $B > $OUT/b250.log 2>&1
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
