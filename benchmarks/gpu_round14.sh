#!/bin/sh
# The round-14 H100 runs (reports/h100-round14/README.md), one step per device call (each under
# 10 minutes): sh benchmarks/gpu_round14.sh STEP, with $OUT the output folder, gpu_site/ (pytest)
# carried for the tests and .whl/ (the FlashInfer wheels) for the bench. Each step packs its
# folder into $OUT/STEP.tgz.
#   (probe_round14.py needs the kernel switches of commit 313f4f5, 4bfa49d or a538536; the
#   GPU tests, final, san and bench run on any tree.)
#   smoke: the Gluon kernel's GPU tests (fp16 and bf16), then benchmarks/probe_round14.py
#          (the schedules against the default and the Triton kernel: bits and times)
#   probe: benchmarks/probe_round14.py alone
#   final: the full check at three dtypes and the control, kernels-fused at three dtypes with
#          the Gluon launches counted
#   san: the Gluon kernel's GPU tests, then compute-sanitizer memcheck and initcheck
#   bench: invariance bench kernels + kernels:gluon=false + kernels-heuristic + FlashInfer's
#          variants, side by side
set -u
STEP=${1:?usage: sh benchmarks/gpu_round14.sh smoke|probe|final|san|bench}
INV="python3 -m invariance.cli"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1

# full_check_and_control, sanitize, gluon_tests, bench, counted_check, pack, step_san,
# step_bench, run_step.
. benchmarks/gpu_full_check.sh

step_smoke() {
  gluon_tests 240
  mkdir -p $C/probe
  timeout 300 python3 benchmarks/probe_round14.py $C/probe
}

step_probe() {
  mkdir -p $C/probe
  timeout 500 python3 benchmarks/probe_round14.py $C/probe
}

step_final() {
  full_check_and_control
  counted_check kernels-fused fp16,bf16,fp32 150
}

run_step gpu_round14.sh "smoke|probe|final|san|bench"
