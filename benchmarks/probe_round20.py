"""Round-20 probe (H100): the 128-key contract in the package (reports/h100-round20/README.md).

    python benchmarks/probe_round20.py OUT_DIR bits [WORKLOAD ...]
    python benchmarks/probe_round20.py OUT_DIR times [WORKLOAD ...]
    python benchmarks/probe_round20.py OUT_DIR plans [WORKLOAD ...]

``bits``: for each workload at bf16 and fp16, out and LSE of every 128-key kernel path against
the default launch (``plan="auto"``): the Gluon kernels in the fused and the split plan, the
Triton kernels (``Tuning(gluon=False)``) in both plans, and the 64-key contract
(``Tuning(block_n=64)``), which must differ (the control: the comparison can fail). Into
``bits.jsonl``.

``times``: at bf16, CUDA-graph replays with L2 flushed (medians of 20), interleaved in
``REPEATS`` repeats: the default (128 keys), the 64-key contract (rounds 13-19's default), and
the 128-key default's fused and split plans forced. Into ``times.jsonl``; the ratio of each
cell to the 64-key contract is the median of the per-repeat ratios.

``plans``: the same timing of the 128-key default's fused and split plans (forced) on decode
batches of 2-16 requests, where ``plan="auto"``'s rule (split below one program per SM, from the
Triton kernels' measurements) may not suit the Gluon kernels. Into ``plans.jsonl``.
"""

from __future__ import annotations

import json
import os
import statistics
import sys

import torch

import kernels
from benchmarks.probe_round4 import call, time_interleaved
from benchmarks.probe_round5 import _bits_vs
from benchmarks.probe_round11 import _workload
from benchmarks.tile_sweep import _graphed as graphed
from invariance.bench import CudaTimer, build_batch

WORKLOADS = ["decode-b1-ctx1k", "decode-b8-ctx1k", "decode-b64-ctx1k", "decode-b1-ctx8k",
             "decode-b8-ctx8k", "decode-b64-ctx8k", "decode-b1-ctx32k", "decode-b8-ctx32k",
             "decode-prod64", "mixed64", "prefill-varlen", "prefill:4kx8"]
BITS_WORKLOADS = ["decode-b1-ctx1k", "decode-b8-ctx8k", "decode-prod64", "mixed64",
                  "prefill:1000,3001,17,130"]
PLAN_WORKLOADS = ["decode:8kx2", "decode:8kx4", "decode:8kx8", "decode:8kx16", "decode:32kx2",
                  "decode:32kx4", "decode:2kx4", "decode:2kx8", "decode:2kx16", "decode:1kx8",
                  "decode:1kx16", "decode:4kx16", "decode:16kx8"]
REPEATS = 7
N64 = kernels.Tuning(block_n=64)
#: ``bits``' cells against the default launch: (plan, tuning).
BIT_CELLS = {"gluon-fused": ("fused", kernels.Tuning(gluon=True)),
             "gluon-split": ("split", kernels.Tuning(gluon=True)),
             "triton-fused": ("fused", kernels.Tuning(gluon=False)),
             "triton-split": ("split", kernels.Tuning(gluon=False)),
             "control-64-keys": ("auto", N64)}
#: ``times``' cells: (plan, tuning).
TIME_CELLS = {"keys64": ("auto", N64), "default": ("auto", None), "fused": ("fused", None),
              "split": ("split", None)}


def _record(rows: list[dict], row: dict, out_dir: str, name: str) -> None:
    rows.append(row)
    print(json.dumps(row), flush=True)
    with open(os.path.join(out_dir, name), "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


def bits(out_dir: str, specs: list[str], cells: dict = BIT_CELLS, name: str = "bits.jsonl",
         defaults: list[str] = BITS_WORKLOADS, make=call) -> None:
    """Out and LSE of each of ``cells`` against the default launch, in differing bits, on each
    workload (``specs``, else ``defaults``) at bf16 and fp16, into ``out_dir/name``; each
    cell's call built by ``make(batch, plan, tuning)``."""
    rows: list[dict] = []
    for spec in specs or defaults:
        for dtype in (torch.bfloat16, torch.float16):
            batch = build_batch(_workload(spec), dtype=dtype)
            ref = call(batch)()
            lp = kernels.plan_attention(batch.q, batch.k_cache, batch.v_cache, batch.cu_seqlens_q,
                                        batch.kv_lens, batch.block_table)
            row: dict = dict(dtype=str(dtype).removeprefix("torch."), workload=spec,
                             default=dict(plan=lp.plan, gluon=lp.gluon, block_n=lp.block_n))
            row["bits_differing"] = {cell: _bits_vs(ref, make(batch, plan, tuning)())
                                     for cell, (plan, tuning) in cells.items()}
            del batch
            _record(rows, row, out_dir, name)


def times(out_dir: str, specs: list[str], cells: dict = TIME_CELLS, base: str = "keys64",
          name: str = "times.jsonl", defaults: list[str] = WORKLOADS, repeats: int = REPEATS,
          make=call) -> None:
    """``cells`` timed interleaved on each workload (``specs``, else ``defaults``), each against
    the ``base`` cell, into ``out_dir/name``; ``repeats`` interleaved repeats, each cell's call
    built by ``make(batch, plan, tuning)``."""
    timer = CudaTimer(iters=20, warmup=2)
    rows: list[dict] = []
    for spec in specs or defaults:
        batch = build_batch(_workload(spec), dtype=torch.bfloat16)
        row: dict = dict(dtype="bfloat16", workload=spec)
        graphs = [(cell, graphed(make(batch, plan, tuning)))
                  for cell, (plan, tuning) in cells.items()]
        time_interleaved(row, graphs, timer, repeats=repeats)
        for cell in cells:
            if cell != base:
                ratios = [x / d for x, d in zip(row[f"us_{cell}"], row[f"us_{base}"], strict=True)]
                row[f"{cell}/{base}"] = round(statistics.median(ratios), 4)
        row["median_us"] = {cell: statistics.median(row[f"us_{cell}"]) for cell in cells}
        del batch, graphs
        _record(rows, row, out_dir, name)


def main() -> None:
    if len(sys.argv) < 3 or sys.argv[2] not in ("bits", "times", "plans"):
        sys.exit("usage: python benchmarks/probe_round20.py OUT_DIR bits|times|plans "
                 "[WORKLOAD ...]")
    out_dir, step, specs = sys.argv[1], sys.argv[2], sys.argv[3:]
    os.makedirs(out_dir, exist_ok=True)
    if step == "bits":
        bits(out_dir, specs)
    elif step == "times":
        times(out_dir, specs)
    else:
        times(out_dir, specs, cells={"split": ("split", None), "fused": ("fused", None)},
              base="split", name="plans.jsonl", defaults=PLAN_WORKLOADS)


if __name__ == "__main__":
    main()
