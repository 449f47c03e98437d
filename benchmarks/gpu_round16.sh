#!/bin/sh
# The round-16 H100 runs (reports/h100-round16/README.md), one step per device call (each under
# 10 minutes): sh benchmarks/gpu_round16.sh STEP, with $OUT the output folder, .whl/ (the
# FlashInfer wheels) carried. Each step packs its folder into $OUT/STEP.tgz.
#   splits: invariance bench of kernels at split sizes 1024 (the default), 512 and 256 beside
#           kernels-heuristic and FlashInfer's variants, every workload; then the Gluon prefill
#           kernel and the Triton fused kernel forced onto short decode (one chain per KV head)
#   final (call 7): at the round's last commit (kernels' code as bf0cedd's), the full check at three
#          dtypes and the control, then the bench (kernels, kernels:gluon=false, the control,
#          FlashInfer's variants)
set -u
STEP=${1:?usage: sh benchmarks/gpu_round16.sh splits|final}
INV="python3 -m invariance.cli"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1

. benchmarks/gpu_full_check.sh

step_splits() {
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
  PYTHONPATH=$PWD:/tmp/site timeout -s INT -k 15 400 $INV bench --backend kernels --backend kernels:split_size=512 --backend kernels:split_size=256 --backend kernels-heuristic --backend flashinfer:use_tensor_cores=true --backend flashinfer-fa3 --baseline flashinfer --iters 30 --no-progress --markdown $C/bench-splits.md --json $C/bench-splits.json > $C/bench-splits.txt 2>&1
  echo "bench splits rc=$?"; head -40 $C/bench-splits.md
  timeout -s INT -k 15 120 $INV bench --backend kernels --backend kernels:plan=fused --backend kernels:plan=fused,block_m=128,num_warps=8,gluon=true --backend kernels-heuristic --workload decode-b1-ctx1k --workload decode-b8-ctx1k --workload decode-b1-ctx8k --iters 30 --no-progress --markdown $C/bench-chains.md --json $C/bench-chains.json > $C/bench-chains.txt 2>&1
  echo "bench chains rc=$?"; tail -4 $C/bench-chains.txt; head -30 $C/bench-chains.md
}

step_final() {
  full_check_and_control
  bench
}

run_step gpu_round16.sh "splits|final"
