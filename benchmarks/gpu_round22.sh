#!/bin/sh
# The round-22 H100 runs (reports/h100-round22/README.md), one step per device call (each under
# 10 minutes): sh benchmarks/gpu_round22.sh STEP, with $OUT the output folder, gpu_site/ (pytest)
# carried for the tests and .whl/ (the FlashInfer wheels) for the bench. Each step packs its
# folder into $OUT/STEP.tgz.
#   probe: benchmarks/probe_round22.py bits (the loader's page ids one tile ahead against the
#          default launch, and the 64-key control) and times (the same, and the control with
#          and without)
#   ncu:   each kernel's duration and warp states under ncu at batch 1 (1k and 32k tokens):
#          the default and the control
#   tests: the Gluon tests (test_gluon.py, fp16 and bf16) with their durations
#   final: the full check at three dtypes with the launches counted (benchmarks/count_gluon.py),
#          the control, memcheck and initcheck (benchmarks/gpu_sanitize.py), then the GPU
#          kernel tests (test_gpu.py)
#   bench: the bench (kernels, the 64-key contract, the control, FlashInfer's variants)
#   check: the full check counted, the control, then the GPU kernel tests (test_gpu.py): the
#          final step without the sanitizers
#   san: memcheck alone with a longer timeout ($SAN_S, 500 s by default; final's 150 s ran out)
set -u
STEP=${1:?usage: sh benchmarks/gpu_round22.sh probe|ncu|tests|final|check|bench|san}
INV="python3 -m invariance.cli"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1

. benchmarks/gpu_full_check.sh

step_probe() {
  step_info
  for part in ${PARTS:-bits times}; do
    s=$(date +%s)
    timeout -s INT -k 15 ${1:-260} python3 benchmarks/probe_round22.py $C $part > $C/$part.txt 2>&1
    echo "$part rc=$? wall $(( $(date +%s) - s )) s"; tail -2 $C/$part.txt | cut -c1-600
  done
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

step_tests() {
  step_info
  s=$(date +%s)
  INVARIANCE_DTYPE=float16,bfloat16 PYTHONPATH=$PWD:$PWD/gpu_site timeout -s INT -k 20 ${1:-540} python3 -m pytest -v -p _invariance_pytestplugin -p no:cacheprovider -rfE --durations=15 tests/triton_kernels/test_gluon.py > $C/tests-gluon.txt 2>&1
  echo "gluon tests rc=$? wall $(( $(date +%s) - s )) s"; grep -E "passed|failed|FAILED|Error" $C/tests-gluon.txt | tail -12 | cut -c1-300
}

gpu_tests() {
  s=$(date +%s)
  PYTHONPATH=$PWD:$PWD/gpu_site timeout 150 python3 -m pytest -q -p _invariance_pytestplugin -p no:cacheprovider -rfE tests/triton_kernels/test_gpu.py > $C/tests-gpu.txt 2>&1
  echo "gpu tests rc=$? wall $(( $(date +%s) - s )) s"; tail -3 $C/tests-gpu.txt
}

step_final() {
  step_info
  counted_final
  gpu_tests
}

step_bench() {
  step_info
  flashinfer_site
  PYTHONPATH=$PWD:/tmp/site timeout -s INT -k 15 540 $INV bench --backend kernels --backend kernels:block_n=64 --backend kernels-heuristic --backend flashinfer:use_tensor_cores=true --backend flashinfer-fa3 --baseline flashinfer --iters 30 --no-progress --markdown $C/bench-kernels-vs-flashinfer.md --json $C/bench-kernels-vs-flashinfer.json > $C/bench.txt 2>&1
  echo "bench rc=$?"; tail -3 $C/bench.txt; head -30 $C/bench-kernels-vs-flashinfer.md
}

step_check() {
  step_info
  counted_check_and_control
  gpu_tests
}

step_san() {
  step_info
  s=$(date +%s)
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout ${SAN_S:-500} compute-sanitizer --tool memcheck --target-processes all --report-api-errors no --error-exitcode 99 python3 benchmarks/gpu_sanitize.py --dtypes bfloat16 > $C/memcheck-bf16.txt 2>&1
  echo "memcheck rc=$? wall $(( $(date +%s) - s )) s"; grep -c "^\[ok\]" $C/memcheck-bf16.txt; tail -3 $C/memcheck-bf16.txt
}

run_step gpu_round22.sh "probe|ncu|tests|final|check|bench|san"
