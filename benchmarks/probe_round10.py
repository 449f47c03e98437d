"""Round-10 probe (H100): launch settings of small split-plan grids, and where their time goes
(reports/h100-round10/README.md).

    python benchmarks/probe_round10.py OUT_DIR [small|pdl|order|profile]

``small``: short and medium decodes at batch 1-8 (the grids where ``value_blocks`` and
``tiles_per_step`` apply) under V column blocks 1, 2, 4 and 8 (8: 16 columns; outside
``Tuning``'s range when this ran, so set on the frozen dataclass; ``Tuning`` takes it now), one
or two tiles per step
and 2, 3 or 4 pipeline stages. Bits of out and LSE of every cell against one block, one tile per
step, two stages (round 8's validated launch) at bf16 (every cell) and fp16 (the cells with 8
blocks or 3-4 stages), times at bf16 (CUDA graphs, L2 flushed, medians of 30), the rules' pick
(``auto``) timed alongside. Writes ``small.jsonl``; its rows with 1 block, 1 tile, 2 stages
compare a rerun of the reference with itself (run-to-run repeats), not two settings.

``pdl``: the split plan's merge as a programmatic dependent launch (``Tuning(dependent_merge=
...)``) against an ordinary launch, on the multi-split decodes at bf16 and fp16: bits of out and
LSE against the ordinary launch, times at bf16 (three repeats, interleaved). Writes
``pdl.jsonl``.

``order``: the fused plan's slot order (``Tuning(slot_order=True)``: the slots of the requests
with the most KV first, each request's last blocks first, sorted on the device) against the
plain order (last slots first) on prefill-like batches, under the default launch otherwise
(calls 5 and 6 ran it on two first versions of the slot order: slots sorted by their own tiles,
and ``torch.argsort`` in place of the rank kernel): bits of out and LSE at bf16 and
fp16, times at bf16 (three repeats, interleaved; CUDA graphs, so the sort is captured too).
Writes ``order.jsonl``.

``profile``: device time per kernel (split kernel, merge kernel) of the default launch on the
multi-split decodes, from torch.profiler over graph replays. Writes ``profile.jsonl``.
"""

from __future__ import annotations

import json
import sys

import torch

import kernels
from benchmarks.probe_round4 import call, save
from benchmarks.probe_round5 import _bits_vs
from benchmarks.tile_sweep import _graphed as graphed
from invariance.bench import WORKLOADS, CudaTimer, build_batch, parse_lengths

SMALL = ["decode:1kx1", "decode:1kx2", "decode:1kx4", "decode:1kx8", "decode:2kx1",
         "decode:2kx2", "decode:2kx4", "decode:4kx1", "decode:4kx2", "decode:8kx1",
         "decode:8kx2", "decode:16kx1"]
#: (value blocks, tiles per step, stages)
CELLS = [(vb, tps, st) for vb in (1, 2, 4, 8) for tps in (1, 2) for st in (2, 3, 4)
         if not (vb == 1 and (tps, st) != (1, 2))]


def _tuning(vb: int, tps: int, stages: int) -> kernels.Tuning:
    t = kernels.Tuning(value_blocks=min(vb, 4), tiles_per_step=tps, num_stages=stages)
    if vb == 8:  # 16 V columns per program: outside Tuning's checked range, this probe only
        object.__setattr__(t, "value_blocks", 8)
    return t


def small(out_dir: str) -> None:
    timer = CudaTimer(iters=30, warmup=3)
    rows = []
    for dtype in (torch.bfloat16, torch.float16):
        for spec in SMALL:
            batch = build_batch(parse_lengths(spec), dtype=dtype)
            ref = call(batch, "split", _tuning(1, 1, 2))()
            for vb, tps, st in [*CELLS, ("auto", "auto", "auto")]:
                if dtype == torch.float16 and not (vb == 8 or (st != 2 and st != "auto")):
                    continue
                tuning = kernels.Tuning() if vb == "auto" else _tuning(vb, tps, st)
                fn = call(batch, "split", tuning)
                row = dict(dtype=str(dtype).removeprefix("torch."), workload=spec,
                           value_blocks=vb, tiles_per_step=tps, stages=st)
                try:
                    row["bits_differing"] = _bits_vs(ref, fn())
                    if dtype == torch.bfloat16:
                        row["us"] = round(timer.time_fn(graphed(fn)) * 1000, 1)
                except Exception as exc:  # a probe: record and go on
                    row["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
                rows.append(row)
                print(json.dumps(row), flush=True)
            del batch, ref
            torch.cuda.empty_cache()
            save(out_dir, "small.jsonl", rows)


PDL_WORKLOADS = ["decode-b1-ctx8k", "decode-b1-ctx32k", "decode:8kx2", "decode:4kx4",
                 "decode-b8-ctx8k", "decode-b8-ctx32k", "decode-b64-ctx8k", "decode-prod64"]


def _workload(spec: str):
    return WORKLOADS[spec] if spec in WORKLOADS else parse_lengths(spec)


def _a_against_b(row: dict, timer: CudaTimer, timed: bool, a, b, names: tuple[str, str]) -> None:
    """Into ``row``: the bits of out and LSE of call ``b`` against call ``a``, and with
    ``timed`` three interleaved CUDA-graph timings of each (us), under ``us_<name>``."""
    row["bits_differing"] = _bits_vs(a(), b())
    if timed:
        graphs = [graphed(a), graphed(b)]
        for name in names:
            row[f"us_{name}"] = []
        for _ in range(3):
            for name, g in zip(names, graphs, strict=True):
                row[f"us_{name}"].append(round(timer.time_fn(g) * 1000, 1))


def pdl(out_dir: str) -> None:
    timer = CudaTimer(iters=30, warmup=3)
    rows = []
    for dtype in (torch.bfloat16, torch.float16):
        for spec in PDL_WORKLOADS:
            batch = build_batch(_workload(spec), dtype=dtype)
            row = dict(dtype=str(dtype).removeprefix("torch."), workload=spec)
            _a_against_b(row, timer, dtype == torch.bfloat16,
                         call(batch, "split", kernels.Tuning(dependent_merge=False)),
                         call(batch, "split", kernels.Tuning()), ("off", "on"))
            rows.append(row)
            print(json.dumps(row), flush=True)
            del batch
            torch.cuda.empty_cache()
            save(out_dir, "pdl.jsonl", rows)


ORDER_WORKLOADS = ["mixed64", "prefill-varlen", "chunk:512/8kx8+chunk:64/1kx56",
                   "decode:8kx32+chunk:256/4kx32", "chunk:1k/16kx4+prefill:1kx12",
                   "prefill:4kx8"]


def order(out_dir: str) -> None:
    timer = CudaTimer(iters=30, warmup=3)
    rows = []
    for dtype in (torch.bfloat16, torch.float16):
        for spec in ORDER_WORKLOADS:
            batch = build_batch(_workload(spec), dtype=dtype)
            lp = kernels.plan_attention(batch.q, batch.k_cache, batch.v_cache,
                                        batch.cu_seqlens_q, batch.kv_lens, batch.block_table,
                                        plan="fused", validate=False,
                                        host_lens=(batch.q_lens(), batch.kv_lens.tolist()))
            row = dict(dtype=str(dtype).removeprefix("torch."), workload=spec,
                       block_m=lp.block_m, rule=lp.slot_order)
            _a_against_b(row, timer, dtype == torch.bfloat16,
                         call(batch, "fused", kernels.Tuning(slot_order=False)),
                         call(batch, "fused", kernels.Tuning(slot_order=True)),
                         ("plain", "ordered"))
            rows.append(row)
            print(json.dumps(row), flush=True)
            del batch
            torch.cuda.empty_cache()
            save(out_dir, "order.jsonl", rows)


def profile(out_dir: str) -> None:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as prof

    rows = []
    for name in ["decode-b1-ctx8k", "decode-b1-ctx32k", "decode-b8-ctx8k", "decode-b8-ctx32k",
                 "decode-prod64"]:
        batch = build_batch(WORKLOADS[name])
        replay = graphed(call(batch))
        for _ in range(3):
            replay()
        torch.cuda.synchronize()
        with prof(activities=[ProfilerActivity.CUDA]) as p:
            for _ in range(20):
                replay()
            torch.cuda.synchronize()
        for e in p.key_averages():
            if e.device_time_total > 0 and ("attention" in e.key or "merge" in e.key):
                rows.append(dict(workload=name, kernel=e.key[:60],
                                 us=round(e.device_time_total / max(e.count, 1), 2),
                                 count=e.count))
                print(json.dumps(rows[-1]), flush=True)
        del batch
        torch.cuda.empty_cache()
    save(out_dir, "profile.jsonl", rows)


if __name__ == "__main__":
    modes = {"small": small, "profile": profile, "pdl": pdl, "order": order}
    if len(sys.argv) not in (2, 3) or (len(sys.argv) == 3 and sys.argv[2] not in modes):
        sys.exit(f"usage: probe_round10.py OUT_DIR [{'|'.join(modes)}]; got {sys.argv[1:]}")
    modes[sys.argv[2] if len(sys.argv) == 3 else "small"](sys.argv[1])
