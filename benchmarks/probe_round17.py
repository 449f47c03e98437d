"""Round-17 probe (H100): small splits without their long-context cost
(reports/h100-round17/README.md).

    python benchmarks/probe_round17.py OUT_DIR walk|flat|stages [WORKLOAD ...]

Round 16 measured 512- and 256-token splits: they take the cost of invariance at batch 1 with
1k / 8k tokens to 1.13x / 1.00x (512) and 1.05x / 1.10x (256), but long decode gets slower
(batch 1 with 32k: 82 / 95 us against 70 at 1024). Two parts of that cost looked like
scheduling, not arithmetic:

- the split kernel runs one program per split: at 256 tokens, 4 tiles each, so a long row is
  many short programs, each paying its pipeline's fill and its q load;
- the merge folds a row's partials in split order, loading ``_MERGE_CHUNK`` (8) of them per
  step: 128 partials at 256 tokens with 32k are 16 rounds of loads in a chain.

``walk`` (call 1, at experiment commit 574f80c: a program walks its splits in nested loops,
one per split, each with its own software pipeline). For each workload and split size (1024,
512, 256) the reference is the split plan with one split per program and merge chunks of 8.
Against it: programs that walk 2, 4 or 8 consecutive splits
(``Tuning(splits_per_program=...)``; each split from a fresh state, written as its own
partial), merge chunks of 32 (``_MERGE_CHUNK`` patched; the chunk size never changes the fold
order), and for short rows two tiles per step.

``flat`` (call 2, at experiment commit 4580fa6: a walking program runs one flat loop over its
splits' tiles, one pipeline across the boundaries, each split's partial written at its
boundary): the same rows, merge chunks of 8 only. The probe cannot tell the two forms apart: at
4580fa6 its ``walk`` mode would time the flat loop.

``stages`` (call 4, at 573332d, whose kernels have no walking programs): the same rows with one
split per program at 3 and 4 pipeline stages instead of the rule's 5. Offline (Triton 3.6,
sm_90a) the long rows' split kernel takes 82,944 bytes of shared memory at 3 or 4 stages
against 115,712 at 5. The question was whether less shared memory per program hides the
per-split cost of small splits. (Two programs fit an H100 SM at 5 stages too, so for those
rows this changes the pipeline depth, not the occupancy.)

All three compare the bits of out and LSE with the reference at bf16 and fp16 (0 expected:
scheduling only) and at bf16 time every cell (CUDA graphs, L2 flushed, medians of 20, three
repeats interleaved cell by cell), with the 1024-token default and the control
(``split_size=None``, ``kernels-heuristic``) in the same rows. The control's bits differ from
each fixed split size's wherever its split count differs, which shows the comparison can fail.
Writes ``MODE.jsonl`` after each row. Neither walking variant was kept (the report says why):
at other commits ``kernels.Tuning`` has no ``splits_per_program``, and the ``walk`` and
``flat`` modes exit, naming the two commits.
"""

from __future__ import annotations

import json
import os
import sys

import torch

import kernels
import kernels.attention as attention
from benchmarks.probe_round4 import call, patched, save
from benchmarks.probe_round11 import _workload
from benchmarks.probe_round12 import bits_and_times
from invariance.bench import CudaTimer, build_batch

WORKLOADS = ["decode-b1-ctx1k", "decode-b8-ctx1k", "decode-b1-ctx8k", "decode-b8-ctx8k",
             "decode-b1-ctx32k", "decode-b8-ctx32k", "decode-prod64"]
SHORT = {"decode-b1-ctx1k", "decode-b8-ctx1k"}
#: Per split size: the cells (splits per program, merge chunk, tiles per step or None).
CELLS = {
    1024: [(1, 32, None), (2, 8, None), (2, 32, None)],
    512: [(1, 32, None), (2, 8, None), (2, 32, None), (4, 32, None)],
    256: [(1, 32, None), (2, 32, None), (4, 8, None), (4, 32, None), (8, 32, None)],
}
SHORT_CELLS = [(1, 8, 2), (1, 32, 2)]
#: ``stages``: per split size, the stages of one-split-per-program cells (the reference: 5).
STAGE_CELLS = {size: [3, 4] for size in (1024, 512, 256)}
FLAT_CELLS = {1024: [(2, 8, None)], 512: [(2, 8, None), (4, 8, None)],
              256: [(2, 8, None), (4, 8, None), (8, 8, None)]}


def _cell(batch, size: int, walk: int, chunk: int, step: int | None):
    fn = call(batch, "split", kernels.Tuning(splits_per_program=walk, tiles_per_step=step),
              split_size=size)
    return patched(fn, attention, "_MERGE_CHUNK", chunk)


def _ref(batch, size: int, mode: str):
    """One split per program, merge chunks of 8, the rule's stages."""
    if mode == "stages":
        return call(batch, "split", split_size=size)
    return call(batch, "split", kernels.Tuning(splits_per_program=1), split_size=size)


def _cells(batch, spec: str, size: int, mode: str) -> dict:
    if mode == "stages":
        return {f"s{st}": call(batch, "split", kernels.Tuning(num_stages=st), split_size=size)
                for st in STAGE_CELLS[size]}
    cells_by_size, short_cells = (CELLS, SHORT_CELLS) if mode == "walk" else (FLAT_CELLS, [])
    return {f"w{w}c{c}" + ("" if t is None else f"t{t}"): _cell(batch, size, w, c, t)
            for w, c, t in cells_by_size[size] + (short_cells if spec in SHORT else [])}


def run(out_dir: str, specs: list[str], mode: str) -> None:
    """Every row of MODE (walk, flat or stages) into OUT_DIR/MODE.jsonl."""
    timer = CudaTimer(iters=20, warmup=2)
    rows: list[dict] = []
    for spec in specs or WORKLOADS:
        for dtype in (torch.bfloat16, torch.float16):
            batch = build_batch(_workload(spec), dtype=dtype)
            for size in (1024, 512, 256):
                ref = _ref(batch, size, mode)
                row: dict = dict(dtype=str(dtype).removeprefix("torch."), workload=spec,
                                 split_size=size)
                cells = _cells(batch, spec, size, mode)
                cells["auto"] = call(batch, "auto", split_size=size)
                cells["control"] = call(batch, "auto", split_size=None)
                if size != kernels.DEFAULT_SPLIT_SIZE:
                    cells["default1024"] = call(batch, "auto")
                bits_and_times(row, ref, cells, timer, timed=dtype == torch.bfloat16)
                rows.append(row)
                print(json.dumps(row), flush=True)
                save(out_dir, f"{mode}.jsonl", rows)
            del batch
            torch.cuda.empty_cache()


if __name__ == "__main__":
    walking = len(sys.argv) > 2 and sys.argv[2] in ("walk", "flat")
    if walking and "splits_per_program" not in kernels.Tuning.__dataclass_fields__:
        sys.exit("probe_round17.py: kernels.Tuning has no splits_per_program at this commit; "
                 "the walking programs were measured at experiment commits 574f80c (walk) and "
                 "4580fa6 (flat) and taken out (reports/h100-round17/README.md)")
    if len(sys.argv) < 3 or sys.argv[2] not in ("walk", "flat", "stages"):
        sys.exit(f"usage: probe_round17.py OUT_DIR walk|flat|stages [WORKLOAD ...]; "
                 f"got {sys.argv[1:]}")
    os.makedirs(sys.argv[1], exist_ok=True)
    run(sys.argv[1], sys.argv[3:], sys.argv[2])
