#!/bin/sh
# The round-6 H100 runs (reports/h100-round6/README.md), one step per device call (each under
# 10 minutes): sh benchmarks/gpu_round6.sh STEP, with $OUT the output folder.
#   check: the full default check (3 dtypes, cold Triton cache), the control, the tuning fuzz
#   fuzz: the tuning fuzz alone (it has a fifth setting, 256/8/3; its first run ran past the 120 s
#         limit the check step then gave it)
#   probe: probe_round6.py plans on round 5's kernels (r5old/: `git archive 9ff36f9 kernels |
#          tar -x -C r5old`; git-ignored, so carried to the GPU) and on these, then tunings
#   stats: probe_round6.py stats (fold-sensitive workloads timed, registers and spills) on
#          round 5's kernels (r5old/), these, and the fold variants under var/ (git-ignored,
#          carried; described in the report), twice in alternating order
#   tall: probe_round6.py stats and tall on these kernels (after the fold was chosen)
#   sanitize: benchmarks/gpu_sanitize.sh (memcheck, initcheck)
#   bench: invariance bench kernels + kernels-heuristic + FlashInfer (the wheels in .whl/)
set -u
STEP=${1:?usage: sh benchmarks/gpu_round6.sh check|fuzz|probe|stats|tall|sanitize|bench}
INV="python3 -m invariance.cli"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1

step_check() {
  C=$OUT/c; mkdir -p $C
  s=$(date +%s)
  timeout 240 $INV check --backend kernels --device cuda --no-progress --json $C/kernels-all-dtypes.json --markdown $C/kernels-all-dtypes.md > $C/kernels.txt 2>&1
  echo "kernels rc=$? wall $(( $(date +%s) - s )) s"
  timeout 80 $INV check --backend kernels-heuristic --device cuda --dtype bf16 --no-progress --json $C/kernels-heuristic-bf16.json --markdown $C/kernels-heuristic-bf16.md > $C/heuristic.txt 2>&1
  echo "heuristic rc=$?"
  step_fuzz
  tar czf $OUT/c.tgz -C $OUT c
  for f in kernels heuristic fuzz; do grep -h -E "PASSED|FAILED" $C/$f.txt | tail -1; done
}

step_fuzz() {
  C=$OUT/c; mkdir -p $C
  timeout 400 $INV check --backend benchmarks/tile_sweep.py:fuzz --device cuda --dtype bf16,fp16 --no-progress --json $C/tuning-fuzz.json --markdown $C/tuning-fuzz.md > $C/fuzz.txt 2>&1
  echo "fuzz rc=$?"
}

step_probe() {
  P=$OUT/p; mkdir -p $P/r5 $P/new
  timeout 150 env PYTHONPATH=$PWD/r5old:$PWD python3 benchmarks/probe_round6.py $P/r5 plans > $P/r5/plans.log 2>&1; echo "r5 plans rc=$?"
  timeout 150 python3 benchmarks/probe_round6.py $P/new plans > $P/new/plans.log 2>&1; echo "new plans rc=$?"
  timeout 260 python3 benchmarks/probe_round6.py $P/new tunings > $P/new/tunings.log 2>&1; echo "tunings rc=$?"
  tar czf $OUT/p.tgz -C $OUT p
  grep -A12 "^workload" $P/r5/plans.log $P/new/plans.log
  grep -E "fastest" $P/new/tunings.log
}

step_stats() {
  S=$OUT/s; mkdir -p $S
  for round in 1 2; do
    for v in r5old . var/*; do
      [ -d $v/kernels ] || continue
      tag=$(echo $v | tr '/.' '__')$round
      timeout 120 env PYTHONPATH=$PWD/$v:$PWD PROBE_BLOCK_M_256=$([ $v = . ] && echo 1) python3 benchmarks/probe_round6.py $S/$tag stats > $S/$tag.log 2>&1
      echo "== $v round $round rc=$?"; grep -v '^$' $S/$tag.log | cut -c1-160
    done
  done
  tar czf $OUT/s.tgz -C $OUT s
}

step_tall() {
  T=$OUT/t; mkdir -p $T
  timeout 150 python3 benchmarks/probe_round6.py $T stats > $T/stats.log 2>&1; echo "stats rc=$?"
  timeout 300 python3 benchmarks/probe_round6.py $T tall > $T/tall.log 2>&1; echo "tall rc=$?"
  tar czf $OUT/t.tgz -C $OUT t
  cat $T/stats.log $T/tall.log | cut -c1-170
}

step_sanitize() {
  timeout 540 bash benchmarks/gpu_sanitize.sh /tmp/sanitizer > $OUT/sanitize.txt 2>&1
  echo "sanitizer rc=$?"; cp /tmp/sanitizer/summary.txt $OUT/sanitizer-summary.txt
  cat $OUT/sanitizer-summary.txt
}

step_bench() {
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
  export PYTHONPATH=$PWD:/tmp/site
  B=$OUT/b; mkdir -p $B
  timeout -s INT -k 15 560 $INV bench --backend kernels --backend kernels-heuristic --backend flashinfer:use_tensor_cores=true --backend flashinfer-fa3 --baseline flashinfer --iters 30 --no-progress --markdown $B/bench-kernels-vs-flashinfer.md --json $B/bench-kernels-vs-flashinfer.json > $B/bench.txt 2>&1
  echo "bench rc=$?"
  tar czf $OUT/b.tgz -C $OUT b
  cat $B/bench-kernels-vs-flashinfer.md | head -70
}

step_$STEP
