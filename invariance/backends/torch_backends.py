"""Plain-torch backends: ``sdpa`` (a real library kernel) and the ``torch-batch-variant`` control.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from invariance.backends.reference import gather_kv
from invariance.batch import AttentionBatch, AttentionResult

__all__ = ["batch_variant_backend", "sdpa_backend"]


def sdpa_backend(batch: AttentionBatch) -> AttentionResult:
    """torch ``scaled_dot_product_attention`` on the batch padded to a dense
    ``[B, H, max_q, max_kv]`` problem with a boolean causal + padding mask, as a server without
    paged attention would call it. SDPA does not return the LSE, so ``lse`` is computed by a
    separate float32 ``logsumexp`` of ``q·kᵀ`` over the same padded batch.
    """
    B, Hq, D = batch.batch_size, batch.num_q_heads, batch.head_dim
    Hkv = batch.num_kv_heads
    q_lens = batch.q_lens()
    kv_lens = batch.kv_lens.tolist()
    out = torch.zeros_like(batch.q)
    lse = torch.full((batch.num_tokens, Hq), float("-inf"), dtype=torch.float32,
                     device=batch.device)
    if batch.num_tokens == 0:
        return AttentionResult(out, lse)
    max_q, max_kv = max(q_lens), max(kv_lens)
    dev, dt = batch.device, batch.dtype
    qd = torch.zeros(B, Hq, max_q, D, dtype=dt, device=dev)
    kd = torch.zeros(B, Hkv, max_kv, D, dtype=dt, device=dev)
    vd = torch.zeros(B, Hkv, max_kv, D, dtype=dt, device=dev)
    mask = torch.zeros(B, 1, max_q, max_kv, dtype=torch.bool, device=dev)
    cu = batch.cu_seqlens_q.tolist()
    kv_pos = torch.arange(max_kv, device=dev)
    for b in range(B):
        if q_lens[b] == 0:
            continue
        k, v = gather_kv(batch, b)
        qd[b, :, : q_lens[b]] = batch.q[cu[b]:cu[b + 1]].transpose(0, 1)
        kd[b, :, : kv_lens[b]] = k.transpose(0, 1)
        vd[b, :, : kv_lens[b]] = v.transpose(0, 1)
        pos = kv_lens[b] - q_lens[b] + torch.arange(q_lens[b], device=dev)
        mask[b, 0, : q_lens[b]] = kv_pos[None, :] <= pos[:, None]
    # Padded query rows attend to key 0 so no row is fully masked (their output is discarded).
    mask[:, :, :, 0] |= ~mask.any(-1)
    o = F.scaled_dot_product_attention(qd, kd, vd, attn_mask=mask, scale=batch.sm_scale,
                                       enable_gqa=Hq != Hkv)
    G = Hq // Hkv
    s = torch.matmul(qd.float(), kd.float().repeat_interleave(G, dim=1).transpose(-1, -2))
    s = (s * batch.sm_scale).masked_fill(~mask, float("-inf"))
    ls = torch.logsumexp(s, dim=-1)  # [B, Hq, max_q]
    for b in range(B):
        if q_lens[b]:
            out[cu[b]:cu[b + 1]] = o[b, :, : q_lens[b]].transpose(0, 1)
            lse[cu[b]:cu[b + 1]] = ls[b, :, : q_lens[b]].transpose(0, 1)
    return AttentionResult(out, lse)


def batch_variant_backend(batch: AttentionBatch) -> AttentionResult:
    """CONTROL, deliberately NOT batch-invariant: float32 online-softmax attention whose KV chunk
    size is derived from the batch (``max(2, 128 // (batch_size * Hkv))`` tokens), the way
    split-KV heuristics pick their split from batch statistics. Accurate, deterministic, and
    different in the last bits when the batch around a request changes.
    """
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
