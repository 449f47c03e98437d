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
    window_left: int = -1,
    sinks: torch.Tensor | None = None,
    logits_soft_cap: float = 0.0,
    k_scale: float | torch.Tensor | None = None,
    v_scale: float | torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as :func:`kernels.unified_attention`, computed per request in float64,
    features included: a window (keys ``[p - window_left, p]``), sinks (one more term
    ``exp(sink)`` in each row's denominator, and in its LSE), a soft-cap (``c * tanh(s / c)``)
    and an FP8 cache's scales (K and V dequantized exactly in float64).

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
    k_sc = _per_head(k_scale, Hkv, q.device).repeat_interleave(G)  # [Hq]
    v_sc = _per_head(v_scale, Hkv, q.device).repeat_interleave(G)
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
        s = torch.einsum("qhd,nhd->hqn", qb, k) * (scale * k_sc)[:, None, None]  # [Hq, Q, N]
        if logits_soft_cap:
            s = logits_soft_cap * torch.tanh(s / logits_soft_cap)
        pos = torch.arange(n_kv - q_len, n_kv, device=q.device)
        keys = torch.arange(n_kv, device=q.device)[None, :]
        mask = keys <= pos[:, None]  # [Q, N]
        if window_left >= 0:
            mask &= keys >= pos[:, None] - window_left
        s = s.masked_fill(~mask[None], float("-inf"))
        if sinks is not None:  # one more logit per row, with a zero value
            sink = sinks.double()[:, None, None].expand(Hq, q_len, 1)
            s = torch.cat([s, sink], dim=-1)
        row_lse = torch.logsumexp(s, dim=-1)  # [Hq, Q]
        p = torch.exp(s - row_lse[..., None])[..., :n_kv]
        out[q0:q1] = torch.einsum("hqn,nhd->qhd", p, v) * v_sc[None, :, None]
        lse[q0:q1] = row_lse.transpose(0, 1)
    return out.to(out_dtype), lse.to(lse_dtype)


def _per_head(scale: float | torch.Tensor | None, Hkv: int, device: torch.device) -> torch.Tensor:
    """A scale as ``[Hkv]`` float64 (1 when None)."""
    if scale is None:
        return torch.ones(Hkv, dtype=torch.float64, device=device)
    if isinstance(scale, torch.Tensor):
        return scale.to(device=device, dtype=torch.float64)
    return torch.full((Hkv,), float(scale), dtype=torch.float64, device=device)
