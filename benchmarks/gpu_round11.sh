#!/bin/sh
# The round-11 H100 runs (reports/h100-round11/README.md), one step per device call (each under
# 10 minutes): sh benchmarks/gpu_round11.sh STEP, with $OUT the output folder, gpu_site/
# (pytest and its pure-Python dependencies, git-ignored, copied from the local .venv) and .whl/
# (the FlashInfer wheels) carried.
#   check: the kernel tests of the fused plan's loop on the GPU, the full default check of the
#          kernels at three dtypes (prefill-like batches on 128 rows, 8 warps, 3 stages, the
#          nested loop with two tiles per step and K rows), the control kernels-heuristic at
#          bf16 (it must fail)
#   fuzzsan: the tuning fuzz (fp16, bf16; it draws the fused loop too), then compute-sanitizer
#          memcheck at bf16 (gpu_sanitize.py: the nested loop on valid and malformed inputs)
#          and initcheck on valid inputs
#   final: probe_round11.py split on two large grids, then the full check and the control
#   finalsan: compute-sanitizer memcheck and initcheck, then the kernel tests
#   bench: the kernel tests of check again (call 9 cut them at 100 s, 24 run and passed), then
#          invariance bench kernels + kernels-heuristic + FlashInfer's variants (side by side)
# Calls 1 and 2 before these were benchmarks/probe_round11.py OUT loops and OUT tune; calls 3-5
# ran check, fuzzsan and bench with the split plan's prefill tile at one tile per step
# ([check-split1/], [fuzz-split1/], [sanitize-split1/], [bench-split1/]); call 6 was
# benchmarks/probe_round10.py OUT order (the slot order re-measured), calls 7 and 8
# probe_round11.py OUT small and OUT split; calls 9-11 check, fuzzsan and bench on the final
# rules (two tiles per step for the prefill tile in the split plan too; call 9's test step was
# cut at its 100 s limit, so call 11 runs the tests first); calls 12 and 13 final and finalsan,
# after the review mend of the nested loop's split count.
set -u
STEP=${1:?usage: sh benchmarks/gpu_round11.sh check|fuzzsan|bench|final|finalsan}
INV="python3 -m invariance.cli"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1

# full_check_and_control: the full default check at three dtypes, then the control, into $C.
. benchmarks/gpu_full_check.sh

step_check() {
  C=$OUT/check; mkdir -p $C
  PYTHONPATH=$PWD:$PWD/gpu_site timeout 100 python3 -m pytest -q -p _invariance_pytestplugin -p no:cacheprovider -rfE tests/triton_kernels/test_plans.py -k "nested_loop or fused_loop or prefills_get or batch_tuning or fused_equals_split or prefill_tile_takes or tiles_per_step" > $C/tests.txt 2>&1
  echo "tests rc=$?"; grep -E "passed|failed|FAILED|^[.sFE]+ " $C/tests.txt | tail -5
  full_check_and_control
}

step_fuzzsan() {
  C=$OUT/fuzz; mkdir -p $C
  s=$(date +%s)
  timeout 330 $INV check --backend benchmarks/tile_sweep.py:fuzz --device cuda --dtype bf16,fp16 --no-progress --json $C/tuning-fuzz.json --markdown $C/tuning-fuzz.md > $C/fuzz.txt 2>&1
  echo "fuzz rc=$? wall $(( $(date +%s) - s )) s"; grep -h -E "PASSED|FAILED" $C/fuzz.txt | tail -1
  C=$OUT/sanitize; mkdir -p $C
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 130 compute-sanitizer --tool memcheck --target-processes all --report-api-errors no --error-exitcode 99 python3 benchmarks/gpu_sanitize.py --dtypes bfloat16 > $C/memcheck-bf16.txt 2>&1
  echo "memcheck rc=$?"; tail -3 $C/memcheck-bf16.txt
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 100 compute-sanitizer --tool initcheck --target-processes all --report-api-errors no --error-exitcode 99 python3 benchmarks/gpu_sanitize.py --dtypes bfloat16 --valid-only > $C/initcheck-bf16.txt 2>&1
  echo "initcheck rc=$?"; tail -3 $C/initcheck-bf16.txt
}

# Call 12, after a review: the kernel's nested split count written without int32 wrap (the
# same count for every valid size), the split plan's prefill tile on two large grids, the full
# check and the control again.
step_final() {
  C=$OUT/final; mkdir -p $C
  timeout 200 python3 benchmarks/probe_round11.py $C split mixed64 prefill:4kx8 > $C/split.txt 2>&1
  echo "split rc=$?"; cat $C/split.jsonl
  full_check_and_control
}

# Call 13: compute-sanitizer (memcheck, initcheck) and the kernel tests on the final kernel
# (the split-near-2**31 test added to the selection).
step_finalsan() {
  C=$OUT/finalsan; mkdir -p $C
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 150 compute-sanitizer --tool memcheck --target-processes all --report-api-errors no --error-exitcode 99 python3 benchmarks/gpu_sanitize.py --dtypes bfloat16 > $C/memcheck-bf16.txt 2>&1
  echo "memcheck rc=$?"; tail -3 $C/memcheck-bf16.txt
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 100 compute-sanitizer --tool initcheck --target-processes all --report-api-errors no --error-exitcode 99 python3 benchmarks/gpu_sanitize.py --dtypes bfloat16 --valid-only > $C/initcheck-bf16.txt 2>&1
  echo "initcheck rc=$?"; tail -3 $C/initcheck-bf16.txt
  PYTHONPATH=$PWD:$PWD/gpu_site timeout 230 python3 -m pytest -q -p _invariance_pytestplugin -p no:cacheprovider -rfE tests/triton_kernels/test_plans.py -k "nested_loop or fused_loop or prefills_get or batch_tuning or fused_equals_split or prefill_tile_takes or tiles_per_step or near_two" > $C/tests.txt 2>&1
  echo "tests rc=$?"; grep -E "passed|failed|FAILED|^[.sFE]+ " $C/tests.txt | tail -5
}

step_bench() {
  C=$OUT/bench; mkdir -p $C
  PYTHONPATH=$PWD:$PWD/gpu_site timeout 230 python3 -m pytest -q -p _invariance_pytestplugin -p no:cacheprovider -rfE tests/triton_kernels/test_plans.py -k "nested_loop or fused_loop or prefills_get or batch_tuning or fused_equals_split or prefill_tile_takes or tiles_per_step" > $C/tests.txt 2>&1
  echo "tests rc=$?"; grep -E "passed|failed|FAILED|^[.sFE]+ " $C/tests.txt | tail -5
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
  export PYTHONPATH=$PWD:/tmp/site
  timeout -s INT -k 15 540 $INV bench --backend kernels --backend kernels-heuristic --backend flashinfer:use_tensor_cores=true --backend flashinfer-fa3 --baseline flashinfer --iters 30 --no-progress --markdown $C/bench-kernels-vs-flashinfer.md --json $C/bench-kernels-vs-flashinfer.json > $C/bench.txt 2>&1
  echo "bench rc=$?"
  tail -5 $C/bench.txt
  cat $C/bench-kernels-vs-flashinfer.md | head -30
}

step_$STEP
