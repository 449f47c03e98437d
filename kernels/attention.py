"""The public entry point: :func:`unified_attention`, paged attention over a varlen batch of
prefill and decode requests in one call (kernels/README.md has the math and the contract).

It checks its arguments (:mod:`kernels._checks`), plans the launch (:mod:`kernels.plan`) and
launches it (:mod:`kernels.launch`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from kernels import _interpreter
from kernels._checks import _LOG2E, _check_sm_scale
from kernels._device import _interpreting
from kernels.config import DEFAULT_SPLIT_SIZE
from kernels.launch import _launch_fused, _launch_split
from kernels.plan import PLANS, HostStats, LaunchPlan, Tuning, _plan_call, plan_attention

__all__ = ["PLANS", "HostStats", "LaunchPlan", "Tuning", "plan_attention", "unified_attention"]



def unified_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    kv_lens: torch.Tensor,
    block_table: torch.Tensor,
    *,
    sm_scale: float | None = None,
    split_size: int | None = DEFAULT_SPLIT_SIZE,
    lead_split_size: int | None = None,
    plan: str = "auto",
    validate: bool = True,
    tuning: Tuning | None = None,
    host_lens: tuple[Sequence[int], Sequence[int]] | None = None,
    window_left: int = -1,
    sinks: torch.Tensor | None = None,
    logits_soft_cap: float = 0.0,
    k_scale: float | torch.Tensor | None = None,
    v_scale: float | torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal attention of a varlen batch of requests over a paged KV cache.

    ``B`` requests with ``T`` query tokens in total; ``Hq`` query heads, ``Hkv`` KV heads
    (``G = Hq / Hkv`` query heads per KV head), head dim ``D`` (64, 128 or 256).

    Args:
        q: ``[T, Hq, D]`` queries, requests concatenated (float16, bfloat16 or float32), last dim
            contiguous.
        k_cache, v_cache: ``[num_pages, page_size, Hkv, D]``, q's dtype, or both
            ``torch.float8_e4m3fn`` with float16 / bfloat16 q (an FP8 cache, see
            ``k_scale``); ``Hq % Hkv == 0``, ``page_size`` a power of two.
        cu_seqlens_q: ``[B + 1]`` int32 query offsets: 0, non-decreasing, last == T.
        kv_lens: ``[B]`` int32 KV length of each request, ``kv_lens[b] >= q_len[b]``. Query token
            i of request b sits at position ``kv_lens[b] - q_len[b] + i`` and sees ``[0, pos]``.
        block_table: ``[B, max_pages]`` int32, logical page -> physical page of ``k/v_cache``;
            only the first ``ceil(kv_lens[b] / page_size)`` entries of row b are read.
        sm_scale: softmax scale, a finite positive real (``sm_scale * log2(e)`` a normal
            float32); default ``1 / sqrt(D)``.
        split_size: KV tokens per split, a positive multiple of the tile config's BLOCK_N
            (``kernels.tile_config``: 16 to 128 keys by dtype, head dim and GPU; bit-defining:
            every row reduces over tiles and splits at absolute positions).
            ``None`` is the CONTROL mode: the split count comes from the batch (FA2 heuristic),
            deliberately not batch-invariant.
        lead_split_size: KV tokens per lead split: the first ``split_size`` tokens of every row
            are cut into splits of this size (bit-defining, absolute positions like the rest;
            kernels/README.md, "Lead splits"), so that a short row runs as several programs and
            a merge. A positive multiple of BLOCK_N that divides ``split_size``; a multiple of
            BLOCK_N of at least ``split_size`` keeps one split size. ``None``:
            :data:`~kernels.config.DEFAULT_LEAD_SPLIT_SIZE` (128) with a split size of 1024
            (the default, or passed explicitly: ``lead_split_size=1024`` gives one size
            there), else one split size (``split_size=N`` alone, N other than 1024, means
            splits of N). Checked, but without effect, in the control mode.
        plan: ``"fused"``, ``"split"`` or ``"auto"``. All plans give identical bits for a given
            split size; ``"auto"`` picks the faster one for the batch (see ``plan_attention``).
        validate: read ``cu_seqlens_q``, ``kv_lens`` and ``block_table`` back to the host (one
            sync) and check every value; skipped while a CUDA graph is being captured. Type,
            shape, dtype and device checks always run. With ``validate=False`` the values are
            trusted (kernels/README.md, "Validation and what validate=False trusts"):
            malformed values give garbage rows but never an out-of-bounds access.
        tuning: launch-setting overrides (:class:`Tuning`; its docstring says which are
            bit-neutral). Default: :func:`~kernels.config.batch_tuning` (shapes only).
        host_lens: optional host copies ``(q_lens, kv_lens)`` of the batch's lengths (an engine
            has them before it launches or captures a CUDA graph): they steer ``plan="auto"``
            when the lengths are not read back (``validate=False`` or during capture), without a
            sync. Speed only: plans are bit-identical, and memory sizes never come from them.

        window_left: sliding window: a query at position ``p`` sees keys ``[p - window_left,
            p]`` (``-1``: no window, ``[0, p]``). Tiles and splits wholly outside a row's window
            are skipped, by the row's position alone.
        sinks: ``[Hq]`` float32 attention-sink logits (gpt-oss style), or None: each row's
            softmax denominator gains ``exp(sink[h])``, once, after every split: ``out =
            sum_j p_j v_j / (sum_j p_j + exp(sink - m))``.
        logits_soft_cap: ``c > 0`` caps the scores: ``s = c * tanh(sm_scale * q.k / c)``
            before the softmax (0: none).
        k_scale, v_scale: an FP8 cache's dequantization scales: a positive real (per tensor)
            or a ``[Hkv]`` float32 tensor (per KV head); default 1. ``k = k_fp8 * k_scale``
            (folded into the scores' scale), ``out = (sum_j p_j v_fp8_j / l) * v_scale``.
            Only ``None`` or 1.0 for a non-FP8 cache.

    Returns:
        ``(out [T, Hq, D] in q's dtype, lse [T, Hq] float32)``; lse is the natural log of the
        softmax denominator, ``sum exp(s_j)`` over the keys a row sees (plus ``exp(sink)`` with
        sinks). A row attending to nothing gets ``out = 0, lse = -inf``.

    Raises:
        ValueError: naming the argument, the expected and the actual value.
    """
    scale = _check_sm_scale(sm_scale)
    lp, features = _plan_call(q, k_cache, v_cache, cu_seqlens_q, kv_lens, block_table,
                              split_size=split_size, lead_split_size=lead_split_size, plan=plan,
                              validate=validate, tuning=tuning, host_lens=host_lens,
                              window_left=window_left, sinks=sinks,
                              logits_soft_cap=logits_soft_cap, k_scale=k_scale, v_scale=v_scale)
    T, Hq, D = q.shape
    if scale is None:
        scale = 1.0 / math.sqrt(D)
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty((T, Hq), dtype=torch.float32, device=q.device)
    if T == 0:
        return out, lse
    inputs = (q, k_cache, v_cache, cu_seqlens_q.contiguous(), kv_lens.contiguous(), block_table)
    if _interpreting():
        _interpreter.install()
    launch = _launch_fused if lp.plan == "fused" else _launch_split
    launch(lp, inputs, out, lse, scale * _LOG2E, features)
    return out, lse
