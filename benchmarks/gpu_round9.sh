#!/bin/sh
# The round-9 H100 runs (reports/h100-round9/README.md), one step per device call (each under
# 10 minutes): sh benchmarks/gpu_round9.sh STEP, with $OUT the output folder, gpu_site/
# (pytest and its pure-Python dependencies, git-ignored, copied from the local .venv) and .whl/
# (the FlashInfer wheels) carried.
#   check: the full default check of the kernels at three dtypes (the tiles-per-step and
#          value-block rules in play), the control kernels-heuristic at bf16 (it must fail),
#          the split-plan tests of test_plans.py (tiles per step, value blocks) on the GPU
#   bench: invariance bench kernels + kernels-heuristic + FlashInfer's variants (side by side)
#   fuzz: the tuning fuzz (fp16, bf16; it draws tiles per step and value blocks per batch),
#         then compute-sanitizer memcheck at bf16 (gpu_sanitize.py: two tiles per step with
#         and without V column blocks, valid and malformed inputs)
#   rest: compute-sanitizer initcheck at bf16 (valid inputs: no read of unwritten memory with
#         two tiles per step and V column blocks), then the kernel test suite without
#         test_fuzz.py and the test_plans.py tests the check step ran
# Calls 1-3 before these were benchmarks/probe_round9.py OUT pair, OUT foldmem and OUT quad on
# the experiment commit 064f77a.
set -u
STEP=${1:?usage: sh benchmarks/gpu_round9.sh check|bench|fuzz|rest}
INV="python3 -m invariance.cli"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1

step_check() {
  C=$OUT/check; mkdir -p $C
  s=$(date +%s)
  timeout 230 $INV check --backend kernels --device cuda --no-progress --json $C/kernels-all-dtypes.json --markdown $C/kernels-all-dtypes.md > $C/check.txt 2>&1
  echo "check rc=$? wall $(( $(date +%s) - s )) s"; grep -h -E "PASSED|FAILED" $C/check.txt | tail -1
  s=$(date +%s)
  timeout 120 $INV check --backend kernels-heuristic --device cuda --dtype bf16 --no-progress --json $C/control-bf16.json --markdown $C/control-bf16.md > $C/control.txt 2>&1
  echo "control rc=$? wall $(( $(date +%s) - s )) s"; grep -h -E "PASSED|FAILED" $C/control.txt | tail -1
  PYTHONPATH=$PWD:$PWD/gpu_site timeout 200 python3 -m pytest -q -p _invariance_pytestplugin -p no:cacheprovider -rfE tests/triton_kernels/test_plans.py -k "tiles_per_step or value_blocks or fused_equals_split" > $C/tests.txt 2>&1
  echo "tests rc=$?"; grep -E "passed|failed|FAILED" $C/tests.txt | tail -5
  tar czf $OUT/check.tgz -C $OUT check
}

step_bench() {
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
  export PYTHONPATH=$PWD:/tmp/site
  B=$OUT/bench; mkdir -p $B
  timeout -s INT -k 15 570 $INV bench --backend kernels --backend kernels-heuristic --backend flashinfer:use_tensor_cores=true --backend flashinfer-fa3 --baseline flashinfer --iters 30 --no-progress --markdown $B/bench-kernels-vs-flashinfer.md --json $B/bench-kernels-vs-flashinfer.json > $B/bench.txt 2>&1
  echo "bench rc=$?"
  tail -5 $B/bench.txt
  cat $B/bench-kernels-vs-flashinfer.md | head -70
}

step_fuzz() {
  C=$OUT/fuzz; mkdir -p $C
  s=$(date +%s)
  timeout 300 $INV check --backend benchmarks/tile_sweep.py:fuzz --device cuda --dtype bf16,fp16 --no-progress --json $C/tuning-fuzz.json --markdown $C/tuning-fuzz.md > $C/fuzz.txt 2>&1
  echo "fuzz rc=$? wall $(( $(date +%s) - s )) s"; grep -h -E "PASSED|FAILED" $C/fuzz.txt | tail -1
  timeout 60 python3 benchmarks/gpu_sanitize.py --dtypes bfloat16 > $C/warm.txt 2>&1; echo "warm rc=$?"
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 200 compute-sanitizer --tool memcheck --target-processes all --report-api-errors no --error-exitcode 99 python3 benchmarks/gpu_sanitize.py --dtypes bfloat16 > $C/memcheck-bf16.txt 2>&1
  echo "memcheck rc=$?"; tail -3 $C/memcheck-bf16.txt
  tar czf $OUT/fuzz.tgz -C $OUT fuzz
}

step_rest() {
  C=$OUT/rest; mkdir -p $C
  timeout 60 python3 benchmarks/gpu_sanitize.py --dtypes bfloat16 --valid-only > $C/warm.txt 2>&1; echo "warm rc=$?"
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 200 compute-sanitizer --tool initcheck --target-processes all --report-api-errors no --error-exitcode 99 python3 benchmarks/gpu_sanitize.py --dtypes bfloat16 --valid-only > $C/initcheck-bf16.txt 2>&1
  echo "initcheck rc=$?"; tail -3 $C/initcheck-bf16.txt
  PYTHONPATH=$PWD:$PWD/gpu_site timeout 280 python3 -m pytest -q -p _invariance_pytestplugin -p no:cacheprovider -rfE tests/triton_kernels --ignore=tests/triton_kernels/test_fuzz.py -k "not tiles_per_step and not value_blocks and not fused_equals_split" > $C/tests.txt 2>&1
  echo "tests rc=$?"; grep -E "passed|failed|FAILED|^[.sFE]+ " $C/tests.txt | tail -8
  tar czf $OUT/rest.tgz -C $OUT rest
}

step_$STEP
