#!/usr/bin/env bash
# Issue 4's second figure: FSDP2's per-GPU rate on 2 and 4 GPUs against 1, the same machine and
# configuration (1.5B, PPO update of actor + critic, per-rank token budget fixed), in one call:
#   run(command="bash bench/device/fsdp_scaling.sh", kind="nvidia-h200-x4", carry=[".device"])
# Session 4 (AC on every block): 2 GPUs at 89.1% of 1. This runs the best single-GPU setting
# (no AC, fused AdamW, gathered weights kept) at 1, 2 and 4 ranks.
set -u
OUT=${OUT:-$PWD/device-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps .device/*.whl 2>&1 | tail -1
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
ARGS="--sizes 1.5b --tokens ${TOKENS:-16384} --compile-blocks --steps 3 --warmup 2 --fused-adam --no-reshard ${EXTRA:---no-ac}"
T0=$SECONDS
for n in ${RANKS:-1 2 4}; do
  timeout ${LIMIT:-150} torchrun --standalone --nproc-per-node $n -m bench.system.learner $ARGS --out $OUT/fsdp_$n.json \
    > $OUT/fsdp_$n.log 2>&1
  echo "$n rank(s) rc $? at $((SECONDS-T0)) s: $(tail -1 $OUT/fsdp_$n.log)"
done
python3 - $OUT <<'PY'
import json, sys
from pathlib import Path
rows = {}
for f in sorted(Path(sys.argv[1]).glob("fsdp_*.json")):
    r = json.loads(f.read_text())["rows"][0]
    rows[r["world_size"]] = r
one = rows.get(1)
for n, r in sorted(rows.items()):
    ratio = r["tokens_per_s_per_gpu"] / one["tokens_per_s_per_gpu"] if one else float("nan")
    print(f"{n} GPU(s): {r['tokens_per_s_per_gpu']:.0f} tokens/s/GPU, MFU {r['mfu']:.1%}, "
          f"peak {r['peak_mem_gib']:.1f} GiB, per-GPU rate {ratio:.3f} of 1 GPU")
PY
