"""Round-9 probe (H100): two tiles per loop step in the split kernel against one, in one run
(reports/h100-round9/README.md).

    python benchmarks/probe_round9.py OUT_DIR [pair|vbpair|mixsplit]

``pair``: the split kernel walking its fully visible tiles two per loop step
(``Tuning(tiles_per_step=2)``: both tiles' loads, scores and exponentials ahead of the first
tile's ``p @ v``; the same arithmetic per row), with the value-block rule and with one block,
two or one pipeline stages (``t2-s1`` changes both). Bits of out and LSE of each two-tile cell
against one tile per step with the same blocks (the ``reference`` rows) at bf16 and fp16 on
decode workloads and mixed64 (split plan), times (bf16) on the first seven. Writes
``pair.jsonl``.

``vbpair``: two tiles per step with 1, 2 or 4 V column blocks and the rules' pick on the short
decodes (bf16), bits against one tile and one block, each timed three times, interleaved.
Writes ``vbpair.jsonl``.

``mixsplit``: mixed64 as one call (128-row tiles for every request) against its decodes and its
prefill chunks as two calls in one CUDA graph (each class with its own tiles and plan), bits of
each sub-batch's rows against the same rows of the one call, times (bf16). A lead for a
two-class launch, not a kernel change. Writes ``mixsplit.jsonl``.

Calls 1-3 of round 9 ran this script's first version on the experiment commit 064f77a
(``git show 064f77a:benchmarks/probe_round9.py``), where an environment variable switched the
tiles per step (1, 2 or 4) and ``foldmem`` timed the fused kernel's running fold kept in memory;
neither variable exists after it. In their ``pair.jsonl`` and ``foldmem.jsonl`` the rows of the
references (``t1``, ``t1-vb1``; ``fold_in_memory: false``) compare a rerun with the reference
(run-to-run repeats), not two settings.
"""

from __future__ import annotations

import json
import sys

import torch

import kernels
from benchmarks.probe_round4 import call, save
from benchmarks.probe_round5 import _bits_vs
from benchmarks.tile_sweep import _graphed as graphed
from invariance.bench import WORKLOADS, CudaTimer, build_batch

PAIR_WORKLOADS = ["decode-b1-ctx1k", "decode-b8-ctx1k", "decode-b1-ctx8k", "decode-b8-ctx8k",
                  "decode-b1-ctx32k", "decode-b8-ctx32k", "decode-prod64", "decode-b64-ctx1k",
                  "mixed64"]
PAIR_TIMED = PAIR_WORKLOADS[:7]
#: (label, tiles per step, Tuning fields)
PAIR_CELLS = [("t1", 1, {}), ("t2", 2, {}), ("t2-s1", 2, {"num_stages": 1}),
              ("t1-vb1", 1, {"value_blocks": 1}), ("t2-vb1", 2, {"value_blocks": 1})]


def vbpair(out_dir: str) -> None:
    """Two tiles per step with 1, 2 or 4 V column blocks on the short decodes, each timed three
    times, interleaved (the rule's pick vs 4 blocks at batch 1 with 8k tokens)."""
    timer = CudaTimer(iters=30, warmup=3)
    rows = []
    for name in PAIR_WORKLOADS[:3]:
        batch = build_batch(WORKLOADS[name])
        ref = call(batch, "split", kernels.Tuning(tiles_per_step=1, value_blocks=1))()
        cells = [("auto", kernels.Tuning())] + [
            (f"t2-vb{vb}", kernels.Tuning(tiles_per_step=2, value_blocks=vb)) for vb in (1, 2, 4)]
        for rep in range(3):
            for label, tuning in cells:
                fn = call(batch, "split", tuning)
                row = dict(workload=name, config=label, rep=rep,
                           bits_differing=_bits_vs(ref, fn()),
                           us=round(timer.time_fn(graphed(fn)) * 1000, 1))
                rows.append(row)
                print(json.dumps(row), flush=True)
        save(out_dir, "vbpair.jsonl", rows)


def _subset(batch, idx):
    """The requests ``idx`` of ``batch`` as a batch of their own (the same caches and pages),
    and the rows of the full batch's q they take."""
    from invariance import AttentionBatch

    cu = batch.cu_seqlens_q.tolist()
    rows = torch.cat([torch.arange(cu[i], cu[i + 1], device=batch.q.device) for i in idx])
    q_lens = [cu[i + 1] - cu[i] for i in idx]
    sub_cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32,
                          device=batch.q.device)
    ix = torch.tensor(idx, device=batch.q.device)
    sub = AttentionBatch(q=batch.q[rows].contiguous(), k_cache=batch.k_cache,
                         v_cache=batch.v_cache, cu_seqlens_q=sub_cu,
                         kv_lens=batch.kv_lens[ix].contiguous(),
                         block_table=batch.block_table[ix].contiguous(), sm_scale=batch.sm_scale)
    return sub, rows


def mixsplit(out_dir: str) -> None:
    timer = CudaTimer(iters=30, warmup=3)
    batch = build_batch(WORKLOADS["mixed64"])
    q_lens = batch.q_lens()
    dec_idx = [i for i, n in enumerate(q_lens) if n == 1]
    pre_idx = [i for i, n in enumerate(q_lens) if n > 1]
    dec, dec_rows = _subset(batch, dec_idx)
    pre, pre_rows = _subset(batch, pre_idx)
    full = call(batch)()
    rows = []
    for label, part, part_rows in (("decodes", dec, dec_rows), ("prefills", pre, pre_rows)):
        for plan in ("auto", "fused", "split"):
            if label == "prefills" and plan == "split":
                continue  # its workspace would be T x Hq x splits x D floats
            out, lse = call(part, plan)()
            lp = kernels.plan_attention(part.q, part.k_cache, part.v_cache, part.cu_seqlens_q,
                                        part.kv_lens, part.block_table, plan=plan,
                                        validate=False,
                                        host_lens=(part.q_lens(), part.kv_lens.tolist()))
            row = dict(workload="mixed64", part=label, plan=plan, launch=dict(
                plan=lp.plan, block_m=lp.block_m, num_warps=lp.num_warps,
                value_blocks=lp.value_blocks, tiles_per_step=lp.tiles_per_step),
                bits_differing_vs_one_call=_bits_vs((full[0][part_rows], full[1][part_rows]),
                                                    (out, lse)),
                us=round(timer.time_fn(graphed(call(part, plan))) * 1000, 1))
            rows.append(row)
            print(json.dumps(row), flush=True)

    def both(dec_plan):
        d, p = call(dec, dec_plan), call(pre)
        return lambda: (d(), p())

    for dec_plan in ("auto", "fused"):
        row = dict(workload="mixed64", part=f"decodes ({dec_plan}) then prefills (auto)",
                   us=round(timer.time_fn(graphed(both(dec_plan))) * 1000, 1))
        rows.append(row)
        print(json.dumps(row), flush=True)
    row = dict(workload="mixed64", part="one call (auto)",
               us=round(timer.time_fn(graphed(call(batch))) * 1000, 1))
    rows.append(row)
    print(json.dumps(row), flush=True)
    save(out_dir, "mixsplit.jsonl", rows)


def pair(out_dir: str) -> None:
    timer = CudaTimer(iters=30, warmup=3)
    rows = []
    for dtype in (torch.bfloat16, torch.float16):
        for name in PAIR_WORKLOADS:
            batch = build_batch(WORKLOADS[name], dtype=dtype)
            refs = {}
            for label, tps, fields in PAIR_CELLS:
                tuning = kernels.Tuning(tiles_per_step=tps, **fields)
                key = fields.get("value_blocks")
                got = call(batch, "split", tuning)()
                row = dict(dtype=str(dtype).removeprefix("torch."), workload=name, config=label)
                if tps == 1:  # the reference of the cells after it: no comparison
                    refs[key] = got
                    row["reference"] = True
                else:
                    row["bits_differing"] = _bits_vs(refs[key], got)
                if dtype == torch.bfloat16 and name in PAIR_TIMED:
                    row["us"] = round(timer.time_fn(graphed(call(batch, "split", tuning))) * 1000,
                                      1)
                rows.append(row)
                print(json.dumps(row), flush=True)
            del batch, refs
            torch.cuda.empty_cache()
            save(out_dir, "pair.jsonl", rows)


if __name__ == "__main__":
    modes = {"pair": pair, "vbpair": vbpair, "mixsplit": mixsplit}
    if len(sys.argv) not in (2, 3) or (len(sys.argv) == 3 and sys.argv[2] not in modes):
        sys.exit(f"usage: probe_round9.py OUT_DIR [{'|'.join(modes)}]; got {sys.argv[1:]}")
    modes[sys.argv[2] if len(sys.argv) == 3 else "pair"](sys.argv[1])
