# Sourced after gpu_full_check.sh by the round-21 and round-22 GPU scripts: their shared steps
# (tests, final, check, bench, san; with $INV the invariance command, $C the output folder,
# gpu_site/ carried for the tests and .whl/ for the bench), overriding rounds 14-15's step_bench
# and step_san.
#   tests: the Gluon tests (test_gluon.py, fp16 and bf16) with their durations
#   final: the full check at three dtypes with the launches counted (benchmarks/count_gluon.py),
#          the control, memcheck and initcheck (benchmarks/gpu_sanitize.py), then the GPU
#          kernel tests (test_gpu.py)
#   bench: the bench (kernels, the 64-key contract, the control, FlashInfer's variants)
#   check: the full check counted, the control, then the GPU kernel tests (test_gpu.py): the
#          final step without the sanitizers
#   san: memcheck alone with a longer timeout ($SAN_S, 500 s by default; final's 150 s ran out)
#   ktests (rounds 24-26): the keys-as-rows Gluon tests (test_gluon.py -k "keys_rows or
#          value_blocks or auto_takes", or $KT_K), bf16 first, then fp16 (or the dtypes in
#          $KT_DTYPES), verbose, $KT_S seconds each
# and probe_parts SCRIPT PARTS: the GPU, then each part (space-separated) of benchmarks/SCRIPT
# into $C/PART.txt (260 s each), with its last lines; san_run (a sanitizer over
# benchmarks/gpu_sanitize.py at one dtype) and ncu_tile (Nsight Compute on the keys-as-rows
# tile), described where they are defined.

probe_parts() {
  step_info
  for part in $2; do
    s=$(date +%s)
    timeout -s INT -k 15 260 python3 benchmarks/$1 $C $part > $C/$part.txt 2>&1
    echo "$part rc=$? wall $(( $(date +%s) - s )) s"; tail -2 $C/$part.txt | cut -c1-600
  done
}

step_tests() {
  step_info
  s=$(date +%s)
  INVARIANCE_DTYPE=float16,bfloat16 PYTHONPATH=$PWD:$PWD/gpu_site timeout -s INT -k 20 540 python3 -m pytest -v -p _invariance_pytestplugin -p no:cacheprovider -rfE --durations=15 tests/triton_kernels/test_gluon.py > $C/tests-gluon.txt 2>&1
  echo "gluon tests rc=$? wall $(( $(date +%s) - s )) s"; grep -E "passed|failed|FAILED|Error" $C/tests-gluon.txt | tail -12 | cut -c1-300
}

gpu_tests() {
  s=$(date +%s)
  PYTHONPATH=$PWD:$PWD/gpu_site timeout 150 python3 -m pytest -q -p _invariance_pytestplugin -p no:cacheprovider -rfE tests/triton_kernels/test_gpu.py > $C/tests-gpu.txt 2>&1
  echo "gpu tests rc=$? wall $(( $(date +%s) - s )) s"; tail -3 $C/tests-gpu.txt
}

step_final() {
  step_info
  counted_final
  gpu_tests
}

step_bench() {
  step_info
  flashinfer_site
  PYTHONPATH=$PWD:/tmp/site timeout -s INT -k 15 540 $INV bench --backend kernels --backend kernels:block_n=64 --backend kernels-heuristic --backend flashinfer:use_tensor_cores=true --backend flashinfer-fa3 --baseline flashinfer --iters 30 --no-progress --markdown $C/bench-kernels-vs-flashinfer.md --json $C/bench-kernels-vs-flashinfer.json > $C/bench.txt 2>&1
  echo "bench rc=$?"; tail -3 $C/bench.txt; head -30 $C/bench-kernels-vs-flashinfer.md
}

step_check() {
  step_info
  counted_check_and_control
  gpu_tests
}

step_san() {
  step_info
  san_run memcheck bf16 bfloat16
}

# san_run TOOL SHORT DTYPE [ARGS...]: compute-sanitizer's TOOL over benchmarks/gpu_sanitize.py
# at DTYPE (then ARGS) into $C/TOOL-SHORT.txt, $SAN_S seconds (500 by default), with its rc,
# wall time, the count of cases run and the last lines.
san_run() {
  tool=$1; f=$C/$1-$2.txt; dt=$3; shift 3
  s=$(date +%s)
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout ${SAN_S:-500} compute-sanitizer --tool $tool --target-processes all --report-api-errors no --error-exitcode 99 python3 benchmarks/gpu_sanitize.py --dtypes $dt "$@" > $f 2>&1
  echo "$tool $dt rc=$? wall $(( $(date +%s) - s )) s"; grep -c "^\[ok\]" $f; tail -3 $f
}

# ncu_tile: Nsight Compute on the keys-as-rows kernel at batch 1 with 1k tokens (auto), one
# launch after two, with $NCU_ARGS added (round 26: "--warp-sampling-interval 0 --section
# MemoryWorkloadAnalysis") and $NCU_S seconds (150): its sections, the SASS source page and its
# stall summary (benchmarks/ncu_stalls.py --order) into $C.
ncu_tile() {
  timeout ${NCU_S:-150} ncu --clock-control none ${NCU_ARGS:-} -k regex:_split_kt_kernel --launch-skip 2 --launch-count 1 --import-source no --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section LaunchStats --section Occupancy --section SourceCounters -o $C/b1-ctx1k python3 benchmarks/profile_round12.py decode-b1-ctx1k > $C/ncu-run.txt 2>&1
  echo "ncu rc=$?"
  ncu -i $C/b1-ctx1k.ncu-rep > $C/ncu-b1-ctx1k.txt 2>&1
  ncu -i $C/b1-ctx1k.ncu-rep --page source --csv --print-source sass > $C/ncu-b1-ctx1k-sass.csv 2>&1
  python3 benchmarks/ncu_stalls.py $C/ncu-b1-ctx1k-sass.csv --order > $C/stalls.md 2>&1
  gzip -f $C/ncu-b1-ctx1k-sass.csv
  grep -E "Duration|Elapsed Cycles|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|Memory Throughput|L2 Hit" $C/ncu-b1-ctx1k.txt | head -14
  head -40 $C/stalls.md
}

step_ktests() {
  step_info
  for dt in ${KT_DTYPES:-bfloat16 float16}; do
    s=$(date +%s)
    INVARIANCE_DTYPE=$dt PYTHONPATH=$PWD:$PWD/gpu_site timeout -s INT -k 20 ${KT_S:-280} python3 -m pytest -v -p _invariance_pytestplugin -p no:cacheprovider -rfE -k "${KT_K:-keys_rows or value_blocks or auto_takes}" tests/triton_kernels/test_gluon.py > $C/ktests-$dt.txt 2>&1
    echo "$dt rc=$? wall $(( $(date +%s) - s )) s"; grep -E "passed|failed|FAILED|Error" $C/ktests-$dt.txt | tail -6 | cut -c1-300
  done
}
