#!/usr/bin/env bash
# MFU of the learner's PPO update (bench.system.learner, 1.5B, actor + critic) on one H200 at four micro-batch sizes.
#   run(command="bash bench/device/mfu.sh", kind="nvidia-h200", carry=[".device"])
# Fused AdamW, gathered weights kept, compiled blocks; 16k/20k/24k tokens per micro-batch without activation
# checkpointing (20k and up need an H200's memory), 32k with it on every 2nd block. Each variant runs in a
# fresh process; VARIANTS picks some by name, LIMIT: seconds per variant (150).
source "$(dirname "$0")/preamble.sh"
COMMON="--sizes 1.5b --compile-blocks --steps 3 --warmup 2 --fused-adam --no-reshard"
declare -A ARGS=(
  [t16k_noac]="--tokens 16384 --no-ac"
  [t20k_noac]="--tokens 20480 --no-ac"
  [t24k_noac]="--tokens 24576 --no-ac"
  [t32k_ac2]="--tokens 32768 --ac-every 2"
)
T0=$SECONDS
for v in ${VARIANTS:-t16k_noac t20k_noac t24k_noac t32k_ac2}; do
  timeout ${LIMIT:-150} python3 -m bench.system.learner $COMMON ${ARGS[$v]} --out $OUT/mfu_$v.json > $OUT/mfu_$v.log 2>&1
  echo "$v rc $? at $((SECONDS-T0)) s: $(tail -1 $OUT/mfu_$v.log)"
done
