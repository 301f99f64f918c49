#!/usr/bin/env bash
# `cuda-agent smoke` on one GPU: whether its PPO rollouts reach compile, verify and profile (rollouts kept).
#   run(command="bash bench/device/smoke.sh", kind="nvidia-h200", carry=[".device", ".bwrap", ".kb"])   # < 8 min
# The check: gpu_queue/jobs_done grows during the PPO steps; rollouts/ppo_*.jsonl (in $OUT/rollouts.tgz) have
# completed trajectories with reward > -1.
source "$(dirname "$0")/preamble.sh"
T0=$SECONDS
timeout 560 python3 -m agentcore.cli smoke --out /tmp/smoke > $OUT/smoke.log 2>&1; echo "smoke rc $? at $((SECONDS-T0)) s"
cp /tmp/smoke/metrics.jsonl $OUT/smoke_metrics.jsonl 2>/dev/null
tar czf $OUT/rollouts.tgz -C /tmp/smoke rollouts 2>/dev/null
grep -v "^\s" $OUT/smoke.log | grep -v "^\[step" | grep -v "sft_loss" | tail -12 | cut -c1-240
python3 - <<'PY'
import glob, json
for f in sorted(glob.glob("/tmp/smoke/rollouts/ppo_*.jsonl")):
    rows = [json.loads(line) for line in open(f)]
    print(f.rsplit("/", 1)[1], [(t.get("status"), t.get("reward")) for t in rows])
PY
