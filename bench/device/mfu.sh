#!/usr/bin/env bash
# Issue 4's MFU question in one nvidia-h200 call (1.5B Qwen2-shaped, PPO update of actor + critic):
#   run(command="bash bench/device/mfu.sh", kind="nvidia-h200", carry=[".device", ".bwrap", ".kb"])
# History (H200, 16k tokens per micro-batch, no AC, compiled blocks): session 4 34.7%, session 8
# 35.1% (3 micro-batches where 2 fit; packing fixed since), session 9: base 37.8%, fused AdamW
# 38.9%, no reshard 38.7%, both 39.4% (fused AdamW is now the training default; single_gpu keeps
# the gathered weights). Each variant runs in a fresh process; VARIANTS picks some by name.
set -u
OUT=${OUT:-$PWD/device-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps .device/*.whl 2>&1 | tail -1
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
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
