#!/bin/sh
# The round-7 H100 runs (reports/h100-round7/README.md), one step per device call (each under
# 10 minutes): sh benchmarks/gpu_round7.sh STEP, with $OUT the output folder.
#   splits: invariance bench of the kernels at split sizes 1024 (the round-6 default), 512 and 256,
#           next to kernels-heuristic and FlashInfer (the wheels in .whl/)
#   spp: probe_round7.py spp (splits per program and merge chunks at split sizes 256/512/1024)
#   check: the full default check (3 dtypes, cold Triton cache), the control, and the full check
#          at split size 256 (3 dtypes)
#   validate: fuzz, then sanitize (one call)
#   fuzz: the tuning fuzz (5 launch settings x 3 plans x 5 splits-per-program draws per batch)
#   sanitize: benchmarks/gpu_sanitize.sh (memcheck, initcheck)
#   tests: the kernel test suite on the GPU (pytest and hypothesis carried in gpu_site/,
#          git-ignored: copies of the pure-Python packages of the local .venv)
#   bench: invariance bench kernels (default and split size 256) + kernels-heuristic + FlashInfer
set -u
STEP=${1:?usage: sh benchmarks/gpu_round7.sh splits|spp|check|validate|fuzz|sanitize|tests|bench}
INV="python3 -m invariance.cli"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1

flashinfer_path() {
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
  export PYTHONPATH=$PWD:/tmp/site
}

step_splits() {
  flashinfer_path
  B=$OUT/b; mkdir -p $B
  timeout -s INT -k 15 570 $INV bench --backend kernels:split_size=1024 --backend kernels:split_size=512 --backend kernels:split_size=256 --backend kernels-heuristic --baseline flashinfer --iters 30 --no-progress --markdown $B/bench-splits.md --json $B/bench-splits.json > $B/bench.txt 2>&1
  echo "bench rc=$?"
  tar czf $OUT/b.tgz -C $OUT b
  tail -5 $B/bench.txt
  head -40 $B/bench-splits.md
}

step_spp() {
  P=$OUT/p; mkdir -p $P
  timeout 540 python3 benchmarks/probe_round7.py $P spp > $P/spp.log 2>&1; echo "spp rc=$?"
  tar czf $OUT/p.tgz -C $OUT p
  grep -A30 "^workload split" $P/spp.log || tail -20 $P/spp.log
}

step_check() {
  C=$OUT/c; mkdir -p $C
  s=$(date +%s)
  timeout 240 $INV check --backend kernels --device cuda --no-progress --json $C/kernels-all-dtypes.json --markdown $C/kernels-all-dtypes.md > $C/kernels.txt 2>&1
  echo "kernels rc=$? wall $(( $(date +%s) - s )) s"
  timeout 80 $INV check --backend kernels-heuristic --device cuda --dtype bf16 --no-progress --json $C/kernels-heuristic-bf16.json --markdown $C/kernels-heuristic-bf16.md > $C/heuristic.txt 2>&1
  echo "heuristic rc=$?"
  s=$(date +%s)
  timeout 240 $INV check --backend kernels:split_size=256 --device cuda --no-progress --json $C/kernels-s256-all-dtypes.json --markdown $C/kernels-s256-all-dtypes.md > $C/s256.txt 2>&1
  echo "split 256 rc=$? wall $(( $(date +%s) - s )) s"
  tar czf $OUT/c.tgz -C $OUT c
  for f in kernels heuristic s256; do grep -h -E "PASSED|FAILED" $C/$f.txt | tail -1; done
}

step_fuzz() {
  C=$OUT/f; mkdir -p $C
  timeout ${FUZZ_LIMIT:-560} $INV check --backend benchmarks/tile_sweep.py:fuzz --device cuda --dtype bf16,fp16 --no-progress --json $C/tuning-fuzz.json --markdown $C/tuning-fuzz.md > $C/fuzz.txt 2>&1
  echo "fuzz rc=$?"
  tar czf $OUT/f.tgz -C $OUT f
  grep -h -E "PASSED|FAILED" $C/fuzz.txt | tail -1
}

step_sanitize() {
  timeout ${SANITIZE_LIMIT:-560} bash benchmarks/gpu_sanitize.sh /tmp/sanitizer > $OUT/sanitize.txt 2>&1
  echo "sanitizer rc=$?"; cp /tmp/sanitizer/summary.txt $OUT/sanitizer-summary.txt
  cat $OUT/sanitizer-summary.txt
}

step_validate() {
  FUZZ_LIMIT=290 step_fuzz
  SANITIZE_LIMIT=280 step_sanitize
}

step_tests() {
  export PYTHONPATH=$PWD:$PWD/gpu_site
  timeout 560 python3 -m pytest -q -p _invariance_pytestplugin -p no:cacheprovider tests/triton_kernels > $OUT/tests.txt 2>&1
  echo "tests rc=$?"; tail -15 $OUT/tests.txt
}

step_bench() {
  flashinfer_path
  B=$OUT/b; mkdir -p $B
  timeout -s INT -k 15 570 $INV bench --backend kernels --backend kernels:split_size=256 --backend kernels-heuristic --backend flashinfer:use_tensor_cores=true --backend flashinfer-fa3 --baseline flashinfer --iters 30 --no-progress --markdown $B/bench-kernels-vs-flashinfer.md --json $B/bench-kernels-vs-flashinfer.json > $B/bench.txt 2>&1
  echo "bench rc=$?"
  tar czf $OUT/b.tgz -C $OUT b
  head -40 $B/bench-kernels-vs-flashinfer.md
}

step_$STEP
