#!/bin/sh
# The round-7 H100 runs (reports/h100-round7/README.md), one step per device call (each under
# 10 minutes): sh benchmarks/gpu_round7.sh STEP, with $OUT the output folder.
#   splits: invariance bench of the kernels at split sizes 1024 (the default), 512 and 256, next
#           to kernels-heuristic and FlashInfer (the wheels in .whl/)
#   final: the full check at split size 256 (3 dtypes), the short-decode workloads timed, and the
#          kernel test suite on the GPU without test_fuzz.py (pytest and its pure-Python
#          dependencies carried in gpu_site/, git-ignored, copied from the local .venv;
#          hypothesis's compiled module does not carry to the GPU machine's Python 3.12). Call 6
#          ran it without the --ignore (pytest stopped at test_fuzz.py's import), call 7 ran the
#          tests alone with it
#   Also there: PYTHONPATH=.:gpu_site python3 benchmarks/fold_signs.py (run in round 8: gpu_round8.sh)
# The steps of the reverted experiment (spp, check, validate, bench: split-plan programs walking
# several splits) are in this file at commit d15c13a, with benchmarks/probe_round7.py.
set -u
STEP=${1:?usage: sh benchmarks/gpu_round7.sh splits|final}
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

step_final() {
  C=$OUT/final; mkdir -p $C
  s=$(date +%s)
  timeout 240 $INV check --backend kernels:split_size=256 --device cuda --no-progress --json $C/kernels-s256-all-dtypes.json --markdown $C/kernels-s256-all-dtypes.md > $C/s256.txt 2>&1
  echo "split 256 rc=$? wall $(( $(date +%s) - s )) s"
  grep -h -E "PASSED|FAILED" $C/s256.txt | tail -1
  timeout 120 $INV bench --backend kernels --workload decode-b1-ctx1k --workload decode-b1-ctx8k --workload decode-b8-ctx1k --workload decode-b8-ctx32k --iters 30 --no-progress --markdown $C/bench-short-decode.md > $C/bench.txt 2>&1
  echo "bench rc=$?"; grep "^| decode" $C/bench-short-decode.md
  export PYTHONPATH=$PWD:$PWD/gpu_site
  timeout 200 python3 -m pytest -q -p _invariance_pytestplugin -p no:cacheprovider tests/triton_kernels --ignore=tests/triton_kernels/test_fuzz.py > $C/tests.txt 2>&1
  echo "tests rc=$?"; tail -6 $C/tests.txt
  tar czf $OUT/final.tgz -C $OUT final
}

step_$STEP
