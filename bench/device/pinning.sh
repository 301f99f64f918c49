#!/usr/bin/env bash
# Whether core placement changes a launch-bound model's baselines: unpinned, first 2 cores, last 2 cores.
#   run(command="bash bench/device/pinning.sh", kind="nvidia-h100-x1", carry=[".device", ".kb"])
# Eager and torch.compile baselines of PROBLEM (20_MobileNetV2) in bench.system.timing's child process, the three
# placements in turns for ROUNDS (1 2 3); the GPU/NUMA topology goes to $OUT/topology.txt.
source "$(dirname "$0")/preamble.sh"
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
