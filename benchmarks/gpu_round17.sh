#!/bin/sh
# The round-17 H100 runs (reports/h100-round17/README.md), one step per device call (each under
# 10 minutes): sh benchmarks/gpu_round17.sh STEP, with $OUT the output folder (.whl/, the
# FlashInfer wheels, carried for the bench; gpu_site/ for the tests). Each step packs its folder
# into $OUT/STEP.tgz.
#   walk: benchmarks/probe_round17.py walk (split sizes 1024 / 512 / 256 with programs walking
#         1-8 consecutive splits and merge chunks of 8 or 32; bits against one split per program;
#         call 1, at 574f80c: nested walking loops)
#   flat: benchmarks/probe_round17.py flat (call 2, at 4580fa6: the walking programs' flat loop)
#   stages (call 4, at 573332d): benchmarks/probe_round17.py stages (one split per program at 3
#          and 4 stages)
#   final (call 3, at d89a927; no kernel code changed after it): the full check
#          at three dtypes and the control, then the bench (kernels, kernels:gluon=false, the
#          control, FlashInfer's variants)
set -u
STEP=${1:?usage: sh benchmarks/gpu_round17.sh walk|flat|stages|final}
INV="python3 -m invariance.cli"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1

. benchmarks/gpu_full_check.sh

probe() {
  s=$(date +%s)
  timeout -s INT -k 15 420 python3 benchmarks/probe_round17.py $C $1 > $C/$1.txt 2>&1
  echo "probe $1 rc=$? wall $(( $(date +%s) - s )) s"; tail -3 $C/$1.txt | cut -c1-400
  cp $C/$1.jsonl $OUT/ 2>/dev/null
}

step_walk() {
  probe walk
}

step_flat() {
  probe flat
}

step_stages() {
  probe stages
}

step_final() {
  full_check_and_control
  bench
}

run_step gpu_round17.sh "walk|flat|stages|final"
