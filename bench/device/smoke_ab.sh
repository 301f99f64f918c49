#!/usr/bin/env bash
# `cuda-agent smoke` variants side by side: rft loss, then per PPO step reward, pass rate, log-prob gap and entropy.
#   run(command='bash bench/device/smoke_ab.sh "optim.actor_lr=0 steps.ppo=6" "steps.ppo=6"',
#       kind="nvidia-h200", carry=[".device", ".bwrap", ".kb"])
# Each argument is one variant's overrides (key=value ...), ~4 min per variant; LIMIT: seconds per variant (280).
# Also prints the value collection's pass rate (the policy PPO starts from).
source "$(dirname "$0")/preamble.sh"
n=0
for variant in "$@"; do
  n=$((n + 1)); T0=$SECONDS; sets=""
  for kv in $variant; do sets="$sets --set $kv"; done
  timeout ${LIMIT:-280} python3 -m agentcore.cli smoke --out /tmp/smoke_$n $sets > $OUT/smoke_$n.log 2>&1
  echo "variant $n [$variant] rc $? at $((SECONDS-T0)) s"
  cp /tmp/smoke_$n/metrics.jsonl $OUT/smoke_${n}_metrics.jsonl 2>/dev/null
  python3 - /tmp/smoke_$n/metrics.jsonl <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r.get("stage") == "rft" and r["step"] % 50 == 49:
        print(" rft", r["step"], "sft_loss", round(r.get("train/sft_loss", 0), 5))
    if "collect/pass_rate" in r and r.get("stage") == "value":
        print(" value collection: pass", r["collect/pass_rate"], "reward", r.get("collect/reward_mean"))
    if r.get("stage") == "ppo":
        print(" ppo", r["step"], "reward", r.get("rollout/reward_mean"), "pass", r.get("rollout/pass_rate"),
              "gap", round(r.get("train/logprob_gap", 0), 4), "entropy", round(r.get("train/entropy", 0), 3),
              "lr", r.get("train/lr_actor"))
PY
done
