#!/usr/bin/env bash
# The third-party corpus (.corpus: bench/kernelbench/corpus/README.md) replayed under both rule sets: every set
# under `kernelbench` first (the rule set the corpus is judged by), then every set under `paper`, then each set's
# rules_report.md and the dynamic decoy check under kernelbench rules (.rulecheck/check.py when carried).
#   run(command="GPUS=0,1,2,3 WAIT_S=560 bash bench/device/corpus_replay.sh", kind="nvidia-h200-x4",
#       carry=[".device", ".bwrap", ".corpus", ".rulecheck", ".dev"])
# GPUS: the verification GPUs (default 0). The replay runs in its own process session and outlives the call on a
# warm machine: call again at once (inside the machine's warm window) to wait for more; each call waits up to
# WAIT_S, then packs what is done into $OUT/corpus.tgz (per set: paper/ and kernelbench/ records,
# rules_report.md; the logs) and prints the reports.
# On a fresh machine it resumes from .dev/corpus.tgz (a previous call's $OUT/corpus.tgz) when there is one: each
# `cuda-agent bench --out` redoes only problems without a record or whose record is an infrastructure error,
# so a finished set costs a machine check and no GPU work. SETS=kb-leaderboard/gpt-o1,pike/h100-level3-metr-orig
# runs only those sets (names as under .corpus/); by default all, smallest first.
source "$(dirname "$0")/preamble.sh"
C=/tmp/corpus
if [ ! -d $C ] && [ -f .dev/corpus.tgz ]; then
  mkdir -p $C; tar xzf .dev/corpus.tgz -C $C; rm -f $C/started $C/done
  echo "resumed from .dev/corpus.tgz: $(cat $C/*/*/records.jsonl 2>/dev/null | wc -l) records"
fi
if [ ! -f $C/started ]; then
  mkdir -p $C; touch $C/started
  ALL=$(for d in $(find .corpus -mindepth 2 -maxdepth 2 -type d); do echo "$(find $d -name '*.py' | wc -l) $d"; done \
        | sort -n | cut -d' ' -f2)
  WANT=${SETS:-}
  for s in ${WANT//,/ }; do [ -d .corpus/$s ] || echo "SETS: no set .corpus/$s"; done
  LIST=$(for s in $ALL; do [ -z "$WANT" ] || [[ ",$WANT," == *",${s#.corpus/},"* ]] && echo $s; done)
  setsid bash -c "
    for rules in kernelbench paper; do
      for s in $(echo $LIST); do
        name=\$(echo \$s | cut -d/ -f2- | tr / _)
        echo \"== \$s \$rules \$(date +%T)\"
        python3 -m agentcore.cli bench --replay \$s --rules \$rules --no-replay-checks --workers 32 --gpus ${GPUS:-0} \
          --out $C/\$name/\$rules >> $C/\$name.log 2>&1
        echo \"== \$s \$rules rc \$? \$(date +%T)\"
      done
    done
    for s in $(echo $LIST); do
      python3 -c 'import sys; from bench.kernelbench.rules_report import write_rules_report as w; w(sys.argv[1])' \
        $C/\$(echo \$s | cut -d/ -f2- | tr / _) >> $C/progress.log 2>&1
    done
    if [ -f .rulecheck/check.py ]; then python3 .rulecheck/check.py kernelbench paper > $C/decoy.log 2>&1; fi
    touch $C/done" >> $C/progress.log 2>&1 < /dev/null &
fi
T0=$SECONDS
while [ ! -f $C/done ] && [ $((SECONDS - T0)) -lt ${WAIT_S:-560} ]; do sleep 5; done
cat $C/progress.log
tar czf $OUT/corpus.tgz --exclude=workspaces --exclude='*compile-cache*' -C $C .
python3 - $C <<'PY'
import sys
from collections import Counter
from pathlib import Path
from bench.kernelbench.rules_report import outcome_of
from bench.system.records import read_records
for f in sorted(Path(sys.argv[1]).glob("*/*/records.jsonl")):
    c = Counter(outcome_of(r) for r in read_records(f) if r.outcome != "no_candidate")
    print(f.parent.parent.name, f.parent.name, sum(c.values()), dict(c.most_common()))
PY
for r in $C/*/rules_report.md; do echo "### $r"; sed -n 1,60p $r | cut -c1-220; done
[ -f $C/decoy.log ] && cut -c1-400 $C/decoy.log
[ -f $C/done ] && echo "ALL DONE" || echo "still running: call again"
