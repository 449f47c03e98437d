#!/bin/sh
# The round-21 H100 runs (reports/h100-round21/README.md), one step per device call (each under
# 10 minutes): sh benchmarks/gpu_round21.sh STEP, with $OUT the output folder, gpu_site/ (pytest)
# carried for the tests and .whl/ (the FlashInfer wheels) for the bench. Each step packs its
# folder into $OUT/STEP.tgz.
#   probe: benchmarks/probe_round21.py bits (the Gluon split kernel's schedules against the
#          default launch, and the 64-key control) and times (the schedules and the control
#          against the default)
#   tests, final, check, bench, san: the steps shared with round 22 (benchmarks/gpu_steps_21.sh)
set -u
STEP=${1:?usage: sh benchmarks/gpu_round21.sh probe|tests|final|check|bench|san}
INV="python3 -m invariance.cli"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1

. benchmarks/gpu_full_check.sh
. benchmarks/gpu_steps_21.sh

step_probe() {
  probe_parts probe_round21.py "bits times"
}

run_step gpu_round21.sh "probe|tests|final|check|bench|san"
