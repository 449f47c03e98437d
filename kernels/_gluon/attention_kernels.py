# mypy: disable-error-code="no-untyped-def"
"""The Gluon kernels (Hopper): warp-specialised tiles with the Triton kernels' bits.

Written for Triton 3.6's Gluon (``kernels._gluon.available`` gates the import: Gluon is
experimental and its API moves between releases). 128 rows on two consumer warpgroups of 64 rows
each plus one loader warp, in two kernels (a third, for decode, below the list):

- ``_fused_prefill_kernel``: the fused plan, one program per (query-block slot, KV head), as the
  Triton fused kernel with its nested loop (``_unified_attention_fused_kernel``, ``IS_NESTED``):
  every tile of the block in order, a fresh state per split folded after it;
- ``_split_kernel`` (128-key tiles only): the split plan's first phase, one program per
  (slot, KV head x V column block, split), as ``_unified_attention_split_kernel``: the split's
  raw state for the package's merge, or with one split per row the result itself
  (``IS_DIRECT``);
- ``_split_kt_kernel`` (128-key tiles at head dims 64 and 128, 64-key tiles at head dim 256):
  the split plan's first phase for decode blocks of 8-32 rows on one consumer warpgroup, with
  the KV tile on the MMA's M dimension and the row sum in the Triton tile's order
  (``_row_sum_t``; kernels/README.md, "The keys-as-rows decode tile").

In both (and, with its one warpgroup, in the third):

- the loader warp brings each KV tile's K and V by TMA through the block table (one box per
  page, or one box of the tile inside a larger page) into a ring of ``STAGES`` slots, handed
  over by mbarriers (``ready``: the TMA bytes arrived; ``empty``: both warpgroups are done with
  the slot);
- a consumer warpgroup with no row of the block (decode rows fill the first) only releases the
  slots (``_release``);
- at 64 keys (the fused kernel of the 64-key contract) each consumer issues the next tile's
  score ``wgmma`` together with this tile's ``p @ v`` (FA3's issue order), waits for the scores,
  then computes the next tile's online-softmax weights. In the SASS (Triton 3.6's ptxas) the
  ``p @ v`` wait lands ahead of those exponentials, so they can overlap only the other
  warpgroup's tensor-core work; builds that keep them ahead of the wait (same bits) were
  slower;
- at 128 keys the fused kernel runs the serial order (``_serial_rows``: this tile's ``p @ v``
  waited before the next scores are issued): with the fold state, FA3's order spills and was
  slower; the split kernel, which has no fold
  state, runs FA3's order without spilling; the keys-as-rows kernel runs the serial order, or
  FA3's with ``AHEAD`` (``kernels.config.kt_scores_ahead``).

Bits: per row the same operations in the same order as the Triton kernels (ARCHITECTURE.md,
"Numerics contract"; kernels/README.md, "The 128-key contract and the Gluon kernels"):
the same tiles at absolute positions, a fresh state per split, raw scores masked by ``key <=
pos`` on tiles some row does not fully see, the package's own ``_tile_weights`` and
``_tile_sum`` (``fma(l, alpha, sum(p))``), ``acc * alpha`` then ``p @ v`` on the same ``wgmma``
shapes (m64nBLOCK_Nk16 scores, m64nDk16 ``p @ v`` over the program's D V columns: 128, or 64
or 32 with V column blocks, fp32 accumulators), the splits folded by
the package's own ``state_fold`` after each split and normalised by ``state_normalize``. The
issue order moves no bit (it changes when an instruction runs, not what it computes). The Triton
jit functions are compiled as Gluon (``gluon.jit(fn.fn)``), so the arithmetic is one source
(except in ``_kt_rows``, whose transposed tile restates ``_tile_weights``' few operations along
the other axis and rebuilds ``_tile_sum``'s reduction order: the GPU bit tests guard them). V
rows at or past a request's ``kv_len`` are zeroed in shared memory before ``p @ v`` (the Triton
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

from kernels._triton.common import (
    _block_pos_bounds,
    _block_row_ids,
    _block_scalars,
    _ends_split,
    _load_q_cols,
    _program_slot,
    _split_len,
    _split_lo,
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
_split_lo_g = gluon.jit(_split_lo.fn)
_split_len_g = gluon.jit(_split_len.fn)
_ends_split_g = gluon.jit(_ends_split.fn)

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
    """Rows ``>= valid`` of a V slot ``[BLOCK_N, HEAD_DIM]`` (``HEAD_DIM``: the slot's columns,
    32-256) set to +0, 16 rows at a time (only the chunks that hold such rows are rewritten),
    then fenced for the tensor cores and a barrier of this warpgroup. In the two-warpgroup
    kernels both do it on the same slot, and one's stores may meet the other's ``p @ v`` reading
    the slot: they store the bytes the slot already holds (its valid rows) or the same zeros, so
    any order reads the same values."""
    L16: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 8],
                                         threads_per_warp=[256 // HEAD_DIM, HEAD_DIM // 8],
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
def _masked(b_s, t, pos, BLOCK_N: gl.constexpr, S_L: gl.constexpr):
    """Raw scores of tile ``t`` with ``-inf`` where a row does not see the key (``key > pos``),
    as ``_tile_scores``' masked path."""
    o_n = t * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, S_L))
    return gl.where(o_n[None, :] <= pos[:, None], b_s, float("-inf"))


@gluon.jit
def _step_weights(q_h, k_slot, zero_s, m_i, l_i, acc, j, j_mid, pos, qk_scale,
                  BLOCK_N: gl.constexpr, S_L: gl.constexpr, ROW_O: gl.constexpr,
                  P_L: gl.constexpr):
    """The serial order's step up to ``p @ v``: tile ``j``'s scores (waited; masked when some
    row does not see all of it, ``j >= j_mid``), its weights, the row sum, acc's rescale and p as
    the 16-bit ``p @ v`` operand. Returns ``(m, l, acc, p)``."""
    s_tok = warpgroup_mma(q_h, k_slot.permute((1, 0)), zero_s, is_async=True)
    b_s = warpgroup_mma_wait(0, deps=[s_tok])
    if j >= j_mid:
        b_s = _masked(b_s, j, pos, BLOCK_N, S_L)
    m_i, alpha, b_p = _weights(m_i, b_s, qk_scale)
    l_i = _sum(l_i, alpha, b_p)
    acc = acc * gl.convert_layout(alpha, ROW_O)[:, None]
    return m_i, l_i, acc, gl.convert_layout(b_p.to(k_slot.dtype), P_L)


@gluon.jit
def _release(ready, empty, n, STAGES: gl.constexpr):
    """A warpgroup with no row in the block (decode rows fill the first one): each of the ``n``
    tiles' slots released once it has landed, so the loader, which waits for both warpgroups,
    goes on. Its tensor-core and exponential work is skipped, not computed on padding."""
    for t in range(0, n):
        mbarrier.wait(ready.index(t % STAGES), (t // STAGES) & 1)
        mbarrier.arrive(empty.index(t % STAGES))


@gluon.jit
def _idle(half, i_qblk, q_len, G: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_Q: gl.constexpr):
    """Whether warpgroup ``half`` holds no valid row of the block: its first row's token is past
    the block's tokens (rows are token-major, ``_block_row_ids``)."""
    return (half * (BLOCK_M // 2)) // G >= gl.minimum(q_len - i_qblk * BLOCK_Q, BLOCK_Q)


@gluon.jit
def _store_folded(f_acc, f_l, f_m, out_ptr, lse_ptr, half, i_qblk, q_start, q_len, kv_len, T,
                  Hq, i_kvh, G: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
                  BLOCK_Q: gl.constexpr, O_L: gl.constexpr):
    """The fused plan's end for one warpgroup's rows ``[half * 64, half * 64 + 64)``: the fold
    of every split normalised (``state_normalize``) into out and lse."""
    b_o, b_lse = _normalize(f_acc, f_l, f_m)
    HALF: gl.constexpr = BLOCK_M // 2
    o_mo = half * HALF + gl.arange(0, HALF, layout=gl.SliceLayout(1, O_L))
    tok, g, m_row, _ = _block_row_ids_g(o_mo, i_qblk, q_start, q_len, kv_len, T, G, BLOCK_Q)
    o_d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, O_L))
    _store_rows_g(out_ptr, lse_ptr, b_o, b_lse, q_start, tok, g, m_row, m_row, i_kvh, Hq, o_d, G,
                  HEAD_DIM)


@gluon.jit
def _store_split(acc, l_i, m_i, ws_o_ptr, ws_ml_ptr, out_ptr, lse_ptr, q_start, tok, g, m_row,
                 m_ml, o_d, i_kvh, Hq, i_split, num_splits, G: gl.constexpr,
                 HEAD_DIM: gl.constexpr, IS_DIRECT: gl.constexpr):
    """The split kernels' end for rows (tok, g) where ``m_row``, columns ``o_d``: with
    ``IS_DIRECT`` (one split per row) the state normalised into out and lse, else the raw state
    ``(acc, m, l)`` into the workspace at split ``i_split`` (m and l where ``m_ml``), where
    ``_unified_attention_split_kernel`` writes them. ``l_i`` and ``m_i`` in ``acc``'s row
    layout."""
    if IS_DIRECT:
        b_o, b_lse = _normalize(acc, l_i, m_i)
        _store_rows_g(out_ptr, lse_ptr, b_o, b_lse, q_start, tok, g, m_row, m_ml, i_kvh, Hq, o_d,
                      G, HEAD_DIM)
    else:
        i_ws = ((q_start + tok).to(gl.int64) * Hq + (i_kvh * G + g)) * num_splits + i_split
        gl.store(ws_o_ptr + i_ws[:, None] * HEAD_DIM + o_d[None, :], acc, mask=m_row[:, None])
        gl.store(ws_ml_ptr + 2 * i_ws, m_i, mask=m_ml)
        gl.store(ws_ml_ptr + 2 * i_ws + 1, l_i, mask=m_ml)


@gluon.jit
def _serial_rows(q_s, k_s, v_s, ready, empty, out_ptr, lse_ptr, half, i_qblk, q_start, q_len,
                 kv_len, T, Hq, i_kvh, n_tiles, j_mid, split_tiles, lead_tiles, qk_scale,
                 G: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
                 BLOCK_Q: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
    """The 128-key tile's rows of one warpgroup in the serial order: tile j's ``p @ v``
    waited, the split folded at its end, then tile j + 1's scores and weights (with the fold
    state, FA3's order spills at 128 keys: kernels/README.md); then the store."""
    S_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, BLOCK_N, 16])
    O_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, HEAD_DIM, 16])
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
        mbarrier.wait(ready.index(0), 0)
        m_i, l_i, acc, p = _step_weights(q_h, k_s.index(0), zero_s, m_i, l_i, acc, 0, j_mid,
                                         pos, qk_scale, BLOCK_N, S_L, ROW_O, P_L)
        for j in range(0, n_tiles):
            if (j + 1 == n_tiles) & (kv_len - j * BLOCK_N < BLOCK_N):
                _zero_v_tail(v_s.index(j % STAGES), kv_len - j * BLOCK_N, BLOCK_N, HEAD_DIM)
            acc_tok = warpgroup_mma(p, v_s.index(j % STAGES), acc, is_async=True)
            acc = warpgroup_mma_wait(0, deps=[acc_tok])
            mbarrier.arrive(empty.index(j % STAGES))
            new_split = _ends_split_g(j + 1, split_tiles, lead_tiles)
            if new_split | (j + 1 == n_tiles):
                # The split ends with tile j: fold it, start a fresh state.
                f_m, f_l, f_acc = _fold(f_m, f_l, f_acc, gl.convert_layout(m_i, ROW_O),
                                        gl.convert_layout(l_i, ROW_O), acc)
                l_i = gl.full_like(l_i, 0.0)
                acc = zero_o
            if j + 1 < n_tiles:
                jn = j + 1
                mbarrier.wait(ready.index(jn % STAGES), (jn // STAGES) & 1)
                m_base = gl.where(new_split, gl.full_like(m_i, float("-inf")), m_i)
                m_i, l_i, acc, p = _step_weights(q_h, k_s.index(jn % STAGES), zero_s, m_base,
                                                 l_i, acc, jn, j_mid, pos, qk_scale, BLOCK_N,
                                                 S_L, ROW_O, P_L)
    _store_folded(f_acc, f_l, f_m, out_ptr, lse_ptr, half, i_qblk, q_start, q_len, kv_len, T,
                  Hq, i_kvh, G, HEAD_DIM, BLOCK_M, BLOCK_Q, O_L)


@gluon.jit
def _consumer(q_s, k_s, v_s, ready, empty, out_ptr, lse_ptr, half, i_qblk, q_start, q_len,
              kv_len, T, Hq, i_kvh, n_tiles, j_mid, split_tiles, lead_tiles, qk_scale,
              G: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
              BLOCK_Q: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
    """One warpgroup: rows ``[half * 64, half * 64 + 64)`` of the block, every tile
    ``0 .. n_tiles - 1`` in order, a fresh state per split folded after it, then the store.
    64-key tiles in FA3's issue order; 128-key tiles in the serial order (:func:`_serial_rows`),
    skipped by a warpgroup with no row (:func:`_release`)."""
    if BLOCK_N == 128:
        if _idle(half, i_qblk, q_len, G, BLOCK_M, BLOCK_Q):
            _release(ready, empty, n_tiles, STAGES)
        else:
            _serial_rows(q_s, k_s, v_s, ready, empty, out_ptr, lse_ptr, half, i_qblk, q_start,
                         q_len, kv_len, T, Hq, i_kvh, n_tiles, j_mid, split_tiles, lead_tiles,
                         qk_scale, G, HEAD_DIM, BLOCK_M, BLOCK_Q, BLOCK_N, STAGES)
    else:
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
        # The running fold of finished splits (rows in acc's layout) and the current split's
        # state.
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
                s_tok = warpgroup_mma(q_h, k_s.index(jn % STAGES).permute((1, 0)), zero_s,
                                      is_async=True)
                if (j + 1 == n_tiles) & (kv_len - j * BLOCK_N < BLOCK_N):
                    _zero_v_tail(v_s.index(j % STAGES), kv_len - j * BLOCK_N, BLOCK_N, HEAD_DIM)
                p = gl.convert_layout(b_p.to(k_s.dtype), P_L)
                acc_tok = warpgroup_mma(p, v_s.index(j % STAGES), acc, is_async=True)
                b_s = warpgroup_mma_wait(1, deps=[s_tok])
                if jn >= j_mid:
                    b_s = _masked(b_s, jn, pos, BLOCK_N, S_L)
                # Tile j + 1's weights while this tile's p @ v runs; a new split starts fresh.
                new_split = _ends_split_g(j + 1, split_tiles, lead_tiles)
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
        _store_folded(f_acc, f_l, f_m, out_ptr, lse_ptr, half, i_qblk, q_start, q_len, kv_len,
                      T, Hq, i_kvh, G, HEAD_DIM, BLOCK_M, BLOCK_Q, O_L)


@gluon.jit
def _loader(k_desc, v_desc, k_s, v_s, ready, empty, j_lo, n_tiles, p_bt, kv_len, num_pages,
            i_kvh, i_vb, HEAD_DIM: gl.constexpr, PAGE_SIZE: gl.constexpr, BLOCK_N: gl.constexpr,
            BOX: gl.constexpr, STAGES: gl.constexpr, BLOCK_DV: gl.constexpr):
    """One warp: tile ``t``'s K and V by TMA into slot ``t % STAGES`` once both warpgroups have
    released that slot's previous tile. ``BOX = min(PAGE_SIZE, BLOCK_N)`` rows per copy, from
    the caches seen as ``[pages * PAGE_SIZE, Hkv * HEAD_DIM]``; of V, the ``BLOCK_DV`` columns of
    V column block ``i_vb`` (the split kernel's ``VALUE_BLOCKS``). Page ids as the Triton kernels
    read them: block-table entries of keys past ``kv_len`` are never read (page 0 instead: its
    V rows are zeroed by the consumers, its K rows masked), ids clamped into the cache."""
    for t in range(0, n_tiles):
        s = t % STAGES
        mbarrier.wait(empty.index(s), ((t // STAGES) & 1) ^ 1, pred=t >= STAGES)
        mbarrier.expect(ready.index(s), BLOCK_N * (HEAD_DIM + BLOCK_DV)
                        * k_desc.dtype.primitive_bitwidth // 8)
        for i in gl.static_range(BLOCK_N // BOX):
            key = (j_lo + t) * BLOCK_N + i * BOX
            page = gl.load(p_bt + key // PAGE_SIZE, mask=key < kv_len, other=0)
            page = gl.minimum(gl.maximum(page, 0), num_pages - 1)
            row = page * PAGE_SIZE + key % PAGE_SIZE
            tma.async_copy_global_to_shared(k_desc, [row, i_kvh * HEAD_DIM], ready.index(s),
                                            k_s.index(s).slice(i * BOX, BOX))
            tma.async_copy_global_to_shared(v_desc, [row, i_kvh * HEAD_DIM + i_vb * BLOCK_DV],
                                            ready.index(s),
                                            v_s.index(s).slice(i * BOX, BOX))


@gluon.jit(do_not_specialize=["split_tiles", "lead_tiles", "B", "T", "num_pages", "max_kv_len"])
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
    lead_tiles,  # KV tiles per lead split, a divisor of split_tiles (_split_lo)
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
    BLOCK_N: gl.constexpr,  # 64 or 128
    BOX: gl.constexpr,  # min(PAGE_SIZE, BLOCK_N)
    IS_SLOT_ORDER: gl.constexpr,
    STAGES: gl.constexpr,  # K/V slots of the ring (each 2 x BLOCK_N x HEAD_DIM elements)
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
        (_consumer, (q_s, k_s, v_s, ready, empty, out_ptr, lse_ptr, 0, i_qblk, q_start, q_len,
                     kv_len, T, Hq, i_kvh, n_tiles, j_mid, split_tiles, lead_tiles, qk_scale, G,
                     HEAD_DIM, BLOCK_M, BLOCK_Q, BLOCK_N, STAGES)),
        (_consumer, (q_s, k_s, v_s, ready, empty, out_ptr, lse_ptr, 1, i_qblk, q_start, q_len,
                     kv_len, T, Hq, i_kvh, n_tiles, j_mid, split_tiles, lead_tiles, qk_scale, G,
                     HEAD_DIM, BLOCK_M, BLOCK_Q, BLOCK_N, STAGES)),
        (_loader, (k_desc, v_desc, k_s, v_s, ready, empty, 0, n_tiles, p_bt, kv_len, num_pages,
                   i_kvh, 0, HEAD_DIM, PAGE_SIZE, BLOCK_N, BOX, STAGES, HEAD_DIM))], [4, 1],
        [232, 24])


# ------------------------------------------------------------------------------------------------
# The split plan on the Gluon tile (128-key tiles): one program per (slot, KV head x V column
# block, split) writes the split's raw state where ``_unified_attention_split_kernel`` writes it;
# the package's merge folds the splits.
# ------------------------------------------------------------------------------------------------


@gluon.jit
def _split_consumer(q_s, k_s, v_s, ready, empty, ws_o_ptr, ws_ml_ptr, out_ptr, lse_ptr, half,
                    i_qblk, q_start, q_len, kv_len, T, Hq, i_kvh, i_vb, j_lo, n, n_tiles, j_mid,
                    i_split, num_splits, qk_scale, G: gl.constexpr, HEAD_DIM: gl.constexpr,
                    BLOCK_M: gl.constexpr, BLOCK_Q: gl.constexpr, BLOCK_N: gl.constexpr,
                    STAGES: gl.constexpr, IS_DIRECT: gl.constexpr, BLOCK_DV: gl.constexpr):
    """One warpgroup of the split kernel: :func:`_split_rows`, or :func:`_release` where it
    holds no row (decode)."""
    if _idle(half, i_qblk, q_len, G, BLOCK_M, BLOCK_Q):
        _release(ready, empty, n, STAGES)
    else:
        _split_rows(q_s, k_s, v_s, ready, empty, ws_o_ptr, ws_ml_ptr, out_ptr, lse_ptr, half,
                    i_qblk, q_start, q_len, kv_len, T, Hq, i_kvh, i_vb, j_lo, n, n_tiles, j_mid,
                    i_split, num_splits, qk_scale, G, HEAD_DIM, BLOCK_M, BLOCK_Q, BLOCK_N,
                    STAGES, IS_DIRECT, BLOCK_DV)


@gluon.jit
def _split_rows(q_s, k_s, v_s, ready, empty, ws_o_ptr, ws_ml_ptr, out_ptr, lse_ptr, half,
                i_qblk, q_start, q_len, kv_len, T, Hq, i_kvh, i_vb, j_lo, n, n_tiles, j_mid,
                i_split, num_splits, qk_scale, G: gl.constexpr, HEAD_DIM: gl.constexpr,
                BLOCK_M: gl.constexpr, BLOCK_Q: gl.constexpr, BLOCK_N: gl.constexpr,
                STAGES: gl.constexpr, IS_DIRECT: gl.constexpr, BLOCK_DV: gl.constexpr):
    """One warpgroup: tiles ``j_lo .. j_lo + n - 1`` of one split from a fresh state in FA3's
    issue order (the next tile's scores issued with this tile's ``p @ v``: without a fold state
    the registers hold both), then the raw state ``(m, l, acc)`` stored where the Triton split
    kernel stores it, or with ``IS_DIRECT`` (one split per row) normalised into out and lse as
    that kernel's ``IS_DIRECT`` does. ``acc`` holds the ``BLOCK_DV`` V columns of block
    ``i_vb``; the scores, max and denominator are the whole row's, computed alike by every
    column block."""
    S_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, BLOCK_N, 16])
    O_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, BLOCK_DV, 16])
    P_L: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_L, k_width=2)
    ROW_S: gl.constexpr = gl.SliceLayout(1, S_L)
    ROW_O: gl.constexpr = gl.SliceLayout(1, O_L)
    HALF: gl.constexpr = BLOCK_M // 2
    o_m = half * HALF + gl.arange(0, HALF, layout=ROW_S)
    _, _, _, pos = _block_row_ids_g(o_m, i_qblk, q_start, q_len, kv_len, T, G, BLOCK_Q)
    q_h = q_s.slice(half * HALF, HALF)
    zero_s = gl.full([HALF, BLOCK_N], 0.0, gl.float32, layout=S_L)
    acc = gl.full([HALF, BLOCK_DV], 0.0, gl.float32, layout=O_L)
    m_i = gl.full([HALF], float("-inf"), gl.float32, layout=ROW_S)
    l_i = gl.full([HALF], 0.0, gl.float32, layout=ROW_S)
    mbarrier.wait(ready.index(0), 0)
    m_i, l_i, acc, p = _step_weights(q_h, k_s.index(0), zero_s, m_i, l_i, acc, j_lo, j_mid, pos,
                                     qk_scale, BLOCK_N, S_L, ROW_O, P_L)
    for t in range(0, n):
        j = j_lo + t
        # The next tile's scores (past the last tile: its own again, a dummy never used) and
        # this tile's p @ v, issued together.
        tn = gl.minimum(t + 1, n - 1)
        mbarrier.wait(ready.index(tn % STAGES), (tn // STAGES) & 1)
        s_tok = warpgroup_mma(q_h, k_s.index(tn % STAGES).permute((1, 0)), zero_s,
                              is_async=True)
        if (j + 1 == n_tiles) & (kv_len - j * BLOCK_N < BLOCK_N):
            _zero_v_tail(v_s.index(t % STAGES), kv_len - j * BLOCK_N, BLOCK_N, BLOCK_DV)
        acc_tok = warpgroup_mma(p, v_s.index(t % STAGES), acc, is_async=True)
        b_s = warpgroup_mma_wait(1, deps=[s_tok])
        if j_lo + tn >= j_mid:
            b_s = _masked(b_s, j_lo + tn, pos, BLOCK_N, S_L)
        m_new, alpha, b_p = _weights(m_i, b_s, qk_scale)
        acc = warpgroup_mma_wait(0, deps=[acc_tok])
        mbarrier.arrive(empty.index(t % STAGES))
        if t + 1 < n:
            m_i = m_new
            l_i = _sum(l_i, alpha, b_p)
            acc = acc * gl.convert_layout(alpha, ROW_O)[:, None]
            p = gl.convert_layout(b_p.to(k_s.dtype), P_L)
    o_mo = half * HALF + gl.arange(0, HALF, layout=ROW_O)
    tok, g, m_row, _ = _block_row_ids_g(o_mo, i_qblk, q_start, q_len, kv_len, T, G, BLOCK_Q)
    if BLOCK_DV == HEAD_DIM:
        o_d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, O_L))
        m_ml = m_row
    else:  # m, l and the LSE from the program of V column block 0
        o_d = i_vb * BLOCK_DV + gl.arange(0, BLOCK_DV, layout=gl.SliceLayout(0, O_L))
        m_ml = m_row & (i_vb == 0)
    _store_split(acc, gl.convert_layout(l_i, ROW_O), gl.convert_layout(m_i, ROW_O), ws_o_ptr,
                 ws_ml_ptr, out_ptr, lse_ptr, q_start, tok, g, m_row, m_ml, o_d, i_kvh, Hq,
                 i_split, num_splits, G, HEAD_DIM, IS_DIRECT)


@gluon.jit(do_not_specialize=["split_tiles", "lead_tiles", "B", "T", "num_pages", "max_kv_len",
                               "num_splits"])
def _split_kernel(
    q_ptr,  # [T, Hq, D]
    k_desc,  # TMA descriptor of k_cache seen as [P * PS, Hkv * D], box [BOX, D]
    v_desc,  # likewise for v_cache, box [BOX, D // VALUE_BLOCKS]
    cu_seqlens_q_ptr,  # [B + 1] int32
    kv_lens_ptr,  # [B] int32
    block_table_ptr,  # [B, max_pages] int32
    ws_o_ptr,  # [T, Hq, num_splits, D] fp32: raw acc per split
    ws_ml_ptr,  # [T, Hq, num_splits, 2] fp32: (m in log2 units, l) per split
    out_ptr,  # [T, Hq, D] contiguous (IS_DIRECT only)
    lse_ptr,  # [T, Hq] fp32 contiguous (IS_DIRECT only)
    qk_scale,  # sm_scale * log2(e), > 0
    split_tiles,  # KV tiles per split
    lead_tiles,  # KV tiles per lead split, a divisor of split_tiles (_split_lo)
    B,
    T,
    Hq,
    num_pages,
    max_kv_len,  # KV tokens the block table covers
    num_splits,
    stride_qt,
    stride_qh,
    stride_bt,
    G: gl.constexpr,
    HEAD_DIM: gl.constexpr,
    PAGE_SIZE: gl.constexpr,
    BLOCK_M: gl.constexpr,  # 128
    BLOCK_Q: gl.constexpr,
    BLOCK_N: gl.constexpr,  # 128
    BOX: gl.constexpr,  # min(PAGE_SIZE, BLOCK_N)
    STAGES: gl.constexpr,  # K/V slots of the ring
    IS_DIRECT: gl.constexpr,  # one split per row (num_splits == 1): out and lse, no merge
    VALUE_BLOCKS: gl.constexpr = 1,  # V column blocks per (slot, KV head, split): 1, 2 or 4
    IS_PDL: gl.constexpr = False,  # the merge is a programmatic dependent launch
):
    """Grid ``(slots, Hkv * VALUE_BLOCKS, splits)``, ``num_warps=4`` (the first consumer
    warpgroup; the second and the loader warp are workers): the split plan's first phase.
    Slots are taken last first, as ``_unified_attention_split_kernel`` takes them; a split past
    a block's last tile exits (with ``IS_DIRECT`` too: only malformed lengths,
    ``validate=False``, leave such a block, whose rows then stay unwritten where the Triton
    kernel writes the empty state).

    Scheduling only, no arithmetic (kernels/README.md, "The 128-key contract and the Gluon
    kernels"): with
    ``VALUE_BLOCKS`` > 1 the programs of one (slot, KV head, split) compute the same scores,
    max and denominator and each the ``p @ v`` of its ``D / VALUE_BLOCKS`` V columns (only
    block 0 stores m, l and the LSE), as the Triton split kernel's ``BLOCK_DV``; with
    ``IS_PDL`` every program lets the merge launch at once (``griddepcontrol.
    launch_dependents``; the merge waits in-kernel for this grid's writes)."""
    if IS_PDL:
        gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // dummy $0", "=r", [],
                                  dtype=gl.int32, is_pure=False, pack=1)
    BLOCK_DV: gl.constexpr = HEAD_DIM // VALUE_BLOCKS
    i_qb = gl.num_programs(0) - 1 - gl.program_id(0)
    if VALUE_BLOCKS == 1:
        i_kvh = gl.program_id(1)
        i_vb = 0
    else:
        i_kvh = gl.program_id(1) // VALUE_BLOCKS
        i_vb = gl.program_id(1) % VALUE_BLOCKS
    i_split = gl.program_id(2)
    i_b, q_start, q_len, kv_len, i_qblk = _block_scalars_g(cu_seqlens_q_ptr, kv_lens_ptr, i_qb, B,
                                                           max_kv_len, BLOCK_Q)
    if i_qblk * BLOCK_Q >= q_len:
        return
    min_pos, max_pos = _block_pos_bounds_g(i_qblk, q_len, kv_len, max_kv_len, BLOCK_Q)
    n_tiles = max_pos // BLOCK_N + 1
    j_lo = _split_lo_g(i_split, split_tiles, lead_tiles)
    if j_lo >= n_tiles:
        return
    n = gl.minimum(j_lo + _split_len_g(i_split, split_tiles, lead_tiles), n_tiles) - j_lo
    LD_L: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[4, 8],
                                          warps_per_cta=[4, 1], order=[1, 0])
    o_m = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, LD_L))
    o_d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, LD_L))
    tok, g, m_row, _ = _block_row_ids_g(o_m, i_qblk, q_start, q_len, kv_len, T, G, BLOCK_Q)
    b_q = _load_q_cols_g(q_ptr, q_start, tok, g, m_row, i_kvh, stride_qt, stride_qh, o_d, G)
    q_s = gl.allocate_shared_memory(b_q.dtype, [BLOCK_M, HEAD_DIM], SMEM_L, b_q)
    k_s = gl.allocate_shared_memory(b_q.dtype, [STAGES, BLOCK_N, HEAD_DIM], SMEM_L)
    if BLOCK_DV == HEAD_DIM:
        v_s = gl.allocate_shared_memory(b_q.dtype, [STAGES, BLOCK_N, HEAD_DIM], SMEM_L)
    else:
        V_L: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=min(128, BLOCK_DV * 2),
                                                 element_bitwidth=16, rank=2)
        v_s = gl.allocate_shared_memory(b_q.dtype, [STAGES, BLOCK_N, BLOCK_DV], V_L)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)
    fence_async_shared()
    j_mid = (min_pos + 1) // BLOCK_N
    p_bt = block_table_ptr + i_b.to(gl.int64) * stride_bt
    gl.warp_specialize([
        (_split_consumer, (q_s, k_s, v_s, ready, empty, ws_o_ptr, ws_ml_ptr, out_ptr, lse_ptr, 0,
                           i_qblk, q_start, q_len, kv_len, T, Hq, i_kvh, i_vb, j_lo, n, n_tiles,
                           j_mid, i_split, num_splits, qk_scale, G, HEAD_DIM, BLOCK_M,
                           BLOCK_Q, BLOCK_N, STAGES, IS_DIRECT, BLOCK_DV)),
        (_split_consumer, (q_s, k_s, v_s, ready, empty, ws_o_ptr, ws_ml_ptr, out_ptr, lse_ptr, 1,
                           i_qblk, q_start, q_len, kv_len, T, Hq, i_kvh, i_vb, j_lo, n, n_tiles,
                           j_mid, i_split, num_splits, qk_scale, G, HEAD_DIM, BLOCK_M,
                           BLOCK_Q, BLOCK_N, STAGES, IS_DIRECT, BLOCK_DV)),
        (_loader, (k_desc, v_desc, k_s, v_s, ready, empty, j_lo, n, p_bt, kv_len, num_pages,
                   i_kvh, i_vb, HEAD_DIM, PAGE_SIZE, BLOCK_N, BOX, STAGES, BLOCK_DV))], [4, 1],
        [232, 24])


# ------------------------------------------------------------------------------------------------
# The split plan's decode tile with the keys on the MMA's rows (128-key tiles; 64-key tiles at
# head dim 256): the same bits as the Triton split kernel (and ``_split_kernel``) with 8x less
# padding on the tensor cores and exponentials when a block has a few rows (kernels/README.md,
# "The keys-as-rows decode tile").
# ------------------------------------------------------------------------------------------------


@gluon.jit
def _row_sum_t(p_t, ROWS: gl.constexpr, BLOCK_N: gl.constexpr, COL_L: gl.constexpr):
    """``tl.sum(p, 1)`` of ``_tile_sum`` with the bits it has in the Triton tile, from the
    transposed ``p_t`` ``[BLOCK_N, ROWS]`` (keys down, rows across). There (Triton 3.6, the
    ``wgmma`` accumulator layout of the 64-row tile at 64 keys and of the 128-row tile at 128
    keys) each of the 4 lanes that share a row adds the row's keys ``c`` with ``c % 8`` in
    ``{2q, 2q + 1}`` one after the other in ascending order (``q``: the lane in its quad), then
    two butterfly shuffles, first across lanes 2 apart, then 1 apart, give ``(s0 + s2) + (s1 +
    s3)`` (read off the PTX at both widths: ``benchmarks/kernel_stats.py --ptx-dir``). Here the
    lanes ``4 r + q`` hold row ``r``'s ``BLOCK_N / 4`` keys of lane ``q`` in that order and the
    same reduction runs: the adds in register order, then the butterflies over ``q``. Needs
    ``BLOCK_N`` 64 or 128 (groups of 8 keys)."""
    gl.static_assert((BLOCK_N == 64) | (BLOCK_N == 128))
    PER_LANE: gl.constexpr = BLOCK_N // 4
    SUM_L: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 1, PER_LANE],
                                           threads_per_warp=[8, 4, 1],
                                           warps_per_cta=[4, 1, 1], order=[2, 1, 0])
    # key c = 8 i + 2 q + e  ->  [ROWS, q, k = 2 i + e]
    p3 = gl.reshape(gl.permute(gl.reshape(p_t, [BLOCK_N // 8, 4, 2, ROWS]), (3, 1, 0, 2)),
                    [ROWS, 4, PER_LANE])
    part = gl.sum(gl.convert_layout(p3, SUM_L), 2)  # s_q: one add after another
    return gl.convert_layout(gl.sum(part, 1), COL_L)  # (s0 + s2) + (s1 + s3)


@gluon.jit
def _kt_weights(s_t, m_i, j, j_mid, pos, qk_scale, ROWS: gl.constexpr, BLOCK_N: gl.constexpr,
                ST_L: gl.constexpr, COL_S: gl.constexpr):
    """Tile ``j``'s weights from its transposed raw scores ``s_t`` ``[BLOCK_N, ROWS]``
    (``_tile_weights``' operations along axis 0; masked by ``key <= pos`` when ``j >=
    j_mid``): ``(m_new, alpha, p_t, row sum)``, the row sum in the Triton tile's order
    (``_row_sum_t``)."""
    if j >= j_mid:
        o_k = j * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, ST_L))
        s_t = gl.where(o_k[:, None] <= pos[None, :], s_t, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s_t, 0) * qk_scale)
    m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = gl.where(m_new == m_i, 1.0, gl.exp2(m_i - m_safe))
    p_t = gl.exp2(gl.fma(s_t, qk_scale, -m_safe[None, :]))
    return m_new, alpha, p_t, _row_sum_t(p_t, ROWS, BLOCK_N, COL_S)


@gluon.jit
def _fold_t(m_a, l_a, acc_a, m_b, l_b, acc_b):
    """``state_fold`` on transposed accumulators (``acc_*`` ``[columns, rows]``, ``m_*`` and
    ``l_*`` along axis 1): the same operations in the same order per element (the weights, then
    one explicit ``fma`` each for ``l`` and ``acc``), so the same bits."""
    a_empty = m_a == float("-inf")
    b_empty = m_b == float("-inf")
    m = gl.maximum(m_a, m_b)
    m_safe = gl.where(a_empty & b_empty, 0.0, m)
    neg_zero = gl.cast(-2147483648, gl.float32, bitcast=True)  # -0.0: see state_fold
    w_a = gl.where(b_empty, 1.0, gl.where(a_empty, neg_zero, gl.exp2(m_a - m_safe)))
    w_b = gl.where(b_empty, neg_zero, gl.where(a_empty, 1.0, gl.exp2(m_b - m_safe)))
    l = gl.fma(l_a, w_a, l_b * w_b)
    acc = gl.fma(acc_a, w_a[None, :], acc_b * w_b[None, :])
    return m, l, acc


@gluon.jit
def _kt_rows(q_s, k_s, v_s, p_s, ready, empty, ws_o_ptr, ws_ml_ptr, out_ptr, lse_ptr, i_qblk,
             q_start, q_len, kv_len, T, Hq, i_kvh, i_vb, j_lo, n, n_tiles, j_mid, i_split,
             num_splits, split_tiles, lead_tiles, qk_scale, G: gl.constexpr,
             HEAD_DIM: gl.constexpr, ROWS: gl.constexpr, BLOCK_Q: gl.constexpr,
             BLOCK_N: gl.constexpr, STAGES: gl.constexpr, IS_DIRECT: gl.constexpr,
             BLOCK_DV: gl.constexpr, AHEAD: gl.constexpr, WALK: gl.constexpr):
    """The consumer warpgroup of ``_split_kt_kernel``: ``_split_rows``' operations per row, on
    transposed tiles. Per tile: ``s^T = k @ q^T`` (m64nROWSk16 ``wgmma``, the keys on M), the
    weights (``_kt_weights``), ``acc^T * alpha``, p^T through shared memory, ``acc^T += v^T @
    p^T`` (m64nROWSk16, V's ``BLOCK_DV`` columns of block ``i_vb`` on M). Then the raw state or,
    with ``IS_DIRECT``, the result, stored as ``_split_rows`` stores them.

    Issue order (no bit: the same operations on the same values): with ``AHEAD`` the next
    tile's scores are issued before this tile's ``p @ v`` and its weights computed while that
    runs (``_split_rows``' order; p in two shared buffers, so the next p is written while this
    one is read); without, each tile waits for its ``p @ v`` before the next scores.

    ``WALK``: the program's tiles may hold several splits (the lead splits, and splits of
    ``split_tiles``: kernels/README.md, "Lead splits"); each ends with a fold of its state into
    the program's running fold (``_fold_t``) and the next starts fresh, as the fused plan walks
    them (``_serial_rows``); at the end of each split of ``split_tiles`` the fold is stored as
    that split's state and starts empty again. The same bits as one program per split and the
    merge: the fold is the merge's, in the same order, and folding into the empty state is
    exact."""
    ST_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                   instr_shape=[16, ROWS, 16])
    COL_S: gl.constexpr = gl.SliceLayout(0, ST_L)
    o_r = gl.arange(0, ROWS, layout=COL_S)
    _, _, _, pos = _block_row_ids_g(o_r, i_qblk, q_start, q_len, kv_len, T, G, BLOCK_Q)
    zero_s = gl.full([BLOCK_N, ROWS], 0.0, gl.float32, layout=ST_L)
    acc = gl.full([BLOCK_DV, ROWS], 0.0, gl.float32, layout=ST_L)
    m_i = gl.full([ROWS], float("-inf"), gl.float32, layout=COL_S)
    l_i = gl.full([ROWS], 0.0, gl.float32, layout=COL_S)
    q_t = q_s.permute((1, 0))
    # WALK: the running fold of the program's finished splits (empty).
    f_m = gl.full([ROWS], float("-inf"), gl.float32, layout=COL_S)
    f_l = gl.full([ROWS], 0.0, gl.float32, layout=COL_S)
    f_acc = gl.full([BLOCK_DV, ROWS], 0.0, gl.float32, layout=ST_L)
    if AHEAD:
        mbarrier.wait(ready.index(0), 0)
        s_tok = warpgroup_mma(k_s.index(0), q_t, zero_s, is_async=True)
        s_t = warpgroup_mma_wait(0, deps=[s_tok])
        m_i, alpha, p_t, r_sum = _kt_weights(s_t, m_i, j_lo, j_mid, pos, qk_scale, ROWS,
                                             BLOCK_N, ST_L, COL_S)
        l_i = gl.fma(l_i, alpha, r_sum)
        acc = acc * alpha[None, :]
        p_s.index(0).store(gl.permute(p_t.to(p_s.dtype), (1, 0)))
        fence_async_shared()
        gl.thread_barrier()
        for t in range(0, n - 1):  # tile t's p @ v with tile t + 1's scores and weights
            s = t % STAGES
            sn = (t + 1) % STAGES
            mbarrier.wait(ready.index(sn), ((t + 1) // STAGES) & 1)
            s_tok = warpgroup_mma(k_s.index(sn), q_t, zero_s, is_async=True)
            acc_tok = warpgroup_mma(v_s.index(s).permute((1, 0)),
                                    p_s.index(t % 2).permute((1, 0)), acc, is_async=True)
            s_t = warpgroup_mma_wait(1, deps=[s_tok])
            m_base = m_i
            if WALK:  # a split ends with tile t: the next one starts fresh
                new_split = _ends_split_g(j_lo + t + 1, split_tiles, lead_tiles)
                m_base = gl.where(new_split, gl.full_like(m_i, float("-inf")), m_i)
            m_new, alpha, p_t, r_sum = _kt_weights(s_t, m_base, j_lo + t + 1, j_mid, pos,
                                                   qk_scale, ROWS, BLOCK_N, ST_L, COL_S)
            p_s.index((t + 1) % 2).store(gl.permute(p_t.to(p_s.dtype), (1, 0)))
            fence_async_shared()
            gl.thread_barrier()
            acc = warpgroup_mma_wait(0, deps=[acc_tok])
            mbarrier.arrive(empty.index(s))
            if WALK:  # noqa: SIM102 (a constexpr branch: new_split exists only with WALK)
                if new_split:
                    f_m, f_l, f_acc = _fold_t(f_m, f_l, f_acc, m_i, l_i, acc)
                    l_i = gl.full_like(l_i, 0.0)
                    acc = gl.full_like(acc, 0.0)
                    if (j_lo + t + 1) % split_tiles == 0:  # a split of split_tiles ends: store
                        _kt_store(f_acc, f_m, f_l, ws_o_ptr, ws_ml_ptr, out_ptr, lse_ptr,
                                  i_qblk, q_start, q_len, kv_len, T, Hq, i_kvh, i_vb,
                                  (j_lo + t) // split_tiles, num_splits, G, HEAD_DIM, ROWS,
                                  BLOCK_Q, IS_DIRECT, BLOCK_DV)
                        f_m = gl.full_like(f_m, float("-inf"))
                        f_l = gl.full_like(f_l, 0.0)
                        f_acc = gl.full_like(f_acc, 0.0)
            m_i = m_new
            l_i = gl.fma(l_i, alpha, r_sum)
            acc = acc * alpha[None, :]
        # The last tile's p @ v (its V tail zeroed first where the row ends inside it).
        t = n - 1
        j = j_lo + t
        if (j + 1 == n_tiles) & (kv_len - j * BLOCK_N < BLOCK_N):
            _zero_v_tail(v_s.index(t % STAGES), kv_len - j * BLOCK_N, BLOCK_N, BLOCK_DV)
        acc_tok = warpgroup_mma(v_s.index(t % STAGES).permute((1, 0)),
                                p_s.index(t % 2).permute((1, 0)), acc, is_async=True)
        acc = warpgroup_mma_wait(0, deps=[acc_tok])
        mbarrier.arrive(empty.index(t % STAGES))
    else:
        p_t_s = p_s.index(0).permute((1, 0))
        for t in range(0, n):
            j = j_lo + t
            s = t % STAGES
            if WALK:  # noqa: SIM102 (a constexpr branch: the test compiles away)
                if (t > 0) & _ends_split_g(j, split_tiles, lead_tiles):
                    # A split ended with tile j - 1: fold it, start fresh.
                    f_m, f_l, f_acc = _fold_t(f_m, f_l, f_acc, m_i, l_i, acc)
                    m_i = gl.full_like(m_i, float("-inf"))
                    l_i = gl.full_like(l_i, 0.0)
                    acc = gl.full_like(acc, 0.0)
                    if j % split_tiles == 0:  # a split of split_tiles ended: store it
                        _kt_store(f_acc, f_m, f_l, ws_o_ptr, ws_ml_ptr, out_ptr, lse_ptr,
                                  i_qblk, q_start, q_len, kv_len, T, Hq, i_kvh, i_vb,
                                  j // split_tiles - 1, num_splits, G, HEAD_DIM, ROWS, BLOCK_Q,
                                  IS_DIRECT, BLOCK_DV)
                        f_m = gl.full_like(f_m, float("-inf"))
                        f_l = gl.full_like(f_l, 0.0)
                        f_acc = gl.full_like(f_acc, 0.0)
            mbarrier.wait(ready.index(s), (t // STAGES) & 1)
            s_tok = warpgroup_mma(k_s.index(s), q_t, zero_s, is_async=True)
            s_t = warpgroup_mma_wait(0, deps=[s_tok])
            m_i, alpha, p_t, r_sum = _kt_weights(s_t, m_i, j, j_mid, pos, qk_scale, ROWS,
                                                 BLOCK_N, ST_L, COL_S)
            l_i = gl.fma(l_i, alpha, r_sum)
            acc = acc * alpha[None, :]
            p_s.index(0).store(gl.permute(p_t.to(p_s.dtype), (1, 0)))
            if (j + 1 == n_tiles) & (kv_len - j * BLOCK_N < BLOCK_N):
                _zero_v_tail(v_s.index(s), kv_len - j * BLOCK_N, BLOCK_N, BLOCK_DV)
            fence_async_shared()
            gl.thread_barrier()
            acc_tok = warpgroup_mma(v_s.index(s).permute((1, 0)), p_t_s, acc, is_async=True)
            acc = warpgroup_mma_wait(0, deps=[acc_tok])
            mbarrier.arrive(empty.index(s))
    if WALK:  # the last split's fold, stored as its split's state
        m_i, l_i, acc = _fold_t(f_m, f_l, f_acc, m_i, l_i, acc)
        i_split = (j_lo + n - 1) // split_tiles
    _kt_store(acc, m_i, l_i, ws_o_ptr, ws_ml_ptr, out_ptr, lse_ptr, i_qblk, q_start, q_len,
              kv_len, T, Hq, i_kvh, i_vb, i_split, num_splits, G, HEAD_DIM, ROWS, BLOCK_Q,
              IS_DIRECT, BLOCK_DV)


@gluon.jit
def _kt_store(acc, m_i, l_i, ws_o_ptr, ws_ml_ptr, out_ptr, lse_ptr, i_qblk, q_start, q_len,
              kv_len, T, Hq, i_kvh, i_vb, i_split, num_splits, G: gl.constexpr,
              HEAD_DIM: gl.constexpr, ROWS: gl.constexpr, BLOCK_Q: gl.constexpr,
              IS_DIRECT: gl.constexpr, BLOCK_DV: gl.constexpr):
    """``_kt_rows``' end: the transposed state ``acc`` ``[BLOCK_DV, ROWS]`` (m and l along its
    axis 1) turned to rows and stored by ``_store_split`` at split ``i_split``."""
    OUT_L: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, BLOCK_DV // 32],
                                           threads_per_warp=[1, 32], warps_per_cta=[4, 1],
                                           order=[1, 0])
    ROW_O: gl.constexpr = gl.SliceLayout(1, OUT_L)
    b_acc = gl.convert_layout(gl.permute(acc, (1, 0)), OUT_L)
    b_m = gl.convert_layout(m_i, ROW_O)
    b_l = gl.convert_layout(l_i, ROW_O)
    o_m = gl.arange(0, ROWS, layout=ROW_O)
    tok, g, m_row, _ = _block_row_ids_g(o_m, i_qblk, q_start, q_len, kv_len, T, G, BLOCK_Q)
    if BLOCK_DV == HEAD_DIM:
        o_d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, OUT_L))
        m_ml = m_row
    else:  # m, l and the LSE from the program of V column block 0
        o_d = i_vb * BLOCK_DV + gl.arange(0, BLOCK_DV, layout=gl.SliceLayout(0, OUT_L))
        m_ml = m_row & (i_vb == 0)
    _store_split(b_acc, b_l, b_m, ws_o_ptr, ws_ml_ptr, out_ptr, lse_ptr, q_start, tok, g, m_row,
                 m_ml, o_d, i_kvh, Hq, i_split, num_splits, G, HEAD_DIM, IS_DIRECT)


@gluon.jit(do_not_specialize=["split_tiles", "lead_tiles", "B", "T", "num_pages", "max_kv_len",
                               "num_splits", "walk_splits"])
def _split_kt_kernel(
    q_ptr,  # [T, Hq, D]
    k_desc,  # TMA descriptor of k_cache seen as [P * PS, Hkv * D], box [BOX, D]
    v_desc,  # likewise for v_cache, box [BOX, D // VALUE_BLOCKS]
    cu_seqlens_q_ptr,  # [B + 1] int32
    kv_lens_ptr,  # [B] int32
    block_table_ptr,  # [B, max_pages] int32
    ws_o_ptr,  # [T, Hq, num_splits, D] fp32: raw acc per split
    ws_ml_ptr,  # [T, Hq, num_splits, 2] fp32: (m in log2 units, l) per split
    out_ptr,  # [T, Hq, D] contiguous (IS_DIRECT only)
    lse_ptr,  # [T, Hq] fp32 contiguous (IS_DIRECT only)
    qk_scale,  # sm_scale * log2(e), > 0
    split_tiles,  # KV tiles per split
    lead_tiles,  # KV tiles per lead split, a divisor of split_tiles (_split_lo)
    B,
    T,
    Hq,
    num_pages,
    max_kv_len,  # KV tokens the block table covers
    num_splits,
    walk_splits,  # WALK: splits of split_tiles per program
    stride_qt,
    stride_qh,
    stride_bt,
    G: gl.constexpr,
    HEAD_DIM: gl.constexpr,
    PAGE_SIZE: gl.constexpr,
    ROWS: gl.constexpr,  # rows per block (the MMA's N): 8, 16 or 32, >= G
    BLOCK_Q: gl.constexpr,  # ROWS // G
    BLOCK_N: gl.constexpr,  # the contract's tile: 128 (head dims 64, 128) or 64 (head dim 256)
    BOX: gl.constexpr,  # min(PAGE_SIZE, BLOCK_N)
    STAGES: gl.constexpr,  # K/V slots of the ring
    IS_DIRECT: gl.constexpr,  # one split per row (num_splits == 1): out and lse, no merge
    VALUE_BLOCKS: gl.constexpr = 1,  # V column blocks per (slot, KV head, split): 1, 2 or 4
    AHEAD: gl.constexpr = False,  # the next tile's scores issued before this tile's p @ v
    IS_PDL: gl.constexpr = False,  # the merge is a programmatic dependent launch
    WALK: gl.constexpr = False,  # program i walks walk_splits splits of split_tiles (below)
):
    """Grid ``(slots, Hkv * VALUE_BLOCKS, splits)``, ``num_warps=4`` (one consumer warpgroup;
    the loader warp is a worker): ``_split_kernel`` for blocks of ``ROWS`` rows with the keys on
    the MMA's rows. Scheduling and operand placement only, the same bits (kernels/README.md,
    "The keys-as-rows decode tile"): ``VALUE_BLOCKS`` as ``_split_kernel``'s (blocks of 64
    columns at least: the ``p @ v`` MMA's M is V's columns), ``AHEAD`` the issue order
    (``_kt_rows``). ``BLOCK_N`` is the contract's tile (the Triton split kernel's, whose bits
    these are): 128 keys, or 64 at head dim 256 (one m64 score MMA per tile; V's 256 columns
    are four m64 blocks of the ``p @ v`` MMA).

    ``WALK``: program ``i`` of grid dim 2 walks the tiles ``[i * w, (i + 1) * w)`` with ``w =
    walk_splits * split_tiles``, folds the lead splits in the first split and stores each split
    of ``split_tiles`` (``_kt_rows``): the workspace then has one entry per ``split_tiles`` (the
    merge counts splits with ``lead_tokens = split_tokens``), and ``IS_DIRECT`` means rows of at
    most ``split_tiles`` tiles."""
    if IS_PDL:
        gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // dummy $0", "=r", [],
                                  dtype=gl.int32, is_pure=False, pack=1)
    i_qb = gl.num_programs(0) - 1 - gl.program_id(0)
    BLOCK_DV: gl.constexpr = HEAD_DIM // VALUE_BLOCKS
    if VALUE_BLOCKS == 1:
        i_kvh = gl.program_id(1)
        i_vb = 0
    else:
        i_kvh = gl.program_id(1) // VALUE_BLOCKS
        i_vb = gl.program_id(1) % VALUE_BLOCKS
    # The last splits first: with lead splits they are the long ones (a row's chain), so they
    # start in the first wave. Scheduling only: each program's work depends on its split alone.
    i_split = gl.num_programs(2) - 1 - gl.program_id(2)
    i_b, q_start, q_len, kv_len, i_qblk = _block_scalars_g(cu_seqlens_q_ptr, kv_lens_ptr, i_qb, B,
                                                           max_kv_len, BLOCK_Q)
    if i_qblk * BLOCK_Q >= q_len:
        return
    min_pos, max_pos = _block_pos_bounds_g(i_qblk, q_len, kv_len, max_kv_len, BLOCK_Q)
    n_tiles = max_pos // BLOCK_N + 1
    if WALK:
        j_lo = i_split * (walk_splits * split_tiles)
        if j_lo >= n_tiles:
            return
        n = gl.minimum(j_lo + walk_splits * split_tiles, n_tiles) - j_lo
    else:
        j_lo = _split_lo_g(i_split, split_tiles, lead_tiles)
        if j_lo >= n_tiles:
            return
        n = gl.minimum(j_lo + _split_len_g(i_split, split_tiles, lead_tiles), n_tiles) - j_lo
    LD_L: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 8],
                                          threads_per_warp=[256 // HEAD_DIM, HEAD_DIM // 8],
                                          warps_per_cta=[4, 1], order=[1, 0])
    o_m = gl.arange(0, ROWS, layout=gl.SliceLayout(1, LD_L))
    o_d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, LD_L))
    tok, g, m_row, _ = _block_row_ids_g(o_m, i_qblk, q_start, q_len, kv_len, T, G, BLOCK_Q)
    b_q = _load_q_cols_g(q_ptr, q_start, tok, g, m_row, i_kvh, stride_qt, stride_qh, o_d, G)
    q_s = gl.allocate_shared_memory(b_q.dtype, [ROWS, HEAD_DIM], SMEM_L, b_q)
    p_s = gl.allocate_shared_memory(b_q.dtype, [2 if AHEAD else 1, ROWS, BLOCK_N], SMEM_L)
    k_s = gl.allocate_shared_memory(b_q.dtype, [STAGES, BLOCK_N, HEAD_DIM], SMEM_L)
    if BLOCK_DV == HEAD_DIM:
        v_s = gl.allocate_shared_memory(b_q.dtype, [STAGES, BLOCK_N, HEAD_DIM], SMEM_L)
    else:
        V_L: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=min(128, BLOCK_DV * 2),
                                                 element_bitwidth=16, rank=2)
        v_s = gl.allocate_shared_memory(b_q.dtype, [STAGES, BLOCK_N, BLOCK_DV], V_L)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    fence_async_shared()
    j_mid = (min_pos + 1) // BLOCK_N
    p_bt = block_table_ptr + i_b.to(gl.int64) * stride_bt
    gl.warp_specialize([
        (_kt_rows, (q_s, k_s, v_s, p_s, ready, empty, ws_o_ptr, ws_ml_ptr, out_ptr, lse_ptr,
                    i_qblk, q_start, q_len, kv_len, T, Hq, i_kvh, i_vb, j_lo, n, n_tiles,
                    j_mid, i_split, num_splits, split_tiles, lead_tiles, qk_scale, G, HEAD_DIM,
                    ROWS, BLOCK_Q, BLOCK_N, STAGES, IS_DIRECT, BLOCK_DV, AHEAD, WALK)),
        (_loader, (k_desc, v_desc, k_s, v_s, ready, empty, j_lo, n, p_bt, kv_len, num_pages,
                   i_kvh, i_vb, HEAD_DIM, PAGE_SIZE, BLOCK_N, BOX, STAGES, BLOCK_DV))], [1],
        [24])
