#!/bin/sh
# The round-15 H100 runs (reports/h100-round15/README.md), one step per device call (each under
# 10 minutes): sh benchmarks/gpu_round15.sh STEP, with $OUT the output folder, gpu_site/ (pytest)
# carried for san and .whl/ (the FlashInfer wheels) for bench. Each step packs its folder into
# $OUT/STEP.tgz. Call 1 was `PYTHONPATH=$PWD python3 benchmarks/probe_round15.py $OUT/probe
# stages` on commit bd947d7's kernels (2 stages in the split plan), call 7 the same with
# `$OUT/blocks blocks` on commit 00213dd's kernels.
#   probe: benchmarks/probe_round15.py rule and fused, then Nsight Compute on the split kernel
#          of decode at batch 1 with 1k tokens (the default launch)
#   final: the full check at three dtypes and the control, then kernels-fused and kernels-split
#          at three dtypes (the Gluon launches counted)
#   san: the Gluon kernel's GPU tests, then compute-sanitizer memcheck and initcheck
#   final2 (after the value-block and tile rules of commit f19fe77): the full check at
#          three dtypes and the control, kernels-split at three dtypes, then the bench
#   bench: invariance bench kernels + kernels:gluon=false + kernels-heuristic + FlashInfer's
#          variants, side by side
set -u
STEP=${1:?usage: sh benchmarks/gpu_round15.sh probe|final|final2|san|bench}
INV="python3 -m invariance.cli"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1

# full_check_and_control, sanitize, gluon_tests, bench, counted_check, pack, step_san,
# step_bench, run_step.
. benchmarks/gpu_full_check.sh

step_probe() {
  for mode in rule fused; do
    timeout 240 python3 benchmarks/probe_round15.py $C $mode > $C/$mode.txt 2>&1
    echo "probe $mode rc=$?"
  done
  timeout 120 ncu --clock-control none -k regex:_unified_attention_split_kernel --launch-skip 2 --launch-count 1 --import-source no --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section LaunchStats --section Occupancy --section SourceCounters -o $C/b1-ctx1k python3 benchmarks/profile_round12.py decode-b1-ctx1k > $C/ncu-run.txt 2>&1
  echo "ncu rc=$?"
  ncu -i $C/b1-ctx1k.ncu-rep > $C/ncu-b1-ctx1k.txt 2>&1
  ncu -i $C/b1-ctx1k.ncu-rep --page source --csv --print-source sass > $C/ncu-b1-ctx1k-sass.csv 2>&1
  grep -E "Duration|Elapsed Cycles|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|Stall" $C/ncu-b1-ctx1k.txt | head -20
}

step_final() {
  full_check_and_control
  counted_check kernels-fused fp16,bf16,fp32 150
  counted_check kernels-split fp16,bf16,fp32 150
}

step_final2() {
  full_check_and_control
  counted_check kernels-split fp16,bf16,fp32 150
  bench
}

run_step gpu_round15.sh "probe|final|final2|san|bench"
