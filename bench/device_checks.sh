#!/usr/bin/env bash
# The GPU checks of session 4's CPU-only work, in one device call (one H100/H200, under 9 min):
#   run(command="bash bench/device_checks.sh", carry=[".device", ".bwrap", ".kb"])
# Close-kill of candidate children, zygote launcher, release around updates, checkpoint timings.
# Everything lands in $OUT/checks.tgz plus a summary on stdout (the device tool returns <= 8 files).
set -u
OUT=${OUT:-$PWD/device-out}; mkdir -p "$OUT/c"
python3 -m pip install -q --no-index --no-deps .device/*.whl 2>&1 | tail -1
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 PATH=$PWD/.bwrap/usr/bin:$PATH
export LD_LIBRARY_PATH=$PWD/.bwrap/lib/x86_64-linux-gnu:$PWD/.bwrap/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
export KERNELBENCH_PROBLEMS=$PWD/.kb/problems.jsonl
C=$OUT/c
timeout 180 python3 -m pytest -v -p no:cacheprovider -m gpu tests/test_verify_gpu.py tests/test_zygote.py \
  tests/test_bench_gpu_queue_real.py tests/test_train_sglang_tensor.py > $C/pytest.log 2>&1; echo "pytest rc $?"
for launcher in zygote; do  # spawn measured in session 4: verify 12.8 s, profile 6.2 s
  timeout 150 python3 -m bench.gpu_queue --real-jobs --gpus 0 --jobs 12 --demo l1_1_matmul_cublas --sandbox \
    --child-launcher $launcher > $C/gpu_queue_$launcher.json 2> $C/gpu_queue_$launcher.err; echo "gpu_queue $launcher rc $?"
done
timeout 100 python3 -m bench.checkpoint --size 0.5b --dir /tmp/ckpt-a > $C/ckpt_blocking.json 2>&1
timeout 100 python3 -m bench.checkpoint --size 0.5b --background --dir /tmp/ckpt-b > $C/ckpt_background.json 2>&1
df -h . /tmp > $C/df.txt
tar czf $OUT/checks.tgz -C $OUT c && rm -rf $C
tar xzf $OUT/checks.tgz -C /tmp && C=/tmp/c
tail -3 $C/pytest.log
for launcher in zygote; do python3 -c "
import json; r=json.load(open('$C/gpu_queue_$launcher.json')); k=r['saturation']['kinds']
for n in k: print('$launcher', n, round(k[n]['wall_ms']['mean']), {p: round(v['mean']) for p, v in list(k[n].get('phases_ms', {}).items())[:8]})
" 2>&1 | tail -3; done
tail -c 600 $C/ckpt_blocking.json; tail -c 600 $C/ckpt_background.json
