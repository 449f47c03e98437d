"""Round-21 probe (H100): schedules of the 128-key Gluon split kernel (reports/h100-round21/).

    python benchmarks/probe_round21.py OUT_DIR bits [WORKLOAD ...]
    python benchmarks/probe_round21.py OUT_DIR times [WORKLOAD ...]

``bits``: for each workload at bf16 and fp16, out and LSE of the split plan under each schedule
(V column blocks, splits per program (at c53c413 only: ``Tuning.splits_per_program`` was taken
out again), the merge launched without ``griddepcontrol``) against
the default launch, and the 64-key contract, which must differ (the control). Into
``bits.jsonl`` (through ``probe_round20.bits``; call 1 ran an earlier copy of it, whose rows lack
the ``default`` plan field).

``times``: at bf16, CUDA-graph replays with L2 flushed (medians of 20), interleaved in
``REPEATS`` repeats: the default, the schedules, and the control (``split_size=None``, the
split count from the batch: ``kernels-heuristic``), each against the default. Into
``times.jsonl``.
"""

from __future__ import annotations

import os
import sys

import kernels
from benchmarks.probe_round4 import call
from benchmarks.probe_round20 import bits, times

T = kernels.Tuning
#: Whether this commit's ``Tuning`` has the walking programs (experiment commit c53c413 only;
#: later commits leave the ``spp`` cells out).
WALKING = "splits_per_program" in T.__dataclass_fields__
#: (plan, tuning) of each schedule.
SCHEDULES = {"vb2": ("split", T(value_blocks=2)), "vb4": ("split", T(value_blocks=4)),
             **({"spp2": ("split", T(splits_per_program=2)),  # type: ignore[call-arg]
                 "spp4": ("split", T(splits_per_program=4)),  # type: ignore[call-arg]
                 "vb2-spp2": ("split", T(value_blocks=2,
                                         splits_per_program=2))}  # type: ignore[call-arg]
                if WALKING else {}),
             "no-pdl": ("split", T(dependent_merge=False))}
BITS_WORKLOADS = ["decode-b1-ctx1k", "decode-b1-ctx8k", "decode-b8-ctx8k", "decode-prod64",
                  "mixed64", "prefill:1000,3001,17,130", "decode:777x3,3001x2"]
TIME_WORKLOADS = ["decode-b1-ctx1k", "decode-b1-ctx8k", "decode-b1-ctx32k", "decode-b8-ctx1k",
                  "decode-b8-ctx8k", "decode-b8-ctx32k", "decode-b64-ctx1k", "decode-prod64",
                  "decode:2kx1", "decode:4kx1", "decode:16kx1", "decode:2kx4", "decode:32kx2"]
REPEATS = 5


def _call(batch, plan, tuning):
    """``call``, with the plan ``"heuristic"`` for the control (``split_size=None``)."""
    if plan == "heuristic":
        return call(batch, "auto", None, split_size=None)
    return call(batch, plan, tuning)


def main() -> None:
    if len(sys.argv) < 3 or sys.argv[2] not in ("bits", "times"):
        sys.exit("usage: python benchmarks/probe_round21.py OUT_DIR bits|times [WORKLOAD ...]")
    out_dir, step, specs = sys.argv[1], sys.argv[2], sys.argv[3:]
    os.makedirs(out_dir, exist_ok=True)
    if step == "bits":
        bits(out_dir, specs, cells={**SCHEDULES, "control-64-keys": ("auto", T(block_n=64))},
             defaults=BITS_WORKLOADS)
    else:
        times(out_dir, specs, cells={"default": ("auto", None), **SCHEDULES,
                                     "heuristic": ("heuristic", None)},
              base="default", defaults=TIME_WORKLOADS, repeats=REPEATS, make=_call)


if __name__ == "__main__":
    main()
