"""Round-13 probe (H100): the Gluon prefill kernel's bit-neutral settings
(reports/h100-round13/README.md).

    python benchmarks/probe_round13.py OUT_DIR [WORKLOAD ...]

On prefill-like workloads (the bench's prefill-varlen and mixed64 by default, and the lengths
specs of round 12's flat-loop probe), the default launch (the Gluon kernel, a ring of
``kernels._gluon.RING_SLOTS`` = 4 K/V slots, the plan's slot order) against: the Triton fused
kernel (``Tuning(gluon=False)``), rings of 2, 3 and 5 slots, and the other slot order. Bits of
out and LSE against the default at bf16 and fp16, times at bf16 (CUDA graphs, L2 flushed,
medians of 20, three repeats interleaved cell by cell). Writes ``gluon.jsonl`` after each
workload.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable

import torch

import kernels
import kernels._gluon
from benchmarks.probe_round4 import call, patched, save
from benchmarks.probe_round11 import _workload
from benchmarks.probe_round12 import bits_and_times
from invariance.bench import CudaTimer, build_batch

WORKLOADS = ["prefill-varlen", "mixed64", "prefill:4kx8", "decode:8kx32+chunk:256/4kx32",
             "chunk:1k/16kx4+prefill:1kx12"]


def _ring(fn: Callable[[], object], slots: int) -> Callable[[], object]:
    """``fn`` with the Gluon kernel's ring at ``slots`` slots while it launches."""
    return patched(fn, kernels._gluon, "RING_SLOTS", slots)


def probe_prefill(out_dir: str, specs: list[str],
                  cells_of: Callable[[object, kernels.LaunchPlan], dict], name: str) -> None:
    """For each workload (``specs``) at bf16 and fp16: the default launch and the cells
    ``cells_of(batch, plan)`` returns, bits against the default and (bf16) times, one JSON row
    per workload and dtype, printed and saved to ``out_dir/name`` after each."""
    timer = CudaTimer(iters=20, warmup=2)
    rows: list[dict] = []
    for spec in specs:
        for dtype in (torch.bfloat16, torch.float16):
            batch = build_batch(_workload(spec), dtype=dtype)
            lens = (batch.q_lens(), batch.kv_lens.tolist())
            lp = kernels.plan_attention(batch.q, batch.k_cache, batch.v_cache,
                                        batch.cu_seqlens_q, batch.kv_lens, batch.block_table,
                                        validate=False, host_lens=lens)
            ref = call(batch)
            cells = cells_of(batch, lp)
            row = dict(dtype=str(dtype).removeprefix("torch."), workload=spec, plan=lp.plan,
                       gluon=lp.gluon, slot_order=lp.slot_order)
            bits_and_times(row, ref, cells, timer, timed=dtype == torch.bfloat16)
            rows.append(row)
            print(json.dumps(row), flush=True)
            del batch
            torch.cuda.empty_cache()
            save(out_dir, name, rows)


def _cells(batch, lp: kernels.LaunchPlan) -> dict:
    return {"triton": call(batch, tuning=kernels.Tuning(gluon=False)),
            **{f"ring{n}": _ring(call(batch), n) for n in (2, 3, 5)},
            "slot_order_flipped": call(batch, tuning=kernels.Tuning(
                slot_order=not lp.slot_order))}


def main(out_dir: str, specs: list[str]) -> None:
    probe_prefill(out_dir, specs or WORKLOADS, _cells, "gluon.jsonl")


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1].startswith("-"):
        sys.exit(f"usage: probe_round13.py OUT_DIR [WORKLOAD ...]; got {sys.argv[1:]}")
    main(sys.argv[1], sys.argv[2:])
