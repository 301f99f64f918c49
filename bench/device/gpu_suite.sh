#!/usr/bin/env bash
# Every `gpu`-marked test: pytest processes side by side (verify x2, env, queue, learner), then the timing tests alone.
#   run(command="GROUPS_RUN=noverify bash bench/device/gpu_suite.sh", kind="nvidia-h100-x1", carry=[".device", ".bwrap", ".kb"])
# All five do not finish in one 600 s call; GROUPS_RUN=noverify (441 s on an H100) leaves out the verify suite
# (~6 min alone). Tests that need two GPUs (FSDP ranks, the 2-rank trainer) skip on one: run them on nvidia-h200-x2.
# GROUPS_RUN=verify runs the two verify groups and env; rest: queue and learner; env: env alone; noenv: all but env
# (TIMING=0 leaves out the timing tests)
# (CUDA_VISIBLE_DEVICES=1 leaves GPU 0 to other work). The env group compiles load_inline solutions with
# nvcc (~30-40 s each): beside a corpus replay's 32 compile workers it does not finish in one call.
# LIMIT: seconds per group (540); one log per group in $OUT. A test still running after DUMP_S (240) seconds
# gets its threads' stacks dumped into the log (pytest's faulthandler_timeout), then goes on.
source "$(dirname "$0")/preamble.sh"
LIMIT=${LIMIT:-540}
T0=$SECONDS
group() {  # name, pytest args...
  local name=$1; shift
  timeout $LIMIT python3 -m pytest -q -rs -p no:cacheprovider -o faulthandler_timeout=${DUMP_S:-240} -m gpu "$@" \
    > $OUT/$name.log 2>&1
  echo "$name rc $? at $((SECONDS-T0)) s: $(tail -1 $OUT/$name.log)"
}
case ${GROUPS_RUN:-all} in  # which groups: verify (x2), env, queue+learner
  verify) V=1 E=1 R=0 ;; rest) V=0 E=0 R=1 ;; env) V=0 E=1 R=0 ;; noverify) V=0 E=1 R=1 ;; noenv) V=1 E=0 R=1 ;; *) V=1 E=1 R=1 ;;
esac
if [ $V = 1 ]; then
  group verify_honest tests/test_verify_gpu.py -k "not cheat" &
  group verify_cheat tests/test_verify_gpu.py -k cheat &
fi
[ $E = 1 ] && group env tests/test_env_gpu.py tests/test_env.py tests/test_inline.py &
if [ $R = 1 ]; then
  group queue tests/test_gpu_queue.py tests/test_compile_pool.py \
    tests/test_bench_gpu_queue_real.py tests/test_bench_gpu.py tests/test_bench_recheck.py &
  group learner tests/test_embedded_engine.py tests/test_models.py tests/test_head_actions.py tests/test_update.py \
    tests/test_checkpoint.py tests/test_data_filters.py tests/test_weight_sync.py tests/test_train_sglang_tensor.py \
    tests/test_fsdp.py tests/test_train_ranks.py tests/test_bench_watch.py &
fi
wait
# Timing tests compare clocks on a kernel of ~100 us: another process's kernels on the same GPU
# (the groups above) lengthen event-timed samples, so they run alone, after the others.
[ $R = 1 ] && [ "${TIMING:-1}" = 1 ] && group timing tests/test_timing_gpu.py tests/test_paired_timing.py
grep -hE "^(FAILED|ERROR)" $OUT/*.log | cut -c1-300 | head -30
