"""Round-26 probe (H100): the keys-as-rows tile at batch 1 with its KV cache in L2, three
bit-neutral experiments on it (an L2 prefetch of the split's later tiles, the row sum after the
next issue, two tiles per step) and a diagnostic without its max and row sum
(reports/h100-round26/; the profile is ``benchmarks/gpu_round26.sh ncu``).

    python benchmarks/probe_round26.py OUT_DIR
        warm|pf|pfbits|late|latebits|pairs|pairsbits|diag [WORKLOAD ...]

``warm``: at bf16, CUDA-graph replays (medians of 20), interleaved in ``REPEATS`` repeats:
``auto`` and the control (``split_size=None``), each with L2 flushed before every replay (the
bench's method) and without (the KV cache left in L2 by the previous replay). What the tile
gains from L2-resident K and V bounds what any prefetch could give. Into ``warm.jsonl``.

The other steps need an experiment switch of ``kernels._gluon`` that exists at one experiment
commit only (elsewhere they exit): ``pf`` and ``pfbits`` ``KT_PREFETCH`` (94d3f2b), ``late`` and
``latebits`` ``KT_LATE_SUM`` (d6eea7c), ``pairs`` and ``pairsbits`` ``KT_PAIRS`` (5f94496),
``diag`` ``KT_DIAG`` (31d4c92).

``pf``: as ``warm`` with L2 flushed, ``auto`` with and without the loader first asking the
split's later tiles into L2 (``cp.async.bulk.prefetch.L2``, every KV head's rows of each page
once across the programs of a split), and the control. Into ``pf.jsonl``. ``pfbits``: out and
LSE with the prefetch against ``auto`` without it and against the 128-row split tile, in
differing bits, at bf16 and fp16 (GQA 4 and 16 at page 16, GQA 4 at page 64); the 64-key
contract (``Tuning(block_n=64)``) must differ (the control). Into ``pfbits.jsonl``.

``diag`` (a diagnostic: wrong results, times only): as ``pf`` on the decodes where ``auto``
issues the scores ahead (the switch acts there only), ``auto`` against the same with the
loop's weights computed without the tile max (``m`` held, ``alpha`` 1), without the row
sum, and without either: what each costs the step, an upper bound on what a cheaper form of it
could gain. Into ``diag.jsonl``.

``late`` and ``latebits``: the tile with the scores ahead computing each tile's row sum after
the next MMAs are issued (the same l chain in tile order). Times as ``pf`` under ``auto``, plus
the tile forced ahead with 2 V blocks with and without it; bits of the forced tile with it
against the same without it (cell ``late-vs-now``) and against the 128-row split tile, with the
control. Into ``late.jsonl`` and ``latebits.jsonl``.

``pairs`` and ``pairsbits``: the tile two tiles per step in the serial order (both tiles'
scores issued together, one cross-warp max exchange and one p barrier for both). Times under
``auto``, and forced with 1 V block (against the same without pairs) and 2 V blocks (no serial
2-block cell: compare with ``now`` where ``auto`` runs 2 blocks); bits of the forced 1- and
2-block tiles against the 128-row split tile only, with the control. Into ``pairs.jsonl`` and
``pairsbits.jsonl``.
"""

from __future__ import annotations

import os
import statistics
import sys

import torch

import kernels
import kernels._gluon as kg
from benchmarks.probe_round4 import patched
from benchmarks.probe_round11 import _workload
from benchmarks.probe_round20 import _record, times
from benchmarks.probe_round23 import LAYOUTS, bits_cells, bits_rows
from benchmarks.probe_round25 import make as make25
from benchmarks.tile_sweep import _graphed as graphed
from invariance.bench import CudaTimer, build_batch

T = kernels.Tuning
REPEATS = 3
STEPS = "warm|pf|pfbits|late|latebits|pairs|pairsbits|diag"
#: Each switched cell's experiment switch of ``kernels._gluon`` and the commit that has it.
SWITCH = {"pf": ("KT_PREFETCH", "94d3f2b"), "late": ("KT_LATE_SUM", "d6eea7c"),
          "pairs": ("KT_PAIRS", "5f94496"), "diag": ("KT_DIAG", "31d4c92")}
WORKLOADS = ["decode:1kx1", "decode:2kx1", "decode:1kx2", "decode:4kx1", "decode:2kx2",
             "decode:1kx4", "decode:8kx1", "decode:32kx1", "decode-b8-ctx1k"]
#: GQA 4 and 16 at page 16, GQA 4 at page 64.
BITS_LAYOUTS = [LAYOUTS[i] for i in (0, 3, 5)]
BITS_WORKLOADS = ["decode:1kx1", "decode:8kx1", "decode:777x3,3001x2", "chunk:5/1000x2"]
WARM_CELLS = {"now": ("auto", None), "control": ("heuristic", None)}
PF_CELLS = {"now": ("auto", None), "prefetch": ("auto+pf", None),
            "control": ("heuristic", None)}
PF_BIT_CELLS = {"pf-vs-now": (("auto", None), ("auto+pf", None)),
                "pf-vs-split": (("split", T(keys_rows=False)), ("auto+pf", None)),
                "control-64-keys": (("auto", None), ("auto", T(block_n=64)))}
#: The tile ahead, forced (2 V blocks), so that every workload runs it.
AHEAD = T(keys_rows=True, value_blocks=2, scores_ahead=True)
LATE_CELLS = {"now": ("auto", None), "late": ("auto+late", None),
              "control": ("heuristic", None), "ahead": ("split", AHEAD),
              "ahead-late": ("split+late", AHEAD)}
LATE_BIT_CELLS = {"late-vs-now": (("split", AHEAD), ("split+late", AHEAD)),
                  "late-vs-split": (("split", T(keys_rows=False)), ("split+late", AHEAD)),
                  "control-64-keys": (("auto", None), ("auto", T(block_n=64)))}
SERIAL1 = T(keys_rows=True, value_blocks=1, scores_ahead=False)
SERIAL2 = T(keys_rows=True, value_blocks=2, scores_ahead=False)
PAIRS_CELLS = {"now": ("auto", None), "pairs": ("auto+pairs", None),
               "control": ("heuristic", None), "vb1": ("split", SERIAL1),
               "vb1-pairs": ("split+pairs", SERIAL1), "vb2-pairs": ("split+pairs", SERIAL2)}
DIAG_WORKLOADS = ["decode:1kx1", "decode:2kx1", "decode:1kx2"]
DIAG_CELLS = {"now": ("auto", None), "no-max": ("auto+diag1", None),
              "no-row-sum": ("auto+diag2", None), "neither": ("auto+diag3", None),
              "control": ("heuristic", None)}
PAIRS_BIT_CELLS = {"pairs-vb1-vs-split": (("split", T(keys_rows=False)), ("split+pairs", SERIAL1)),
                   "pairs-vb2-vs-split": (("split", T(keys_rows=False)), ("split+pairs", SERIAL2)),
                   "control-64-keys": (("auto", None), ("auto", T(block_n=64)))}


def make(batch, cell: str, tuning):
    """``cell``: a plan or ``heuristic`` (the control), with ``+pf``, ``+late`` or ``+pairs``
    a switch."""
    base, _, switch = cell.partition("+")
    fn = make25(batch, base, tuning)  # round 25's cells without a switch
    if switch in ("pf", "late", "pairs"):
        fn = patched(fn, kg, SWITCH[switch][0], True)
    elif switch in ("diag1", "diag2", "diag3"):
        fn = patched(fn, kg, SWITCH["diag"][0], int(switch[-1]))
    elif switch:
        raise ValueError(f"cell {cell!r}: expected the switch +pf, +late, +pairs or +diagN")
    return fn


def warm(out_dir: str, specs: list[str]) -> None:
    """``auto`` and the control, flushed and L2-warm, interleaved (module docstring)."""
    cold = CudaTimer(iters=20, warmup=2)
    hot = CudaTimer(iters=20, warmup=2)
    hot._flush = torch.empty(16, dtype=torch.uint8, device="cuda")  # 16 bytes: no flush
    rows: list[dict] = []
    for spec in specs or WORKLOADS:
        batch = build_batch(_workload(spec), dtype=torch.bfloat16)
        row: dict = dict(dtype="bfloat16", workload=spec)
        graphs = {c: graphed(make(batch, *cell)) for c, cell in WARM_CELLS.items()}
        for _ in range(REPEATS):
            for c, g in graphs.items():
                for tag, timer in (("flushed", cold), ("warm", hot)):
                    row.setdefault(f"us_{c}_{tag}", []).append(round(timer.time_fn(g) * 1000, 1))
        row["median_us"] = {k.removeprefix("us_"): statistics.median(v)
                            for k, v in row.items() if k.startswith("us_")}
        del batch, graphs
        _record(rows, row, out_dir, "warm.jsonl")


def main() -> None:
    args = sys.argv[1:]
    if len(args) < 2 or args[1] not in STEPS.split("|"):
        sys.exit(f"usage: python benchmarks/probe_round26.py OUT_DIR {STEPS} [WORKLOAD ...]")
    out_dir, step, specs = args[0], args[1], args[2:]
    name, commit = SWITCH.get(step.removesuffix("bits"), (None, None))
    if name is not None and not hasattr(kg, name):
        sys.exit(f"{step}: needs kernels._gluon.{name} (experiment commit {commit})")
    os.makedirs(out_dir, exist_ok=True)
    if step == "warm":
        warm(out_dir, specs)
    elif step == "diag":
        times(out_dir, specs, cells=DIAG_CELLS, base="now", defaults=DIAG_WORKLOADS,
              repeats=REPEATS, make=make, name="diag.jsonl")
    elif step in ("pf", "late", "pairs"):
        cells = {"pf": PF_CELLS, "late": LATE_CELLS, "pairs": PAIRS_CELLS}[step]
        times(out_dir, specs, cells=cells, base="now", defaults=WORKLOADS, repeats=REPEATS,
              make=make, name=f"{step}.jsonl")
    else:
        cells = {"pfbits": PF_BIT_CELLS, "latebits": LATE_BIT_CELLS,
                 "pairsbits": PAIRS_BIT_CELLS}[step]
        bits_rows(out_dir, f"{step}.jsonl", specs or BITS_WORKLOADS,
                  BITS_LAYOUTS,
                  lambda batch: dict(bits_differing=bits_cells(
                      cells, lambda side: make(batch, side[0], side[1])())))


if __name__ == "__main__":
    main()
