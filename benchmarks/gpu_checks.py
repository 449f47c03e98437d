"""Correctness and invariance experiments for ``kernels`` on a real GPU (one command).

    python benchmarks/gpu_checks.py --out DIR [--tile BN,BM,WARPS,STAGES] [--quick]

Everything goes through the harness: batches are ``invariance`` workloads and schedules, bit
comparisons ``invariance.replay`` / ``compare_bits``, accuracy ``invariance.accuracy`` (the
float64 reference and the one tolerance table). At the production shape (Hq=32, Hkv=8, D=128,
page 16; fp16 and bf16, plus fp32 and D=64/256 spot checks) it checks, and records in
``DIR/gpu_checks.json``:

- accuracy against the float64 reference;
- fused == split == auto, bit for bit, for several split sizes;
- invariance of a request's rows: decode vs prefill vs chunked prefill next to neighbours, on
  page sizes 1, 16 and 64; alone vs in batches of 16 and 64 decodes;
- the negative control: ``split_size=None`` changes bits between batch sizes;
- whether a row's bits change with BLOCK_M / num_warps (``kernels.Tuning`` overrides);
- CUDA-graph capture (value checks skipped while capturing) and replay give the eager bits;
- the split plan never reads uninitialised workspace (allocator pre-filled with NaN).

``--tile`` applies ``kernels.Tuning(block_n, block_m, num_warps, num_stages)`` to every fp16/bf16
call: a candidate tile config (block_n is bit-defining: it defines other numerics).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from invariance import (
    AttentionBatch,
    Chunk,
    HeadConfig,
    PageLayout,
    Request,
    Schedule,
    Step,
    Workload,
    compare_bits,
    replay,
    run_schedule,
)
from invariance.accuracy import measure_accuracy
from kernels import DEFAULT_SPLIT_SIZE, Tuning, tile_config, unified_attention

RESULTS: dict[str, Any] = {}
DEVICE = "cuda"
HALF = (torch.float16, torch.bfloat16)
PROD = HeadConfig(32, 8, 128)
# Tile-config overrides (``--tile``) applied to every fp16/bf16 call.
TILE: Tuning | None = None


@dataclass(frozen=True)
class Kernels:
    """A harness backend: ``unified_attention`` with a split size, a plan and tuning (default:
    the ``--tile`` overrides for fp16/bf16)."""

    split_size: int | None = DEFAULT_SPLIT_SIZE
    plan: str = "auto"
    tuning: Tuning | None = None

    def __call__(self, batch: AttentionBatch) -> tuple[torch.Tensor, torch.Tensor]:
        tuning = self.tuning or (TILE if batch.q.dtype in HALF else None)
        return unified_attention(
            batch.q, batch.k_cache, batch.v_cache, batch.cu_seqlens_q, batch.kv_lens,
            batch.block_table, sm_scale=batch.sm_scale, split_size=self.split_size,
            plan=self.plan, tuning=tuning)


def block_n(dtype: torch.dtype, head_dim: int) -> int:
    """The tile width of this GPU's contract (128 keys for half precision at head dim 128 on
    Hopper with Triton 3.6's Gluon), or the --tile override's."""
    if TILE is not None and TILE.block_n is not None and dtype in HALF:
        return TILE.block_n
    from kernels.attention import _gluon_installed, _sm_major

    sm = _sm_major(torch.device("cuda")) if torch.cuda.is_available() else None
    return tile_config(dtype, head_dim, sm, _gluon_installed(dtype, head_dim, sm)).block_n


def record(name: str, ok: bool, detail: Any = None) -> None:
    RESULTS[name] = {"ok": ok, "detail": detail}
    print(f"[{'ok' if ok else 'FAIL'}] {name}: {detail}", flush=True)


def record_replay(name: str, backend: Kernels, workload: Workload, a: Schedule,
                  b: Schedule) -> None:
    """Record whether ``a`` and ``b`` agree bit for bit on every token they share."""
    try:
        cmp = replay(backend, workload, a, b, device=DEVICE)
    except AssertionError as exc:
        record(name, False, str(exc)[:1000])
        return
    record(name, True, f"{len(cmp.keys)} tokens bit-identical")


def tag(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def mixed(seed: int, n: int = 12, max_kv: int = 2500,
          first_id: int = 0) -> tuple[list[Request], list[Chunk]]:
    """``n`` requests (ids from ``first_id``): decode rows, prefill chunks, whole prefills."""
    g = torch.Generator().manual_seed(seed)
    requests, chunks = [], []
    for i in range(n):
        kv = int(torch.randint(1, max_kv, (1,), generator=g))
        kind = i % 3
        q = 1 if kind == 0 else (min(kv, int(torch.randint(1, 300, (1,), generator=g)))
                                 if kind == 1 else kv)
        requests.append(Request(first_id + i, kv))
        chunks.append(Chunk(first_id + i, kv - q, kv))
    return requests, chunks


def check_accuracy_and_plans(dtype: torch.dtype, heads: HeadConfig, page: int) -> None:
    name = f"{tag(dtype)}-{heads}-page{page}"
    requests, chunks = mixed(seed=1)
    workload = Workload(tuple(requests), heads, dtype, seed=1)
    schedule = Schedule((Step(tuple(chunks)),),
                        PageLayout(page, "shuffled", extra_columns=3, fill="nan", seed=3))
    cache: dict[tuple[int, str], torch.Tensor] = {}
    bn = block_n(dtype, heads.head_dim)
    for split in sorted({bn, 4 * bn, 512}):
        outs = {p: run_schedule(Kernels(split, p), workload, schedule, DEVICE, cache)
                for p in ("fused", "split", "auto")}
        acc = measure_accuracy(workload, outs["fused"], rows=64, backend="kernels")
        record(f"accuracy/{name}/S{split}", acc.passed,
               {"max_abs_err_out": acc.max_abs_err_out, "max_abs_err_lse": acc.max_abs_err_lse,
                "worst_ratio_to_bound": acc.worst_ratio})
        for p in ("split", "auto"):
            diffs = [compare_bits(getattr(outs[p], t), getattr(outs["fused"], t), name=t)
                     for t in ("out", "lse")]
            record(f"plans/{name}/S{split}/fused=={p}", all(d.equal for d in diffs),
                   "; ".join(d.summary() for d in diffs))


def _target_rows(backend: Kernels, workload: Workload,
                 schedule: Schedule) -> tuple[torch.Tensor, torch.Tensor]:
    out = run_schedule(backend, workload, schedule, DEVICE)
    rows = [i for i, (rid, _) in enumerate(out.keys) if rid == 0]
    return out.out[rows], out.lse[rows]


def check_invariance(dtype: torch.dtype, heads: HeadConfig = PROD) -> None:
    L, split = 1500, 256
    backend = Kernels(split)
    others, other_chunks = mixed(seed=9, n=9, first_id=1)
    workload = Workload((Request(0, L), *others), heads, dtype, seed=4242)
    full = Schedule((Step((Chunk(0, 0, L),)),), PageLayout(16))
    # Decode at several positions, batched together with neighbours.
    positions = [0, 63, 64, 255, 256, 777, L - 1]
    decode = Schedule((Step((*(Chunk(0, p, p + 1) for p in positions), *other_chunks)),),
                      PageLayout(16, "shuffled", seed=5))
    record_replay(f"invariance/{tag(dtype)}/prefill-vs-batched-decode", backend, workload, full,
                  decode)
    # Chunked prefill, the chunks in one batch with neighbours, on three page sizes.
    cuts = [0, 100, 613, 1024, L]
    chunked = Step((*(Chunk(0, a, b) for a, b in itertools.pairwise(cuts)), *other_chunks[:4]))
    for page in (1, 16, 64):
        record_replay(f"invariance/{tag(dtype)}/chunked-prefill-page{page}", backend, workload,
                      full, Schedule((chunked,), PageLayout(page, "shuffled", seed=6 + page)))


def check_control(dtype: torch.dtype, heads: HeadConfig = PROD) -> None:
    # Negative control: split_size=None, a decode row alone vs in a batch of 16 / 64 decodes.
    L = 1500
    neighbours = [Request(1 + i, 300 + 37 * i) for i in range(63)]
    workload = Workload((Request(0, L), *neighbours), heads, dtype, seed=4242)
    alone = Schedule((Step((Chunk(0, L - 1, L),)),), PageLayout(16))
    control = Kernels(split_size=None)
    base = _target_rows(control, workload, alone)
    diffs: dict[int, list[str] | None] = {}
    for n in (16, 64):
        batch = Step((Chunk(0, L - 1, L),
                      *(Chunk(r.id, r.length - 1, r.length) for r in neighbours[:n - 1])))
        batched = Schedule((batch,), PageLayout(16, "shuffled", seed=n))
        got = _target_rows(control, workload, batched)
        cmp = [compare_bits(g, b, name=t) for t, g, b in zip(("out", "lse"), got, base,
                                                                strict=True)]
        diffs[n] = None if all(d.equal for d in cmp) else [d.summary() for d in cmp]
        record_replay(f"invariance/{tag(dtype)}/default-split-alone-vs-batch{n}", Kernels(),
                      workload, alone, batched)
    record(f"control/{tag(dtype)}/split_size=None-differs",
           any(v is not None for v in diffs.values()), diffs)


def check_tile_overrides(dtype: torch.dtype, heads: HeadConfig = PROD) -> None:
    requests, chunks = mixed(seed=2, n=9, max_kv=1200)
    workload = Workload(tuple(requests), heads, dtype, seed=2)
    schedule = Schedule((Step(tuple(chunks)),), PageLayout(16, "shuffled", seed=1))
    cache: dict[tuple[int, str], torch.Tensor] = {}
    base = run_schedule(Kernels(256, "fused"), workload, schedule, DEVICE, cache)
    cfg = tile_config(dtype, heads.head_dim)
    out: dict[str, Any] = {"default": {"block_m": cfg.block_m, "num_warps": cfg.num_warps}}
    for bm, nw in [(16, 4), (32, 4), (64, 8), (128, 4), (128, 8), (64, 4), (16, 1), (32, 2)]:
        key = f"bm{bm}-w{nw}"
        try:
            tuning = Tuning(block_m=bm, num_warps=nw, block_n=TILE.block_n if TILE else None)
            got = run_schedule(Kernels(256, "fused", tuning), workload, schedule, DEVICE, cache)
            diffs = [compare_bits(getattr(got, t), getattr(base, t), name=t)
                     for t in ("out", "lse")]
            out[key] = "identical" if all(d.equal for d in diffs) else [d.summary() for d in diffs]
        except Exception as exc:  # an experiment: record and go on
            out[key] = f"error {type(exc).__name__}: {str(exc)[:200]}"
    record(f"tile-overrides/{tag(dtype)}/block_m-num_warps-vs-default", True, out)


def check_graph_and_workspace(dtype: torch.dtype, heads: HeadConfig = PROD) -> None:
    requests, chunks = mixed(seed=3, n=6, max_kv=3000)
    workload = Workload(tuple(requests), heads, dtype, seed=3)
    eager = Schedule((Step(tuple(chunks)),), PageLayout(16, "shuffled", seed=2))
    poisoned = Schedule(eager.steps, eager.layout, poison=True)
    record_replay(f"uninitialised-workspace/{tag(dtype)}", Kernels(plan="split"), workload,
                  eager, poisoned)
    for plan in ("fused", "split"):
        graphed = Schedule(eager.steps, eager.layout, graph=True)
        try:
            record_replay(f"cuda-graph/{tag(dtype)}/{plan}", Kernels(plan=plan), workload, eager,
                          graphed)
        except Exception as exc:  # capture failures are results too
            record(f"cuda-graph/{tag(dtype)}/{plan}", False, f"{type(exc).__name__}: {exc}"[:300])


def main() -> int:
    global TILE
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--tile", default="", help="BLOCK_N,BLOCK_M,num_warps,num_stages overrides")
    p.add_argument("--quick", action="store_true", help="bf16 accuracy/plans + invariance only")
    args = p.parse_args()
    if args.tile:
        bn, bm, nw, ns = (int(x) for x in args.tile.split(","))
        TILE = Tuning(block_n=bn, block_m=bm, num_warps=nw, num_stages=ns)
    if not torch.cuda.is_available():
        raise SystemExit("gpu_checks.py needs CUDA")
    os.makedirs(args.out, exist_ok=True)
    t0 = time.time()
    steps: list[Callable[[], None]] = [
        lambda: check_accuracy_and_plans(torch.bfloat16, PROD, 16),
        lambda: check_invariance(torch.bfloat16),
        lambda: check_graph_and_workspace(torch.bfloat16),
        lambda: check_accuracy_and_plans(torch.float16, PROD, 16),
        lambda: check_accuracy_and_plans(torch.float32, PROD, 16),
        lambda: check_accuracy_and_plans(torch.bfloat16, HeadConfig(8, 2, 64), 1),
        lambda: check_accuracy_and_plans(torch.float16, HeadConfig(16, 4, 256), 32),
        lambda: check_accuracy_and_plans(torch.bfloat16, HeadConfig(12, 4, 128), 4),
        lambda: check_invariance(torch.float16),
        lambda: check_control(torch.bfloat16),
        lambda: check_control(torch.float16),
        lambda: check_tile_overrides(torch.bfloat16),
        lambda: check_tile_overrides(torch.float16),
    ]
    if args.quick:
        steps = steps[:3]
    for i, step in enumerate(steps):
        try:
            step()
        except Exception:
            record(f"step{i}-crashed", False, traceback.format_exc()[-2000:])
    RESULTS["_elapsed_s"] = {"ok": True, "detail": time.time() - t0}
    suffix = "-" + args.tile.replace(",", "_") if args.tile else ""
    with open(os.path.join(args.out, f"gpu_checks{suffix}.json"), "w") as f:
        json.dump(RESULTS, f, indent=2, default=str)
    fails = [k for k, v in RESULTS.items() if not v["ok"]]
    print(f"{len(RESULTS)} checks, {len(fails)} failed: {fails}")
    return 1 if fails else 0


if __name__ == "__main__":
    raise SystemExit(main())
