"""Round-5 probe (H100): the swapped decode tile (reports/h100-round5/README.md).

    python benchmarks/probe_round5.py OUT_DIR [swap|plans|flat|krows|hashes]

``swap``: every workload under the standard tile (fused and split plans), the swapped decode tile
at 16/32 rows, 2-4 pipeline stages and 4/8 warps, and ``plan="auto"``; CUDA-graph replay (L2
flushed, median), each compared bit for bit (out and LSE) with the fused plan. It needs the
experiment's ``kernels.Tuning(swap=...)``: run it on commit 6303129, whose kernels have the
swapped tile (reverted after this probe; reports/h100-round5/README.md says why).
``flat`` (on commits fda026b and c174114, which had it): int32 row addressing vs round 4's int64
page/slot addressing, each plan, timed and compared bit for bit. ``krows``: K loaded as rows
(the default for tiles of up to 64 rows) vs as columns, each plan, timed and compared bit for
bit. ``hashes``: SHA-256 of out and LSE per workload and plan (run
on two builds to compare their bits). ``plans``: fused / split / auto only, with whatever
``kernels`` is first on ``PYTHONPATH`` (run it on the previous round's kernels to time them in
the same session).
"""

from __future__ import annotations

import json
import os
import sys

import torch

import kernels
from benchmarks.probe_round4 import call, save
from benchmarks.tile_sweep import _graphed as graphed
from invariance.bench import WORKLOADS, CudaTimer, build_batch
from invariance.compare import compare_bits

WORKLOADS_R5 = ["decode-b1-ctx1k", "decode-b1-ctx8k", "decode-b1-ctx32k", "decode-b8-ctx1k",
                "decode-b8-ctx8k", "decode-b8-ctx32k", "decode-b64-ctx1k", "decode-b64-ctx8k",
                "decode-prod64", "mixed64", "prefill-varlen"]
PREFILL = ("mixed64", "prefill-varlen")

# (label, plan, Tuning fields); "std" = the standard tile forced, "swapR-sS-wW" = the swapped
# tile with R rows, S stages, W warps.
SWAP_CONFIGS = [
    ("fused-std", "fused", dict(swap=False)),
    ("split-std", "split", dict(swap=False)),
    ("swap16-s2-w4", "split", dict(swap=True, block_m=16, num_stages=2, num_warps=4)),
    ("swap16-s3-w4", "split", dict(swap=True, block_m=16, num_stages=3, num_warps=4)),
    ("swap16-s4-w4", "split", dict(swap=True, block_m=16, num_stages=4, num_warps=4)),
    ("swap32-s2-w4", "split", dict(swap=True, block_m=32, num_stages=2, num_warps=4)),
    ("swap16-s2-w8", "split", dict(swap=True, block_m=16, num_stages=2, num_warps=8)),
    ("auto", "auto", dict()),
]


def _bits_vs(ref, got):
    return (compare_bits(got[0], ref[0], name="out").num_different
            + compare_bits(got[1], ref[1], name="lse").num_different)


def _table(rows, labels):
    print("\nworkload | " + " | ".join(labels))
    for name in WORKLOADS_R5:
        got = {r["config"]: r for r in rows if r["workload"] == name}
        print(name + " | " + " | ".join(
            "-" if lb not in got else "err" if "error" in got[lb] else
            f"{got[lb]['us']}{'' if got[lb].get('bits_differing', 0) == 0 else ' DIFF'}"
            for lb in labels))


def swap(out_dir):
    """The swapped tile vs the standard tile: bits against the fused plan, and time."""
    if "swap" not in kernels.Tuning.__dataclass_fields__:
        sys.exit("probe_round5 swap: needs the kernels of commit 6303129 (the swapped tile was "
                 "reverted after it)")
    timer = CudaTimer(iters=20, warmup=3)
    rows = []
    for name in WORKLOADS_R5:
        batch = build_batch(WORKLOADS[name])
        ref = call(batch, "fused", kernels.Tuning(swap=False))()
        for label, plan, fields in SWAP_CONFIGS:
            if name in PREFILL and label.startswith("swap") and label != "swap16-s2-w4":
                continue  # one swapped run for the bits; the swapped tile is not for prefill
            if name == "decode-b1-ctx32k" and plan == "fused":
                continue
            tuning = kernels.Tuning(**fields)
            try:
                d = _bits_vs(ref, call(batch, plan, tuning)())
                ms = timer.time_fn(graphed(call(batch, plan, tuning)))
            except Exception as exc:  # out of resources: recorded
                rows.append(dict(workload=name, config=label,
                                 error=str(exc).splitlines()[0][:160]))
                print(json.dumps(rows[-1]), flush=True)
                continue
            lp = kernels.plan_attention(
                batch.q, batch.k_cache, batch.v_cache, batch.cu_seqlens_q, batch.kv_lens,
                batch.block_table, plan=plan, tuning=tuning, validate=False,
                host_lens=(batch.q_lens(), batch.kv_lens.tolist()))
            rows.append(dict(workload=name, config=label, plan=lp.plan, swap=lp.swap,
                             block_m=lp.block_m, us=round(ms * 1000, 1), bits_differing=d))
            print(json.dumps(rows[-1]), flush=True)
        del batch, ref
        torch.cuda.empty_cache()
    save(out_dir, "swap.jsonl", rows)
    _table(rows, [c[0] for c in SWAP_CONFIGS])


def plans(out_dir):
    """fused / split / auto with the kernels first on PYTHONPATH (no Tuning fields)."""
    timer = CudaTimer(iters=20, warmup=3)
    rows = []
    for name in WORKLOADS_R5:
        batch = build_batch(WORKLOADS[name])
        for plan in ("fused", "split", "auto"):
            if name == "decode-b1-ctx32k" and plan == "fused":
                continue
            ms = timer.time_fn(graphed(call(batch, plan)))
            rows.append(dict(workload=name, config=plan, us=round(ms * 1000, 1),
                             kernels=os.path.dirname(kernels.__file__)))
            print(json.dumps(rows[-1]), flush=True)
        del batch
        torch.cuda.empty_cache()
    save(out_dir, "plans.jsonl", rows)
    _table(rows, ["fused", "split", "auto"])


def flat(out_dir):
    """Int32 row addressing (``IS_FLAT_ROWS``, the default for contiguous caches) vs the int64
    page/slot addressing of round 4 (``kernels.attention._flat_rows`` patched to False), under
    each plan: time, and bits against the fused plan with round 4's addressing."""
    import kernels.attention as attention

    if not hasattr(attention, "_flat_rows"):
        sys.exit("probe_round5 flat: needs the kernels of commit fda026b or c174114 (int32 row "
                 "addressing was removed after them)")
    timer = CudaTimer(iters=20, warmup=3)
    rows = []
    real = attention._flat_rows
    for name in WORKLOADS_R5:
        batch = build_batch(WORKLOADS[name])
        attention._flat_rows = lambda k, v: False
        ref = call(batch, "fused")()
        for plan in ("fused", "split", "auto"):
            if name == "decode-b1-ctx32k" and plan == "fused":
                continue
            for is_flat in (False, True):
                attention._flat_rows = real if is_flat else (lambda k, v: False)
                d = _bits_vs(ref, call(batch, plan)())
                ms = timer.time_fn(graphed(call(batch, plan)))
                rows.append(dict(workload=name, config=f"{plan}-{'flat' if is_flat else 'r4'}",
                                 flat=is_flat and real(batch.k_cache, batch.v_cache),
                                 us=round(ms * 1000, 1), bits_differing=d))
                print(json.dumps(rows[-1]), flush=True)
        attention._flat_rows = real
        del batch, ref
        torch.cuda.empty_cache()
    save(out_dir, "flat.jsonl", rows)
    _table(rows, [f"{p}-{f}" for p in ("fused", "split", "auto") for f in ("r4", "flat")])


def krows(out_dir):
    """K loaded as [BLOCK_N, D] rows vs [D, BLOCK_N] columns (``kernels.attention._k_rows``
    patched), under each plan: time, and bits against the fused plan with columns."""
    import kernels.attention as attention

    timer = CudaTimer(iters=20, warmup=3)
    rows = []
    real = attention._k_rows
    for name in WORKLOADS_R5:
        batch = build_batch(WORKLOADS[name])
        attention._k_rows = lambda lp, dt: False
        ref = call(batch, "fused")()
        for plan in ("fused", "split", "auto"):
            if name == "decode-b1-ctx32k" and plan == "fused":
                continue
            for mode in ("cols", "rows", "default"):
                attention._k_rows = (real if mode == "default" else
                                     (lambda lp, dt, r=mode == "rows": r))
                d = _bits_vs(ref, call(batch, plan)())
                ms = timer.time_fn(graphed(call(batch, plan)))
                rows.append(dict(workload=name, config=f"{plan}-{mode}", us=round(ms * 1000, 1),
                                 bits_differing=d))
                print(json.dumps(rows[-1]), flush=True)
        attention._k_rows = real
        del batch, ref
        torch.cuda.empty_cache()
    save(out_dir, "krows.jsonl", rows)
    _table(rows, [f"{p}-{m}" for p in ("fused", "split", "auto")
                  for m in ("cols", "rows", "default")])


def hashes(out_dir):
    """SHA-256 of the raw bits of out and LSE, per workload and plan, with whatever ``kernels``
    is first on ``PYTHONPATH``: run on two builds and compare the files (bits across builds)."""
    import hashlib

    rows = []
    for name in WORKLOADS_R5:
        batch = build_batch(WORKLOADS[name])
        for plan in ("fused", "split", "auto"):
            if name == "decode-b1-ctx32k" and plan == "fused":
                continue
            out, lse = call(batch, plan)()
            torch.cuda.synchronize()
            rows.append(dict(workload=name, plan=plan,
                             out=hashlib.sha256(out.contiguous().view(torch.int16).cpu().numpy()
                                                .tobytes()).hexdigest()[:16],
                             lse=hashlib.sha256(lse.contiguous().view(torch.int32).cpu().numpy()
                                                .tobytes()).hexdigest()[:16]))
            print(json.dumps(rows[-1]), flush=True)
        del batch
        torch.cuda.empty_cache()
    save(out_dir, "hashes.jsonl", rows)


MODES = {"swap": swap, "plans": plans, "flat": flat, "krows": krows, "hashes": hashes}

if __name__ == "__main__":
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    what = sys.argv[2] if len(sys.argv) > 2 else "swap"
    if what not in MODES:
        sys.exit(f"probe_round5: unknown mode {what!r}; expected one of {', '.join(MODES)}")
    MODES[what](out_dir)
