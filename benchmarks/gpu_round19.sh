#!/bin/sh
# The round-19 H100 runs (reports/h100-round19/README.md), one step per device call (each under
# 10 minutes): sh benchmarks/gpu_round19.sh STEP, with $OUT the output folder and .whl/ (the
# FlashInfer wheels) carried for ncu. Each step packs its folder into $OUT/STEP.tgz. ncu and rate
# run on any tree; pp, fold, bn128, bn128g, decode128, serial, joint, gdecode and gsplit need the switches of the experiment
# commits (all of them at 37d9540; benchmarks/probe_round19.py names them).
#   ncu: Nsight Compute on the prefill kernel of `kernels` (the Gluon tile) and of FlashInfer's
#        FA3 on the same batches (prefill-varlen, eight 4k prompts), clocks locked to base
#        (ncu's default), the same sections for both: where the cycles go on each side
#   pp: benchmarks/probe_round19.py at the experiment commit (kernels._gluon.PINGPONG): bits and
#       interleaved times of the consumers taking turns on named barriers, then ncu on it
#   fold: benchmarks/probe_round19.py fold at the experiment commit (FOLDLESS, Q_REGS): the
#         tile without the split fold's state, and with q in registers, at one split per row
#   bn128: benchmarks/probe_round19.py bn128 at the experiment commit: a 128-key Gluon tile
#          (no fold state, p kept as the 16-bit operand) against the 64-key one, one split
#   bn128g: benchmarks/probe_round19.py bn128g: the 128-key tile at the 1024-token split, its fold
#           acc in registers or in a global workspace, against the 64-key default
#   decode128: benchmarks/probe_round19.py decode128: a decode step at 128 keys (Triton) against
#              the 128-key Gluon prefill of the same token (bits), and its times
#   serial: benchmarks/probe_round19.py serial: each step's p @ v waited before the next scores
#           (SERIAL), the 128-key tile's fold state in registers with little spill
#   joint: benchmarks/probe_round19.py joint twice (INVARIANCE_R19_JOINT=0, then 1): decode with
#          two 64-key tiles per step, as two softmax steps or as one 128-key step
#   gdecode: benchmarks/probe_round19.py gdecode: the Gluon tile (64 and 128 keys) on large-batch
#            decode through the fused plan, against the kept decode
#   gsplit: benchmarks/probe_round19.py gsplit: the split plan on the Gluon tile (64 and 128 keys)
#           with the package's merge, on small-batch decode, against the kept decode
#   rate: benchmarks/wgmma_rate.py: one tile step's wgmma group alone (scores at 64 and 128
#         keys, q from shared memory or registers; p @ v), cycles per group
set -u
STEP=${1:?usage: sh benchmarks/gpu_round19.sh ncu|pp|fold|bn128|bn128g|decode128|serial|joint|gdecode|gsplit|rate}
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1

. benchmarks/gpu_full_check.sh

SECTIONS="--section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis --section InstructionStats --section SourceCounters"
METRICS="sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,smsp__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum,sm__cycles_elapsed.max,smsp__inst_executed_pipe_xu.sum,smsp__inst_executed_pipe_fma.sum,smsp__inst_executed_pipe_alu.sum,smsp__inst_executed_pipe_uniform.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,smsp__inst_executed_op_shared_ld.sum,smsp__inst_executed_op_shared_st.sum,sm__sass_inst_executed_op_shared_ld.sum,lts__t_bytes.sum,dram__bytes_read.sum"

# ncu with $SECTIONS and $METRICS, timeout $2 s, the kernels matching $3, $4 launches, on the
# command after them, into $C/ncu-$1.{ncu-rep,txt} and its SASS source page
# $C/ncu-source-$1.csv.gz; prints the headline figures.
ncu_to() {
  name=$1 limit=$2 kernels=$3 count=$4; shift 4
  s=$(date +%s)
  timeout $limit ncu $SECTIONS --metrics $METRICS --import-source no -k "$kernels" --launch-count $count -o $C/ncu-$name "$@" > $C/ncu-run-$name.txt 2>&1
  echo "ncu $name rc=$? wall $(( $(date +%s) - s )) s"
  ncu -i $C/ncu-$name.ncu-rep > $C/ncu-$name.txt 2>&1
  ncu -i $C/ncu-$name.ncu-rep --page source --csv --print-source sass 2>/dev/null | gzip > $C/ncu-source-$name.csv.gz
  grep -E "^  [A-Za-z_].*\(|Duration|Elapsed Cycles|SM Frequency|hmma|pipe_xu|pipe_fma|Issue Slots Busy|No Eligible|Registers Per|Block Size|Grid Size|Dynamic Shared|Achieved Occupancy|Warp Cycles Per Issued|inst_executed.sum" $C/ncu-$name.txt | head -40
}

# ncu on backend $1, workload $2: the kernels whose name matches "prefill" (any case) of the
# eager call and the first replay.
profile() {
  ncu_to $1-$2 240 'regex:(?i)prefill' 2 env PYTHONPATH=$PWD:/tmp/site python3 benchmarks/profile_peer.py $1 $2
}

step_ncu() {
  step_info > $C/gpu.txt 2>&1
  flashinfer_site
  s=$(date +%s)
  # FlashInfer compiles its kernels on first use (nvcc), outside the profile.
  PYTHONPATH=$PWD:/tmp/site timeout 300 python3 benchmarks/profile_peer.py flashinfer-fa3 prefill-varlen > $C/warm.txt 2>&1
  echo "warm rc=$? wall $(( $(date +%s) - s )) s"; tail -2 $C/warm.txt
  for w in prefill-varlen prefill:4kx8; do
    profile kernels $w
    profile flashinfer-fa3 $w
  done
}

step_pp() {
  step_info > $C/gpu.txt 2>&1
  s=$(date +%s)
  timeout -s INT -k 15 360 python3 benchmarks/probe_round19.py $C probe > $C/probe.txt 2>&1
  echo "probe rc=$? wall $(( $(date +%s) - s )) s"
  python3 -c "
import json
for l in open('$C/pingpong.jsonl'):
    r = json.loads(l); print(r['workload'], r['dtype'], r['bits_differing'], r.get('pingpong/default'))"
  ncu_to pingpong-prefill-varlen 200 regex:_fused_prefill_kernel 1 python3 benchmarks/probe_round19.py $C target prefill-varlen
}

# benchmarks/probe_round19.py MODE (experiment commits only) into $C/MODE.txt, with a timeout
# of $2 s; the last $4 lines of its output, cut at $3 characters.
probe_step() {
  step_info > $C/gpu.txt 2>&1
  s=$(date +%s)
  timeout -s INT -k 15 $2 python3 benchmarks/probe_round19.py $C $1 > $C/$1.txt 2>&1
  echo "$1 rc=$? wall $(( $(date +%s) - s )) s"; cut -c1-$3 $C/$1.txt | grep -v Warn | tail -$4
}

step_fold() { probe_step fold 400 700 8; }
step_bn128() { probe_step bn128 400 1500 6; }
step_bn128g() { probe_step bn128g 400 2500 6; }
step_decode128() { probe_step decode128 500 1200 12; }
step_serial() { probe_step serial 400 2500 6; }
step_gdecode() { probe_step gdecode 400 1500 6; }
step_gsplit() { probe_step gsplit 480 1500 9; }
step_joint() {
  for f in 0 1; do
    step_info > $C/gpu.txt 2>&1
    s=$(date +%s)
    INVARIANCE_R19_JOINT=$f timeout -s INT -k 15 280 python3 benchmarks/probe_round19.py $C joint > $C/joint-$f.txt 2>&1
    echo "joint $f rc=$? wall $(( $(date +%s) - s )) s"; cut -c1-900 $C/joint-$f.txt | grep -v Warn | tail -10
  done
}

step_rate() {
  step_info > $C/gpu.txt 2>&1
  s=$(date +%s)
  timeout 300 python3 benchmarks/wgmma_rate.py --json $C/rate.jsonl > $C/rate.txt 2>&1
  echo "rate rc=$? wall $(( $(date +%s) - s )) s"; cut -c1-400 $C/rate.txt | tail -12
}

step_info() {
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv
  python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"
}

run_step gpu_round19.sh "ncu|pp|fold|bn128|bn128g|decode128|serial|joint|gdecode|gsplit|rate"
