"""Round-27 probe (Hopper): three schedules of the keys-as-rows tile (reports/h100-round27/),
each an experiment switch of ``kernels._gluon`` that exists at experiment commits only
(elsewhere the steps exit, naming the commit):

- ``KT_TWO_GROUPS`` (e492a3c): ``_split_kt2_kernel``, two consumer warpgroups that take a
  split's tiles by parity and hand each other the tile max, p and the row sum;
- ``KT_PHASED`` (af90826): ``_split_ktp_kernel``, four tiles' scores issued together, their
  weights in straight-line code, then the acc chain; K and V in rings of their own;
- ``KT_AHEAD2_RINGS`` (3160395): ``_split_ktp_kernel`` with ``ORDER=1``, round 25's scores two
  tiles ahead (experiment bbba804) on those split rings (a K slot released once scored).

3160395 holds all three switches.

    python benchmarks/probe_round27.py OUT_DIR bits|times|pbits|ptimes|abits|atimes [WORKLOAD ...]

``bits``: out and LSE of the tile with ``KT_TWO_GROUPS`` on (forced, ``Tuning(keys_rows=True)``,
so every workload runs it) against the 128-row split tile (``Tuning(keys_rows=False)``) and
against today's keys-as-rows tile, in differing bits, at bf16 and fp16 under four head layouts
(GQA 4, 1 and 16 at page 16, GQA 4 at page 64); the workloads give splits of an even and an
odd number of tiles, a one-tile split (1100 keys), masked tiles (chunks) and rows ending inside
a tile. The 64-key contract (``Tuning(block_n=64)``) must differ (the control: the comparison
can fail). Into ``bits.jsonl``.

``times``: at bf16, CUDA-graph replays with L2 flushed (medians of 20), interleaved in
``REPEATS`` repeats, each cell against ``now`` (``plan="auto"``, switch off): ``auto`` with the
switch, the control (``split_size=None``) without and with it. Into ``times.jsonl``.

``pbits`` (``KT_PHASED``): as ``bits``, the tile forced with 2 V column blocks (the schedule runs
there only), against the 128-row split tile and the landed tile with the same settings.
``abits`` (``KT_AHEAD2_RINGS``): as ``bits``, the tile forced with the rule's V blocks and with
one block, each against the 128-row split tile. ``ptimes`` and ``atimes``: as ``times`` (each
cell against ``now``), ``auto`` with the switch and the control, without a control with the
switch. Each into ``STEP.jsonl``.
"""

from __future__ import annotations

import os
import sys

import kernels
import kernels._gluon as kg
from benchmarks.probe_round4 import patched
from benchmarks.probe_round20 import times
from benchmarks.probe_round23 import LAYOUTS, bits_cells, bits_rows
from benchmarks.probe_round25 import make as make25

T = kernels.Tuning
KT = T(keys_rows=True)
NO_KT = T(keys_rows=False)
REPEATS = 3
KT2 = T(keys_rows=True, value_blocks=2)
BITS_LAYOUTS = [LAYOUTS[i] for i in (0, 2, 3, 5)]
BITS_WORKLOADS = ["decode:1kx1", "decode:8kx1", "decode:777x3,3001x2", "decode:1100x1",
                  "decode:300x2", "decode:100x3", "chunk:5/1000x2"]
BIT_CELLS = {"two-vs-split": (("split", NO_KT), ("split+two", KT)),
             "two-vs-kt": (("split", KT), ("split+two", KT)),
             "control-64-keys": (("split", KT), ("auto", T(block_n=64)))}
TIME_WORKLOADS = ["decode:1kx1", "decode:2kx1", "decode:1kx2", "decode:4kx1", "decode:2kx2",
                  "decode:1kx4", "decode:8kx1", "decode:32kx1", "decode-b8-ctx1k",
                  "decode-b8-ctx8k", "decode-b64-ctx8k", "decode-prod64"]
P_BITS_LAYOUTS = [LAYOUTS[i] for i in (0, 3, 5)]
P_BITS_WORKLOADS = ["decode:1kx1", "decode:777x3,3001x2", "decode:1100x1", "decode:300x2",
                    "chunk:5/1000x2"]
P_BIT_CELLS = {"phased-vs-split": (("split", NO_KT), ("split+phased", KT2)),
               "phased-vs-kt": (("split", KT2), ("split+phased", KT2)),
               "control-64-keys": (("split", KT), ("auto", T(block_n=64)))}
A_BITS_WORKLOADS = ["decode:1kx1", "decode:777x3,3001x2", "decode:1100x1", "chunk:5/1000x2"]
A_BIT_CELLS = {"a2-vs-split": (("split", NO_KT), ("split+a2", KT)),
               "a2-vb1-vs-split": (("split", NO_KT), ("split+a2", T(keys_rows=True,
                                                                     value_blocks=1))),
               "control-64-keys": (("split", KT), ("auto", T(block_n=64)))}
A_TIME_CELLS = {"now": ("auto", None), "a2": ("auto+a2", None), "control": ("heuristic", None)}
P_TIME_CELLS = {"now": ("auto", None), "phased": ("auto+phased", None),
                "control": ("heuristic", None)}
TIME_CELLS = {"now": ("auto", None), "two": ("auto+two", None), "control": ("heuristic", None),
              "control-two": ("heuristic+two", None)}


SWITCHES = {"two": "KT_TWO_GROUPS", "phased": "KT_PHASED", "a2": "KT_AHEAD2_RINGS"}
#: The experiment commit each switch was measured at (3160395 holds all three).
COMMITS = {"two": "e492a3c", "phased": "af90826", "a2": "3160395"}
#: Each step: its switch, its cells and, for the bit steps, the layouts (None for times) and
#: the default workloads.
STEP_TABLE = {
    "bits": ("two", BIT_CELLS, BITS_LAYOUTS, BITS_WORKLOADS),
    "times": ("two", TIME_CELLS, None, TIME_WORKLOADS),
    "pbits": ("phased", P_BIT_CELLS, P_BITS_LAYOUTS, P_BITS_WORKLOADS),
    "ptimes": ("phased", P_TIME_CELLS, None, TIME_WORKLOADS),
    "abits": ("a2", A_BIT_CELLS, P_BITS_LAYOUTS, A_BITS_WORKLOADS),
    "atimes": ("a2", A_TIME_CELLS, None, TIME_WORKLOADS)}
STEPS = "|".join(STEP_TABLE)


def make(batch, cell: str, tuning):
    """``cell``: a plan or ``heuristic`` (the control), with ``+two``, ``+phased`` or ``+a2`` a
    switch on."""
    base, _, switch = cell.partition("+")
    fn = make25(batch, base, tuning)
    if switch in SWITCHES:
        fn = patched(fn, kg, SWITCHES[switch], True)
    elif switch:
        raise ValueError(f"cell {cell!r}: expected the switch +two, +phased or +a2")
    return fn


def main() -> None:
    args = sys.argv[1:]
    if len(args) < 2 or args[1] not in STEPS.split("|"):
        sys.exit(f"usage: python benchmarks/probe_round27.py OUT_DIR {STEPS} [WORKLOAD ...]")
    out_dir, step, specs = args[0], args[1], args[2:]
    switch, cells, layouts, defaults = STEP_TABLE[step]
    if not hasattr(kg, SWITCHES[switch]):
        sys.exit(f"{step}: needs kernels._gluon.{SWITCHES[switch]} (experiment commit "
                 f"{COMMITS[switch]})")
    os.makedirs(out_dir, exist_ok=True)
    if layouts is not None:
        bits_rows(out_dir, f"{step}.jsonl", specs or defaults, layouts,
                  lambda batch: dict(bits_differing=bits_cells(
                      cells, lambda side: make(batch, side[0], side[1])())))
    else:
        times(out_dir, specs, cells=cells, base="now", defaults=defaults, repeats=REPEATS,
              make=make, name=f"{step}.jsonl")


if __name__ == "__main__":
    main()
