#!/bin/sh
# The round-8 H100 runs (reports/h100-round8/README.md), one step per device call (each under
# 10 minutes): sh benchmarks/gpu_round8.sh STEP, with $OUT the output folder and gpu_site/
# (pytest and its pure-Python dependencies, git-ignored, copied from the local .venv) carried.
#   fold: benchmarks/fold_signs.py; the kernel test suite without test_fuzz.py (hypothesis's
#         compiled module does not carry to the GPU machine's Python 3.12); the two -0.0 tests
#         again with state_fold's literal -0.0 put back (a deliberate break, on a copy of the
#         file, restored after); the full default check at three dtypes
#   blockn: benchmarks/probe_round8.py (BLOCK_N 128 with the bit-neutral settings swept)
#   again: (call 2) the full default check of the kernels at three dtypes (call 1 named two
#          backends, and check runs the last: it checked only the control), the two changed
#          test files, then the probe until the call's time runs out
set -u
STEP=${1:?usage: sh benchmarks/gpu_round8.sh fold|blockn}
INV="python3 -m invariance.cli"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1

step_fold() {
  C=$OUT/fold; mkdir -p $C
  PYTHONPATH=$PWD:$PWD/gpu_site python3 benchmarks/fold_signs.py > $C/fold_signs.txt 2>&1
  echo "fold_signs rc=$?"; cat $C/fold_signs.txt
  T="-q -p _invariance_pytestplugin -p no:cacheprovider"
  PYTHONPATH=$PWD:$PWD/gpu_site timeout 220 python3 -m pytest $T tests/triton_kernels --ignore=tests/triton_kernels/test_fuzz.py > $C/tests.txt 2>&1
  echo "tests rc=$?"; tail -4 $C/tests.txt
  F=kernels/_triton/merge_kernels.py; cp $F /tmp/merge_kernels.py
  sed -i 's/tl.where(a_empty, neg_zero, /tl.where(a_empty, -0.0, /; s/tl.where(b_empty, neg_zero, /tl.where(b_empty, -0.0, /' $F
  grep -c "\-0\.0, tl" $F
  PYTHONPATH=$PWD:$PWD/gpu_site timeout 100 python3 -m pytest $T tests/triton_kernels/test_merge.py tests/triton_kernels/test_plans.py -k "exact_noops or zero_values" > $C/tests-break.txt 2>&1
  echo "break rc=$?"; grep -E "passed|failed" $C/tests-break.txt | tail -2; grep "^FAILED" $C/tests-break.txt
  cp /tmp/merge_kernels.py $F
  s=$(date +%s)
  timeout 270 $INV check --backend kernels --backend kernels-heuristic --device cuda --no-progress --json $C/check-all-dtypes.json --markdown $C/check-all-dtypes.md > $C/check.txt 2>&1
  echo "check rc=$? wall $(( $(date +%s) - s )) s"; tail -3 $C/check.txt
  tar czf $OUT/fold.tgz -C $OUT fold
}

step_blockn() {
  C=$OUT/blockn; mkdir -p $C
  timeout 560 python3 benchmarks/probe_round8.py $C > $C/probe.txt 2>&1
  echo "probe rc=$?"; cat $C/probe.txt | cut -c1-200
  tar czf $OUT/blockn.tgz -C $OUT blockn
}

step_again() {
  C=$OUT/again; mkdir -p $C
  s=$(date +%s)
  timeout 200 $INV check --backend kernels --device cuda --no-progress --json $C/check-all-dtypes.json --markdown $C/check-all-dtypes.md > $C/check.txt 2>&1
  echo "check rc=$? wall $(( $(date +%s) - s )) s"; tail -3 $C/check.txt | cut -c1-200
  PYTHONPATH=$PWD:$PWD/gpu_site timeout 150 python3 -m pytest -q -p _invariance_pytestplugin -p no:cacheprovider tests/triton_kernels/test_merge.py tests/triton_kernels/test_plans.py > $C/tests.txt 2>&1
  echo "tests rc=$?"; grep -E "passed|failed|FAILED" $C/tests.txt | tail -5
  timeout 200 python3 benchmarks/probe_round8.py $C > $C/probe.txt 2>&1
  echo "probe rc=$?"; cut -c1-160 $C/probe.txt
  tar czf $OUT/again.tgz -C $OUT again
}

step_$STEP
