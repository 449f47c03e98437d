# mypy: disable-error-code="no-untyped-def"
"""Unified paged attention: jit code for the fused plan, the split plan and its merge kernel.

Tile rows are (query token, query head) pairs: the ``G = Hq // Hkv`` query heads that share one KV
head are packed into the M dimension (row ``r`` is token ``r // G``, head ``r % G`` of the group),
so one K/V tile load serves the whole group and decode still fills the tensor cores.

Numerics contract (``kernels/README.md``): the reduction order of every row is a function of its
absolute position alone. KV tiles sit at absolute positions ``[j * BLOCK_N, (j + 1) * BLOCK_N)``,
splits at ``[s * S, (s + 1) * S)``; each split runs a fresh online softmax over its tiles in
increasing order (:func:`_attend_split`), and the splits' raw states are folded left to right
with :func:`state_fold`, then normalized once (:func:`state_normalize`). Tiles and splits a row
does not reach leave its state bit-identical.
"""

import triton
import triton.language as tl

try:  # Triton 3.4 and later: programmatic dependent launch (griddepcontrol)
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

    HAS_GDC = True
except ImportError:  # older Triton: never launched with IS_PDL (kernels.attention checks HAS_GDC)
    HAS_GDC = False

    @triton.jit
    def gdc_launch_dependents():
        pass

    @triton.jit
    def gdc_wait():
        pass

from kernels._triton.common import (
    LN2,
    _block_rows,
    _ends_split,
    _find_request,
    _load_q_cols,
    _program_slot,
    _split_count,
    _split_len,
    _split_lo,
    _store_rows,
    _tile_sum,
    _tile_weights,
)
from kernels._triton.merge_kernels import (
    state_fold,
    state_fold_sink,
    state_normalize,
    state_scale,
    state_weights,
)

# An empty state's (m, l) = (-inf, +0.0) as one int64 (little-endian pairs: m low, l high): m's
# bits 0xFF800000, zero-extended (a sign-extended value would make l's bits 0xFFFFFFFF, a NaN).
_EMPTY_ML: tl.constexpr = tl.constexpr(0xFF800000)


#: Elements of the interpreter's product tensor ``[M, K, N]`` (Triton's largest block).
_EMULATED_PRODUCT_MAX: tl.constexpr = tl.constexpr(1 << 20)


@triton.jit
def _dot_emulated(a, b, acc):
    """acc + a @ b for :func:`_dot` under the interpreter (fp32 operands in row-major order):
    the product ``[M, K, N]`` summed over K. A product past Triton's largest block (e.g. 256
    rows at 128 keys) is computed as two interleaved halves of the rows, recursively: each
    element's sum over K is the same either way. Interpreter only (it runs this recursion as
    Python)."""
    M: tl.constexpr = a.shape[0]
    K: tl.constexpr = a.shape[1]
    N: tl.constexpr = b.shape[1]
    if M * K * N <= _EMULATED_PRODUCT_MAX or M == 1:
        return acc + tl.sum(a[:, :, None] * b[None, :, :], 1)
    else:
        a0, a1 = tl.split(tl.permute(tl.reshape(a, [M // 2, 2, K]), [0, 2, 1]))
        c0, c1 = tl.split(tl.permute(tl.reshape(acc, [M // 2, 2, N]), [0, 2, 1]))
        r0 = _dot_emulated(a0, b, c0)
        r1 = _dot_emulated(a1, b, c1)
        return tl.reshape(tl.permute(tl.join(r0, r1), [0, 2, 1]), [M, N])


@triton.jit
def _dot(a, b, acc, IS_INTERPRET: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """acc + a @ b with fp32 accumulation. a: [M, K], b: [K, N], acc: [M, N] fp32."""
    if IS_INTERPRET:
        # NOTE: the interpreter's tl.dot is numpy.matmul (OpenBLAS), whose result for a row
        # depends on the row's index inside the tile, and it multiplies raw bits for bfloat16.
        # Emulate instead: upcast (products of fp16/bf16 values are exact in fp32) and sum over K
        # in a fixed order that is the same for every element. The reshapes copy a transposed
        # operand (K read as rows) into row-major order: numpy's summation order follows the
        # memory layout, which must not depend on how an operand was loaded.
        a = tl.reshape(tl.reshape(a.to(tl.float32), [a.shape[0] * a.shape[1]]), a.shape)
        b = tl.reshape(tl.reshape(b.to(tl.float32), [b.shape[0] * b.shape[1]]), b.shape)
        return _dot_emulated(a, b, acc)
    else:
        return tl.dot(a, b, acc, input_precision=DOT_PRECISION)


@triton.jit
def _load_tile(
    j, kv_len, kv_off_h, k_ptr, v_ptr, p_bt, num_pages,
    stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh,
    HEAD_DIM: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    PAGE_SHIFT: tl.constexpr,
    BLOCK_N: tl.constexpr,
    IS_MASKED: tl.constexpr,
    IS_PAGE_PER_TILE: tl.constexpr,
    IS_K_ROWS: tl.constexpr,
    d0=0,  # first V column
    BLOCK_DV: tl.constexpr = None,  # V columns (None: HEAD_DIM)
):
    """K and V of KV tile ``j`` (keys ``[j * BLOCK_N, (j + 1) * BLOCK_N)``) through the block
    table: ``b_kt`` [D, BN] (K transposed) and ``b_v`` [BN, BLOCK_DV] (V columns from ``d0``).
    ``IS_MASKED=False`` only for tiles whose keys all lie before ``kv_len``."""
    o_d = tl.arange(0, HEAD_DIM)
    if BLOCK_DV is None:  # noqa: SIM108 (a constexpr branch: compiled away)
        o_dv = o_d
    else:
        o_dv = d0 + tl.arange(0, BLOCK_DV)
    o_n = j * BLOCK_N + tl.arange(0, BLOCK_N)
    # Positions are >= 0 and PAGE_SIZE a power of two: shifts and masks, not signed division.
    if IS_PAGE_PER_TILE:
        # The whole tile lies in one page (PAGE_SIZE >= BLOCK_N, both powers of two).
        i_page = tl.load(p_bt + ((j * BLOCK_N) >> PAGE_SHIFT))
    elif IS_MASKED:
        # NOTE: gather the page of every key; unused block-table columns are never read.
        i_page = tl.load(p_bt + (o_n >> PAGE_SHIFT), mask=o_n < kv_len, other=0)
    else:
        i_page = tl.load(p_bt + (o_n >> PAGE_SHIFT))
    # NOTE: clamp page ids into [0, num_pages): a no-op for valid input (validate=True checks
    # every needed id); with validate=False a bad id reads a wrong page, never out of k/v_cache.
    i_page = tl.minimum(tl.maximum(i_page, 0), num_pages - 1)
    i_slot = (o_n & (PAGE_SIZE - 1)).to(tl.int64)
    off_k = i_page.to(tl.int64) * stride_kp + i_slot * stride_ks + kv_off_h * stride_kh
    off_v = i_page.to(tl.int64) * stride_vp + i_slot * stride_vs + kv_off_h * stride_vh
    m_n = o_n < kv_len
    # [BN, D] V tile. K as [BN, D] too with IS_K_ROWS (the same keys per thread as V, so the
    # page ids and slots of a thread's keys serve both; the dot reads it transposed), else as
    # [D, BN]. Either way the dot multiplies the same operands (bit-neutral: kernels/README.md).
    if IS_MASKED:
        b_v = tl.load(v_ptr + off_v[:, None] + o_dv[None, :], mask=m_n[:, None], other=0.0)
    else:
        b_v = tl.load(v_ptr + off_v[:, None] + o_dv[None, :])
    if IS_K_ROWS:
        if IS_MASKED:
            b_k = tl.load(k_ptr + off_k[:, None] + o_d[None, :], mask=m_n[:, None], other=0.0)
        else:
            b_k = tl.load(k_ptr + off_k[:, None] + o_d[None, :])
        b_kt = tl.trans(b_k)
    else:
        if IS_MASKED:
            b_kt = tl.load(k_ptr + off_k[None, :] + o_d[:, None], mask=m_n[None, :], other=0.0)
        else:
            b_kt = tl.load(k_ptr + off_k[None, :] + o_d[:, None])
    return b_kt, b_v


@triton.jit
def _soft_cap(b_s, cap, cap_scale):
    """``cap * tanh(b_s * cap_scale)`` (``cap_scale = sm_scale * k_scale / cap``): the
    soft-capped scores in natural units. tanh as ``(1 - e) / (1 + e)`` with
    ``e = exp2(-2 log2(e) |x|)`` and the sign of ``x``: one formula on every path and under
    the interpreter (no library tanh whose rounding could differ). Absolute error of a few
    units of float32 roundoff times ``cap``."""
    x = b_s * cap_scale
    e = tl.exp2(tl.abs(x) * -2.8853900817779268)
    t = (1.0 - e) / (1.0 + e)
    return tl.where(x < 0, -t, t) * cap


@triton.jit
def _tile_scores(b_q, b_kt, j, pos, window_left, cap, cap_scale, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, IS_MASKED: tl.constexpr, HAS_WINDOW: tl.constexpr,
                 HAS_SOFTCAP: tl.constexpr, IS_INTERPRET: tl.constexpr,
                 DOT_PRECISION: tl.constexpr):
    """[BM, BN] scores of tile ``j``: raw ``q.k`` (unscaled), or with ``HAS_SOFTCAP`` the
    soft-capped scores in natural units (:func:`_soft_cap`); ``-inf`` where a row does not see a
    key (``IS_MASKED``: past its position, or with ``HAS_WINDOW`` more than ``window_left``
    before it). K is read in q's dtype (an FP8 cache converts exactly)."""
    b_s = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    b_s = _dot(b_q, b_kt.to(b_q.dtype), b_s, IS_INTERPRET, DOT_PRECISION)
    if HAS_SOFTCAP:
        b_s = _soft_cap(b_s, cap, cap_scale)
    if IS_MASKED:
        o_n = j * BLOCK_N + tl.arange(0, BLOCK_N)
        seen = o_n[None, :] <= pos[:, None]
        if HAS_WINDOW:
            seen = seen & (o_n[None, :] >= pos[:, None] - window_left)
        b_s = tl.where(seen, b_s, float("-inf"))
    return b_s


@triton.jit
def _attend_tile(
    b_q, m_i, l_i, acc, j, pos, kv_len, kv_off_h, k_ptr, v_ptr, p_bt, num_pages, qk_scale,
    window_left, cap, cap_scale,
    stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh,
    HEAD_DIM: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    PAGE_SHIFT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    IS_MASKED: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,
    IS_PAGE_PER_TILE: tl.constexpr,
    IS_K_ROWS: tl.constexpr,
    IS_INTERPRET: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    d0=0,  # first V column of acc
    BLOCK_DV: tl.constexpr = None,  # V columns of acc (None: HEAD_DIM)
):
    """One online-softmax step over KV tile ``j`` (keys ``[j * BLOCK_N, (j + 1) * BLOCK_N)``).

    ``acc`` holds V columns ``[d0, d0 + BLOCK_DV)``; the scores always use the whole head dim.

    ``IS_MASKED=False`` is only used for tiles that every row of the block sees entirely (all
    keys at or before the block's first position, hence < kv_len, and inside every row's
    window): no load masks, no select. ``qk_scale`` turns scores into log2 units: ``sm_scale *
    log2(e)`` (times the KV head's ``k_scale`` with an FP8 cache) on raw scores, ``log2(e)`` on
    soft-capped ones.

    NOTE: both paths must round identically. A first fast path wrote ``s * qk_scale`` and
    ``s - m`` separately; without the select between them the compiler contracted them into an
    FMA on the unmasked path only, and a row's bits depended on whether its block's first row had
    reached the tile (prefill vs decode, chunking; seen on an H100). Here the scores stay raw
    (the mask selects on raw scores), the row max is scaled after the max (exact: rounding is
    monotonic and qk_scale > 0), and the exponent is one explicit ``tl.fma``: the same single
    rounding on both paths, leaving the compiler no choice to make.
    """
    b_kt, b_v = _load_tile(
        j, kv_len, kv_off_h, k_ptr, v_ptr, p_bt, num_pages,
        stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh,
        HEAD_DIM, PAGE_SIZE, PAGE_SHIFT, BLOCK_N, IS_MASKED, IS_PAGE_PER_TILE, IS_K_ROWS,
        d0, BLOCK_DV)
    b_s = _tile_scores(b_q, b_kt, j, pos, window_left, cap, cap_scale, BLOCK_M, BLOCK_N,
                       IS_MASKED, HAS_WINDOW, HAS_SOFTCAP, IS_INTERPRET, DOT_PRECISION)
    m_new, alpha, b_p = _tile_weights(m_i, b_s, qk_scale)
    l_i = _tile_sum(l_i, alpha, b_p)
    acc = acc * alpha[:, None]
    acc = _dot(b_p.to(b_q.dtype), b_v.to(b_q.dtype), acc, IS_INTERPRET, DOT_PRECISION)
    return m_new, l_i, acc


@triton.jit
def _attend_tile_pair(
    b_q, m_i, l_i, acc, j, pos, kv_len, kv_off_h, k_ptr, v_ptr, p_bt, num_pages, qk_scale,
    cap, cap_scale,
    stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh,
    HEAD_DIM: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    PAGE_SHIFT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,
    IS_PAGE_PER_TILE: tl.constexpr,
    IS_K_ROWS: tl.constexpr,
    IS_INTERPRET: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    d0,  # first V column of acc
    BLOCK_DV: tl.constexpr,  # V columns of acc
):
    """Two unmasked online-softmax steps, over tiles ``j`` then ``j + 1``: the arithmetic of two
    :func:`_attend_tile` calls, in the same order per row, written so that the second tile's
    loads, scores and exponentials do not wait for the first tile's ``p @ v`` (a shorter
    dependency chain per tile; bit-neutral, kernels/README.md)."""
    b_kt0, b_v0 = _load_tile(
        j, kv_len, kv_off_h, k_ptr, v_ptr, p_bt, num_pages,
        stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh,
        HEAD_DIM, PAGE_SIZE, PAGE_SHIFT, BLOCK_N, False, IS_PAGE_PER_TILE, IS_K_ROWS,
        d0, BLOCK_DV)
    b_kt1, b_v1 = _load_tile(
        j + 1, kv_len, kv_off_h, k_ptr, v_ptr, p_bt, num_pages,
        stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh,
        HEAD_DIM, PAGE_SIZE, PAGE_SHIFT, BLOCK_N, False, IS_PAGE_PER_TILE, IS_K_ROWS,
        d0, BLOCK_DV)
    b_s0 = _tile_scores(b_q, b_kt0, j, pos, 0, cap, cap_scale, BLOCK_M, BLOCK_N, False, False,
                        HAS_SOFTCAP, IS_INTERPRET, DOT_PRECISION)
    b_s1 = _tile_scores(b_q, b_kt1, j + 1, pos, 0, cap, cap_scale, BLOCK_M, BLOCK_N, False,
                        False, HAS_SOFTCAP, IS_INTERPRET, DOT_PRECISION)
    m_0, alpha0, b_p0 = _tile_weights(m_i, b_s0, qk_scale)
    m_1, alpha1, b_p1 = _tile_weights(m_0, b_s1, qk_scale)
    l_i = _tile_sum(l_i, alpha0, b_p0)
    l_i = _tile_sum(l_i, alpha1, b_p1)
    acc = acc * alpha0[:, None]
    acc = _dot(b_p0.to(b_q.dtype), b_v0.to(b_q.dtype), acc, IS_INTERPRET, DOT_PRECISION)
    acc = acc * alpha1[:, None]
    acc = _dot(b_p1.to(b_q.dtype), b_v1.to(b_q.dtype), acc, IS_INTERPRET, DOT_PRECISION)
    return m_1, l_i, acc


@triton.jit
def _window_tiles(j_lo, j_hi, min_pos, max_pos, window_left, BLOCK_N: tl.constexpr,
                  HAS_WINDOW: tl.constexpr):
    """(j_first, j_full): a block's tiles within ``[j_lo, j_hi)`` under a window. Tiles before
    ``j_first`` hold only keys before every row's window (skipped: a row's state would stay
    bit-identical through them); tiles in ``[j_first, j_full)`` are cut by the window edge of
    some row (masked); from ``j_full`` on every key is inside every row's window. Without a
    window ``(j_lo, j_lo)``. A function of the block's positions, and per row the same tiles
    change its state whichever block it is in."""
    j_first = j_lo
    j_full = j_lo
    if HAS_WINDOW:
        j_first = tl.maximum(j_lo, tl.maximum(min_pos - window_left, 0) // BLOCK_N)
        edge = tl.maximum(max_pos - window_left, 0)
        j_full = tl.minimum(tl.maximum((edge + BLOCK_N - 1) // BLOCK_N, j_first), j_hi)
    return j_first, j_full


@triton.jit
def _attend_split(
    b_q,  # [BM, D] q tile
    pos,  # [BM] int32 absolute position of each row, -1 for padding rows
    min_pos,  # scalar, smallest position of the block's rows
    max_pos,  # scalar, largest position of the block's rows
    kv_len,
    i_split,
    split_tiles,  # tiles per split (S // BLOCK_N)
    lead_tiles,  # tiles per lead split, a divisor of split_tiles (_split_lo)
    i_kvh,
    k_ptr,  # [P, PS, Hkv, D]
    v_ptr,  # [P, PS, Hkv, D]
    p_bt,  # [max_pages] pointer to this request's block-table row
    num_pages,  # pages of k/v_cache (page ids are clamped into [0, num_pages))
    qk_scale,  # scores to log2 units (_attend_tile)
    window_left,  # HAS_WINDOW: keys at most this far before a row's position
    cap,  # HAS_SOFTCAP: the soft-cap
    cap_scale,  # HAS_SOFTCAP: sm_scale (times k_scale) / cap
    stride_kp,
    stride_ks,
    stride_kh,
    stride_vp,
    stride_vs,
    stride_vh,
    HEAD_DIM: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    PAGE_SHIFT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,
    IS_PAGE_PER_TILE: tl.constexpr,
    IS_K_ROWS: tl.constexpr,
    IS_INTERPRET: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    d0,  # first V column of acc
    BLOCK_DV: tl.constexpr,  # V columns of acc
    TILES_PER_STEP: tl.constexpr,  # unmasked tiles per loop step: 1 or 2 (_attend_tile_pair)
):
    """Online softmax over the tiles of split ``i_split``, from a fresh state, in increasing order.

    Returns the split's raw state (m [BM], l [BM], acc [BM, BLOCK_DV]) fp32, m in log2 units,
    ``acc`` for V columns ``[d0, d0 + BLOCK_DV)``. A split wholly outside a row's window leaves
    that row's state empty (``m = -inf``): an exact no-op when folded.
    """
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
    j_lo = _split_lo(i_split, split_tiles, lead_tiles)
    # Tiles past the block's last position are masked for every row: skip them.
    j_hi = tl.minimum(j_lo + _split_len(i_split, split_tiles, lead_tiles),
                      max_pos // BLOCK_N + 1)
    j_lo, j_full = _window_tiles(j_lo, j_hi, min_pos, max_pos, window_left, BLOCK_N, HAS_WINDOW)
    # Tiles in [j_full, j_mid) are seen entirely by every row of the block: the unmasked path.
    j_mid = tl.maximum(tl.minimum((min_pos + 1) // BLOCK_N, j_hi), j_full)
    kv_off_h = i_kvh.to(tl.int64)
    if HAS_WINDOW:
        for j in range(j_lo, j_full):
            m_i, l_i, acc = _attend_tile(
                b_q, m_i, l_i, acc, j, pos, kv_len, kv_off_h, k_ptr, v_ptr, p_bt, num_pages,
                qk_scale, window_left, cap, cap_scale,
                stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh,
                HEAD_DIM, PAGE_SIZE, PAGE_SHIFT, BLOCK_M, BLOCK_N, True, HAS_WINDOW, HAS_SOFTCAP,
                IS_PAGE_PER_TILE, IS_K_ROWS, IS_INTERPRET, DOT_PRECISION, d0, BLOCK_DV)
    j_single = j_full
    if TILES_PER_STEP == 2:
        # Pairs of unmasked tiles, then the odd one out below.
        j_single = j_full + (j_mid - j_full) // 2 * 2
        for j in range(j_full, j_single, 2):
            m_i, l_i, acc = _attend_tile_pair(
                b_q, m_i, l_i, acc, j, pos, kv_len, kv_off_h, k_ptr, v_ptr, p_bt, num_pages,
                qk_scale, cap, cap_scale, stride_kp, stride_ks, stride_kh, stride_vp, stride_vs,
                stride_vh, HEAD_DIM, PAGE_SIZE, PAGE_SHIFT, BLOCK_M, BLOCK_N, HAS_SOFTCAP,
                IS_PAGE_PER_TILE, IS_K_ROWS, IS_INTERPRET, DOT_PRECISION, d0, BLOCK_DV)
    for j in range(j_single, j_mid):
        m_i, l_i, acc = _attend_tile(
            b_q, m_i, l_i, acc, j, pos, kv_len, kv_off_h, k_ptr, v_ptr, p_bt, num_pages, qk_scale,
            window_left, cap, cap_scale,
            stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh,
            HEAD_DIM, PAGE_SIZE, PAGE_SHIFT, BLOCK_M, BLOCK_N, False, HAS_WINDOW, HAS_SOFTCAP,
            IS_PAGE_PER_TILE, IS_K_ROWS, IS_INTERPRET, DOT_PRECISION, d0, BLOCK_DV)
    for j in range(j_mid, j_hi):
        m_i, l_i, acc = _attend_tile(
            b_q, m_i, l_i, acc, j, pos, kv_len, kv_off_h, k_ptr, v_ptr, p_bt, num_pages, qk_scale,
            window_left, cap, cap_scale,
            stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh,
            HEAD_DIM, PAGE_SIZE, PAGE_SHIFT, BLOCK_M, BLOCK_N, True, HAS_WINDOW, HAS_SOFTCAP,
            IS_PAGE_PER_TILE, IS_K_ROWS, IS_INTERPRET, DOT_PRECISION, d0, BLOCK_DV)
    return m_i, l_i, acc


@triton.jit
def _row_features(sinks_ptr, k_scale_ptr, i_kvh, g, m_row, qk_scale, cap, G: tl.constexpr,
                  HAS_SINKS: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
                  HAS_KV_SCALE: tl.constexpr):
    """What the features make of a program's rows (query heads ``i_kvh * G + g``): (the scale
    that turns scores into log2 units, the soft-cap's argument scale, each row's sink in log2
    units). The FP8 cache's ``k_scale`` of the KV head scales the scores; soft-capped scores
    are in natural units, so their log2 scale is log2(e). Without sinks the sink is ``-inf``
    (unused).

    NOTE: the sinks arrive in log2 units, converted on the host (kernels.launch). A product
    ``sink * log2(e)`` here would feed the fold's ``sink2 - m`` and the compiler may contract
    the two into one fma in one kernel and not in another: on an H200 the fused plan and the
    merge then disagreed by up to 14 ULP in rows a sink dominates (the interpreter, which never
    contracts, agreed)."""
    sm_scale2 = qk_scale
    if HAS_KV_SCALE:
        sm_scale2 = qk_scale * tl.load(k_scale_ptr + i_kvh)
    w_scale = sm_scale2
    cap_scale = sm_scale2
    if HAS_SOFTCAP:
        # sm_scale * k_scale / cap, from the log2-unit scale: the same value on every path.
        cap_scale = sm_scale2 * (LN2 / cap)
        w_scale = 1.4426950408889634
    sink2 = tl.full(g.shape, float("-inf"), dtype=tl.float32)
    if HAS_SINKS:
        sink2 = tl.load(sinks_ptr + i_kvh * G + g, mask=m_row, other=0.0)
    return w_scale, cap_scale, sink2


@triton.jit
def _close_split(f_m, f_l, f_acc, m_i, l_i, acc, BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr):
    """End of a split in the fused plan: fold its raw state into the running fold (f_m, f_l,
    f_acc) and return a fresh online-softmax state."""
    f_m, f_l, f_acc = state_fold(f_m, f_l, f_acc, m_i, l_i, acc)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    return f_m, f_l, f_acc, m_i, l_i, acc


@triton.jit
def _load_q(q_ptr, q_start, tok, g, m_row, i_kvh, stride_qt, stride_qh,
            G: tl.constexpr, HEAD_DIM: tl.constexpr):
    return _load_q_cols(q_ptr, q_start, tok, g, m_row, i_kvh, stride_qt, stride_qh,
                        tl.arange(0, HEAD_DIM), G)


@triton.jit
def _store_out(out_ptr, lse_ptr, b_o, b_lse2, q_start, tok, g, m_row, i_kvh, Hq,
               G: tl.constexpr, HEAD_DIM: tl.constexpr, d0=0, BLOCK_DV: tl.constexpr = None):
    """Stores ``b_o`` (out columns ``[d0, d0 + BLOCK_DV)``, all of them by default) and, from
    the program of column 0, the LSE."""
    if BLOCK_DV is None:
        o_d = tl.arange(0, HEAD_DIM)
        m_lse = m_row
    else:
        o_d = d0 + tl.arange(0, BLOCK_DV)
        m_lse = m_row & (tok * 0 + d0 == 0)
    _store_rows(out_ptr, lse_ptr, b_o, b_lse2, q_start, tok, g, m_row, m_lse, i_kvh, Hq, o_d, G,
                HEAD_DIM)


@triton.jit
def _finish(f_m, f_l, f_acc, sink2, v_scale_ptr, i_kvh, HAS_SINKS: tl.constexpr,
            HAS_KV_SCALE: tl.constexpr):
    """A row's folded raw state to its output: the sink folded in (``HAS_SINKS``), normalized,
    and, with an FP8 cache, times the KV head's ``v_scale``. Returns (o [BM, D] fp32, lse2 [BM],
    log2 units; with sinks the LSE includes the sink)."""
    if HAS_SINKS:
        f_m, f_l, f_acc = state_fold_sink(f_m, f_l, f_acc, sink2)
    b_o, b_lse = state_normalize(f_acc, f_l, f_m)
    if HAS_KV_SCALE:
        b_o = b_o * tl.load(v_scale_ptr + i_kvh)
    return b_o, b_lse


# NOTE: per-batch integers are not specialised (Triton would compile a variant per "== 1" /
# "divisible by 16" combination of B, T, page count and lengths: ~20 compiles per dtype in one
# check). Strides stay specialised: their alignment enables vector loads.
@triton.jit(do_not_specialize=["split_tiles", "lead_tiles", "B", "T", "num_pages", "max_kv_len"])
def _unified_attention_fused_kernel(
    # Inputs
    q_ptr,  # [T, Hq, D]
    k_ptr,  # [P, PS, Hkv, D]
    v_ptr,  # [P, PS, Hkv, D]
    cu_seqlens_q_ptr,  # [B + 1] int32
    kv_lens_ptr,  # [B] int32
    block_table_ptr,  # [B, max_pages] int32
    slot_order_ptr,  # [num_slots] int32, a permutation of the slots (IS_SLOT_ORDER only)
    sinks_ptr,  # [Hq] fp32 sink logits in log2 units (HAS_SINKS only)
    k_scale_ptr,  # [Hkv] fp32 (HAS_KV_SCALE only)
    v_scale_ptr,  # [Hkv] fp32 (HAS_KV_SCALE only)
    # Outputs
    out_ptr,  # [T, Hq, D] contiguous
    lse_ptr,  # [T, Hq] fp32 contiguous
    # Scalars
    qk_scale,  # sm_scale * log2(e), > 0
    window_left,  # HAS_WINDOW: a row at position p sees keys [p - window_left, p]
    cap,  # HAS_SOFTCAP: the soft-cap, > 0
    split_tiles,  # KV tiles per split (split_tokens // BLOCK_N)
    lead_tiles,  # KV tiles per lead split, a divisor of split_tiles (_split_lo)
    B,  # requests
    T,  # query tokens
    Hq,  # query heads
    num_pages,  # pages of k/v_cache (bound of the page-id clamp)
    max_kv_len,  # KV tokens the block table covers: max_pages * PAGE_SIZE (kv_len clamp)
    stride_qt: tl.int64,
    stride_qh: tl.int64,
    stride_kp: tl.int64,
    stride_ks: tl.int64,
    stride_kh: tl.int64,
    stride_vp: tl.int64,
    stride_vs: tl.int64,
    stride_vh: tl.int64,
    stride_bt: tl.int64,
    # Constexprs
    G: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    PAGE_SHIFT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_N: tl.constexpr,
    IS_PAGE_PER_TILE: tl.constexpr,
    IS_K_ROWS: tl.constexpr,
    IS_INTERPRET: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    HAS_SINKS: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,
    HAS_KV_SCALE: tl.constexpr,  # an FP8 cache with per-KV-head k_scale and v_scale
    IS_SLOT_ORDER: tl.constexpr,  # program i takes slot slot_order[i]
    IS_NESTED: tl.constexpr,  # an inner loop per split (_attend_split), its fold after it
    TILES_PER_STEP: tl.constexpr,  # IS_NESTED: fully visible KV tiles per loop step (1 or 2)
):
    """Fused plan: one program per (query-block slot, kv head) walks all splits of its block,
    merging each into a register state as soon as it ends: in one flat loop over the tiles, or
    (``IS_NESTED``) in an inner loop per split.

    Which program takes which slot is scheduling only (a program's work depends on its slot
    alone). ``IS_SLOT_ORDER``: program ``i`` takes slot ``slot_order[i]``, a permutation that
    puts the requests with the most KV first (:func:`_slot_keys_kernel`, then
    :func:`_slot_rank_kernel`), so that long programs do not start last (the tail of a mixed
    batch). Else the last slots go first: within a request the last query blocks see the most
    keys."""
    i_qb = _program_slot(slot_order_ptr, IS_SLOT_ORDER)
    i_kvh = tl.program_id(1)
    i_b, q_start, q_len, kv_len, i_qblk, tok, g, m_row, pos, min_pos, max_pos = _block_rows(
        cu_seqlens_q_ptr, kv_lens_ptr, i_qb, B, T, max_kv_len, G, BLOCK_M, BLOCK_Q)
    if i_qblk * BLOCK_Q >= q_len:
        return
    w_scale, cap_scale, sink2 = _row_features(sinks_ptr, k_scale_ptr, i_kvh, g, m_row, qk_scale,
                                              cap, G, HAS_SINKS, HAS_SOFTCAP, HAS_KV_SCALE)
    b_q = _load_q(q_ptr, q_start, tok, g, m_row, i_kvh, stride_qt, stride_qh, G, HEAD_DIM)
    p_bt = block_table_ptr + i_b.to(tl.int64) * stride_bt
    # The running fold of the finished splits (empty).
    f_m = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    f_l = tl.zeros([BLOCK_M], dtype=tl.float32)
    f_acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    # Tiles from j_end on lie past the block's last position: masked for every row, skipped.
    j_end = max_pos // BLOCK_N + 1
    # Under a window, tiles before j_start hold no key any row sees: skipped, and so are the
    # splits holding only them (their states would be empty: exact no-ops in the fold).
    j_start, j_full = _window_tiles(0, j_end, min_pos, max_pos, window_left, BLOCK_N,
                                    HAS_WINDOW)
    if IS_NESTED:
        # An inner loop per split (the split kernel's: fully visible tiles TILES_PER_STEP at a
        # time, then the masked ones), its fold after it: per row the same operations in the same
        # order as the flat loop below; only register allocation and the schedule change.
        n_splits = _split_count(j_end, split_tiles, lead_tiles)
        s_first = _split_count(j_start + 1, split_tiles, lead_tiles) - 1
        for i_split in range(s_first, n_splits):
            m_i, l_i, acc = _attend_split(
                b_q, pos, min_pos, max_pos, kv_len, i_split, split_tiles, lead_tiles, i_kvh,
                k_ptr, v_ptr, p_bt, num_pages, w_scale, window_left, cap, cap_scale,
                stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh, HEAD_DIM,
                PAGE_SIZE, PAGE_SHIFT, BLOCK_M, BLOCK_N, HAS_WINDOW, HAS_SOFTCAP,
                IS_PAGE_PER_TILE, IS_K_ROWS, IS_INTERPRET, DOT_PRECISION, 0, HEAD_DIM,
                TILES_PER_STEP)
            f_m, f_l, f_acc = state_fold(f_m, f_l, f_acc, m_i, l_i, acc)
    else:
        # One flat loop over the tiles (long loops pipeline well); at every split boundary the
        # split's raw state is folded and reset: the same operations, in the same order, as
        # _attend_split + state_fold in the split plan's merge. The current split's state:
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
        kv_off_h = i_kvh.to(tl.int64)
        # Tiles in [j_full, j_mid) are seen entirely by every row of the block: unmasked.
        j_mid = tl.maximum(tl.minimum((min_pos + 1) // BLOCK_N, j_end), j_full)
        if HAS_WINDOW:
            for j in range(j_start, j_full):
                m_i, l_i, acc = _attend_tile(
                    b_q, m_i, l_i, acc, j, pos, kv_len, kv_off_h, k_ptr, v_ptr, p_bt,
                    num_pages, w_scale, window_left, cap, cap_scale, stride_kp, stride_ks,
                    stride_kh, stride_vp, stride_vs, stride_vh, HEAD_DIM, PAGE_SIZE,
                    PAGE_SHIFT, BLOCK_M, BLOCK_N, True, HAS_WINDOW, HAS_SOFTCAP,
                    IS_PAGE_PER_TILE, IS_K_ROWS, IS_INTERPRET, DOT_PRECISION)
                if _ends_split(j + 1, split_tiles, lead_tiles):
                    f_m, f_l, f_acc, m_i, l_i, acc = _close_split(f_m, f_l, f_acc, m_i, l_i,
                                                                  acc, BLOCK_M, HEAD_DIM)
        for j in range(j_full, j_mid):
            m_i, l_i, acc = _attend_tile(
                b_q, m_i, l_i, acc, j, pos, kv_len, kv_off_h, k_ptr, v_ptr, p_bt, num_pages,
                w_scale, window_left, cap, cap_scale, stride_kp, stride_ks, stride_kh,
                stride_vp, stride_vs, stride_vh, HEAD_DIM, PAGE_SIZE, PAGE_SHIFT, BLOCK_M,
                BLOCK_N, False, HAS_WINDOW, HAS_SOFTCAP, IS_PAGE_PER_TILE, IS_K_ROWS,
                IS_INTERPRET, DOT_PRECISION)
            if _ends_split(j + 1, split_tiles, lead_tiles):
                f_m, f_l, f_acc, m_i, l_i, acc = _close_split(f_m, f_l, f_acc, m_i, l_i, acc,
                                                              BLOCK_M, HEAD_DIM)
        for j in range(j_mid, j_end):
            m_i, l_i, acc = _attend_tile(
                b_q, m_i, l_i, acc, j, pos, kv_len, kv_off_h, k_ptr, v_ptr, p_bt, num_pages,
                w_scale, window_left, cap, cap_scale, stride_kp, stride_ks, stride_kh,
                stride_vp, stride_vs, stride_vh, HEAD_DIM, PAGE_SIZE, PAGE_SHIFT, BLOCK_M,
                BLOCK_N, True, HAS_WINDOW, HAS_SOFTCAP, IS_PAGE_PER_TILE, IS_K_ROWS,
                IS_INTERPRET, DOT_PRECISION)
            if _ends_split(j + 1, split_tiles, lead_tiles):
                f_m, f_l, f_acc, m_i, l_i, acc = _close_split(f_m, f_l, f_acc, m_i, l_i, acc,
                                                              BLOCK_M, HEAD_DIM)
        if j_end % tl.where(j_end <= split_tiles, lead_tiles, split_tiles) != 0:
            # The last split ends inside the block's range (not after tile j_end - 1).
            f_m, f_l, f_acc, m_i, l_i, acc = _close_split(f_m, f_l, f_acc, m_i, l_i, acc,
                                                          BLOCK_M, HEAD_DIM)
    b_o, b_lse = _finish(f_m, f_l, f_acc, sink2, v_scale_ptr, i_kvh, HAS_SINKS, HAS_KV_SCALE)
    _store_out(out_ptr, lse_ptr, b_o, b_lse, q_start, tok, g, m_row, i_kvh, Hq, G, HEAD_DIM)


@triton.jit(do_not_specialize=["B", "T", "max_kv_len"])
def _slot_keys_kernel(
    cu_seqlens_q_ptr,  # [B + 1] int32
    kv_lens_ptr,  # [B] int32
    keys_ptr,  # [num_slots] int64 output
    B,  # requests
    T,  # query tokens
    max_kv_len,  # KV tokens the block table covers (kv_len clamp, as in _block_rows)
    G: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """One program per query-block slot: the key of the fused plan's slot order,
    ``request_tiles * 2**32 + slot``, where ``request_tiles`` is the KV tiles of the slot's
    request (``ceil(kv_len / BLOCK_N)``: what its last block walks), 0 for a slot past its
    request's blocks. Sorted descending, the requests with the most KV go first and, within a
    request, its last blocks first (the plain order's, which keeps one request's blocks, and so
    its K and V in L2, together). Reads the lengths as the fused kernel does
    (:func:`_block_rows`, with its clamps): malformed lengths give some key, never an
    out-of-bounds read."""
    i_qb = tl.program_id(0)
    _, _, q_len, kv_len, i_qblk, _, _, _, _, _, _ = _block_rows(
        cu_seqlens_q_ptr, kv_lens_ptr, i_qb, B, T, max_kv_len, G, BLOCK_M, BLOCK_Q)
    # int64: kv_len + BLOCK_N - 1 must not wrap for a block table near 2**31 tokens.
    tiles = tl.where(i_qblk * BLOCK_Q < q_len,
                     (kv_len.to(tl.int64) + BLOCK_N - 1) // BLOCK_N, 0)
    tl.store(keys_ptr + i_qb, tiles * 4294967296 + i_qb)


@triton.jit(do_not_specialize=["num_slots"])
def _slot_rank_kernel(
    keys_ptr,  # [num_slots] int64, distinct and >= 0 (_slot_keys_kernel)
    order_ptr,  # [num_slots] int32 output: the slots by descending key
    num_slots,
    BLOCK: tl.constexpr,
):
    """One program per slot: its rank, the number of larger keys, and ``order[rank] = slot``.
    The keys are distinct and non-negative (the slot is their low 32 bits, the tiles above
    them), so the ranks are a permutation of ``[0, num_slots)`` and every entry of ``order`` is
    written once: a sort in one launch, with no storage beyond the keys and ``order``
    (``num_slots`` squared comparisons; with the keys kernel, 11 us over the plain order on a
    batch of 8 prompts of 4k tokens, about 520 slots, on an H100)."""
    i = tl.program_id(0)
    key = tl.load(keys_ptr + i)
    rank = 0
    for j0 in range(0, num_slots, BLOCK):
        o = j0 + tl.arange(0, BLOCK)
        m = o < num_slots
        other = tl.load(keys_ptr + o, mask=m, other=-1)
        rank += tl.sum(((other > key) & m).to(tl.int32))
    tl.store(order_ptr + rank, i)


@triton.jit(do_not_specialize=["split_tiles", "lead_tiles", "B", "T", "num_pages",
                               "max_kv_len", "num_splits"])
def _unified_attention_split_kernel(
    # Inputs
    q_ptr,  # [T, Hq, D]
    k_ptr,  # [P, PS, Hkv, D]
    v_ptr,  # [P, PS, Hkv, D]
    cu_seqlens_q_ptr,  # [B + 1] int32
    kv_lens_ptr,  # [B] int32
    block_table_ptr,  # [B, max_pages] int32
    sinks_ptr,  # [Hq] fp32 sink logits in log2 units (HAS_SINKS; folded with IS_DIRECT only)
    k_scale_ptr,  # [Hkv] fp32 (HAS_KV_SCALE only)
    v_scale_ptr,  # [Hkv] fp32 (HAS_KV_SCALE and IS_DIRECT only)
    # Outputs
    ws_o_ptr,  # [T, Hq, num_splits, D] fp32 partial raw acc (un-normalized p @ v)
    ws_ml_ptr,  # [T, Hq, num_splits, 2] fp32 partial (m in log2 units, l)
    out_ptr,  # [T, Hq, D] contiguous (IS_DIRECT only)
    lse_ptr,  # [T, Hq] fp32 contiguous (IS_DIRECT only)
    # Scalars
    qk_scale,  # sm_scale * log2(e), > 0
    window_left,  # HAS_WINDOW: a row at position p sees keys [p - window_left, p]
    cap,  # HAS_SOFTCAP: the soft-cap, > 0
    split_tiles,  # KV tiles per split (split_tokens // BLOCK_N)
    lead_tiles,  # KV tiles per lead split, a divisor of split_tiles (_split_lo)
    B,  # requests
    T,  # query tokens
    Hq,  # query heads
    num_pages,  # pages of k/v_cache (bound of the page-id clamp)
    max_kv_len,  # KV tokens the block table covers: max_pages * PAGE_SIZE (kv_len clamp)
    num_splits,  # workspace splits per row (grid dim 2)
    stride_qt: tl.int64,
    stride_qh: tl.int64,
    stride_kp: tl.int64,
    stride_ks: tl.int64,
    stride_kh: tl.int64,
    stride_vp: tl.int64,
    stride_vs: tl.int64,
    stride_vh: tl.int64,
    stride_bt: tl.int64,
    # Constexprs
    G: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    PAGE_SHIFT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_N: tl.constexpr,
    IS_PAGE_PER_TILE: tl.constexpr,
    IS_K_ROWS: tl.constexpr,
    IS_INTERPRET: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    HAS_SINKS: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,
    HAS_KV_SCALE: tl.constexpr,  # an FP8 cache with per-KV-head k_scale and v_scale
    IS_DIRECT: tl.constexpr,
    BLOCK_DV: tl.constexpr,  # V columns per program: HEAD_DIM, or a fraction of it
    TILES_PER_STEP: tl.constexpr,  # fully visible KV tiles per loop step: 1 or 2
    IS_PDL: tl.constexpr,  # the merge is a programmatic dependent launch (sm_90+)
):
    """Split plan, phase 1: one program per (query-block slot, kv head x V column block, split)
    writes a partial.

    With ``BLOCK_DV < HEAD_DIM`` the programs of one (slot, kv head, split) each compute the
    same scores, max and denominator and the ``p @ v`` of their own V columns: every column's
    arithmetic is the same as with one program (bit-neutral where the dot's per-element results
    do not depend on how many columns it computes; kernels/README.md), for more programs on a
    small grid. Only the program of column 0 writes m, l and the LSE.

    ``IS_DIRECT`` (every row has one split, ``num_splits == 1``): the partial is the result, so
    it is normalized and goes straight to ``out`` / ``lse``; there is no merge. The same bits:
    folding one state into the empty state returns it unchanged (:func:`state_fold`), and the
    normalization and stores are the merge kernel's.

    ``IS_PDL``: every program lets the merge kernel launch now (``griddepcontrol``); the merge
    waits for this whole grid to finish and its writes to be visible before it reads a partial.
    Scheduling only: no arithmetic changes."""
    if IS_PDL:
        gdc_launch_dependents()
    i_qb = tl.num_programs(0) - 1 - tl.program_id(0)
    i_kvh = tl.program_id(1) // (HEAD_DIM // BLOCK_DV)
    d0 = (tl.program_id(1) % (HEAD_DIM // BLOCK_DV)) * BLOCK_DV
    i_split = tl.program_id(2)
    i_b, q_start, q_len, kv_len, i_qblk, tok, g, m_row, pos, min_pos, max_pos = _block_rows(
        cu_seqlens_q_ptr, kv_lens_ptr, i_qb, B, T, max_kv_len, G, BLOCK_M, BLOCK_Q)
    if i_qblk * BLOCK_Q >= q_len:
        return
    # Splits past the block's last position are read by no row: nothing to write; under a
    # window neither are splits wholly before every row's window (the merge starts each row at
    # its window's first split). NOTE: with IS_DIRECT (split 0 only) the program writes even a
    # block with no position (max_pos < 0, only for malformed lengths with validate=False): its
    # rows get the empty state (0, -inf), as under the fused plan, never unwritten memory.
    if not IS_DIRECT:
        if _split_lo(i_split, split_tiles, lead_tiles) * BLOCK_N > max_pos:
            return
        if HAS_WINDOW:  # noqa: SIM102 (a constexpr branch)
            if _split_count(tl.maximum(min_pos - window_left, 0) // BLOCK_N + 1, split_tiles,
                            lead_tiles) - 1 > i_split:
                return
    w_scale, cap_scale, sink2 = _row_features(sinks_ptr, k_scale_ptr, i_kvh, g, m_row, qk_scale,
                                              cap, G, HAS_SINKS, HAS_SOFTCAP, HAS_KV_SCALE)
    b_q = _load_q(q_ptr, q_start, tok, g, m_row, i_kvh, stride_qt, stride_qh, G, HEAD_DIM)
    p_bt = block_table_ptr + i_b.to(tl.int64) * stride_bt
    s_m, s_l, s_acc = _attend_split(
        b_q, pos, min_pos, max_pos, kv_len, i_split, split_tiles, lead_tiles, i_kvh, k_ptr,
        v_ptr, p_bt, num_pages, w_scale, window_left, cap, cap_scale,
        stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh,
        HEAD_DIM, PAGE_SIZE, PAGE_SHIFT, BLOCK_M, BLOCK_N, HAS_WINDOW, HAS_SOFTCAP,
        IS_PAGE_PER_TILE, IS_K_ROWS, IS_INTERPRET, DOT_PRECISION, d0, BLOCK_DV, TILES_PER_STEP)
    if IS_DIRECT:
        b_o, b_lse = _finish(s_m, s_l, s_acc, sink2, v_scale_ptr, i_kvh, HAS_SINKS, HAS_KV_SCALE)
        _store_out(out_ptr, lse_ptr, b_o, b_lse, q_start, tok, g, m_row, i_kvh, Hq, G, HEAD_DIM,
                   d0, BLOCK_DV)
    else:
        o_d = d0 + tl.arange(0, BLOCK_DV)
        i_ws = ((q_start + tok).to(tl.int64) * Hq + (i_kvh * G + g)) * num_splits + i_split
        tl.store(ws_o_ptr + i_ws[:, None] * HEAD_DIM + o_d[None, :], s_acc, mask=m_row[:, None])
        m_ml = m_row & (tok * 0 + d0 == 0)  # m and l from the program of column 0
        tl.store(ws_ml_ptr + 2 * i_ws, s_m, mask=m_ml)
        tl.store(ws_ml_ptr + 2 * i_ws + 1, s_l, mask=m_ml)


@triton.jit
def _load_partial(p_acc, p_ml, i_s, n_splits, m_h, HEAD_DIM: tl.constexpr):
    """Split ``i_s``'s raw partial ``(m [BH], l [BH], acc [BH, BD])`` of a merge program's rows:
    ``p_acc`` [BH, BD] and ``p_ml`` [BH] (an int64 view of the ``(m, l)`` pairs) point at split
    0; ``m_h`` the live rows. Past ``n_splits`` an empty state, not read. ``m`` and ``l`` come in
    one 8-byte load and are taken apart by their bits (exact)."""
    m_s = m_h & (m_h.to(tl.int32) * 0 + i_s < n_splits)
    ml = tl.load(p_ml + i_s, mask=m_s, other=_EMPTY_ML)
    s_m = (ml & 0xFFFFFFFF).to(tl.uint32).to(tl.float32, bitcast=True)
    s_l = (ml >> 32).to(tl.uint32).to(tl.float32, bitcast=True)
    s_acc = tl.load(p_acc + i_s * HEAD_DIM, mask=m_s[:, None], other=0.0)
    return s_m, s_l, s_acc


@triton.jit(do_not_specialize=["split_tokens", "lead_tokens", "B", "num_splits", "max_kv_len"])
def _merge_splits_kernel(
    # Inputs
    ws_o_ptr,  # [T, Hq, num_splits, D] fp32 raw acc
    ws_ml_ptr,  # [T, Hq, num_splits, 2] fp32 (m in log2 units, l)
    cu_seqlens_q_ptr,  # [B + 1] int32
    kv_lens_ptr,  # [B] int32
    sinks_ptr,  # [Hq] fp32 sink logits in log2 units (HAS_SINKS only)
    v_scale_ptr,  # [Hkv] fp32 (HAS_KV_SCALE only)
    # Outputs
    out_ptr,  # [T, Hq, D]
    lse_ptr,  # [T, Hq] fp32
    # Scalars
    window_left,  # HAS_WINDOW: a row at position p sees keys [p - window_left, p]
    split_tokens,  # KV tokens per split
    lead_tokens,  # KV tokens per lead split, a divisor of split_tokens (_split_lo)
    B,  # requests
    Hq,  # query heads
    num_splits,  # workspace splits per row
    max_kv_len,  # KV tokens the block table covers (kv_len clamp, as in _block_rows)
    # Constexprs
    G: tl.constexpr,  # query heads per KV head
    HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
    CHUNK: tl.constexpr,
    HAS_WINDOW: tl.constexpr,  # rows start at the split of their window's first key
    HAS_SINKS: tl.constexpr,  # the sink folded after the splits (state_fold_sink)
    HAS_KV_SCALE: tl.constexpr,  # an FP8 cache: outputs times the KV head's v_scale
    IS_PDL: tl.constexpr,  # launched as a programmatic dependent of the split kernel (sm_90+)
):
    """Split plan, phase 2: one program per (query token, BLOCK_H query heads, BLOCK_D columns
    of the head dim) folds the raw partials of its rows in increasing split order
    (:func:`state_fold`), then normalizes them once.

    Every column of a row runs the same merge arithmetic on the same LSEs, so cutting the heads
    and the head dim into blocks is bit-neutral (it only changes how many programs there are).
    Each step folds CHUNK splits, loaded by the step before: first every weight
    (:func:`state_weights`, the running max in split order), then the fmas in split order
    (:func:`state_scale`), :func:`state_fold`'s operations on the same values. Splits past the
    row's last one load as empty states (exact no-ops), and loads are masked there. Under a
    window a row starts at the split holding its window's first key: the splits before it are
    empty for the row, and are never read (the split kernel may not have written them). Then
    the sink, once.

    ``IS_PDL``: the kernel may start while the split kernel still runs; it finds its row (from
    ``cu_seqlens_q`` and ``kv_lens``, which the split kernel does not write) and then waits
    (``griddepcontrol.wait``: the split kernel has finished and its writes are visible) before
    it reads the workspace."""
    i_t = tl.program_id(0)
    i_hb = tl.program_id(1)
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
    # NOTE: a token past its request's q_len (only with malformed cu_seqlens_q and
    # validate=False) reads no partial: its row gets the empty state, never unwritten memory.
    n_splits = tl.where(i_t - q_start < q_len, n_splits, 0)
    s_first = 0
    if HAS_WINDOW:
        s_first = _split_count(tl.maximum(pos - window_left, 0) + 1, split_tokens, lead_tokens) - 1
    o_h = i_hb * BLOCK_H + tl.arange(0, BLOCK_H)
    o_d = i_db * BLOCK_D + tl.arange(0, BLOCK_D)
    m_h = o_h < Hq
    i_ws = (i_t.to(tl.int64) * Hq + o_h) * num_splits  # [BH]
    p_acc = ws_o_ptr + i_ws[:, None] * HEAD_DIM + o_d[None, :]  # [BH, BD] at split 0
    p_ml = ws_ml_ptr.to(tl.pointer_type(tl.int64)) + i_ws  # [BH]: (m, l) pairs at split 0
    if IS_PDL:
        gdc_wait()
    f_m = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    f_l = tl.zeros([BLOCK_H], dtype=tl.float32)
    f_acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)
    # NOTE: software-pipelined by hand: each step folds the CHUNK partials the step before
    # loaded and loads the next CHUNK, so every load is issued a step ahead of its fold (a load
    # issued next to its fold kept only about two in flight).
    # NOTE: tuples grow by concatenation (Triton's frontend has no starred unpacking, so RUF005
    # is silenced per line) from an empty tuple (mypy would infer an empty tuple type).
    ahead = ()
    for c in tl.static_range(CHUNK):
        part = _load_partial(p_acc, p_ml, s_first + c, n_splits, m_h, HEAD_DIM)
        ahead = ahead + (part,)  # type: ignore[assignment]  # noqa: RUF005
    for i_s0 in range(s_first, n_splits, CHUNK):
        nxt = ()
        for c in tl.static_range(CHUNK):
            part = _load_partial(p_acc, p_ml, i_s0 + CHUNK + c, n_splits, m_h, HEAD_DIM)
            nxt = nxt + (part,)  # type: ignore[assignment]  # noqa: RUF005
        # state_fold in two passes: every weight of the step from the maxes (off the l and acc
        # chains), then the fmas in split order. The same operations on the same values.
        weights = ()
        for c in tl.static_range(CHUNK):
            f_m, w_a, w_b = state_weights(f_m, ahead[c][0])
            weights = weights + ((w_a, w_b),)  # type: ignore[assignment]  # noqa: RUF005
        for c in tl.static_range(CHUNK):
            f_l, f_acc = state_scale(f_l, f_acc, ahead[c][1], ahead[c][2], weights[c][0],
                                     weights[c][1])
        ahead = nxt
    if HAS_SINKS:
        sink2 = tl.load(sinks_ptr + o_h, mask=m_h, other=0.0)  # log2 units (_row_features)
        f_m, f_l, f_acc = state_fold_sink(f_m, f_l, f_acc, sink2)
    b_o, b_lse = state_normalize(f_acc, f_l, f_m)
    if HAS_KV_SCALE:
        b_o = b_o * tl.load(v_scale_ptr + o_h // G, mask=m_h, other=1.0)[:, None]
    i_row = i_t.to(tl.int64) * Hq + o_h
    tl.store(out_ptr + i_row[:, None] * HEAD_DIM + o_d[None, :],
             b_o.to(out_ptr.dtype.element_ty), mask=m_h[:, None])
    tl.store(lse_ptr + i_row, b_lse * LN2, mask=m_h & (o_h * 0 + i_db == 0))
