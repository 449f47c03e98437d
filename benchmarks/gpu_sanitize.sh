#!/usr/bin/env bash
# compute-sanitizer memcheck and initcheck over every kernel path (fused, split + merge, control,
# merge_states, malformed validate=False inputs; float16, bfloat16, float32), driven by
# benchmarks/gpu_sanitize.py on small batches. Needs a CUDA GPU and compute-sanitizer (CUDA
# toolkit) on PATH; run from the repository root with the package installed (pip install -e .).
#
#   benchmarks/gpu_sanitize.sh LOG_DIR
#
# Writes LOG_DIR/{warmup,memcheck,initcheck}.log (the driver's output), the sanitizers' reports
# LOG_DIR/{memcheck,initcheck}.sanitizer.log and LOG_DIR/summary.txt. Exits 1 if a tool reports
# an error or the driver fails. At most 150 s of warm-up (Triton compiles every kernel once,
# outside the sanitizers) and 2 x 120 s under them: under 5 minutes of GPU time.
set -uo pipefail

out=${1:?usage: benchmarks/gpu_sanitize.sh LOG_DIR}
mkdir -p "$out"
command -v compute-sanitizer >/dev/null || { echo "compute-sanitizer not on PATH" >&2; exit 2; }

# One cudaMalloc per tensor: memcheck then sees each tensor's exact bounds (no out-of-bounds
# access hides inside a caching-allocator block), and torch.empty memory stays uninitialised for
# initcheck (the split plan's workspace is uninitialised on purpose: no row may read a partial
# that was not written).
export PYTORCH_NO_CUDA_MEMORY_CACHING=1
# Compiled kernels are cached here by the warm-up and reused under the sanitizers.
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-$out/triton-cache}
driver=(python benchmarks/gpu_sanitize.py)
status=0

echo "== warm-up (no sanitizer)"
timeout 150 "${driver[@]}" >"$out/warmup.log" 2>&1 || { echo "warm-up failed" >&2; status=1; }
tail -n 1 "$out/warmup.log"

: >"$out/summary.txt"
for tool in memcheck initcheck; do
    echo "== $tool"
    # initcheck leaves out malformed validate=False inputs: their garbage rows may read workspace
    # no program wrote (in bounds: memcheck covers them), which the contract allows.
    extra=()
    [ "$tool" = initcheck ] && extra=(--valid-only)
    # --report-api-errors no: torch probes CUDA APIs that fail by design (device queries).
    timeout 120 compute-sanitizer --tool "$tool" --target-processes all \
        --report-api-errors no --error-exitcode 99 \
        --log-file "$out/$tool.sanitizer.log" \
        "${driver[@]}" ${extra[@]+"${extra[@]}"} >"$out/$tool.log" 2>&1
    rc=$?
    summary=$(grep -h "ERROR SUMMARY" "$out/$tool.sanitizer.log" | tail -n 1)
    echo "$tool: exit $rc; ${summary:-no ERROR SUMMARY line}; $(tail -n 1 "$out/$tool.log")" \
        | tee -a "$out/summary.txt"
    # 99: the tool found errors; 124: timed out; anything else non-zero: the driver failed.
    [ "$rc" -eq 0 ] || status=1
done
exit "$status"
