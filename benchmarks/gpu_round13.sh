#!/bin/sh
# The round-13 H100 runs (reports/h100-round13/README.md), one step per device call (each under
# 10 minutes): sh benchmarks/gpu_round13.sh STEP, with $OUT the output folder, gpu_site/ (pytest)
# carried for the tests and .whl/ (the FlashInfer wheels) for the bench.
#   smoke: the Gluon prefill kernel's GPU tests (tests/triton_kernels/test_gluon.py, fp16 and
#          bf16), then prefill-varlen and mixed64 timed with it and without it (kernels vs
#          kernels:gluon=false, side by side in one run)
#   check: the full default check of the kernels at three dtypes (the Gluon kernel serving the
#          prefill tile), the control at bf16 (it must fail), the same check with
#          kernels:gluon=false at bf16, then compute-sanitizer memcheck and initcheck at bf16
#   bench: invariance bench kernels + kernels:gluon=false + kernels-heuristic + FlashInfer's
#          variants, side by side; then the default check at bf16 of kernels and of
#          kernels-fused with the Gluon launches counted (benchmarks/count_gluon.py: how many
#          calls of each check ran the Gluon kernel)
#   probe: benchmarks/probe_round13.py (rings of 2, 3, 5 slots, the other slot order, the Triton
#          kernel; bits and times)
#   final: on the final kernel (the ring's depth a launch argument since the probe): the Gluon
#          GPU tests, the full check at three dtypes and the control, and the check of
#          kernels-fused at three dtypes with the Gluon launches counted
#   finalsan: the sanitizers, then the bench as in step bench
#   final2, finalsan2: final and finalsan again after the review's kernel changes (the
#          denominator update as one explicit fma, _tile_sum, in every kernel; the V tail zeroed
#          only in the 16-row chunks that hold it; the fused plan's slot choice shared), with the
#          outputs packed into one archive (a call brings back at most a few files)
#   final3: after the final read's refactor (the Gluon kernel's q load and store through the
#          Triton kernels' jit functions: the same instructions, reordered): the Gluon tests and
#          kernels-fused at three dtypes counted, packed
#   profile: Nsight Compute on the Gluon kernel of prefill-varlen and mixed64 (the default
#          launch, benchmarks/profile_round12.py), as round 12 profiled the Triton kernel
set -u
STEP=${1:?usage: sh benchmarks/gpu_round13.sh smoke|check|bench|probe|final|finalsan|final2|finalsan2|final3|profile}
INV="python3 -m invariance.cli"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1

# full_check_and_control (the full default check at three dtypes, then the control), sanitize
# (memcheck and initcheck at bf16), gluon_tests, bench, counted_check, final_checks and pack,
# into $C.
. benchmarks/gpu_full_check.sh

step_smoke() {
  C=$OUT/smoke; mkdir -p $C
  gluon_tests 300
  timeout 200 $INV bench --backend kernels --backend kernels:gluon=false --baseline kernels:gluon=false --workload prefill-varlen --workload mixed64 --iters 30 --no-progress --markdown $C/bench-gluon.md --json $C/bench-gluon.json > $C/bench.txt 2>&1
  echo "bench rc=$?"; tail -3 $C/bench.txt; head -20 $C/bench-gluon.md
}

step_check() {
  C=$OUT/check; mkdir -p $C
  full_check_and_control
  s=$(date +%s)
  timeout 120 $INV check --backend kernels:gluon=false --device cuda --dtype bf16 --no-progress --json $C/triton-only-bf16.json --markdown $C/triton-only-bf16.md > $C/triton-only.txt 2>&1
  echo "triton-only rc=$? wall $(( $(date +%s) - s )) s"; grep -h -E "PASSED|FAILED" $C/triton-only.txt | tail -1
  sanitize
}

step_bench() {
  C=$OUT/bench; mkdir -p $C
  bench
  for b in kernels kernels-fused; do counted_check $b bf16; done
}

step_probe() {
  mkdir -p $OUT/probe
  timeout 500 python3 benchmarks/probe_round13.py $OUT/probe
}

step_final() {
  C=$OUT/final; mkdir -p $C
  final_checks 200
}

step_finalsan() {
  C=$OUT/finalsan; mkdir -p $C
  sanitize
  bench
}

step_final2() {
  C=$OUT/final2; mkdir -p $C
  final_checks 240
  pack
}

step_finalsan2() {
  C=$OUT/finalsan2; mkdir -p $C
  sanitize
  bench
  pack
}

step_final3() {
  C=$OUT/final3; mkdir -p $C
  gluon_tests 240
  counted_check kernels-fused fp16,bf16,fp32 150
  pack
}

step_profile() {
  C=$OUT/profile; mkdir -p $C
  for w in prefill-varlen mixed64; do
    timeout 200 ncu --clock-control none -k regex:_fused_prefill_kernel --launch-skip 2 --launch-count 1 --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis --metrics sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,smsp__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active python3 benchmarks/profile_round12.py $w > $C/ncu-$w.txt 2>&1
    echo "ncu $w rc=$?"; grep -E "Duration|Tensor|Compute \(SM\) Throughput|Memory Throughput|hmma|pipe_xu|pipe_fma|Issue Slots Busy|No Eligible|Registers Per|Achieved Occupancy|Eligible Warps|Stall" $C/ncu-$w.txt | head -24
  done
}

step_$STEP
