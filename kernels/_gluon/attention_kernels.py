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
  ``p @ v`` and computes the next tile's online-softmax weights while both run (FA3's order),
  so the exponentials overlap tensor-core work, which Triton 3.6's own pipeline never does
  (reports/h100-round12/cpu/dot-waits.md).

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
#: Two 64-key tiles' scores from one m64n128 ``wgmma`` (``PAIRS``): each score is the same
#: dot product as on m64n64 (columns are computed independently), split into the two tiles.
WG_S2_L: gl.constexpr = gl.constexpr(gl.NVMMADistributedLayout(
    version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 128, 16]))
#: The fold's fp32 acc in shared memory (``PAIRS``): written and read in acc's own layout.
F_SMEM_L: gl.constexpr = gl.constexpr(gl.NVMMASharedLayout(
    swizzle_byte_width=128, element_bitwidth=32, rank=2))
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
def _masked(b_s, t, pos, BLOCK_N: gl.constexpr, L: gl.constexpr):
    """Raw scores of tile ``t`` (``BLOCK_N`` keys, layout ``L``) with ``-inf`` where a row does
    not see the key (``key > pos``), as ``_tile_scores``' masked path."""
    o_n = t * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, L))
    return gl.where(o_n[None, :] <= pos[:, None], b_s, float("-inf"))


@gluon.jit
def _halves(b_s2, HALF: gl.constexpr, BLOCK_N: gl.constexpr):
    """The two tiles' raw scores ``[HALF, BLOCK_N]`` of a pair's ``[HALF, 2 * BLOCK_N]`` (each
    thread already holds both tiles' columns: no data moves)."""
    x = gl.permute(gl.reshape(b_s2, [HALF, 2, BLOCK_N]), (0, 2, 1))
    a, b = gl.split(x)
    return (gl.convert_layout(a, WG_S_L, assert_trivial=True),
            gl.convert_layout(b, WG_S_L, assert_trivial=True))


@gluon.jit
def _consumer(q_s, k_s, v_s, turn, ready, empty, out_ptr, lse_ptr, half, i_qblk, q_start,
              q_len, kv_len, T, Hq, i_kvh, n_tiles, j_mid, split_tiles, qk_scale,
              G: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
              BLOCK_Q: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
              PINGPONG: gl.constexpr):
    """One warpgroup: rows ``[half * 64, half * 64 + 64)`` of the block, every tile
    ``0 .. n_tiles - 1`` in order, a fresh state per split folded after it, then the store.
    ``PINGPONG``: the two warpgroups take turns issuing each iteration's ``wgmma`` pair
    (mbarriers ``turn``), so one's weights run while the other's dots do (FA3's inter-warpgroup
    schedule; the order of issue, not of any row's arithmetic)."""
    S_L: gl.constexpr = WG_S_L
    O_L: gl.constexpr = WG_O_L
    P_L: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_L, k_width=2)
    ROW_S: gl.constexpr = gl.SliceLayout(1, S_L)
    ROW_O: gl.constexpr = gl.SliceLayout(1, O_L)
    HALF: gl.constexpr = BLOCK_M // 2
    o_m = half * HALF + gl.arange(0, HALF, layout=ROW_S)
    _, _, _, pos = _block_row_ids_g(o_m, i_qblk, q_start, q_len, kv_len, T, G, BLOCK_Q)
    q_h = q_s.slice(half * HALF, HALF)
    zero_s = gl.full([HALF, BLOCK_N], 0.0, gl.float32, layout=S_L)
    zero_o = gl.full([HALF, HEAD_DIM], 0.0, gl.float32, layout=O_L)
    # The running fold of finished splits (rows in acc's layout) and the current split's state.
    f_m = gl.full([HALF], float("-inf"), gl.float32, layout=ROW_O)
    f_l = gl.full([HALF], 0.0, gl.float32, layout=ROW_O)
    f_acc = zero_o
    m_i = gl.full([HALF], float("-inf"), gl.float32, layout=ROW_S)
    l_i = gl.full([HALF], 0.0, gl.float32, layout=ROW_S)
    acc = zero_o
    if n_tiles > 0:
        # Tile 0's scores and weights, and the rescale before its p @ v.
        mbarrier.wait(ready.index(0), 0)
        s_tok = warpgroup_mma(q_h, k_s.index(0).permute((1, 0)), zero_s, is_async=True)
        b_s = warpgroup_mma_wait(0, deps=[s_tok])
        if j_mid <= 0:
            b_s = _masked(b_s, 0, pos, BLOCK_N, S_L)
        m_i, alpha, b_p = _weights(m_i, b_s, qk_scale)
        l_i = _sum(l_i, alpha, b_p)
        acc = acc * gl.convert_layout(alpha, ROW_O)[:, None]
        for j in range(0, n_tiles):
            # The next tile's scores (past the last tile: its own again, a dummy never used)
            # and this tile's p @ v, issued together.
            jn = gl.minimum(j + 1, n_tiles - 1)
            mbarrier.wait(ready.index(jn % STAGES), (jn // STAGES) & 1)
            if PINGPONG:
                # Warpgroup 1 waits for 0's j-th issue, 0 for 1's (j - 1)-th.
                mbarrier.wait(turn.index(half), (j + half - 1) & 1, pred=j + half >= 1)
            s_tok = warpgroup_mma(q_h, k_s.index(jn % STAGES).permute((1, 0)), zero_s,
                                  is_async=True)
            if (j + 1 == n_tiles) & (kv_len - j * BLOCK_N < BLOCK_N):
                _zero_v_tail(v_s.index(j % STAGES), kv_len - j * BLOCK_N, BLOCK_N, HEAD_DIM)
            p = gl.convert_layout(b_p.to(k_s.dtype), P_L)
            acc_tok = warpgroup_mma(p, v_s.index(j % STAGES), acc, is_async=True)
            if PINGPONG:
                mbarrier.arrive(turn.index(1 - half))
            b_s = warpgroup_mma_wait(1, deps=[s_tok])
            if jn >= j_mid:
                b_s = _masked(b_s, jn, pos, BLOCK_N, S_L)
            # Tile j + 1's weights while this tile's p @ v runs; a new split starts fresh.
            new_split = (j + 1) % split_tiles == 0
            m_base = gl.where(new_split, gl.full_like(m_i, float("-inf")), m_i)
            m_new, alpha, b_p_n = _weights(m_base, b_s, qk_scale)
            acc = warpgroup_mma_wait(0, deps=[acc_tok])
            mbarrier.arrive(empty.index(j % STAGES))
            if new_split | (j + 1 == n_tiles):
                # The split ends with tile j: fold it, start a fresh state.
                f_m, f_l, f_acc = _fold(f_m, f_l, f_acc, gl.convert_layout(m_i, ROW_O),
                                        gl.convert_layout(l_i, ROW_O), acc)
                l_i = gl.full_like(l_i, 0.0)
                acc = zero_o
            if j + 1 < n_tiles:
                m_i = m_new
                l_i = _sum(l_i, alpha, b_p_n)
                acc = acc * gl.convert_layout(alpha, ROW_O)[:, None]
                b_p = b_p_n
    b_o, b_lse = _normalize(f_acc, f_l, f_m)
    o_mo = half * HALF + gl.arange(0, HALF, layout=ROW_O)
    tok, g, m_row, _ = _block_row_ids_g(o_mo, i_qblk, q_start, q_len, kv_len, T, G, BLOCK_Q)
    o_d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, O_L))
    _store_rows_g(out_ptr, lse_ptr, b_o, b_lse, q_start, tok, g, m_row, m_row, i_kvh, Hq, o_d, G,
                  HEAD_DIM)


@gluon.jit
def _consumer_pairs(q_s, k_s, v_s, f_acc_s, ready, empty, out_ptr, lse_ptr, half, i_qblk, q_start,
                    q_len, kv_len, T, Hq, i_kvh, n_tiles, j_mid, split_tiles, qk_scale,
                    G: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
                    BLOCK_Q: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
    """``_consumer`` on pairs of tiles (``split_tiles`` even): tiles ``2p`` and ``2p + 1``'s
    scores from one m64n128 ``wgmma`` over slot ``p % STAGES``'s 128 keys, then per tile, in
    tile order, the same weights, rescale, ``p @ v`` and denominator as ``_consumer``. Pair
    ``p + 1``'s scores run with tile ``2p``'s ``p @ v``, its weights with tile ``2p + 1``'s.
    A last odd tile runs alone (its pair's second half is never used). The fold of finished
    splits keeps its acc in shared memory (``f_acc_s[half]``, fp32): the registers hold the
    running acc, the next pair's scores and the p operands, as FA3's do."""
    S_L: gl.constexpr = WG_S_L
    S2_L: gl.constexpr = WG_S2_L
    O_L: gl.constexpr = WG_O_L
    P_L: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_L, k_width=2)
    ROW_S: gl.constexpr = gl.SliceLayout(1, S_L)
    ROW_S2: gl.constexpr = gl.SliceLayout(1, S2_L)
    ROW_O: gl.constexpr = gl.SliceLayout(1, O_L)
    HALF: gl.constexpr = BLOCK_M // 2
    BN2: gl.constexpr = 2 * BLOCK_N
    o_m = half * HALF + gl.arange(0, HALF, layout=ROW_S2)
    _, _, _, pos = _block_row_ids_g(o_m, i_qblk, q_start, q_len, kv_len, T, G, BLOCK_Q)
    q_h = q_s.slice(half * HALF, HALF)
    zero_s2 = gl.full([HALF, BN2], 0.0, gl.float32, layout=S2_L)
    zero_o = gl.full([HALF, HEAD_DIM], 0.0, gl.float32, layout=O_L)
    f_m = gl.full([HALF], float("-inf"), gl.float32, layout=ROW_O)
    f_l = gl.full([HALF], 0.0, gl.float32, layout=ROW_O)
    f_acc_h = f_acc_s.index(half)
    f_acc_h.store(zero_o)
    m_i = gl.full([HALF], float("-inf"), gl.float32, layout=ROW_S)
    l_i = gl.full([HALF], 0.0, gl.float32, layout=ROW_S)
    acc = zero_o
    n_pairs = (n_tiles + 1) // 2
    n_full = n_tiles // 2
    if n_tiles > 0:
        # Pair 0's scores and both tiles' weights. Each tile's denominator is updated as soon as
        # its weights exist (it needs no acc), so p waits for its p @ v as 16-bit operands.
        mbarrier.wait(ready.index(0), 0)
        s_tok = warpgroup_mma(q_h, k_s.index(0).permute((1, 0)), zero_s2, use_acc=False,
                              is_async=True)
        b_s2 = warpgroup_mma_wait(0, deps=[s_tok])
        if j_mid <= 1:
            b_s2 = _masked(b_s2, 0, pos, BN2, S2_L)
        s_a, s_b = _halves(b_s2, HALF, BLOCK_N)
        m_a, alpha, b_p = _weights(m_i, s_a, qk_scale)
        l_a = _sum(l_i, alpha, b_p)
        p_a = gl.convert_layout(b_p.to(k_s.dtype), P_L)
        acc = acc * gl.convert_layout(alpha, ROW_O)[:, None]
        m_i, alpha_b, b_p = _weights(m_a, s_b, qk_scale)
        l_i = _sum(l_a, alpha_b, b_p)
        p_b = gl.convert_layout(b_p.to(k_s.dtype), P_L)
        # (m_i, l_i): the state after the pair's second tile; (m_a, l_a): after its first.
        for p in range(0, n_full):
            sl = p % STAGES
            pn = gl.minimum(p + 1, n_pairs - 1)
            mbarrier.wait(ready.index(pn % STAGES), (pn // STAGES) & 1)
            # The next pair's scores (past the last pair: this pair's again, a dummy never
            # used), then tile 2p's p @ v; the next pair's first weights while it runs.
            s_tok = warpgroup_mma(q_h, k_s.index(pn % STAGES).permute((1, 0)), zero_s2,
                                  use_acc=False, is_async=True)
            acc_tok = warpgroup_mma(p_a, v_s.index(2 * sl), acc, is_async=True)
            b_s2 = warpgroup_mma_wait(1, deps=[s_tok])
            if 2 * pn + 1 >= j_mid:
                b_s2 = _masked(b_s2, pn, pos, BN2, S2_L)
            # A new split starts with the next pair: a fresh state.
            new_split = (2 * p + 2) % split_tiles == 0
            m_base = gl.where(new_split, gl.full_like(m_i, float("-inf")), m_i)
            l_base = gl.where(new_split, gl.full_like(l_i, 0.0), l_i)
            s_a, s_b = _halves(b_s2, HALF, BLOCK_N)
            m_a_n, alpha_n, b_p = _weights(m_base, s_a, qk_scale)
            l_a_n = _sum(l_base, alpha_n, b_p)
            p_a_n = gl.convert_layout(b_p.to(k_s.dtype), P_L)
            acc = warpgroup_mma_wait(0, deps=[acc_tok])
            # Tile 2p + 1's rescale and p @ v; the next pair's second weights while it runs.
            acc = acc * gl.convert_layout(alpha_b, ROW_O)[:, None]
            jb = 2 * p + 1
            if (jb + 1 == n_tiles) & (kv_len - jb * BLOCK_N < BLOCK_N):
                _zero_v_tail(v_s.index(2 * sl + 1), kv_len - jb * BLOCK_N, BLOCK_N, HEAD_DIM)
            acc_tok = warpgroup_mma(p_b, v_s.index(2 * sl + 1), acc, is_async=True)
            m_b_n, alpha_b_n, b_p = _weights(m_a_n, s_b, qk_scale)
            l_b_n = _sum(l_a_n, alpha_b_n, b_p)
            p_b_n = gl.convert_layout(b_p.to(k_s.dtype), P_L)
            acc = warpgroup_mma_wait(0, deps=[acc_tok])
            mbarrier.arrive(empty.index(sl))
            if new_split | (2 * p + 2 == n_tiles):
                # The split ends with tile 2p + 1: fold it, start a fresh acc.
                f_m, f_l, f_acc = _fold(f_m, f_l, f_acc_h.load(O_L),
                                        gl.convert_layout(m_i, ROW_O),
                                        gl.convert_layout(l_i, ROW_O), acc)
                f_acc_h.store(f_acc)
                acc = zero_o
            if 2 * p + 2 < n_tiles:
                acc = acc * gl.convert_layout(alpha_n, ROW_O)[:, None]
                m_a = m_a_n
                l_a = l_a_n
                m_i = m_b_n
                l_i = l_b_n
                alpha_b = alpha_b_n
                p_a = p_a_n
                p_b = p_b_n
        if n_tiles % 2 == 1:
            # The last tile alone (its pair's second half unused): its p @ v, then the fold.
            sl = n_full % STAGES
            ja = n_tiles - 1
            if kv_len - ja * BLOCK_N < BLOCK_N:
                _zero_v_tail(v_s.index(2 * sl), kv_len - ja * BLOCK_N, BLOCK_N, HEAD_DIM)
            acc_tok = warpgroup_mma(p_a, v_s.index(2 * sl), acc, is_async=True)
            acc = warpgroup_mma_wait(0, deps=[acc_tok])
            mbarrier.arrive(empty.index(sl))
            f_m, f_l, f_acc = _fold(f_m, f_l, f_acc_h.load(O_L), gl.convert_layout(m_a, ROW_O),
                                    gl.convert_layout(l_a, ROW_O), acc)
            f_acc_h.store(f_acc)
    b_o, b_lse = _normalize(f_acc_h.load(O_L), f_l, f_m)
    o_mo = half * HALF + gl.arange(0, HALF, layout=ROW_O)
    tok, g, m_row, _ = _block_row_ids_g(o_mo, i_qblk, q_start, q_len, kv_len, T, G, BLOCK_Q)
    o_d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, O_L))
    _store_rows_g(out_ptr, lse_ptr, b_o, b_lse, q_start, tok, g, m_row, m_row, i_kvh, Hq, o_d, G,
                  HEAD_DIM)


@gluon.jit
def _loader(k_desc, v_desc, k_s, v_s, ready, empty, n_tiles, p_bt, kv_len, num_pages, i_kvh,
            HEAD_DIM: gl.constexpr, PAGE_SIZE: gl.constexpr, BLOCK_N: gl.constexpr,
            BOX: gl.constexpr, STAGES: gl.constexpr, TILES: gl.constexpr):
    """One warp: slot ``s = t % STAGES`` takes tiles ``TILES * t ..`` (K into ``k_s[s]``, V into
    ``v_s[TILES * s ..]``) by TMA once both warpgroups have released its previous tiles.
    ``BOX = min(PAGE_SIZE, BLOCK_N)`` rows per copy, from the caches seen as
    ``[pages * PAGE_SIZE, Hkv * HEAD_DIM]``. Page ids as the Triton kernels read them:
    block-table entries of keys past ``kv_len`` are never read (page 0 instead: its V rows are
    zeroed by the consumers, its K rows masked or unused), ids clamped into the cache."""
    for t in range(0, (n_tiles + TILES - 1) // TILES):
        s = t % STAGES
        mbarrier.wait(empty.index(s), ((t // STAGES) & 1) ^ 1, pred=t >= STAGES)
        mbarrier.expect(ready.index(s), 2 * TILES * BLOCK_N * HEAD_DIM
                        * k_desc.dtype.primitive_bitwidth // 8)
        for i in gl.static_range(TILES * BLOCK_N // BOX):
            key = t * TILES * BLOCK_N + i * BOX
            page = gl.load(p_bt + key // PAGE_SIZE, mask=key < kv_len, other=0)
            page = gl.minimum(gl.maximum(page, 0), num_pages - 1)
            row = page * PAGE_SIZE + key % PAGE_SIZE
            tma.async_copy_global_to_shared(k_desc, [row, i_kvh * HEAD_DIM], ready.index(s),
                                            k_s.index(s).slice(i * BOX, BOX))
            tma.async_copy_global_to_shared(
                v_desc, [row, i_kvh * HEAD_DIM], ready.index(s),
                v_s.index(s * TILES + i * BOX // BLOCK_N).slice(i * BOX % BLOCK_N, BOX))


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
    STAGES: gl.constexpr,  # K/V slots of the ring (each 2 x TILES x BLOCK_N x HEAD_DIM)
    PAIRS: gl.constexpr,  # two tiles' scores per wgmma (split_tiles even): _consumer_pairs
    PINGPONG: gl.constexpr,  # the warpgroups take turns issuing their wgmmas (_consumer)
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
    TILES: gl.constexpr = 2 if PAIRS else 1
    HALF: gl.constexpr = BLOCK_M // 2
    k_s = gl.allocate_shared_memory(b_q.dtype, [STAGES, TILES * BLOCK_N, HEAD_DIM], SMEM_L)
    v_s = gl.allocate_shared_memory(b_q.dtype, [STAGES * TILES, BLOCK_N, HEAD_DIM], SMEM_L)
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
    # Two consumer warpgroups (rows [0, 64) and [64, 128)) and the loader warp.
    if PAIRS:
        f_acc_s = gl.allocate_shared_memory(gl.float32, [2, HALF, HEAD_DIM], F_SMEM_L)
        gl.warp_specialize([
            (_consumer_pairs, (q_s, k_s, v_s, f_acc_s, ready, empty, out_ptr, lse_ptr, 0, i_qblk,
             q_start, q_len, kv_len, T, Hq, i_kvh, n_tiles, j_mid, split_tiles, qk_scale, G,
             HEAD_DIM, BLOCK_M, BLOCK_Q, BLOCK_N, STAGES)),
            (_consumer_pairs, (q_s, k_s, v_s, f_acc_s, ready, empty, out_ptr, lse_ptr, 1, i_qblk,
             q_start, q_len, kv_len, T, Hq, i_kvh, n_tiles, j_mid, split_tiles, qk_scale, G,
             HEAD_DIM, BLOCK_M, BLOCK_Q, BLOCK_N, STAGES)),
            (_loader, (k_desc, v_desc, k_s, v_s, ready, empty, n_tiles, p_bt, kv_len, num_pages,
                       i_kvh, HEAD_DIM, PAGE_SIZE, BLOCK_N, BOX, STAGES, TILES))],
            [4, 1], [240, 24])
    else:
        turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(2):
            mbarrier.init(turn.index(i), count=1)
        fence_async_shared()
        gl.warp_specialize([
            (_consumer, (q_s, k_s, v_s, turn, ready, empty, out_ptr, lse_ptr, 0, i_qblk,
             q_start, q_len, kv_len, T, Hq, i_kvh, n_tiles, j_mid, split_tiles, qk_scale, G,
             HEAD_DIM, BLOCK_M, BLOCK_Q, BLOCK_N, STAGES, PINGPONG)),
            (_consumer, (q_s, k_s, v_s, turn, ready, empty, out_ptr, lse_ptr, 1, i_qblk,
             q_start, q_len, kv_len, T, Hq, i_kvh, n_tiles, j_mid, split_tiles, qk_scale, G,
             HEAD_DIM, BLOCK_M, BLOCK_Q, BLOCK_N, STAGES, PINGPONG)),
            (_loader, (k_desc, v_desc, k_s, v_s, ready, empty, n_tiles, p_bt, kv_len, num_pages,
                       i_kvh, HEAD_DIM, PAGE_SIZE, BLOCK_N, BOX, STAGES, TILES))],
            [4, 1], [232, 24])
