#!/usr/bin/env bash
# Is the milestone the same in every fresh process, old way vs paired? (bench.system.timing --reward-stability)
#   run(command="TASKS=4_LeNet5,1_Square_matrix_multiplication_ bash bench/device/reward_stability.sh",
#       kind="nvidia-h100-x1", carry=[".device"])
# One command must fit the device's 10 minutes: a few TASKS per run (comma-separated KernelBench names), RUNS fresh
# processes per task and way (10), COST_RUNS jobs of each kind for the cost (3); no new run starts after DEADLINE_S (500). PAIRED: PairedConfig overrides of the
# paired runs, e.g. PAIRED="min_rounds=6 round_target_ms=10" (recorded in each task file). Each run leaves task_<name>.json in
# $OUT/reward_stability; copy those of several runs into one directory and merge them into one table with
#   python -m bench.system.timing --reward-stability --tables-only --out DIR
source "$(dirname "$0")/preamble.sh"
P=""; for kv in ${PAIRED:-}; do P="$P --paired $kv"; done
python3 -m bench.system.timing --reward-stability --tasks "${TASKS:-}" --runs "${RUNS:-10}" --cost-runs "${COST_RUNS:-3}" $P \
  --deadline-s "${DEADLINE_S:-500}" --out "$OUT/reward_stability" 2> >(tee "$OUT/reward_stability.log" >&2)
