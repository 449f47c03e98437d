"""Round-4 probe (H100): where the decode time goes (reports/h100-round4/README.md).

    python benchmarks/probe_round4.py OUT_DIR [times|small|blockn|splits|profile|ttgir|ncu W P]

``times``: every workload x plan x pipeline stages x merge column block, CUDA-graph replay (L2
flushed, median), each compared bit for bit with the fused plan. ``small``: short decode, stages x
warps. ``blockn``: BLOCK_N 128 (bit-defining, timed only). ``splits``: each plan at split sizes
1024 / 512 / 256 (bit-defining, timed only). ``profile``: device time per kernel
(torch.profiler). ``ttgir``: registers, spills, shared memory and what the pipeliner made of the
loops (async copies, wgmma waits). ``ncu``: runs a workload twice, for ``ncu -k ... -s 1``.
"""

from __future__ import annotations

import json
import os
import sys

import torch

import kernels
from benchmarks.tile_sweep import _graphed as graphed
from invariance.bench import WORKLOADS, CudaTimer, build_batch
from invariance.compare import compare_bits

DECODE = ["decode-b1-ctx1k", "decode-b1-ctx8k", "decode-b1-ctx32k", "decode-b8-ctx1k",
          "decode-b8-ctx32k", "decode-b64-ctx8k", "decode-prod64"]
ALL = [*DECODE, "mixed64", "prefill-varlen"]


def call(batch, plan="auto", tuning=None, split_size=kernels.DEFAULT_SPLIT_SIZE):
    lens = (batch.q_lens(), batch.kv_lens.tolist())

    def fn():
        return kernels.unified_attention(
            batch.q, batch.k_cache, batch.v_cache, batch.cu_seqlens_q, batch.kv_lens,
            batch.block_table, sm_scale=batch.sm_scale, plan=plan, tuning=tuning,
            validate=False, host_lens=lens, split_size=split_size)
    return fn


def patched(fn, owner, name, value):
    """``fn`` run with ``owner.name`` set to ``value`` (restored after each call), so that a
    CUDA-graph capture of the result records the patched behaviour."""
    def run():
        saved = getattr(owner, name)
        setattr(owner, name, value)
        try:
            return fn()
        finally:
            setattr(owner, name, saved)
    return run


def time_interleaved(row, graphs, timer, repeats=3):
    """Into ``row["us_NAME"]``: ``repeats`` timings (us) of each ``(NAME, graph replay)``, the
    cells interleaved within each repeat."""
    for _ in range(repeats):
        for name, g in graphs:
            row.setdefault(f"us_{name}", []).append(round(timer.time_fn(g) * 1000, 1))


def save(out_dir, name, rows):
    """Write ``rows`` as JSON lines to ``out_dir/name``."""
    with open(os.path.join(out_dir, name), "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


# (label, plan, merge columns per program, merge warps, stages)
CONFIGS = [
    ("fused-s2", "fused", 32, 1, 2),
    ("fused-s3", "fused", 32, 1, 3),
    ("split-s2", "split", 32, 1, 2),
    ("split-s3", "split", 32, 1, 3),
    ("split-merge64w2", "split", 64, 2, 2),
    ("split-merge128w4", "split", 128, 4, 2),
    ("auto", "auto", 32, 1, 2),
]


def times(out_dir):
    """Plans, stages and merge column blocks, timed and compared bit for bit with the fused plan
    (the merge settings are module constants of kernels.attention, patched here)."""
    import kernels.attention as attention

    timer = CudaTimer(iters=20, warmup=3)
    rows = []
    saved = attention._merge_block_d, attention._MERGE_NUM_WARPS
    for name in ALL:
        batch = build_batch(WORKLOADS[name])
        ref = call(batch, "fused")()
        for label, plan, block_d, warps, stages in CONFIGS:
            if plan == "split" and name == "prefill-varlen" and label != "split-s2":
                continue
            if plan == "fused" and name == "decode-b1-ctx32k" and stages == 3:
                continue
            attention._merge_block_d = lambda head_dim, b=block_d: min(b, head_dim)
            attention._MERGE_NUM_WARPS = warps
            tuning = kernels.Tuning(num_stages=stages)
            out, lse = call(batch, plan, tuning)()
            d = (compare_bits(out, ref[0], name="out").num_different
                 + compare_bits(lse, ref[1], name="lse").num_different)
            ms = timer.time_fn(graphed(call(batch, plan, tuning)))
            rows.append(dict(workload=name, config=label, us=round(ms * 1000, 1),
                             bits_differing=d))
            print(json.dumps(rows[-1]), flush=True)
        del batch
        torch.cuda.empty_cache()
    attention._merge_block_d, attention._MERGE_NUM_WARPS = saved
    save(out_dir, "times.jsonl", rows)
    labels = [c[0] for c in CONFIGS]
    print("\nworkload | " + " | ".join(labels))
    for name in ALL:
        got = {r["config"]: r for r in rows if r["workload"] == name}
        print(name + " | " + " | ".join(
            f"{got[lb]['us']}{'' if got[lb]['bits_differing'] == 0 else ' DIFF'}"
            if lb in got else "-" for lb in labels))


SPLIT_WORKLOADS = list(WORKLOADS)  # every bench workload


def splits(out_dir):
    """Time of each plan at split sizes 1024 / 512 / 256 (bit-defining: no bit comparison)."""
    timer = CudaTimer(iters=20, warmup=3)
    rows = []
    for name in SPLIT_WORKLOADS:
        batch = build_batch(WORKLOADS[name])
        for split in (1024, 512, 256):
            for plan in ("fused", "split"):
                if name == "decode-b1-ctx32k" and plan == "fused":
                    continue
                ms = timer.time_fn(graphed(call(batch, plan, None, split)))
                rows.append(dict(workload=name, split=split, plan=plan, us=round(ms * 1000, 1)))
                print(json.dumps(rows[-1]), flush=True)
        del batch
        torch.cuda.empty_cache()
    save(out_dir, "splits.jsonl", rows)
    print("\nworkload | " + " | ".join(f"{p}-{s}" for s in (1024, 512, 256)
                                        for p in ("fused", "split")))
    for name in SPLIT_WORKLOADS:
        got = {(r["plan"], r["split"]): r["us"] for r in rows if r["workload"] == name}
        print(name + " | " + " | ".join(str(got.get((p, s), "-")) for s in (1024, 512, 256)
                                         for p in ("fused", "split")))


BLOCKN_CONFIGS = [(64, 64, 4, 2), (64, 128, 4, 2), (128, 64, 4, 2), (128, 64, 8, 2),
                  (128, 128, 4, 2), (128, 128, 8, 2), (128, 128, 8, 3)]


def blockn(out_dir):
    """BLOCK_N 128 instead of 64 (bit-defining: timed only) with BLOCK_M 64/128 and 4/8 warps,
    each under plan auto (with host lengths), for every bench workload."""
    timer = CudaTimer(iters=15, warmup=3)
    rows = []
    for name in SPLIT_WORKLOADS:
        batch = build_batch(WORKLOADS[name])
        for bn, bm, w, st in BLOCKN_CONFIGS:
            tuning = kernels.Tuning(block_n=bn, block_m=bm, num_warps=w, num_stages=st)
            try:
                ms = timer.time_fn(graphed(call(batch, "auto", tuning)))
            except Exception as exc:  # out of resources: recorded
                rows.append(dict(workload=name, config=f"{bn}/{bm}/{w}/{st}",
                                 error=str(exc).splitlines()[0][:120]))
                continue
            rows.append(dict(workload=name, config=f"{bn}/{bm}/{w}/{st}", us=round(ms * 1000, 1)))
            print(json.dumps(rows[-1]), flush=True)
        del batch
        torch.cuda.empty_cache()
    save(out_dir, "blockn.jsonl", rows)
    labels = [f"{bn}/{bm}/{w}/{st}" for bn, bm, w, st in BLOCKN_CONFIGS]
    print("\nworkload (BLOCK_N/BLOCK_M/warps/stages) | " + " | ".join(labels))
    for name in SPLIT_WORKLOADS:
        got = {r["config"]: r.get("us", "err") for r in rows if r["workload"] == name}
        print(name + " | " + " | ".join(str(got.get(lb, "-")) for lb in labels))


def small(out_dir):
    """Short decode at batch 1-8 under the split plan: pipeline stages x warps (bit-neutral
    where measured; compared bit for bit with the default launch)."""
    timer = CudaTimer(iters=30, warmup=5)
    rows = []
    for name in ("decode-b1-ctx1k", "decode-b1-ctx8k", "decode-b8-ctx1k"):
        batch = build_batch(WORKLOADS[name])
        ref = call(batch, "split")()
        for st in (1, 2, 3, 4):
            for w in (4, 8):
                tuning = kernels.Tuning(num_stages=st, num_warps=w)
                out, lse = call(batch, "split", tuning)()
                d = (compare_bits(out, ref[0], name="out").num_different
                     + compare_bits(lse, ref[1], name="lse").num_different)
                ms = timer.time_fn(graphed(call(batch, "split", tuning)))
                rows.append(dict(workload=name, stages=st, warps=w, us=round(ms * 1000, 1),
                                 bits_differing=d))
                print(json.dumps(rows[-1]), flush=True)
    save(out_dir, "small.jsonl", rows)


def profile(out_dir):
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as prof
    lines = []
    for name, plan in [("decode-b1-ctx1k", "fused"), ("decode-b1-ctx1k", "split"),
                       ("decode-b1-ctx8k", "split"), ("decode-b1-ctx32k", "split"),
                       ("decode-b8-ctx32k", "split"), ("decode-prod64", "split"),
                       ("mixed64", "fused"), ("mixed64", "split")]:
        batch = build_batch(WORKLOADS[name])
        fn = call(batch, plan)
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        with prof(activities=[ProfilerActivity.CUDA]) as p:
            for _ in range(10):
                fn()
            torch.cuda.synchronize()
        for e in p.key_averages():
            if e.device_time_total > 0 and ("attention" in e.key or "merge" in e.key):
                lines.append(f"{name} {plan} {e.key[:48]} "
                             f"{e.device_time_total / max(e.count, 1):.1f} us x{e.count}")
                print(lines[-1], flush=True)
        del batch
        torch.cuda.empty_cache()
    with open(os.path.join(out_dir, "profile.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")


def ttgir(out_dir):
    import triton.runtime.jit as jit
    seen = {}
    orig = jit.JITFunction.run

    def run(fn, *args, **kwargs):
        k = orig(fn, *args, **kwargs)
        name = getattr(getattr(fn, "fn", None), "__name__", "kernel")
        if k is not None and hasattr(k, "asm"):
            tag = f"{name}-m{kwargs.get('BLOCK_M')}"
            seen[tag] = k
        return k

    jit.JITFunction.run = run
    for name in ("decode-b8-ctx32k", "mixed64"):
        batch = build_batch(WORKLOADS[name])
        for plan in ("fused", "split"):
            call(batch, plan)()
        torch.cuda.synchronize()
    jit.JITFunction.run = orig
    for tag, k in seen.items():
        ir = k.asm.get("ttgir", "")
        with open(os.path.join(out_dir, tag + ".ttgir"), "w") as f:
            f.write(ir)
        meta = k.metadata
        counts = {w: ir.count(w) for w in ("async_copy_global_to_local", "async_wait",
                                           "warp_group_dot ", "warp_group_dot_wait",
                                           "local_alloc", "scf.for", "scf.if")}
        print(tag, "regs", getattr(k, "n_regs", "?"), "spills", getattr(k, "n_spills", "?"),
              "shared", getattr(meta, "shared", "?"), counts, flush=True)


def ncu(workload, plan):
    batch = build_batch(WORKLOADS[workload])
    fn = call(batch, plan)
    fn()
    torch.cuda.synchronize()
    fn()
    torch.cuda.synchronize()


MODES = {"times": times, "small": small, "blockn": blockn, "splits": splits,
         "profile": profile, "ttgir": ttgir}

if __name__ == "__main__":
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    what = sys.argv[2] if len(sys.argv) > 2 else "times"
    if what == "ncu":
        ncu(sys.argv[3], sys.argv[4])
    elif what in MODES:
        MODES[what](out_dir)
    else:
        sys.exit(f"probe_round4: unknown mode {what!r}; expected one of {', '.join(MODES)} or "
                 "ncu WORKLOAD PLAN")
