#!/bin/sh
# The round-18 H100 runs (reports/h100-round18/README.md), one step per device call (each under
# 10 minutes): sh benchmarks/gpu_round18.sh STEP, with $OUT the output folder (.whl/, the
# FlashInfer wheels, carried for the bench; gpu_site/ for the tests). Each step packs its folder
# into $OUT/STEP.tgz. The probe and overlap steps need the switches of the experiment commits
# (call 1: 1324497; call 3: 9e63351 and later, to b5f528d); ab and power run on any tree.
#   probe: the Gluon kernel's GPU tests (fp16, bf16), then benchmarks/probe_round18.py (the
#          consumer loop's scheduling switches against the default: bits and times; call 1,
#          its CALL1 switch sets)
#   overlap: benchmarks/probe_round18.py alone (call 3: its CALL3 switch sets)
#   power: benchmarks/peer_ab.py --sustain 3: kernels and FlashInfer's FA3 and FA2 on prefill,
#          each also replayed back to back for 3 s, with the SM clock and power meanwhile
#   power2 (call 6): the same with --sustain 4 --sustain-passes 3 (three 4 s windows per
#          backend, rotated; power.draw.instant, the first second of each left out)
#   smoke (call 7): peer_ab.py after the second review (kernels against the control on one
#          decode batch, two 2 s windows each): nvidia-smi's GPU selection and settled timing
#   last (call 8, the final tree): the full check at three dtypes and the control, then the
#          bench (kernels, kernels:gluon=false, the control, FlashInfer's variants)
#   check (call 5, the final tree): the Gluon tests, the full check at three dtypes and the
#          control
#   final: the Gluon tests, the full check at three dtypes and the control, kernels-fused
#          counted, then the bench (kernels, kernels:gluon=false, the control, FlashInfer's
#          variants)
#   san: the Gluon tests, then compute-sanitizer memcheck and initcheck
#   ab: benchmarks/peer_ab.py (interleaved rounds): kernels against FlashInfer's FA3 and FA2 on
#       prefill-varlen, mixed64 and eight 4k prompts, and kernels against the control on
#       batch-1 decode
set -u
STEP=${1:?usage: sh benchmarks/gpu_round18.sh probe|overlap|power|power2|smoke|last|check|final|san|ab}
INV="python3 -m invariance.cli"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1

. benchmarks/gpu_full_check.sh

step_probe() {
  gluon_tests 200
  step_overlap
}

step_overlap() {
  s=$(date +%s)
  timeout -s INT -k 15 420 python3 benchmarks/probe_round18.py $C > $C/probe.txt 2>&1
  echo "probe rc=$? wall $(( $(date +%s) - s )) s"; tail -3 $C/probe.txt | cut -c1-600
  cp $C/schedules.jsonl $OUT/ 2>/dev/null
}

# peer_ab.py with sustained windows ($@: its --sustain options) on the three prefill-like
# workloads, into $C/power.
power_run() {
  flashinfer_site
  s=$(date +%s)
  PYTHONPATH=$PWD:/tmp/site timeout -s INT -k 15 500 python3 benchmarks/peer_ab.py $C/power --rounds 5 "$@" --workload prefill-varlen --workload prefill:4kx8 --workload mixed64 > $C/power.txt 2>&1
  echo "power rc=$? wall $(( $(date +%s) - s )) s"; grep -v Warn $C/power.txt | cut -c1-300 | tail -30
}

step_power2() {
  power_run --sustain 4 --sustain-passes 3
}

step_smoke() {
  s=$(date +%s)
  timeout -s INT -k 15 200 python3 benchmarks/peer_ab.py $C/smoke --rounds 3 --backend kernels --backend kernels-heuristic --workload decode-b8-ctx8k --sustain 2 --sustain-passes 2 > $C/smoke.txt 2>&1
  echo "smoke rc=$? wall $(( $(date +%s) - s )) s"; cut -c1-300 $C/smoke.txt | tail -8; head -2 $C/smoke/smi.csv
}

step_last() {
  full_check_and_control
  bench
}

step_check() {
  gluon_tests 200
  full_check_and_control
}

step_final() {
  final_checks 200
  bench
}

step_ab() {
  flashinfer_site
  s=$(date +%s)
  PYTHONPATH=$PWD:/tmp/site timeout -s INT -k 15 330 python3 benchmarks/peer_ab.py $C/peers --workload prefill-varlen --workload mixed64 --workload prefill:4kx8 > $C/peers.txt 2>&1
  echo "peers rc=$? wall $(( $(date +%s) - s )) s"; cut -c1-400 $C/peers.txt | grep -v Warn | tail -8
  s=$(date +%s)
  timeout -s INT -k 15 120 python3 benchmarks/peer_ab.py $C/control --backend kernels --backend kernels-heuristic --workload decode-b1-ctx1k --workload decode-b1-ctx8k --workload decode-b8-ctx8k > $C/control.txt 2>&1
  echo "control rc=$? wall $(( $(date +%s) - s )) s"; cut -c1-400 $C/control.txt | tail -4
}

step_power() {
  power_run --sustain 3
}

run_step gpu_round18.sh "probe|overlap|power|power2|smoke|last|check|final|san|ab"
