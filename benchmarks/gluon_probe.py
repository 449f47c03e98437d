"""Round-12 spike (H100): can a kernel that issues its own ``wgmma`` waits overlap a tile's
exponentials with tensor-core work and keep the Triton kernels' bits? (reports/h100-round12/).

    python benchmarks/gluon_probe.py OUT_DIR [--compile-only]

Written for Triton 3.6, the GPU machine's version: Gluon is experimental and its API moves
between releases (under Triton 3.9 this file does not compile), so no CPU test runs it.

Not a kernel of the package: a microbenchmark of the prefill tile's inner loop (128 query rows
on 8 warps, 64-key tiles, head dim 128, every tile fully visible, one fresh online softmax, raw
states out), in versions with the same operations per row as the package's ``_attend_tile``
(``_tile_scores`` and ``_tile_weights``, then ``l * alpha + sum(p)`` and ``acc * alpha + p @ v``
on the tensor cores; the Gluon versions compile the package's ``_tile_weights`` as Gluon):

- ``triton`` (``_triton_loop``): the loop in Triton, one tile per step, contiguous K and V
  (every score ``wgmma`` waited for at once; reports/h100-round12/cpu/dot-waits.md). Not the
  package's fused kernel (no pairs of tiles, block-table gathers, splits or folds): the
  reference the others are compared with, bit for bit and in time;
- ``package`` (``_package_loop``): the package's own loop, ``_attend_split`` as the fused
  kernel's nested loop runs it for the prefill tile (two tiles per step, K rows, the block-table
  gather of the paged cache, 8 warps, 3 stages), over one split of fully visible tiles;
- ``gluon`` (``_gluon_loop``, explicit layouts and waits): the next tile's score ``wgmma``
  issued before this tile's exponentials, this tile's ``p @ v`` waited for only before the next
  rescale, loads two tiles ahead (``cp.async``, five slots: a slot is refilled three tiles after
  its use, when both warpgroups are past their reads of it);
- ``gluon-ws`` (``_gluon_ws_loop``): the same per warpgroup, warp-specialised: each warpgroup
  (64 rows) its own partition, a loader warp bringing the tiles by TMA, mbarriers instead of the
  block-wide barrier of each step (FA3's producer/consumer split); ``-paged``: through a block
  table of 16-token pages in shuffled order (four TMA boxes per tile);
- ``gluon-ws2-paged`` (``FA3_ORDER``): each step issues the next tile's score ``wgmma`` and this
  tile's ``p @ v`` together, computes the next tile's weights while both run, and rescales
  ``acc`` once ``p @ v`` is done; ``-pp`` (``PINGPONG``): the two warpgroups also take turns
  issuing their dots (FA3's ping-pong, by mbarriers).

The raw states (m, l, acc; NaN-filled before each run) of ``package`` and the Gluon versions
are compared bit for bit with ``triton``'s at bf16 on four grids and at fp16 on the largest,
then all are timed at bf16 (``_time``: ten back-to-back launches between CUDA events, five
repeats with the versions interleaved, the median; descriptors built outside the timed
launches; eight K/V sequences shared by all programs, so they stay in L2 as a prefill's do).
``--compile-only`` compiles every version for sm_90 without a GPU (as
``benchmarks/kernel_stats.py`` does) and prints registers, spills, shared memory and the order
of its dots, waits and exponentials (``kernel_stats.py --dot-waits``).
"""

from __future__ import annotations

import json
import os
import sys

import torch
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_init,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from kernels._triton.attention_kernels import _attend_split, _tile_scores, _tile_weights

BLOCK_M, BLOCK_N, D = 128, 64, 128
#: Distinct K/V sequences, program p reads set p % KV_SETS: as in a prefill, where every query
#: block of a request reads the same keys, they stay in L2 and the loop is compute-bound.
KV_SETS: tl.constexpr = tl.constexpr(8)


@triton.jit
def _triton_loop(q_ptr, k_ptr, v_ptr, m_ptr, l_ptr, acc_ptr, N, qk_scale,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr):
    pid = tl.program_id(0)
    o_m = tl.arange(0, BLOCK_M)
    o_n = tl.arange(0, BLOCK_N)
    o_d = tl.arange(0, D)
    b_q = tl.load(q_ptr + pid.to(tl.int64) * BLOCK_M * D + o_m[:, None] * D + o_d[None, :])
    kv = (pid % KV_SETS).to(tl.int64) * N * BLOCK_N * D
    pos = o_m  # unused on the unmasked path
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, D], dtype=tl.float32)
    for j in range(0, N):
        off = kv + (j * BLOCK_N + o_n)[:, None] * D + o_d[None, :]
        b_kt = tl.trans(tl.load(k_ptr + off))
        b_v = tl.load(v_ptr + off)
        b_s = _tile_scores(b_q, b_kt, j, pos, BLOCK_M, BLOCK_N, False, False, "tf32")
        m_i, alpha, b_p = _tile_weights(m_i, b_s, qk_scale)
        l_i = l_i * alpha + tl.sum(b_p, 1)
        acc = acc * alpha[:, None]
        acc = tl.dot(b_p.to(b_v.dtype), b_v, acc)
    o = pid.to(tl.int64) * BLOCK_M
    tl.store(m_ptr + o + o_m, m_i)
    tl.store(l_ptr + o + o_m, l_i)
    tl.store(acc_ptr + (o + o_m)[:, None] * D + o_d[None, :], acc)


@triton.jit
def _package_loop(q_ptr, k_ptr, v_ptr, m_ptr, l_ptr, acc_ptr, N, qk_scale, table_ptr, num_pages,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr,
                  HEADS: tl.constexpr):
    """The package's own inner loop: ``_attend_split`` as the fused kernel's nested loop runs it
    for the prefill tile (two fully visible tiles per step, K loaded as rows, the block-table
    gather of 16-token pages), over one split of ``N`` tiles that every row sees entirely,
    from the paged cache ``[pages, 16, HEADS, D]`` (head ``pid % KV_SETS``)."""
    pid = tl.program_id(0)
    o_m = tl.arange(0, BLOCK_M)
    o_d = tl.arange(0, D)
    b_q = tl.load(q_ptr + pid.to(tl.int64) * BLOCK_M * D + o_m[:, None] * D + o_d[None, :])
    kv_len = N * BLOCK_N
    pos = kv_len + o_m  # past every key: no tile is masked
    m_i, l_i, acc = _attend_split(
        b_q, pos, kv_len - 1, kv_len - 1, kv_len, 0, N, pid % KV_SETS, k_ptr, v_ptr, table_ptr,
        num_pages, qk_scale, 16 * HEADS * D, HEADS * D, D, 16 * HEADS * D, HEADS * D, D,
        D, 16, 4, BLOCK_M, BLOCK_N, False, True, False, "tf32", 0, D, 2)
    o = pid.to(tl.int64) * BLOCK_M
    tl.store(m_ptr + o + o_m, m_i)
    tl.store(l_ptr + o + o_m, l_i)
    tl.store(acc_ptr + (o + o_m)[:, None] * D + o_d[None, :], acc)


@gluon.jit
def _issue_tile(k_s, v_s, k_ptr, v_ptr, kv, t, N, o_n, o_d,
                BLOCK_N: gl.constexpr, D: gl.constexpr, STAGES: gl.constexpr):
    """cp.async of tile ``t``'s K and V into slot ``t % STAGES`` (nothing past the last tile),
    then a commit (an empty group past it: the group count stays one per call)."""
    m = (t < N) & (o_n >= 0)
    off = kv + (t * BLOCK_N + o_n)[:, None] * D + o_d[None, :]
    cp.async_copy_global_to_shared(k_s.index(t % STAGES), k_ptr + off, mask=m[:, None])
    cp.async_copy_global_to_shared(v_s.index(t % STAGES), v_ptr + off, mask=m[:, None])
    cp.commit_group()


#: The package's own online-softmax weights (``_tile_weights``), compiled as Gluon: the Gluon
#: versions run the same source for them as the Triton kernels.
_weights = gluon.jit(_tile_weights.fn)


@gluon.jit
def _store_state(m_i, l_i, acc, m_ptr, l_ptr, acc_ptr, row0, ROWS: gl.constexpr,
                 D: gl.constexpr, S_L: gl.constexpr, O_L: gl.constexpr):
    """The raw state of rows ``[row0, row0 + ROWS)``: m, l (layout ``S_L``'s rows), acc
    (``O_L``)."""
    o_ms = gl.arange(0, ROWS, layout=gl.SliceLayout(1, S_L))
    gl.store(m_ptr + row0 + o_ms, m_i)
    gl.store(l_ptr + row0 + o_ms, l_i)
    o_mo = gl.arange(0, ROWS, layout=gl.SliceLayout(1, O_L))
    o_do = gl.arange(0, D, layout=gl.SliceLayout(0, O_L))
    gl.store(acc_ptr + (row0 + o_mo)[:, None] * D + o_do[None, :], acc)


@gluon.jit
def _q_and_slots(q_ptr, pid, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, D: gl.constexpr,
                 STAGES: gl.constexpr, LD_L: gl.constexpr):
    """The block's q in shared memory (128-byte swizzled, as Triton puts it), and ``STAGES`` K
    and V slots."""
    SM_L: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16,
                                              rank=2)
    o_m = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, LD_L))
    o_d = gl.arange(0, D, layout=gl.SliceLayout(0, LD_L))
    b_q = gl.load(q_ptr + pid.to(gl.int64) * BLOCK_M * D + o_m[:, None] * D + o_d[None, :])
    q_s = gl.allocate_shared_memory(b_q.dtype, [BLOCK_M, D], SM_L, b_q)
    k_s = gl.allocate_shared_memory(b_q.dtype, [STAGES, BLOCK_N, D], SM_L)
    v_s = gl.allocate_shared_memory(b_q.dtype, [STAGES, BLOCK_N, D], SM_L)
    return q_s, k_s, v_s


@gluon.jit
def _gluon_loop(q_ptr, k_ptr, v_ptr, m_ptr, l_ptr, acc_ptr, N, qk_scale,
                BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, D: gl.constexpr):
    # The layouts Triton 3.6 gives the prefill tile (its TTGIR): S and P on m64n64 wgmma, acc on
    # m64n128, both warpgroups stacked on M; K/V tiles in 128-byte swizzled shared memory.
    S_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[8, 1],
                                                  instr_shape=[16, 64, 16])
    O_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[8, 1],
                                                  instr_shape=[16, 128, 16])
    P_L: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_L, k_width=2)
    LD_L: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[2, 16],
                                          warps_per_cta=[8, 1], order=[1, 0])
    STAGES: gl.constexpr = 5
    pid = gl.program_id(0)
    o_n = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, LD_L))
    o_d = gl.arange(0, D, layout=gl.SliceLayout(0, LD_L))
    q_s, k_s, v_s = _q_and_slots(q_ptr, pid, BLOCK_M, BLOCK_N, D, STAGES, LD_L)
    kv = (pid % KV_SETS).to(gl.int64) * N * BLOCK_N * D
    _issue_tile(k_s, v_s, k_ptr, v_ptr, kv, 0, N, o_n, o_d, BLOCK_N, D, STAGES)
    _issue_tile(k_s, v_s, k_ptr, v_ptr, kv, 1, N, o_n, o_d, BLOCK_N, D, STAGES)
    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=gl.SliceLayout(1, S_L))
    l_i = gl.full([BLOCK_M], 0.0, gl.float32, layout=gl.SliceLayout(1, S_L))
    zero_s = gl.full([BLOCK_M, BLOCK_N], 0.0, gl.float32, layout=S_L)
    acc_tok = warpgroup_mma_init(gl.full([BLOCK_M, D], 0.0, gl.float32, layout=O_L))
    # Tile 0's scores (tile 1 may still be in flight).
    cp.wait_group(1)
    gl.thread_barrier()
    fence_async_shared()
    s_tok = warpgroup_mma(q_s, k_s.index(0).permute((1, 0)), zero_s, is_async=True)
    b_s = warpgroup_mma_wait(0, deps=[s_tok])
    for j in range(0, N):
        # Tile j + 2 into the slot tile j - 3 used (every warpgroup has waited for its p @ v
        # before the barrier of step j - 1, which this thread has passed), then tile j + 1 in.
        _issue_tile(k_s, v_s, k_ptr, v_ptr, kv, j + 2, N, o_n, o_d, BLOCK_N, D, STAGES)
        cp.wait_group(1)
        gl.thread_barrier()
        fence_async_shared()
        # Next tile's scores (past the last tile: a dummy on a zero-filled slot).
        s_next = warpgroup_mma(q_s, k_s.index((j + 1) % STAGES).permute((1, 0)), zero_s,
                               is_async=True)
        # This tile's weights, while the next scores and the previous p @ v run.
        m_i, alpha, b_p = _weights(m_i, b_s, qk_scale)
        l_i = l_i * alpha + gl.sum(b_p, 1)
        # The previous p @ v (the older of the two dots in flight) before the rescale.
        acc = warpgroup_mma_wait(1, deps=[acc_tok])
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, O_L))[:, None]
        p = gl.convert_layout(b_p.to(k_s.dtype), P_L)
        acc_tok = warpgroup_mma(p, v_s.index(j % STAGES), acc, is_async=True)
        # The next scores (now the older dot in flight); this p @ v runs on.
        b_s = warpgroup_mma_wait(1, deps=[s_next])
    acc = warpgroup_mma_wait(0, deps=[acc_tok])
    _store_state(m_i, l_i, acc, m_ptr, l_ptr, acc_ptr, pid.to(gl.int64) * BLOCK_M, BLOCK_M, D,
                 S_L, O_L)


#: One warpgroup's layouts in the warp-specialised versions (64 rows on 4 warps): the scores and
#: p on m64n64 ``wgmma``, acc on m64n128, as Triton lays out each warpgroup's half of the tile.
WG_S_L: gl.constexpr = gl.constexpr(gl.NVMMADistributedLayout(
    version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 64, 16]))
WG_O_L: gl.constexpr = gl.constexpr(gl.NVMMADistributedLayout(
    version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 128, 16]))


@gluon.jit
def _wg_start(q_s, half, HALF: gl.constexpr, BLOCK_N: gl.constexpr):
    """A consumer warpgroup's q rows (its half of the block) and fresh online-softmax state:
    (q, m = -inf, l = 0, a zero score accumulator)."""
    m_i = gl.full([HALF], float("-inf"), gl.float32, layout=gl.SliceLayout(1, WG_S_L))
    l_i = gl.full([HALF], 0.0, gl.float32, layout=gl.SliceLayout(1, WG_S_L))
    zero_s = gl.full([HALF, BLOCK_N], 0.0, gl.float32, layout=WG_S_L)
    return q_s.slice(half * HALF, HALF), m_i, l_i, zero_s


@gluon.jit
def _ws_consumer(q_s, k_s, v_s, ready, empty, m_ptr, l_ptr, acc_ptr, N, qk_scale, pid, half,
                 BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, D: gl.constexpr,
                 STAGES: gl.constexpr):
    """One warpgroup's 64 rows (``half`` 0 or 1 of the 128-row block): scores of the next tile
    issued before this tile's exponentials, as in ``_gluon_loop``; tiles from the loader's
    ``ready`` barriers, each released on ``empty`` once this warpgroup's ``p @ v`` of it is
    done. No barrier with the other warpgroup: the two drift apart, so one's exponentials can
    run while the other's dots do."""
    S_L: gl.constexpr = WG_S_L
    O_L: gl.constexpr = WG_O_L
    P_L: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_L, k_width=2)
    HALF: gl.constexpr = BLOCK_M // 2
    q_h, m_i, l_i, zero_s = _wg_start(q_s, half, HALF, BLOCK_N)
    acc_tok = warpgroup_mma_init(gl.full([HALF, D], 0.0, gl.float32, layout=O_L))
    mbarrier.wait(ready.index(0), 0)
    s_tok = warpgroup_mma(q_h, k_s.index(0).permute((1, 0)), zero_s, is_async=True)
    b_s = warpgroup_mma_wait(0, deps=[s_tok])
    for j in range(0, N):
        jn = gl.minimum(j + 1, N - 1)  # past the last tile: its own scores again (a dummy)
        mbarrier.wait(ready.index(jn % STAGES), (jn // STAGES) & 1)
        s_next = warpgroup_mma(q_h, k_s.index(jn % STAGES).permute((1, 0)), zero_s,
                               is_async=True)
        m_i, alpha, b_p = _weights(m_i, b_s, qk_scale)
        l_i = l_i * alpha + gl.sum(b_p, 1)
        acc = warpgroup_mma_wait(1, deps=[acc_tok])
        # Tile j - 1's p @ v is done: its slot is free as far as this warpgroup goes.
        mbarrier.arrive(empty.index((j + STAGES - 1) % STAGES), pred=j > 0)
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, O_L))[:, None]
        p = gl.convert_layout(b_p.to(k_s.dtype), P_L)
        acc_tok = warpgroup_mma(p, v_s.index(j % STAGES), acc, is_async=True)
        b_s = warpgroup_mma_wait(1, deps=[s_next])
    acc = warpgroup_mma_wait(0, deps=[acc_tok])
    _store_state(m_i, l_i, acc, m_ptr, l_ptr, acc_ptr, pid.to(gl.int64) * BLOCK_M + half * HALF,
                 HALF, D, S_L, O_L)


@gluon.jit
def _ws_consumer2(q_s, k_s, v_s, ready, empty, turn, m_ptr, l_ptr, acc_ptr, N, qk_scale, pid,
                  half, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, D: gl.constexpr,
                  STAGES: gl.constexpr, PINGPONG: gl.constexpr):
    """``_ws_consumer`` in FA3's order: each step issues the next tile's scores and this tile's
    ``p @ v`` together, then computes the next tile's weights while both run, and rescales
    ``acc`` once ``p @ v`` is done (per row the same operations in the same order). With
    ``PINGPONG`` the two warpgroups take turns issuing their dots (mbarriers ``turn``), so one's
    exponentials run while the other's dots do."""
    S_L: gl.constexpr = WG_S_L
    O_L: gl.constexpr = WG_O_L
    P_L: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_L, k_width=2)
    HALF: gl.constexpr = BLOCK_M // 2
    q_h, m_i, l_i, zero_s = _wg_start(q_s, half, HALF, BLOCK_N)
    acc = gl.full([HALF, D], 0.0, gl.float32, layout=O_L)
    mbarrier.wait(ready.index(0), 0)
    s_tok = warpgroup_mma(q_h, k_s.index(0).permute((1, 0)), zero_s, is_async=True)
    b_s = warpgroup_mma_wait(0, deps=[s_tok])
    # Tile 0's weights and the rescale before its p @ v.
    m_i, alpha, b_p = _weights(m_i, b_s, qk_scale)
    l_i = l_i * alpha + gl.sum(b_p, 1)
    acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, O_L))[:, None]
    for j in range(0, N):
        jn = gl.minimum(j + 1, N - 1)  # past the last tile: its own scores again (a dummy)
        mbarrier.wait(ready.index(jn % STAGES), (jn // STAGES) & 1)
        if PINGPONG:
            mbarrier.wait(turn.index(half), (j & 1) ^ (1 - half))
        s_tok = warpgroup_mma(q_h, k_s.index(jn % STAGES).permute((1, 0)), zero_s,
                              is_async=True)
        p = gl.convert_layout(b_p.to(k_s.dtype), P_L)
        acc_tok = warpgroup_mma(p, v_s.index(j % STAGES), acc, is_async=True)
        if PINGPONG:
            mbarrier.arrive(turn.index(1 - half))
        b_s = warpgroup_mma_wait(1, deps=[s_tok])
        # Tile j + 1's weights while this tile's p @ v runs (a dummy after the last tile:
        # computed, never used).
        m_new, alpha, b_p_n = _weights(m_i, b_s, qk_scale)
        acc = warpgroup_mma_wait(0, deps=[acc_tok])
        mbarrier.arrive(empty.index(j % STAGES))
        last = j + 1 >= N
        m_i = gl.where(last, m_i, m_new)
        l_i = gl.where(last, l_i, l_i * alpha + gl.sum(b_p_n, 1))
        if j + 1 < N:
            acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, O_L))[:, None]
        b_p = b_p_n
    _store_state(m_i, l_i, acc, m_ptr, l_ptr, acc_ptr, pid.to(gl.int64) * BLOCK_M + half * HALF,
                 HALF, D, S_L, O_L)


@gluon.jit
def _ws_loader(k_desc, v_desc, k_s, v_s, ready, empty, N, table_ptr, head,
               BLOCK_N: gl.constexpr, D: gl.constexpr, STAGES: gl.constexpr,
               PAGED: gl.constexpr):
    """One warp: each tile's K and V by TMA into slot ``t % STAGES`` once both warpgroups have
    released the tile that used it (``empty``, two arrivals). From ``[sets * tokens, D]``
    (sequence ``head``), or with ``PAGED`` through a block table of 16-token pages: four TMA
    boxes of 16 rows per K and V tile, from a cache laid out ``[pages * 16, heads * D]`` (the
    package's ``[P, PS, Hkv, D]`` seen as 2-D), each into its 16-row slice of the slot."""
    for t in range(0, N):
        s = t % STAGES
        mbarrier.wait(empty.index(s), ((t // STAGES) & 1) ^ 1, pred=t >= STAGES)
        mbarrier.expect(ready.index(s), 2 * BLOCK_N * D * 2)
        if PAGED:
            for i in gl.static_range(BLOCK_N // 16):
                page = gl.load(table_ptr + t * (BLOCK_N // 16) + i)
                tma.async_copy_global_to_shared(k_desc, [page * 16, head * D], ready.index(s),
                                                k_s.index(s).slice(i * 16, 16))
                tma.async_copy_global_to_shared(v_desc, [page * 16, head * D], ready.index(s),
                                                v_s.index(s).slice(i * 16, 16))
        else:
            row = (head * N + t) * BLOCK_N
            tma.async_copy_global_to_shared(k_desc, [row, 0], ready.index(s), k_s.index(s))
            tma.async_copy_global_to_shared(v_desc, [row, 0], ready.index(s), v_s.index(s))


@gluon.jit
def _gluon_ws_loop(q_ptr, k_desc, v_desc, m_ptr, l_ptr, acc_ptr, N, qk_scale,
                   BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, D: gl.constexpr, table_ptr,
                   PAGED: gl.constexpr, FA3_ORDER: gl.constexpr, PINGPONG: gl.constexpr):
    """``_gluon_loop`` warp-specialised: two consumer warpgroups (64 rows each: the default
    partition and a worker; ``_ws_consumer``, or ``_ws_consumer2`` with ``FA3_ORDER``) and a
    loader warp (TMA), synchronised by mbarriers only."""
    LD_L: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[4, 8],
                                          warps_per_cta=[4, 1], order=[1, 0])
    STAGES: gl.constexpr = 4
    pid = gl.program_id(0)
    q_s, k_s, v_s = _q_and_slots(q_ptr, pid, BLOCK_M, BLOCK_N, D, STAGES, LD_L)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)
    mbarrier.init(turn.index(0), count=1)
    mbarrier.init(turn.index(1), count=1)
    fence_async_shared()
    head = pid % KV_SETS
    if FA3_ORDER:
        gl.warp_specialize([
            (_ws_consumer2, (q_s, k_s, v_s, ready, empty, turn, m_ptr, l_ptr, acc_ptr, N,
                             qk_scale, pid, 0, BLOCK_M, BLOCK_N, D, STAGES, PINGPONG)),
            (_ws_consumer2, (q_s, k_s, v_s, ready, empty, turn, m_ptr, l_ptr, acc_ptr, N,
                             qk_scale, pid, 1, BLOCK_M, BLOCK_N, D, STAGES, PINGPONG)),
            (_ws_loader, (k_desc, v_desc, k_s, v_s, ready, empty, N, table_ptr, head, BLOCK_N,
                          D, STAGES, PAGED))], [4, 1], [232, 40])
    else:
        gl.warp_specialize([
            (_ws_consumer, (q_s, k_s, v_s, ready, empty, m_ptr, l_ptr, acc_ptr, N, qk_scale, pid,
                            0, BLOCK_M, BLOCK_N, D, STAGES)),
            (_ws_consumer, (q_s, k_s, v_s, ready, empty, m_ptr, l_ptr, acc_ptr, N, qk_scale, pid,
                            1, BLOCK_M, BLOCK_N, D, STAGES)),
            (_ws_loader, (k_desc, v_desc, k_s, v_s, ready, empty, N, table_ptr, head, BLOCK_N,
                          D, STAGES, PAGED))], [4, 1], [232, 40])


def _descs(k, v, rows=BLOCK_N):
    layout = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    return (TensorDescriptor.from_tensor(k.view(k.shape[0] * k.shape[1], -1), [rows, D], layout),
            TensorDescriptor.from_tensor(v.view(v.shape[0] * v.shape[1], -1), [rows, D], layout))


def _paged(k, v, seed=13):
    """(k, v) as a cache of 16-token pages in shuffled order, ``[pages, 16, KV_SETS * D]`` (set
    ``s`` is head ``s``), and the block table that reads them back in order."""
    sets, tokens, _ = k.shape
    pages = tokens // 16
    perm = torch.randperm(pages, generator=torch.Generator().manual_seed(seed))
    table = torch.empty(pages, dtype=torch.int32)
    table[torch.arange(pages)] = perm.to(torch.int32)  # logical page i lives at perm[i]
    def cache(x):
        c = torch.empty(pages, 16, sets, D, dtype=x.dtype, device=x.device)
        c[perm.to(x.device)] = x.view(sets, pages, 16, D).permute(1, 2, 0, 3)
        return c.view(pages, 16, sets * D)
    return cache(k), cache(v), table.to(k.device)


def _inputs(programs: int, tiles: int, device: str, dtype: torch.dtype = torch.bfloat16):
    g = torch.Generator(device="cpu").manual_seed(12)
    q = torch.randn(programs, BLOCK_M, D, generator=g).to(device, dtype)
    sets = min(programs, KV_SETS.value)
    k = torch.randn(sets, tiles * BLOCK_N, D, generator=g).to(device, dtype)
    v = torch.randn(sets, tiles * BLOCK_N, D, generator=g).to(device, dtype)
    # NaN-filled: a version that leaves a value unwritten differs from the reference there.
    out = (torch.full((programs, BLOCK_M), float("nan"), device=device),
           torch.full((programs, BLOCK_M), float("nan"), device=device),
           torch.full((programs, BLOCK_M, D), float("nan"), device=device))
    return q, k, v, out


def _run(name, q, k, v, out, tiles):
    """Launch version ``name`` on (q, k, v) into ``out``."""
    scale = 0.125 * 1.4426950408889634
    grid = (q.shape[0],)
    if name == "triton":
        _triton_loop[grid](q, k, v, *out, tiles, scale, BLOCK_M, BLOCK_N, D, num_warps=8,
                           num_stages=3)
        return
    if name == "gluon":
        _gluon_loop[grid](q, k, v, *out, tiles, scale, BLOCK_M, BLOCK_N, D, num_warps=8)
        return
    paged = "paged" in name or name == "package"
    # Descriptors (and the paged cache) are built once per (k, v), outside the timed launches.
    key = (k.data_ptr(), v.data_ptr(), paged)
    if key not in _DESCS:
        if paged:
            kc, vc, table = _paged(k, v)
            _DESCS[key] = (*_descs(kc, vc, 16), table, kc, vc)
        else:
            _DESCS[key] = (*_descs(k, v), None)
    k_desc, v_desc, table = _DESCS[key][:3]
    if name == "package":
        kc, vc = _DESCS[key][3:]
        _package_loop[grid](q, kc, vc, *out, tiles, scale, table, kc.shape[0], BLOCK_M, BLOCK_N,
                            D, kc.shape[2] // D, num_warps=8, num_stages=3)
        return
    _gluon_ws_loop[grid](q, k_desc, v_desc, *out, tiles, scale, BLOCK_M, BLOCK_N, D, table,
                         paged, "ws2" in name, name.endswith("-pp"), num_warps=4)


_DESCS: dict = {}


VERSIONS = ("triton", "package", "gluon", "gluon-ws", "gluon-ws-paged", "gluon-ws2-paged",
            "gluon-ws2-paged-pp")


def _time(row: dict, q, k, v, out, tiles: int, launches: int = 10, repeats: int = 5) -> None:
    """Into ``row``: per version, the GPU time of one launch (us): ``launches`` back-to-back
    launches between two CUDA events (the host stays ahead, so its launch cost is not counted
    past the first), ``repeats`` times, the versions interleaved, the median; and TFLOP/s."""
    names = [n for n in VERSIONS if not isinstance(row["differing"].get(n, {}), str)]
    for name in names:
        _run(name, q, k, v, out, tiles)  # warm-up
    times: dict[str, list[float]] = {n: [] for n in names}
    for _ in range(repeats):
        for name in names:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            a.record()
            for _ in range(launches):
                _run(name, q, k, v, out, tiles)
            b.record()
            torch.cuda.synchronize()
            times[name].append(a.elapsed_time(b) * 1000 / launches)
    flops = 4 * row["programs"] * BLOCK_M * tiles * BLOCK_N * D
    for name in names:
        row[f"us_{name}"] = round(sorted(times[name])[repeats // 2], 1)
        row[f"tflops_{name}"] = round(flops / row[f"us_{name}"] / 1e6, 1)


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1].startswith("-"):
        sys.exit(f"usage: gluon_probe.py OUT_DIR [--compile-only]; got {sys.argv[1:]}")
    out_dir = sys.argv[1]
    if "--compile-only" in sys.argv:
        sys.path.insert(0, os.path.dirname(__file__))
        from kernel_stats import _dot_waits, _ptxas_stats, compile_sm90
        q, k, v, out = _inputs(2, 4, "cpu")
        scale = 0.125 * 1.4426950408889634
        for name, fn, kw in (("triton", _triton_loop, dict(num_warps=8, num_stages=3)),
                             ("gluon", _gluon_loop, dict(num_warps=8)),
                             *((n, _gluon_ws_loop, dict(num_warps=4)) for n in VERSIONS[3:])):
            kv: tuple = (k, v)
            if fn is _gluon_ws_loop:
                paged = "paged" in name
                kc, vc, table = _paged(k, v) if paged else (k, v, None)
                kv = _descs(kc, vc, 16 if paged else BLOCK_N)
                kw = dict(kw, table_ptr=table, PAGED=paged, FA3_ORDER="ws2" in name,
                          PINGPONG=name.endswith("-pp"))
            c = compile_sm90(fn, q, *kv, *out, 4, scale, BLOCK_M, BLOCK_N, D, **kw)
            print(name, _ptxas_stats(c.asm["ptx"]), c.metadata.shared, flush=True)
            print("  ", _dot_waits(c.asm["ttgir"]), flush=True)
            if name == "triton":  # the package's loop, on the paged cache
                kc, vc, table = _paged(k, v)
                c = compile_sm90(_package_loop, q, kc, vc, *out, 4, scale, table, kc.shape[0],
                                 BLOCK_M, BLOCK_N, D, kc.shape[2] // D, num_warps=8,
                                 num_stages=3)
                print("package", _ptxas_stats(c.asm["ptx"]), c.metadata.shared, flush=True)
                print("  ", _dot_waits(c.asm["ttgir"]), flush=True)
        return
    rows = []
    for dtype in (torch.bfloat16, torch.float16):
        for programs, tiles in ((132, 64), (264, 64), (1056, 16), (1056, 64)):
            if dtype == torch.float16 and (programs, tiles) != (1056, 64):
                continue  # fp16: bits on one grid, no times
            _DESCS.clear()
            q, k, v, ref = _inputs(programs, tiles, "cuda", dtype)
            _run("triton", q, k, v, ref, tiles)
            row: dict = dict(dtype=str(dtype).removeprefix("torch."), programs=programs,
                             tiles=tiles, differing={})
            for name in VERSIONS[1:]:
                got = _inputs(programs, tiles, "cuda", dtype)[3]
                try:
                    _run(name, q, k, v, got, tiles)
                    torch.cuda.synchronize()
                    row["differing"][name] = {
                        n: int((a.view(torch.int32) != b.view(torch.int32)).sum())
                        for n, a, b in zip(("m", "l", "acc"), ref, got, strict=True)}
                except Exception as exc:  # a probe: record and go on
                    row["differing"][name] = f"{type(exc).__name__}: {str(exc)[:300]}"
            if dtype == torch.bfloat16:
                _time(row, q, k, v, ref, tiles)
            rows.append(row)
            print(json.dumps(row), flush=True)
    with open(os.path.join(out_dir, "gluon.jsonl"), "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
