"""Round-6 probe (H100): raw-state folds, timed against round 5's kernels and re-tuned
(reports/h100-round6/README.md).

    python benchmarks/probe_round6.py OUT_DIR [plans|tunings|stats|tall]

``plans``: fused / split / auto per workload with whatever ``kernels`` is first on
``PYTHONPATH`` (``probe_round5.plans``; run it on round 5's kernels too, in the same session).
``stats``: the fold-sensitive workloads timed, with the compiled kernels' registers and spills
(one kernels variant per run). ``tall``: BLOCK_M 256 / 8 warps on prefill-like batches.
``tunings``: the bit-neutral launch settings (BLOCK_M 64/128 x
4/8 warps x 2/3 stages, both plans) on the workloads that miss their targets, timed and compared
bit for bit (out and LSE) with the default launch (``plan="auto"``, no tuning).
"""

from __future__ import annotations

import json
import os
import sys

import torch

import kernels
from benchmarks.probe_round4 import call, save
from benchmarks.probe_round5 import _bits_vs, plans
from benchmarks.tile_sweep import _graphed as graphed
from invariance.bench import WORKLOADS, CudaTimer, build_batch

TUNED = ["prefill-varlen", "mixed64", "decode-b1-ctx1k", "decode-b8-ctx1k", "decode-b1-ctx8k"]


def tunings(out_dir):
    timer = CudaTimer(iters=20, warmup=3)
    rows = []
    for name in TUNED:
        batch = build_batch(WORKLOADS[name])
        ref = call(batch, "auto")()
        ms = timer.time_fn(graphed(call(batch, "auto")))
        rows.append(dict(workload=name, config="default", us=round(ms * 1000, 1)))
        print(json.dumps(rows[-1]), flush=True)
        for plan in ("fused", "split"):
            for bm in (64, 128):
                for warps in (4, 8):
                    for stages in (2, 3):
                        tuning = kernels.Tuning(block_m=bm, num_warps=warps, num_stages=stages)
                        d = _bits_vs(ref, call(batch, plan, tuning)())
                        ms = timer.time_fn(graphed(call(batch, plan, tuning)))
                        rows.append(dict(workload=name, config=f"{plan}-{bm}/{warps}/{stages}",
                                         us=round(ms * 1000, 1), bits_differing=d))
                        print(json.dumps(rows[-1]), flush=True)
        best = min((r for r in rows if r["workload"] == name), key=lambda r: r["us"])
        print(f"{name}: default {rows[-17]['us']} us, fastest {best['config']} {best['us']} us, "
              f"differing {sum(r.get('bits_differing', 0) for r in rows[-16:])}", flush=True)
        del batch, ref
        torch.cuda.empty_cache()
    save(out_dir, "tunings.jsonl", rows)


def _compiled(jit_fn):
    """Registers, spills and warps of each compiled variant of a jit function."""
    out = []
    for cache in getattr(jit_fn, "device_caches", {}).values():
        kernels_ = next((c for c in cache if isinstance(c, dict)), {})
        for k in kernels_.values():
            out.append(dict(regs=getattr(k, "n_regs", None), spills=getattr(k, "n_spills", None),
                            warps=k.metadata.num_warps))
    return out


def stats(out_dir):
    """Fold-sensitive workloads (fused prefill and mixed, split long decode) timed, and the
    registers and spills of the compiled kernels, with whatever ``kernels`` is first on
    ``PYTHONPATH`` (one variant per run)."""
    from kernels._triton import attention_kernels as ak

    timer = CudaTimer(iters=20, warmup=3)
    rows = []
    for name, plan in [("prefill-varlen", "fused"), ("mixed64", "fused"),
                       ("decode-b1-ctx32k", "split"), ("decode-b8-ctx32k", "split"),
                       ("decode-prod64", "split")]:
        batch = build_batch(WORKLOADS[name])
        ms = timer.time_fn(graphed(call(batch, plan)))
        rows.append(dict(workload=name, config=plan, us=round(ms * 1000, 1)))
        print(json.dumps(rows[-1]), flush=True)
        if name == "prefill-varlen" and os.environ.get("PROBE_BLOCK_M_256"):
            ref = call(batch, plan)()
            tuning = kernels.Tuning(block_m=256, num_warps=8)
            d = _bits_vs(ref, call(batch, plan, tuning)())
            ms = timer.time_fn(graphed(call(batch, plan, tuning)))
            rows.append(dict(workload=name, config=f"{plan}-256/8/2", us=round(ms * 1000, 1),
                             bits_differing=d))
            print(json.dumps(rows[-1]), flush=True)
        del batch
        torch.cuda.empty_cache()
    for fn in ("_unified_attention_fused_kernel", "_unified_attention_split_kernel",
               "_merge_splits_kernel"):
        rows.append(dict(kernel=fn, compiled=_compiled(getattr(ak, fn))))
        print(json.dumps(rows[-1]), flush=True)
    save(out_dir, "stats.jsonl", rows)


def tall(out_dir):
    """Taller tiles for prefill-like batches: BLOCK_M 256 with 8 warps (two warpgroups of 128
    rows, each row still on one m64 wgmma) against the default 128/4, fused, both half
    precisions; bits against the default launch."""
    timer = CudaTimer(iters=20, warmup=3)
    rows = []
    for dtype in (torch.bfloat16, torch.float16):
        for name in ("prefill-varlen", "mixed64", "decode-b64-ctx1k"):
            batch = build_batch(WORKLOADS[name], dtype=dtype)
            ref = call(batch, "auto")()
            for bm, warps, stages in ((128, 4, 2), (256, 8, 2), (256, 8, 3), (128, 8, 2)):
                tuning = kernels.Tuning(block_m=bm, num_warps=warps, num_stages=stages)
                d = _bits_vs(ref, call(batch, "fused", tuning)())
                ms = timer.time_fn(graphed(call(batch, "fused", tuning)))
                rows.append(dict(dtype=str(dtype), workload=name,
                                 config=f"fused-{bm}/{warps}/{stages}",
                                 us=round(ms * 1000, 1), bits_differing=d))
                print(json.dumps(rows[-1]), flush=True)
            del batch, ref
            torch.cuda.empty_cache()
    save(out_dir, "tall.jsonl", rows)


MODES = {"plans": plans, "tunings": tunings, "stats": stats, "tall": tall}

if __name__ == "__main__":
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    what = sys.argv[2] if len(sys.argv) > 2 else ""
    if what not in MODES:
        sys.exit(f"probe_round6: unknown mode {what!r}; expected one of {', '.join(MODES)}")
    MODES[what](out_dir)
