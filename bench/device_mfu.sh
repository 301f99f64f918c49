#!/usr/bin/env bash
# Issue 4's MFU question in one nvidia-h200 call (1.5B, 16k tokens per micro-batch, no AC: the
# configuration of session 4's best, 34.7%; session 8: 35.1%):
#   run(command="bash bench/device_mfu.sh", kind="nvidia-h200", carry=[".device", ".bwrap", ".kb"])
# Session 8's profile of that step: matmuls 42% of the GPU time, FlashAttention-2 27%, ~200 ms in
# copies (FSDP2 casting parameters to bf16 again for the backward under reshard_after_forward, and
# its copy-in/out at world size 1), unfused AdamW 68 ms, and the batch packed into 3 micro-batches
# instead of 2 (fixed since in rl.packing.pack). Variants, each in a fresh process:
#   base, --fused-adam, --no-reshard, --fused-adam --no-reshard.
set -u
OUT=${OUT:-$PWD/device-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps .device/*.whl 2>&1 | tail -1
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
T0=$SECONDS
for v in base fused noreshard fused_noreshard; do
  case $v in base) extra="";; fused) extra="--fused-adam";; noreshard) extra="--no-reshard";;
    fused_noreshard) extra="--fused-adam --no-reshard";; esac
  timeout 140 python3 -m bench.learner --sizes 1.5b --tokens 16384 --compile-blocks --no-ac --steps 3 --warmup 2 \
    $extra --out $OUT/mfu_$v.json > $OUT/mfu_$v.log 2>&1
  echo "$v rc $? at $((SECONDS-T0)) s: $(tail -1 $OUT/mfu_$v.log)"
done
