"""Round-9 probe (H100), two bit-neutral candidates against the current launch, in one run
(reports/h100-round9/README.md).

    python benchmarks/probe_round9.py OUT_DIR [pair|foldmem|all]

``pair``: the split kernel walking its unmasked tiles two per loop step
(``KERNELS_TILES_PER_STEP=2``: both tiles' loads, scores and exponentials ahead of the first
tile's ``p @ v``; the same arithmetic per row), with the value-block rule and with one block,
two or one pipeline stages. Bits of out and LSE against one tile per step at bf16 and fp16 on
decode workloads, times (bf16) on the short ones. Writes ``pair.jsonl``.

``foldmem``: the fused kernel keeping its running fold's ``acc`` in a float32 workspace instead
of registers (``KERNELS_FOLD_IN_MEMORY=1``; loaded and stored at split boundaries only), split
sizes 1024 and 256. Bits against registers, times (bf16). Writes ``foldmem.jsonl``.
"""

from __future__ import annotations

import json
import os
import sys

import torch

import kernels
from benchmarks.probe_round4 import call, save
from benchmarks.probe_round5 import _bits_vs
from benchmarks.tile_sweep import _graphed as graphed
from invariance.bench import WORKLOADS, CudaTimer, build_batch

PAIR_WORKLOADS = ["decode-b1-ctx1k", "decode-b8-ctx1k", "decode-b1-ctx8k", "decode-b8-ctx8k",
                  "decode-b1-ctx32k", "decode-b8-ctx32k", "decode-prod64", "decode-b64-ctx1k",
                  "mixed64"]
PAIR_TIMED = PAIR_WORKLOADS[:7]
#: (label, tiles per step, Tuning fields)
PAIR_CELLS = [("t1", "1", {}), ("t2", "2", {}), ("t2-s1", "2", {"num_stages": 1}),
              ("t1-vb1", "1", {"value_blocks": 1}), ("t2-vb1", "2", {"value_blocks": 1})]


def _run(batch, plan, tuning, env, value, split_size=kernels.DEFAULT_SPLIT_SIZE):
    os.environ[env] = value
    try:
        return call(batch, plan, tuning, split_size)()
    finally:
        os.environ.pop(env, None)


def _time(timer, batch, plan, tuning, env, value, split_size=kernels.DEFAULT_SPLIT_SIZE):
    os.environ[env] = value
    try:  # the launch reads the variable at capture; replays keep what was captured
        fn = graphed(call(batch, plan, tuning, split_size))
    finally:
        os.environ.pop(env, None)
    return round(timer.time_fn(fn) * 1000, 1)


QUAD_CELLS = [("t1", "1", {}), ("t2", "2", {}), ("t4", "4", {}), ("t4-s1", "4", {"num_stages": 1}),
              ("t2-vb4", "2", {"value_blocks": 4}), ("t4-vb4", "4", {"value_blocks": 4})]


def quad(out_dir: str) -> None:
    """Four unmasked tiles per loop step against two and one, short decode (bf16)."""
    env = "KERNELS_TILES_PER_STEP"
    timer = CudaTimer(iters=30, warmup=3)
    rows = []
    for name in PAIR_WORKLOADS[:3]:
        batch = build_batch(WORKLOADS[name])
        ref = _run(batch, "split", kernels.Tuning(), env, "1")
        for label, tps, fields in QUAD_CELLS:
            tuning = kernels.Tuning(**fields)
            row = dict(dtype="bfloat16", workload=name, config=label,
                       bits_differing=_bits_vs(ref, _run(batch, "split", tuning, env, tps)),
                       us=_time(timer, batch, "split", tuning, env, tps))
            rows.append(row)
            print(json.dumps(row), flush=True)
        save(out_dir, "quad.jsonl", rows)


def pair(out_dir: str) -> None:
    env = "KERNELS_TILES_PER_STEP"
    timer = CudaTimer(iters=30, warmup=3)
    rows = []
    for dtype in (torch.bfloat16, torch.float16):
        for name in PAIR_WORKLOADS:
            batch = build_batch(WORKLOADS[name], dtype=dtype)
            refs = {}
            for label, tps, fields in PAIR_CELLS:
                tuning = kernels.Tuning(**fields)
                key = fields.get("value_blocks")
                got = _run(batch, "split", tuning, env, tps)
                if tps == "1":
                    refs[key] = got
                row = dict(dtype=str(dtype).removeprefix("torch."), workload=name,
                           config=label, bits_differing=_bits_vs(refs[key], got))
                if dtype == torch.bfloat16 and name in PAIR_TIMED:
                    row["us"] = _time(timer, batch, "split", tuning, env, tps)
                rows.append(row)
                print(json.dumps(row), flush=True)
            del batch, refs
            torch.cuda.empty_cache()
            save(out_dir, "pair.jsonl", rows)


FOLD_WORKLOADS = ["mixed64", "prefill-varlen", "decode-b64-ctx8k", "decode-b256-ctx8k",
                  "decode-b64-ctx32k"]


def foldmem(out_dir: str) -> None:
    env = "KERNELS_FOLD_IN_MEMORY"
    timer = CudaTimer(iters=20, warmup=3)
    rows = []
    for name in FOLD_WORKLOADS:
        for dtype in (torch.bfloat16, torch.float16):
            batch = build_batch(WORKLOADS[name], dtype=dtype)
            for split in (1024, 256):
                if split == 256 and name.startswith("decode"):
                    continue
                ref = _run(batch, "fused", None, env, "0", split)
                for mem in ("0", "1"):
                    row = dict(dtype=str(dtype).removeprefix("torch."), workload=name,
                               split_size=split, fold_in_memory=mem == "1",
                               bits_differing=_bits_vs(ref, _run(batch, "fused", None, env, mem,
                                                                 split)))
                    if dtype == torch.bfloat16:
                        row["us"] = _time(timer, batch, "fused", None, env, mem, split)
                    rows.append(row)
                    print(json.dumps(row), flush=True)
            del batch
            torch.cuda.empty_cache()
            save(out_dir, "foldmem.jsonl", rows)


if __name__ == "__main__":
    what = sys.argv[2] if len(sys.argv) > 2 else "all"
    if what in ("pair", "all"):
        pair(sys.argv[1])
    if what == "quad":
        quad(sys.argv[1])
    if what in ("foldmem", "all"):
        foldmem(sys.argv[1])
