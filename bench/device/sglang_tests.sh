#!/usr/bin/env bash
# The contract tests against real SGLang servers (`pytest -m sglang`: the `real` variants in test_sglang_client.py,
# test_weight_sync.py and test_router.py), each server started through agentcore.sglang's launcher on a random-init
# Qwen2 that the tests export (tests/sglang_backends.py). SGLang comes from the carried bundle, one part per call
# on one warm machine (sglang_install.sh); the call that brings the last part installs and runs the tests:
#   run(command="bash bench/device/sglang_tests.sh", kind="nvidia-h100-x2", carry=[".device", ".sglang/parts/manifest.json", ".sglang/parts/sglang-offline.tar.000"])
#   run(command="bash bench/device/sglang_tests.sh", kind="nvidia-h100-x2", carry=[".device", ".sglang/parts/manifest.json", ".sglang/parts/sglang-offline.tar.001"])
#   run(command="bash bench/device/sglang_tests.sh", kind="nvidia-h100-x2", carry=[".device", ".sglang/parts/manifest.json", ".sglang/parts/sglang-offline.tar.002"])
# Two GPUs for the router test (one server on each; on one GPU it skips). Later calls on the warm machine carry
# only ".device"; arguments replace the default test files (e.g. "tests/test_weight_sync.py -k release").
# CUDA_AGENT_SGLANG_ARGS replaces the server flags of tests/sglang_backends.py. The tests stop before the call's
# 10 minutes (BUDGET_S, counted from the script's start). $OUT: pytest_sglang.log, versions.txt, sglang_logs/.
source "$(dirname "$0")/preamble.sh"
source "$(dirname "$0")/sglang_install.sh"
set -o pipefail
export CUDA_AGENT_SGLANG_LOG_DIR=$OUT/sglang_logs HF_HUB_OFFLINE=1
PYTHONPATH=$CUDA_AGENT_SGLANG_PYTHONPATH python3 -c "import sglang, sgl_kernel; print('sglang', sglang.__version__, 'sgl_kernel', sgl_kernel.__version__)" 2>&1 | tail -1 | tee $OUT/versions.txt
python3 -c "import torch, transformers; print('tests: torch', torch.__version__, 'transformers', transformers.__version__, 'GPUs', torch.cuda.device_count())" 2>&1 | tail -1 | tee -a $OUT/versions.txt
if [ $# -eq 0 ]; then set -- tests/test_sglang_client.py tests/test_weight_sync.py tests/test_router.py; fi
timeout $(( ${BUDGET_S:-570} - SECONDS )) python3 -m pytest -v -p no:cacheprovider -m sglang --durations=20 "$@" 2>&1 \
  | tee $OUT/pytest_sglang.log | grep -E "PASSED|FAILED|ERROR|SKIPPED|^E |passed|failed|error|slowest|[0-9]s (setup|call|teardown)" | cut -c1-300 | tail -80
echo "pytest rc ${PIPESTATUS[0]} at $SECONDS s"
