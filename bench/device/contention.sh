#!/usr/bin/env bash
# Whether launch-bound baselines slow down while every CPU is busy, and whether 2 cores of their own undo it.
#   run(command="bash bench/device/contention.sh", kind="nvidia-h100-x1", carry=[".device", ".kb"])   # ~8-9 min
# Three problems whose two baseline measurements disagreed in the full recheck: eager and torch.compile
# baselines in 2 quiet processes, 2 more while as many busy-looping processes as CPUs hold the machine,
# and 2 more on 2 cores of their own with the busy processes on the rest (--pin-cores). LIMIT: seconds (540).
source "$(dirname "$0")/preamble.sh"
T0=$SECONDS
timeout ${LIMIT:-540} python3 -m bench.system.timing --runs 1 --baseline-runs 2 --cpu-load $(nproc) --pin-cores 2 --out $OUT/contention.json \
  --problems 4_LeNet5,20_MobileNetV2,71_conv_transposed_2D__asymmetric_input__square_kernel \
  > $OUT/contention.log 2>&1
echo "bench.system.timing rc $? at $((SECONDS-T0)) s"
python3 - $OUT/contention.json <<'PY'
import json, sys
for b in json.load(open(sys.argv[1]))["baselines"]:
    load = b.get("under_cpu_load", {})
    print(b["problem"][:40], "quiet 2 runs:", {s: round(b[s]["rel_diff"], 3) for s in ("eager", "compile") if s in b},
          "loaded/quiet:", {s: round(load[s]["loaded_over_quiet"], 3) for s in ("eager", "compile") if s in load},
          "pinned/quiet:", {s: round(load[s].get("pinned_over_quiet", 0), 3) for s in ("eager", "compile") if s in load},
          load.get("error", ""))
PY
