#!/bin/sh
# The round-5 H100 runs (reports/h100-round5/README.md), one step per device call (each under
# 10 minutes): sh benchmarks/gpu_round5.sh STEP, with $OUT the output folder.
#   micro: benchmarks/probe_swap.py (standalone kernels: is the swapped tile bit-identical?)
#   ncu: stall sampling of round 4's split kernel at batch 1, 1k tokens (r4old/: round 4's
#        kernels from `git archive 7225b3f kernels | tar -x -C r4old`; git-ignored, so carried
#        to the GPU)
#   check: on the final kernels, the full default check (3 dtypes, cold Triton cache), the
#          control, the tuning fuzz and the hashes of round 4's kernels (r4old/) and these
#          (bits across builds; on commit c174114 this step also ran probe_round5.py flat)
#   sanitize: benchmarks/gpu_sanitize.sh (memcheck, initcheck)
#   (Steps probe, flat and rows ran the swap and flat probe modes on kernels that are gone; they
#   are in this script at commits 6303129 (probe) and c174114 (flat, rows).)
#   bench: probe_round5.py krows (K rows vs columns, bits and time), then invariance bench
#          kernels + kernels-heuristic + FlashInfer (the wheels in .whl/)
set -u
STEP=${1:?usage: sh benchmarks/gpu_round5.sh micro|ncu|check|sanitize|bench}
INV="python3 -m invariance.cli"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1

step_micro() {
  timeout 400 python3 benchmarks/probe_swap.py $OUT 2>&1 | tail -80
}

step_ncu() {
  export PYTHONPATH=$PWD/r4old:$PWD
  N="ncu --section SourceCounters --section WarpStateStats -k regex:split_kernel -s 1 -c 1"
  timeout 200 $N --page raw --csv python3 benchmarks/probe_round4.py $OUT/x ncu decode-b1-ctx1k split > $OUT/raw.csv 2>&1; echo "raw rc=$?"
  timeout 200 $N --page source --print-source sass --csv python3 benchmarks/probe_round4.py $OUT/x ncu decode-b1-ctx1k split > $OUT/sass.csv 2>&1; echo "sass rc=$?"
  rm -rf $OUT/x
}

step_check() {
  C=$OUT/c; mkdir -p $C
  s=$(date +%s)
  timeout 240 $INV check --backend kernels --device cuda --no-progress --json $C/kernels-all-dtypes.json --markdown $C/kernels-all-dtypes.md > $C/kernels.txt 2>&1
  echo "kernels rc=$? wall $(( $(date +%s) - s )) s"
  timeout 80 $INV check --backend kernels-heuristic --device cuda --dtype bf16 --no-progress --json $C/kernels-heuristic-bf16.json --markdown $C/kernels-heuristic-bf16.md > $C/heuristic.txt 2>&1
  echo "heuristic rc=$?"
  timeout 120 $INV check --backend benchmarks/tile_sweep.py:fuzz --device cuda --dtype bf16,fp16 --no-progress --json $C/tuning-fuzz.json --markdown $C/tuning-fuzz.md > $C/fuzz.txt 2>&1
  echo "fuzz rc=$?"
  mkdir -p $C/r4 $C/new
  timeout 100 env PYTHONPATH=$PWD/r4old:$PWD python3 benchmarks/probe_round5.py $C/r4 hashes > $C/r4/hashes.log 2>&1; echo "r4 hashes rc=$?"
  timeout 100 python3 benchmarks/probe_round5.py $C/new hashes > $C/new/hashes.log 2>&1; echo "new hashes rc=$?"
  python3 -c "
import json
a=[json.loads(l) for l in open('$C/r4/hashes.jsonl')]; b=[json.loads(l) for l in open('$C/new/hashes.jsonl')]
print('hash rows', len(a), len(b), 'differ', sum(x != y for x, y in zip(a, b)))"
  tar czf $OUT/c.tgz -C $OUT c
  for f in kernels heuristic fuzz; do grep -h -E "PASSED|FAILED" $C/$f.txt | tail -1; done
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
  timeout 170 python3 benchmarks/probe_round5.py $B krows > $B/krows.log 2>&1; echo "krows rc=$?"
  timeout -s INT -k 15 540 $INV bench --backend kernels --backend kernels-heuristic --backend flashinfer:use_tensor_cores=true --backend flashinfer-fa3 --baseline flashinfer --iters 30 --no-progress --markdown $B/bench-kernels-vs-flashinfer.md --json $B/bench-kernels-vs-flashinfer.json > $B/bench.txt 2>&1
  echo "bench rc=$?"
  tar czf $OUT/b.tgz -C $OUT b
  grep -A13 "^workload" $B/krows.log
  cat $B/bench-kernels-vs-flashinfer.md | head -70
}

step_$STEP
