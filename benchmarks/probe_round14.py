"""Round-14 probe (H100): schedules of the Gluon prefill kernel (reports/h100-round14/README.md).

    python benchmarks/probe_round14.py OUT_DIR [WORKLOAD ...]

On prefill-like workloads (the bench's prefill-varlen and mixed64 by default, and the lengths
specs of rounds 12-13's probes), the default launch (the Gluon kernel as ``kernels._gluon``'s
switches say) against the launch with each switch of ``SWITCHES`` flipped, and the Triton
fused kernel (``Tuning(gluon=False)``). Bits of out and LSE against the default at bf16 and
fp16, times at bf16 (CUDA graphs, L2 flushed, medians of 20, three repeats interleaved cell by
cell). Writes ``schedules.jsonl`` after each workload.

Calls 1-2 ran it at commit 313f4f5 with the switches ``PAIRS`` and ``PINGPONG``, calls 3-4 at
commit 4bfa49d with ``Q_IN_REGISTERS`` and ``FOLD_IN_SHARED`` (none faster, all taken out),
call 5 at a538536 with ``PAIR_RELEASE`` and ``SPLIT_COUNTER`` (none clearly faster, all taken
out). Where a switch is missing it exits naming it and the commit that has it.
"""

from __future__ import annotations

import sys

import kernels
import kernels._gluon
from benchmarks.probe_round4 import call, patched
from benchmarks.probe_round13 import probe_prefill

#: Module switches of ``kernels._gluon`` flipped together, one cell per tuple (calls 1-2 at
#: commit 313f4f5: ``PINGPONG``, ``PAIRS``; call 3: ``Q_IN_REGISTERS``, which then also moved
#: the fold's acc to shared memory; call 4 at 4bfa49d: ``FOLD_IN_SHARED`` alone and with
#: ``Q_IN_REGISTERS``; call 5 at a538536: these).
SWITCHES = (("PAIR_RELEASE",), ("SPLIT_COUNTER",), ("PAIR_RELEASE", "SPLIT_COUNTER"))
WORKLOADS = ["prefill-varlen", "mixed64", "prefill:4kx8", "decode:8kx32+chunk:256/4kx32"]


def _cells(batch, lp: kernels.LaunchPlan) -> dict:
    cells = {}
    for names in SWITCHES:
        fn = call(batch)
        for name in names:
            fn = patched(fn, kernels._gluon, name, not getattr(kernels._gluon, name))
        cells["+".join(names).lower()] = fn
    cells["triton"] = call(batch, tuning=kernels.Tuning(gluon=False))
    return cells


def main(out_dir: str, specs: list[str]) -> None:
    missing = sorted({name for names in SWITCHES for name in names
                      if not hasattr(kernels._gluon, name)})
    if missing:
        sys.exit(f"probe_round14.py: kernels._gluon has no {missing}; the switches taken out "
                 "in round 14 live at commits 313f4f5 (PAIRS, PINGPONG), 4bfa49d "
                 "(Q_IN_REGISTERS, FOLD_IN_SHARED) and a538536 (PAIR_RELEASE, SPLIT_COUNTER)")
    probe_prefill(out_dir, specs or WORKLOADS, _cells, "schedules.jsonl")


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1].startswith("-"):
        sys.exit(f"usage: probe_round14.py OUT_DIR [WORKLOAD ...]; got {sys.argv[1:]}")
    main(sys.argv[1], sys.argv[2:])
