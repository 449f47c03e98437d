"""Round-18 probe (H100): the Gluon prefill kernel's consumer loop in FA3's order
(reports/h100-round18/README.md).

    python benchmarks/probe_round18.py OUT_DIR [WORKLOAD ...]

FA3's forward loop issues the next tile's scores before it rescales acc, updates the row sum
while ``p @ v`` runs, and hands K and V over by separate pipelines (K released once its scores
are done). The Gluon consumer did the rescale before the next scores, the row sum after
``p @ v``, and released K and V together. Each of these moves only the order of the same
operations on the same values (and the barriers), so the bits must not change; each is a
switch of ``kernels._gluon`` (``RESCALE_LATE``, ``ROWSUM_EARLY``, ``RELEASE_LATE``,
``KV_SPLIT``). On prefill-like workloads (round 14's), the default launch against each
switch set: bits of out and LSE at bf16 and fp16, times at bf16 (CUDA graphs, L2 flushed,
medians of 20, three repeats interleaved cell by cell). Writes ``schedules.jsonl`` after each
workload.
"""

from __future__ import annotations

import sys

import kernels
import kernels._gluon
from benchmarks.probe_round4 import call, patched
from benchmarks.probe_round13 import probe_prefill

SWITCH_NAMES = ("RESCALE_LATE", "ROWSUM_EARLY", "RELEASE_LATE", "KV_SPLIT")
#: Switch sets flipped on together, one cell per tuple.
SWITCHES = (("RESCALE_LATE",), ("ROWSUM_EARLY",), ("RELEASE_LATE",), ("KV_SPLIT",),
            ("RESCALE_LATE", "ROWSUM_EARLY"), ("RESCALE_LATE", "ROWSUM_EARLY", "KV_SPLIT"),
            SWITCH_NAMES)
WORKLOADS = ["prefill-varlen", "mixed64", "prefill:4kx8", "decode:8kx32+chunk:256/4kx32"]


def _cells(batch, lp: kernels.LaunchPlan) -> dict:
    cells = {}
    for names in SWITCHES:
        fn = call(batch)
        for name in names:
            fn = patched(fn, kernels._gluon, name, True)
        cells["+".join(names).lower()] = fn
    return cells


def main(out_dir: str, specs: list[str]) -> None:
    missing = [name for name in SWITCH_NAMES if not hasattr(kernels._gluon, name)]
    if missing:
        sys.exit(f"probe_round18.py: kernels._gluon has no {missing}")
    on = [name for name in SWITCH_NAMES if getattr(kernels._gluon, name)]
    if on:
        sys.exit(f"probe_round18.py: the default must have every switch off, got {on} on")
    probe_prefill(out_dir, specs or WORKLOADS, _cells, "schedules.jsonl")


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1].startswith("-"):
        sys.exit(f"usage: probe_round18.py OUT_DIR [WORKLOAD ...]; got {sys.argv[1:]}")
    main(sys.argv[1], sys.argv[2:])
