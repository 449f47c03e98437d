"""Round-29 probe (H100/H200): where batch 1 with 32k keys loses against the control
(reports/h100-round29/).

    python benchmarks/probe_round29.py OUT_DIR times|parts|bits|times2 [WORKLOAD ...]

A cell is ``PLAN[@SPLIT[/LEAD]][+SWITCH]``: a plan (``auto``, ``split``) or ``heuristic`` (the
control, ``split_size=None``); ``@SPLIT`` a split size in tokens (``/LEAD`` a lead split size,
else the default's rule); switches, all bit-neutral (the merge's order per row is the same):
``+cN`` the merge loading N partials per step, ``+dN`` merge programs of N head-dim columns,
``+r28`` round 28's merge (each partial loaded next to its fold: :func:`_merge_r28_kernel`,
kept here as the baseline).

``times``: at bf16, CUDA-graph replays with L2 flushed (medians of 20), interleaved in
``REPEATS`` repeats, each cell against ``auto``. Into ``times.jsonl``.

``bits``: each workload at bf16 and fp16, out and LSE of ``auto`` with round 28's merge and
with 4 and 16 partials per step against ``auto``, in differing bits, and one split size (1024)
as the control that must differ. Into ``bits.jsonl``.

``times2``: as ``times`` with 5 repeats, the merge at 128 columns per program (and 16 partials
per step) against round 28's, each under the contract and the control. Into ``times2.jsonl``.

``parts``: each cell's CUDA graph replayed under the PyTorch profiler (L2 flushed before each
of 20 replays), its kernels' durations from the GPU timeline: the first phase (every kernel but the
merge and the flush), the merge, and the merge's end after the first phase's end (its visible
cost, which a dependent launch shortens). Medians over the runs, in us, into ``parts.jsonl``.
"""

from __future__ import annotations

import os
import statistics
import sys

import torch
import triton
import triton.language as tl

import kernels
import kernels.attention
from benchmarks.probe_round4 import call, patched
from benchmarks.probe_round5 import _bits_vs
from benchmarks.probe_round11 import _workload
from benchmarks.probe_round20 import _record, times
from benchmarks.tile_sweep import _graphed as graphed
from invariance.bench import build_batch
from kernels._triton.attention_kernels import LN2, _find_request, _split_count, gdc_wait
from kernels._triton.merge_kernels import state_fold, state_normalize

REPEATS = 3
STEPS = "times|parts|bits|times2"
WORKLOADS = ["decode:32kx1", "decode:24kx1", "decode:16kx2", "decode:32kx2", "decode:8kx1",
             "decode:2kx1", "decode:4kx1"]
CELLS = {"auto": ("auto", None), "control": ("heuristic", None),
         "merge-r28": ("auto+r28", None), "control-r28": ("heuristic+r28", None),
         "merge-c4": ("auto+c4", None), "merge-c16": ("auto+c16", None),
         "merge-d64": ("auto+d64", None), "merge-d128": ("auto+d128", None),
         "split2048": ("auto@2048", None), "split2048-lead256": ("auto@2048/256", None),
         "split2048-lead128": ("auto@2048/128", None)}
RUNS = 20
#: ``times2``: the merge's layouts against round 28's, each for the contract and the control.
TIME2_CELLS = {"auto": ("auto", None), "control": ("heuristic", None),
               "auto-r28": ("auto+r28", None), "control-r28": ("heuristic+r28", None),
               "auto-d128": ("auto+d128", None), "control-d128": ("heuristic+d128", None),
               "auto-d128-c16": ("auto+d128+c16", None),
               "control-d128-c16": ("heuristic+d128+c16", None)}
TIME2_WORKLOADS = ["decode-b1-ctx32k", "decode:24kx1", "decode:16kx2", "decode-b1-ctx8k",
                   "decode:2kx1", "decode-b1-ctx1k", "decode-b8-ctx8k", "decode-prod64"]
BITS_WORKLOADS = ["decode:32kx1", "decode:777x3,3001x2", "decode:5000x2", "chunk:5/1000x2",
                  "prefill:1000,17"]
BIT_CELLS = {"merge-r28": "auto+r28", "merge-c4": "auto+c4", "merge-c16": "auto+c16",
             "control-one-size": "auto@1024/1024"}


# Round 28's merge kernel, as it was (kernels/_triton/attention_kernels.py at c9d8163).
@triton.jit(do_not_specialize=["split_tokens", "lead_tokens", "B", "num_splits", "max_kv_len"])
def _merge_r28_kernel(
    # Inputs
    ws_o_ptr,  # [T, Hq, num_splits, D] fp32 raw acc
    ws_ml_ptr,  # [T, Hq, num_splits, 2] fp32 (m in log2 units, l)
    cu_seqlens_q_ptr,  # [B + 1] int32
    kv_lens_ptr,  # [B] int32
    # Outputs
    out_ptr,  # [T, Hq, D]
    lse_ptr,  # [T, Hq] fp32
    # Scalars
    split_tokens,  # KV tokens per split
    lead_tokens,  # KV tokens per lead split, a divisor of split_tokens (_split_lo)
    B,  # requests
    Hq,  # query heads
    num_splits,  # workspace splits per row
    max_kv_len,  # KV tokens the block table covers (kv_len clamp, as in _block_rows)
    # Constexprs
    G: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_D: tl.constexpr,
    CHUNK: tl.constexpr,
    IS_PDL: tl.constexpr,  # launched as a programmatic dependent of the split kernel (sm_90+)
):
    """Split plan, phase 2: one program per (query token, kv head, BLOCK_D columns of the head
    dim) folds the raw partials of the group's heads in increasing split order
    (:func:`state_fold`), then normalizes them once.

    Every column of a row runs the same merge arithmetic on the same LSEs, so cutting the head dim
    into column blocks is bit-neutral (it only adds programs when there are few tokens). CHUNK
    splits are loaded per step (unrolled, so their loads are in flight together) and merged one by
    one, in order; splits past the row's last one load as empty states, exact no-ops.

    ``IS_PDL``: the kernel may start while the split kernel still runs; it finds its row (from
    ``cu_seqlens_q`` and ``kv_lens``, which the split kernel does not write) and then waits
    (``griddepcontrol.wait``: the split kernel has finished and its writes are visible) before
    it reads the workspace."""
    i_t = tl.program_id(0)
    i_kvh = tl.program_id(1)
    i_db = tl.program_id(2)
    # Request of token i_t: the last b with cu[b] <= i_t (empty requests own no token).
    i_b = _find_request(cu_seqlens_q_ptr, i_t, B, 1, False)
    q_start = tl.load(cu_seqlens_q_ptr + i_b)
    q_len = tl.load(cu_seqlens_q_ptr + i_b + 1) - q_start
    kv_len = tl.minimum(tl.maximum(tl.load(kv_lens_ptr + i_b), 0), max_kv_len)
    pos = kv_len - q_len + (i_t - q_start)
    # NOTE: the clamp to num_splits is a no-op for valid input (pos < max kv_len, which sized the
    # workspace); it keeps malformed lengths (validate=False) inside the workspace.
    n_splits = tl.minimum(_split_count(pos + 1, split_tokens, lead_tokens), num_splits)
    o_g = tl.arange(0, BLOCK_G)
    o_d = i_db * BLOCK_D + tl.arange(0, BLOCK_D)
    m_g = o_g < G
    i_ws = (i_t.to(tl.int64) * Hq + i_kvh * G + o_g) * num_splits  # [BG]
    if IS_PDL:
        gdc_wait()
    f_m = tl.full([BLOCK_G], float("-inf"), dtype=tl.float32)
    f_l = tl.zeros([BLOCK_G], dtype=tl.float32)
    f_acc = tl.zeros([BLOCK_G, BLOCK_D], dtype=tl.float32)
    for i_s0 in range(0, n_splits, CHUNK):
        for c in tl.static_range(CHUNK):
            m_s = m_g & (o_g * 0 + (i_s0 + c) < n_splits)
            # [BG]
            s_m = tl.load(ws_ml_ptr + 2 * (i_ws + i_s0 + c), mask=m_s, other=float("-inf"))
            s_l = tl.load(ws_ml_ptr + 2 * (i_ws + i_s0 + c) + 1, mask=m_s, other=0.0)
            # [BG, BD]
            s_acc = tl.load(ws_o_ptr + (i_ws + i_s0 + c)[:, None] * HEAD_DIM + o_d[None, :],
                            mask=m_s[:, None], other=0.0)
            f_m, f_l, f_acc = state_fold(f_m, f_l, f_acc, s_m, s_l, s_acc)
    b_o, b_lse = state_normalize(f_acc, f_l, f_m)
    i_row = i_t.to(tl.int64) * Hq + i_kvh * G + o_g
    tl.store(out_ptr + i_row[:, None] * HEAD_DIM + o_d[None, :],
             b_o.to(out_ptr.dtype.element_ty), mask=m_g[:, None])
    tl.store(lse_ptr + i_row, b_lse * LN2, mask=m_g & (o_g * 0 + i_db == 0))


def make(batch, cell: str, tuning):
    """The call of ``cell`` (module docstring) on ``batch``."""
    cell, *switches = cell.split("+")
    fn = make(batch, cell, tuning) if switches else None
    for switch in switches:
        if switch.startswith("c"):
            fn = patched(fn, kernels.attention, "_MERGE_CHUNK", int(switch[1:]))
        elif switch == "r28":
            fn = patched(fn, kernels.attention, "_merge_splits_kernel",
                         _R28(batch.q.shape[1] // batch.k_cache.shape[2]))
        elif switch.startswith("d"):
            fn = patched(fn, kernels.attention, "_MERGE_BLOCK_D", int(switch[1:]))
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


class _R28:
    """Stands in for the merge kernel in ``kernels.attention._launch_merge``: launches round 28's
    with its own layout (one program per KV head's group of ``G`` query heads and 32 head-dim
    columns, the whole head under the interpreter) and the arguments it took."""

    def __init__(self, G: int) -> None:
        self.G = G

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            kwargs.pop("BLOCK_H")
            head_dim = kwargs["HEAD_DIM"]
            block_d = head_dim if kernels.attention._interpreting() else min(32, head_dim)
            kwargs.update(G=self.G, BLOCK_G=triton.next_power_of_2(self.G), BLOCK_D=block_d)
            _merge_r28_kernel[(grid[0], kwargs["Hq"] // self.G, head_dim // block_d)](
                *args, **kwargs)
        return launch


def _parts_of(fn, flush: torch.Tensor) -> dict:
    """Median durations (us) of ``fn``'s kernels over ``RUNS`` profiled graph replays (module
    docstring)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    fn = graphed(fn)
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


def bits(out_dir: str, specs: list[str]) -> None:
    """``bits``: see the module docstring."""
    rows: list[dict] = []
    for spec in specs or BITS_WORKLOADS:
        for dtype in (torch.bfloat16, torch.float16):
            batch = build_batch(_workload(spec), dtype=dtype)
            ref = make(batch, "auto", None)()
            row: dict = dict(dtype=str(dtype).removeprefix("torch."), workload=spec)
            row["bits_differing"] = {name: _bits_vs(ref, make(batch, cell, None)())
                                     for name, cell in BIT_CELLS.items()}
            del batch
            _record(rows, row, out_dir, "bits.jsonl")


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
    elif step == "bits":
        bits(out_dir, specs)
    elif step == "times2":
        times(out_dir, specs, cells=TIME2_CELLS, base="auto", defaults=TIME2_WORKLOADS,
              repeats=5, make=make, name="times2.jsonl")
    else:
        times(out_dir, specs, cells=CELLS, base="auto", defaults=WORKLOADS, repeats=REPEATS,
              make=make)


if __name__ == "__main__":
    main()
