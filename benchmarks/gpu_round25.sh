#!/bin/sh
# The round-25 H100 runs (reports/h100-round25/README.md), one step per device call (each under
# 10 minutes): sh benchmarks/gpu_round25.sh STEP, with $OUT the output folder, gpu_site/ (pytest)
# carried for the tests and .whl/ (the FlashInfer wheels) for the bench. Each step packs its
# folder into $OUT/STEP.tgz.
#   probe: the parts of benchmarks/probe_round25.py named in $PARTS ("bits times" by default), each
#          into PART.txt and its jsonl
#   ktests, tests, final, check, bench, san: the steps shared with rounds 21-24
#          (gpu_steps_21.sh)
#   ncu:   Nsight Compute on the keys-as-rows kernel at batch 1 with 1k tokens (auto: 2 V blocks,
#          the scores ahead): its sections, the SASS source page and its stall summary
#          (benchmarks/ncu_stalls.py --order)
set -u
STEP=${1:?usage: sh benchmarks/gpu_round25.sh probe|ktests|tests|final|check|bench|san|ncu}
INV="python3 -m invariance.cli"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1

. benchmarks/gpu_full_check.sh
. benchmarks/gpu_steps_21.sh

step_probe() {
  probe_parts probe_round25.py "${PARTS:-bits times}"
}

step_ncu() {
  step_info
  ncu_tile
}

run_step gpu_round25.sh "probe|ktests|tests|final|check|bench|san|ncu"
