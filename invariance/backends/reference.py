"""The float64 reference backend: one query row at a time, invariant by construction.

Every row is computed from its own query and the K/V prefix ``[0, pos]`` of its request, with
tensor shapes that depend on ``pos`` alone, so no batch property can reach its arithmetic. It is
both a backend that must pass every perturbation and the accuracy oracle of :func:`check`.
"""

from __future__ import annotations

import torch

from invariance.backends import Capabilities
from invariance.batch import AttentionBatch, AttentionResult, dequantize
from invariance.features import FEATURE_NAMES

__all__ = ["gather_kv", "reference_backend", "reference_rows"]


def gather_kv(batch: AttentionBatch, b: int,
              kv_len: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V of request ``b`` of ``batch``, ``[kv_len, Hkv, D]`` each, gathered from its first
    ``ceil(kv_len / page_size)`` pages. ``kv_len`` is the host copy of ``batch.kv_lens[b]``
    when the caller has it (then no sync: CUDA-graph safe); default: read it from the device."""
    if kv_len is None:
        kv_len = int(batch.kv_lens[b])
    P = batch.page_size
    needed = -(-kv_len // P)
    pages = batch.block_table[b, :needed].long()
    Hkv, D = batch.num_kv_heads, batch.head_dim
    k = batch.k_cache[pages].reshape(-1, Hkv, D)[:kv_len]
    v = batch.v_cache[pages].reshape(-1, Hkv, D)[:kv_len]
    return k, v


def reference_rows(
    q: torch.Tensor,
    positions: list[int],
    k: torch.Tensor,
    v: torch.Tensor,
    sm_scale: float,
    *,
    window_left: int = -1,
    sinks: torch.Tensor | None = None,
    logits_soft_cap: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal attention of query rows ``q`` ``[n, Hq, D]`` at absolute ``positions`` over ``k``,
    ``v`` ``[L, Hkv, D]`` (row ``i`` sees ``[0, positions[i]]``), in float64.

    The features of :class:`~invariance.AttentionBatch` (its docstring has the math):
    ``window_left >= 0`` limits row ``i`` to ``[max(0, pos - window_left), pos]``;
    ``logits_soft_cap > 0`` replaces each score ``s`` by ``cap * tanh(s / cap)``; ``sinks``
    ``[Hq]`` adds ``exp(sink)`` to every row's denominator (and the LSE includes it). ``k`` and
    ``v`` are what the attention sees (dequantize an FP8 cache first:
    :func:`invariance.batch.dequantize`).

    Returns ``out`` ``[n, Hq, D]`` and ``lse`` ``[n, Hq]``, both float64.
    """
    n, Hq, D = q.shape
    Hkv = k.shape[1]
    G = Hq // Hkv
    out = torch.zeros(n, Hq, D, dtype=torch.float64, device=q.device)
    lse = torch.full((n, Hq), float("-inf"), dtype=torch.float64, device=q.device)
    sink = None if sinks is None else sinks.to(device=q.device, dtype=torch.float64).view(Hkv, G)
    for i, pos in enumerate(positions):
        lo = max(0, pos - window_left) if window_left >= 0 else 0
        kk = k[lo: pos + 1].to(torch.float64)  # [L, Hkv, D]
        vv = v[lo: pos + 1].to(torch.float64)
        qq = q[i].to(torch.float64).view(Hkv, G, D)
        s = (kk[:, :, None, :] * qq[None]).sum(-1) * sm_scale  # [L, Hkv, G]
        if logits_soft_cap > 0:
            s = logits_soft_cap * torch.tanh(s / logits_soft_cap)
        m = s.amax(0)
        if sink is not None:
            m = torch.maximum(m, sink)
        p = torch.exp(s - m)
        denom = p.sum(0)
        if sink is not None:
            denom = denom + torch.exp(sink - m)
        o = (p[..., None] * vv[:, :, None, :]).sum(0) / denom[..., None]  # [Hkv, G, D]
        out[i] = o.reshape(Hq, D)
        lse[i] = (m + torch.log(denom)).reshape(Hq)
    return out, lse


def reference_backend(batch: AttentionBatch) -> AttentionResult:
    """Float64 attention of every row of ``batch``, one row at a time (see module docstring),
    with every feature of the batch (window, sinks, soft-cap, FP8 dequantization). The batch is
    validated first: the oracle never indexes out of bounds."""
    batch.validate()
    out = torch.zeros_like(batch.q)
    lse = torch.full((batch.num_tokens, batch.num_q_heads), float("-inf"),
                     dtype=torch.float32, device=batch.device)
    cu = batch.cu_seqlens_q.tolist()
    kv_lens = batch.kv_lens.tolist()
    for b in range(batch.batch_size):
        lo, hi = cu[b], cu[b + 1]
        if hi == lo:
            continue
        k, v = gather_kv(batch, b)
        first = kv_lens[b] - (hi - lo)
        o, s = reference_rows(batch.q[lo:hi], list(range(first, kv_lens[b])),
                              dequantize(k, batch.k_scale), dequantize(v, batch.v_scale),
                              batch.sm_scale, window_left=batch.window_left, sinks=batch.sinks,
                              logits_soft_cap=float(batch.logits_soft_cap))
        out[lo:hi] = o.to(batch.dtype)
        lse[lo:hi] = s.to(torch.float32)
    return AttentionResult(out, lse)


#: The reference takes every feature.
reference_backend.capabilities = Capabilities(  # type: ignore[attr-defined]
    features=frozenset(FEATURE_NAMES))
