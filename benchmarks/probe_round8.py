"""Round-8 probe (H100): BLOCK_N 128 instead of 64 (bit-defining), with the bit-neutral launch
settings swept for it, against the default launch in the same run (reports/h100-round8/README.md).

    python benchmarks/probe_round8.py OUT_DIR [blockn|vblocks]

``vblocks``: the split plan with the V columns cut into 1, 2 or 4 programs per (slot, KV head,
split) (``Tuning(value_blocks=...)``), bits of out and LSE against 1 at float16 and bfloat16 on
the decode workloads and mixed64, and the time of each on the short-decode workloads (bf16).
Writes ``vblocks.jsonl``.

``blockn`` (the default):

Round 4 measured BLOCK_N 128 with the default warps and stages only (prefill and mixed 10-15%
faster, large-batch decode 8-25% slower). Here the bench workloads are timed (CUDA-graph
replays after an L2 flush, median of 20), the ones that miss their targets first, with the
default launch and with BLOCK_N 128 at the batch's own warps and stages (``batch_tuning``), 8
warps, one stage, or both (BLOCK_M from ``batch_tuning``, plan ``auto`` with host lengths); a
setting that does not compile (shared memory) is recorded as such. Writes
``blockn.jsonl`` and prints one JSON line per cell, then the registers and spills of the
compiled kernels.
"""

from __future__ import annotations

import json
import sys

import torch

import kernels
from benchmarks.probe_round4 import call, save
from benchmarks.probe_round6 import _compiled
from benchmarks.tile_sweep import _graphed as graphed
from invariance.bench import WORKLOADS, CudaTimer, build_batch

#: (label, Tuning fields besides block_n=128)
SETTINGS = [("bn128", {}), ("bn128-s1", {"num_stages": 1}), ("bn128-w8", {"num_warps": 8}),
            ("bn128-w8-s1", {"num_warps": 8, "num_stages": 1})]
FIRST = ["prefill-varlen", "mixed64", "decode-b1-ctx1k", "decode-b8-ctx1k", "decode-b64-ctx8k",
         "decode-prod64", "decode-b1-ctx32k", "decode-b1-ctx8k"]


def blockn(out_dir: str) -> None:
    from kernels._triton import attention_kernels as ak

    timer = CudaTimer(iters=20, warmup=3)
    rows = []
    for name in FIRST + [w for w in WORKLOADS if w not in FIRST]:
        batch = build_batch(WORKLOADS[name])
        cells = [("default", None)] + [
            (label, kernels.Tuning(block_n=128, **fields)) for label, fields in SETTINGS]
        for label, tuning in cells:
            row = dict(workload=name, config=label)
            try:
                row["us"] = round(timer.time_fn(graphed(call(batch, "auto", tuning))) * 1000, 1)
            except Exception as e:  # a setting that does not fit (shared memory), recorded
                row["error"] = f"{type(e).__name__}: {str(e)[:160]}"
                torch.cuda.synchronize()
            rows.append(row)
            print(json.dumps(row), flush=True)
        del batch
        torch.cuda.empty_cache()
        save(out_dir, "blockn.jsonl", rows)  # after every workload: a timeout keeps the rest
    for fn in ("_unified_attention_fused_kernel", "_unified_attention_split_kernel"):
        rows.append(dict(kernel=fn, compiled=_compiled(getattr(ak, fn))))
        print(json.dumps(rows[-1]), flush=True)
    save(out_dir, "blockn.jsonl", rows)


VB_WORKLOADS = ["decode-b1-ctx1k", "decode-b1-ctx8k", "decode-b8-ctx1k", "decode-b8-ctx8k",
                "decode-b1-ctx32k", "decode-b64-ctx1k", "decode-prod64", "mixed64"]
VB_TIMED = VB_WORKLOADS[:5]


def vblocks(out_dir: str) -> None:
    from benchmarks.probe_round5 import _bits_vs

    timer = CudaTimer(iters=30, warmup=3)
    rows = []
    for dtype in (torch.bfloat16, torch.float16):
        for name in VB_WORKLOADS:
            batch = build_batch(WORKLOADS[name], dtype=dtype)
            ref = call(batch, "split", kernels.Tuning(value_blocks=1))()
            for vb in (1, 2, 4):
                tuning = kernels.Tuning(value_blocks=vb)
                row = dict(dtype=str(dtype).removeprefix("torch."), workload=name,
                           value_blocks=vb,
                           bits_differing=_bits_vs(ref, call(batch, "split", tuning)()))
                if dtype == torch.bfloat16 and name in VB_TIMED:
                    row["us"] = round(timer.time_fn(graphed(call(batch, "split", tuning))) * 1000,
                                      1)
                rows.append(row)
                print(json.dumps(row), flush=True)
            lp = kernels.plan_attention(batch.q, batch.k_cache, batch.v_cache,
                                        batch.cu_seqlens_q, batch.kv_lens, batch.block_table,
                                        validate=False,
                                        host_lens=(batch.q_lens(), batch.kv_lens.tolist()))
            rows.append(dict(dtype=str(dtype).removeprefix("torch."), workload=name,
                             auto=dict(plan=lp.plan, value_blocks=lp.value_blocks)))
            print(json.dumps(rows[-1]), flush=True)
            del batch
            torch.cuda.empty_cache()
        save(out_dir, "vblocks.jsonl", rows)


if __name__ == "__main__":
    {"blockn": blockn, "vblocks": vblocks}[sys.argv[2] if len(sys.argv) > 2 else "blockn"](
        sys.argv[1])
