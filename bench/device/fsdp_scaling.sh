#!/usr/bin/env bash
# FSDP2's per-GPU update rate on 2 and 4 ranks against 1 (bench.system.learner, 1.5B, per-rank tokens fixed).
#   run(command="bash bench/device/fsdp_scaling.sh", kind="nvidia-h200-x4", carry=[".device"])
# The PPO update of actor + critic under torchrun in the best single-GPU setting (no AC, fused AdamW,
# gathered weights kept). RANKS (1 2 4), TOKENS per micro-batch (16384), EXTRA (--no-ac), LIMIT per run in s (150).
source "$(dirname "$0")/preamble.sh"
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
