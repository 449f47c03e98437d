#!/bin/sh
# The round-12 H100 runs (reports/h100-round12/README.md), one step per device call (each under
# 10 minutes): sh benchmarks/gpu_round12.sh STEP, with $OUT the output folder and .whl/ (the
# FlashInfer wheels) carried for the bench.
#   check: the full default check of the kernels at three dtypes (the fused plan's 64-row
#          decode tiles on 3 stages, kernels.config.fused_stages), the control kernels-heuristic
#          at bf16 (it must fail), then the tuning fuzz (fp16, bf16; it draws 64 rows on 4 warps
#          with 3 stages too)
#   sanbench: compute-sanitizer memcheck at bf16 (gpu_sanitize.py: valid and malformed inputs)
#          and initcheck on valid inputs, then invariance bench kernels + kernels-heuristic +
#          FlashInfer's variants (side by side)
#   final: after the final read's kernel refactor (the fused kernel's j_end and flat-loop state
#          written once; the nested loop's PTX unchanged, the flat loop's moved), the full check
#          at three dtypes and the control, then the bench with FlashInfer
#   finalsan: after it, compute-sanitizer memcheck and initcheck and the kernel tests (gpu_site/
#          carried)
#   profile: probe_round9.py mixsplit (mixed64's decodes and prefill chunks as two calls), then
#          Nsight Compute on the fused kernel of prefill-varlen and mixed64 (default launch and
#          the control's split count)
# Calls 1 and 2 before these were benchmarks/probe_round12.py OUT decode, OUT flat (with the
# temporary switch of commit f2f3cb3) and OUT split.
set -u
STEP=${1:?usage: sh benchmarks/gpu_round12.sh check|sanbench|profile|final|finalsan}
INV="python3 -m invariance.cli"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1

# full_check_and_control (the full default check at three dtypes, then the control) and sanitize
# (memcheck and initcheck at bf16), into $C.
. benchmarks/gpu_full_check.sh

step_check() {
  C=$OUT/check; mkdir -p $C
  full_check_and_control
  C=$OUT/fuzz; mkdir -p $C
  s=$(date +%s)
  timeout 330 $INV check --backend benchmarks/tile_sweep.py:fuzz --device cuda --dtype bf16,fp16 --no-progress --json $C/tuning-fuzz.json --markdown $C/tuning-fuzz.md > $C/fuzz.txt 2>&1
  echo "fuzz rc=$? wall $(( $(date +%s) - s )) s"; grep -h -E "PASSED|FAILED" $C/fuzz.txt | tail -1
}

# The side-by-side bench with FlashInfer into $C (.whl carried).
bench() {
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
  PYTHONPATH=$PWD:/tmp/site timeout -s INT -k 15 330 $INV bench --backend kernels --backend kernels-heuristic --backend flashinfer:use_tensor_cores=true --backend flashinfer-fa3 --baseline flashinfer --iters 30 --no-progress --markdown $C/bench-kernels-vs-flashinfer.md --json $C/bench-kernels-vs-flashinfer.json > $C/bench.txt 2>&1
  echo "bench rc=$?"
  tail -5 $C/bench.txt
  head -30 $C/bench-kernels-vs-flashinfer.md
}

step_final() {
  C=$OUT/final; mkdir -p $C
  full_check_and_control
  bench
}

step_sanbench() {
  C=$OUT/sanitize; mkdir -p $C
  sanitize
  C=$OUT/bench; mkdir -p $C
  bench
}

# After the final read's refactor (with gpu_site/ carried: pytest): the sanitizers, then the
# kernel tests of the fused plan's loops and rules on the GPU.
step_finalsan() {
  C=$OUT/finalsan; mkdir -p $C
  sanitize
  PYTHONPATH=$PWD:$PWD/gpu_site timeout 230 python3 -m pytest -q -p _invariance_pytestplugin -p no:cacheprovider -rfE tests/triton_kernels/test_plans.py -k "nested_loop or fused_loop or prefills_get or batch_tuning or fused_equals_split or prefill_tile_takes or tiles_per_step or near_two or stages" > $C/tests.txt 2>&1
  echo "tests rc=$?"; grep -E "passed|failed|FAILED|^[.sFE]+ " $C/tests.txt | tail -5
}

step_profile() {
  C=$OUT/profile; mkdir -p $C
  timeout 150 python3 benchmarks/probe_round9.py $C mixsplit > $C/mixsplit.txt 2>&1
  echo "mixsplit rc=$?"; cat $C/mixsplit.jsonl
  for w in prefill-varlen mixed64; do
    for size in 1024 none; do
      timeout 120 ncu --clock-control none -k regex:_unified_attention_fused_kernel --launch-skip 2 --launch-count 1 --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis --metrics sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,smsp__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active python3 benchmarks/profile_round12.py $w fused $size > $C/ncu-$w-$size.txt 2>&1
      echo "ncu $w $size rc=$?"; grep -E "Duration|Tensor|Compute \(SM\) Throughput|Memory Throughput|hmma|pipe_xu|pipe_fma|Issue Slots Busy|No Eligible|Registers Per|Achieved Occupancy" $C/ncu-$w-$size.txt | head -14
    done
  done
}

step_$STEP
