"""Round-12 probe (H100): the fused plan's flat loop with two tiles per step, and 3 stages for
large-batch decode (reports/h100-round12/README.md).

    python benchmarks/probe_round12.py OUT_DIR flat|decode|split|mmav2 [WORKLOAD ...]

Offline (Triton 3.6, sm_90) the nested loop drains its software pipeline at the end of every
split (``async_wait 0`` after each inner loop): the loads of a split's first tiles are issued
only after the previous split's fold. A flat loop over the row's tiles keeps one pipeline across
split boundaries (its fold under an ``if`` after the pair of tiles that ends a split, which
Triton's pipeliner accepts). Rounds 1-10 walked the flat loop one tile per step; round 11
measured two tiles per step in the nested loop only. The same operations in the same order per
row either way (the CPU test of commit f2f3cb3 compared the bits).

``flat`` ran at commit f2f3cb3, whose launcher took ``Tuning(nested_loop=False,
tiles_per_step=2)`` (a temporary switch, removed after the call: it was slower); on later
commits the flat loop walks one tile per step whatever ``tiles_per_step`` says, so ``flat``
measures that instead. ``flat``: prefill-like workloads, the default launch (128 rows on 8
warps, 3 stages, nested, two tiles per step, K rows) against the flat loop with two tiles per
step (K rows, 3 or 4 stages; K columns, 3 stages).

``decode``: large-batch decode on the fused plan (64-row tiles, flat loop) with 3 and 4 stages
against the default 2 (round 11: 3 stages 1.0-2.2% faster; the rule since, so on later commits
the default is 3). For both: bits of out and LSE against the default at bf16 (every cell) and
fp16 (``FP16``), times at bf16 (CUDA graphs, L2 flushed, medians of 20, three repeats
interleaved cell by cell). Writes ``flat.jsonl`` / ``decode.jsonl`` after each workload
(probe_round11's ``fused``).

``split``: decode on the split plan (the ``auto`` pick for batches of 1-8 and decode-prod64)
with 3 and 4 stages against its default launch (2 stages; value blocks and tiles per step by
the rules). Bits at bf16 and fp16, times at bf16 (three repeats, interleaved). Writes
``split.jsonl``.

``mmav2`` (run with ``DISABLE_MMA_V3=1``, Triton's process-wide switch that compiles every
``tl.dot`` to ``mma.sync`` instead of ``wgmma`` on Hopper): a lead, not a launch option. The
fused plan under several tiles against the default tiling, all on ``mma.sync`` (do the tiles
agree bit for bit there too?), times at bf16 to set against the ``wgmma`` default of ``flat``.
Writes ``mmav2.jsonl``.
"""

from __future__ import annotations

import json
import sys

import torch

import kernels
from benchmarks.probe_round4 import call, save, time_interleaved
from benchmarks.probe_round5 import _bits_vs
from benchmarks.probe_round11 import _workload, fused
from benchmarks.tile_sweep import _graphed as graphed
from invariance.bench import CudaTimer, build_batch

FLAT_WORKLOADS = ["prefill-varlen", "mixed64", "prefill:4kx8", "decode:8kx32+chunk:256/4kx32",
                  "chunk:1k/16kx4+prefill:1kx12"]
#: (block_m, warps, stages, nested, tiles per step[, "krows"]); None: the default launch.
FLAT_CELLS: list = [None, (128, 8, 3, False, 2, "krows"), (128, 8, 4, False, 2, "krows"),
                    (128, 8, 3, False, 2), (128, 8, 3, True, 2, "krows")]
DECODE_WORKLOADS = ["decode-b64-ctx1k", "decode-b64-ctx8k", "decode-b64-ctx32k",
                    "decode-b256-ctx8k", "decode-b8-ctx32k"]
DECODE_CELLS: list = [None, (64, 4, 3, False, 1), (64, 4, 4, False, 1)]
MMAV2_WORKLOADS = ["prefill-varlen", "mixed64", "decode-b64-ctx8k"]
MMAV2_CELLS: list = [None, (128, 8, 3, True, 1, "krows"), (128, 8, 2, True, 1, "krows"),
                     (128, 4, 2, False, 1), (64, 4, 2, False, 1), (64, 4, 3, False, 1, "krows")]
FP16 = [(128, 8, 3, False, 2, "krows"), (128, 8, 4, False, 2, "krows"), (64, 4, 3, False, 1)]

SPLIT_WORKLOADS = ["decode-b1-ctx32k", "decode-b8-ctx8k", "decode-b8-ctx32k", "decode-prod64",
                   "decode-b1-ctx8k", "decode-b8-ctx1k", "decode-b1-ctx1k"]
SPLIT_STAGES = [3, 4]


def bits_and_times(row: dict, ref, cells: dict, timer, timed: bool) -> None:
    """Into ``row``: the bits of each cell's out and LSE differing from ``ref``'s
    (``bits_differing``), and with ``timed`` the default's and each cell's times (CUDA graphs,
    :func:`time_interleaved`)."""
    ref_out = ref()
    row["bits_differing"] = {name: _bits_vs(ref_out, fn()) for name, fn in cells.items()}
    if timed:
        graphs = [("default", graphed(ref))] + [(n, graphed(f)) for n, f in cells.items()]
        time_interleaved(row, graphs, timer)


def split(out_dir: str, specs: list[str]) -> None:
    timer = CudaTimer(iters=20, warmup=2)
    rows: list[dict] = []
    for spec in specs or SPLIT_WORKLOADS:
        for dtype in (torch.bfloat16, torch.float16):
            batch = build_batch(_workload(spec), dtype=dtype)
            ref = call(batch, "split")
            cells = {f"stages{n}": call(batch, "split", kernels.Tuning(num_stages=n))
                     for n in SPLIT_STAGES}
            row = dict(dtype=str(dtype).removeprefix("torch."), workload=spec)
            bits_and_times(row, ref, cells, timer, timed=dtype == torch.bfloat16)
            rows.append(row)
            print(json.dumps(row), flush=True)
            del batch
            torch.cuda.empty_cache()
            save(out_dir, "split.jsonl", rows)


if __name__ == "__main__":
    modes = {
        "flat": lambda out, specs: fused(out, specs or FLAT_WORKLOADS, lambda s: FLAT_CELLS,
                                         FP16, "flat.jsonl"),
        "decode": lambda out, specs: fused(out, specs or DECODE_WORKLOADS,
                                           lambda s: DECODE_CELLS, FP16, "decode.jsonl"),
        "split": split,
        "mmav2": lambda out, specs: fused(out, specs or MMAV2_WORKLOADS, lambda s: MMAV2_CELLS,
                                          [], "mmav2.jsonl"),
    }
    if len(sys.argv) < 3 or sys.argv[2] not in modes:
        sys.exit(f"usage: probe_round12.py OUT_DIR flat|decode|split|mmav2 [WORKLOAD ...]; "
                 f"got {sys.argv[1:]}")
    modes[sys.argv[2]](sys.argv[1], sys.argv[3:])
