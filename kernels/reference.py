"""Plain-torch float64 reference for :func:`kernels.unified_attention` (used by kernel tests)."""

from __future__ import annotations

import math

import torch

__all__ = ["reference_attention"]


def reference_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    kv_lens: torch.Tensor,
    block_table: torch.Tensor,
    *,
    sm_scale: float | None = None,
    out_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as :func:`kernels.unified_attention`, computed per request in float64.

    Shapes: q ``[T, Hq, D]``; k_cache, v_cache ``[num_pages, page_size, Hkv, D]``;
    cu_seqlens_q ``[B + 1]``; kv_lens ``[B]``; block_table ``[B, max_pages]``.
    Returns ``(out [T, Hq, D], lse [T, Hq] float32)``; out is in ``out_dtype`` (default q's
    dtype; pass ``torch.float64`` to keep the exact values), lse in float32 unless out_dtype is
    float64.
    """
    T, Hq, D = q.shape
    _, page_size, Hkv, _ = k_cache.shape
    G = Hq // Hkv
    scale = 1.0 / math.sqrt(D) if sm_scale is None else sm_scale
    out_dtype = q.dtype if out_dtype is None else out_dtype
    lse_dtype = torch.float64 if out_dtype == torch.float64 else torch.float32
    out = torch.zeros((T, Hq, D), dtype=torch.float64, device=q.device)
    lse = torch.full((T, Hq), float("-inf"), dtype=torch.float64, device=q.device)
    cu = cu_seqlens_q.tolist()
    kv = kv_lens.tolist()
    for b in range(len(kv)):
        q0, q1, n_kv = cu[b], cu[b + 1], kv[b]
        q_len = q1 - q0
        if q_len == 0 or n_kv == 0:
            continue
        n_pages = (n_kv + page_size - 1) // page_size
        pages = block_table[b, :n_pages].long()
        k = k_cache[pages].reshape(-1, Hkv, D)[:n_kv].double()  # [N, Hkv, D]
        v = v_cache[pages].reshape(-1, Hkv, D)[:n_kv].double()
        k = k.repeat_interleave(G, dim=1)  # [N, Hq, D]
        v = v.repeat_interleave(G, dim=1)
        qb = q[q0:q1].double()  # [Q, Hq, D]
        s = torch.einsum("qhd,nhd->hqn", qb, k) * scale  # [Hq, Q, N]
        pos = torch.arange(n_kv - q_len, n_kv, device=q.device)
        mask = torch.arange(n_kv, device=q.device)[None, :] <= pos[:, None]  # [Q, N]
        s = s.masked_fill(~mask[None], float("-inf"))
        row_lse = torch.logsumexp(s, dim=-1)  # [Hq, Q]
        p = torch.exp(s - row_lse[..., None])
        out[q0:q1] = torch.einsum("hqn,nhd->qhd", p, v)
        lse[q0:q1] = row_lse.transpose(0, 1)
    return out.to(out_dtype), lse.to(lse_dtype)
