#!/bin/sh
# The round-22 H100 runs (reports/h100-round22/README.md), one step per device call (each under
# 10 minutes): sh benchmarks/gpu_round22.sh STEP, with $OUT the output folder, gpu_site/ (pytest)
# carried for the tests and .whl/ (the FlashInfer wheels) for the bench. Each step packs its
# folder into $OUT/STEP.tgz.
#   probe: the parts of benchmarks/probe_round22.py named in $PARTS ("bits times" by default),
#          each into PART.txt and its jsonl: bits/times (the loader's page ids one tile ahead,
#          at experiment commit 565ee23 only; later commits run the default, the control and
#          the 64-key control alone), bits-merge/times-merge (the merge's chunk), times-split
#          (fixed split sizes), err-grow/times-grow (growing split boundaries, at experiment
#          commit 2bbb717 only), bits-scores/times-scores (the scores by separate programs, at
#          experiment commit 8a58915 only)
#   ncu:   each kernel's duration and warp states under ncu at batch 1 (1k and 32k tokens):
#          the default and the control
#   tests, final, check, bench, san: the steps shared with round 21 (benchmarks/gpu_steps_21.sh)
set -u
STEP=${1:?usage: sh benchmarks/gpu_round22.sh probe|ncu|tests|final|check|bench|san}
INV="python3 -m invariance.cli"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1

. benchmarks/gpu_full_check.sh
. benchmarks/gpu_steps_21.sh

step_probe() {
  probe_parts probe_round22.py "${PARTS:-bits times}"
}

step_ncu() {
  step_info
  for wl in decode-b1-ctx1k decode-b1-ctx32k; do
    for cell in auto heuristic; do
      timeout 90 ncu --section SpeedOfLight --section WarpStateStats --section LaunchStats --csv python3 benchmarks/probe_round22.py $C once $cell $wl > $C/ncu-$cell-$wl.csv 2> $C/ncu-$cell-$wl.err
      echo "ncu $cell $wl rc=$?"; grep -E '"Duration"' $C/ncu-$cell-$wl.csv | awk -F'","' '{print $5, $(NF-2), $NF}' | cut -c1-100 | tail -4
    done
  done
}

run_step gpu_round22.sh "probe|ncu|tests|final|check|bench|san"
