#!/bin/sh
# The round-10 H100 runs (reports/h100-round10/README.md), one step per device call (each under
# 10 minutes): sh benchmarks/gpu_round10.sh STEP, with $OUT the output folder, gpu_site/
# (pytest and its pure-Python dependencies, git-ignored, copied from the local .venv) and .whl/
# (the FlashInfer wheels) carried.
#   check: the merge's dependent launch against an ordinary one (probe_round10.py pdl: bits and
#          times), the full default check of the kernels at three dtypes (the value-block rule
#          with 8 blocks and with 4 for several splits, two tiles per step, the dependent merge
#          in play), the control kernels-heuristic at bf16 (it must fail)
#   order: the fused plan's slot order against the plain order (probe_round10.py order: bits
#          and times), then the full default check at three dtypes and the control, as in
#          check, on the final kernels (the slot-order rule in play too)
#   fuzz: the tuning fuzz (fp16, bf16; it draws 1-8 value blocks, tiles per step, the merge's
#         launch and the fused plan's slot order per batch)
#   sanitize: compute-sanitizer memcheck at bf16 (gpu_sanitize.py: 8 value blocks, the
#         dependent merge and an ordinary one, the slot order, valid and malformed inputs),
#         then initcheck on valid inputs
#   fuzzsan: fuzz, then sanitize, in one call
#   tests: the new and changed kernel tests on the GPU (carry gpu_site/)
#   bench: the split-plan tests of test_plans.py on the GPU, then invariance bench kernels +
#          kernels-heuristic + FlashInfer's variants (side by side)
# Call 1 before these was benchmarks/probe_round10.py OUT profile and OUT small. Call 3 ran
# the fuzz (then cut at 240 s: 19 of 28 cells done, all passed) and sanitize steps in one
# call (reports/h100-round10/fuzz-cut/); call 4 reran the fuzz step alone. Calls 2-4 ran
# before the slot order existed. Calls 5 and 6 ran the order step on two first versions of it
# (order-tiles-key/: slots sorted by their own tiles with torch.argsort; order-argsort/: the
# request key with torch.argsort); call 7 is the order step on the final kernels (the request
# key ranked by _slot_rank_kernel), call 8 the fuzz and sanitize steps, call 9 bench (its test
# step cut at 80 s, three test bugs seen), call 10 the tests step after mending them. A rerun of
# the tests step after the review mends was refused (no device time left).
set -u
STEP=${1:?usage: sh benchmarks/gpu_round10.sh check|order|fuzz|sanitize|fuzzsan|tests|bench}
INV="python3 -m invariance.cli"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1

# full_check_and_control (the full default check at three dtypes, then the control, into $C;
# the order step of calls 5-7 gave the control 100 s, the check step 120).
. benchmarks/gpu_full_check.sh

step_check() {
  C=$OUT/check; mkdir -p $C
  timeout 150 python3 benchmarks/probe_round10.py $C pdl > $C/pdl.txt 2>&1
  echo "pdl rc=$?"; cat $C/pdl.jsonl
  full_check_and_control
}

step_order() {
  C=$OUT/order; mkdir -p $C
  timeout 200 python3 benchmarks/probe_round10.py $C order > $C/order.txt 2>&1
  echo "order rc=$?"; cat $C/order.jsonl
  full_check_and_control
}

step_fuzz() {
  C=$OUT/fuzz; mkdir -p $C
  s=$(date +%s)
  timeout 450 $INV check --backend benchmarks/tile_sweep.py:fuzz --device cuda --dtype bf16,fp16 --no-progress --json $C/tuning-fuzz.json --markdown $C/tuning-fuzz.md > $C/fuzz.txt 2>&1
  echo "fuzz rc=$? wall $(( $(date +%s) - s )) s"; grep -h -E "PASSED|FAILED" $C/fuzz.txt | tail -1
}

step_sanitize() {
  C=$OUT/sanitize; mkdir -p $C
  timeout 90 python3 benchmarks/gpu_sanitize.py --dtypes bfloat16 > $C/warm.txt 2>&1; echo "warm rc=$?"; tail -2 $C/warm.txt
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 150 compute-sanitizer --tool memcheck --target-processes all --report-api-errors no --error-exitcode 99 python3 benchmarks/gpu_sanitize.py --dtypes bfloat16 > $C/memcheck-bf16.txt 2>&1
  echo "memcheck rc=$?"; tail -3 $C/memcheck-bf16.txt
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 120 compute-sanitizer --tool initcheck --target-processes all --report-api-errors no --error-exitcode 99 python3 benchmarks/gpu_sanitize.py --dtypes bfloat16 --valid-only > $C/initcheck-bf16.txt 2>&1
  echo "initcheck rc=$?"; tail -3 $C/initcheck-bf16.txt
}

step_fuzzsan() {
  step_fuzz
  step_sanitize
}

step_tests() {
  mkdir -p $OUT/tests
  PYTHONPATH=$PWD:$PWD/gpu_site timeout 280 python3 -m pytest -q -p _invariance_pytestplugin -p no:cacheprovider -rfE tests/triton_kernels/test_plans.py tests/triton_kernels/test_validation.py -k "slot or dependent or eight or sixteen or value_blocks or tiles_per_step" > $OUT/tests/tests.txt 2>&1
  echo "tests rc=$?"; grep -E "passed|failed|FAILED|^[.sFE]+" $OUT/tests/tests.txt | tail -12
}

step_bench() {
  C=$OUT/bench; mkdir -p $C
  PYTHONPATH=$PWD:$PWD/gpu_site timeout 80 python3 -m pytest -q -p _invariance_pytestplugin -p no:cacheprovider -rfE tests/triton_kernels/test_plans.py -k "value_blocks or dependent or tiles_per_step or slot or fused_equals_split" > $C/tests.txt 2>&1
  echo "tests rc=$?"; grep -E "passed|failed|FAILED|^[.sFE]+ " $C/tests.txt | tail -5
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
  export PYTHONPATH=$PWD:/tmp/site
  timeout -s INT -k 15 470 $INV bench --backend kernels --backend kernels-heuristic --backend flashinfer:use_tensor_cores=true --backend flashinfer-fa3 --baseline flashinfer --iters 30 --no-progress --markdown $C/bench-kernels-vs-flashinfer.md --json $C/bench-kernels-vs-flashinfer.json > $C/bench.txt 2>&1
  echo "bench rc=$?"
  tail -5 $C/bench.txt
  cat $C/bench-kernels-vs-flashinfer.md | head -70
}

step_$STEP
