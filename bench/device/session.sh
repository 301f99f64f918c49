#!/usr/bin/env bash
# A queue of device steps that outlives each call, so the warm machine never idles between calls:
#   run(command="STEPS=.dev/steps.txt WAIT_S=570 bash bench/device/session.sh", kind="nvidia-h100-x1",
#       carry=[".device", ".bwrap", ".dev", ...what the steps need])
# STEPS: a file of lines `NAME: COMMAND` (blank lines and # comments skipped), e.g.
#   replay: GPUS=0 WAIT_S=3000 bash bench/device/corpus_replay.sh
#   env: GROUPS_RUN=env bash bench/device/gpu_suite.sh
#   warmup: timeout 300 python3 -m bench.system.compile_warmup --device cuda --profile
# LANES instead of STEPS fills a machine of several GPUs: queues side by side, each on its own GPUs
# (CUDA_VISIBLE_DEVICES), e.g. LANES="0=.dev/a.txt 1=.dev/b.txt 2,3=.dev/c.txt"; a lane's steps run one after
# another, and the lanes' GPUs should not overlap. GPUS@CPUS pins a lane to those cores (taskset), e.g.
# LANES="0@0-15=a.txt 1@16-31=b.txt": two lanes of a 2-GPU, 32-core machine then have what a one-GPU machine
# of 16 cores has, so each lane's time stands for a run alone there.
# The first call starts the steps in their own process session (each with OUT set to its own folder, so a
# script's $OUT files stay apart); every call (the same command) waits up to WAIT_S for every queue to end,
# packs every step's log and OUT so far into $OUT/session.tgz (NN_NAME/log, NN_NAME/out/...), and prints
# where the queues stand. A step's exit status
# does not stop its queue. Call again at once (the machine goes back after 30 s idle, and after 30 minutes
# held); a fresh machine starts the queues from the top. The steps run in a copy of the first call's working
# tree (/tmp/session/tree), so what that call carried stays theirs; files a later call brings reach them
# only through /tmp (preamble.sh parks wheel parts in /tmp/parts; copy anything else there yourself).
source "$(dirname "$0")/preamble.sh"
S=/tmp/session
if [ ! -f $S/started ]; then
  LANES=${LANES:-"-=${STEPS:-}"}
  rm -rf $S; mkdir -p $S
  for lane in $LANES; do
    f=${lane#*=}
    [ -f "$f" ] || { echo "session.sh: STEPS (or each LANES entry's file) must name a file of 'NAME: COMMAND' lines: $f"; exit 2; }
  done
  # The queues run in a copy of this call's working tree: every later call re-syncs the working tree, removing
  # what it does not carry (a step's inputs, even a tracked file for a moment) under a running step.
  mkdir -p $S/tree && tar -C . --exclude=./device-out -cf - . | tar -C $S/tree -xf -
  k=0
  for lane in $LANES; do
    k=$((k + 1)); gpus=${lane%%=*}; cpus=""; q=$S/queue$k
    case $gpus in *@*) cpus=${gpus#*@}; gpus=${gpus%%@*};; esac
    [ "$gpus" = - ] && prefix="" || prefix="g${gpus//,/}_"
    mkdir -p $q; grep -v '^[[:space:]]*\(#\|$\)' "${lane#*=}" > $q/steps
    pin=""; [ -n "$cpus" ] && pin="taskset -c $cpus"
    setsid $pin bash -c '
      S=$0 q=$1 gpus=$2 prefix=$3; n=0
      cd $S/tree && export PYTHONPATH=$S/tree PATH=$S/tree/.bwrap/usr/bin:$PATH
      export LD_LIBRARY_PATH=$S/tree/.bwrap/lib/x86_64-linux-gnu:$S/tree/.bwrap/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
      [ "$gpus" = - ] || export CUDA_VISIBLE_DEVICES=$gpus
      while IFS= read -r line; do
        n=$((n + 1)); name=$(printf "%s%02d_%s" "$prefix" $n "$(echo "${line%%:*}" | tr -c "A-Za-z0-9_\n-" _)")
        mkdir -p "$S/$name/out"; date +%s > "$S/$name/start"
        OUT="$S/$name/out" bash -c "${line#*:}" > "$S/$name/log" 2>&1 < /dev/null
        echo $? > "$S/$name/rc"; date +%s > "$S/$name/end"
      done < "$q/steps"
      touch "$q/done"' $S $q $gpus "$prefix" < /dev/null > /dev/null 2>&1 &
    echo "session: queue $k (GPUs ${gpus/-/all}${cpus:+, cores $cpus}) started $(wc -l < $q/steps) steps"
  done
  touch $S/started
fi
all_done() { for q in $S/queue*/; do [ -f $q/done ] || return 1; done; }
T0=$SECONDS
while ! all_done && [ $((SECONDS - T0)) -lt ${WAIT_S:-560} ]; do sleep 5; done
for d in $S/*_*/; do
  d=${d%/}; name=$(basename $d)
  if [ -f $d/rc ]; then
    echo "$name: rc $(cat $d/rc) in $(( $(cat $d/end) - $(cat $d/start) )) s: $(tail -1 $d/log | cut -c1-160)"
  else
    echo "$name: running for $(( $(date +%s) - $(cat $d/start) )) s: $(tail -1 $d/log | cut -c1-160)"
  fi
done
# Every step's log and OUT so far, finished or running, in one file: the run tool brings back only a few
# files from $OUT, and the machine may go back before a step ends. Rollouts stay in: their per-turn tool
# results and timings say where a run's time went.
tar czf $OUT/session.tgz -C $S --exclude="*.so" --exclude="*.safetensors" --exclude="*.pt" --exclude="*.whl" \
  --exclude="*.distcp" --exclude=ckpt --exclude=hf --exclude=weights \
  $(cd $S && ls -d *_*/ 2>/dev/null) 2>/dev/null
echo "session.tgz: $(du -h $OUT/session.tgz | cut -f1)"
waiting=$(( $(cat $S/queue*/steps | wc -l) - $(ls -d $S/*_*/ 2>/dev/null | wc -l) ))
all_done && echo "SESSION DONE" || echo "session: $waiting steps not started; call again"
