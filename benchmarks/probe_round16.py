"""Round-16 probe (H100): the swapped decode tile under a layout-free denominator, and 128-key
tiles (reports/h100-round16/README.md).

    python benchmarks/probe_round16.py OUT_DIR chain|steps|bn128|bn128g

``chain`` (calls 2 and 3): a standalone chain of online-softmax tile steps (dense K/V, no paging:
the tile arithmetic alone) in two shapes:

- ``std``: the package's decode tile, ``BLOCK_M`` = 64 rows (query heads) on the MMA's M
  dimension: ``s = q @ k^T``, ``acc = p @ v``;
- ``swap``: the KV tile on M and 16 rows on N: ``s^T = k @ q^T``, ``acc^T = v^T @ p^T`` (round 5
  measured these dots bit-identical to ``std``'s, reports/h100-round5/).

and two denominators: ``tl.sum`` (the package's today: an order set by the register layout, which
differs between the shapes) and ``tree``: a pairwise sum whose pairing is fixed by the key index
(keys ``k`` and ``k + 32``, then ``+ 16``, ..., ``+ 1``): each level reduces an axis of size 2,
and ``a + b == b + a`` exactly, so the bits cannot depend on the layout.

For each denominator it compares the raw bits of the chain's final ``m``, ``l`` and ``acc``
between ``std`` and ``swap`` (bf16 and fp16, three seeds): with ``tree`` they must agree; with
``tl.sum`` they are expected to differ (the control that shows the comparison can fail). Then it
times each variant at 16 and 128 tiles per program on 8, 64 and 132 programs and 3 and 5
stages, every program reading the same K/V (``shared_kv``: 4 MB, L2-sized, the chain's latency) or
its own copy (32 MB at 8 programs, still L2-sized; from HBM at 64 and 132): the per-tile time is
``(t128 - t16) / 112``. Call 2 timed single launches with events around the
host launch (host overhead included, K/V per program only); call 3 times CUDA graphs of 20
launches. Writes ``chain.jsonl``.

``steps`` (call 6): the same chain with two and four tiles per step, both shapes
(:func:`steps`).

``bn128`` (call 4, at commit c85a41e, whose Gluon kernel carries the experiment for ``BLOCK_N >
64``) and ``bn128g`` (call 5, at 7c1f9ea: the fold in global memory, 3 ring slots): :func:`bn128`,
:func:`bn128g`; at other commits they exit, naming these.
"""

from __future__ import annotations

import json
import os
import sys

import torch
import triton
import triton.language as tl

BN = 64
D = 128
BM_STD = 64
BR_SWAP = 16


@triton.jit
def _pair_sum_rows(x, R: tl.constexpr, W: tl.constexpr):
    """[R, W] -> [R, W // 2]: element k plus element k + W // 2."""
    return tl.sum(tl.reshape(x, [R, 2, W // 2]), 1)


@triton.jit
def _pair_sum_cols(x, W: tl.constexpr, R: tl.constexpr):
    """[W, R] -> [W // 2, R]: element k plus element k + W // 2."""
    return tl.sum(tl.reshape(x, [2, W // 2, R]), 0)


@triton.jit
def _tree_rows(x, R: tl.constexpr):
    """Row sums of a [R, 64] tile in the fixed pairwise order."""
    x = _pair_sum_rows(x, R, 64)
    x = _pair_sum_rows(x, R, 32)
    x = _pair_sum_rows(x, R, 16)
    x = _pair_sum_rows(x, R, 8)
    x = _pair_sum_rows(x, R, 4)
    x = _pair_sum_rows(x, R, 2)
    return tl.reshape(x, [R])


@triton.jit
def _tree_cols(x, R: tl.constexpr):
    """Column sums of a [64, R] tile in the same pairwise order over its 64 keys."""
    x = _pair_sum_cols(x, 64, R)
    x = _pair_sum_cols(x, 32, R)
    x = _pair_sum_cols(x, 16, R)
    x = _pair_sum_cols(x, 8, R)
    x = _pair_sum_cols(x, 4, R)
    x = _pair_sum_cols(x, 2, R)
    return tl.reshape(x, [R])


@triton.jit
def _tree_sums_kernel(x_ptr, out_ptr, R: tl.constexpr, TRANSPOSED: tl.constexpr):
    """``out[r]`` = the tree sum of row ``r`` of ``x`` [R, 64], through ``_tree_rows`` or, with
    ``TRANSPOSED``, through ``_tree_cols`` on ``x^T`` (tests/test_bench.py runs it on the CPU)."""
    r = tl.arange(0, R)
    k = tl.arange(0, 64)
    if TRANSPOSED:
        tl.store(out_ptr + r, _tree_cols(tl.load(x_ptr + r[None, :] * 64 + k[:, None]), R))
    else:
        tl.store(out_ptr + r, _tree_rows(tl.load(x_ptr + r[:, None] * 64 + k[None, :]), R))


@triton.jit
def _chain_std(q_ptr, k_ptr, v_ptr, acc_ptr, ml_ptr, n_tiles, qk_scale,
               BM: tl.constexpr, BN_: tl.constexpr, HD: tl.constexpr, TREE: tl.constexpr,
               STAGES: tl.constexpr, SHARED_KV: tl.constexpr):
    pid = tl.program_id(0)
    rm = tl.arange(0, BM)
    rd = tl.arange(0, HD)
    rn = tl.arange(0, BN_)
    q = tl.load(q_ptr + pid * BM * HD + rm[:, None] * HD + rd[None, :])
    m = tl.full([BM], float("-inf"), tl.float32)
    l_i = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, HD], tl.float32)
    base = pid.to(tl.int64) * n_tiles * BN_ * HD * (1 - SHARED_KV)
    for j in tl.range(0, n_tiles, num_stages=STAGES):
        offs = base + (j * BN_ + rn)[:, None] * HD + rd[None, :]
        k = tl.load(k_ptr + offs)
        v = tl.load(v_ptr + offs)
        s = tl.dot(q, tl.trans(k))
        m_new = tl.maximum(m, tl.max(s, 1) * qk_scale)
        p = tl.math.exp2(tl.fma(s, qk_scale, -m_new[:, None]))
        alpha = tl.math.exp2(m - m_new)
        if TREE:  # noqa: SIM108
            l_i = tl.fma(l_i, alpha, _tree_rows(p, BM))
        else:
            l_i = tl.fma(l_i, alpha, tl.sum(p, 1))
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc)
        m = m_new
    tl.store(acc_ptr + pid * BM * HD + rm[:, None] * HD + rd[None, :], acc)
    tl.store(ml_ptr + pid * 2 * BM + rm, m)
    tl.store(ml_ptr + pid * 2 * BM + BM + rm, l_i)


@triton.jit
def _chain_swap(q_ptr, k_ptr, v_ptr, acc_ptr, ml_ptr, n_tiles, qk_scale,
                BM: tl.constexpr, BR: tl.constexpr, BN_: tl.constexpr, HD: tl.constexpr,
                TREE: tl.constexpr, STAGES: tl.constexpr, SHARED_KV: tl.constexpr):
    """The same chain with the operands swapped; q rows [0, BR) of the std buffer (BM rows per
    program); writes acc in std's layout ([BM, HD] per program, rows [0, BR))."""
    pid = tl.program_id(0)
    rr = tl.arange(0, BR)
    rd = tl.arange(0, HD)
    rn = tl.arange(0, BN_)
    qt = tl.load(q_ptr + pid * BM * HD + rr[None, :] * HD + rd[:, None])  # [HD, BR]
    m = tl.full([BR], float("-inf"), tl.float32)
    l_i = tl.zeros([BR], tl.float32)
    acc_t = tl.zeros([HD, BR], tl.float32)
    base = pid.to(tl.int64) * n_tiles * BN_ * HD * (1 - SHARED_KV)
    for j in tl.range(0, n_tiles, num_stages=STAGES):
        offs = base + (j * BN_ + rn)[:, None] * HD + rd[None, :]
        k = tl.load(k_ptr + offs)
        v = tl.load(v_ptr + offs)
        s_t = tl.dot(k, qt)  # [BN, BR]
        m_new = tl.maximum(m, tl.max(s_t, 0) * qk_scale)
        p_t = tl.math.exp2(tl.fma(s_t, qk_scale, -m_new[None, :]))
        alpha = tl.math.exp2(m - m_new)
        if TREE:
            l_i = tl.fma(l_i, alpha, _tree_cols(p_t, BR))
        else:
            l_i = tl.fma(l_i, alpha, tl.sum(p_t, 0))
        acc_t = acc_t * alpha[None, :]
        acc_t = tl.dot(tl.trans(v), p_t.to(v.dtype), acc_t)  # [HD, BN] @ [BN, BR]
        m = m_new
    tl.store(acc_ptr + pid * BM * HD + rr[None, :] * HD + rd[:, None], acc_t)
    tl.store(ml_ptr + pid * 2 * BM + rr, m)
    tl.store(ml_ptr + pid * 2 * BM + BM + rr, l_i)


@triton.jit
def _std_weights(m, b_s, qk_scale):
    m_new = tl.maximum(m, tl.max(b_s, 1) * qk_scale)
    return m_new, tl.math.exp2(tl.fma(b_s, qk_scale, -m_new[:, None])), tl.math.exp2(m - m_new)


@triton.jit
def _swap_weights(m, s_t, qk_scale):
    m_new = tl.maximum(m, tl.max(s_t, 0) * qk_scale)
    return m_new, tl.math.exp2(tl.fma(s_t, qk_scale, -m_new[None, :])), tl.math.exp2(m - m_new)


@triton.jit
def _std_fold(l_i, acc, alpha, p, v, BM: tl.constexpr, TREE: tl.constexpr):
    l_i = tl.fma(l_i, alpha, _tree_rows(p, BM) if TREE else tl.sum(p, 1))
    return l_i, tl.dot(p.to(v.dtype), v, acc * alpha[:, None])


@triton.jit
def _swap_fold(l_i, acc_t, alpha, p_t, v, BR: tl.constexpr, TREE: tl.constexpr):
    l_i = tl.fma(l_i, alpha, _tree_cols(p_t, BR) if TREE else tl.sum(p_t, 0))
    return l_i, tl.dot(tl.trans(v), p_t.to(v.dtype), acc_t * alpha[None, :])


@triton.jit
def _chain_steps(q_ptr, k_ptr, v_ptr, acc_ptr, ml_ptr, n_tiles, qk_scale,
                 BM: tl.constexpr, BR: tl.constexpr, BN_: tl.constexpr, HD: tl.constexpr,
                 SWAP: tl.constexpr, TPS: tl.constexpr, TREE: tl.constexpr,
                 STAGES: tl.constexpr, SHARED_KV: tl.constexpr):
    """The chain with ``TPS`` (2 or 4) tiles per loop step, after the package's split kernel's
    two: the tiles' loads, scores, running maxima and exponentials first, then per tile in
    order its denominator, rescale and ``p @ v`` (per row the operations of ``TPS`` one-tile
    steps, in the same order). ``SWAP``: the swapped tile (``BR`` rows on
    N); else the standard one (``BM`` rows). ``n_tiles`` a multiple of ``TPS``."""
    pid = tl.program_id(0)
    rd = tl.arange(0, HD)
    rn = tl.arange(0, BN_)
    base = pid.to(tl.int64) * n_tiles * BN_ * HD * (1 - SHARED_KV)
    if SWAP:
        rr = tl.arange(0, BR)
        qt = tl.load(q_ptr + pid * BM * HD + rr[None, :] * HD + rd[:, None])  # [HD, BR]
        m = tl.full([BR], float("-inf"), tl.float32)
        l_i = tl.zeros([BR], tl.float32)
        acc = tl.zeros([HD, BR], tl.float32)
    else:
        rr = tl.arange(0, BM)
        qt = tl.load(q_ptr + pid * BM * HD + rr[:, None] * HD + rd[None, :])  # [BM, HD]
        m = tl.full([BM], float("-inf"), tl.float32)
        l_i = tl.zeros([BM], tl.float32)
        acc = tl.zeros([BM, HD], tl.float32)
    for j in tl.range(0, n_tiles, TPS, num_stages=STAGES):
        o0 = base + (j * BN_ + rn)[:, None] * HD + rd[None, :]
        o1 = o0 + BN_ * HD
        k0 = tl.load(k_ptr + o0)
        k1 = tl.load(k_ptr + o1)
        v0 = tl.load(v_ptr + o0)
        v1 = tl.load(v_ptr + o1)
        if SWAP:
            m0, p0, a0 = _swap_weights(m, tl.dot(k0, qt), qk_scale)
            m1, p1, a1 = _swap_weights(m0, tl.dot(k1, qt), qk_scale)
        else:
            m0, p0, a0 = _std_weights(m, tl.dot(qt, tl.trans(k0)), qk_scale)
            m1, p1, a1 = _std_weights(m0, tl.dot(qt, tl.trans(k1)), qk_scale)
        if TPS == 4:
            k2 = tl.load(k_ptr + o1 + BN_ * HD)
            k3 = tl.load(k_ptr + o1 + 2 * BN_ * HD)
            v2 = tl.load(v_ptr + o1 + BN_ * HD)
            v3 = tl.load(v_ptr + o1 + 2 * BN_ * HD)
            if SWAP:
                m2, p2, a2 = _swap_weights(m1, tl.dot(k2, qt), qk_scale)
                m3, p3, a3 = _swap_weights(m2, tl.dot(k3, qt), qk_scale)
            else:
                m2, p2, a2 = _std_weights(m1, tl.dot(qt, tl.trans(k2)), qk_scale)
                m3, p3, a3 = _std_weights(m2, tl.dot(qt, tl.trans(k3)), qk_scale)
        if SWAP:
            l_i, acc = _swap_fold(l_i, acc, a0, p0, v0, BR, TREE)
            l_i, acc = _swap_fold(l_i, acc, a1, p1, v1, BR, TREE)
            if TPS == 4:
                l_i, acc = _swap_fold(l_i, acc, a2, p2, v2, BR, TREE)
                l_i, acc = _swap_fold(l_i, acc, a3, p3, v3, BR, TREE)
        else:
            l_i, acc = _std_fold(l_i, acc, a0, p0, v0, BM, TREE)
            l_i, acc = _std_fold(l_i, acc, a1, p1, v1, BM, TREE)
            if TPS == 4:
                l_i, acc = _std_fold(l_i, acc, a2, p2, v2, BM, TREE)
                l_i, acc = _std_fold(l_i, acc, a3, p3, v3, BM, TREE)
        m = m3 if TPS == 4 else m1
    if SWAP:
        tl.store(acc_ptr + pid * BM * HD + rr[None, :] * HD + rd[:, None], acc)
    else:
        tl.store(acc_ptr + pid * BM * HD + rr[:, None] * HD + rd[None, :], acc)
    tl.store(ml_ptr + pid * 2 * BM + rr, m)
    tl.store(ml_ptr + pid * 2 * BM + BM + rr, l_i)


def _inputs(programs: int, tiles: int, dtype: torch.dtype, seed: int):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.zeros(programs, BM_STD, D, device="cuda", dtype=dtype)
    q[:, :BR_SWAP] = torch.randn(programs, BR_SWAP, D, device="cuda", generator=g).to(dtype)
    k = torch.randn(programs, tiles * BN, D, device="cuda", generator=g).to(dtype)
    v = torch.randn(programs, tiles * BN, D, device="cuda", generator=g).to(dtype)
    return q, k, v


def _outputs(programs: int, device: str = "cuda"):
    return (torch.zeros(programs, BM_STD, D, device=device, dtype=torch.float32),
            torch.zeros(programs, 2, BM_STD, device=device, dtype=torch.float32))


def _run(kind: str, tree: bool, q, k, v, tiles: int, stages: int, outs=None,
         shared_kv: bool = False):
    programs = q.shape[0]
    acc, ml = outs if outs is not None else _outputs(programs, q.device.type)
    scale = 0.08838834764831845 * 1.4426950408889634
    if kind == "std":
        _chain_std[(programs,)](q, k, v, acc, ml, tiles, scale, BM=BM_STD, BN_=BN, HD=D,
                                TREE=tree, STAGES=stages, SHARED_KV=shared_kv, num_warps=4)
    else:
        _chain_swap[(programs,)](q, k, v, acc, ml, tiles, scale, BM=BM_STD, BR=BR_SWAP, BN_=BN,
                                 HD=D, TREE=tree, STAGES=stages, SHARED_KV=shared_kv, num_warps=4)
    return acc[:, :BR_SWAP], ml[:, :, :BR_SWAP]


def _bits_differ(a: torch.Tensor, b: torch.Tensor) -> int:
    return int((a.contiguous().view(torch.int32) != b.contiguous().view(torch.int32)).sum())


def _time(fn, reps: int = 21, per_graph: int = 20) -> float:
    """Median us per launch: a CUDA graph of ``per_graph`` launches replayed ``reps`` times
    (no host launch overhead between the kernels)."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(per_graph):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0 / per_graph)
    times.sort()
    return times[len(times) // 2]


def chain(out_dir: str) -> None:
    rows: list[dict] = []
    path = os.path.join(out_dir, "chain.jsonl")

    def emit(row: dict) -> None:
        rows.append(row)
        print(json.dumps(row), flush=True)
        with open(path, "a") as f:
            f.write(json.dumps(row) + "\n")

    for dtype in (torch.bfloat16, torch.float16):
        for seed in (0, 1, 2):
            q, k, v = _inputs(8, 16, dtype, seed)
            for tree in (True, False):
                a_std, ml_std = _run("std", tree, q, k, v, 16, 3)
                a_sw, ml_sw = _run("swap", tree, q, k, v, 16, 3)
                emit(dict(kind="bits", dtype=str(dtype).removeprefix("torch."), seed=seed,
                          denominator="tree" if tree else "tl.sum",
                          acc_differ=_bits_differ(a_std, a_sw),
                          m_differ=_bits_differ(ml_std[:, 0], ml_sw[:, 0]),
                          l_differ=_bits_differ(ml_std[:, 1], ml_sw[:, 1]),
                          compared=a_std.numel() + 2 * ml_std[:, 0].numel()))
    for shared_kv in (True, False):
      for programs in (8, 64, 132):
        for stages in (3, 5):
            inputs = {t: _inputs(programs, t, torch.bfloat16, 0) for t in (16, 128)}
            outs = _outputs(programs)
            for kind in ("std", "swap"):
                for tree in (False, True):
                    t = {n: _time(lambda n=n: _run(kind, tree, *inputs[n], n, stages, outs,  # noqa: B023
                                                   shared_kv))  # noqa: B023
                         for n in (16, 128)}
                    emit(dict(kind="time", tile=kind, denominator="tree" if tree else "tl.sum",
                              shared_kv=shared_kv,
                              programs=programs, stages=stages, us16=round(t[16], 2),
                              us128=round(t[128], 2),
                              us_per_tile=round((t[128] - t[16]) / 112, 4)))


#: steps (call 6): (label, SWAP, TPS, TREE, STAGES) of ``_chain_steps`` (4 tiles per step fit
#: one stage only: 2 stages need 270,336-278,528 bytes of shared memory,
#: reports/h100-round16/cpu/steps-compile.txt).
STEP_CELLS = [("std-t2-s2", False, 2, False, 2), ("std-t2-s3", False, 2, False, 3),
              ("std-t4-s1", False, 4, False, 1),
              ("swap-t2-s3", True, 2, False, 3), ("swap-t2-s3-tree", True, 2, True, 3),
              ("swap-t4-s1", True, 4, False, 1), ("swap-t4-s1-tree", True, 4, True, 1)]


def _run_steps(cell, q, k, v, tiles: int, outs, shared_kv: bool = False) -> tuple:
    _, swap, tps, tree, stages = cell
    acc, ml = outs
    _chain_steps[(q.shape[0],)](q, k, v, acc, ml, tiles, 0.08838834764831845 * 1.4426950408889634,
                                BM=BM_STD, BR=BR_SWAP, BN_=BN, HD=D, SWAP=swap, TPS=tps,
                                TREE=tree, STAGES=stages, SHARED_KV=shared_kv, num_warps=4)
    return acc[:, :BR_SWAP], ml[:, :, :BR_SWAP]


def steps(out_dir: str) -> None:
    """Several tiles per loop step (``_chain_steps``), standard and swapped: bits against the
    one-tile standard chain with the same denominator (equal expected wherever the
    denominator is the tree or the tile is the standard one; the swapped tile with ``tl.sum``
    is the control, expected to differ in ``l``), then per-tile times with shared K/V (the
    chain's latency), 8 and 64 programs, against the one-tile chain at 3 and 5 stages. A cell
    whose ``acc`` or ``m`` differed is not timed (call 6 timed the swapped four-tile cell,
    whose GPU build computed a wrong ``acc``, and stopped on an illegal memory access)."""
    path = os.path.join(out_dir, "steps.jsonl")

    def emit(row: dict) -> None:
        print(json.dumps(row), flush=True)
        with open(path, "a") as f:
            f.write(json.dumps(row) + "\n")

    broken: set[str] = set()
    for dtype in (torch.bfloat16, torch.float16):
        for seed in (0, 1):
            q, k, v = _inputs(8, 16, dtype, seed)
            refs = {tree: _run("std", tree, q, k, v, 16, 3) for tree in (False, True)}
            for cell in STEP_CELLS:
                a, ml = _run_steps(cell, q, k, v, 16, _outputs(8))
                a_ref, ml_ref = refs[cell[3]]
                row = dict(kind="bits", dtype=str(dtype).removeprefix("torch."), seed=seed,
                           cell=cell[0], acc_differ=_bits_differ(a, a_ref),
                           m_differ=_bits_differ(ml[:, 0], ml_ref[:, 0]),
                           l_differ=_bits_differ(ml[:, 1], ml_ref[:, 1]))
                if row["acc_differ"] or row["m_differ"]:
                    broken.add(cell[0])
                emit(row)
    for programs in (8, 64):
        inputs = {t: _inputs(programs, t, torch.bfloat16, 0) for t in (16, 128)}
        outs = _outputs(programs)
        for stages in (3, 5):
            t = {n: _time(lambda n=n: _run("std", False, *inputs[n], n, stages, outs, True))  # noqa: B023
                 for n in (16, 128)}
            emit(dict(kind="time", cell=f"std-t1-s{stages}", programs=programs,
                      us16=round(t[16], 2), us128=round(t[128], 2),
                      us_per_tile=round((t[128] - t[16]) / 112, 4)))
        for cell in STEP_CELLS:
            if cell[0] in broken:
                emit(dict(kind="time", cell=cell[0], programs=programs,
                          skipped="acc or m differed from the one-tile chain"))
                continue
            t = {n: _time(lambda n=n: _run_steps(cell, *inputs[n], n, outs, True))  # noqa: B023
                 for n in (16, 128)}
            emit(dict(kind="time", cell=cell[0], programs=programs, us16=round(t[16], 2),
                      us128=round(t[128], 2), us_per_tile=round((t[128] - t[16]) / 112, 4)))


#: bn128: (workload, cells) where a cell is (label, Tuning fields, Gluon ring slots or None).
BN128_PREFILL = [("bn128-gluon", dict(block_n=128), 2),
                 ("bn128-triton", dict(block_n=128, gluon=False), None)]
BN128_DECODE = [("bn128-s3", dict(block_n=128, num_stages=3, tiles_per_step=1), None),
                ("bn128-s2", dict(block_n=128, num_stages=2, tiles_per_step=1), None)]
BN128_WORKLOADS = {"prefill-varlen": BN128_PREFILL, "mixed64": BN128_PREFILL,
                   "prefill:4096x4": BN128_PREFILL,
                   **{w: BN128_DECODE for w in (
                       "decode-b1-ctx1k", "decode-b1-ctx8k", "decode-b8-ctx1k", "decode-b8-ctx8k",
                       "decode-b1-ctx32k", "decode-b64-ctx8k", "decode-b256-ctx8k",
                       "decode-prod64")}}


#: bn128g (call 5, at commit 7c1f9ea, which adds ``kernels._gluon.FOLD_GLOBAL``): the Gluon cells
#: only, with the fold's acc in shared memory (2 ring slots) or in a global workspace (2 or 3
#: slots: shared memory then holds q and the ring alone).
BN128G_PREFILL = [("bn128-gluon", dict(block_n=128), 2),
                  ("bn128-gluon-global", dict(block_n=128), (2, True)),
                  ("bn128-gluon-global-ring3", dict(block_n=128), (3, True))]
BN128G_WORKLOADS = {"prefill-varlen": BN128G_PREFILL, "mixed64": BN128G_PREFILL,
                    "prefill:4096x4": BN128G_PREFILL}


def bn128g(out_dir: str) -> None:
    """:func:`bn128`'s Gluon cells with the fold in global memory (``BN128G_WORKLOADS``)."""
    bn128(out_dir, BN128G_WORKLOADS, "bn128g.jsonl")


def bn128(out_dir: str, workloads: dict | None = None, name: str = "bn128.jsonl") -> None:
    """BLOCK_N 128 (a contract change: other bits) against the default 64-key tiles, bf16: the
    Gluon prefill kernel at 128 keys (its fold acc in shared memory, 2 ring slots of 64 KB; the
    gate ``gluon_prefill`` patched to let 128 through) and the Triton kernels at 128 keys, on
    prefill and mixed batches; the Triton decode kernels at 128 keys with 3 and 2 stages (5 do
    not fit in shared memory) on decode. Times (CUDA graphs, L2 flushed, medians of 20, three
    repeats interleaved) and, as a sanity check of the 128-key kernels' results, the largest
    difference of out and LSE from the default's (not bits: BLOCK_N moves them)."""
    import kernels
    import kernels._gluon as kg
    import kernels.attention as ka
    from benchmarks.probe_round4 import call, patched, time_interleaved
    from benchmarks.probe_round11 import _workload
    from benchmarks.tile_sweep import _graphed as graphed
    from invariance.bench import CudaTimer, build_batch

    reason = kg.unavailable_reason()
    if reason is not None:
        raise SystemExit(f"probe_round16.py bn128: the Gluon kernel needs {reason}")
    import kernels._gluon.attention_kernels as gluon_kernels
    if not hasattr(gluon_kernels, "_score_layout"):
        raise SystemExit("probe_round16.py bn128/bn128g: the Gluon kernel here has no 128-key "
                         "tiles; "
                         "run bn128 at commit c85a41e (call 4) and bn128g at 7c1f9ea (call 5), "
                         "whose kernels carry the experiment")
    gate = ka.gluon_prefill
    ka.gluon_prefill = (lambda dtype, d, bm, bn, nw, ps, nested, sm=None:
                        gate(dtype, d, bm, 64 if bn == 128 else bn, nw, ps, nested, sm))
    timer = CudaTimer(iters=20, warmup=2)
    path = os.path.join(out_dir, name)
    for spec, cells in (workloads or BN128_WORKLOADS).items():
        batch = build_batch(_workload(spec), dtype=torch.bfloat16)
        ref = call(batch)
        ref_out, ref_lse = ref()
        row: dict = dict(workload=spec)
        graphs = [("default", graphed(ref))]
        for label, fields, ring in cells:
            fn = call(batch, "auto", kernels.Tuning(**fields))
            if isinstance(ring, tuple):  # (ring slots, the fold in global memory)
                if not hasattr(kg, "FOLD_GLOBAL"):
                    raise SystemExit("probe_round16.py bn128g: kernels._gluon has no "
                                     "FOLD_GLOBAL here; run it at commit 7c1f9ea (call 5)")
                fn = patched(patched(fn, kg, "RING_SLOTS", ring[0]), kg, "FOLD_GLOBAL", ring[1])
            elif ring is not None:
                fn = patched(fn, kg, "RING_SLOTS", ring)
            try:
                out, lse = fn()
                # Rows that attend to nothing have LSE -inf in both; any other non-finite
                # LSE of the variant is counted, not masked (call 4 ran an earlier version
                # that masked it: reports/h100-round16/README.md, section 4).
                same_inf = torch.isinf(ref_lse) & (lse == ref_lse)
                row[f"{label}_max_out_diff"] = float((out.float() - ref_out.float()).abs().max())
                row[f"{label}_max_lse_diff"] = float(
                    torch.where(same_inf, 0.0, (lse - ref_lse).abs()).max())
                row[f"{label}_nonfinite_out"] = int((~torch.isfinite(out)).sum())
                row[f"{label}_nonfinite_lse"] = int((~(torch.isfinite(lse) | same_inf)).sum())
                graphs.append((label, graphed(fn)))
            except Exception as exc:  # a cell that does not compile or launch: recorded
                row[f"{label}_error"] = repr(exc)[:300]
        time_interleaved(row, graphs, timer)
        print(json.dumps(row), flush=True)
        with open(path, "a") as f:
            f.write(json.dumps(row) + "\n")
        del batch
        torch.cuda.empty_cache()


MODES = {"chain": chain, "steps": steps, "bn128": bn128, "bn128g": bn128g}


def main(out_dir: str, mode: str) -> None:
    os.makedirs(out_dir, exist_ok=True)
    if mode not in MODES:
        raise SystemExit(f"probe_round16.py: unknown mode {mode!r} ({', '.join(MODES)})")
    MODES[mode](out_dir)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    main(sys.argv[1], sys.argv[2])
