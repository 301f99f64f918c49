#!/usr/bin/env bash
# A queue of device steps that outlives each call, so the warm machine never idles between calls:
#   run(command="STEPS=.dev/steps.txt WAIT_S=570 bash bench/device/session.sh", kind="nvidia-h100-x1",
#       carry=[".device", ".bwrap", ".dev", ...what the steps need])
# STEPS: a file of lines `NAME: COMMAND` (blank lines and # comments skipped), e.g.
#   replay: GPUS=0 WAIT_S=3000 bash bench/device/corpus_replay.sh
#   env: GROUPS_RUN=env bash bench/device/gpu_suite.sh
#   warmup: timeout 300 python3 -m bench.system.compile_warmup --device cuda --profile
# The first call starts the steps one after another in their own process session (each with OUT set to its
# own folder, so a script's $OUT files stay apart); every call (the same command) waits up to WAIT_S for the
# queue to end, copies each step that finished since the last call into $OUT/NAME/ (its log and its OUT) and
# what a running step has written so far into $OUT/NAME.running/, and prints where the queue stands. A step's
# exit status does not stop the queue. Call again at once (the machine goes back after 30 s idle, and after
# 30 minutes held); a fresh machine starts the queue from the top.
source "$(dirname "$0")/preamble.sh"
S=/tmp/session
if [ ! -f $S/started ]; then
  [ -f "${STEPS:-}" ] || { echo "session.sh: STEPS must name a file of 'NAME: COMMAND' lines"; exit 2; }
  rm -rf $S; mkdir -p $S; grep -v '^[[:space:]]*\(#\|$\)' "$STEPS" > $S/steps; touch $S/started
  setsid bash -c '
    n=0
    while IFS= read -r line; do
      n=$((n + 1)); name=$(printf "%02d_%s" $n "$(echo "${line%%:*}" | tr -c "A-Za-z0-9_\n-" _)")
      mkdir -p "$0/$name/out"; date +%s > "$0/$name/start"
      OUT="$0/$name/out" bash -c "${line#*:}" > "$0/$name/log" 2>&1 < /dev/null
      echo $? > "$0/$name/rc"; date +%s > "$0/$name/end"
    done < "$0/steps"
    touch "$0/done"' $S < /dev/null > /dev/null 2>&1 &
  echo "session: started $(wc -l < $S/steps) steps"
fi
T0=$SECONDS
while [ ! -f $S/done ] && [ $((SECONDS - T0)) -lt ${WAIT_S:-560} ]; do sleep 5; done
for d in $S/[0-9]*_*/; do
  d=${d%/}; name=$(basename $d)
  if [ -f $d/rc ] && [ ! -f $d/copied ]; then
    mkdir -p $OUT/$name && cp $d/log $OUT/$name/ && cp -r $d/out/. $OUT/$name/ 2>/dev/null; touch $d/copied
  fi
  if [ -f $d/rc ]; then
    echo "$name: rc $(cat $d/rc) in $(( $(cat $d/end) - $(cat $d/start) )) s: $(tail -1 $d/log | cut -c1-160)"
  else  # what a running step has written so far, in case the machine goes back before it ends
    mkdir -p $OUT/$name.running && cp $d/log $OUT/$name.running/ && cp -r $d/out/. $OUT/$name.running/ 2>/dev/null
    echo "$name: running for $(( $(date +%s) - $(cat $d/start) )) s: $(tail -1 $d/log | cut -c1-160)"
  fi
done
waiting=$(( $(wc -l < $S/steps) - $(ls -d $S/[0-9]*_*/ 2>/dev/null | wc -l) ))
[ -f $S/done ] && echo "SESSION DONE" || echo "session: $waiting steps not started; call again"
