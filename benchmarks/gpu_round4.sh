#!/bin/sh
# The round-4 H100 runs (reports/h100-round4/README.md), one step per device call (each under
# 10 minutes): sh benchmarks/gpu_round4.sh STEP, with $OUT the output folder.
#   probe: benchmarks/probe_round4.py's split sizes, per-kernel profile and compiled-kernel facts
#   blockn: BLOCK_N 128 vs 64 (bit-defining, timed only) with BLOCK_M and warps
#   small: short decode at batch 1-8 (stages x warps; ncu stall reasons at batch 1, 1k tokens)
#   a: the full default check of kernels (3 dtypes, cold Triton cache), the control, the tuning
#      fuzz, and the probe's plan / merge-block timings with bit comparisons
#   final: step a's checks (no control), the probe and the sanitizer again after the review's mends
#   c: the bench again after the FlashInfer adapter's gather-free path, with tensor-core decode
#   warm: the full check cold, then warm
#   b: invariance bench kernels + kernels-heuristic + flashinfer-fa3 vs FlashInfer; sanitizer
# b and c need the FlashInfer wheels in .whl/ (carry them to the GPU).
set -u
STEP=${1:?usage: sh benchmarks/gpu_round4.sh probe|blockn|small|a|b|final|c|warm}
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
INV="python3 -m invariance.cli"

step_probe() {
  P=$OUT/p; mkdir -p $P
  timeout 300 python3 benchmarks/probe_round4.py $P splits > $P/splits.log 2>&1; echo "splits rc=$?"
  timeout 100 python3 benchmarks/probe_round4.py $P profile > $P/profile.log 2>&1; echo "profile rc=$?"
  timeout 100 python3 benchmarks/probe_round4.py $P ttgir > $P/ttgir.log 2>&1; echo "ttgir rc=$?"
  tar czf $OUT/p.tgz -C $OUT p
  grep -A14 "^workload" $P/splits.log
}

step_blockn() {
  N=$OUT/n; mkdir -p $N
  timeout 400 python3 benchmarks/probe_round4.py $N blockn > $N/blockn.log 2>&1; echo "blockn rc=$?"
  grep -A14 "^workload" $N/blockn.log; grep -i error $N/blockn.jsonl | head -5
}

step_small() {
  S=$OUT/s; mkdir -p $S
  timeout 200 python3 benchmarks/probe_round4.py $S small > $S/small.log 2>&1; echo "small rc=$?"
  timeout 150 ncu --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats --section SourceCounters -k regex:split_kernel -s 1 -c 1 python3 benchmarks/probe_round4.py $S ncu decode-b1-ctx1k split > $S/ncu-b1-ctx1k.txt 2>&1; echo "ncu rc=$?"
  grep -v "^{" $S/small.log | tail -3; python3 -c "
import json
for l in open('$S/small.jsonl'): r=json.loads(l); print(r['workload'], r['stages'], r['warps'], r['us'], r['bits_differing'])"
  grep -E "Duration|DRAM Throughput|Stall|Warp Cycles Per|Issued Warp|No Eligible|Active Warps" $S/ncu-b1-ctx1k.txt | head -30
}

step_a() {
  A=$OUT/a; mkdir -p $A
  nvidia-smi --query-gpu=name,driver_version --format=csv > $A/gpu.txt
  python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $A/gpu.txt
  s=$(date +%s)
  timeout 220 $INV check --backend kernels --device cuda --no-progress --json $A/kernels-all-dtypes.json --markdown $A/kernels-all-dtypes.md > $A/kernels.txt 2>&1
  echo "kernels rc=$? wall $(( $(date +%s) - s )) s"
  timeout 80 $INV check --backend kernels-heuristic --device cuda --dtype bf16 --no-progress --json $A/kernels-heuristic-bf16.json --markdown $A/kernels-heuristic-bf16.md > $A/heuristic.txt 2>&1
  echo "heuristic rc=$?"
  timeout 120 $INV check --backend benchmarks/tile_sweep.py:fuzz --device cuda --dtype bf16,fp16 --no-progress --json $A/tuning-fuzz.json --markdown $A/tuning-fuzz.md > $A/fuzz.txt 2>&1
  echo "fuzz rc=$?"
  timeout 150 python3 benchmarks/probe_round4.py $A times > $A/probe-times.log 2>&1
  echo "probe rc=$?"
  tar czf $OUT/a.tgz -C $OUT a
  for f in kernels heuristic fuzz; do grep -h -E "passed|failed|PASSED|FAILED|error" $A/$f.txt | tail -2; done
  grep -A10 "^workload" $A/probe-times.log
}

step_final() {
  # After the review's mends (host-side and malformed-input paths only): the full check, the
  # fuzz, the probe's bit comparisons and the sanitizer once more.
  F=$OUT/f; mkdir -p $F
  s=$(date +%s)
  timeout 220 $INV check --backend kernels --device cuda --no-progress --json $F/kernels-all-dtypes.json --markdown $F/kernels-all-dtypes.md > $F/kernels.txt 2>&1
  echo "kernels rc=$? wall $(( $(date +%s) - s )) s"
  timeout 100 $INV check --backend benchmarks/tile_sweep.py:fuzz --device cuda --dtype bf16,fp16 --no-progress --json $F/tuning-fuzz.json --markdown $F/tuning-fuzz.md > $F/fuzz.txt 2>&1
  echo "fuzz rc=$?"
  timeout 150 python3 benchmarks/probe_round4.py $F times > $F/probe-times.log 2>&1
  echo "probe rc=$?"
  timeout 200 bash benchmarks/gpu_sanitize.sh /tmp/sanitizer > $F/sanitize.txt 2>&1
  echo "sanitizer rc=$?"; cp /tmp/sanitizer/summary.txt $F/sanitizer-summary.txt
  tar czf $OUT/f.tgz -C $OUT f
  for f in kernels fuzz; do grep -h -E "PASSED|FAILED" $F/$f.txt | tail -1; done
  grep -A10 "^workload" $F/probe-times.log; cat $F/sanitizer-summary.txt
}

step_c() {
  # The bench again after the FlashInfer adapter stopped gathering/scattering when one wrapper
  # serves every row, with FlashInfer's tensor-core decode as a further peer; then a short check
  # of the adapter's new path.
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
  export PYTHONPATH=$PWD:/tmp/site
  C=/tmp/c; mkdir -p $C
  timeout -s INT -k 15 400 $INV bench --backend kernels --backend kernels-heuristic --backend flashinfer:use_tensor_cores=true --backend flashinfer-fa3 --baseline flashinfer --iters 30 --no-progress --markdown $C/bench-kernels-vs-flashinfer.md --json $C/bench-kernels-vs-flashinfer.json > $C/bench.txt 2>&1
  echo "bench rc=$?"
  timeout -s INT -k 15 100 $INV check --backend flashinfer --device cuda --dtype bf16 --perturb batch_size,position,order,repeat,cuda_graph --no-progress --json $C/flashinfer-check.json --markdown $C/flashinfer-check.md > $C/check.txt 2>&1
  echo "check rc=$?"
  tar czf $OUT/c.tgz -C /tmp c
  grep -h -E "PASSED|FAILED" $C/check.txt | tail -1
}

step_warm() {
  # The full check on a fresh machine, then again with Triton's cache warm.
  W=$OUT/w; mkdir -p $W
  for r in cold warm; do
    s=$(date +%s)
    timeout 240 $INV check --backend kernels --device cuda --no-progress --json $W/kernels-$r.json > $W/$r.txt 2>&1
    echo "$r rc=$? wall $(( $(date +%s) - s )) s"; grep -h -E "PASSED|FAILED" $W/$r.txt | tail -1
  done
}

step_b() {
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
  export PYTHONPATH=$PWD:/tmp/site
  B=/tmp/b; mkdir -p $B
  timeout -s INT -k 15 380 $INV bench --backend kernels --backend kernels-heuristic --backend flashinfer-fa3 --baseline flashinfer --iters 30 --no-progress --markdown $B/bench-kernels-vs-flashinfer.md --json $B/bench-kernels-vs-flashinfer.json > $B/bench.txt 2>&1
  echo "bench rc=$?"
  timeout 420 bash benchmarks/gpu_sanitize.sh $B/sanitizer > $B/sanitize.txt 2>&1
  echo "sanitizer rc=$?"
  rm -rf $B/sanitizer/triton-cache
  tar czf $OUT/b.tgz -C /tmp b
  tail -22 $B/bench.txt; cat $B/sanitizer/summary.txt
}

"step_$STEP"
