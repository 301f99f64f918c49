#!/usr/bin/env bash
# A short `cuda-agent train` run on a node layout with the checkpoint watcher beside it (bench.system.node's report).
#   run(command="bash bench/device/node.sh node_8gpu 7", kind="nvidia-h200-x8", carry=[".device", ".bwrap", ".kb", ".dev"])
# Args: recipe (node_2gpu), watcher GPU (1). First the 2-rank GPU test (RANKS_TEST=0 skips it), then rft -> value -> ppo
# on TASKS (.dev/tasks.jsonl: synthesized tasks) for LIMIT_S seconds (420). NODE_SETS="--set k=v ..." is appended
# to bench.system.node's overrides (later ones win). PRESET=demo_ppo puts these first: rft on the two demonstrations
# until the policy replays them, then 3 PPO steps whose rollouts write kernels, on TASKS=.dev/tasks5.jsonl (5 tasks).
source "$(dirname "$0")/preamble.sh"
if [ "${PRESET:-}" = demo_ppo ]; then
  TASKS=${TASKS:-$PWD/.dev/tasks5.jsonl}
  NODE_SETS="--set data.with_demo_tasks=true --set data.rft_policy_rollouts=false --set data.demos=2 \
--set data.demo_names=[\"l1_1_matmul_cublas\",\"l1_47_sum_dim\"] --set steps.rft=150 --set optim.sft_lr=3e-4 \
--set steps.value=0 --set steps.ppo=3 --set data.tasks_per_step=2 --set data.samples_per_task=2 \
--set rollout.max_new_tokens=3072 --set rollout.max_turns=6 --set rollout.max_context_tokens=12288 \
--set checkpoint.every_steps=1000 ${NODE_SETS:-}"
fi
RECIPE=${1:-node_2gpu}; WATCH=${2:-1}; LIMIT=${LIMIT_S:-420}; TASKS=${TASKS:-$PWD/.dev/tasks.jsonl}
T0=$SECONDS
if [ "${RANKS_TEST:-1}" = 1 ]; then
  timeout 120 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_train_ranks.py > $OUT/ranks.log 2>&1
  echo "2-rank GPU test rc $? at $((SECONDS-T0)) s"; tail -1 $OUT/ranks.log
fi
RUN=/tmp/node; rm -rf $RUN  # a warm machine keeps /tmp from the previous call
timeout $((LIMIT + 120)) python3 -m bench.system.node --recipe $RECIPE --run-dir $RUN --time-limit-s $LIMIT --watch-gpus $WATCH \
  --watch-grace-s 45 --single-gpu-json bench/results/learner/ac1_t16k_1gpu.json \
  --set stage=smoke --set model.compile_blocks=false --set data.tasks=$TASKS --set data.demos=1 \
  --set data.collect_tasks=6 --set steps.rft=2 --set steps.value=1 --set steps.ppo=3 --set data.tasks_per_step=6 \
  --set data.samples_per_task=2 --set rollout.max_turns=3 --set rollout.max_new_tokens=256 \
  --set rollout.max_context_tokens=8192 --set checkpoint.every_steps=2 --set orchestrator.progress_every_s=20 \
  --watch-set problem_ids=[47] --watch-set max_turns=2 --watch-set max_new_tokens=128 ${NODE_SETS:-} > $OUT/node.log 2>&1
echo "bench.system.node rc $? at $((SECONDS-T0)) s"
mkdir -p $OUT/r; cp $RUN/node_report.md $RUN/node_report.json $RUN/config.json $RUN/metrics.jsonl $RUN/node_train.log \
  $RUN/node_watch.log $OUT/r/ 2>/dev/null
cp -r $RUN/bench $OUT/r/bench 2>/dev/null; tail -150 $RUN/learner.log > $OUT/r/learner_tail.log 2>/dev/null
ls -la $RUN $RUN/ckpt $RUN/rollouts > $OUT/r/ls.txt 2>&1
tar czf $OUT/node.tgz -C $OUT r && rm -rf $OUT/r
grep -v "^\s" $RUN/node_train.log | grep -v "^\[step" | tail -25 | cut -c1-300
head -30 $RUN/node_report.md
