"""Round-14 probe (H100): schedules of the Gluon prefill kernel (reports/h100-round14/README.md).

    python benchmarks/probe_round14.py OUT_DIR [WORKLOAD ...]

On prefill-like workloads (``WORKLOADS`` by default: the bench's prefill-varlen and mixed64 and
two lengths specs of rounds 12-13's probes), the default launch (the Gluon kernel as
``kernels._gluon``'s switches say) against the launch with each switch of ``SWITCHES`` flipped,
and the Triton fused kernel (``Tuning(gluon=False)``). Bits of out and LSE against the default
at bf16 and fp16, times at bf16 (CUDA graphs, L2 flushed, medians of 20, three repeats
interleaved cell by cell). Writes ``schedules.jsonl`` after each workload.

The switches it flipped live at the commits that carried them: ``PAIRS`` and ``PINGPONG`` at
313f4f5 (call 2; call 1 on the working tree before it), ``Q_IN_REGISTERS`` and
``FOLD_IN_SHARED`` at 4bfa49d (call 4; call 3 on the working tree before it, one switch for
both), ``PAIR_RELEASE`` and ``SPLIT_COUNTER`` at a538536 (call 5); none was clearly faster and
all were taken out. Where a switch is missing it exits naming it and the commit that has it.
"""

from __future__ import annotations

import sys

import kernels
import kernels._gluon
from benchmarks.probe_round4 import call, patched
from benchmarks.probe_round13 import probe_prefill

#: Module switches of ``kernels._gluon`` flipped together, one cell per tuple (call 5's; the
#: earlier calls' are in the module docstring and reports/h100-round14/README.md).
SWITCHES = (("PAIR_RELEASE",), ("SPLIT_COUNTER",), ("PAIR_RELEASE", "SPLIT_COUNTER"))
WORKLOADS = ["prefill-varlen", "mixed64", "prefill:4kx8", "decode:8kx32+chunk:256/4kx32"]


def switch_cells(batch, switch_sets) -> dict:
    """One cell per tuple of ``kernels._gluon`` switch names: the default launch with those
    switches flipped while it launches, named by the lowercase names joined with ``+``."""
    cells = {}
    for names in switch_sets:
        fn = call(batch)
        for name in names:
            fn = patched(fn, kernels._gluon, name, not getattr(kernels._gluon, name))
        cells["+".join(names).lower()] = fn
    return cells


def _cells(batch, lp: kernels.LaunchPlan) -> dict:
    cells = switch_cells(batch, SWITCHES)
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
