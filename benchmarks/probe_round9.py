"""Round-9 probe (H100): two tiles per loop step in the split kernel against one, in one run
(reports/h100-round9/README.md).

    python benchmarks/probe_round9.py OUT_DIR [pair|vbpair]

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
    {"pair": pair, "vbpair": vbpair}[sys.argv[2] if len(sys.argv) > 2 else "pair"](sys.argv[1])
