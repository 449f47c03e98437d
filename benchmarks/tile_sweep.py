"""Which launch settings of the attention kernels are bit-neutral on this GPU, and how fast each is.

    python benchmarks/tile_sweep.py --out DIR [--dtypes bfloat16,float16,float32] [--quick]

For every dtype, every candidate ``kernels.Tuning(block_m, num_warps, num_stages)`` and both
plans, it runs ``kernels.unified_attention`` on ``invariance bench``'s workloads and compares out
and LSE **bit for bit** with the default launch (``Tuning()``, ``plan="auto"``); it records the
MMA instruction family the compiled kernels use (``wgmma`` / ``mma.sync`` / FMA, from their PTX)
and the time (CUDA-graph replay, L2 flushed, median: ``invariance.bench.CudaTimer``). BLOCK_N and
the split size stay at their defaults (they are bit-defining). A ``control`` row (BLOCK_M 32 for
half precision, known to leave the wgmma family on an H100) shows that the comparison can fail.

Writes ``DIR/tile_sweep.json`` and ``DIR/tile_sweep.md``. ``fuzz`` below is a backend for
``invariance check --backend benchmarks/tile_sweep.py:fuzz`` that picks a candidate setting per
batch (a hash of its shape), so the harness itself checks that the settings agree under every
perturbation.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from collections.abc import Callable
from typing import Any

import torch

from invariance.backends import Capabilities
from invariance.batch import AttentionBatch, AttentionResult

HALF_CANDIDATES = [(bm, w, s) for bm in (64, 128) for w in (4, 8) for s in (2, 3, 4)]
FP32_CANDIDATES = [(bm, w, s) for bm in (32, 64) for w in (4, 8) for s in (2, 3)]
#: What ``fuzz`` draws from (fewer than the sweep: each setting compiles its own kernels).
FUZZ_CANDIDATES = [(64, 4, 2), (128, 4, 2), (64, 8, 3), (128, 8, 4), (256, 8, 3), (128, 8, 3),
                   (64, 4, 3)]
CONTROL = {"bfloat16": (32, 4, 2), "float16": (32, 4, 2), "float32": (16, 4, 2)}
WORKLOADS = ["prefill-varlen", "mixed64", "decode-prod64", "decode-b8-ctx8k", "decode-b1-ctx32k",
             "decode-b64-ctx8k"]


def candidates(dtype: torch.dtype) -> list[tuple[int, int, int]]:
    return FP32_CANDIDATES if dtype == torch.float32 else HALF_CANDIDATES


class _Families:
    """Records the MMA instruction family of every kernel launched while active."""

    def __init__(self) -> None:
        import triton.runtime.jit as jit

        self.seen: set[str] = set()
        self._jit = jit
        self._run = jit.JITFunction.run
        families = self.seen

        def run(fn: Any, *args: Any, **kwargs: Any) -> Any:
            kernel = self._run(fn, *args, **kwargs)
            name = getattr(getattr(fn, "fn", None), "__name__", "kernel")
            ptx = getattr(kernel, "asm", {}).get("ptx", "") if kernel is not None else ""
            if "wgmma" in ptx:
                families.add(f"{name}:wgmma")
            elif "mma.sync" in ptx:
                families.add(f"{name}:mma.sync")
            elif ptx:
                families.add(f"{name}:fma")
            return kernel

        jit.JITFunction.run = run  # type: ignore[method-assign]

    def close(self) -> None:
        self._jit.JITFunction.run = self._run  # type: ignore[method-assign]


def _call(batch: AttentionBatch, plan: str, tuning: Any) -> Callable[[], tuple[Any, Any]]:
    import kernels

    def fn() -> tuple[Any, Any]:
        return kernels.unified_attention(
            batch.q, batch.k_cache, batch.v_cache, batch.cu_seqlens_q, batch.kv_lens,
            batch.block_table, sm_scale=batch.sm_scale, plan=plan, tuning=tuning,
            validate=False)
    return fn


def sweep(dtypes: list[torch.dtype], workloads: list[str], quick: bool) -> list[dict[str, Any]]:
    import kernels
    from invariance.bench import WORKLOADS as BENCH
    from invariance.bench import CudaTimer, build_batch, graph_replay
    from invariance.compare import compare_bits

    timer = CudaTimer(iters=10 if quick else 30, warmup=3 if quick else 5)
    rows: list[dict[str, Any]] = []
    for dt in dtypes:
        name = str(dt).removeprefix("torch.")
        configs = [*(("candidate", c) for c in candidates(dt)), ("control", CONTROL[name])]
        for wname in workloads:
            batch = build_batch(BENCH[wname], dtype=dt)
            ref_out, ref_lse = _call(batch, "auto", kernels.Tuning())()
            for plan in ("fused", "split"):
                for kind, (bm, w, s) in configs:
                    tuning = kernels.Tuning(block_m=bm, num_warps=w, num_stages=s)
                    fams = _Families()
                    try:
                        out, lse = _call(batch, plan, tuning)()
                        torch.cuda.synchronize()
                    except Exception as exc:  # e.g. out of shared memory: recorded, not fatal
                        rows.append({"dtype": name, "workload": wname, "plan": plan,
                                     "kind": kind, "block_m": bm, "num_warps": w,
                                     "num_stages": s, "error": f"{type(exc).__name__}: "
                                     f"{str(exc).splitlines()[0][:200]}"})
                        continue
                    finally:
                        fams.close()
                    d_out = compare_bits(out, ref_out, name="out")
                    d_lse = compare_bits(lse, ref_lse, name="lse")
                    ms = timer.time_fn(graph_replay(_call(batch, plan, tuning), batch.device))
                    rows.append({
                        "dtype": name, "workload": wname, "plan": plan, "kind": kind,
                        "block_m": bm, "num_warps": w, "num_stages": s, "ms": ms,
                        "out_different": d_out.num_different, "lse_different": d_lse.num_different,
                        "families": sorted(fams.seen)})
                    print(json.dumps(rows[-1]), flush=True)
            del batch
            torch.cuda.empty_cache()
    return rows


def to_markdown(rows: list[dict[str, Any]], header: str) -> str:
    lines = [header, "", "| dtype | workload | plan | BLOCK_M | warps | stages | ms | out bits "
             "differing | LSE bits differing | MMA family |", "|---" * 10 + "|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['dtype']} | {r['workload']} | {r['plan']} | {r['block_m']} | "
                         f"{r['num_warps']} | {r['num_stages']} | error | {r['error']} | | |")
            continue
        tag = " (control)" if r["kind"] == "control" else ""
        lines.append(
            f"| {r['dtype']} | {r['workload']} | {r['plan']} | {r['block_m']}{tag} | "
            f"{r['num_warps']} | {r['num_stages']} | {r['ms']:.4f} | {r['out_different']} | "
            f"{r['lse_different']} | {', '.join(r['families'])} |")
    return "\n".join(lines) + "\n"


class Fuzz:
    """``kernels`` with a candidate launch setting, plan, (split plan) V column blocks, tiles per
    loop step and the merge's launch, and (fused plan) the slot order and the loop (flat or
    nested, with K loaded as rows; tiles per step too when nested) picked per batch from a
    hash of the batch's shape: under ``invariance check`` every perturbation then compares rows
    computed with different settings, which agree bit for bit only if the settings are
    bit-neutral."""

    plans = ("fused", "split", "auto")

    @property
    def capabilities(self) -> Capabilities:
        from invariance.backends.kernels import invariant
        return Capabilities(dtypes=("float16", "bfloat16"), head_dims=(128,),
                            split_tokens=invariant.capabilities.split_tokens)

    def __call__(self, batch: AttentionBatch) -> AttentionResult:
        from invariance.backends.kernels import _enable_interpreter_on_cpu
        _enable_interpreter_on_cpu(batch)
        import kernels

        key = f"{batch.num_tokens}:{batch.batch_size}:{batch.block_table.shape[1]}"
        h = int(hashlib.sha256(key.encode()).hexdigest(), 16)
        if batch.dtype == torch.float32:
            raise ValueError("fuzz: float32 has no bit-neutral BLOCK_M choice to draw from "
                             "(kernels/README.md); check float16 or bfloat16")
        bm, w, s = FUZZ_CANDIDATES[h % len(FUZZ_CANDIDATES)]
        h //= len(FUZZ_CANDIDATES)
        plan = self.plans[h % len(self.plans)]
        h //= len(self.plans)
        # V column blocks, tiles per loop step and the merge's dependent launch of the split
        # plan (ignored by the fused one); None: the shape rules.
        vb = (None, 1, 2, 4, 8)[h % 5]
        step = (None, 1, 2)[(h // 5) % 3]
        dependent = (None, False)[(h // 15) % 2]
        # The fused plan's slot order (ignored by the split plan); None: the shape rule.
        ordered = (None, True, False)[(h // 30) % 3]
        # The fused plan's loop (ignored by the split plan); None: the shape rule.
        nested = (None, True, False)[(h // 90) % 3]
        out, lse = kernels.unified_attention(
            batch.q, batch.k_cache, batch.v_cache, batch.cu_seqlens_q, batch.kv_lens,
            batch.block_table, sm_scale=batch.sm_scale, plan=plan,
            tuning=kernels.Tuning(block_m=bm, num_warps=w, num_stages=s, value_blocks=vb,
                                  tiles_per_step=step, dependent_merge=dependent,
                                  slot_order=ordered, nested_loop=nested))
        return AttentionResult(out, lse)


fuzz = Fuzz()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--dtypes", default="bfloat16,float16,float32")
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("tile_sweep: needs a CUDA GPU")
    import os

    import triton
    dtypes = [getattr(torch, d) for d in args.dtypes.split(",")]
    t0 = time.time()
    rows = sweep(dtypes, args.workloads.split(","), args.quick)
    os.makedirs(args.out, exist_ok=True)
    header = (f"# Tuning sweep: {torch.cuda.get_device_name()}, torch {torch.__version__}, "
              f"triton {triton.__version__}, {time.time() - t0:.0f} s\n\n"
              "Bits compared with the default launch (Tuning(), plan auto) of the same workload.")
    with open(os.path.join(args.out, "tile_sweep.json"), "w") as f:
        json.dump(rows, f, indent=1)
    with open(os.path.join(args.out, "tile_sweep.md"), "w") as f:
        f.write(to_markdown(rows, header))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
