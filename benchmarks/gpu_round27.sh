#!/bin/sh
# The round-27 GPU runs (reports/h100-round27/README.md; all three calls got an H200), one step
# per device call (each under 10 minutes): sh benchmarks/gpu_round27.sh STEP, with $OUT the output
# folder, gpu_site/ (pytest) carried for the tests and .whl/ (the FlashInfer wheels) for the bench.
# Each step packs its folder into $OUT/STEP.tgz.
#   probe: the parts of benchmarks/probe_round27.py named in $PARTS ("bits times" by default;
#          "pbits ptimes" and "abits atimes" for the other two switches),
#          each into PART.txt and its jsonl (260 s each)
#   ktests, tests, final, check, bench, san: the steps shared with rounds 21-26
#          (gpu_steps_21.sh)
set -u
STEP=${1:?usage: sh benchmarks/gpu_round27.sh probe|ktests|tests|final|check|bench|san}
INV="python3 -m invariance.cli"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1

. benchmarks/gpu_full_check.sh
. benchmarks/gpu_steps_21.sh

step_probe() {
  probe_parts probe_round27.py "${PARTS:-bits times}"
}

run_step gpu_round27.sh "probe|ktests|tests|final|check|bench|san"
