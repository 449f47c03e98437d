"""Round-11 probe (H100): the fused plan's loop structure on prefill-like batches
(reports/h100-round11/README.md).

    python benchmarks/probe_round11.py OUT_DIR loops|tune|small|split [WORKLOAD ...]

The fused kernel walks a query block's KV tiles either in one flat loop with the fold at each
split boundary (``Tuning(nested_loop=False)``, rounds 1-10) or in an inner loop per split with
the fold after it (``nested_loop=True``: the split kernel's loop, so one or two fully visible
tiles per step, ``tiles_per_step``). The same operations in the same order per row; the loop
structure changes register allocation (offline, Triton 3.6 sm_90: 256 rows on 8 warps spill
2300 bytes flat, 1944 nested with K rows; 128 rows on 8 warps spill none either way with one
tile per step; reports/h100-round11/cpu/kernel-stats.md) and what the
scheduler may overlap (with two tiles per step, the second tile's score dot and the first
tile's exponentials).

``loops`` (call 1): for each prefill-like workload, each cell of ``CELLS`` (rows, warps,
stages, nested, tiles per step) against the default launch: bits of out and LSE at bf16 (every
cell) and fp16 (``FP16_CELLS``), times at bf16 (CUDA graphs, L2 flushed, medians of 20; three
repeats, interleaved cell by cell). Writes ``fused.jsonl`` after each workload.

``tune`` (call 2): the same around call 1's best cell (128 rows on 8 warps, nested, two tiles
per step): stages 3 and 4, one tile per step, K loaded as rows (``krows``: the fused kernel's
128-row tiles load K as columns by default), the flat loop with 3 stages, and 256-row tiles
with 4 stages or K rows; and the fused plan of large-batch decode (64-row tiles) nested. Writes
``tune.jsonl``.

``small`` (call 7, on the rules of calls 3-5): prefill-like batches whose grid is smaller
than the GPU (``plan="auto"`` takes the split plan there, whose programs now get 128 rows on 8
warps and 3 stages too) under the default against round 10's launch (``Tuning(block_m=128)``: 4
warps, 2 stages); and large-batch decode (fused plan, 64 rows) with 3 stages against the
default 2. Bits at bf16 and fp16, times at bf16 (three repeats, interleaved). Writes
``small.jsonl``.

``split`` (call 8; mixed64 and prefill:4kx8 added for call 12): prefill-like batches under
the split plan (the ``auto`` pick for grids smaller than the GPU, and on larger grids where a
long request would be a tail, with host lengths) with 128 rows on 8 warps and 3 stages at one
and two tiles per step, against round 10's 128 rows on 4 warps and 2 stages at one and two;
bits against the default at bf16 (every cell) and fp16 (two tiles per step on 8 warps), times
at bf16 (three repeats, interleaved). Writes ``split.jsonl``.
"""

from __future__ import annotations

import json
import sys

import torch

import kernels
from benchmarks.probe_round4 import call, patched, save
from benchmarks.probe_round5 import _bits_vs
from benchmarks.probe_round10 import _a_against_b
from benchmarks.tile_sweep import _graphed as graphed
from invariance.bench import WORKLOADS, CudaTimer, build_batch, parse_lengths

WORKLOADS_R11 = ["prefill-varlen", "mixed64", "prefill:4kx8", "decode:8kx32+chunk:256/4kx32",
                 "chunk:1k/16kx4+prefill:1kx12"]
#: (block_m, warps, stages, nested, tiles per step); None: the default launch (the reference).
CELLS: list[tuple[int, int, int, bool, int] | None] = [
    None,
    (256, 8, 3, False, 1), (256, 8, 3, True, 1), (256, 8, 3, True, 2),
    (256, 8, 2, True, 1), (256, 8, 2, True, 2),
    (128, 4, 2, False, 1), (128, 4, 2, True, 1), (128, 4, 2, True, 2),
    (128, 8, 2, False, 1), (128, 8, 2, True, 1), (128, 8, 2, True, 2), (128, 8, 3, True, 2),
]
FP16_CELLS = [(256, 8, 3, True, 2), (128, 4, 2, True, 2), (128, 8, 2, True, 2)]

TUNE_PREFILL = ["mixed64", "decode:8kx32+chunk:256/4kx32", "prefill-varlen", "prefill:4kx8"]
TUNE_DECODE = ["decode-b64-ctx8k", "decode-b256-ctx8k", "decode-b64-ctx1k"]
#: (block_m, warps, stages, nested, tiles per step[, "krows"])
TUNE_CELLS_PREFILL: list = [
    None, (128, 8, 3, True, 2), (128, 8, 4, True, 2), (128, 8, 3, True, 1), (128, 8, 4, True, 1),
    (128, 8, 3, True, 2, "krows"), (128, 8, 3, False, 1), (256, 8, 4, False, 1),
    (256, 8, 3, False, 1, "krows")]
TUNE_CELLS_DECODE: list = [
    None, (64, 4, 2, True, 1), (64, 4, 2, True, 2), (64, 4, 3, True, 2), (64, 4, 3, False, 1),
    (64, 8, 3, True, 2)]
TUNE_FP16 = [(128, 8, 3, True, 2), (128, 8, 4, True, 2), (128, 8, 3, True, 2, "krows"),
             (64, 4, 3, True, 2)]


def _tuning(cell: tuple | None) -> kernels.Tuning:
    if cell is None:
        return kernels.Tuning()
    bm, warps, stages, nested, tps = cell[:5]
    return kernels.Tuning(block_m=bm, num_warps=warps, num_stages=stages, nested_loop=nested,
                          tiles_per_step=tps)


def _k_rows_round10(lp, dtype: torch.dtype) -> bool:
    """How calls 1 and 2 loaded K: as rows only in the split kernel and in tiles of up to 64
    rows (round 10's ``_k_rows``; the final one gives the nested loop rows too)."""
    return dtype != torch.float32 and (lp.plan == "split" or lp.block_m <= 64)


def _call(batch, cell: tuple | None):
    """The fused plan under ``cell``, loading K as calls 1 and 2 did: with "krows" as rows,
    else by round 10's rule (patched into ``kernels.attention._k_rows`` around the call, so
    graph captures take it too). The default cell keeps the final code's own choice."""
    fn = call(batch, "fused", _tuning(cell))
    if cell is None:
        return fn
    k_rows = (lambda lp, dtype: True) if "krows" in cell else _k_rows_round10
    return patched(fn, kernels.attention, "_k_rows", k_rows)


def _workload(spec: str):
    return WORKLOADS[spec] if spec in WORKLOADS else parse_lengths(spec)


def fused(out_dir: str, specs: list[str], cells_of=lambda spec: CELLS,
          fp16_cells=FP16_CELLS, name: str = "fused.jsonl") -> None:
    timer = CudaTimer(iters=20, warmup=2)
    rows: list[dict] = []
    for spec in specs:
        for dtype in (torch.bfloat16, torch.float16):
            batch = build_batch(_workload(spec), dtype=dtype)
            ref = call(batch, "fused")()
            cells = cells_of(spec) if dtype == torch.bfloat16 else [
                c for c in cells_of(spec) if c in fp16_cells]
            done: list[tuple[dict, object]] = []
            for cell in cells:
                row = dict(dtype=str(dtype).removeprefix("torch."), workload=spec,
                           cell="default" if cell is None else "/".join(map(str, cell)))
                try:
                    fn = _call(batch, cell)
                    row["bits_differing"] = _bits_vs(ref, fn())
                    if dtype == torch.bfloat16:
                        done.append((row, graphed(fn)))
                except Exception as exc:  # a probe: record and go on
                    row["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
                rows.append(row)
                print(json.dumps(row), flush=True)
            for _ in range(3):
                for row, g in done:
                    row.setdefault("us", []).append(round(timer.time_fn(g) * 1000, 1))
            for row, _ in done:
                print(json.dumps(row), flush=True)
            del batch, ref, done
            torch.cuda.empty_cache()
            save(out_dir, name, rows)


SMALL_PREFILL = ["prefill:1kx1", "prefill:512x2", "prefill:256x2", "chunk:256/4kx2",
                 "chunk:128/8kx1", "prefill:1kx4"]
SMALL_DECODE = ["decode-b64-ctx1k", "decode-b64-ctx8k", "decode-b64-ctx32k", "decode-b256-ctx8k"]


def small(out_dir: str, specs: list[str]) -> None:
    timer = CudaTimer(iters=20, warmup=2)
    rows: list[dict] = []
    for spec in specs or SMALL_PREFILL + SMALL_DECODE:
        decode = spec.startswith("decode-")
        other = kernels.Tuning(num_stages=3) if decode else kernels.Tuning(block_m=128)
        for dtype in (torch.bfloat16, torch.float16):
            batch = build_batch(_workload(spec), dtype=dtype)
            lp = kernels.plan_attention(batch.q, batch.k_cache, batch.v_cache,
                                        batch.cu_seqlens_q, batch.kv_lens, batch.block_table,
                                        validate=False,
                                        host_lens=(batch.q_lens(), batch.kv_lens.tolist()))
            row = dict(dtype=str(dtype).removeprefix("torch."), workload=spec, plan=lp.plan,
                       launch=f"{lp.block_m}/{lp.num_warps}/{lp.num_stages}",
                       other="3 stages" if decode else "128/4/2 (round 10)")
            _a_against_b(row, timer, dtype == torch.bfloat16, call(batch),
                         call(batch, "auto", other), ("default", "other"))
            rows.append(row)
            print(json.dumps(row), flush=True)
            del batch
            torch.cuda.empty_cache()
            save(out_dir, "small.jsonl", rows)


SPLIT_WORKLOADS = ["chunk:256/4kx2", "chunk:128/8kx1", "prefill:256x2", "chunk:512/16kx1",
                   "chunk:64/32kx2", "chunk:256/2kx3", "mixed64", "prefill:4kx8"]
#: (block_m, warps, stages, tiles per step) under the split plan
SPLIT_CELLS = [(128, 8, 3, 2), (128, 4, 2, 1), (128, 4, 2, 2), (128, 8, 2, 2), (128, 8, 4, 2)]


def split(out_dir: str, specs: list[str]) -> None:
    timer = CudaTimer(iters=20, warmup=2)
    rows: list[dict] = []
    for spec in specs or SPLIT_WORKLOADS:
        for dtype in (torch.bfloat16, torch.float16):
            batch = build_batch(_workload(spec), dtype=dtype)
            ref = call(batch, "split")
            cells = SPLIT_CELLS if dtype == torch.bfloat16 else [(128, 8, 3, 2)]
            row = dict(dtype=str(dtype).removeprefix("torch."), workload=spec)
            row["bits_differing"] = {
                "/".join(map(str, c)): _bits_vs(ref(), call(batch, "split", kernels.Tuning(
                    block_m=c[0], num_warps=c[1], num_stages=c[2], tiles_per_step=c[3]))())
                for c in cells}
            if dtype == torch.bfloat16:
                graphs = [("default", graphed(ref))] + [
                    ("/".join(map(str, c)), graphed(call(batch, "split", kernels.Tuning(
                        block_m=c[0], num_warps=c[1], num_stages=c[2], tiles_per_step=c[3]))))
                    for c in cells]
                for _ in range(3):
                    for name, g in graphs:
                        row.setdefault(f"us_{name}", []).append(
                            round(timer.time_fn(g) * 1000, 1))
            rows.append(row)
            print(json.dumps(row), flush=True)
            del batch
            torch.cuda.empty_cache()
            save(out_dir, "split.jsonl", rows)


def tune(out_dir: str, specs: list[str]) -> None:
    fused(out_dir, specs or TUNE_PREFILL + TUNE_DECODE,
          lambda spec: TUNE_CELLS_DECODE if spec.startswith("decode-") else TUNE_CELLS_PREFILL,
          TUNE_FP16, "tune.jsonl")


if __name__ == "__main__":
    modes = {"loops": lambda out, specs: fused(out, specs or WORKLOADS_R11), "tune": tune,
             "small": small, "split": split}
    if len(sys.argv) < 3 or sys.argv[2] not in modes:
        sys.exit(f"usage: probe_round11.py OUT_DIR loops|tune|small|split [WORKLOAD ...]; "
                 f"got {sys.argv[1:]}")
    modes[sys.argv[2]](sys.argv[1], sys.argv[3:])
