#!/bin/sh
# The round-5 H100 runs (reports/h100-round5/README.md), one step per device call (each under
# 10 minutes): sh benchmarks/gpu_round5.sh STEP, with $OUT the output folder.
#   probe: probe_round5.py swap (the swapped decode tile vs the standard tile, bits and time),
#          then probe_round5.py plans on round 4's kernels (r4old/, `git archive 7225b3f kernels`)
#          and on these, for a same-session comparison
#   check: the full default check of kernels (3 dtypes, cold Triton cache), the control, the
#          tuning fuzz (which now draws the swapped tile too) and the sanitizer
#   bench: invariance bench kernels + kernels-heuristic + FlashInfer (needs the wheels in .whl/)
set -u
STEP=${1:?usage: sh benchmarks/gpu_round5.sh probe|check|bench}
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
INV="python3 -m invariance.cli"

step_probe() {
  P=$OUT/p; mkdir -p $P/r4 $P/r5
  nvidia-smi --query-gpu=name,driver_version --format=csv > $P/gpu.txt
  python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $P/gpu.txt
  timeout 330 python3 benchmarks/probe_round5.py $P swap > $P/swap.log 2>&1; echo "swap rc=$?"
  timeout 120 env PYTHONPATH=$PWD/r4old:$PWD python3 benchmarks/probe_round5.py $P/r4 plans > $P/r4/plans.log 2>&1; echo "r4 plans rc=$?"
  timeout 100 python3 benchmarks/probe_round5.py $P/r5 plans > $P/r5/plans.log 2>&1; echo "r5 plans rc=$?"
  tar czf $OUT/p.tgz -C $OUT p
  grep -A13 "^workload" $P/swap.log; grep -A13 "^workload" $P/r4/plans.log; grep -A13 "^workload" $P/r5/plans.log
  grep -h error $P/swap.log | head -5
}

step_check() {
  C=$OUT/c; mkdir -p $C
  s=$(date +%s)
  timeout 230 $INV check --backend kernels --device cuda --no-progress --json $C/kernels-all-dtypes.json --markdown $C/kernels-all-dtypes.md > $C/kernels.txt 2>&1
  echo "kernels rc=$? wall $(( $(date +%s) - s )) s"
  timeout 80 $INV check --backend kernels-heuristic --device cuda --dtype bf16 --no-progress --json $C/kernels-heuristic-bf16.json --markdown $C/kernels-heuristic-bf16.md > $C/heuristic.txt 2>&1
  echo "heuristic rc=$?"
  timeout 130 $INV check --backend benchmarks/tile_sweep.py:fuzz --device cuda --dtype bf16,fp16 --no-progress --json $C/tuning-fuzz.json --markdown $C/tuning-fuzz.md > $C/fuzz.txt 2>&1
  echo "fuzz rc=$?"
  timeout 130 bash benchmarks/gpu_sanitize.sh /tmp/sanitizer > $C/sanitize.txt 2>&1
  echo "sanitizer rc=$?"; cp /tmp/sanitizer/summary.txt $C/sanitizer-summary.txt
  tar czf $OUT/c.tgz -C $OUT c
  for f in kernels heuristic fuzz; do grep -h -E "PASSED|FAILED|passed|failed" $C/$f.txt | tail -2; done
  cat $C/sanitizer-summary.txt
}

step_bench() {
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
  export PYTHONPATH=$PWD:/tmp/site
  B=$OUT/b; mkdir -p $B
  timeout 540 $INV bench --backend kernels --backend kernels-heuristic --backend flashinfer:use_tensor_cores=true --backend flashinfer-fa3 --baseline flashinfer --iters 30 --json $B/bench.json --markdown $B/bench.md > $B/bench.txt 2>&1
  echo "bench rc=$?"
  tar czf $OUT/b.tgz -C $OUT b
  cat $B/bench.md | head -60
}

step_$STEP
