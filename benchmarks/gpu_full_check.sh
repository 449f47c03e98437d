# Sourced by the per-round GPU scripts (gpu_round10.sh, gpu_round11.sh, gpu_round12.sh): with
# $INV the invariance command and $C the output folder, full_check_and_control runs the full
# default check of the kernels at three dtypes, then the batch-dependent control at bf16 (it must fail).
full_check_and_control() {
  s=$(date +%s)
  timeout 260 $INV check --backend kernels --device cuda --no-progress --json $C/kernels-all-dtypes.json --markdown $C/kernels-all-dtypes.md > $C/check.txt 2>&1
  echo "check rc=$? wall $(( $(date +%s) - s )) s"; grep -h -E "PASSED|FAILED" $C/check.txt | tail -1
  s=$(date +%s)
  timeout 120 $INV check --backend kernels-heuristic --device cuda --dtype bf16 --no-progress --json $C/control-bf16.json --markdown $C/control-bf16.md > $C/control.txt 2>&1
  echo "control rc=$? wall $(( $(date +%s) - s )) s"; grep -h -E "PASSED|FAILED" $C/control.txt | tail -1
}
