"""What a fused prefill program costs: a fixed part per program and a part per KV tile, fitted
to measured times (no GPU; reports/h100-round14/README.md, section 5).

    PYTHONPATH=. python benchmarks/tile_cost_fit.py JSONL [CELL]

JSONL is a probe's output (``benchmarks/probe_round14.py``'s ``schedules.jsonl``): bf16 rows
with ``us_CELL`` (three repeats; ``CELL`` is ``default`` unless given) on workloads whose every
query block runs the fused plan's 128-row tile (32 tokens x 4 query heads per KV head, 8 KV
heads, one program per block and KV head, one program per SM at a time on 132 SMs). Each
workload's SM time (median x 132) is fitted, least squares over the workloads, as
``a * programs + b * tiles``, with ``tiles`` the KV tiles the programs walk
(``max_pos // 64 + 1`` each, as the kernel). ``a`` is what a program costs beyond its tiles
(launch, q load, the first tile's wait, the store); ``b`` a 64-key tile of 128 rows.

A model, not a measurement: it assumes every SM busy all the time (the slot-order model,
``benchmarks/slot_order_model.py``, puts prefill-varlen's tail within 0.3% of that), and counts
the programs that walk tiles (the grid's spare slots, which return at once, are left out).
"""

from __future__ import annotations

import json
import statistics
import sys

import torch

from benchmarks.slot_order_model import _blocks
from invariance.bench import WORKLOADS, parse_lengths

KV_HEADS = 8
BLOCK_Q = 32  # tokens per 128-row block: 4 query heads per KV head
SMS = 132
TILE_FLOP = 2 * 2 * 128 * 64 * 128  # q @ k^T and p @ v of one 128-row, 64-key tile


def load(path: str, cell: str = "default") -> list[tuple[str, int, int, float]]:
    """(workload, programs, tiles, median us) of the bf16 Gluon rows with ``us_CELL``; a file
    that cannot be read or a line that is not such a JSON row exits naming the path and line."""
    rows = []
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as exc:
        sys.exit(f"tile_cost_fit.py: cannot read {path}: {exc}")
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            r = json.loads(line)
            if r["dtype"] != "bfloat16" or f"us_{cell}" not in r or not r.get("gluon"):
                continue
            spec, us = r["workload"], statistics.median(r[f"us_{cell}"])
            w = WORKLOADS[spec] if spec in WORKLOADS else parse_lengths(spec)
        except (ValueError, KeyError, TypeError, statistics.StatisticsError) as exc:
            sys.exit(f"tile_cost_fit.py: {path}:{n}: expected a probe row (dtype, workload: a "
                     f"bench workload or lengths spec, gluon, us_{cell}: a list of times), got "
                     f"{line[:80]!r} ({exc!r})")
        blocks = _blocks(w, BLOCK_Q)
        rows.append((spec, len(blocks) * KV_HEADS, sum(b[2] for b in blocks) * KV_HEADS, us))
    return rows


def fit(rows: list[tuple[str, int, int, float]]) -> tuple[float, float]:
    """(a us per program, b us per tile): least squares of SM time on programs and tiles. The
    workloads must not all walk the same tiles per program (then a and b cannot be told apart:
    ValueError)."""
    x = torch.tensor([[p, t] for _, p, t, _ in rows], dtype=torch.float64)
    if len(rows) < 2 or int(torch.linalg.matrix_rank(x)) < 2:
        raise ValueError(f"need workloads with different tiles per program, got "
                         f"{[(spec, p, t) for spec, p, t, _ in rows]}")
    y = torch.tensor([us * SMS for *_, us in rows], dtype=torch.float64)
    a, b = torch.linalg.lstsq(x, y[:, None], driver="gelsd").solution[:, 0].tolist()
    return a, b


def main(path: str, cell: str = "default") -> None:
    rows = load(path, cell)
    try:
        a, b = fit(rows)
    except ValueError as exc:
        sys.exit(f"tile_cost_fit.py: {path}, cell {cell!r}: {exc}")
    print(f"a = {a:.2f} us per program, b = {b:.3f} us per tile "
          f"({TILE_FLOP / b / 1e6 * SMS:.0f} TFLOP/s over {SMS} SMs in the tiles alone)")
    print("| workload | programs | tiles | measured us | fitted us | per-program share |")
    print("|---|---|---|---|---|---|")
    for spec, p, t, us in rows:
        fitted = (a * p + b * t) / SMS
        print(f"| {spec} | {p} | {t} | {us:.0f} | {fitted:.0f} | {a * p / (a * p + b * t):.1%} |")


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3) or sys.argv[1].startswith("-"):
        sys.exit(f"usage: tile_cost_fit.py JSONL [CELL]; got {sys.argv[1:]}")
    main(*sys.argv[1:])
