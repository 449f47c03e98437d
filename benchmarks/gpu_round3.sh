#!/bin/sh
# The round-3 H100 runs (reports/h100-round3/README.md), one step per device call (each under
# 10 minutes): sh benchmarks/gpu_round3.sh STEP, with $OUT the output folder.
#   a: tuning sweep bf16 (part 1) + a profile of the default kernels check (bf16)
#   c: tuning sweep part 2 (bf16 decode shapes; fp16 and fp32 neutrality)
#   d: the full default check of kernels (cold, then warm Triton cache), the control, the fuzz
#   e: invariance bench kernels vs FlashInfer; flashinfer-fixed-split; the fuzz check again
#   f: SDPA adapters at bf16 + fp16; flashinfer-fixed-split fp16 without cuda_graph
#   g: the cells f cut short; compute-sanitizer over the final kernels
# e, f and g need the FlashInfer wheels in .whl/ (DEVELOPERS notes: carry them to the GPU).
set -u
STEP=${1:?usage: sh benchmarks/gpu_round3.sh a|c|d|e|f|g}

step_a() {
  set -x
  export PYTHONPATH=$PWD
  mkdir -p $OUT/a
  nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/a/gpu.txt
  python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $OUT/a/gpu.txt
  timeout 330 python3 benchmarks/tile_sweep.py --out $OUT/a --dtypes bfloat16,float16 --quick > $OUT/a/sweep.log 2>&1
  echo sweep rc=$?
  timeout 200 python3 -m cProfile -o $OUT/a/check.prof -m invariance.cli check --backend kernels --device cuda --dtype bf16 --json $OUT/a/check-bf16.json > $OUT/a/check-bf16.txt 2>&1
  echo check rc=$?
  python3 -c "import pstats; p=pstats.Stats('$OUT/a/check.prof'); p.sort_stats('cumulative').print_stats(45); p.sort_stats('tottime').print_stats(30)" > $OUT/a/profile.txt 2>&1
  tail -5 $OUT/a/check-bf16.txt; tail -3 $OUT/a/sweep.log
}

step_c() {
  export PYTHONPATH=$PWD
  mkdir -p $OUT/c
  timeout 250 python3 benchmarks/tile_sweep.py --out $OUT/c/bf16 --dtypes bfloat16 --quick \
    --workloads decode-b1-ctx1k,decode-b1-ctx8k,decode-b1-ctx32k,decode-b64-ctx8k,decode-b256-ctx8k,decode-b64-ctx32k,decode-b8-ctx32k > $OUT/c/bf16.log 2>&1
  echo bf16 rc=$?
  timeout 170 python3 benchmarks/tile_sweep.py --out $OUT/c/fp16 --dtypes float16 --quick \
    --workloads mixed64,decode-prod64,decode-b8-ctx8k > $OUT/c/fp16.log 2>&1
  echo fp16 rc=$?
  timeout 150 python3 benchmarks/tile_sweep.py --out $OUT/c/fp32 --dtypes float32 --quick \
    --workloads mixed64,decode-b8-ctx8k > $OUT/c/fp32.log 2>&1
  echo fp32 rc=$?
}

step_d() {
  export PYTHONPATH=$PWD
  D=$OUT/d; mkdir -p $D
  INV="python3 -m invariance.cli"
  s=$(date +%s)
  timeout 280 $INV check --backend kernels --device cuda --no-progress --json $D/kernels-all-dtypes.json --markdown $D/kernels-all-dtypes.md --html $D/kernels-all-dtypes.html > $D/kernels-cold.txt 2>&1
  echo "cold rc=$? wall $(( $(date +%s) - s )) s"
  s=$(date +%s)
  timeout 150 $INV check --backend kernels --device cuda --no-progress --json $D/kernels-warm.json > $D/kernels-warm.txt 2>&1
  echo "warm rc=$? wall $(( $(date +%s) - s )) s"
  timeout 80 $INV check --backend kernels-heuristic --device cuda --dtype bf16 --no-progress --json $D/kernels-heuristic-bf16.json --markdown $D/kernels-heuristic-bf16.md > $D/heuristic.txt 2>&1
  echo "heuristic rc=$?"
  timeout 200 $INV check --backend benchmarks/tile_sweep.py:fuzz --device cuda --dtype bf16,fp16 --no-progress --json $D/tuning-fuzz.json --markdown $D/tuning-fuzz.md > $D/fuzz.txt 2>&1
  echo "fuzz rc=$?"
  for f in kernels-cold kernels-warm heuristic fuzz; do grep -h -E "PASSED|FAILED|error" $D/$f.txt | head -2; done
}

step_e() {
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
  export PYTHONPATH=$PWD:/tmp/site
  E=/tmp/e; mkdir -p $E
  INV="python3 -m invariance.cli"
  timeout -s INT -k 15 260 $INV bench --backend kernels --backend kernels-heuristic --baseline flashinfer --iters 30 --no-progress --markdown $E/bench-kernels-vs-flashinfer.md --json $E/bench-kernels-vs-flashinfer.json > $E/bench.txt 2>&1
  echo "bench rc=$?"
  timeout -s INT -k 15 110 $INV check --backend flashinfer-fixed-split --device cuda --dtype bf16,fp16 --no-progress --json $E/flashinfer-fixed-split.json --markdown $E/flashinfer-fixed-split.md > $E/fixed.txt 2>&1
  echo "fixed-split rc=$?"
  timeout -s INT -k 15 90 $INV check --backend benchmarks/tile_sweep.py:fuzz --device cuda --dtype bf16,fp16 --no-progress --json $E/tuning-fuzz.json --markdown $E/tuning-fuzz.md > $E/fuzz.txt 2>&1
  echo "fuzz rc=$?"
  grep -h -E "PASSED|FAILED|interrupted" $E/fixed.txt $E/fuzz.txt | head -4
  cat $E/bench.txt | tail -25
  tar czf $OUT/e.tgz -C /tmp e
}

step_f() {
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
  export PYTHONPATH=$PWD:/tmp/site
  F=/tmp/f; mkdir -p $F
  INV="python3 -m invariance.cli"
  for b in sdpa-flash sdpa-efficient sdpa-cudnn sdpa-math; do
    s=$(date +%s)
    timeout -s INT -k 15 115 $INV check --backend $b --device cuda --dtype bf16,fp16 --no-progress --json $F/$b.json --markdown $F/$b.md > $F/$b.txt 2>&1
    echo "$b rc=$? $(( $(date +%s) - s )) s: $(grep -m1 -E 'PASSED|FAILED|interrupted' $F/$b.txt)"
  done
  P=batch_size,position,order,neighbors,mixed,chunked_prefill,prefill_vs_decode,paging,padding,repeat,uninitialized,prefix_sharing,spec_verify
  timeout -s INT -k 15 70 $INV check --backend flashinfer-fixed-split --device cuda --dtype fp16 --perturb $P --no-progress --json $F/flashinfer-fixed-split-fp16.json --markdown $F/flashinfer-fixed-split-fp16.md > $F/fixed.txt 2>&1
  echo "fixed-split fp16 rc=$?: $(grep -m1 -E 'PASSED|FAILED|interrupted' $F/fixed.txt)"
  tar czf $OUT/f.tgz -C /tmp f
}

step_g() {
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
  export PYTHONPATH=$PWD:/tmp/site
  G=/tmp/g; mkdir -p $G
  INV="python3 -m invariance.cli"
  timeout -s INT -k 15 150 $INV check --backend sdpa-cudnn --device cuda --dtype fp16 --perturb neighbors,mixed,chunked_prefill,prefill_vs_decode,paging,padding,repeat,uninitialized,prefix_sharing,spec_verify,cuda_graph --no-progress --json $G/sdpa-cudnn-fp16-rest.json --markdown $G/sdpa-cudnn-fp16-rest.md > $G/cudnn.txt 2>&1
  echo "cudnn rc=$?: $(grep -m1 -E 'PASSED|FAILED|interrupted' $G/cudnn.txt)"
  timeout -s INT -k 15 60 $INV check --backend sdpa-math --device cuda --dtype fp16 --perturb spec_verify,cuda_graph --no-progress --json $G/sdpa-math-fp16-rest.json --markdown $G/sdpa-math-fp16-rest.md > $G/math.txt 2>&1
  echo "math rc=$?: $(grep -m1 -E 'PASSED|FAILED|interrupted' $G/math.txt)"
  P=batch_size,position,order,neighbors,mixed,chunked_prefill,prefill_vs_decode,paging,padding,repeat,uninitialized,prefix_sharing,spec_verify
  timeout -s INT -k 15 150 $INV check --backend flashinfer-fixed-split --device cuda --dtype fp16 --perturb $P --no-progress --json $G/flashinfer-fixed-split-fp16.json --markdown $G/flashinfer-fixed-split-fp16.md > $G/fixed.txt 2>&1
  echo "fixed-split fp16 rc=$?: $(grep -m1 -E 'PASSED|FAILED|interrupted' $G/fixed.txt)"
  tar czf $OUT/g.tgz -C /tmp g
  mkdir -p /tmp/bin && printf '#!/bin/sh\nexec python3 "$@"\n' > /tmp/bin/python && chmod +x /tmp/bin/python
  PATH=/tmp/bin:$PATH TRITON_CACHE_DIR=/tmp/tc PYTHONPATH=$PWD timeout 170 bash benchmarks/gpu_sanitize.sh $G/sanitizer > /dev/null 2>&1
  echo "sanitizer rc=$?"; cat $G/sanitizer/summary.txt 2>/dev/null
  tar czf $OUT/g.tgz -C /tmp g
}

"step_$STEP"
