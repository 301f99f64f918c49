#!/usr/bin/env bash
# Session 10's contention check found 20_MobileNetV2's baselines 10-20% faster in a process pinned to
# two cores than unpinned. Is it core placement (NUMA locality to the GPU) or pinning as such?
# Fresh baseline processes (eager + torch.compile, bench.system.timing's child) unpinned, on the first two
# cores and on the last two, in turns, one GPU call:
#   run(command="bash bench/device/pinning.sh", kind="nvidia-h100-x1", carry=[".device", ".kb"])
set -u
OUT=${OUT:-$PWD/device-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps .device/*.whl 2>&1 | tail -1
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
PROBLEM=${PROBLEM:-20_MobileNetV2}; N=$(nproc)
{ nvidia-smi topo -m; lscpu | grep -i "numa\|model name"; } > $OUT/topology.txt 2>&1; cat $OUT/topology.txt
T0=$SECONDS
for round in ${ROUNDS:-1 2 3}; do
  for where in all first last; do
    case $where in all) pin="";; first) pin="taskset -c 0,1";; last) pin="taskset -c $((N-2)),$((N-1))";; esac
    timeout 150 $pin python3 -m bench.system.timing --child baselines --problem $PROBLEM --problems-file .kb/problems.jsonl \
      --child-out $OUT/pin_${where}_$round.json > /dev/null 2>> $OUT/pinning.log
    echo "round $round $where rc $? at $((SECONDS-T0)) s: $(python3 -c "import json,sys; d=json.load(open('$OUT/pin_${where}_$round.json')); print('eager', round(d['eager']['median_ms'],3), 'compile', round(d['compile']['median_ms'],3))" 2>&1 | tail -1)"
  done
done
