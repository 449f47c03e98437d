"""Round-24 probe (H100): where the keys-as-rows tile beats the fused plan, and a two-level
reduction tree (reports/h100-round24/).

    python benchmarks/probe_round24.py OUT_DIR plans [WORKLOAD ...]
    python benchmarks/probe_round24.py OUT_DIR tree-bits|tree-times|tree-fused [WORKLOAD ...]
    python benchmarks/probe_round24.py OUT_DIR tree-scratch|tree-smem|slots [WORKLOAD ...]

``plans``: at bf16, CUDA-graph replays with L2 flushed (medians of 20), interleaved in
``REPEATS`` repeats, on decode batches of 8-256 requests and mixed lengths: the fused plan
(``plan="fused"``), the split plan on the keys-as-rows tile (``plan="split"``,
``Tuning(keys_rows=True)``) and ``plan="auto"``, each against the fused plan. Into
``plans.jsonl``.

The ``tree-*`` and ``slots`` steps need the experiment switch ``kernels._gluon.TREE``
(experiment commits c785797: the keys-as-rows tile and the merge; 95a6892: the fused Gluon
kernel; bbf1a05: ``TREE_SCRATCH``; 6554efb: ``TREE_SMEM``; 34c487d: ``FUSED_SLOTS``; elsewhere
they exit). With ``TREE = (leaf, group)`` the
keys-as-rows split plan reduces each row over a fixed two-level tree: chains of ``leaf`` keys,
left-folded within each ``group`` of keys at absolute positions, the groups left-folded. A
program runs one leaf (``split_size=leaf``; the merge folds leaves into groups, then groups) or
one group (``split_size=group``; the program folds its leaves, the merge folds groups): the same
bits by construction, a free choice per batch.

``tree-bits``: bf16 and fp16, out and LSE of the tree run by leaves against the tree run by
groups (must not differ), with two controls that must differ: the tree against today's
1024-token chains, and the flat 256-token contract. Into ``tree-bits.jsonl``.

``tree-fused``: the tree in the fused Gluon kernel (its third state in registers): its bits
against the tree run by leaves and by groups (must not differ; today's chains must), then
its times against today's default on prompts and decodes. Into ``tree-fused-bits.jsonl`` and
``tree-fused-times.jsonl``.

``tree-scratch``: ``tree-fused`` with the running fold of finished groups kept in global
scratch between group ends (``kernels._gluon.TREE_SCRATCH``), plus prompts of 3000 and 1100
tokens in the bits. Into ``tree-scratch-bits.jsonl`` and ``tree-scratch-times.jsonl``.
``tree-smem``: the same with the running fold's accumulator in shared memory and 2 ring slots
(``kernels._gluon.TREE_SMEM``, experiment commit 6554efb); into ``tree-smem-*.jsonl``.
``slots``: the times of today's fused kernel with 2 ring slots instead of 3
(``kernels._gluon.FUSED_SLOTS``, experiment commit 34c487d) beside ``tree-smem``'s, into
``slots-times.jsonl``: what the slot given up costs without the tree.

``tree-times``: bf16 timing (as ``plans``) of today's default, the tree by leaves, the tree by
groups, and the control (``split_size=None``), each against today's default. Into
``tree-times.jsonl``.
"""

from __future__ import annotations

import os
import sys

import kernels
import kernels._gluon as kg
from benchmarks.probe_round4 import call, patched
from benchmarks.probe_round20 import times
from benchmarks.probe_round23 import bits_cells, bits_rows
from invariance.bench import BENCH_HEADS, BENCH_PAGE_SIZE

T = kernels.Tuning
KT = T(keys_rows=True)
REPEATS = 5
STEPS = "plans|tree-bits|tree-times|tree-fused|tree-scratch|tree-smem|slots"
PLAN_WORKLOADS = ["decode:512x8", "decode:1kx8", "decode:2kx8", "decode:4kx8", "decode:8kx8",
                  "decode:1kx16", "decode:2kx16", "decode:4kx16", "decode:1kx32",
                  "decode:2kx32", "decode:512x64", "decode:1kx64", "decode:2kx64",
                  "decode:512x256", "decode:1kx256", "decode:777x3,3001x2",
                  "decode:1kx4,4kx4", "decode:300x16,2kx4", "decode:100x20,1500x12",
                  "decode-b8-ctx8k", "decode-b64-ctx8k"]
PLAN_CELLS = {"fused": ("fused", None), "split-kt": ("split", KT), "auto": ("auto", None)}
#: The experiment's tree: 256-token leaves in 1024-token groups.
TREE = (256, 1024)
#: Whether this commit has the tree switch (the round-24 experiment commit only).
HAS_TREE = hasattr(kg, "TREE")
TREE_BITS_WORKLOADS = ["decode:1kx1", "decode:8kx1", "decode:777x3,3001x2", "decode:100x3",
                       "decode:3000x2", "decode:1kx8", "chunk:5/1000x2"]
TREE_TIME_WORKLOADS = [f"decode:{n}x{b}" for n in ("1k", "2k", "3k", "4k", "6k", "8k", "12k",
                                                     "16k", "24k", "32k") for b in (1, 2, 4)]


#: The cells of :func:`make`.
CELLS = ("default", "control", "flat256", "tree-leaf", "tree-group", "tree-fused",
         "tree-fused-scratch", "tree-fused-smem", "slots2")


def make(batch, cell: str, tuning):
    """``cell``: ``default`` (today's auto), ``control`` (``split_size=None``), ``flat256``
    (256-token chains, no tree), ``tree-leaf`` / ``tree-group`` (the tree run by leaves or by
    groups, split plan on the keys-as-rows tile), ``tree-fused`` (the fused plan's tree, its
    running fold in registers; ``-scratch``: in global scratch; ``-smem``: in shared memory),
    ``slots2`` (today's fused kernel with 2 ring slots)."""
    if cell == "default":
        return call(batch, "auto", tuning)
    if cell == "control":
        return call(batch, "auto", tuning, split_size=None)
    if cell == "flat256":
        return call(batch, "split", KT, split_size=TREE[0])
    if cell == "tree-fused":
        return patched(call(batch, "fused", None, split_size=TREE[1]), kg, "TREE", TREE)
    if cell == "tree-fused-scratch":  # the running fold in global scratch
        return patched(make(batch, "tree-fused", tuning), kg, "TREE_SCRATCH", True)
    if cell == "slots2":  # today's fused kernel with 2 ring slots
        return patched(call(batch, "fused", None), kg, "FUSED_SLOTS", 2)
    if cell == "tree-fused-smem":  # the running fold in shared memory, 2 ring slots
        return patched(make(batch, "tree-fused", tuning), kg, "TREE_SMEM", True)
    if cell in ("tree-leaf", "tree-group"):
        size = TREE[0] if cell == "tree-leaf" else TREE[1]
        return patched(call(batch, "split", KT, split_size=size), kg, "TREE", TREE)
    raise ValueError(f"cell {cell!r}: expected one of {', '.join(CELLS)}")


TREE_BIT_CELLS = {"leaf-vs-group": ("tree-group", "tree-leaf"),
                  "control-vs-today": ("default", "tree-group"),
                  "control-vs-flat256": ("flat256", "tree-leaf")}
TREE_FUSED_BIT_CELLS = {"fused-vs-group": ("tree-group", "tree-fused"),
                        "fused-vs-leaf": ("tree-leaf", "tree-fused"),
                        "control-vs-today": ("default", "tree-fused")}
TREE_FUSED_WORKLOADS = ["decode:1kx1", "decode:8kx1", "decode:777x3,3001x2", "decode:3000x2",
                        "decode:1kx8", "chunk:5/1000x2"]
TREE_FUSED_TIMES = ["prefill-varlen", "mixed64", "decode-b8-ctx8k", "decode-b64-ctx8k"]
TREE_TIME_CELLS = {"default": ("default", None), "tree-leaf": ("tree-leaf", None),
                   "tree-group": ("tree-group", None), "control": ("control", None)}


def tree_bits(out_dir: str, specs: list[str], cells: dict = TREE_BIT_CELLS,
              defaults: list[str] = TREE_BITS_WORKLOADS, name: str = "tree-bits.jsonl") -> None:
    bits_rows(out_dir, name, specs or defaults, [(BENCH_HEADS, BENCH_PAGE_SIZE)],
              lambda batch: dict(bits_differing=bits_cells(
                  cells, lambda cell: make(batch, cell, None)())))


def main() -> None:
    args = sys.argv[1:]
    if len(args) < 2 or args[1] not in STEPS.split("|"):
        sys.exit(f"usage: python benchmarks/probe_round24.py OUT_DIR {STEPS} [WORKLOAD ...]")
    out_dir, step, specs = args[0], args[1], args[2:]
    if step != "plans" and not HAS_TREE:
        sys.exit(f"{step}: needs kernels._gluon.TREE (round 24's experiment commits c785797, "
                 f"95a6892, bbf1a05, 6554efb and 34c487d)")
    os.makedirs(out_dir, exist_ok=True)
    if step == "plans":
        times(out_dir, specs, cells=PLAN_CELLS, base="fused", defaults=PLAN_WORKLOADS,
              repeats=REPEATS, name="plans.jsonl")
    elif step == "tree-bits":
        tree_bits(out_dir, specs)
    elif step == "tree-fused":  # the fused plan's tree: bits, then times on prompts and decodes
        tree_bits(out_dir, specs, cells=TREE_FUSED_BIT_CELLS, defaults=TREE_FUSED_WORKLOADS,
                  name="tree-fused-bits.jsonl")
        times(out_dir, [], cells={"default": ("default", None),
                                  "tree-fused": ("tree-fused", None)},
              base="default", defaults=TREE_FUSED_TIMES, repeats=3, make=make,
              name="tree-fused-times.jsonl")
    elif step in ("tree-scratch", "tree-smem"):  # tree-fused with f out of registers
        where = step.removeprefix("tree-")
        cells = {f"{where}-vs-{k}": (f"tree-{k}", f"tree-fused-{where}")
                 for k in ("group", "leaf")}
        cells["control-vs-today"] = ("default", f"tree-fused-{where}")
        tree_bits(out_dir, specs, cells=cells,
                  defaults=[*TREE_FUSED_WORKLOADS, "prefill:3000,1100"],
                  name=f"{step}-bits.jsonl")
        times(out_dir, [], cells={"default": ("default", None),
                                  f"tree-fused-{where}": (f"tree-fused-{where}", None)},
              base="default", defaults=TREE_FUSED_TIMES, repeats=3, make=make,
              name=f"{step}-times.jsonl")
    elif step == "slots":  # what 2 ring slots cost the fused kernel without the tree
        times(out_dir, specs, cells={"default": ("default", None), "slots2": ("slots2", None),
                                     "tree-fused-smem": ("tree-fused-smem", None)},
              base="default", defaults=TREE_FUSED_TIMES, repeats=3, make=make,
              name="slots-times.jsonl")
    else:
        times(out_dir, specs, cells=TREE_TIME_CELLS, base="default",
              defaults=TREE_TIME_WORKLOADS, repeats=REPEATS, make=make, name="tree-times.jsonl")


if __name__ == "__main__":
    main()
