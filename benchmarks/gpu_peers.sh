#!/usr/bin/env bash
# Peer backends on one CUDA GPU, in about 8 minutes at most:
#   1. install the FlashInfer wheels carried in .whl/ (no index, no dependencies) into /tmp/site;
#   2. `invariance check` (bf16 and fp16, every perturbation including cuda_graph, budget 1) of
#      flashinfer, flashinfer-fa3, flashinfer-prefill, flashinfer-fixed-split, sdpa-flash,
#      sdpa-efficient, sdpa-cudnn and sdpa-math, going on after failures; each check is interrupted after
#      CHECK_TIMEOUT seconds (default 45; its partial report is then written, marked incomplete);
#   3. `invariance bench --backend kernels --baseline flashinfer` (BENCH_TIMEOUT, default 150 s;
#      0 skips it).
# BACKENDS (a space-separated list) replaces the list of step 2.
#
# Usage: benchmarks/gpu_peers.sh OUTDIR
# Writes OUTDIR/check-NAME.{json,md,txt}, OUTDIR/bench.{json,md,txt}, OUTDIR/env.txt and
# OUTDIR/summary.txt (one line per step with its exit status: 0 passed, 1 violations or
# errors, 2 usage or runtime error, 130 interrupted by the timeout).
set -uo pipefail

OUT=${1:?usage: benchmarks/gpu_peers.sh OUTDIR}
CHECK_TIMEOUT=${CHECK_TIMEOUT:-45}
BENCH_TIMEOUT=${BENCH_TIMEOUT:-150}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
cd "$ROOT" || exit 2

if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
else
  echo "gpu_peers: no .whl/*.whl here; using the flashinfer installed, if any" >&2
fi
export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}
INV=(python3 -m invariance.cli)
: > "$OUT/summary.txt"

note() { echo "$*" | tee -a "$OUT/summary.txt"; }

python3 -c "import flashinfer, sys; print('flashinfer', flashinfer.__version__, 'from', \
flashinfer.__file__)" 2>&1 | tee "$OUT/env.txt"
"${INV[@]}" env >> "$OUT/env.txt" 2>&1
COLUMNS=200 "${INV[@]}" list >> "$OUT/env.txt" 2>&1

for backend in ${BACKENDS:-flashinfer flashinfer-fa3 flashinfer-prefill flashinfer-fixed-split \
                          sdpa-flash sdpa-efficient sdpa-cudnn sdpa-math}; do
  start=$SECONDS
  timeout -s INT -k 15 "$CHECK_TIMEOUT" "${INV[@]}" check --backend "$backend" --device cuda \
    --dtype bfloat16,float16 --perturb all --budget 1 --no-progress \
    --json "$OUT/check-$backend.json" --markdown "$OUT/check-$backend.md" \
    > "$OUT/check-$backend.txt" 2>&1
  status=$?
  note "check $backend: exit $status in $((SECONDS - start)) s: $(grep -m1 -E \
'PASSED|FAILED|error:|interrupted' "$OUT/check-$backend.txt" | cut -c1-200)"
done

[ "$BENCH_TIMEOUT" = 0 ] && { cat "$OUT/summary.txt"; exit 0; }
start=$SECONDS
timeout -s INT -k 15 "$BENCH_TIMEOUT" "${INV[@]}" bench --backend kernels \
  --baseline flashinfer --iters 30 --no-progress \
  --markdown "$OUT/bench.md" --json "$OUT/bench.json" > "$OUT/bench.txt" 2>&1
status=$?
note "bench kernels vs flashinfer: exit $status in $((SECONDS - start)) s"
cat "$OUT/bench.txt"
echo
cat "$OUT/summary.txt"
