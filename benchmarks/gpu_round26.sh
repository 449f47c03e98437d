#!/bin/sh
# The round-26 H100 runs (reports/h100-round26/README.md), one step per device call (each under
# 10 minutes): sh benchmarks/gpu_round26.sh STEP, with $OUT the output folder, gpu_site/ (pytest)
# carried for the tests and .whl/ (the FlashInfer wheels) for the bench. Each step packs its
# folder into $OUT/STEP.tgz.
#   probe: the parts of benchmarks/probe_round26.py named in $PARTS ("warm" by default), each
#          into PART.txt and its jsonl
#   ktests, tests, final, check, bench, san: the steps shared with rounds 21-25
#          (gpu_steps_21.sh)
#   ncu:   Nsight Compute on the keys-as-rows kernel at batch 1 with 1k tokens (auto), warp
#          states sampled every 32 cycles (round 25's default interval gave 146 samples): its
#          sections, the SASS source page and its stall summary (benchmarks/ncu_stalls.py --order)
#   rate:  benchmarks/wgmma_rate.py (with the keys-as-rows tile's groups; 120 s at most) into
#          rate.jsonl, then memcheck at fp16 (benchmarks/gpu_sanitize.py, $SAN_S s, 400 by
#          default; round 25 ran it at bf16 only)
#   init:  initcheck at bf16 on the valid cases (gpu_sanitize.py --valid-only; $SAN_S s, 500)
# Call 1 ran "probe" (PARTS="warm pf") and "ncu" in one device call: they can take up to
# 2 x 260 + 200 s, so run them in two calls unless the parts are short.
set -u
STEP=${1:?usage: sh benchmarks/gpu_round26.sh probe|ktests|tests|final|check|bench|san|ncu|rate|init}
INV="python3 -m invariance.cli"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1

. benchmarks/gpu_full_check.sh
. benchmarks/gpu_steps_21.sh

step_probe() {
  probe_parts probe_round26.py "${PARTS:-warm}"
}

step_ncu() {
  step_info
  NCU_ARGS="--warp-sampling-interval 0 --section MemoryWorkloadAnalysis" NCU_S=200 ncu_tile
}

step_rate() {
  step_info
  timeout 120 python3 benchmarks/wgmma_rate.py --json $C/rate.jsonl > $C/rate.txt 2>&1
  echo "rate rc=$?"; cut -c1-400 $C/rate.txt
  SAN_S=${SAN_S:-400} san_run memcheck fp16 float16
}

step_init() {
  step_info
  san_run initcheck bf16 bfloat16 --valid-only
}

run_step gpu_round26.sh "probe|ktests|tests|final|check|bench|san|ncu|rate|init"
