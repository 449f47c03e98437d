"""Plain-torch backends: ``sdpa`` (a real library kernel) and the ``torch-batch-variant`` control.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from invariance.backends.reference import gather_kv
from invariance.batch import AttentionBatch, AttentionResult, require_features

__all__ = [
    "ROW_BLOCK_BYTES",
    "DenseBatch",
    "batch_lengths",
    "batch_variant_backend",
    "causal_lse",
    "dense_lse",
    "pad_dense",
    "row_blocks",
    "sdpa_backend",
    "unpad",
]


@dataclass
class DenseBatch:
    """A batch padded to dense per request: request ``b`` in slot ``b`` of ``q`` ``[B, Hq,
    max_q, D]`` and ``k``, ``v`` ``[B, Hkv, max_kv, D]``; ``mask`` ``[B, 1, max_q, max_kv]`` is
    causal + padding (True = attend), with padded query rows attending to key 0 so that no row is
    fully masked (their output is discarded). Host copies of the lengths come along."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    mask: torch.Tensor
    q_lens: list[int]
    kv_lens: list[int]
    cu: list[int]


def batch_lengths(batch: AttentionBatch) -> tuple[list[int], list[int], list[int]]:
    """Host copies ``(q_lens, kv_lens, cu_seqlens_q)`` of ``batch`` (a device sync)."""
    return batch.q_lens(), batch.kv_lens.tolist(), batch.cu_seqlens_q.tolist()


def pad_dense(batch: AttentionBatch) -> DenseBatch | None:
    """``batch`` padded to a :class:`DenseBatch` (``None`` when it has no query token)."""
    q_lens, kv_lens, cu = batch_lengths(batch)
    if batch.num_tokens == 0:
        return None
    B, Hq, D = batch.batch_size, batch.num_q_heads, batch.head_dim
    Hkv = batch.num_kv_heads
    max_q, max_kv = max(q_lens), max(kv_lens)
    dev, dt = batch.device, batch.dtype
    qd = torch.zeros(B, Hq, max_q, D, dtype=dt, device=dev)
    kd = torch.zeros(B, Hkv, max_kv, D, dtype=dt, device=dev)
    vd = torch.zeros(B, Hkv, max_kv, D, dtype=dt, device=dev)
    mask = torch.zeros(B, 1, max_q, max_kv, dtype=torch.bool, device=dev)
    kv_pos = torch.arange(max_kv, device=dev)
    for b in range(B):
        if q_lens[b] == 0:
            continue
        k, v = gather_kv(batch, b, kv_lens[b])  # the host length: no sync
        qd[b, :, : q_lens[b]] = batch.q[cu[b]:cu[b + 1]].transpose(0, 1)
        kd[b, :, : kv_lens[b]] = k.transpose(0, 1)
        vd[b, :, : kv_lens[b]] = v.transpose(0, 1)
        pos = kv_lens[b] - q_lens[b] + torch.arange(q_lens[b], device=dev)
        mask[b, 0, : q_lens[b]] = kv_pos[None, :] <= pos[:, None]
    # Padded query rows attend to key 0 so no row is fully masked (their output is discarded).
    mask[:, :, :, 0] |= ~mask.any(-1)
    return DenseBatch(qd, kd, vd, mask, q_lens, kv_lens, cu)


def dense_lse(dense: DenseBatch, sm_scale: float) -> torch.Tensor:
    """The natural-log LSE ``[B, Hq, max_q]`` of the dense problem, in float32: a separate
    ``logsumexp`` of ``q·kᵀ`` under the same mask (SDPA itself returns no LSE). The ``sdpa-*``
    adapters compute theirs per request in row blocks (:func:`causal_lse`)."""
    G = dense.q.shape[1] // dense.k.shape[1]
    s = torch.matmul(dense.q.float(),
                     dense.k.float().repeat_interleave(G, dim=1).transpose(-1, -2))
    s = (s * sm_scale).masked_fill(~dense.mask, float("-inf"))
    return torch.logsumexp(s, dim=-1)


#: Default budget, in bytes, of the transient memory of one row block of the row-blocked helpers
#: (:func:`causal_lse`, the ``sdpa-*`` adapters of :mod:`invariance.backends.sdpa`).
ROW_BLOCK_BYTES = 1 << 30

#: Float64 ``[Hq, rows, kv_len]`` buffers :func:`causal_lse` counts per block: the scores and
#: the temporaries of ``logsumexp`` (max-shifted scores, their ``exp``).
_LSE_COPIES = 3


def row_blocks(q_len: int, bytes_per_row: int, max_bytes: int) -> list[tuple[int, int]]:
    """Contiguous ``[start, stop)`` blocks covering ``q_len`` query rows, each of
    ``max(1, max_bytes // bytes_per_row)`` rows (the last one shorter): as many rows as fit in
    ``max_bytes`` when one row needs ``bytes_per_row`` transient bytes (one block when that is
    ``<= 0``). A function of its arguments alone; no row is split."""
    if q_len <= 0:
        return []
    rows = q_len if bytes_per_row <= 0 else max(1, max_bytes // bytes_per_row)
    return [(a, min(q_len, a + rows)) for a in range(0, q_len, rows)]


def causal_lse(q: torch.Tensor, k: torch.Tensor, sm_scale: float,
               max_bytes: int | None = None, *, window_left: int = -1,
               sinks: torch.Tensor | None = None) -> torch.Tensor:
    """The natural-log LSE ``[n, Hq]`` (float32) of one request's query rows ``q`` ``[n, Hq, D]``
    over its keys ``k`` ``[L, Hkv, D]`` (query head ``h`` reads key head ``h // (Hq // Hkv)``),
    causal aligned bottom-right: row ``i`` sits at position ``L - n + i`` and sees keys
    ``0 .. L - n + i``.

    Computed in float64 and rounded to float32 once, in contiguous row blocks
    (:func:`row_blocks`) so that the score buffers of a block, ``Hq × rows × L`` float64 a few
    times over, stay under ``max_bytes`` (default :data:`ROW_BLOCK_BYTES`; at least one row per
    block): it never materialises ``Hq × n × L`` at once beyond that budget. Every block reads
    all ``L`` keys with its rows of the causal mask.

    Why float64: this LSE is the adapter's, not the kernel's, and it must not make a kernel look
    batch-variant. A matrix product's rounding depends on its row count (the block, the chunk a
    schedule computes), which moved float32 results by 1-2 ULP between schedules on an H100;
    in float64 such differences are ~2^-29 of a float32 ULP and vanish in the final rounding
    unless a value sits that close to a rounding boundary. Besides the blocks it keeps one
    float64 copy of ``k`` (``L × Hkv × D``). No host sync. ``n == 0`` gives an empty
    ``[0, Hq]``.

    ``window_left >= 0`` also masks the keys before ``pos - window_left``; ``sinks`` ``[Hq]``
    joins each row's sum (``lse = log(sum exp(s) + exp(sink))``, the contract of
    :class:`~invariance.AttentionBatch`)."""
    n, Hq, D = q.shape
    L, Hkv = k.shape[0], k.shape[1]
    G = Hq // Hkv
    budget = ROW_BLOCK_BYTES if max_bytes is None else max_bytes
    out = torch.empty(n, Hq, dtype=torch.float32, device=q.device)
    if n == 0:
        return out
    kf = k.double().transpose(0, 1).contiguous()  # [Hkv, L, D]
    for a, b in row_blocks(n, L * (Hq * 8 * _LSE_COPIES + 1), budget):
        r = b - a
        qb = q[a:b].double().reshape(r, Hkv, G, D).permute(1, 2, 0, 3).reshape(Hkv, G * r, D)
        s = torch.matmul(qb, kf.transpose(-1, -2)).view(Hkv, G, r, L)
        s.mul_(sm_scale)
        # Row a + i sits at L - n + a + i: the keys after it are masked (and, with a window,
        # those before L - n + a + i - window_left).
        masked = torch.ones(r, L, dtype=torch.bool, device=q.device).triu_(L - n + a + 1)
        if window_left >= 0:
            masked |= torch.ones(r, L, dtype=torch.bool, device=q.device).tril_(
                L - n + a - window_left - 1)
        s.masked_fill_(masked, float("-inf"))
        lse = torch.logsumexp(s, dim=-1)  # [Hkv, G, r]
        if sinks is not None:
            lse = torch.logaddexp(lse, sinks.to(torch.float64).view(Hkv, G, 1))
        out[a:b] = lse.reshape(Hq, r).transpose(0, 1).float()
    return out


def unpad(batch: AttentionBatch, dense: DenseBatch | None, o: torch.Tensor | None,
          ls: torch.Tensor | None) -> AttentionResult:
    """Rows of the dense output ``o`` ``[B, Hq, max_q, D]`` and LSE ``ls`` ``[B, Hq, max_q]``
    back in the batch's row order (zeros and ``-inf`` when the batch has no token)."""
    out = torch.zeros_like(batch.q)
    lse = torch.full((batch.num_tokens, batch.num_q_heads), float("-inf"), dtype=torch.float32,
                     device=batch.device)
    if dense is None or o is None or ls is None:
        return AttentionResult(out, lse)
    cu = dense.cu
    for b in range(len(dense.q_lens)):
        if dense.q_lens[b]:
            out[cu[b]:cu[b + 1]] = o[b, :, : dense.q_lens[b]].transpose(0, 1)
            lse[cu[b]:cu[b + 1]] = ls[b, :, : dense.q_lens[b]].transpose(0, 1)
    return AttentionResult(out, lse)


def sdpa_backend(batch: AttentionBatch) -> AttentionResult:
    """torch ``scaled_dot_product_attention`` on the batch padded to a dense
    ``[B, H, max_q, max_kv]`` problem with a boolean causal + padding mask, as a server without
    paged attention would call it. SDPA does not return the LSE, so ``lse`` is computed by a
    separate float32 ``logsumexp`` of ``q·kᵀ`` over the same padded batch. Takes no attention
    feature (a batch using one is refused).
    """
    require_features(batch, frozenset(), "sdpa")
    dense = pad_dense(batch)
    if dense is None:
        return unpad(batch, None, None, None)
    o = F.scaled_dot_product_attention(dense.q, dense.k, dense.v, attn_mask=dense.mask,
                                       scale=batch.sm_scale,
                                       enable_gqa=batch.num_q_heads != batch.num_kv_heads)
    return unpad(batch, dense, o, dense_lse(dense, batch.sm_scale))


def batch_variant_backend(batch: AttentionBatch) -> AttentionResult:
    """CONTROL, deliberately NOT batch-invariant: float32 online-softmax attention whose KV chunk
    size is derived from the batch (``max(2, 128 // (batch_size * Hkv))`` tokens), the way
    split-KV heuristics pick their split from batch statistics. Accurate, deterministic, and
    different in the last bits when the batch around a request changes. Takes no attention
    feature (a batch using one is refused).
    """
    require_features(batch, frozenset(), "torch-batch-variant")
    Hq, D, Hkv = batch.num_q_heads, batch.head_dim, batch.num_kv_heads
    G = Hq // Hkv
    chunk = max(2, 128 // max(1, batch.batch_size * Hkv))
    out = torch.zeros_like(batch.q)
    lse = torch.full((batch.num_tokens, Hq), float("-inf"), dtype=torch.float32,
                     device=batch.device)
    cu = batch.cu_seqlens_q.tolist()
    kv_lens = batch.kv_lens.tolist()
    for b in range(batch.batch_size):
        n = cu[b + 1] - cu[b]
        if n == 0:
            continue
        k, v = gather_kv(batch, b)
        k = k.float().repeat_interleave(G, dim=1).transpose(0, 1)  # [Hq, L, D]
        v = v.float().repeat_interleave(G, dim=1).transpose(0, 1)
        q = batch.q[cu[b]:cu[b + 1]].float().transpose(0, 1) * batch.sm_scale  # [Hq, n, D]
        pos = kv_lens[b] - n + torch.arange(n, device=batch.device)
        m = torch.full((Hq, n), float("-inf"), device=batch.device)
        l = torch.zeros(Hq, n, device=batch.device)
        acc = torch.zeros(Hq, n, D, device=batch.device)
        for j in range(0, kv_lens[b], chunk):
            s = q @ k[:, j:j + chunk].transpose(1, 2)  # [Hq, n, c]
            cols = j + torch.arange(s.shape[-1], device=batch.device)
            s = s.masked_fill(cols[None, None, :] > pos[None, :, None], float("-inf"))
            m_new = torch.maximum(m, s.max(-1).values)
            m_safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
            alpha = torch.exp(m - m_safe)
            p = torch.exp(s - m_safe[..., None])
            l = l * alpha + p.sum(-1)
            acc = acc * alpha[..., None] + p @ v[:, j:j + chunk]
            m = m_new
        out[cu[b]:cu[b + 1]] = (acc / l[..., None]).transpose(0, 1).to(batch.dtype)
        lse[cu[b]:cu[b + 1]] = (m + torch.log(l)).transpose(0, 1)
    return AttentionResult(out, lse)
