#!/bin/sh
# The round-8 H100 runs (reports/h100-round8/README.md), one step per device call (each under
# 10 minutes): sh benchmarks/gpu_round8.sh STEP, with $OUT the output folder and gpu_site/
# (pytest and its pure-Python dependencies, git-ignored, copied from the local .venv) carried.
#   fold: benchmarks/fold_signs.py; the kernel test suite without test_fuzz.py (hypothesis's
#         compiled module does not carry to the GPU machine's Python 3.12); the two -0.0 tests
#         again with state_fold's literal -0.0 put back (a deliberate break, on a copy of the
#         file, restored after); the control's full check at three dtypes (call 1 ran one
#         check naming kernels and the control, and check ran only the last; the CLI now
#         refuses that, so the step names the control alone: `again` checks the kernels)
#   blockn: benchmarks/probe_round8.py (BLOCK_N 128 with the bit-neutral settings swept)
#   again: (call 2) the full default check of the kernels at three dtypes (call 1 named two
#          backends, and check runs the last: it checked only the control), the two changed
#          test files, then the probe until the call's time runs out
#   vb: (call 4) V column blocks in the split plan: benchmarks/probe_round8.py vblocks (bits of
#       2 and 4 blocks vs 1 at fp16/bf16, times at bf16), then the full default check of the
#       kernels at three dtypes with the shape rule in play, then the tuning fuzz (fp16, bf16),
#       which draws the blocks per batch (it ran past its 190 s after 20 of 28 cells)
# Call 3 ran inline the rest of the kernel test suite: PYTHONPATH=$PWD:$PWD/gpu_site python3 -m
# pytest -q -p _invariance_pytestplugin -p no:cacheprovider -rfE
# tests/triton_kernels/test_plans.py::test_k_rows_and_k_columns_give_the_same_bits
# tests/triton_kernels/test_plans.py::test_caches_with_other_layouts_give_the_same_bits
# tests/triton_kernels/test_plans.py::test_long_prompts_get_tall_tiles_and_overrides_keep_their_own_warps
# tests/triton_kernels/test_validation.py tests/triton_kernels/test_invariance.py
# The blockn step never ran as such: call 2 (again) ran the same probe.
# Call 5 ran inline the 8 remaining fp16 fuzz cells (invariance check --backend
# benchmarks/tile_sweep.py:fuzz --device cuda --dtype fp16 --perturb prefill_vs_decode --perturb
# paging --perturb padding --perturb repeat --perturb uninitialized --perturb prefix_sharing
# --perturb spec_verify --perturb cuda_graph); call 6 ran memcheck alone, bf16 only:
# PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck --target-processes all
# --report-api-errors no --error-exitcode 99 python3 benchmarks/gpu_sanitize.py --dtypes bfloat16
# (after one run without the sanitizer, to compile).
set -u
STEP=${1:?usage: sh benchmarks/gpu_round8.sh fold|blockn|again|vb}
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
  timeout 270 $INV check --backend kernels-heuristic --device cuda --no-progress --json $C/check-all-dtypes.json --markdown $C/check-all-dtypes.md > $C/check.txt 2>&1
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

step_vb() {
  C=$OUT/vb; mkdir -p $C
  timeout 150 python3 benchmarks/probe_round8.py $C vblocks > $C/probe.txt 2>&1
  echo "probe rc=$?"; cut -c1-150 $C/probe.txt
  s=$(date +%s)
  timeout 170 $INV check --backend kernels --device cuda --no-progress --json $C/kernels-all-dtypes.json --markdown $C/kernels-all-dtypes.md > $C/check.txt 2>&1
  echo "check rc=$? wall $(( $(date +%s) - s )) s"; grep -h -E "PASSED|FAILED" $C/check.txt | tail -1
  s=$(date +%s)
  timeout 190 $INV check --backend benchmarks/tile_sweep.py:fuzz --device cuda --dtype bf16,fp16 --no-progress --json $C/tuning-fuzz.json --markdown $C/tuning-fuzz.md > $C/fuzz.txt 2>&1
  echo "fuzz rc=$? wall $(( $(date +%s) - s )) s"; grep -h -E "PASSED|FAILED" $C/fuzz.txt | tail -1
  tar czf $OUT/vb.tgz -C $OUT vb
}

step_$STEP
