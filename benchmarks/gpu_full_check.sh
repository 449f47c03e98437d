# Sourced by the per-round GPU scripts (gpu_round10.sh to gpu_round13.sh): with $INV the
# invariance command and $C the output folder, full_check_and_control runs the full default
# check of the kernels at three dtypes, then the batch-dependent control at bf16 (it must fail);
# sanitize runs compute-sanitizer memcheck (valid and malformed inputs) and initcheck (valid
# ones) at bf16 over benchmarks/gpu_sanitize.py.
full_check_and_control() {
  s=$(date +%s)
  timeout 260 $INV check --backend kernels --device cuda --no-progress --json $C/kernels-all-dtypes.json --markdown $C/kernels-all-dtypes.md > $C/check.txt 2>&1
  echo "check rc=$? wall $(( $(date +%s) - s )) s"; grep -h -E "PASSED|FAILED" $C/check.txt | tail -1
  s=$(date +%s)
  timeout 120 $INV check --backend kernels-heuristic --device cuda --dtype bf16 --no-progress --json $C/control-bf16.json --markdown $C/control-bf16.md > $C/control.txt 2>&1
  echo "control rc=$? wall $(( $(date +%s) - s )) s"; grep -h -E "PASSED|FAILED" $C/control.txt | tail -1
}

sanitize() {
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 150 compute-sanitizer --tool memcheck --target-processes all --report-api-errors no --error-exitcode 99 python3 benchmarks/gpu_sanitize.py --dtypes bfloat16 > $C/memcheck-bf16.txt 2>&1
  echo "memcheck rc=$?"; tail -3 $C/memcheck-bf16.txt
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 100 compute-sanitizer --tool initcheck --target-processes all --report-api-errors no --error-exitcode 99 python3 benchmarks/gpu_sanitize.py --dtypes bfloat16 --valid-only > $C/initcheck-bf16.txt 2>&1
  echo "initcheck rc=$?"; tail -3 $C/initcheck-bf16.txt
}
