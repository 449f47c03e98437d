#!/bin/sh
# The round-17 H100 runs (reports/h100-round17/README.md), one step per device call (each under
# 10 minutes): sh benchmarks/gpu_round17.sh STEP, with $OUT the output folder (.whl/, the
# FlashInfer wheels, carried for the bench; gpu_site/ for the tests). Each step packs its folder
# into $OUT/STEP.tgz.
#   walk: benchmarks/probe_round17.py walk (split sizes 1024 / 512 / 256 with programs walking
#         1-8 consecutive splits and merge chunks of 8 or 32; bits against one split per program)
set -u
STEP=${1:?usage: sh benchmarks/gpu_round17.sh walk}
INV="python3 -m invariance.cli"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1

. benchmarks/gpu_full_check.sh

step_walk() {
  s=$(date +%s)
  timeout -s INT -k 15 420 python3 benchmarks/probe_round17.py $C walk > $C/walk.txt 2>&1
  echo "probe walk rc=$? wall $(( $(date +%s) - s )) s"; tail -3 $C/walk.txt | cut -c1-400
  cp $C/walk.jsonl $OUT/ 2>/dev/null
}

run_step gpu_round17.sh "walk"
