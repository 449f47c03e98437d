"""Round-5 probe (H100): K loads and bits across builds (reports/h100-round5/README.md).

    python benchmarks/probe_round5.py OUT_DIR [plans|krows|hashes]

``krows``: K loaded as rows (the default, except in the fused kernel's 128-row tiles) vs as
columns, each plan, timed (CUDA-graph replay, L2 flushed, median) and compared bit for bit (out
and LSE) with the fused plan. ``hashes``: SHA-256 of out and LSE per workload and plan (run on
two builds to compare their bits). ``plans``: fused / split / auto only, with whatever
``kernels`` is first on ``PYTHONPATH`` (run it on the previous round's kernels to time them in
the same session).

Two modes ran on kernels that are gone, and stay in this file at those commits: ``swap`` (the
swapped decode tile; commit 6303129) and ``flat`` (int32 row addressing; commit c174114).
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


MODES = {"plans": plans, "krows": krows, "hashes": hashes}

if __name__ == "__main__":
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    what = sys.argv[2] if len(sys.argv) > 2 else "swap"
    if what not in MODES:
        sys.exit(f"probe_round5: unknown mode {what!r}; expected one of {', '.join(MODES)}")
    MODES[what](out_dir)
