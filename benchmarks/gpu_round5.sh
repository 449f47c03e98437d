#!/bin/sh
# The round-5 H100 runs (reports/h100-round5/README.md), one step per device call (each under
# 10 minutes): sh benchmarks/gpu_round5.sh STEP, with $OUT the output folder.
#   micro: benchmarks/probe_swap.py (standalone kernels: is the swapped tile bit-identical?)
#   probe: probe_round5.py swap on the experiment's kernels (commit 6303129: the swapped decode
#          tile, reverted after this probe), then probe_round5.py plans on round 4's kernels
#          (r4old/, from `git archive 7225b3f kernels | tar -x -C r4old`) and on the
#          experiment's, for a same-session comparison
#   ncu: stall sampling of round 4's split kernel at batch 1, 1k tokens (r4old/ as above)
set -u
STEP=${1:?usage: sh benchmarks/gpu_round5.sh micro|probe|ncu}
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1

step_micro() {
  timeout 400 python3 benchmarks/probe_swap.py $OUT 2>&1 | tail -80
}

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

step_ncu() {
  export PYTHONPATH=$PWD/r4old:$PWD
  N="ncu --section SourceCounters --section WarpStateStats -k regex:split_kernel -s 1 -c 1"
  timeout 200 $N --page raw --csv python3 benchmarks/probe_round4.py $OUT/x ncu decode-b1-ctx1k split > $OUT/raw.csv 2>&1; echo "raw rc=$?"
  timeout 200 $N --page source --print-source sass --csv python3 benchmarks/probe_round4.py $OUT/x ncu decode-b1-ctx1k split > $OUT/sass.csv 2>&1; echo "sass rc=$?"
  rm -rf $OUT/x
}

step_$STEP
