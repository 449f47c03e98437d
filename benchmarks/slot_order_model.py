"""A list-scheduling model of the fused plan's program order (reports/h100-round10/README.md,
section 3): which order of query-block slots leaves the shortest tail. No GPU.

    PYTHONPATH=. python benchmarks/slot_order_model.py

Each fused program (one per query-block slot and KV head) is modelled as lasting the number of
KV tiles its block walks (``max_pos // BLOCK_N + 1``); programs start in launch order on the
first free one of ``slots`` places (two per SM with 128-row tiles, one with 256-row tiles, 132
SMs), KV head after KV head as the 2-D grid launches them. The makespan of three orders is
printed against the lower bound (the total over the places):

- ``plain``: the last slots first (the fused kernel's order without ``slot_order``);
- ``own tiles``: slots sorted by the tiles they walk, longest first;
- ``request``: requests sorted by their KV tiles, longest first, each request's last blocks
  first (the order ``Tuning(slot_order=True)`` computes on the device).

A model, not a measurement: it ignores what the GPU shares between programs (L2, two programs
on one SM running slower than one alone).
"""

from __future__ import annotations

import heapq

from invariance.bench import WORKLOADS, BenchWorkload, parse_lengths

BLOCK_N = 64
NUM_KV_HEADS = 8
GROUP = 4  # query heads per KV head: rows per query token
#: (workload, tile rows, programs at once)
CASES = [("mixed64", 128, 264), ("prefill-varlen", 256, 132),
         ("chunk:512/8kx8+chunk:64/1kx56", 128, 264), ("decode:8kx32+chunk:256/4kx32", 128, 264),
         ("chunk:1k/16kx4+prefill:1kx12", 256, 132), ("prefill:4kx8", 256, 132)]


def _blocks(w: BenchWorkload, block_q: int) -> list[tuple[int, int, int, int]]:
    """(request, block, tiles the block walks, tiles of the request) per query block."""
    out = []
    for b, (q, kv) in enumerate(zip(w.q_lens, w.kv_lens, strict=True)):
        for i in range(-(-q // block_q)):
            end = min((i + 1) * block_q, q)
            out.append((b, i, (kv - q + end - 1) // BLOCK_N + 1, -(-kv // BLOCK_N)))
    return out


def makespan(durations: list[int], places: int) -> int:
    """When the last program ends, each starting on the first free place in list order."""
    free = [0] * places
    for d in durations:
        heapq.heappush(free, heapq.heappop(free) + d)
    return max(free)


def main() -> None:
    print("| workload | tile rows | programs at once | lower bound | plain | own tiles | request |")
    print("|---|---|---|---|---|---|---|")
    for spec, rows, places in CASES:
        w = WORKLOADS[spec] if spec in WORKLOADS else parse_lengths(spec)
        blocks = _blocks(w, rows // GROUP)
        orders = {
            "plain": sorted(blocks, key=lambda x: (-x[0], -x[1])),
            "own tiles": sorted(blocks, key=lambda x: (-x[2], x[0], x[1])),
            "request": sorted(blocks, key=lambda x: (-x[3], -x[0], -x[1])),
        }
        spans = {k: makespan([x[2] for _ in range(NUM_KV_HEADS) for x in o], places)
                 for k, o in orders.items()}
        bound = sum(x[2] for x in blocks) * NUM_KV_HEADS / places
        print(f"| {spec} | {rows} | {places} | {bound:.0f} | {spans['plain']} | "
              f"{spans['own tiles']} | {spans['request']} |")


if __name__ == "__main__":
    main()
