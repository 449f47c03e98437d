"""Sweep tile configurations of the attention kernels on a CUDA GPU (tuning experiment).

    python benchmarks/tile_sweep.py --out DIR

For each ``kernels.Tuning(block_n, block_m, num_warps, num_stages)`` it times a few workloads of
``benchmarks/attention.py`` (CUDA-graph replay, L2 flushed) and checks which configurations give
bit-identical outputs (a configuration may only be swapped for another without changing bits if
they agree everywhere). Writes ``DIR/tile_sweep.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

# ``python benchmarks/tile_sweep.py`` puts benchmarks/ first on sys.path: the benchmark's module.
import attention as bench_mod
import torch

from invariance import compare_bits
from kernels import Tuning, unified_attention

# (BLOCK_N, BLOCK_M, num_warps, num_stages)
CONFIGS = [
    (64, 64, 4, 2), (128, 128, 8, 2), (64, 128, 8, 2), (128, 64, 4, 2), (128, 128, 8, 3),
    (64, 64, 4, 3), (64, 128, 8, 3), (64, 64, 8, 2), (64, 128, 4, 2), (128, 64, 4, 3),
]
# (workload, plan) pairs to time.
WORK = [("prefill-varlen", "fused"), ("mixed64", "fused"), ("decode-b64-ctx8k", "fused"),
        ("decode-b256-ctx1k", "fused"), ("decode-b1-ctx32k", "split"),
        ("decode-prod64", "split")]


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--budget-s", type=float, default=300.0)
    args = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("tile_sweep.py needs CUDA")
    os.makedirs(args.out, exist_ok=True)
    t0 = time.time()
    tensors = {n: bench_mod.build(bench_mod.WORKLOADS[n]) for n in {w for w, _ in WORK}}
    results: list[dict[str, Any]] = []
    ref_out: dict[tuple[int, str], tuple[str, tuple[torch.Tensor, torch.Tensor]]] = {}
    for bn, bm, nw, ns in CONFIGS:
        if time.time() - t0 > args.budget_s:
            break
        row: dict[str, Any] = {"block_n": bn, "block_m": bm, "num_warps": nw, "num_stages": ns,
                               "us": {}, "bits": {}}
        kw: dict[str, Any] = dict(
            tuning=Tuning(block_n=bn, block_m=bm, num_warps=nw, num_stages=ns), validate=False)
        for name, plan in WORK:
            t = tensors[name]
            key = f"{name}/{plan}"
            try:
                row["us"][key] = 1e3 * bench_mod.bench(
                    lambda t=t, plan=plan, kw=kw: unified_attention(*t.args(), plan=plan, **kw),
                    False)
                if name in ("mixed64", "decode-b64-ctx8k"):
                    res = unified_attention(*t.args(), plan=plan, **kw)
                    first = ref_out.setdefault((bn, key), (f"{bm}/{nw}/{ns}", res))
                    diffs = [compare_bits(a, b, name=n) for n, a, b in
                             zip(("out", "lse"), res, first[1], strict=True)]
                    same = all(d.equal for d in diffs)
                    row["bits"][key] = f"vs BN{bn} {first[0]}: " + (
                        "identical" if same else "; ".join(d.summary() for d in diffs))
            except Exception as exc:
                row["us"][key] = f"error {type(exc).__name__}: {str(exc)[:200]}"
        results.append(row)
        print(json.dumps(row), flush=True)
    with open(os.path.join(args.out, "tile_sweep.json"), "w") as f:
        json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
