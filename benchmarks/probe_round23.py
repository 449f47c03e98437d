"""Round-23 probe (H100): the keys-as-rows decode tile (reports/h100-round23/).

    python benchmarks/probe_round23.py OUT_DIR bits|bits2 [WORKLOAD ...]
    python benchmarks/probe_round23.py OUT_DIR times [WORKLOAD ...]
    python benchmarks/probe_round23.py OUT_DIR diag [WORKLOAD ...]   (experiment commit bdd11ec)

``bits``: each workload at bf16 and fp16 under the first three head layouts, out and
LSE of the keys-as-rows tile (``Tuning(keys_rows=True)``, split plan) against the 128-row split
tile (``Tuning(keys_rows=False)``, split plan) and against the fused plan, in differing bits,
with the 64-key contract (``Tuning(block_n=64)``), which must differ (the control: the
comparison can fail). Into ``bits.jsonl``; ``bits2``: the same under the last three layouts
(other GQA groups and page sizes), into ``bits2.jsonl``.

``times``: at bf16, CUDA-graph replays with L2 flushed (medians of 20), interleaved in
``REPEATS`` repeats, each cell against ``before`` (the default without the new tile): the
default, the tile forced in the split plan, the control (``split_size=None``) with and without
it. Into ``times.jsonl``.

``diag``: the same timing of the tile forced, with its consumer only releasing the slots
(``+diag1``: the loads alone) and with its loader copying nothing (``+diag2``: the arithmetic
alone; wrong results), beside the 128-row default and the control, into ``diag.jsonl``. The
switch (``kernels._gluon.KT_DIAG``) exists at experiment commit bdd11ec only; elsewhere the step
exits.
"""

from __future__ import annotations

import os
import sys

import torch

import kernels
import kernels._gluon as kg
from benchmarks.probe_round4 import call, patched
from benchmarks.probe_round5 import _bits_vs
from benchmarks.probe_round11 import _workload
from benchmarks.probe_round20 import _record, times
from invariance.bench import build_batch
from invariance.workload import HeadConfig

T = kernels.Tuning
#: (heads, page size) layouts of ``bits``: GQA groups of 4 (the bench's), 8, 1, 16 and 3.
LAYOUTS = [(HeadConfig(32, 8, 128), 16), (HeadConfig(32, 4, 128), 16),
           (HeadConfig(8, 8, 128), 16), (HeadConfig(64, 4, 128), 16),
           (HeadConfig(24, 8, 128), 16), (HeadConfig(32, 8, 128), 64)]
BITS_WORKLOADS = ["decode:1kx1", "decode:8kx1", "decode:32kx1", "decode:777x3,3001x2",
                  "decode:100x3", "decode:1kx8", "decode:130x64", "chunk:5/1000x2",
                  "prefill:1000,17"]
TIME_WORKLOADS = ["decode-b1-ctx1k", "decode:2kx1", "decode:4kx1", "decode-b1-ctx8k",
                  "decode-b1-ctx32k", "decode:1kx2", "decode:8kx2", "decode:32kx2",
                  "decode:1kx4", "decode:8kx4", "decode-b8-ctx1k", "decode-b8-ctx8k",
                  "decode-b8-ctx32k", "decode-b64-ctx1k", "decode-b64-ctx8k",
                  "decode-b64-ctx32k", "decode-b256-ctx8k", "decode-prod64"]
REPEATS = 5
STEPS = "bits|bits2|times|diag"
#: Whether this commit has the tile's diagnostic switch (experiment commit bdd11ec only).
DIAG = hasattr(kg, "KT_DIAG")
KT = T(keys_rows=True)
NO_KT = T(keys_rows=False)
BIT_CELLS = {"kt-vs-split": (("split", KT), ("split", NO_KT)),
             "kt-vs-fused": (("split", KT), ("fused", None)),
             "control-64-keys": (("split", KT), ("auto", T(block_n=64)))}
TIME_CELLS = {"before": ("auto", NO_KT), "default": ("auto", None), "split-kt": ("split", KT),
              "heuristic-before": ("heuristic", NO_KT), "heuristic": ("heuristic", None)}


DIAG_WORKLOADS = ["decode-b1-ctx1k", "decode:2kx1", "decode-b1-ctx8k", "decode-b1-ctx32k",
                  "decode-b8-ctx1k", "decode:100x1"]
DIAG_CELLS = {"before": ("auto", NO_KT), "split-kt": ("split", KT),
              "loads-only": ("split+diag1", KT), "arith-only": ("split+diag2", KT),
              "heuristic": ("heuristic", None)}


def make(batch, cell, tuning):
    """``cell`` a plan or ``heuristic`` (the control, ``split_size=None``); ``+diagN``: with
    ``kernels._gluon.KT_DIAG = N`` (1: the tile's consumer only releases the slots, 2: its loader
    copies nothing; times only)."""
    base, _, switch = cell.partition("+")
    if switch:
        if not (switch.startswith("diag") and switch[4:] in ("1", "2")):
            raise ValueError(f"cell {cell!r}: expected the switch +diag1 or +diag2")
        return patched(make(batch, base, tuning), kg, "KT_DIAG", int(switch[4:]))
    if cell == "heuristic":
        return call(batch, "auto", tuning, split_size=None)
    if cell not in kernels.PLANS:
        raise ValueError(f"cell {cell!r}: expected a plan {kernels.PLANS} or 'heuristic'")
    return call(batch, cell, tuning)


def bits_cells(cells: dict, run) -> dict:
    """For each ``cell: (a, b)``, the bits of out and LSE in which ``run(a)`` and ``run(b)``
    differ, or the error either raised (a probe: record and go on)."""
    found: dict = {}
    for cell, (a, b) in cells.items():
        try:
            found[cell] = _bits_vs(run(b), run(a))
        except Exception as exc:
            found[cell] = f"{type(exc).__name__}: {str(exc)[:300]}"
    return found


def bits_rows(out_dir: str, name: str, specs: list[str], layouts: list, row_of) -> None:
    """One row per (layout, workload, dtype): each ``(heads, page size)`` of ``layouts``, each
    workload (``specs``), at bf16 then fp16, the batch built and ``row_of(batch)``'s fields
    recorded after its identity (dtype, workload, heads, page) into ``out_dir/name``."""
    rows: list[dict] = []
    for heads, page in layouts:
        for spec in specs:
            for dtype in (torch.bfloat16, torch.float16):
                batch = build_batch(_workload(spec), heads=heads, dtype=dtype, page_size=page)
                row: dict = dict(dtype=str(dtype).removeprefix("torch."), workload=spec,
                                 heads=[heads.num_q_heads, heads.num_kv_heads], page=page)
                row.update(row_of(batch))
                del batch
                _record(rows, row, out_dir, name)


def bits(out_dir: str, specs: list[str], layouts=LAYOUTS[:3],
         name: str = "bits.jsonl") -> None:
    def row_of(batch) -> dict:
        args = (batch.q, batch.k_cache, batch.v_cache, batch.cu_seqlens_q, batch.kv_lens,
                batch.block_table)
        lp = kernels.plan_attention(*args, plan="split", tuning=KT)
        return dict(kt=dict(keys_rows=lp.keys_rows, block_m=lp.block_m, splits=lp.num_splits),
                    auto_keys_rows=kernels.plan_attention(*args).keys_rows,
                    bits_differing=bits_cells(BIT_CELLS, lambda spec: call(batch, *spec)()))

    bits_rows(out_dir, name, specs or BITS_WORKLOADS, layouts, row_of)


def main() -> None:
    args = sys.argv[1:]
    if len(args) < 2 or args[1] not in STEPS.split("|"):
        sys.exit(f"usage: python benchmarks/probe_round23.py OUT_DIR {STEPS} [WORKLOAD ...]")
    out_dir, step, specs = args[0], args[1], args[2:]
    if step == "diag" and not DIAG:
        sys.exit("diag: needs kernels._gluon.KT_DIAG (experiment commit bdd11ec)")
    os.makedirs(out_dir, exist_ok=True)
    if step == "bits":
        bits(out_dir, specs)
    elif step == "bits2":  # the layouts a 260 s part leaves out of ``bits``
        bits(out_dir, specs, layouts=LAYOUTS[3:], name="bits2.jsonl")
    elif step == "diag":
        times(out_dir, specs, cells=DIAG_CELLS, base="split-kt", defaults=DIAG_WORKLOADS,
              repeats=REPEATS, make=make, name="diag.jsonl")
    else:
        times(out_dir, specs, cells=TIME_CELLS, base="before", defaults=TIME_WORKLOADS,
              repeats=REPEATS, make=make)


if __name__ == "__main__":
    main()
