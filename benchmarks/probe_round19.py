"""Round-19 probe (H100): the Gluon prefill kernel's consumers taking turns through hardware
named barriers, FA3's warp-scheduler barriers (reports/h100-round19/README.md).

    python benchmarks/probe_round19.py OUT_DIR probe [WORKLOAD ...]
    python benchmarks/probe_round19.py OUT_DIR fold [WORKLOAD ...]
    python benchmarks/probe_round19.py OUT_DIR bn128 [WORKLOAD ...]
    python benchmarks/probe_round19.py OUT_DIR bn128g [WORKLOAD ...]
    python benchmarks/probe_round19.py OUT_DIR decode128 [WORKLOAD ...]
    python benchmarks/probe_round19.py OUT_DIR serial [WORKLOAD ...]
    INVARIANCE_R19_JOINT=0|1 python benchmarks/probe_round19.py OUT_DIR joint [WORKLOAD ...]
    python benchmarks/probe_round19.py OUT_DIR gdecode [WORKLOAD ...]
    python benchmarks/probe_round19.py OUT_DIR gsplit [WORKLOAD ...]
    python benchmarks/probe_round19.py OUT_DIR target WORKLOAD

Nsight Compute on FlashInfer's FA3 and on the Gluon kernel (call 1) put 0.8% of FA3's warp
samples on ``wgmma`` waits and 10% of ours; FA3's two consumer warpgroups take turns issuing
their ``wgmma`` (``bar.sync`` before, ``bar.arrive`` for the other after), ours issue when
ready. Round 14 measured a turn-taking built on mbarriers (a spin wait and a warpgroup
``bar.sync`` per hand-over) and found no gain. ``kernels._gluon.PINGPONG`` (in the experiment
commit only) takes turns on two named barriers instead. Turns move only when a warpgroup issues,
never what it computes, so the bits must not change.

``probe``: for each workload at bf16 and fp16, the bits of out and LSE with the switch on against
the default; at bf16 the times of both (CUDA graphs, L2 flushed, medians of 20), interleaved in
``REPEATS`` repeats. Writes ``pingpong.jsonl`` after each workload. ``target``: the switched
launch twice, for ``ncu`` to profile.

``fold`` (call 4): what the split fold's state costs the tile. With a split larger than any row
(``ONE_SPLIT`` tokens) every row is one split, the fold a pass-through, and
``kernels._gluon.FOLDLESS`` drops the fold state from the consumers (64 fp32 registers per
thread); with them free, ``Q_REGS`` (q in registers for the score ``wgmma``, which spills next to
the fold state) fits. Bits of each against the one-split default (they must agree), times of
all and of the default at its own 1024-token split (other bits, time only), in ``fold.jsonl``.

``bn128`` (call 5): is a 128-key Gluon tile faster per key, once its registers fit? At one split
per row, ``FOLDLESS`` and ``KEEP_P`` (p carried as the 16-bit operand) let the 128-key tile
(3 ring slots of 64 KB) compile without spills. Launched directly (``launch_fused_prefill`` with
``block_n=128``; the launcher keeps the Gluon tile at 64 keys), plain slot order, against the same
direct launch at 64 keys. A 128-key tile is another numerics contract (other bits): its cells
report the largest difference from the 64-key result (a sanity check), the 64-key cells their
bits. In ``bn128.jsonl``.
"""

from __future__ import annotations

import json
import statistics
import sys

import torch

import kernels
import kernels._gluon
from benchmarks.probe_round4 import call, patched, save, time_interleaved
from benchmarks.probe_round5 import _bits_vs
from benchmarks.probe_round11 import _workload
from benchmarks.tile_sweep import _graphed as graphed
from invariance.bench import CudaTimer, build_batch
from kernels.attention import _LOG2E

WORKLOADS = ["prefill-varlen", "mixed64", "prefill:4kx8", "decode:8kx32+chunk:256/4kx32"]
FOLD_WORKLOADS = ["prefill-varlen", "prefill:4kx8", "mixed64"]
REPEATS = 11
#: KV tokens per split for ``fold``: more than any row of its workloads (16k at most).
ONE_SPLIT = 65536
#: ``fold``'s cells: the ``kernels._gluon`` switches each turns on, at ``ONE_SPLIT``.
FOLD_CELLS = {"foldless": ("FOLDLESS",), "foldless+q_regs": ("FOLDLESS", "Q_REGS"),
              "foldless+q_regs+pingpong": ("FOLDLESS", "Q_REGS", "PINGPONG")}


def _switched(batch):
    return patched(call(batch), kernels._gluon, "PINGPONG", True)


def ratio_summary(row: dict, name: str, base: str) -> dict:
    """Median, minimum and maximum over the repeats of ``row["us_" + name]`` /
    ``row["us_" + base]`` (the repeats interleave the cells, so each ratio is one repeat's)."""
    ratios = [x / d for x, d in zip(row[f"us_{name}"], row[f"us_{base}"], strict=True)]
    return dict(median=round(statistics.median(ratios), 4), min=round(min(ratios), 4),
                max=round(max(ratios), 4))


def max_abs_diff(got, ref) -> dict:
    """The largest difference of out and LSE from ``ref`` and the non-finite values of ``got``:
    a sanity check for cells whose bits are not comparable (another numerics contract)."""
    return dict(out=float((got[0].float() - ref[0].float()).abs().max()),
                lse=float((got[1] - ref[1]).abs().max()),
                nonfinite=int((~torch.isfinite(got[0])).sum() + (~torch.isfinite(got[1])).sum()))


def probe(out_dir: str, specs: list[str]) -> None:
    timer = CudaTimer(iters=20, warmup=2)
    rows: list[dict] = []
    for spec in specs or WORKLOADS:
        for dtype in (torch.bfloat16, torch.float16):
            batch = build_batch(_workload(spec), dtype=dtype)
            ref, cell = call(batch), _switched(batch)
            row: dict = dict(dtype=str(dtype).removeprefix("torch."), workload=spec)
            row["bits_differing"] = {"pingpong": _bits_vs(ref(), cell())}
            if dtype == torch.bfloat16:
                time_interleaved(row, [("default", graphed(ref)), ("pingpong", graphed(cell))],
                                 timer, repeats=REPEATS)
                row["pingpong/default"] = ratio_summary(row, "pingpong", "default")
            del batch
            _record(rows, row, out_dir, "pingpong.jsonl")


def fold(out_dir: str, specs: list[str]) -> None:
    timer = CudaTimer(iters=20, warmup=2)
    rows: list[dict] = []
    for spec in specs or FOLD_WORKLOADS:
        for dtype in (torch.bfloat16, torch.float16):
            batch = build_batch(_workload(spec), dtype=dtype)
            ref = call(batch, split_size=ONE_SPLIT)
            cells = {}
            for name, switches in FOLD_CELLS.items():
                fn = call(batch, split_size=ONE_SPLIT)
                for sw in switches:
                    fn = patched(fn, kernels._gluon, sw, True)
                cells[name] = fn
            row: dict = dict(dtype=str(dtype).removeprefix("torch."), workload=spec,
                             split=ONE_SPLIT)
            ref_out = ref()
            row["bits_differing"] = {n: _bits_vs(ref_out, f()) for n, f in cells.items()}
            if dtype == torch.bfloat16:
                graphs = [("one_split", graphed(ref)), ("split1024", graphed(call(batch)))]
                graphs += [(n, graphed(f)) for n, f in cells.items()]
                time_interleaved(row, graphs, timer, repeats=REPEATS)
                for n, _ in graphs[1:]:
                    row[f"{n}/one_split"] = ratio_summary(row, n, "one_split")
            del batch
            _record(rows, row, out_dir, "fold.jsonl")


#: ``bn128``'s cells: (block_n, the ``kernels._gluon`` switches set).
BN128_CELLS = {
    "g64": (64, {}),
    "g64-foldless-keepp": (64, {"FOLDLESS": True, "KEEP_P": True}),
    "g128-foldless-keepp": (128, {"FOLDLESS": True, "KEEP_P": True}),
    "g128-foldless-keepp-r240": (128, {"FOLDLESS": True, "KEEP_P": True, "CONSUMER_REGS": 240}),
    "g128-foldless-keepp-pingpong": (128, {"FOLDLESS": True, "KEEP_P": True, "PINGPONG": True}),
    "g128-fold-keepp-r240": (128, {"KEEP_P": True, "CONSUMER_REGS": 240}),
}


def _time_cells(row: dict, cells: dict, base: str, timer) -> None:
    """Into ``row``: each cell's times (CUDA graphs, ``REPEATS`` interleaved repeats), its
    ratio summary against the ``base`` cell, and every cell's median."""
    graphs = [(n, graphed(f)) for n, f in cells.items()]
    time_interleaved(row, graphs, timer, repeats=REPEATS)
    for n in cells:
        if n != base:
            row[f"{n}/{base}"] = ratio_summary(row, n, base)
    row["median_us"] = {n: statistics.median(row[f"us_{n}"]) for n in cells}


def _record(rows: list, row: dict, out_dir: str, name: str) -> None:
    """Append ``row``, print it without its per-repeat times, free the cached GPU memory and
    rewrite ``out_dir/name`` with every row so far."""
    rows.append(row)
    print(json.dumps({k: v for k, v in row.items() if not k.startswith("us_")}), flush=True)
    torch.cuda.empty_cache()
    save(out_dir, name, rows)


def _plan(batch, split: int = kernels.DEFAULT_SPLIT_SIZE) -> kernels.LaunchPlan:
    """The launcher's plan for ``batch`` (its lengths from the host, no sync)."""
    return kernels.plan_attention(batch.q, batch.k_cache, batch.v_cache, batch.cu_seqlens_q,
                                  batch.kv_lens, batch.block_table, validate=False,
                                  host_lens=(batch.q_lens(), batch.kv_lens.tolist()),
                                  split_size=split)


def _direct(batch, lp, block_n: int, switches: dict, split: int = ONE_SPLIT, ws=None):
    """The Gluon kernel launched directly at ``block_n`` keys, ``split`` KV tokens per split."""
    from kernels._gluon import launch_fused_prefill

    T, Hq, _ = batch.q.shape
    qk_scale = batch.sm_scale * _LOG2E

    def fn():
        saved = {k: getattr(kernels._gluon, k) for k in switches}
        for k, v in switches.items():
            setattr(kernels._gluon, k, v)
        try:
            out = torch.empty_like(batch.q)
            lse = torch.empty(T, Hq, dtype=torch.float32, device=batch.q.device)
            launch_fused_prefill(batch.q, batch.k_cache, batch.v_cache, batch.cu_seqlens_q,
                                 batch.kv_lens, batch.block_table, batch.cu_seqlens_q, out, lse,
                                 qk_scale, num_slots=lp.num_slots,
                                 split_tiles=split // block_n, block_m=lp.block_m,
                                 block_q=lp.block_q, block_n=block_n, is_slot_order=False,
                                 ws=ws)
            return out, lse
        finally:
            for k, v in saved.items():
                setattr(kernels._gluon, k, v)
    return fn


def bn128(out_dir: str, specs: list[str]) -> None:
    timer = CudaTimer(iters=20, warmup=2)
    rows: list[dict] = []
    for spec in specs or FOLD_WORKLOADS:
        batch = build_batch(_workload(spec), dtype=torch.bfloat16)
        lp = _plan(batch, ONE_SPLIT)
        ref_out = call(batch, split_size=ONE_SPLIT)()
        cells = {n: _direct(batch, lp, bn, sw) for n, (bn, sw) in BN128_CELLS.items()}
        row: dict = dict(dtype="bfloat16", workload=spec, split=ONE_SPLIT, gluon=lp.gluon,
                         bits_differing={}, max_abs_diff={})
        for n, f in cells.items():
            got = f()
            if BN128_CELLS[n][0] == 64:
                row["bits_differing"][n] = _bits_vs(ref_out, got)
            row["max_abs_diff"][n] = max_abs_diff(got, ref_out)
        _time_cells(row, cells, "g64", timer)
        del batch
        _record(rows, row, out_dir, "bn128.jsonl")


#: ``bn128g``'s cells at the contract's 1024-token split: (block_n, switches, split, workspace).
BN128G_CELLS = {
    "g128-fold-r240": (128, {"KEEP_P": True, "CONSUMER_REGS": 240}, 1024, False),
    "g128-foldglobal": (128, {"KEEP_P": True, "FOLD_GLOBAL": True}, 1024, True),
    "g128-foldglobal-r240": (128, {"KEEP_P": True, "FOLD_GLOBAL": True, "CONSUMER_REGS": 240},
                             1024, True),
    "g128-foldless-onesplit": (128, {"KEEP_P": True, "FOLDLESS": True}, ONE_SPLIT, False),
}


def bn128g(out_dir: str, specs: list[str]) -> None:
    """Call 6: the 128-key tile with the split fold (1024 tokens): its fold acc in registers
    (spills) or in a global workspace (``FOLD_GLOBAL``), against the 64-key default launch."""
    timer = CudaTimer(iters=20, warmup=2)
    rows: list[dict] = []
    for spec in specs or FOLD_WORKLOADS:
        batch = build_batch(_workload(spec), dtype=torch.bfloat16)
        lp = _plan(batch)
        Hkv = batch.k_cache.shape[2]
        ws = torch.empty(lp.num_slots * Hkv * 2, 64, batch.q.shape[2], dtype=torch.float32,
                         device=batch.q.device)
        cells = {"g64-default": call(batch)}
        for n, (bn, sw, split, use_ws) in BN128G_CELLS.items():
            cells[n] = _direct(batch, lp, bn, sw, split, ws if use_ws else None)
        row: dict = dict(dtype="bfloat16", workload=spec, gluon=lp.gluon, plan=lp.plan,
                         workspace_mb=round(ws.numel() * 4 / 2**20))
        ref = cells["g128-fold-r240"]()
        row["bits_vs_g128-fold-r240"] = {n: _bits_vs(ref, cells[n]())
                                         for n in ("g128-foldglobal", "g128-foldglobal-r240")}
        base = cells["g64-default"]()
        row["max_abs_diff_vs_g64"] = {}
        for n, f in cells.items():
            row["max_abs_diff_vs_g64"][n] = max_abs_diff(f(), base)
        _time_cells(row, cells, "g64-default", timer)
        del batch, ws
        _record(rows, row, out_dir, "bn128g.jsonl")


#: ``serial``'s cells at the 1024-token split: (block_n, switches), launched directly.
SERIAL_CELLS = {
    "g64-serial": (64, {"KEEP_P": True, "SERIAL": True}),
    "g128-fold-r240": (128, {"KEEP_P": True, "CONSUMER_REGS": 240}),
    "g128-serial": (128, {"KEEP_P": True, "SERIAL": True}),
}


def serial(out_dir: str, specs: list[str]) -> None:
    """Call 9: ``SERIAL`` (each step's ``p @ v`` waited before the next scores are issued: no
    score accumulator live beside it), which lets the 128-key tile hold the fold state in
    registers with 36 bytes of spill instead of 336. Bits: the 128-key serial cell against the
    128-key FA3-order one, the 64-key serial cell against the kept default (both must agree);
    times against the kept default."""
    timer = CudaTimer(iters=20, warmup=2)
    rows: list[dict] = []
    for spec in specs or FOLD_WORKLOADS:
        batch = build_batch(_workload(spec), dtype=torch.bfloat16)
        lp = _plan(batch)
        cells = {"g64-default": call(batch)}
        for n, (bn, sw) in SERIAL_CELLS.items():
            cells[n] = _direct(batch, lp, bn, sw, 1024)
        cells["g128-foldless-onesplit"] = _direct(batch, lp, 128,
                                                  {"KEEP_P": True, "FOLDLESS": True})
        row: dict = dict(dtype="bfloat16", workload=spec, gluon=lp.gluon, plan=lp.plan)
        row["bits_differing"] = {
            "g64-serial vs g64-default": _bits_vs(cells["g64-default"](), cells["g64-serial"]()),
            "g128-serial vs g128-fold-r240": _bits_vs(cells["g128-fold-r240"](),
                                                      cells["g128-serial"]())}
        _time_cells(row, cells, "g64-default", timer)
        del batch
        _record(rows, row, out_dir, "serial.jsonl")


#: ``joint``'s cells: (plan, Tuning fields); run once with INVARIANCE_R19_JOINT=0 (Triton's tile
#: pairs as two 64-key softmax steps) and once with =1 (one 128-key step per pair).
JOINT_CELLS = {
    "default": ("auto", {}),
    "tps1": ("auto", dict(tiles_per_step=1)),
    "tps2": ("auto", dict(tiles_per_step=2)),
    "tps2-s3": ("auto", dict(tiles_per_step=2, num_stages=3)),
    "split-tps2": ("split", dict(tiles_per_step=2)),
    "split-tps2-s3": ("split", dict(tiles_per_step=2, num_stages=3)),
}


def joint(out_dir: str, specs: list[str]) -> None:
    """Call 10: decode with two 64-key tiles per step everywhere, the pair computed as two
    softmax steps (the kept arithmetic) or, with INVARIANCE_R19_JOINT=1, as one 128-key step
    (a numerics-contract change a 128-key tile would bring to decode); times only."""
    import kernels._triton.attention_kernels as tk

    flag = int(bool(tk.R19_JOINT))
    timer = CudaTimer(iters=20, warmup=2)
    rows: list[dict] = []
    for spec in specs or DECODE128_WORKLOADS:
        batch = build_batch(_workload(spec), dtype=torch.bfloat16)
        cells = {n: call(batch, plan, kernels.Tuning(**f) if f else None)
                 for n, (plan, f) in JOINT_CELLS.items()}
        row: dict = dict(workload=spec, joint=flag, errors={})
        ok = {}
        for n, f in cells.items():
            try:
                f()
                ok[n] = f
            except Exception as exc:  # a cell that does not launch: say why, time the rest
                row["errors"][n] = repr(exc)[:300]
        _time_cells(row, ok, "default", timer)
        del batch
        _record(rows, row, out_dir, f"joint-{flag}.jsonl")


GDECODE_WORKLOADS = ["decode-b64-ctx8k", "decode-b64-ctx32k", "decode-b256-ctx8k", "decode-prod64"]


def gdecode(out_dir: str, specs: list[str]) -> None:
    """Call 11: can the Gluon tile serve large-batch decode at 128 keys? The fused plan's Gluon
    launch (128 rows: one request's 4 query rows per KV head, the rest padding; 1024-token
    splits folded in the program) at 64 keys and at 128 keys (``SERIAL``, fold in registers),
    against the kept decode (the Triton kernels); times, and the largest difference from the
    kept result as a sanity check."""
    timer = CudaTimer(iters=20, warmup=2)
    rows: list[dict] = []
    for spec in specs or GDECODE_WORKLOADS:
        batch = build_batch(_workload(spec), dtype=torch.bfloat16)
        lp = kernels.plan_attention(
            batch.q, batch.k_cache, batch.v_cache, batch.cu_seqlens_q, batch.kv_lens,
            batch.block_table, validate=False, host_lens=(batch.q_lens(), batch.kv_lens.tolist()),
            plan="fused", tuning=kernels.Tuning(block_m=128, num_warps=8))
        cells = {"default": call(batch),
                 "gluon64": _direct(batch, lp, 64, {}, 1024),
                 "gluon128-serial": _direct(batch, lp, 128, {"KEEP_P": True, "SERIAL": True},
                                            1024)}
        ref = cells["default"]()
        row: dict = dict(workload=spec, num_slots=lp.num_slots, block_q=lp.block_q,
                         bits_differing={"gluon64": _bits_vs(ref, cells["gluon64"]())},
                         max_abs_diff={n: max_abs_diff(f(), ref) for n, f in cells.items()})
        _time_cells(row, cells, "default", timer)
        del batch
        _record(rows, row, out_dir, "gdecode.jsonl")


GSPLIT_WORKLOADS = ["decode-b1-ctx1k", "decode-b1-ctx8k", "decode-b1-ctx32k", "decode-b8-ctx1k",
                    "decode-b8-ctx8k", "decode-b8-ctx32k", "decode-prod64"]


def _gsplit(batch, block_n: int):
    """The split plan on the Gluon tile (``launch_split_decode``) at ``block_n`` keys, 1024-token
    splits, then the package's merge (an ordinary launch)."""
    from kernels._gluon import launch_split_decode
    from kernels.attention import _launch_merge

    lp = kernels.plan_attention(
        batch.q, batch.k_cache, batch.v_cache, batch.cu_seqlens_q, batch.kv_lens,
        batch.block_table, validate=False, host_lens=(batch.q_lens(), batch.kv_lens.tolist()),
        plan="split", tuning=kernels.Tuning(block_m=128, num_warps=8, dependent_merge=False))
    T, Hq, D = batch.q.shape
    inputs = (batch.q, batch.k_cache, batch.v_cache, batch.cu_seqlens_q, batch.kv_lens,
              batch.block_table)

    def fn():
        ws_o = torch.empty(T, Hq, lp.num_splits, D, dtype=torch.float32, device=batch.q.device)
        ws_ml = torch.empty(T, Hq, lp.num_splits, 2, dtype=torch.float32, device=batch.q.device)
        out = torch.empty_like(batch.q)
        lse = torch.empty(T, Hq, dtype=torch.float32, device=batch.q.device)
        launch_split_decode(batch.q, batch.k_cache, batch.v_cache, batch.cu_seqlens_q,
                            batch.kv_lens, batch.block_table, ws_o, ws_ml,
                            batch.sm_scale * _LOG2E, num_slots=lp.num_slots,
                            num_splits=lp.num_splits, split_tiles=1024 // block_n,
                            block_m=lp.block_m, block_q=lp.block_q, block_n=block_n)
        _launch_merge(lp, ws_o, ws_ml, inputs, out, lse)
        return out, lse
    return fn


def gsplit(out_dir: str, specs: list[str]) -> None:
    """Call 12: the split plan on the Gluon tile, at 64 keys (bits against the kept decode) and
    at 128 keys (bits against the Triton split kernel at 128 keys), times against the kept
    decode."""
    timer = CudaTimer(iters=20, warmup=2)
    rows: list[dict] = []
    for spec in specs or GSPLIT_WORKLOADS:
        batch = build_batch(_workload(spec), dtype=torch.bfloat16)
        cells = {"default": call(batch),
                 "triton128": call(batch, "split", kernels.Tuning(
                     block_n=128, value_blocks=2, num_stages=2, tiles_per_step=1)),
                 "gsplit64": _gsplit(batch, 64), "gsplit128": _gsplit(batch, 128)}
        row: dict = dict(workload=spec, errors={}, bits_differing={}, max_abs_diff={})
        ok = {}
        outs = {}
        for n, f in cells.items():
            try:
                outs[n] = f()
                ok[n] = f
            except Exception as exc:  # a cell that does not launch: say why, time the rest
                row["errors"][n] = repr(exc)[:300]
        for n, ref in (("gsplit64", "default"), ("gsplit128", "triton128")):
            if n in outs and ref in outs:
                row["bits_differing"][f"{n} vs {ref}"] = _bits_vs(outs[ref], outs[n])
        row["max_abs_diff"] = {n: max_abs_diff(o, outs["default"]) for n, o in outs.items()}
        _time_cells(row, ok, "default", timer)
        del batch
        _record(rows, row, out_dir, "gsplit.jsonl")


#: ``decode128``'s 128-key decode cells: (plan, Tuning fields).
DECODE128_CELLS = {
    "split-vb2-s2": ("split", dict(block_n=128, value_blocks=2, num_stages=2, tiles_per_step=1)),
    "split-vb2-s3": ("split", dict(block_n=128, value_blocks=2, num_stages=3, tiles_per_step=1)),
    "split-vb1-s2": ("split", dict(block_n=128, value_blocks=1, num_stages=2, tiles_per_step=1)),
    "auto-s2": ("auto", dict(block_n=128, num_stages=2, tiles_per_step=1)),
}
DECODE128_WORKLOADS = ["decode-b1-ctx1k", "decode-b1-ctx8k", "decode-b1-ctx32k", "decode-b8-ctx1k",
                       "decode-b8-ctx8k", "decode-b8-ctx32k", "decode-b64-ctx8k",
                       "decode-b256-ctx8k", "decode-prod64"]
#: Prompt lengths of ``decode128``'s consistency check (one and several splits, a partial tile).
DECODE128_PROMPTS = (1000, 3001)


def _consistency(rows: list[dict]) -> None:
    """A prompt prefilled by the 128-key Gluon tile (split 1024, fold in registers) against its
    last token decoded alone by each 128-key Triton decode cell: bits of that token's rows."""
    for n_prompt in DECODE128_PROMPTS:
        batch = build_batch(_workload(f"prefill:{n_prompt}"), dtype=torch.bfloat16)
        lp = _plan(batch)
        pre_out, pre_lse = _direct(batch, lp, 128, {"KEEP_P": True, "CONSUMER_REGS": 240},
                                   1024)()
        q1 = batch.q[-1:].contiguous()
        cu1 = torch.tensor([0, 1], dtype=torch.int32, device=q1.device)
        row: dict = dict(check="prefill_vs_decode", prompt=n_prompt, bits_differing={})
        for name, (plan, fields) in DECODE128_CELLS.items():
            try:
                out, lse = kernels.unified_attention(
                    q1, batch.k_cache, batch.v_cache, cu1, batch.kv_lens, batch.block_table,
                    sm_scale=batch.sm_scale, plan=plan, tuning=kernels.Tuning(**fields),
                    validate=False, host_lens=([1], batch.kv_lens.tolist()), split_size=1024)
            except Exception as exc:  # a cell that does not launch: say why
                row["bits_differing"][name] = repr(exc)[:300]
                continue
            row["bits_differing"][name] = _bits_vs((pre_out[-1:], pre_lse[-1:]), (out, lse))
        rows.append(row)
        print(json.dumps(row), flush=True)
        del batch


def decode128(out_dir: str, specs: list[str]) -> None:
    """Call 7: could the decode kernels carry a 128-key contract? Bits of a decode step against
    the 128-key Gluon prefill of the same token, then times of the 128-key decode cells against
    the 64-key default (other bits: sanity differences only)."""
    timer = CudaTimer(iters=20, warmup=2)
    rows: list[dict] = []
    _consistency(rows)
    save(out_dir, "decode128.jsonl", rows)
    for spec in specs or DECODE128_WORKLOADS:
        batch = build_batch(_workload(spec), dtype=torch.bfloat16)
        base = call(batch)
        cells = {"default": base}
        for name, (plan, fields) in DECODE128_CELLS.items():
            cells[name] = call(batch, plan, kernels.Tuning(**fields))
        row: dict = dict(workload=spec, max_abs_diff={}, errors={})
        ref = base()
        ok = {}
        for n, f in cells.items():
            try:
                got = f()
            except Exception as exc:  # a cell that does not launch: say why, time the rest
                row["errors"][n] = repr(exc)[:300]
                continue
            ok[n] = f
            row["max_abs_diff"][n] = max_abs_diff(got, ref)
        graphs = [(n, graphed(f)) for n, f in ok.items()]
        time_interleaved(row, graphs, timer, repeats=5)
        for n, _ in graphs[1:]:
            # Call 8 recorded the median alone.
            row[f"{n}/default"] = ratio_summary(row, n, "default")["median"]
        row["median_us"] = {n: statistics.median(row[f"us_{n}"]) for n, _ in graphs}
        del batch
        _record(rows, row, out_dir, "decode128.jsonl")


def target(spec: str) -> None:
    batch = build_batch(_workload(spec), dtype=torch.bfloat16)
    fn = _switched(batch)
    for _ in range(2):
        fn()
    torch.cuda.synchronize()


if __name__ == "__main__":
    missing = [n for n in ("PINGPONG", "FOLDLESS", "Q_REGS", "KEEP_P", "CONSUMER_REGS",
                           "RING_SLOTS_128", "FOLD_GLOBAL", "SERIAL", "launch_split_decode")
               if not hasattr(kernels._gluon, n)]
    if missing:
        sys.exit(f"probe_round19.py: kernels._gluon has no {missing}; round 19 took its switches "
                 "out again: every one lives at commit 37d9540 (PINGPONG from 26ca4cf, FOLDLESS "
                 "and Q_REGS from 35b5828, the 128-key tile from 20adadd, FOLD_GLOBAL from "
                 "7777922, SERIAL and FOLD_PREFETCH from 337e104, the Triton kernels' "
                 "R19_JOINT from e6f9af0, launch_split_decode from 37d9540; "
                 "reports/h100-round19/README.md)")
    modes = dict(probe=probe, fold=fold, bn128=bn128, bn128g=bn128g, decode128=decode128,
                 serial=serial, joint=joint, gdecode=gdecode, gsplit=gsplit)
    if len(sys.argv) < 3 or (sys.argv[2] not in modes and sys.argv[2] != "target") or (
            sys.argv[2] == "target" and len(sys.argv) != 4):
        sys.exit(f"usage: probe_round19.py OUT_DIR {'|'.join(modes)} [WORKLOAD ...] | "
                 f"OUT_DIR target WORKLOAD; got {sys.argv[1:]}")
    if sys.argv[2] == "target":
        target(sys.argv[3])
    else:
        modes[sys.argv[2]](sys.argv[1], sys.argv[3:])
