# mypy: disable-error-code="no-untyped-def"
"""The fused plan's prefill tile in Gluon (Hopper): warp-specialised, FA3-ordered, same bits.

Written for Triton 3.6's Gluon (``kernels._gluon.available`` gates the import: Gluon is
experimental and its API moves between releases). One program per (query-block slot, KV head),
as the Triton fused kernel with its nested loop (``_unified_attention_fused_kernel``,
``IS_NESTED``), 128 rows on two consumer warpgroups of 64 rows each plus one loader warp:

- the loader warp brings each KV tile's K and V by TMA through the block table (one box per
  page, or one box of the tile inside a larger page) into a ring of ``STAGES`` slots, handed
  over by mbarriers (``ready``: the TMA bytes arrived; ``empty``: both warpgroups are done with
  the slot);
- each consumer warpgroup issues the next tile's score ``wgmma`` together with this tile's
  ``p @ v`` (FA3's issue order), waits for the scores, then computes the next tile's
  online-softmax weights. In the SASS (Triton 3.6's ptxas) the ``p @ v`` wait lands ahead of
  those exponentials, so they can overlap only the other warpgroup's tensor-core work, not this
  one's ``p @ v``; builds that keep them ahead of the wait (same bits) were 5-14% slower
  (reports/h100-round18/README.md). Triton 3.6's own pipeline waits for every score ``wgmma``
  at once (reports/h100-round12/cpu/dot-waits.md).

Bits: per row the same operations in the same order as the Triton kernel (ARCHITECTURE.md,
"Numerics contract"; kernels/README.md, "The Gluon prefill tile"): the same tiles at absolute
positions, a fresh state per split, raw scores masked by ``key <= pos`` on tiles some row does
not fully see, the package's own ``_tile_weights`` and ``_tile_sum`` (``fma(l, alpha,
sum(p))``), ``acc * alpha`` then ``p @ v`` on the same ``wgmma`` shapes (m64n64k16 scores,
m64n128k16 ``p @ v``, fp32 accumulators), the splits folded by the package's own
``state_fold`` after each split and normalised by ``state_normalize``. The Triton jit
functions are compiled as Gluon (``gluon.jit(fn.fn)``), so the arithmetic is one source. V rows
at or past a request's ``kv_len`` are zeroed in shared memory before ``p @ v`` (the Triton
kernels' masked loads give 0 there; TMA copies whatever the page holds, NaN included).
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from kernels._triton.attention_kernels import (
    _block_pos_bounds,
    _block_row_ids,
    _block_scalars,
    _load_q_cols,
    _program_slot,
    _store_rows,
    _tile_sum,
    _tile_weights,
)
from kernels._triton.merge_kernels import state_fold, state_normalize

# The package's jit functions, compiled as Gluon: one source for the arithmetic.
_block_scalars_g = gluon.jit(_block_scalars.fn)
_block_row_ids_g = gluon.jit(_block_row_ids.fn)
_block_pos_bounds_g = gluon.jit(_block_pos_bounds.fn)
_weights = gluon.jit(_tile_weights.fn)
_sum = gluon.jit(_tile_sum.fn)
_program_slot_g = gluon.jit(_program_slot.fn)
_fold = gluon.jit(state_fold.fn)
_normalize = gluon.jit(state_normalize.fn)
_load_q_cols_g = gluon.jit(_load_q_cols.fn)
_store_rows_g = gluon.jit(_store_rows.fn)

#: One consumer warpgroup's layouts (64 rows on 4 warps), as Triton 3.6 lays out each
#: warpgroup's half of the 128-row tile: scores and p on m64n64 ``wgmma``, acc on m64n128.
WG_S_L: gl.constexpr = gl.constexpr(gl.NVMMADistributedLayout(
    version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 64, 16]))
WG_O_L: gl.constexpr = gl.constexpr(gl.NVMMADistributedLayout(
    version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 128, 16]))
#: 128-byte swizzled shared memory for q, K and V (what Triton gives them, and TMA's boxes).
SMEM_L: gl.constexpr = gl.constexpr(gl.NVMMASharedLayout(
    swizzle_byte_width=128, element_bitwidth=16, rank=2))


@gluon.jit
def _zero_v_tail(v_slot, valid, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr):
    """Rows ``>= valid`` of a V slot ``[BLOCK_N, HEAD_DIM]`` set to +0, 16 rows at a time (only
    the chunks that hold such rows are rewritten), then fenced for the tensor cores and a
    barrier of this warpgroup. Both warpgroups do it on the same slot, and one's stores may meet
    the other's ``p @ v`` reading the slot: they store the bytes the slot already holds (its
    valid rows) or the same zeros, so any order reads the same values."""
    L16: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[2, 16],
                                         warps_per_cta=[4, 1], order=[1, 0])
    for i in gl.static_range(BLOCK_N // 16):
        if (i + 1) * 16 > valid:
            part = v_slot.slice(i * 16, 16)
            v = part.load(L16)
            o_n = i * 16 + gl.arange(0, 16, layout=gl.SliceLayout(1, L16))
            part.store(gl.where((o_n < valid)[:, None], v, gl.zeros_like(v)))
    fence_async_shared()
    gl.thread_barrier()


@gluon.jit
def _turn_wait(half):
    """Wait for this warpgroup's turn: ``bar.sync`` on its named barrier (8 + half) of both
    consumer warpgroups' 256 threads (this one's 128 wait, the other's 128 arrive)."""
    if half == 0:
        gl.inline_asm_elementwise("bar.sync 8, 256; mov.u32 $0, 0;", "=r", [], dtype=gl.int32,
                                  is_pure=False, pack=1)
    else:
        gl.inline_asm_elementwise("bar.sync 9, 256; mov.u32 $0, 0;", "=r", [], dtype=gl.int32,
                                  is_pure=False, pack=1)


@gluon.jit
def _turn_pass(half):
    """Give the other warpgroup its turn: ``bar.arrive`` on its named barrier (9 - half)."""
    if half == 0:
        gl.inline_asm_elementwise("bar.arrive 9, 256; mov.u32 $0, 0;", "=r", [], dtype=gl.int32,
                                  is_pure=False, pack=1)
    else:
        gl.inline_asm_elementwise("bar.arrive 8, 256; mov.u32 $0, 0;", "=r", [], dtype=gl.int32,
                                  is_pure=False, pack=1)


@gluon.jit
def _masked(b_s, t, pos, BLOCK_N: gl.constexpr, S_L: gl.constexpr):
    """Raw scores of tile ``t`` with ``-inf`` where a row does not see the key (``key > pos``),
    as ``_tile_scores``' masked path."""
    o_n = t * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, S_L))
    return gl.where(o_n[None, :] <= pos[:, None], b_s, float("-inf"))


@gluon.jit
def _consumer(q_s, k_s, v_s, ready, empty, out_ptr, lse_ptr, ws_ptr, half, i_qblk, q_start, q_len,
              kv_len, T, Hq, i_kvh, n_tiles, j_mid, split_tiles, qk_scale,
              G: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
              BLOCK_Q: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
              PINGPONG: gl.constexpr, FOLDLESS: gl.constexpr, Q_REGS: gl.constexpr,
              KEEP_P: gl.constexpr, FOLD_GLOBAL: gl.constexpr, FOLD_PREFETCH: gl.constexpr,
              SERIAL: gl.constexpr):
    """One warpgroup: rows ``[half * 64, half * 64 + 64)`` of the block, every tile
    ``0 .. n_tiles - 1`` in order, a fresh state per split folded after it, then the store."""
    # Round 19's 128-key experiment: the score layout follows BLOCK_N (WG_S_L at 64).
    S_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, BLOCK_N, 16])
    O_L: gl.constexpr = WG_O_L
    P_L: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_L, k_width=2)
    ROW_S: gl.constexpr = gl.SliceLayout(1, S_L)
    ROW_O: gl.constexpr = gl.SliceLayout(1, O_L)
    HALF: gl.constexpr = BLOCK_M // 2
    o_m = half * HALF + gl.arange(0, HALF, layout=ROW_S)
    _, _, _, pos = _block_row_ids_g(o_m, i_qblk, q_start, q_len, kv_len, T, G, BLOCK_Q)
    q_h = q_s.slice(half * HALF, HALF)
    if Q_REGS:  # noqa: SIM108 (a constexpr branch: the load exists only with Q_REGS)
        q_op = q_h.load(gl.DotOperandLayout(operand_index=0, parent=S_L, k_width=2))
    else:
        q_op = q_h
    zero_s = gl.full([HALF, BLOCK_N], 0.0, gl.float32, layout=S_L)
    zero_o = gl.full([HALF, HEAD_DIM], 0.0, gl.float32, layout=O_L)
    # The running fold of finished splits (rows in acc's layout) and the current split's state.
    f_m = gl.full([HALF], float("-inf"), gl.float32, layout=ROW_O)
    f_l = gl.full([HALF], 0.0, gl.float32, layout=ROW_O)
    f_acc = zero_o
    m_i = gl.full([HALF], float("-inf"), gl.float32, layout=ROW_S)
    l_i = gl.full([HALF], 0.0, gl.float32, layout=ROW_S)
    acc = zero_o
    if FOLD_GLOBAL:
        # Round 19's experiment: this warpgroup's running fold acc in a global workspace
        # (one [64, D] fp32 block per program and warpgroup), read and written at split ends.
        o_wr = gl.arange(0, HALF, layout=ROW_O)
        o_wd = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, O_L))
        ws = ws_ptr + ((gl.program_id(0) * gl.num_programs(1) + gl.program_id(1)) * 2
                       + half).to(gl.int64) * (HALF * HEAD_DIM)
        ws_offs = o_wr[:, None] * HEAD_DIM + o_wd[None, :]
    if n_tiles > 0:
        # Tile 0's scores and weights, and the rescale before its p @ v.
        mbarrier.wait(ready.index(0), 0)
        s_tok = warpgroup_mma(q_op, k_s.index(0).permute((1, 0)), zero_s, is_async=True)
        b_s = warpgroup_mma_wait(0, deps=[s_tok])
        if j_mid <= 0:
            b_s = _masked(b_s, 0, pos, BLOCK_N, S_L)
        m_i, alpha, b_p = _weights(m_i, b_s, qk_scale)
        l_i = _sum(l_i, alpha, b_p)
        acc = acc * gl.convert_layout(alpha, ROW_O)[:, None]
        if KEEP_P:
            p_c = gl.convert_layout(b_p.to(k_s.dtype), P_L)
        if SERIAL:
            # Round 19's experiment: this tile's p @ v, then the next tile's scores, one at a
            # time (no scores in flight beside p @ v: fewer live registers), KEEP_P required.
            for j in range(0, n_tiles):
                if (j + 1 == n_tiles) & (kv_len - j * BLOCK_N < BLOCK_N):
                    _zero_v_tail(v_s.index(j % STAGES), kv_len - j * BLOCK_N, BLOCK_N, HEAD_DIM)
                acc_tok = warpgroup_mma(p_c, v_s.index(j % STAGES), acc, is_async=True)
                acc = warpgroup_mma_wait(0, deps=[acc_tok])
                mbarrier.arrive(empty.index(j % STAGES))
                new_split = (j + 1) % split_tiles == 0
                if new_split | (j + 1 == n_tiles):
                    f_m, f_l, f_acc = _fold(f_m, f_l, f_acc, gl.convert_layout(m_i, ROW_O),
                                            gl.convert_layout(l_i, ROW_O), acc)
                    l_i = gl.full_like(l_i, 0.0)
                    acc = zero_o
                if j + 1 < n_tiles:
                    jn = j + 1
                    mbarrier.wait(ready.index(jn % STAGES), (jn // STAGES) & 1)
                    s_tok = warpgroup_mma(q_op, k_s.index(jn % STAGES).permute((1, 0)), zero_s,
                                          is_async=True)
                    b_s = warpgroup_mma_wait(0, deps=[s_tok])
                    if jn >= j_mid:
                        b_s = _masked(b_s, jn, pos, BLOCK_N, S_L)
                    m_base = gl.where(new_split, gl.full_like(m_i, float("-inf")), m_i)
                    m_i, alpha, b_p_n = _weights(m_base, b_s, qk_scale)
                    l_i = _sum(l_i, alpha, b_p_n)
                    acc = acc * gl.convert_layout(alpha, ROW_O)[:, None]
                    p_c = gl.convert_layout(b_p_n.to(k_s.dtype), P_L)
        else:
            for j in range(0, n_tiles):
                # The next tile's scores (past the last tile: its own again, a dummy never used)
                # and this tile's p @ v, issued together.
                jn = gl.minimum(j + 1, n_tiles - 1)
                if FOLD_PREFETCH:
                    # The running fold read at the top of a split's last step: its latency overlaps
                    # the step's dots and weights (the value lives in registers only there).
                    if (((j + 1) % split_tiles == 0) | (j + 1 == n_tiles)) & (j >= split_tiles):
                        f_pre = gl.load(ws + ws_offs)
                    else:
                        f_pre = zero_o
                mbarrier.wait(ready.index(jn % STAGES), (jn // STAGES) & 1)
                if PINGPONG:  # noqa: SIM102 (a constexpr branch around a runtime one)
                    # Warpgroup 0 goes first; each waits for the other's issue of the previous
                    # step (warpgroup 1 does not pass after its last: the counts stay balanced).
                    if (half == 1) | (j >= 1):
                        _turn_wait(half)
                s_tok = warpgroup_mma(q_op, k_s.index(jn % STAGES).permute((1, 0)), zero_s,
                                      is_async=True)
                if (j + 1 == n_tiles) & (kv_len - j * BLOCK_N < BLOCK_N):
                    _zero_v_tail(v_s.index(j % STAGES), kv_len - j * BLOCK_N, BLOCK_N, HEAD_DIM)
                if KEEP_P:  # noqa: SIM108 (constexpr: p_c exists only with KEEP_P)
                    p = p_c
                else:
                    p = gl.convert_layout(b_p.to(k_s.dtype), P_L)
                acc_tok = warpgroup_mma(p, v_s.index(j % STAGES), acc, is_async=True)
                if PINGPONG:  # noqa: SIM102 (a constexpr branch around a runtime one)
                    if (half == 0) | (j + 1 < n_tiles):
                        _turn_pass(half)
                b_s = warpgroup_mma_wait(1, deps=[s_tok])
                if jn >= j_mid:
                    b_s = _masked(b_s, jn, pos, BLOCK_N, S_L)
                # Tile j + 1's weights while this tile's p @ v runs; a new split starts fresh.
                new_split = (j + 1) % split_tiles == 0
                m_base = gl.where(new_split, gl.full_like(m_i, float("-inf")), m_i)
                m_new, alpha, b_p_n = _weights(m_base, b_s, qk_scale)
                acc = warpgroup_mma_wait(0, deps=[acc_tok])
                mbarrier.arrive(empty.index(j % STAGES))
                if FOLD_GLOBAL:
                    # The next tile's row sum and 16-bit p first (its fp32 weights die), then the
                    # fold with the previous fold read from the workspace (KEEP_P required).
                    ends = new_split | (j + 1 == n_tiles)
                    if j + 1 < n_tiles:
                        l_n = _sum(gl.where(ends, gl.full_like(l_i, 0.0), l_i), alpha, b_p_n)
                        p_c = gl.convert_layout(b_p_n.to(k_s.dtype), P_L)
                    else:
                        l_n = l_i
                    if ends:
                        if FOLD_PREFETCH:
                            f_prev = f_pre
                        elif j >= split_tiles:
                            f_prev = gl.load(ws + ws_offs)
                        else:
                            f_prev = zero_o
                        f_m, f_l, f_new = _fold(f_m, f_l, f_prev, gl.convert_layout(m_i, ROW_O),
                                                gl.convert_layout(l_i, ROW_O), acc)
                        gl.store(ws + ws_offs, f_new)
                        acc = zero_o
                    if j + 1 < n_tiles:
                        m_i = m_new
                        l_i = l_n
                        acc = acc * gl.convert_layout(alpha, ROW_O)[:, None]
                else:
                    if FOLDLESS:
                        pass
                    elif new_split | (j + 1 == n_tiles):
                        # The split ends with tile j: fold it, start a fresh state.
                        f_m, f_l, f_acc = _fold(f_m, f_l, f_acc, gl.convert_layout(m_i, ROW_O),
                                                gl.convert_layout(l_i, ROW_O), acc)
                        l_i = gl.full_like(l_i, 0.0)
                        acc = zero_o
                    if j + 1 < n_tiles:
                        m_i = m_new
                        l_i = _sum(l_i, alpha, b_p_n)
                        acc = acc * gl.convert_layout(alpha, ROW_O)[:, None]
                        if KEEP_P:
                            p_c = gl.convert_layout(b_p_n.to(k_s.dtype), P_L)
                        else:
                            b_p = b_p_n
        if FOLD_GLOBAL:
            f_acc = gl.load(ws + ws_offs)
    if FOLDLESS:
        f_m = gl.convert_layout(m_i, ROW_O)
        f_l = gl.convert_layout(l_i, ROW_O)
        f_acc = acc
    b_o, b_lse = _normalize(f_acc, f_l, f_m)
    o_mo = half * HALF + gl.arange(0, HALF, layout=ROW_O)
    tok, g, m_row, _ = _block_row_ids_g(o_mo, i_qblk, q_start, q_len, kv_len, T, G, BLOCK_Q)
    o_d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, O_L))
    _store_rows_g(out_ptr, lse_ptr, b_o, b_lse, q_start, tok, g, m_row, m_row, i_kvh, Hq, o_d, G,
                  HEAD_DIM)


@gluon.jit
def _loader(k_desc, v_desc, k_s, v_s, ready, empty, n_tiles, p_bt, kv_len, num_pages, i_kvh,
            HEAD_DIM: gl.constexpr, PAGE_SIZE: gl.constexpr, BLOCK_N: gl.constexpr,
            BOX: gl.constexpr, STAGES: gl.constexpr):
    """One warp: tile ``t``'s K and V by TMA into slot ``t % STAGES`` once both warpgroups have
    released that slot's previous tile. ``BOX = min(PAGE_SIZE, BLOCK_N)`` rows per copy, from
    the caches seen as ``[pages * PAGE_SIZE, Hkv * HEAD_DIM]``. Page ids as the Triton kernels
    read them: block-table entries of keys past ``kv_len`` are never read (page 0 instead: its
    V rows are zeroed by the consumers, its K rows masked), ids clamped into the cache."""
    for t in range(0, n_tiles):
        s = t % STAGES
        mbarrier.wait(empty.index(s), ((t // STAGES) & 1) ^ 1, pred=t >= STAGES)
        mbarrier.expect(ready.index(s), 2 * BLOCK_N * HEAD_DIM * k_desc.dtype.primitive_bitwidth
                        // 8)
        for i in gl.static_range(BLOCK_N // BOX):
            key = t * BLOCK_N + i * BOX
            page = gl.load(p_bt + key // PAGE_SIZE, mask=key < kv_len, other=0)
            page = gl.minimum(gl.maximum(page, 0), num_pages - 1)
            row = page * PAGE_SIZE + key % PAGE_SIZE
            tma.async_copy_global_to_shared(k_desc, [row, i_kvh * HEAD_DIM], ready.index(s),
                                            k_s.index(s).slice(i * BOX, BOX))
            tma.async_copy_global_to_shared(v_desc, [row, i_kvh * HEAD_DIM], ready.index(s),
                                            v_s.index(s).slice(i * BOX, BOX))


@gluon.jit(do_not_specialize=["split_tiles", "B", "T", "num_pages", "max_kv_len"])
def _fused_prefill_kernel(
    q_ptr,  # [T, Hq, D]
    k_desc,  # TMA descriptor of k_cache seen as [P * PS, Hkv * D], box [BOX, D]
    v_desc,  # likewise for v_cache
    cu_seqlens_q_ptr,  # [B + 1] int32
    kv_lens_ptr,  # [B] int32
    block_table_ptr,  # [B, max_pages] int32
    slot_order_ptr,  # [num_slots] int32 (IS_SLOT_ORDER only)
    out_ptr,  # [T, Hq, D] contiguous
    lse_ptr,  # [T, Hq] fp32 contiguous
    ws_ptr,  # FOLD_GLOBAL only: [grid0 * Hkv * 2, 64, D] fp32 workspace
    qk_scale,  # sm_scale * log2(e), > 0
    split_tiles,  # KV tiles per split
    B,
    T,
    Hq,
    num_pages,
    max_kv_len,  # KV tokens the block table covers
    stride_qt,
    stride_qh,
    stride_bt,
    G: gl.constexpr,
    HEAD_DIM: gl.constexpr,
    PAGE_SIZE: gl.constexpr,
    BLOCK_M: gl.constexpr,  # 128
    BLOCK_Q: gl.constexpr,
    BLOCK_N: gl.constexpr,  # 64
    BOX: gl.constexpr,  # min(PAGE_SIZE, BLOCK_N)
    IS_SLOT_ORDER: gl.constexpr,
    STAGES: gl.constexpr,  # K/V slots of the ring (each 2 x BLOCK_N x HEAD_DIM elements)
    PINGPONG: gl.constexpr,  # round 19's experiment: the consumers take turns (_turn_wait)
    FOLDLESS: gl.constexpr,  # round 19's experiment: no fold state (one split per row only)
    Q_REGS: gl.constexpr,  # round 19's experiment: q in registers for the score wgmma
    CONSUMER_REGS: gl.constexpr,  # registers per thread of the worker consumer warpgroup
    KEEP_P: gl.constexpr,  # round 19's experiment: p carried between steps as the bf16 operand
    FOLD_GLOBAL: gl.constexpr,  # round 19's experiment: the fold acc in a global workspace
    FOLD_PREFETCH: gl.constexpr,  # with FOLD_GLOBAL: its read issued at the split's last step
    SERIAL: gl.constexpr,  # round 19's experiment: p @ v, then the next scores, one at a time
):
    """The fused plan for 128-row tiles (launch with ``num_warps=4``: the first consumer
    warpgroup; the second and the loader warp are workers). Same slots, rows, tiles, splits
    and stores as ``_unified_attention_fused_kernel`` with ``IS_NESTED``."""
    i_qb = _program_slot_g(slot_order_ptr, IS_SLOT_ORDER)
    i_kvh = gl.program_id(1)
    i_b, q_start, q_len, kv_len, i_qblk = _block_scalars_g(cu_seqlens_q_ptr, kv_lens_ptr, i_qb, B,
                                                           max_kv_len, BLOCK_Q)
    if i_qblk * BLOCK_Q >= q_len:
        return
    min_pos, max_pos = _block_pos_bounds_g(i_qblk, q_len, kv_len, max_kv_len, BLOCK_Q)
    # The block's q rows, gathered into shared memory.
    LD_L: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[4, 8],
                                          warps_per_cta=[4, 1], order=[1, 0])
    o_m = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, LD_L))
    o_d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, LD_L))
    tok, g, m_row, _ = _block_row_ids_g(o_m, i_qblk, q_start, q_len, kv_len, T, G, BLOCK_Q)
    b_q = _load_q_cols_g(q_ptr, q_start, tok, g, m_row, i_kvh, stride_qt, stride_qh, o_d, G)
    q_s = gl.allocate_shared_memory(b_q.dtype, [BLOCK_M, HEAD_DIM], SMEM_L, b_q)
    k_s = gl.allocate_shared_memory(b_q.dtype, [STAGES, BLOCK_N, HEAD_DIM], SMEM_L)
    v_s = gl.allocate_shared_memory(b_q.dtype, [STAGES, BLOCK_N, HEAD_DIM], SMEM_L)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)
    fence_async_shared()
    # Tiles 0 .. n_tiles - 1 (from j_end on, masked for every row: skipped); those before j_mid
    # are seen entirely by every row (unmasked), as in the Triton kernel.
    n_tiles = max_pos // BLOCK_N + 1
    j_mid = (min_pos + 1) // BLOCK_N
    p_bt = block_table_ptr + i_b.to(gl.int64) * stride_bt
    gl.warp_specialize([
        (_consumer, (q_s, k_s, v_s, ready, empty, out_ptr, lse_ptr, ws_ptr, 0, i_qblk, q_start,
                     q_len, kv_len, T, Hq, i_kvh, n_tiles, j_mid, split_tiles, qk_scale, G,
                     HEAD_DIM,
                     BLOCK_M, BLOCK_Q, BLOCK_N, STAGES, PINGPONG, FOLDLESS, Q_REGS,
                     KEEP_P, FOLD_GLOBAL, FOLD_PREFETCH, SERIAL)),
        (_consumer, (q_s, k_s, v_s, ready, empty, out_ptr, lse_ptr, ws_ptr, 1, i_qblk, q_start,
                     q_len, kv_len, T, Hq, i_kvh, n_tiles, j_mid, split_tiles, qk_scale, G,
                     HEAD_DIM,
                     BLOCK_M, BLOCK_Q, BLOCK_N, STAGES, PINGPONG, FOLDLESS, Q_REGS,
                     KEEP_P, FOLD_GLOBAL, FOLD_PREFETCH, SERIAL)),
        (_loader, (k_desc, v_desc, k_s, v_s, ready, empty, n_tiles, p_bt, kv_len, num_pages,
                   i_kvh, HEAD_DIM, PAGE_SIZE, BLOCK_N, BOX, STAGES))], [4, 1], [CONSUMER_REGS, 24])


# ------------------------------------------------------------------------------------------------
# Round 19's experiment: the split plan on the Gluon tile (one program per slot, KV head and
# split, writing the split's raw state as the Triton split kernel does; the merge folds them).
# ------------------------------------------------------------------------------------------------

@gluon.jit
def _split_consumer(q_s, k_s, v_s, ready, empty, ws_o_ptr, ws_ml_ptr, half, i_qblk, q_start,
                    q_len, kv_len, T, Hq, i_kvh, j_lo, n, n_tiles, j_mid, i_split, num_splits,
                    qk_scale, G: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
                    BLOCK_Q: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
    """One warpgroup: tiles ``j_lo .. j_lo + n - 1`` of one split from a fresh state, each
    ``p @ v`` waited before the next scores (``SERIAL``'s order), then the raw state stored
    where ``_unified_attention_split_kernel`` stores it."""
    S_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, BLOCK_N, 16])
    O_L: gl.constexpr = WG_O_L
    P_L: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_L, k_width=2)
    ROW_S: gl.constexpr = gl.SliceLayout(1, S_L)
    ROW_O: gl.constexpr = gl.SliceLayout(1, O_L)
    HALF: gl.constexpr = BLOCK_M // 2
    o_m = half * HALF + gl.arange(0, HALF, layout=ROW_S)
    _, _, _, pos = _block_row_ids_g(o_m, i_qblk, q_start, q_len, kv_len, T, G, BLOCK_Q)
    q_h = q_s.slice(half * HALF, HALF)
    zero_s = gl.full([HALF, BLOCK_N], 0.0, gl.float32, layout=S_L)
    acc = gl.full([HALF, HEAD_DIM], 0.0, gl.float32, layout=O_L)
    m_i = gl.full([HALF], float("-inf"), gl.float32, layout=ROW_S)
    l_i = gl.full([HALF], 0.0, gl.float32, layout=ROW_S)
    mbarrier.wait(ready.index(0), 0)
    s_tok = warpgroup_mma(q_h, k_s.index(0).permute((1, 0)), zero_s, is_async=True)
    b_s = warpgroup_mma_wait(0, deps=[s_tok])
    if j_lo >= j_mid:
        b_s = _masked(b_s, j_lo, pos, BLOCK_N, S_L)
    m_i, alpha, b_p = _weights(m_i, b_s, qk_scale)
    l_i = _sum(l_i, alpha, b_p)
    acc = acc * gl.convert_layout(alpha, ROW_O)[:, None]
    p_c = gl.convert_layout(b_p.to(k_s.dtype), P_L)
    for t in range(0, n):
        j = j_lo + t
        if (j + 1 == n_tiles) & (kv_len - j * BLOCK_N < BLOCK_N):
            _zero_v_tail(v_s.index(t % STAGES), kv_len - j * BLOCK_N, BLOCK_N, HEAD_DIM)
        acc_tok = warpgroup_mma(p_c, v_s.index(t % STAGES), acc, is_async=True)
        acc = warpgroup_mma_wait(0, deps=[acc_tok])
        mbarrier.arrive(empty.index(t % STAGES))
        if t + 1 < n:
            tn = t + 1
            mbarrier.wait(ready.index(tn % STAGES), (tn // STAGES) & 1)
            s_tok = warpgroup_mma(q_h, k_s.index(tn % STAGES).permute((1, 0)), zero_s,
                                  is_async=True)
            b_s = warpgroup_mma_wait(0, deps=[s_tok])
            if j + 1 >= j_mid:
                b_s = _masked(b_s, j + 1, pos, BLOCK_N, S_L)
            m_i, alpha, b_p = _weights(m_i, b_s, qk_scale)
            l_i = _sum(l_i, alpha, b_p)
            acc = acc * gl.convert_layout(alpha, ROW_O)[:, None]
            p_c = gl.convert_layout(b_p.to(k_s.dtype), P_L)
    o_mo = half * HALF + gl.arange(0, HALF, layout=ROW_O)
    tok, g, m_row, _ = _block_row_ids_g(o_mo, i_qblk, q_start, q_len, kv_len, T, G, BLOCK_Q)
    i_ws = ((q_start + tok).to(gl.int64) * Hq + (i_kvh * G + g)) * num_splits + i_split
    o_d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, O_L))
    gl.store(ws_o_ptr + i_ws[:, None] * HEAD_DIM + o_d[None, :], acc, mask=m_row[:, None])
    gl.store(ws_ml_ptr + 2 * i_ws, gl.convert_layout(m_i, ROW_O), mask=m_row)
    gl.store(ws_ml_ptr + 2 * i_ws + 1, gl.convert_layout(l_i, ROW_O), mask=m_row)


@gluon.jit
def _split_loader(k_desc, v_desc, k_s, v_s, ready, empty, j_lo, n, p_bt, kv_len, num_pages,
                  i_kvh, HEAD_DIM: gl.constexpr, PAGE_SIZE: gl.constexpr, BLOCK_N: gl.constexpr,
                  BOX: gl.constexpr, STAGES: gl.constexpr):
    """``_loader`` for tiles ``j_lo .. j_lo + n - 1`` (ring slot ``t % STAGES`` for the t-th)."""
    for t in range(0, n):
        s = t % STAGES
        mbarrier.wait(empty.index(s), ((t // STAGES) & 1) ^ 1, pred=t >= STAGES)
        mbarrier.expect(ready.index(s), 2 * BLOCK_N * HEAD_DIM * k_desc.dtype.primitive_bitwidth
                        // 8)
        for i in gl.static_range(BLOCK_N // BOX):
            key = (j_lo + t) * BLOCK_N + i * BOX
            page = gl.load(p_bt + key // PAGE_SIZE, mask=key < kv_len, other=0)
            page = gl.minimum(gl.maximum(page, 0), num_pages - 1)
            row = page * PAGE_SIZE + key % PAGE_SIZE
            tma.async_copy_global_to_shared(k_desc, [row, i_kvh * HEAD_DIM], ready.index(s),
                                            k_s.index(s).slice(i * BOX, BOX))
            tma.async_copy_global_to_shared(v_desc, [row, i_kvh * HEAD_DIM], ready.index(s),
                                            v_s.index(s).slice(i * BOX, BOX))


@gluon.jit(do_not_specialize=["split_tiles", "B", "T", "num_pages", "max_kv_len", "num_splits"])
def _split_decode_kernel(
    q_ptr, k_desc, v_desc, cu_seqlens_q_ptr, kv_lens_ptr, block_table_ptr,
    ws_o_ptr,  # [T, Hq, num_splits, D] fp32 raw acc
    ws_ml_ptr,  # [T, Hq, num_splits, 2] fp32 (m in log2 units, l)
    qk_scale, split_tiles, B, T, Hq, num_pages, max_kv_len, num_splits,
    stride_qt, stride_qh, stride_bt,
    G: gl.constexpr, HEAD_DIM: gl.constexpr, PAGE_SIZE: gl.constexpr, BLOCK_M: gl.constexpr,
    BLOCK_Q: gl.constexpr, BLOCK_N: gl.constexpr, BOX: gl.constexpr, STAGES: gl.constexpr,
):
    """Grid (slots, Hkv, splits), ``num_warps=4``: the split plan's phase 1 on the Gluon tile."""
    i_qb = gl.num_programs(0) - 1 - gl.program_id(0)
    i_kvh = gl.program_id(1)
    i_split = gl.program_id(2)
    i_b, q_start, q_len, kv_len, i_qblk = _block_scalars_g(cu_seqlens_q_ptr, kv_lens_ptr, i_qb, B,
                                                           max_kv_len, BLOCK_Q)
    if i_qblk * BLOCK_Q >= q_len:
        return
    min_pos, max_pos = _block_pos_bounds_g(i_qblk, q_len, kv_len, max_kv_len, BLOCK_Q)
    n_tiles = max_pos // BLOCK_N + 1
    j_lo = i_split * split_tiles
    if j_lo >= n_tiles:
        return
    n = gl.minimum(j_lo + split_tiles, n_tiles) - j_lo
    LD_L: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[4, 8],
                                          warps_per_cta=[4, 1], order=[1, 0])
    o_m = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, LD_L))
    o_d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, LD_L))
    tok, g, m_row, _ = _block_row_ids_g(o_m, i_qblk, q_start, q_len, kv_len, T, G, BLOCK_Q)
    b_q = _load_q_cols_g(q_ptr, q_start, tok, g, m_row, i_kvh, stride_qt, stride_qh, o_d, G)
    q_s = gl.allocate_shared_memory(b_q.dtype, [BLOCK_M, HEAD_DIM], SMEM_L, b_q)
    k_s = gl.allocate_shared_memory(b_q.dtype, [STAGES, BLOCK_N, HEAD_DIM], SMEM_L)
    v_s = gl.allocate_shared_memory(b_q.dtype, [STAGES, BLOCK_N, HEAD_DIM], SMEM_L)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)
    fence_async_shared()
    j_mid = (min_pos + 1) // BLOCK_N
    p_bt = block_table_ptr + i_b.to(gl.int64) * stride_bt
    gl.warp_specialize([
        (_split_consumer, (q_s, k_s, v_s, ready, empty, ws_o_ptr, ws_ml_ptr, 0, i_qblk, q_start,
                           q_len, kv_len, T, Hq, i_kvh, j_lo, n, n_tiles, j_mid, i_split,
                           num_splits, qk_scale, G, HEAD_DIM, BLOCK_M, BLOCK_Q, BLOCK_N,
                           STAGES)),
        (_split_consumer, (q_s, k_s, v_s, ready, empty, ws_o_ptr, ws_ml_ptr, 1, i_qblk, q_start,
                           q_len, kv_len, T, Hq, i_kvh, j_lo, n, n_tiles, j_mid, i_split,
                           num_splits, qk_scale, G, HEAD_DIM, BLOCK_M, BLOCK_Q, BLOCK_N,
                           STAGES)),
        (_split_loader, (k_desc, v_desc, k_s, v_s, ready, empty, j_lo, n, p_bt, kv_len,
                         num_pages, i_kvh, HEAD_DIM, PAGE_SIZE, BLOCK_N, BOX, STAGES))],
        [4, 1], [232, 24])
