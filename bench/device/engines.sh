#!/usr/bin/env bash
# SGLang and the embedded engine side by side on one GPU with the same model (python -m bench.system.engines):
# TTFT, tokens/s at 1 and 64 sequences, weight sync per update, memory released for training. SGLang comes from
# the carried bundle, one part per call on one warm machine (sglang_install.sh, as for sglang_tests.sh):
#   run(command="bash bench/device/engines.sh", kind="nvidia-h100-x1", carry=[".device", ".sglang/parts/manifest.json", ".sglang/parts/sglang-offline.tar.000"])
#   run(command="bash bench/device/engines.sh", kind="nvidia-h100-x1", carry=[".device", ".sglang/parts/manifest.json", ".sglang/parts/sglang-offline.tar.001"])
#   run(command="bash bench/device/engines.sh", kind="nvidia-h100-x1", carry=[".device", ".sglang/parts/manifest.json", ".sglang/parts/sglang-offline.tar.002"])
# MODEL: random:0.5b (default: written on the machine, nothing to carry), random:1.5b, or smollm2-135m (its wheel's
# parts carried as for smoke.sh). ARGS: more flags of bench.system.engines. $OUT: engines.json, engines.md, sglang.log.
source "$(dirname "$0")/preamble.sh"
source "$(dirname "$0")/sglang_install.sh"
export HF_HUB_OFFLINE=1
timeout ${LIMIT_S:-540} python3 -m bench.system.engines --model "${MODEL:-random:0.5b}" --out $OUT ${ARGS:-} \
  > $OUT/engines.log 2>&1
echo "engines rc $? at $SECONDS s"
grep "^engines:" $OUT/engines.log | cut -c1-400
tail -5 $OUT/sglang.log 2>/dev/null | cut -c1-300
cat $OUT/engines.md 2>/dev/null
