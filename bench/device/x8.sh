#!/usr/bin/env bash
# One nvidia-h200-x8 call for issues 7 and 4 (session 6):
#   run(command="bash bench/device/x8.sh", kind="nvidia-h200-x8", carry=[".device", ".bwrap", ".kb", ".dev"])
# GPUs 0-6: `python -m bench.system.node --recipe node_8gpu` (learner + engines on 0-5, verification and the
# checkpoint watcher on 6). GPU 7 beside it: bench.system.learner 1.5B 16k (no AC: session 4's best, 34.7%
# MFU with the full head) with the LM head on action positions only, then `cuda-agent smoke` (the
# README's main job).
# NODE_SETS="--set k=v ..." is appended to bench.system.node's overrides (later ones win); SIDE=0 skips GPU 7's work.
set -u
LIMIT=${LIMIT_S:-430}; TASKS=${TASKS:-$PWD/.dev/tasks.jsonl}
OUT=${OUT:-$PWD/device-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps .device/*.whl 2>&1 | tail -1
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 PATH=$PWD/.bwrap/usr/bin:$PATH
export LD_LIBRARY_PATH=$PWD/.bwrap/lib/x86_64-linux-gnu:$PWD/.bwrap/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
export KERNELBENCH_PROBLEMS=$PWD/.kb/problems.jsonl
T0=$SECONDS
[ "${SIDE:-1}" = 1 ] && (
  export CUDA_VISIBLE_DEVICES=7
  timeout 100 python3 -m bench.system.learner --sizes 1.5b --tokens 16384 --compile-blocks --no-ac --steps 3 --warmup 2 \
    --out $OUT/learner_head_actions.json > $OUT/learner_head_actions.log 2>&1
  echo "bench.system.learner (no AC, head on actions) rc $? at $((SECONDS-T0)) s" >> $OUT/side.txt
  timeout 420 python3 -m agentcore.cli smoke --out /tmp/smoke > $OUT/smoke.log 2>&1
  echo "smoke rc $? at $((SECONDS-T0)) s" >> $OUT/side.txt
  cp /tmp/smoke/metrics.jsonl $OUT/smoke_metrics.jsonl 2>/dev/null
) &
RUN=/tmp/node; rm -rf $RUN  # a warm machine keeps /tmp from the previous call
timeout $((LIMIT + 100)) python3 -m bench.system.node --recipe node_8gpu --run-dir $RUN --time-limit-s $LIMIT --watch-gpus 6 \
  --watch-grace-s 45 --single-gpu-json bench/results/2026-11-22-session4/l_15_16k_ac1.json \
  --set stage=smoke --set model.compile_blocks=false --set data.tasks=$TASKS --set data.demos=1 \
  --set layout.verify_gpus=[6] --set orchestrator.gpu_slots=1 \
  --set data.collect_tasks=6 --set steps.rft=2 --set steps.value=1 --set steps.ppo=6 --set data.tasks_per_step=6 \
  --set data.samples_per_task=2 --set rollout.max_turns=3 --set rollout.max_new_tokens=256 \
  --set rollout.max_context_tokens=8192 --set checkpoint.every_steps=2 --set orchestrator.progress_every_s=30 \
  --watch-set problem_ids=[47] --watch-set max_turns=2 --watch-set max_new_tokens=128 ${NODE_SETS:-} > $OUT/node.log 2>&1
echo "bench.system.node rc $? at $((SECONDS-T0)) s"
wait; cat $OUT/side.txt 2>/dev/null
mkdir -p $OUT/r; cp $RUN/node_report.md $RUN/node_report.json $RUN/config.json $RUN/metrics.jsonl $RUN/node_train.log \
  $RUN/node_watch.log $OUT/r/ 2>/dev/null
cp -r $RUN/bench $OUT/r/bench 2>/dev/null; tail -150 $RUN/learner.log > $OUT/r/learner_tail.log 2>/dev/null
ls -la $RUN $RUN/ckpt $RUN/rollouts > $OUT/r/ls.txt 2>&1
mv $OUT/smoke.log $OUT/smoke_metrics.jsonl $OUT/learner_head_* $OUT/node.log $OUT/r/ 2>/dev/null
tar czf $OUT/x8.tgz -C $OUT r && rm -rf $OUT/r
grep -v "^\s" $RUN/node_train.log | grep -v "^\[step" | grep -v "rollouts\|progress" | tail -16 | cut -c1-240
head -24 $RUN/node_report.md
tar xzf $OUT/x8.tgz -O r/smoke.log 2>/dev/null | grep -v "^\s" | grep -v "^\[step" | tail -6 | cut -c1-240
for h in actions; do tar xzf $OUT/x8.tgz -O r/learner_head_$h.log 2>/dev/null | tail -3; done
