"""Round-29 probe (H100/H200): where batch 1 with 32k keys loses against the control
(reports/h100-round29/).

    python benchmarks/probe_round29.py OUT_DIR times|parts [WORKLOAD ...]

A cell is ``PLAN[@SPLIT[/LEAD]][+SWITCH]``: a plan (``auto``, ``split``) or ``heuristic`` (the
control, ``split_size=None``); ``@SPLIT`` a split size in tokens (``/LEAD`` a lead split size,
else the default's rule); ``+c32`` the merge loading 32 partials per step, ``+d16`` merge
programs of 16 head-dim columns (both bit-neutral: the merge's order per row is the same).

``times``: at bf16, CUDA-graph replays with L2 flushed (medians of 20), interleaved in
``REPEATS`` repeats, each cell against ``auto``. Into ``times.jsonl``.

``parts``: each cell run eagerly under the PyTorch profiler (L2 flushed before each of 20
runs), its kernels' durations from the GPU timeline: the first phase (every kernel but the
merge and the flush), the merge, and the merge's end after the first phase's end (its visible
cost, which a dependent launch shortens). Medians over the runs, in us, into ``parts.jsonl``.
"""

from __future__ import annotations

import os
import statistics
import sys

import torch

import kernels
import kernels.attention
from benchmarks.probe_round4 import call, patched
from benchmarks.probe_round11 import _workload
from benchmarks.probe_round20 import _record, times
from invariance.bench import build_batch

REPEATS = 3
STEPS = "times|parts"
WORKLOADS = ["decode:32kx1", "decode:24kx1", "decode:16kx2", "decode:32kx2", "decode:8kx1",
             "decode:2kx1", "decode:4kx1"]
CELLS = {"auto": ("auto", None), "control": ("heuristic", None),
         "merge-c32": ("auto+c32", None), "merge-d16": ("auto+d16", None),
         "split2048": ("auto@2048", None), "split2048-lead256": ("auto@2048/256", None),
         "split2048-lead128": ("auto@2048/128", None)}
RUNS = 20


def make(batch, cell: str, tuning):
    """The call of ``cell`` (module docstring) on ``batch``."""
    cell, *switches = cell.split("+")
    fn = make(batch, cell, tuning) if switches else None
    for switch in switches:
        if switch == "c32":
            fn = patched(fn, kernels.attention, "_MERGE_CHUNK", 32)
        elif switch == "d16":
            fn = patched(fn, kernels.attention, "_MERGE_BLOCK_D", 16)
        else:
            raise ValueError(f"cell {cell!r}: unknown switch {switch!r}")
    if fn is not None:
        return fn
    base, _, sizes = cell.partition("@")
    if base == "heuristic":
        return call(batch, "auto", tuning, split_size=None)
    if base not in kernels.PLANS:
        raise ValueError(f"cell {cell!r}: expected a plan {kernels.PLANS} or 'heuristic'")
    if not sizes:
        return call(batch, base, tuning)
    split, _, lead = sizes.partition("/")
    lens = (batch.q_lens(), batch.kv_lens.tolist())  # on the host, before any capture

    def run():
        return kernels.unified_attention(
            batch.q, batch.k_cache, batch.v_cache, batch.cu_seqlens_q, batch.kv_lens,
            batch.block_table, sm_scale=batch.sm_scale, plan=base, tuning=tuning,
            validate=False, host_lens=lens, split_size=int(split),
            lead_split_size=int(lead) if lead else None)
    return run


def _parts_of(fn, flush: torch.Tensor) -> dict:
    """Median durations (us) of ``fn``'s kernels over ``RUNS`` profiled runs (module docstring)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(RUNS):
            flush.zero_()
            fn()
        torch.cuda.synchronize()
    kernels_ = sorted((e for e in prof.events() if e.device_type == DeviceType.CUDA),
                      key=lambda e: e.time_range.start)
    runs: list[list] = []
    for e in kernels_:
        if "elementwise" in e.name or "zero" in e.name.lower() or "fill" in e.name.lower():
            runs.append([])  # the flush opens a run
        elif runs:
            runs[-1].append(e)
    first, merge, tail, total, names = [], [], [], [], set()
    for run in runs:
        phase1 = [e for e in run if "merge" not in e.name]
        merges = [e for e in run if "merge" in e.name]
        names.update(e.name[:60] for e in run)
        if not phase1:
            continue
        p1_end = max(e.time_range.end for e in phase1)
        p1_start = min(e.time_range.start for e in phase1)
        first.append(p1_end - p1_start)
        end = p1_end
        if merges:
            merge.append(sum(e.time_range.end - e.time_range.start for e in merges))
            end = max(e.time_range.end for e in merges)
            tail.append(end - p1_end)
        total.append(end - p1_start)

    def med(xs):
        return round(statistics.median(xs), 2) if xs else None
    return dict(first_phase=med(first), merge=med(merge), merge_tail=med(tail),
                span=med(total), runs=len(runs), kernels=sorted(names))


def parts(out_dir: str, specs: list[str]) -> None:
    """``parts``: see the module docstring."""
    l2 = int(getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 64 << 20))
    flush = torch.empty(max(2 * l2, 256 << 20), dtype=torch.uint8, device="cuda")
    rows: list[dict] = []
    for spec in specs or WORKLOADS:
        batch = build_batch(_workload(spec), dtype=torch.bfloat16)
        for cell, (plan, tuning) in CELLS.items():
            fn = make(batch, plan, tuning)
            row: dict = dict(dtype="bfloat16", workload=spec, cell=cell)
            lp = kernels.plan_attention(
                batch.q, batch.k_cache, batch.v_cache, batch.cu_seqlens_q, batch.kv_lens,
                batch.block_table, host_lens=(batch.q_lens(), batch.kv_lens.tolist()),
                **_plan_args(plan))
            row["plan"] = dict(plan=lp.plan, keys_rows=lp.keys_rows, num_splits=lp.num_splits,
                               walk_lead=lp.walk_lead, walk_splits=lp.walk_splits,
                               value_blocks=lp.value_blocks, scores_ahead=lp.scores_ahead,
                               split_tokens=lp.split_tokens, lead_tokens=lp.lead_tokens,
                               dependent_merge=lp.dependent_merge)
            row.update(_parts_of(fn, flush))
            _record(rows, row, out_dir, "parts.jsonl")
        del batch


def _plan_args(cell: str) -> dict:
    """``plan_attention``'s keyword arguments for ``cell``'s plan and sizes (switches dropped)."""
    base, _, sizes = cell.split("+")[0].partition("@")
    if base == "heuristic":
        return dict(split_size=None)
    args: dict = dict(plan=base)
    if sizes:
        split, _, lead = sizes.partition("/")
        args.update(split_size=int(split), lead_split_size=int(lead) if lead else None)
    return args


def main() -> None:
    args = sys.argv[1:]
    if len(args) < 2 or args[1] not in STEPS.split("|"):
        sys.exit(f"usage: python benchmarks/probe_round29.py OUT_DIR {STEPS} [WORKLOAD ...]")
    out_dir, step, specs = args[0], args[1], args[2:]
    os.makedirs(out_dir, exist_ok=True)
    if step == "parts":
        parts(out_dir, specs)
    else:
        times(out_dir, specs, cells=CELLS, base="auto", defaults=WORKLOADS, repeats=REPEATS,
              make=make)


if __name__ == "__main__":
    main()
