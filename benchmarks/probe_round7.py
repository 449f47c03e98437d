"""Round-7 probe (H100): smaller splits for short decode, with the split plan's programs walking
several consecutive splits (reports/h100-round7/README.md).

    python benchmarks/probe_round7.py OUT_DIR spp

``spp``: at split sizes 256 / 512 / 1024 (bit-defining), the decode workloads timed with
``plan="auto"`` (host lengths given, as an engine would) for splits per program 1 / 2 / 4 / 8 /
16 and the rule's own choice, and merge chunks of 8 and 32 partials per step (both bit-neutral),
each compared bit for bit with splits per program 1 and chunk 8 at the same split size.
"""

from __future__ import annotations

import json
import os
import sys

import torch

import kernels
import kernels.attention as attention
from benchmarks.probe_round4 import call, save
from benchmarks.probe_round5 import _bits_vs
from benchmarks.tile_sweep import _graphed as graphed
from invariance.bench import WORKLOADS, CudaTimer, build_batch

DECODE = ["decode-b1-ctx1k", "decode-b1-ctx8k", "decode-b1-ctx32k", "decode-b8-ctx1k",
          "decode-b8-ctx8k", "decode-b8-ctx32k", "decode-prod64", "decode-b64-ctx8k"]


def spp(out_dir):
    timer = CudaTimer(iters=20, warmup=3)
    rows = []
    for name in DECODE:
        batch = build_batch(WORKLOADS[name])
        for split in (256, 512, 1024):
            lens = (batch.q_lens(), batch.kv_lens.tolist())
            lp = kernels.plan_attention(
                batch.q, batch.k_cache, batch.v_cache, batch.cu_seqlens_q, batch.kv_lens,
                batch.block_table, split_size=split, validate=False, host_lens=lens)
            attention._MERGE_CHUNK = 8
            ref = call(batch, "auto", kernels.Tuning(splits_per_program=1), split)()
            for chunk in (8, 32):
                attention._MERGE_CHUNK = chunk
                for k in (None, 1, 2, 4, 8, 16):
                    tuning = kernels.Tuning(splits_per_program=k)
                    d = _bits_vs(ref, call(batch, "auto", tuning, split)())
                    ms = timer.time_fn(graphed(call(batch, "auto", tuning, split)))
                    rows.append(dict(workload=name, split=split, plan=lp.plan, chunk=chunk,
                                     spp=k if k else f"rule={lp.splits_per_program}",
                                     us=round(ms * 1000, 1), bits_differing=d))
                    print(json.dumps(rows[-1]), flush=True)
            del ref
        del batch
        torch.cuda.empty_cache()
    attention._MERGE_CHUNK = 8
    save(out_dir, "spp.jsonl", rows)
    print("\nworkload split plan: fastest (spp, chunk) us | rule chunk 8 | spp 1 chunk 8")
    for name in DECODE:
        for split in (256, 512, 1024):
            rs = [r for r in rows if r["workload"] == name and r["split"] == split]
            best = min(rs, key=lambda r: r["us"])
            rule = next(r for r in rs if str(r["spp"]).startswith("rule") and r["chunk"] == 8)
            one = next(r for r in rs if r["spp"] == 1 and r["chunk"] == 8)
            print(f"{name} {split} {rs[0]['plan']}: ({best['spp']}, {best['chunk']}) "
                  f"{best['us']} | {rule['spp']} {rule['us']} | {one['us']}  differing "
                  f"{sum(r['bits_differing'] for r in rs)}", flush=True)


MODES = {"spp": spp}

if __name__ == "__main__":
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    what = sys.argv[2] if len(sys.argv) > 2 else ""
    if what not in MODES:
        sys.exit(f"probe_round7: unknown mode {what!r}; expected one of {', '.join(MODES)}")
    MODES[what](out_dir)
