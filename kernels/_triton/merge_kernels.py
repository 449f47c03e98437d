# mypy: disable-error-code="no-untyped-def"
"""Attention-state helpers and the fixed-order merge kernel.

The attention kernels carry *raw* states: ``(m [BM], l [BM], acc [BM, D])`` float32, the running
max of the scores (log2 units), the softmax denominator relative to it, and the un-normalized
sum ``p @ v``. An empty state (no keys) has ``m = -inf``, ``l = 0``. Split states are folded
left to right with :func:`state_fold` (one multiply and one fma per element, no division) and
divided once at the end by :func:`state_normalize`. The fused and the split plans both run these
operations on the same values in the same order, which is what makes their results
bit-identical: the kernels call :func:`state_fold`, and the split plan's merge calls its two
halves, :func:`state_weights` and :func:`state_scale`, a step's weights before its fmas
(kernels/README.md, "The merge").

:func:`state_merge` folds *normalized* states ``(o, lse)``; the public ``merge_states`` uses it.
"""

import triton
import triton.language as tl


@triton.jit
def state_fold(m_a, l_a, acc_a, m_b, l_b, acc_b):
    """Fold raw state b into raw state a (a then b); log2 units.

    m_*, l_*: [BM] fp32; acc_*: [BM, D] fp32. Returns (m, l, acc).
    ``m = max(m_a, m_b)``, ``w = 2^(m_x - m)``, ``l = fma(l_a, w_a, l_b * w_b)``,
    ``acc = fma(acc_a, w_a, acc_b * w_b)``.

    Folding an empty state (``m = -inf``) into either side is an exact pass-through, by the row
    weights alone (no per-element select, which cost 5% of a prefill on an H100): the empty
    side's weight is ``-0.0`` and the other's ``1.0``. An empty state's ``acc`` is ``+0.0``
    (a fresh ``+0`` plus products with ``p = +0``), so its term is ``-0.0`` and ``x + -0.0 == x``
    for every x, ``-0.0`` included; the empty running fold times ``-0.0`` adds ``-0.0`` to the
    other side's term, likewise exact. A NaN stays a NaN; its payload is the hardware's (an
    NVIDIA GPU returns its canonical NaN from arithmetic, the interpreter keeps the input's).
    Exactness holds for finite caches: a NaN or infinite V in keys a row does not see, in
    tiles its block visits, reaches the row's state through ``0 * v`` (kernels/README.md).
    """
    m, w_a, w_b = state_weights(m_a, m_b)
    l, acc = state_scale(l_a, acc_a, l_b, acc_b, w_a, w_b)
    return m, l, acc


@triton.jit
def state_weights(m_a, m_b):
    """:func:`state_fold`'s first half: the folded max and the two sides' weights, from the maxes
    alone (m_*: [BM] fp32, log2 units). Returns (m, w_a, w_b), each [BM]."""
    a_empty = m_a == float("-inf")
    b_empty = m_b == float("-inf")
    m = tl.maximum(m_a, m_b)
    # NOTE: guard exp2(-inf - -inf) = NaN when both are empty.
    m_safe = tl.where(a_empty & b_empty, 0.0, m)
    # NOTE: -0.0 from its bits: Triton 3.6 turns a literal -0.0 into +0.0 (its scalar_constant
    # tests value == 0), and x + +0.0 turns a -0.0 into +0.0 (kernels/README.md, "Math"). A scalar
    # cast, not tl.full([]): Gluon's full needs a layout, and the Gluon prefill kernel
    # (kernels/_gluon) compiles this function as it is.
    neg_zero = tl.cast(-2147483648, tl.float32, bitcast=True)
    # b empty (both empty included): keep a. Else a empty: take b.
    w_a = tl.where(b_empty, 1.0, tl.where(a_empty, neg_zero, tl.exp2(m_a - m_safe)))
    w_b = tl.where(b_empty, neg_zero, tl.where(a_empty, 1.0, tl.exp2(m_b - m_safe)))
    return m, w_a, w_b


@triton.jit
def state_scale(l_a, acc_a, l_b, acc_b, w_a, w_b):
    """:func:`state_fold`'s second half: ``l = fma(l_a, w_a, l_b * w_b)`` and
    ``acc = fma(acc_a, w_a, acc_b * w_b)`` (l_*, w_*: [BM]; acc_*: [BM, D]). Returns (l, acc)."""
    # NOTE: explicit fmas leave the compiler no contraction choice, so the fold rounds the same
    # way whether state b was just computed in registers (fused plan) or loaded (split plan).
    l = tl.fma(l_a, w_a, l_b * w_b)
    acc = tl.fma(acc_a, w_a[:, None], acc_b * w_b[:, None])
    return l, acc


@triton.jit
def state_fold_sink(m, l, acc, sink2):
    """Fold the attention sink into a raw state, once, after every split: one more key with the
    logit ``sink2`` (log2 units) and a zero value, so ``l`` gains ``2^(sink2 - m)`` and ``acc``
    only rescales. Every plan calls it on the same state (the fold of all splits), so the bits
    agree. m, l, sink2: [BM]; acc: [BM, D]."""
    m_new, w_a, w_b = state_weights(m, sink2)
    return m_new, tl.fma(l, w_a, w_b), acc * w_a[:, None]


@triton.jit
def state_normalize(acc, l_i, m_i):
    """Turn a raw state (an online-softmax accumulator, or a fold of them) into a normalized one.

    acc: [BM, D] fp32 un-normalized sum p @ v; l_i: [BM] fp32 sum of p; m_i: [BM] fp32 running max
    of the scores in log2 units. Returns (o [BM, D] fp32, lse2 [BM] fp32), lse2 in log2 units.
    """
    # NOTE: l_i == 0 exactly iff every key of the row was masked (the row's max key contributes
    # exp2(0) = 1). Such a state is empty: lse = -inf and o = 0, never 0/0.
    is_empty = l_i == 0.0
    l_safe = tl.where(is_empty, 1.0, l_i)
    o = acc / l_safe[:, None]
    o = tl.where(is_empty[:, None], 0.0, o)
    lse2 = tl.where(is_empty, float("-inf"), m_i + tl.log2(l_safe))
    return o, lse2


@triton.jit
def state_merge(o_a, lse_a, o_b, lse_b):
    """Merge normalized state b into state a (FlashInfer-style ``state_merge``), a then b.

    o_a, o_b: [BM, D] fp32; lse_a, lse_b: [BM] fp32, natural log. Returns (o [BM, D] fp32,
    lse [BM] fp32).
    """
    a_empty = lse_a == float("-inf")
    b_empty = lse_b == float("-inf")
    m = tl.maximum(lse_a, lse_b)
    # NOTE: guard exp(-inf - -inf) = NaN when both are empty.
    m_safe = tl.where(a_empty & b_empty, 0.0, m)
    w_a = tl.exp(lse_a - m_safe)
    w_b = tl.exp(lse_b - m_safe)
    w = w_a + w_b
    w_safe = tl.where(w == 0.0, 1.0, w)
    c_a = w_a / w_safe
    c_b = w_b / w_safe
    # NOTE: an explicit fma leaves the compiler no contraction choice.
    o = tl.fma(o_a, c_a[:, None], o_b * c_b[:, None])
    lse = m_safe + tl.log(w_safe)
    # NOTE: merging an empty state must be an exact no-op. Select instead of relying on 0 * o: the
    # o of an empty state may be garbage (NaN), and exp/log round-trips are not exact.
    o = tl.where(b_empty[:, None], o_a, tl.where(a_empty[:, None], o_b, o))
    lse = tl.where(b_empty, lse_a, tl.where(a_empty, lse_b, lse))
    return o, lse


@triton.jit
def _merge_states_kernel(
    # Inputs
    o_ptr,  # [N, S, H, D] any float, last dim contiguous
    lse_ptr,  # [N, S, H] fp32 natural log
    # Outputs
    out_ptr,  # [N, H, D] fp32
    out_lse_ptr,  # [N, H] fp32
    # Scalars
    H,
    S,
    D,
    stride_on: tl.int64,
    stride_os: tl.int64,
    stride_oh: tl.int64,
    stride_ln: tl.int64,
    stride_ls: tl.int64,
    stride_lh: tl.int64,
    # Constexprs
    BLOCK_D: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    i_n = tl.program_id(0).to(tl.int64)
    i_hb = tl.program_id(1)
    o_h = i_hb * BLOCK_H + tl.arange(0, BLOCK_H)
    o_d = tl.arange(0, BLOCK_D)
    m_h = o_h < H
    m_hd = m_h[:, None] & (o_d[None, :] < D)
    b_o = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)
    b_lse = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    # Rows that met a NaN or +inf partial LSE (see merge_states: such a row comes out NaN).
    b_bad = tl.zeros([BLOCK_H], dtype=tl.int1)
    for i_s in range(0, S):
        # [BH, D]
        p_o = o_ptr + i_n * stride_on + i_s * stride_os + o_h[:, None] * stride_oh + o_d[None, :]
        b_os = tl.load(p_o, mask=m_hd, other=0.0).to(tl.float32)
        # [BH]
        p_l = lse_ptr + i_n * stride_ln + i_s * stride_ls + o_h * stride_lh
        b_ls = tl.load(p_l, mask=m_h, other=float("-inf")).to(tl.float32)
        b_bad = b_bad | (b_ls != b_ls) | (b_ls == float("inf"))
        b_o, b_lse = state_merge(b_o, b_lse, b_os, b_ls)
    # NOTE: a select after the fold, so rows without NaN/+inf keep the bits of the state_merge
    # fold (state_merge alone would let a +inf partial after empty ones through).
    b_o = tl.where(b_bad[:, None], float("nan"), b_o)
    b_lse = tl.where(b_bad, float("nan"), b_lse)
    p_out = out_ptr + (i_n * H + o_h[:, None]) * D + o_d[None, :]
    tl.store(p_out, b_o, mask=m_hd)
    tl.store(out_lse_ptr + i_n * H + o_h, b_lse, mask=m_h)
