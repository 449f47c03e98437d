#!/bin/sh
# Regenerate the evidence set of this GPU (reports/<gpu>/, indexed by reports/<gpu>/README.md),
# one named step at a time (each fits a 10-minute device call):
#
#   sh benchmarks/evidence.sh STEP [STEP ...]      (OUT=dir, default ./evidence-out)
#
# Steps (each writes $OUT/STEP/ and packs it into $OUT/STEP.tgz; every command it runs is
# recorded in $OUT/STEP/commands.txt, the machine in $OUT/STEP/gpu.txt):
#   check     the full check of `kernels` at fp16, bf16 and fp32 with the Gluon launches
#             counted (heads 32:8:128), the same at head dims 64 (64:8:64) and 256 (16:8:256),
#             the batch-dependent control at bf16 and at 16:8:256 (each must fail), the GPU
#             kernel tests; the measured table in force (kernels/tuned/<gpu>.json)
#   tune      `invariance tune` over the default and shapes grids into $OUT/tune/<gpu>.json
#             (--resume: run it again to search the buckets a first run had no time for;
#             TUNE_AGAIN="bf16/d64/ ...": bucket prefixes to search again after a kernel change)
#   tune-features  `invariance tune --resume` on the table of the tune step (or the shipped one)
#             with each model-like feature set of features-bench: buckets of their own
#   features  the kernels' feature tests, the full check with each feature at fp16 and bf16
#             (window + sinks at the gpt-oss-like heads 64:8:64, soft-cap + window at
#             16:8:256, an FP8 cache at 32:8:128) and the control with a window (at 32:8:128
#             and with sinks at 64:8:64)
#   contract  the bit-defining tile chosen by measurement: `invariance tune` at head dims 64
#             (64:8:64) and 256 (16:8:256), bf16, under today's contract and under KV tiles
#             twice as wide (--block-n), on the same decode and prefill workloads
#   features-bench  the features' speed at model-like shapes against FlashInfer's fastest
#             variant with the same feature: gpt-oss-like 64:8:64 with window 128 and sinks,
#             Gemma-like 16:8:256 with window 4096 and soft-cap 50, Llama-like 32:8:128 with an
#             FP8 cache; decode (8 and 64 requests of 8k, 8 of 32k) and prefill
#   features-peers  the full check, bf16, of FlashInfer's decode (tensor cores) and prefill
#             wrappers with each model-like feature set above (which stay invariant with it)
#   gluon     the Gluon kernel tests at bf16 and fp16 (or the dtypes in $GLUON_DTYPES)
#   sanitizer compute-sanitizer memcheck (valid and malformed inputs) and initcheck at bf16
#   peers     the full check of FlashInfer's variants and torch SDPA at bf16
#   bench     the default and shapes grids ($BENCH_GRIDS): kernels, its control, FlashInfer's
#             fastest variant per workload (more backends in $BENCH_EXTRA, e.g.
#             "--backend kernels:host_lens=false")
#   shape-bench  head dims and page sizes off the default grid, each against `flashinfer-best`:
#             head dims 64 (64:8:64) and 256 (16:8:256), decode (8 and 64 requests of 8k, 8
#             of 32k) and prefill; pages of one token, decode
#   model     `invariance model` on a random-init Llama-like model (8 layers, hidden 1024, GQA
#             8:2, head dim 128) at bf16: the default stack, then attention through `kernels`
# FlashInfer (peers, bench) needs its wheels in .whl/ (see reports/README.md).
set -u
OUT=${OUT:-$PWD/evidence-out}
INV="python3 -m invariance.cli"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1

info() {
  { nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
    python3 -c "import sys, torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'python', sys.version.split()[0])"
  } > "$C/gpu.txt" 2>&1
  cat "$C/gpu.txt"
}

# run NAME TIMEOUT CMD...: CMD (recorded) with its console into $C/NAME.txt; prints rc, wall
# time and the verdict line.
run() {
  # run_-prefixed names: sh has no locals, and a step's own variables must survive the call.
  run_name=$1; run_limit=$2; shift 2
  echo "$*" >> "$C/commands.txt"
  run_start=$(date +%s)
  timeout -s INT -k 20 "$run_limit" "$@" > "$C/$run_name.txt" 2>&1
  run_rc=$?
  echo "$run_name rc=$run_rc wall $(( $(date +%s) - run_start )) s"
  grep -h -E "^(PASSED|FAILED|INCOMPLETE)|passed|failed|ERROR SUMMARY|launches" "$C/$run_name.txt" \
    | tail -2 | cut -c1-400
}

# each_model FN: FN MODEL HEADS FEATURE-ARGS... for each model-like feature set (gpt-oss-,
# Gemma- and Llama-with-FP8-like; MODELS="gemma ..." runs those only), as features-bench,
# features-peers and tune-features use them.
each_model() {
  each_model_ran=0
  for cfg in "gpt-oss 64:8:64 --feature window=128,sinks" \
             "gemma 16:8:256 --feature window=4096,softcap=50" \
             "llama-fp8 32:8:128 --kv-dtype fp8_e4m3"; do
    case " ${MODELS:-gpt-oss gemma llama-fp8} " in
      *" ${cfg%% *} "*) ;;
      *) continue ;;
    esac
    # shellcheck disable=SC2086  # word splitting of cfg intended
    "$1" $cfg
    each_model_ran=1
  done
  [ "$each_model_ran" = 1 ] || { echo "evidence.sh: MODELS='${MODELS:-}' names none of gpt-oss, gemma, llama-fp8" >&2; return 1; }
}
# The decode and prefill workloads of those feature sets.
FEATURE_LENS="--lengths decode:8kx8 --lengths decode:8kx64 --lengths decode:32kx8 \
--lengths prefill:16k,8k,4kx2,2k,1k,512x2"

flashinfer_site() {
  [ -d .whl ] || { echo "no .whl/: FlashInfer's wheels are not here"; return 1; }
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=$PYTHONPATH:/tmp/site
}

step_check() {
  run check 330 python3 benchmarks/count_gluon.py check --backend kernels --device cuda \
    --no-progress --json "$C/kernels-all-dtypes.json" --markdown "$C/kernels-all-dtypes.md"
  for h in 64:8:64 16:8:256; do
    run "check-d${h##*:}" 200 $INV check --backend kernels --device cuda --heads "$h" \
      --no-progress --json "$C/kernels-d${h##*:}.json" --markdown "$C/kernels-d${h##*:}.md"
  done
  # The control's report as Markdown only: its JSON (every violation with its case) is ~1 MB.
  run control 120 $INV check --backend kernels-heuristic --device cuda --dtype bf16 \
    --no-progress --markdown "$C/control-bf16.md"
  run control-d256 90 $INV check --backend kernels-heuristic --device cuda --dtype bf16 \
    --heads 16:8:256 --no-progress --markdown "$C/control-d256.md"
  run tests-gpu ${GPU_TESTS_S:-240} python3 -m pytest -q -p no:cacheprovider -rfE \
    tests/triton_kernels/test_gpu.py tests/triton_kernels/test_tuned.py
}

step_tune() {
  gpu=$(python3 -c "import torch; from kernels.tuned import device_slug; \
print(device_slug(torch.cuda.get_device_name()))")
  [ -f "kernels/tuned/$gpu.json" ] && cp "kernels/tuned/$gpu.json" "$C/$gpu.json"
  again=""
  for p in ${TUNE_AGAIN:-}; do again="$again --again $p"; done
  # shellcheck disable=SC2086  # word splitting of $again intended
  run tune ${TUNE_S:-570} $INV tune --grid shapes --grid default --budget-s ${TUNE_BUDGET_S:-430} \
    --resume $again --table "$C/$gpu.json" --json "$C/tune.json" --markdown "$C/tune.md"
}

step_tune_features() {
  gpu=$(python3 -c "import torch; from kernels.tuned import device_slug; \
print(device_slug(torch.cuda.get_device_name()))")
  [ -f "$OUT/tune/$gpu.json" ] && cp "$OUT/tune/$gpu.json" "$C/$gpu.json"
  [ -f "$C/$gpu.json" ] || cp "kernels/tuned/$gpu.json" "$C/$gpu.json"
  TABLE=$C/$gpu.json
  each_model tune_model
}

tune_model() {
  model=$1 heads=$2; shift 2
  run "tune-$model" ${TUNE_FEATURE_S:-180} $INV tune --heads "$heads" "$@" $FEATURE_LENS \
    --resume --table "$TABLE" --markdown "$C/tune-$model.md" --json "$C/tune-$model.json"
}

step_features() {
  run tests-features 200 python3 -m pytest -q -p no:cacheprovider -rfE \
    tests/triton_kernels/test_feature_kernels.py
  run window-sinks 200 $INV check --backend kernels --device cuda --dtype fp16,bf16 \
    --heads 64:8:64 --feature window=128 --feature sinks --no-progress \
    --json "$C/window-sinks.json" --markdown "$C/window-sinks.md"
  run softcap-window 200 $INV check --backend kernels --device cuda --dtype fp16,bf16 \
    --heads 16:8:256 --feature softcap=50 --feature window=4096 --no-progress \
    --json "$C/softcap-window.json" --markdown "$C/softcap-window.md"
  run fp8 200 $INV check --backend kernels --device cuda --dtype fp16,bf16 \
    --kv-dtype fp8_e4m3 --no-progress --json "$C/fp8.json" --markdown "$C/fp8.md"
  run control-window 120 $INV check --backend kernels-heuristic --device cuda --dtype bf16 \
    --feature window=4096 --no-progress --markdown "$C/control-window.md"
  run control-window-d64 120 $INV check --backend kernels-heuristic --device cuda --dtype bf16 \
    --heads 64:8:64 --feature window=128 --feature sinks --no-progress \
    --markdown "$C/control-window-d64.md"
}

step_contract() {
  lens="--lengths decode:8kx8 --lengths decode:8kx64 --lengths prefill:16k,8k,4kx2,2k,1k,512x2"
  for cfg in "d64 64:8:64 128" "d256 16:8:256 64"; do
    set -- $cfg
    for n in default "$3"; do
      opt=""; [ "$n" = default ] || opt="--block-n $n"
      run "tune-$1-$n" ${CONTRACT_S:-140} $INV tune --heads "$2" $lens $opt \
        --table "$C/$1-$n.json" --markdown "$C/$1-$n.md" --json "$C/$1-$n-trials.json"
    done
  done
}

step_features_bench() {
  flashinfer_site || return
  each_model bench_model
}

bench_model() {
  model=$1 heads=$2; shift 2
  run "bench-$model" ${BENCH_S:-200} $INV bench --heads "$heads" "$@" $FEATURE_LENS \
    --backend kernels --backend kernels-heuristic --baseline flashinfer-best \
    --iters ${BENCH_ITERS:-20} --no-progress --json "$C/bench-$model.json" \
    --markdown "$C/bench-$model.md"
}

step_features_peers() {
  flashinfer_site || return
  each_model peer_model
}

peer_model() {
  model=$1 heads=$2; shift 2
  for b in flashinfer:use_tensor_cores=true flashinfer-prefill; do
    n=$model-$(echo "$b" | tr ':=,' '---')
    run "peer-$n" 120 $INV check --backend "$b" --device cuda --dtype bf16 --heads "$heads" \
      "$@" --no-progress --markdown "$C/peer-$n.md"
  done
}

step_gluon() {
  for dt in ${GLUON_DTYPES:-bfloat16 float16}; do
    export INVARIANCE_DTYPE=$dt
    run "gluon-$dt" 270 python3 -m pytest -q -p no:cacheprovider -rfE \
      tests/triton_kernels/test_gluon.py
  done
  unset INVARIANCE_DTYPE
}

step_sanitizer() {
  export PYTORCH_NO_CUDA_MEMORY_CACHING=1
  run memcheck ${SAN_S:-300} compute-sanitizer --tool memcheck --target-processes all \
    --report-api-errors no --error-exitcode 99 python3 benchmarks/gpu_sanitize.py \
    --dtypes bfloat16
  run initcheck ${SAN_S:-200} compute-sanitizer --tool initcheck --target-processes all \
    --report-api-errors no --error-exitcode 99 python3 benchmarks/gpu_sanitize.py \
    --dtypes bfloat16 --valid-only
}

step_peers() {
  flashinfer_site || return
  for b in flashinfer flashinfer:use_tensor_cores=true flashinfer-fa3 flashinfer-prefill \
           sdpa-efficient sdpa-flash; do
    n=$(echo "$b" | tr ':=,' '---')
    run "peer-$n" 90 $INV check --backend "$b" --device cuda --dtype bf16 --no-progress \
      --markdown "$C/peer-$n.md"
  done
}

step_bench() {
  flashinfer_site || return
  for grid in ${BENCH_GRIDS:-default shapes}; do
    run "bench-$grid" ${BENCH_S:-280} $INV bench --grid "$grid" --backend kernels \
      --backend kernels-heuristic ${BENCH_EXTRA:-} --baseline flashinfer-best \
      --iters ${BENCH_ITERS:-20} --no-progress --json "$C/bench-$grid.json" \
      --markdown "$C/bench-$grid.md"
  done
}

step_shape_bench() {
  flashinfer_site || return
  for cfg in "d64 --heads 64:8:64" "d256 --heads 16:8:256" "page1 --page-size 1"; do
    set -- $cfg
    tag=$1; shift
    prefill="--lengths decode:32kx8 --lengths prefill:16k,8k,4kx2,2k,1k,512x2"
    [ "$tag" = page1 ] && prefill=""
    run "shape-$tag" ${BENCH_S:-200} $INV bench "$@" --lengths decode:8kx8 \
      --lengths decode:8kx64 $prefill --backend kernels --backend kernels-heuristic \
      --baseline flashinfer-best --iters ${BENCH_ITERS:-20} --no-progress \
      --json "$C/shape-$tag.json" --markdown "$C/shape-$tag.md"
  done
}

step_model() {
  m=llama:hidden_size=1024,intermediate_size=2816,num_hidden_layers=8,num_attention_heads=8
  m=$m,num_key_value_heads=2,head_dim=128,vocab_size=32000,max_position_embeddings=4096
  for att in default kernels; do
    run "model-$att" ${MODEL_S:-250} $INV model "$m" --dtype bfloat16 --device cuda \
      --batch-sizes 2,3,4,8,16,32,64,128 --length 16 --decode-steps 4 --attention "$att" \
      --no-progress --json "$C/llama-$att.json" --markdown "$C/llama-$att.md" \
      --html "$C/llama-$att.html"
  done
}

[ $# -ge 1 ] || { sed -n '2,41p' "$0"; exit 2; }
mkdir -p "$OUT"
for STEP in "$@"; do
  case "$STEP" in
    check|tune|tune-features|contract|features|features-bench|features-peers|gluon|sanitizer|peers|bench|shape-bench|model) ;;
    *) sed -n '2,41p' "$0" >&2
       echo "evidence.sh: unknown step '$STEP' (the steps are listed above)" >&2
       exit 2 ;;
  esac
  C=$OUT/$STEP
  mkdir -p "$C"
  info
  "step_$(echo "$STEP" | tr - _)"
  tar czf "$OUT/$STEP.tgz" -C "$OUT" "$STEP"
done
