# mypy: disable-error-code="no-untyped-def"
"""Jit helpers shared by the Triton kernels (kernels/_triton/attention_kernels.py) and the Gluon
kernels (kernels/_gluon/attention_kernels.py, which compile them as Gluon with
``gluon.jit(fn.fn)``): one source for what both must compute alike.

- which request and rows a program serves: :func:`_find_request`, :func:`_block_scalars`,
  :func:`_block_row_ids`, :func:`_block_pos_bounds`, :func:`_block_rows`, :func:`_program_slot`;
- where the contract's splits lie: :func:`_split_lo`, :func:`_split_len`, :func:`_split_count`,
  :func:`_ends_split`;
- the online softmax's per-tile arithmetic: :func:`_tile_weights`, :func:`_tile_sum`;
- q loads and out / LSE stores: :func:`_load_q_cols`, :func:`_store_rows`.

Helpers that take index vectors (``o_m``, ``o_d``) rather than making them do so because the
Gluon kernels run them on their own layouts.
"""

import triton
import triton.language as tl

LN2: tl.constexpr = tl.constexpr(0.6931471805599453)

@triton.jit
def _find_request(cu_seqlens_q_ptr, i, B, BLOCK_Q: tl.constexpr, IS_SLOT: tl.constexpr):
    """The request owning index ``i``: the last ``b`` in ``[0, B)`` whose first index is ``<= i``.

    ``IS_SLOT``: ``i`` is a query-block slot and request b's first slot is ``cu[b] // BLOCK_Q + b``
    (request b owns the slots up to ``cu[b + 1] // BLOCK_Q + b + 1``, an upper bound on its
    blocks). Otherwise ``i`` is a query token and request b's first token is ``cu[b]``.
    NOTE: clamped to 0, so that even malformed ``cu_seqlens_q`` (``validate=False``) never makes
    a caller read ``cu_seqlens_q[-1]``; a no-op for valid input, where ``cu[0] == 0``.
    """
    lo = 0
    hi = B
    while lo < hi:
        mid = (lo + hi) // 2
        if IS_SLOT:
            start = tl.load(cu_seqlens_q_ptr + mid) // BLOCK_Q + mid
        else:
            start = tl.load(cu_seqlens_q_ptr + mid)
        if start <= i:
            lo = mid + 1
        else:
            hi = mid
    return tl.maximum(lo - 1, 0)

@triton.jit
def _block_scalars(cu_seqlens_q_ptr, kv_lens_ptr, i_qb, B, max_kv_len, BLOCK_Q: tl.constexpr):
    """The request of query-block slot ``i_qb`` and the block's place in it: (i_b, q_start,
    q_len, kv_len, i_qblk). ``kv_len`` clamped to ``[0, max_kv_len]`` (:func:`_block_rows`)."""
    i_b = _find_request(cu_seqlens_q_ptr, i_qb, B, BLOCK_Q, True)
    q_start = tl.load(cu_seqlens_q_ptr + i_b)
    q_len = tl.load(cu_seqlens_q_ptr + i_b + 1) - q_start
    kv_len = tl.minimum(tl.maximum(tl.load(kv_lens_ptr + i_b), 0), max_kv_len)
    i_qblk = i_qb - (q_start // BLOCK_Q + i_b)
    return i_b, q_start, q_len, kv_len, i_qblk

@triton.jit
def _block_row_ids(o_m, i_qblk, q_start, q_len, kv_len, T, G: tl.constexpr,
                   BLOCK_Q: tl.constexpr):
    """Tile rows ``o_m`` of a query block: (tok token index in the request, g head in group,
    m_row valid rows, pos absolute position, -1 on invalid rows) (:func:`_block_rows`). Takes
    the row indices rather than making them, so that the Gluon kernel (kernels/_gluon) runs the
    same code on its own layouts."""
    tok = i_qblk * BLOCK_Q + o_m // G
    g = o_m % G
    # NOTE: when G is not a power of two, BLOCK_Q * G < BLOCK_M and the last rows are padding.
    m_row = (o_m // G < BLOCK_Q) & (tok < q_len)
    m_row = m_row & (q_start + tok >= 0) & (q_start + tok < T)
    pos = tl.where(m_row, kv_len - q_len + tok, -1)
    return tok, g, m_row, pos

@triton.jit
def _block_pos_bounds(i_qblk, q_len, kv_len, max_kv_len, BLOCK_Q: tl.constexpr):
    """(min_pos, max_pos): the smallest and largest position of a query block's rows, with the
    guards of :func:`_block_rows`."""
    ctx = kv_len - q_len
    max_pos = tl.minimum(ctx + tl.minimum((i_qblk + 1) * BLOCK_Q, q_len) - 1, max_kv_len - 1)
    min_pos = tl.maximum(tl.minimum(ctx + i_qblk * BLOCK_Q, max_pos), -1)
    return min_pos, max_pos

@triton.jit
def _block_rows(cu_seqlens_q_ptr, kv_lens_ptr, i_qb, B, T, max_kv_len, G: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_Q: tl.constexpr):
    """Rows of query-block slot ``i_qb``.

    Returns (i_b, q_start, q_len, kv_len, i_qblk, tok [BM] token index in the request,
    g [BM] head in group, m_row [BM] valid rows, pos [BM] absolute position (-1 on invalid rows),
    min_pos / max_pos scalars = smallest / largest position in the block).

    NOTE: integer guards against malformed indices (``validate=False``), no-ops for valid input
    (where ``0 <= min_pos <= max_pos < kv_len <= max_kv_len``): ``kv_len`` is clamped to
    ``[0, max_kv_len]`` (``max_kv_len`` = the KV tokens the block table covers), ``max_pos`` to
    at most ``max_kv_len - 1`` and ``min_pos`` into ``[-1, max_pos]`` (when ``max_pos >= -1``),
    so every tile visited lies in ``[0, max_kv_len)``: no key before or past the block table,
    and loops stay bounded, even under int32 wrap-around of garbage lengths. A row is valid
    only if its token index lies in ``[0, T)``, so no q load or out store leaves q or out.
    """
    i_b, q_start, q_len, kv_len, i_qblk = _block_scalars(cu_seqlens_q_ptr, kv_lens_ptr, i_qb, B,
                                                         max_kv_len, BLOCK_Q)
    tok, g, m_row, pos = _block_row_ids(tl.arange(0, BLOCK_M), i_qblk, q_start, q_len, kv_len, T,
                                        G, BLOCK_Q)
    min_pos, max_pos = _block_pos_bounds(i_qblk, q_len, kv_len, max_kv_len, BLOCK_Q)
    return i_b, q_start, q_len, kv_len, i_qblk, tok, g, m_row, pos, min_pos, max_pos

@triton.jit
def _load_q_cols(q_ptr, q_start, tok, g, m_row, i_kvh, stride_qt, stride_qh, o_d,
                 G: tl.constexpr):
    """The ``[BM, D]`` q tile of rows (tok, g) and columns ``o_d``, 0 on invalid rows. Takes the
    column indices, so that the Gluon kernel (kernels/_gluon) runs it on its own layout."""
    i_t = (q_start + tok).to(tl.int64)
    i_h = (i_kvh * G + g).to(tl.int64)
    p_q = q_ptr + i_t[:, None] * stride_qt + i_h[:, None] * stride_qh + o_d[None, :]
    return tl.load(p_q, mask=m_row[:, None], other=0.0)

@triton.jit
def _store_rows(out_ptr, lse_ptr, b_o, b_lse2, q_start, tok, g, m_row, m_lse, i_kvh, Hq, o_d,
                G: tl.constexpr, HEAD_DIM: tl.constexpr):
    """Stores ``b_o`` (out columns ``o_d`` of rows (tok, g), where ``m_row``) and the LSE (where
    ``m_lse``), ``b_lse2`` in log2 units. Takes the column indices, so that the Gluon kernel
    runs it on its own layout."""
    i_row = (q_start + tok).to(tl.int64) * Hq + (i_kvh * G + g)
    p_o = out_ptr + i_row[:, None] * HEAD_DIM + o_d[None, :]
    tl.store(p_o, b_o.to(out_ptr.dtype.element_ty), mask=m_row[:, None])
    tl.store(lse_ptr + i_row, b_lse2 * LN2, mask=m_lse)

@triton.jit
def _program_slot(slot_order_ptr, IS_SLOT_ORDER: tl.constexpr):
    """The query-block slot of this program of the fused plan: ``slot_order[program]`` with
    ``IS_SLOT_ORDER`` (requests with the most KV first), else the last slots first."""
    if IS_SLOT_ORDER:
        # NOTE: the clamp is a no-op for the sort's permutation; it bounds the slot anyway.
        i_qb = tl.minimum(tl.maximum(tl.load(slot_order_ptr + tl.program_id(0)), 0),
                          tl.num_programs(0) - 1)
    else:
        i_qb = tl.num_programs(0) - 1 - tl.program_id(0)
    return i_qb

@triton.jit
def _split_lo(i_split, split_tiles, lead_tiles):
    """First KV tile of split ``i_split``. The contract's splits (kernels/README.md, "Lead
    splits"): the first ``split_tiles`` tiles of every row in splits of ``lead_tiles`` (a
    divisor of ``split_tiles``), then splits of ``split_tiles``, all at absolute positions."""
    n_lead = split_tiles // lead_tiles
    # NOTE: the branch not taken may wrap in int32 (a split near 2**31 tiles with a small lead);
    # tl.where discards it.
    return tl.where(i_split < n_lead, i_split * lead_tiles, (i_split - n_lead + 1) * split_tiles)

@triton.jit
def _split_len(i_split, split_tiles, lead_tiles):
    """KV tiles of split ``i_split`` (:func:`_split_lo`)."""
    return tl.where(i_split < split_tiles // lead_tiles, lead_tiles, split_tiles)

@triton.jit
def _split_count(n_tiles, split_tiles, lead_tiles):
    """Splits that hold tiles ``0 .. n_tiles - 1`` (0 for ``n_tiles <= 0``): the split of the
    last tile, plus one. NOTE: no ``n_tiles + split_tiles - 1``, which wraps in int32 for a split
    size near 2**31 tiles."""
    last = tl.maximum(n_tiles - 1, 0)
    i_last = tl.where(last < split_tiles, last // lead_tiles,
                      last // split_tiles + split_tiles // lead_tiles - 1)
    return tl.where(n_tiles > 0, i_last + 1, 0)

@triton.jit
def _ends_split(n_done, split_tiles, lead_tiles):
    """Whether a split ends after the first ``n_done`` tiles (``n_done >= 1``): at every
    ``lead_tiles`` up to ``split_tiles``, then at every ``split_tiles``."""
    return n_done % tl.where(n_done <= split_tiles, lead_tiles, split_tiles) == 0

@triton.jit
def _tile_weights(m_i, b_s, qk_scale):
    """The online-softmax weights of one tile's raw scores ``b_s`` against the running max
    ``m_i``: (m_new, alpha [BM], p [BM, BN] fp32).

    NOTE: a row masked on this whole tile keeps m_new == m_i, so alpha is exactly 1 and every
    p is exactly exp2(-inf) = 0: the state is left bit-identical. m_safe guards -inf - -inf.
    """
    m_new = tl.maximum(m_i, tl.max(b_s, 1) * qk_scale)
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.where(m_new == m_i, 1.0, tl.exp2(m_i - m_safe))
    b_p = tl.exp2(tl.fma(b_s, qk_scale, -m_safe[:, None]))
    return m_new, alpha, b_p

@triton.jit
def _tile_sum(l_i, alpha, b_p):
    """The online-softmax denominator after one tile: ``l * alpha + sum(p)`` as one explicit
    fma, so that no compiler chooses between a fused and a separate multiply (ptxas may fuse a
    PTX ``mul.f32`` and ``add.f32``), and the Triton and Gluon kernels round it alike."""
    return tl.fma(l_i, alpha, tl.sum(b_p, 1))
