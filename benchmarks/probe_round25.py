"""Round-25 probe (H100): the keys-as-rows tile with the next tile's scores issued ahead, and
with 2 V column blocks (reports/h100-round25/).

    python benchmarks/probe_round25.py OUT_DIR bits|times|final|ahead2|bits32 [WORKLOAD ...]

``bits`` and ``times`` need two switches of ``kernels._gluon`` that exist at experiment commit
628895b only (elsewhere they exit): ``KT_AHEAD`` (``_split_kt_kernel``'s ``AHEAD``: tile t +
1's scores issued before tile t's ``p @ v``, its weights computed while that runs) and
``KT_BLOCKS`` (``plan_attention`` gives the tile ``kernels.config.kt_value_blocks``' V column
blocks; at that commit 2 blocks where ``num_programs * 2 <= num_sms``). Both are scheduling
only. They became ``Tuning.scores_ahead`` and the rules ``kt_value_blocks`` and
``kt_scores_ahead``.

``bits``: each workload at bf16 and fp16 under four head layouts (GQA 4, 1 and 16 at page 16,
GQA 4 at page 64), out and LSE of the tile in each variant (today, ahead, 2 blocks, both)
against the 128-row split tile (``Tuning(keys_rows=False)``), in differing bits, with the
64-key contract (``Tuning(block_n=64)``), which must differ (the control: the comparison can
fail). Into ``bits.jsonl``.

``times``: at bf16, CUDA-graph replays with L2 flushed (medians of 20), interleaved in
``REPEATS`` repeats, each cell against ``now`` (``plan="auto"``, switches off): ``auto`` with
either switch and both, the control (``split_size=None``) without and with both. Into
``times.jsonl``.

``final`` (the landed code): as ``times``, ``auto`` against round 24's schedule (the tile
forced with one V block in the serial order) and the control, on the decodes of 1-4 requests.
Into ``final.jsonl``.

``bits32`` (the landed code): as ``bits`` at GQA 32 (32 query heads on one KV head: blocks of
32 rows, which ``auto`` does not take), the tile forced with 1 block in the serial order, 2
blocks, and 2 blocks ahead, against the 128-row split tile; the 64-key control. Into
``bits32.jsonl``.

``ahead2`` (experiment switch ``kernels._gluon.KT_AHEAD_TILES``, at experiment commit bbba804
only; elsewhere it exits): with
``scores_ahead`` the scores issued two tiles ahead and waited together with the ``p @ v``, so
the weights need no wait. Bits as ``bits`` (two tiles ahead with 1 and 2 V blocks against the
128-row tile; the 64-key control) into ``ahead2-bits.jsonl``, then times as ``final`` into
``ahead2-times.jsonl``: ``auto`` one and two tiles ahead, the tile forced with 1 or 2 V blocks
two tiles ahead, with 1 V block one tile ahead, and the control.
"""

from __future__ import annotations

import os
import sys

import kernels
import kernels._gluon as kg
from benchmarks.probe_round4 import call, patched
from benchmarks.probe_round20 import times
from benchmarks.probe_round23 import LAYOUTS, bits_cells, bits_rows
from invariance.workload import HeadConfig

T = kernels.Tuning
KT = T(keys_rows=True)
KT2 = T(keys_rows=True, value_blocks=2)
NO_KT = T(keys_rows=False)
REPEATS = 3
STEPS = "bits|times|final|ahead2|bits32"
#: Whether this commit has the round-25 switches.
HAS_SWITCHES = hasattr(kg, "KT_AHEAD") and hasattr(kg, "KT_BLOCKS")
BITS_LAYOUTS = [LAYOUTS[i] for i in (0, 2, 3, 5)]
BITS_WORKLOADS = ["decode:1kx1", "decode:8kx1", "decode:777x3,3001x2", "decode:100x3",
                  "chunk:5/1000x2"]
#: ``name: (a, b)``, each side ``(cell, tuning)`` for :func:`make`.
BIT_CELLS = {"kt-vs-split": (("split", NO_KT), ("split", KT)),
             "ahead-vs-split": (("split", NO_KT), ("split+ahead", KT)),
             "vb2-vs-split": (("split", NO_KT), ("split", KT2)),
             "ahead-vb2-vs-split": (("split", NO_KT), ("split+ahead", KT2)),
             "control-64-keys": (("split", KT), ("auto", T(block_n=64)))}
TIME_WORKLOADS = [f"decode:{n}x{b}" for b in (1, 2, 4) for n in ("1k", "2k", "4k", "8k", "16k",
                                                                  "32k")] + [
    "decode-b8-ctx1k", "decode-b64-ctx1k", "decode-prod64"]
TIME_CELLS = {"now": ("auto", None), "ahead": ("auto+ahead", None),
              "blocks": ("auto+blocks", None), "both": ("auto+ahead+blocks", None),
              "control": ("heuristic", None), "control-both": ("heuristic+ahead+blocks", None)}


FINAL_WORKLOADS = TIME_WORKLOADS[:18]
BITS32_LAYOUTS = [(HeadConfig(32, 1, 128), 16)]
BITS32_CELLS = {
    "kt-vs-split": (("split", NO_KT), ("split", T(keys_rows=True, value_blocks=1,
                                                  scores_ahead=False))),
    "vb2-vs-split": (("split", NO_KT), ("split", T(keys_rows=True, value_blocks=2,
                                                   scores_ahead=False))),
    "ahead-vb2-vs-split": (("split", NO_KT), ("split", T(keys_rows=True, value_blocks=2,
                                                         scores_ahead=True))),
    "control-64-keys": (("split", KT), ("auto", T(block_n=64)))}
FINAL_CELLS = {"before": ("split", T(keys_rows=True, value_blocks=1, scores_ahead=False)),
               "now": ("auto", None), "control": ("heuristic", None)}


AHEAD2_BIT_CELLS = {
    "ahead2-vb1-vs-split": (("split", NO_KT), ("split+ahead2", T(keys_rows=True, value_blocks=1,
                                                                 scores_ahead=True))),
    "ahead2-vb2-vs-split": (("split", NO_KT), ("split+ahead2", T(keys_rows=True, value_blocks=2,
                                                                 scores_ahead=True))),
    "control-64-keys": (("split", KT), ("auto", T(block_n=64)))}
AHEAD2_WORKLOADS = ["decode:1kx1", "decode:2kx1", "decode:4kx1", "decode:8kx1", "decode:1kx2",
                    "decode:2kx2", "decode:4kx2", "decode:1kx4", "decode:2kx4"]
AHEAD2_CELLS = {"now": ("auto", None), "ahead2": ("auto+ahead2", None),
                "vb2-ahead2": ("split+ahead2", T(keys_rows=True, value_blocks=2,
                                                  scores_ahead=True)),
                "vb1-ahead2": ("split+ahead2", T(keys_rows=True, value_blocks=1,
                                                  scores_ahead=True)),
                "vb1-ahead1": ("split", T(keys_rows=True, value_blocks=1, scores_ahead=True)),
                "control": ("heuristic", None)}


def make(batch, cell: str, tuning):
    """``cell``: a plan or ``heuristic`` (the control, ``split_size=None``), then any of
    ``+ahead`` (``KT_AHEAD``), ``+blocks`` (``KT_BLOCKS``) and ``+ahead2``
    (``KT_AHEAD_TILES = 2``)."""
    base, *switches = cell.split("+")
    if base == "heuristic":
        fn = call(batch, "auto", tuning, split_size=None)
    elif base in kernels.PLANS:
        fn = call(batch, base, tuning)
    else:
        raise ValueError(f"cell {cell!r}: expected a plan {kernels.PLANS} or 'heuristic'")
    for sw in switches:
        if sw == "ahead2":
            fn = patched(fn, kg, "KT_AHEAD_TILES", 2)
        elif sw in ("ahead", "blocks"):
            fn = patched(fn, kg, "KT_AHEAD" if sw == "ahead" else "KT_BLOCKS", True)
        else:
            raise ValueError(f"cell {cell!r}: expected the switches +ahead, +blocks, +ahead2")
    return fn


def bits(out_dir: str, specs: list[str], cells: dict = BIT_CELLS,
         name: str = "bits.jsonl", layouts: list = BITS_LAYOUTS) -> None:
    bits_rows(out_dir, name, specs or BITS_WORKLOADS, layouts,
              lambda batch: dict(bits_differing=bits_cells(
                  cells, lambda side: make(batch, side[0], side[1])())))


def main() -> None:
    args = sys.argv[1:]
    if len(args) < 2 or args[1] not in STEPS.split("|"):
        sys.exit(f"usage: python benchmarks/probe_round25.py OUT_DIR {STEPS} [WORKLOAD ...]")
    if args[1] == "ahead2" and not hasattr(kg, "KT_AHEAD_TILES"):
        sys.exit("ahead2: needs kernels._gluon.KT_AHEAD_TILES (experiment commit bbba804)")
    if args[1] in ("bits", "times") and not HAS_SWITCHES:
        sys.exit(f"{args[1]}: needs kernels._gluon.KT_AHEAD and KT_BLOCKS (experiment commit "
                 f"628895b)")
    out_dir, step, specs = args[0], args[1], args[2:]
    os.makedirs(out_dir, exist_ok=True)
    if step == "bits":
        bits(out_dir, specs)
    elif step == "ahead2":
        bits(out_dir, specs, cells=AHEAD2_BIT_CELLS, name="ahead2-bits.jsonl")
        times(out_dir, [], cells=AHEAD2_CELLS, base="now", defaults=AHEAD2_WORKLOADS,
              repeats=REPEATS, make=make, name="ahead2-times.jsonl")
    elif step == "bits32":
        bits(out_dir, specs, cells=BITS32_CELLS, name="bits32.jsonl", layouts=BITS32_LAYOUTS)
    elif step == "final":
        times(out_dir, specs, cells=FINAL_CELLS, base="before", defaults=FINAL_WORKLOADS,
              repeats=REPEATS, make=make, name="final.jsonl")
    else:
        times(out_dir, specs, cells=TIME_CELLS, base="now", defaults=TIME_WORKLOADS,
              repeats=REPEATS, make=make)


if __name__ == "__main__":
    main()
