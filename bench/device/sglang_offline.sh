#!/usr/bin/env bash
# SGLang 0.5.17 from carried parts: installs them into /tmp/sglang-site, then imports sglang, sgl_kernel, flashinfer
# and the server's start-up modules, and runs `python -m sglang.launch_server --help`. Three calls on one warm machine:
#   run(command="bash bench/device/sglang_offline.sh", carry=[".device", ".sglang/parts/manifest.json", ".sglang/parts/sglang-offline.tar.000"])
#   run(command="bash bench/device/sglang_offline.sh", carry=[".device", ".sglang/parts/manifest.json", ".sglang/parts/sglang-offline.tar.001"])
#   run(command="bash bench/device/sglang_offline.sh", carry=[".device", ".sglang/parts/manifest.json", ".sglang/parts/sglang-offline.tar.002"])
# Build the parts here first (README, "SGLang on an offline GPU machine"): a call carries at most 64 MiB with the
# checkout, so each carries one part, which sglang_install.sh copies into /tmp/sglang-parts; /tmp stays while the
# machine is warm (send the next call before it goes idle). Until every part of manifest.json is there, install says
# which are missing and the script stops; the call that brings the last one installs (< 1 min) and checks (< 2 min).
source "$(dirname "$0")/preamble.sh"
source "$(dirname "$0")/sglang_install.sh"  # the install step, shared with sglang_tests.sh
export PYTHONPATH=$CUDA_AGENT_SGLANG_PYTHONPATH:$PYTHONPATH
python3 - <<'PY'
import importlib, time
import sgl_kernel, flashinfer, sglang, transformers
print("sglang", sglang.__version__, "sgl_kernel", sgl_kernel.__version__, "flashinfer", flashinfer.__version__,
      "transformers", transformers.__version__, "common_ops", sgl_kernel.common_ops.__file__)
for name in ["sglang.launch_server", "sglang.srt.entrypoints.http_server", "sglang.srt.managers.scheduler",
             "sglang.srt.model_executor.model_runner", "sglang.srt.models.llama", "sglang.srt.models.qwen2",
             "sglang.srt.layers.attention.triton_backend", "sglang.srt.layers.attention.flashinfer_backend",
             "sglang.srt.utils.torch_memory_saver_adapter"]:
    t0 = time.time()
    try:
        importlib.import_module(name)
        print(f"ok    {name} ({time.time() - t0:.1f} s)")
    except Exception as e:
        print(f"FAIL  {name}: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
PY
timeout 120 python3 -m sglang.launch_server --help > $OUT/launch_server_help.txt 2>&1; echo "launch_server --help rc $?"
grep -E -- "^  --(attention-backend|sampling-backend|grammar-backend) " $OUT/launch_server_help.txt | cut -c1-120
