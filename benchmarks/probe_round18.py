"""Round-18 probe (H100): the Gluon prefill kernel's consumer loop in FA3's order
(reports/h100-round18/README.md).

    python benchmarks/probe_round18.py OUT_DIR [WORKLOAD ...]

FA3's forward loop issues the next tile's scores before it rescales acc, updates the row sum
while ``p @ v`` runs, and hands K and V over by separate pipelines (K released once its scores
are done). The Gluon consumer did the rescale before the next scores, the row sum after
``p @ v``, and released K and V together. Each of these moves only the order of the same
operations on the same values (and the barriers), so the bits must not change; each is a
switch of ``kernels._gluon`` (``SWITCH_NAMES``). Call 1 flipped ``CALL1``'s sets; the SASS
then showed ptxas placing the ``p @ v`` wait ahead of the next tile's exponentials in every
build, so call 3 flips ``CALL3``'s, which keep them ahead of the wait. None was faster, and
the switches were taken out again: this script runs at commit 9e63351 (call 1's four switches
also at 1324497) and, elsewhere, exits naming those commits.

On prefill-like workloads (round 14's), the default launch against each switch set: bits of
out and LSE at bf16 and fp16, times at bf16 (CUDA graphs, L2 flushed, medians of 20, three
repeats interleaved cell by cell). Writes ``schedules.jsonl`` after each workload.
"""

from __future__ import annotations

import sys

import kernels
import kernels._gluon
from benchmarks.probe_round13 import probe_prefill
from benchmarks.probe_round14 import switch_cells

SWITCH_NAMES = ("RESCALE_LATE", "ROWSUM_EARLY", "RELEASE_LATE", "KV_SPLIT", "KEEP_P", "EXP_FIRST",
                "EXP_FENCE", "K_AFTER_EXP")
#: Call 1's switch sets (one cell per tuple): FA3's order, each move alone and together.
CALL1 = (("RESCALE_LATE",), ("ROWSUM_EARLY",), ("RELEASE_LATE",), ("KV_SPLIT",),
         ("RESCALE_LATE", "ROWSUM_EARLY"), ("RESCALE_LATE", "ROWSUM_EARLY", "KV_SPLIT"),
         ("RESCALE_LATE", "ROWSUM_EARLY", "RELEASE_LATE", "KV_SPLIT"))
#: The sets that keep the next tile's exponentials ahead of the ``p @ v`` wait in the SASS
#: (reports/h100-round18/cpu/): K released under a branch after them (a block boundary ptxas
#: does not hoist the wait across), the weights passed through the wait.
OVERLAP = ("KV_SPLIT", "K_AFTER_EXP", "EXP_FIRST", "ROWSUM_EARLY")
#: Call 3's: the overlap, with the rescale or the V release moved too, without EXP_FIRST, and
#: K's release moved alone (the exponentials after the wait: the control for the branch).
CALL3 = (OVERLAP, (*OVERLAP, "RESCALE_LATE"), (*OVERLAP, "RELEASE_LATE"),
         ("KV_SPLIT", "K_AFTER_EXP", "ROWSUM_EARLY"), ("KV_SPLIT", "K_AFTER_EXP"))
SWITCHES = CALL3
WORKLOADS = ["prefill-varlen", "mixed64", "prefill:4kx8", "decode:8kx32+chunk:256/4kx32"]


def _cells(batch, lp: kernels.LaunchPlan) -> dict:
    # Every switch is off by default (main checks), so flipping one turns it on.
    return switch_cells(batch, SWITCHES)


def main(out_dir: str, specs: list[str]) -> None:
    missing = [name for name in SWITCH_NAMES if not hasattr(kernels._gluon, name)]
    if missing:
        sys.exit(f"probe_round18.py: kernels._gluon has no {missing}; round 18 took its "
                 "switches out again: call 1's four live at commit 1324497, all eight at "
                 "9e63351 (reports/h100-round18/README.md)")
    on = [name for name in SWITCH_NAMES if getattr(kernels._gluon, name)]
    if on:
        sys.exit(f"probe_round18.py: the default must have every switch off, got {on} on")
    probe_prefill(out_dir, specs or WORKLOADS, _cells, "schedules.jsonl")


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1].startswith("-"):
        sys.exit(f"usage: probe_round18.py OUT_DIR [WORKLOAD ...]; got {sys.argv[1:]}")
    main(sys.argv[1], sys.argv[2:])
