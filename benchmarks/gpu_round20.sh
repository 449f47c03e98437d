#!/bin/sh
# The round-20 H100 runs (reports/h100-round20/README.md), one step per device call (each under
# 10 minutes): sh benchmarks/gpu_round20.sh STEP, with $OUT the output folder, gpu_site/ (pytest)
# carried for the tests and .whl/ (the FlashInfer wheels) for the bench. Each step packs its
# folder into $OUT/STEP.tgz.
#   probe: the Gluon tests (fp16, bf16), then benchmarks/probe_round20.py bits (every 128-key
#          kernel path against the default launch, and the 64-key control) and times (the
#          128-key default against the 64-key contract)
#   tests: the Gluon tests with their durations, then probe_round20.py plans (the fused and the
#          split plan on decode batches of 2-16 requests)
#   check: the full check at three dtypes, then the control (bf16)
#   bench: the bench (kernels, the 64-key contract, kernels:gluon=false, the control,
#          FlashInfer's variants)
#   san: compute-sanitizer memcheck and initcheck (benchmarks/gpu_sanitize.py), then the GPU
#        kernel tests (test_gpu.py)
#   final: on the final tree, the full check at three dtypes with the launches counted
#          (benchmarks/count_gluon.py), the control, then memcheck and initcheck
#   final2: on the final tree, the Gluon tests, then the GPU kernel tests (test_gpu.py)
set -u
STEP=${1:?usage: sh benchmarks/gpu_round20.sh probe|tests|check|bench|san|final|final2}
INV="python3 -m invariance.cli"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1

. benchmarks/gpu_full_check.sh

step_probe() {
  step_info
  gluon_tests 330
  for part in bits times; do
    s=$(date +%s)
    timeout -s INT -k 15 ${1:-150} python3 benchmarks/probe_round20.py $C $part > $C/$part.txt 2>&1
    echo "$part rc=$? wall $(( $(date +%s) - s )) s"; tail -2 $C/$part.txt | cut -c1-400
  done
}

step_tests() {
  step_info
  s=$(date +%s)
  INVARIANCE_DTYPE=float16,bfloat16 PYTHONPATH=$PWD:$PWD/gpu_site timeout -s INT -k 20 400 python3 -m pytest -v -p _invariance_pytestplugin -p no:cacheprovider -rfE --durations=25 tests/triton_kernels/test_gluon.py > $C/tests-gluon.txt 2>&1
  echo "gluon tests rc=$? wall $(( $(date +%s) - s )) s"; tail -32 $C/tests-gluon.txt | cut -c1-200
  s=$(date +%s)
  timeout -s INT -k 15 120 python3 benchmarks/probe_round20.py $C plans > $C/plans.txt 2>&1
  echo "plans rc=$? wall $(( $(date +%s) - s )) s"
}

step_check() {
  step_info
  full_check_and_control 450 120
}

step_bench() {
  step_info
  flashinfer_site
  PYTHONPATH=$PWD:/tmp/site timeout -s INT -k 15 540 $INV bench --backend kernels --backend kernels:block_n=64 --backend kernels:gluon=false --backend kernels-heuristic --backend flashinfer:use_tensor_cores=true --backend flashinfer-fa3 --baseline flashinfer --iters 30 --no-progress --markdown $C/bench-kernels-vs-flashinfer.md --json $C/bench-kernels-vs-flashinfer.json > $C/bench.txt 2>&1
  echo "bench rc=$?"; tail -3 $C/bench.txt; head -30 $C/bench-kernels-vs-flashinfer.md
}

step_san() {
  step_info
  sanitize
  gpu_tests
}

gpu_tests() {
  PYTHONPATH=$PWD:$PWD/gpu_site timeout 150 python3 -m pytest -q -p _invariance_pytestplugin -p no:cacheprovider -rfE tests/triton_kernels/test_gpu.py > $C/tests-gpu.txt 2>&1
  echo "gpu tests rc=$?"; tail -3 $C/tests-gpu.txt
}

step_final() {
  step_info
  counted_final
}

step_final2() {
  step_info
  gluon_tests 330
  gpu_tests
}

run_step gpu_round20.sh "probe|tests|check|bench|san|final|final2"
