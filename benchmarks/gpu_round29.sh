#!/bin/sh
# The round-29 GPU runs (reports/h100-round29/README.md), one step per device call (each under
# 10 minutes): sh benchmarks/gpu_round29.sh STEP, with $OUT the output folder, gpu_site/ carried
# for the tests and .whl/ (the FlashInfer wheels) for the bench. Each step packs its folder into
# $OUT/STEP.tgz.
#   probe: the parts of benchmarks/probe_round29.py named in $PARTS ("bits times parts" by default),
#          each into PART.txt and its jsonl
#   ktests, tests, final, check, bench, san: the steps shared with rounds 21-27
#          (gpu_steps_21.sh)
#   sanall: memcheck at bf16 (every case), then initcheck at bf16 (valid cases), $SAN_S
#          seconds each (270 by default); added in the second session, on an H200
set -u
STEP=${1:?usage: sh benchmarks/gpu_round29.sh probe|ktests|tests|final|check|bench|san|sanall}
INV="python3 -m invariance.cli"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1

. benchmarks/gpu_full_check.sh
. benchmarks/gpu_steps_21.sh

step_probe() {
  probe_parts probe_round29.py "${PARTS:-bits times parts}"
}

step_sanall() {
  step_info
  SAN_S=${SAN_S:-270}
  san_run memcheck bf16 bfloat16
  san_run initcheck bf16 bfloat16 --valid-only
}

run_step gpu_round29.sh "probe|ktests|tests|final|check|bench|san|sanall"
