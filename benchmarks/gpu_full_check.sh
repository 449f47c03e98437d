# Sourced by the per-round GPU scripts (gpu_round10.sh to gpu_round15.sh): with $INV the
# invariance command and $C the output folder, full_check_and_control [CHECK_S [CONTROL_S]] runs
# the full default check of the kernels at three dtypes, then the batch-dependent control at
# bf16 (it must fail), with those timeouts (260 and 120 s by default);
# sanitize runs compute-sanitizer memcheck (valid and malformed inputs) and initcheck (valid
# ones) at bf16 over benchmarks/gpu_sanitize.py; gluon_tests, bench, counted_check,
# final_checks and pack are rounds 13-14's steps (gluon_tests needs gpu_site/ carried, bench
# the FlashInfer wheels in .whl/).
full_check_and_control() {
  s=$(date +%s)
  timeout ${1:-260} $INV check --backend kernels --device cuda --no-progress --json $C/kernels-all-dtypes.json --markdown $C/kernels-all-dtypes.md > $C/check.txt 2>&1
  echo "check rc=$? wall $(( $(date +%s) - s )) s"; grep -h -E "PASSED|FAILED" $C/check.txt | tail -1
  s=$(date +%s)
  timeout ${2:-120} $INV check --backend kernels-heuristic --device cuda --dtype bf16 --no-progress --json $C/control-bf16.json --markdown $C/control-bf16.md > $C/control.txt 2>&1
  echo "control rc=$? wall $(( $(date +%s) - s )) s"; grep -h -E "PASSED|FAILED" $C/control.txt | tail -1
}

sanitize() {
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 150 compute-sanitizer --tool memcheck --target-processes all --report-api-errors no --error-exitcode 99 python3 benchmarks/gpu_sanitize.py --dtypes bfloat16 > $C/memcheck-bf16.txt 2>&1
  echo "memcheck rc=$?"; tail -3 $C/memcheck-bf16.txt
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 100 compute-sanitizer --tool initcheck --target-processes all --report-api-errors no --error-exitcode 99 python3 benchmarks/gpu_sanitize.py --dtypes bfloat16 --valid-only > $C/initcheck-bf16.txt 2>&1
  echo "initcheck rc=$?"; tail -3 $C/initcheck-bf16.txt
}

gluon_tests() {
  INVARIANCE_DTYPE=float16,bfloat16 PYTHONPATH=$PWD:$PWD/gpu_site timeout ${1:-300} python3 -m pytest -q -p _invariance_pytestplugin -p no:cacheprovider -rfE -x tests/triton_kernels/test_gluon.py > $C/tests-gluon.txt 2>&1
  echo "gluon tests rc=$?"; grep -E "passed|failed|FAILED|Error|^[.sFE]+ " $C/tests-gluon.txt | tail -8
}

# The GPU, driver, torch and Triton into $C/gpu.txt (rounds 20-21).
step_info() {
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $C/gpu.txt
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> $C/gpu.txt
  cat $C/gpu.txt
}

# The full check at three dtypes with the Gluon launches counted, then the control, into $C.
counted_check_and_control() {
  s=$(date +%s)
  timeout 300 python3 benchmarks/count_gluon.py check --backend kernels --device cuda --no-progress --json $C/kernels-all-dtypes.json --markdown $C/kernels-all-dtypes.md > $C/check.txt 2>&1
  echo "check rc=$? wall $(( $(date +%s) - s )) s"; grep -h -E "PASSED|FAILED|launches" $C/check.txt | tail -2
  s=$(date +%s)
  timeout 100 $INV check --backend kernels-heuristic --device cuda --dtype bf16 --no-progress --json $C/control-bf16.json --markdown $C/control-bf16.md > $C/control.txt 2>&1
  echo "control rc=$? wall $(( $(date +%s) - s )) s"; grep -h -E "PASSED|FAILED" $C/control.txt | tail -1
}

# counted_check_and_control, then memcheck and initcheck (rounds 20-21's final step).
counted_final() {
  counted_check_and_control
  sanitize
}

# FlashInfer's carried wheels (.whl/) into /tmp/site, for PYTHONPATH=$PWD:/tmp/site.
flashinfer_site() {
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
}

bench() {
  flashinfer_site
  PYTHONPATH=$PWD:/tmp/site timeout -s INT -k 15 420 $INV bench --backend kernels --backend kernels:gluon=false --backend kernels-heuristic --backend flashinfer:use_tensor_cores=true --backend flashinfer-fa3 --baseline flashinfer --iters 30 --no-progress --markdown $C/bench-kernels-vs-flashinfer.md --json $C/bench-kernels-vs-flashinfer.json > $C/bench.txt 2>&1
  echo "bench rc=$?"
  tail -5 $C/bench.txt
  head -30 $C/bench-kernels-vs-flashinfer.md
}

# The default check of backend $1 at dtypes $2 with the Gluon launches counted, into $C.
counted_check() {
  timeout ${3:-100} python3 benchmarks/count_gluon.py check --backend $1 --device cuda --dtype $2 --no-progress --markdown $C/check-$1.md --json $C/check-$1.json > $C/check-$1.txt 2>&1
  echo "check $1 rc=$?"; grep -h -E "PASSED|FAILED|Gluon" $C/check-$1.txt | tail -2
}

# The final validation into $C: the Gluon tests (their timeout $1), the full check and the
# control, kernels-fused at three dtypes counted.
final_checks() {
  gluon_tests $1
  full_check_and_control
  counted_check kernels-fused fp16,bf16,fp32 150
}

# $C packed into $OUT/NAME.tgz (a device call brings back only a few files).
pack() {
  tar czf $OUT/$(basename $C).tgz -C $OUT $(basename $C) && rm -rf $C
}

# Rounds 14-15's shared steps and dispatch: step_san (the Gluon tests, then the sanitizers),
# step_bench, and run_step SCRIPT STEPS, which runs step_$STEP into $C=$OUT/$STEP and packs it,
# or names the valid steps (STEPS, separated by |) and exits 2 for any other.
step_san() {
  gluon_tests 240
  sanitize
}

step_bench() {
  bench
}

run_step() {
  case "|$2|" in
    *"|$STEP|"*) ;;
    *) echo "$1: unknown step '$STEP' ($2)" >&2; exit 2 ;;
  esac
  C=$OUT/$STEP; mkdir -p $C
  step_$STEP
  pack
}
