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
  timeout 200 ncu --clock-control none --warp-sampling-interval 0 -k regex:_split_kt_kernel --launch-skip 2 --launch-count 1 --import-source no --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section LaunchStats --section Occupancy --section SourceCounters --section MemoryWorkloadAnalysis -o $C/b1-ctx1k python3 benchmarks/profile_round12.py decode-b1-ctx1k > $C/ncu-run.txt 2>&1
  echo "ncu rc=$?"
  ncu -i $C/b1-ctx1k.ncu-rep > $C/ncu-b1-ctx1k.txt 2>&1
  ncu -i $C/b1-ctx1k.ncu-rep --page source --csv --print-source sass > $C/ncu-b1-ctx1k-sass.csv 2>&1
  python3 benchmarks/ncu_stalls.py $C/ncu-b1-ctx1k-sass.csv --order > $C/stalls.md 2>&1
  gzip -f $C/ncu-b1-ctx1k-sass.csv
  grep -E "Duration|Elapsed Cycles|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|Memory Throughput|L2 Hit" $C/ncu-b1-ctx1k.txt | head -14
  head -40 $C/stalls.md
}

step_rate() {
  step_info
  timeout 120 python3 benchmarks/wgmma_rate.py --json $C/rate.jsonl > $C/rate.txt 2>&1
  echo "rate rc=$?"; cut -c1-400 $C/rate.txt
  s=$(date +%s)
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout ${SAN_S:-420} compute-sanitizer --tool memcheck --target-processes all --report-api-errors no --error-exitcode 99 python3 benchmarks/gpu_sanitize.py --dtypes float16 > $C/memcheck-fp16.txt 2>&1
  echo "memcheck fp16 rc=$? wall $(( $(date +%s) - s )) s"; grep -c "^\[ok\]" $C/memcheck-fp16.txt; tail -3 $C/memcheck-fp16.txt
}

step_init() {
  step_info
  s=$(date +%s)
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout ${SAN_S:-500} compute-sanitizer --tool initcheck --target-processes all --report-api-errors no --error-exitcode 99 python3 benchmarks/gpu_sanitize.py --dtypes bfloat16 --valid-only > $C/initcheck-bf16.txt 2>&1
  echo "initcheck rc=$? wall $(( $(date +%s) - s )) s"; grep -c "^\[ok\]" $C/initcheck-bf16.txt; tail -3 $C/initcheck-bf16.txt
}

run_step gpu_round26.sh "probe|ktests|tests|final|check|bench|san|ncu|rate|init"
