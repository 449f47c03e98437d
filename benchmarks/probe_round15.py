"""Round-15 probe (H100): pipeline depth of the decode programs (reports/h100-round15/README.md).

    python benchmarks/probe_round15.py OUT_DIR stages|rule|fused|blocks [WORKLOAD ...]

Offline (Triton 3.6, sm_90a; reports/h100-round15/cpu/) the split kernel's tile loop at 2
stages issues the next step's page-id loads and K/V copies at the end of each step, after its
``p @ v``, and waits for them at the top of the next step: each step pays the block table's and
the KV cache's memory latency in full, one after the other. At 3-4 stages the page ids move one
step earlier but the K/V copies stay one step ahead; from 5 stages the copies are two or more
steps ahead. On a small grid (decode at batch 1-8 with short contexts: one program's chain of
tiles is the time) that latency would be most of the time.

``stages`` (call 1, on commit bd947d7's kernels, whose split plan ran 2 stages): for each workload,
at bf16 and fp16, the default launch (plan ``auto``: the split plan for these batches) against the
same launch with 3, 4, 5, 6 and 8 stages, and with one tile per step at 5 and 8 stages. ``rule``
(call 2, with the split plan's 5 stages the default, now :func:`kernels.config.decode_stages`): the
default against round 14's launches, 2 stages with one and with two tiles per step (at call 2 the
value blocks were still round 14's; from commit f19fe77 on they differ on multi-split grids).
``fused`` (call 2, when the fused plan's rule still gave 3): the fused plan's large-batch decode
(64-row tiles) against 3, 4, 5 and 6 stages (call 2 had no 3-stage cell: 3 was the default).
``blocks``: decode over several splits on small grids (and batch 1 with 1k tokens) at 5 stages with
2, 4 or 8 value blocks and one or two tiles per step.

Each compares the bits of out and LSE against the default (0 expected: stages and tiles per
step schedule loads, not arithmetic) at bf16 and fp16, and at bf16 times every cell (CUDA
graphs, L2 flushed, medians of 20, three repeats interleaved cell by cell). The control
(``split_size=None``: FA2's split count, ``kernels-heuristic``) is timed in the same run, and
its bits are compared too: they differ wherever its split count differs from the fixed one,
which shows that the comparison can fail. Writes
``MODE.jsonl`` after each workload.
"""

from __future__ import annotations

import json
import os
import sys

import torch

import kernels
from benchmarks.probe_round4 import call, save
from benchmarks.probe_round11 import _workload
from benchmarks.probe_round12 import bits_and_times
from invariance.bench import CudaTimer, build_batch

SPLIT_WORKLOADS = ["decode-b1-ctx1k", "decode-b8-ctx1k", "decode-b1-ctx8k", "decode:2kx4",
                   "decode:4kx2", "decode-b8-ctx8k", "decode-b1-ctx32k", "decode-b8-ctx32k",
                   "decode-prod64"]
FUSED_WORKLOADS = ["decode-b64-ctx1k", "decode-b64-ctx8k", "decode-b64-ctx32k",
                   "decode-b256-ctx8k"]
#: Per mode: the plan and the cells, (stages, tiles per step or None for the rule's choice).
MODES = {
    "stages": ("auto", SPLIT_WORKLOADS,
               [(3, None), (4, None), (5, None), (6, None), (8, None), (5, 1), (8, 1)]),
    "rule": ("auto", SPLIT_WORKLOADS, [(2, 1), (2, 2)]),
    "fused": ("auto", FUSED_WORKLOADS, [(3, None), (4, None), (5, None), (6, None)]),
    # (stages, tiles per step, value blocks): the rule's 5 stages with other block counts.
    "blocks": ("auto", ["decode-b1-ctx8k", "decode:2kx4", "decode:4kx2", "decode-b1-ctx1k"],
               [(5, 2, 2), (5, 1, 2), (5, 1, 8), (5, 2, 8), (5, 2, 4)]),
}


def main(out_dir: str, mode: str, specs: list[str]) -> None:
    plan, workloads, cell_specs = MODES[mode]
    os.makedirs(out_dir, exist_ok=True)
    timer = CudaTimer(iters=20, warmup=2)
    rows: list[dict] = []
    for spec in specs or workloads:
        for dtype in (torch.bfloat16, torch.float16):
            batch = build_batch(_workload(spec), dtype=dtype)
            ref = call(batch, plan)
            row: dict = dict(dtype=str(dtype).removeprefix("torch."), workload=spec)
            cells = {}
            candidates = {
                f"s{c[0]}" + ("" if c[1] is None else f"t{c[1]}")
                + ("" if len(c) < 3 else f"v{c[2]}"):
                call(batch, plan, kernels.Tuning(num_stages=c[0], tiles_per_step=c[1],
                                                 value_blocks=c[2] if len(c) > 2 else None))
                for c in cell_specs}
            candidates["control"] = call(batch, plan, split_size=None)
            for name, fn in candidates.items():
                try:  # a probe: a cell that does not compile (shared memory) is recorded
                    fn()
                    cells[name] = fn
                except Exception as exc:
                    row.setdefault("errors", {})[name] = f"{type(exc).__name__}: {str(exc)[:200]}"
            bits_and_times(row, ref, cells, timer, timed=dtype == torch.bfloat16)
            rows.append(row)
            print(json.dumps(row), flush=True)
            del batch
            torch.cuda.empty_cache()
            save(out_dir, f"{mode}.jsonl", rows)


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[2] not in MODES:
        sys.exit(f"usage: probe_round15.py OUT_DIR {'|'.join(MODES)} [WORKLOAD ...]; "
                 f"got {sys.argv[1:]}")
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
