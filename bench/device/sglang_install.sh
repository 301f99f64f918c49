#!/usr/bin/env bash
# Sourced by the SGLang device scripts, after preamble.sh: parks the carried parts of the offline SGLang bundle
# (.sglang/parts/, one part per call) in /tmp/sglang-parts; once every part of manifest.json is there it installs
# them into /tmp/sglang-site (once per warm machine: a later call with the same manifest skips it) and exports
# CUDA_AGENT_SGLANG_PYTHONPATH=/tmp/sglang-site, for the SGLang server's PYTHONPATH only (tests/sglang_backends.py):
# the bundle's transformers 5.12.1 is sglang's, the machine's own serves everything else. While parts are
# missing, install says which and the calling script stops (exit 0).
PARTS=/tmp/sglang-parts SITE=/tmp/sglang-site
mkdir -p $PARTS
if compgen -G ".sglang/parts/*" > /dev/null; then cp .sglang/parts/* $PARTS/; fi
ls -l $PARTS | tail -n +2
ldd --version | head -1  # the sglang wheel is manylinux_2_34: glibc 2.34 or later
if cmp -s $PARTS/manifest.json $SITE/.bundle-manifest.json; then
  echo "sglang bundle of $PARTS/manifest.json already in $SITE"
else
  python3 agentcore/sglang/offline.py install $PARTS --target $SITE || exit 0  # by path: the standard library only
  cp $PARTS/manifest.json $SITE/.bundle-manifest.json
fi
export CUDA_AGENT_SGLANG_PYTHONPATH=$SITE
