"""Launchers: a :class:`~kernels.plan.LaunchPlan` turned into grids and kernel arguments
(kernels/README.md, "Layers"). No checks and no choices here: the plan made them."""

from __future__ import annotations

from typing import Any

import torch
import triton

from kernels._checks import _LOG2E, Features
from kernels._device import _interpreting
from kernels._triton.attention_kernels import (
    _merge_splits_kernel,
    _slot_keys_kernel,
    _slot_rank_kernel,
    _unified_attention_fused_kernel,
    _unified_attention_split_kernel,
)
from kernels.plan import LaunchPlan

__all__: list[str] = []

_PLAIN = Features()

# Split partials the merge kernel loads per step (their loads are in flight together; 1 under the
# interpreter, where it only costs time: the chunk size never changes the merge order).
_MERGE_CHUNK = 8
# Head-dim columns and query heads per merge program on a GPU. Every column runs the same
# arithmetic, so the blocks are bit-neutral; the values are the measured fastest
# (reports/<gpu>/, CHANGELOG.md).
_MERGE_BLOCK_D = 128
_MERGE_BLOCK_H = 1
_MERGE_NUM_WARPS = 1
# Keys the slot-rank kernel compares per step (the fused plan's slot order).
_RANK_BLOCK = 1024
_RANK_NUM_WARPS = 4


def _merge_block_d(head_dim: int) -> int:
    """Head-dim columns per merge program (the whole head under the interpreter: fewer programs)."""
    return head_dim if _interpreting() else min(_MERGE_BLOCK_D, head_dim)


def _merge_block_h(num_q_heads: int) -> int:
    """Query heads per merge program (every head under the interpreter: fewer programs)."""
    return triton.next_power_of_2(num_q_heads) if _interpreting() else _MERGE_BLOCK_H


def _merge_chunk() -> int:
    """Split partials the merge kernel loads per step."""
    return 1 if _interpreting() else _MERGE_CHUNK



def _k_rows(lp: LaunchPlan, dtype: torch.dtype) -> bool:
    """``IS_K_ROWS``: load K as ``[BLOCK_N, D]`` rows like V (the same keys per thread, so the
    page ids and slots of a thread's keys serve both loads; the dot reads it transposed) rather
    than as ``[D, BLOCK_N]`` columns. Bit-neutral: the same values reach the same dot. Rows in
    the split kernel, in fused tiles of up to 64 rows and in the nested loop; columns in the
    fused kernel's other wide tiles and for float32 (FMA dots): the faster of the two measured
    per case."""
    return dtype != torch.float32 and (lp.plan == "split" or lp.block_m <= 64 or lp.nested_loop)


def _feature_args(f: Features, dummy: torch.Tensor) -> dict[str, Any]:
    """The features' kernel arguments: their tensors (``dummy``, never read, where a feature is
    off), scalars and ``HAS_*`` constexprs."""
    return dict(
        # log2 units, one float32 rounding here (see _row_features' NOTE).
        sinks_ptr=dummy if f.sinks is None else f.sinks * _LOG2E,
        k_scale_ptr=dummy if f.k_scale is None else f.k_scale,
        v_scale_ptr=dummy if f.v_scale is None else f.v_scale,
        window_left=max(f.window_left, 0), cap=f.soft_cap or 1.0,
        HAS_WINDOW=f.window_left >= 0, HAS_SINKS=f.sinks is not None,
        HAS_SOFTCAP=f.soft_cap > 0, HAS_KV_SCALE=f.k_scale is not None,
    )


def _attention_args(lp: LaunchPlan, q: torch.Tensor, k_cache: torch.Tensor,
                    v_cache: torch.Tensor, block_table: torch.Tensor,
                    qk_scale: float, features: Features) -> dict[str, Any]:
    """Scalar, stride and constexpr arguments shared by the fused and the split kernels."""
    T, Hq, D = q.shape
    num_pages, page_size, Hkv, _ = k_cache.shape
    return dict(
        **_feature_args(features, q),
        qk_scale=qk_scale, split_tiles=lp.split_tiles, lead_tiles=lp.lead_tiles,
        B=block_table.shape[0], T=T, Hq=Hq,
        num_pages=num_pages, max_kv_len=block_table.shape[1] * page_size,
        stride_qt=q.stride(0), stride_qh=q.stride(1),
        stride_kp=k_cache.stride(0), stride_ks=k_cache.stride(1), stride_kh=k_cache.stride(2),
        stride_vp=v_cache.stride(0), stride_vs=v_cache.stride(1), stride_vh=v_cache.stride(2),
        stride_bt=block_table.stride(0),
        G=Hq // Hkv, HEAD_DIM=D, PAGE_SIZE=page_size, PAGE_SHIFT=page_size.bit_length() - 1,
        BLOCK_M=lp.block_m, BLOCK_Q=lp.block_q, BLOCK_N=lp.block_n,
        IS_PAGE_PER_TILE=page_size >= lp.block_n, IS_K_ROWS=_k_rows(lp, q.dtype),
        IS_INTERPRET=_interpreting(),
        # NOTE: fp32 must not silently run in tf32: "ieee" is exact fp32 FMA.
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        num_warps=lp.num_warps, num_stages=lp.num_stages,
    )


def _launch_fused(lp: LaunchPlan, inputs: tuple[torch.Tensor, ...], out: torch.Tensor,
                  lse: torch.Tensor, qk_scale: float, features: Features = _PLAIN) -> None:
    """One program per (query-block slot, KV head): all splits, merged in registers. With
    ``lp.slot_order`` the slots are first sorted on the device, requests with the most KV first
    and each request's last blocks first (``_slot_keys_kernel``, then ``_slot_rank_kernel``:
    two small launches, no sync, so CUDA graphs capture them), and program i takes slot
    ``order[i]`` (a sort in two launches: faster than ``torch.argsort`` here)."""
    q, k_cache, v_cache, cu_seqlens_q, kv_lens, block_table = inputs
    T, Hq, _ = q.shape
    Hkv = k_cache.shape[2]
    order = cu_seqlens_q  # not read without lp.slot_order
    if lp.slot_order:
        keys = torch.empty(lp.num_slots, dtype=torch.int64, device=q.device)
        _slot_keys_kernel[(lp.num_slots,)](
            cu_seqlens_q, kv_lens, keys, kv_lens.shape[0], T,
            block_table.shape[1] * k_cache.shape[1], G=Hq // Hkv, BLOCK_M=lp.block_m,
            BLOCK_Q=lp.block_q, BLOCK_N=lp.block_n, num_warps=1)
        order = torch.empty(lp.num_slots, dtype=torch.int32, device=q.device)
        _slot_rank_kernel[(lp.num_slots,)](keys, order, lp.num_slots, BLOCK=_RANK_BLOCK,
                                           num_warps=_RANK_NUM_WARPS)
    if lp.gluon:
        from kernels._gluon import launch_fused_prefill

        launch_fused_prefill(q, k_cache, v_cache, cu_seqlens_q, kv_lens, block_table, order, out,
                             lse, qk_scale, num_slots=lp.num_slots, split_tiles=lp.split_tiles,
                             block_m=lp.block_m, block_q=lp.block_q, block_n=lp.block_n,
                             is_slot_order=lp.slot_order, lead_tiles=lp.lead_tiles)
        return
    _unified_attention_fused_kernel[(lp.num_slots, Hkv)](
        q_ptr=q, k_ptr=k_cache, v_ptr=v_cache, cu_seqlens_q_ptr=cu_seqlens_q,
        kv_lens_ptr=kv_lens, block_table_ptr=block_table, slot_order_ptr=order, out_ptr=out,
        lse_ptr=lse,
        IS_SLOT_ORDER=lp.slot_order, IS_NESTED=lp.nested_loop, TILES_PER_STEP=lp.tiles_per_step,
        **_attention_args(lp, q, k_cache, v_cache, block_table, qk_scale, features))


def _launch_split(lp: LaunchPlan, inputs: tuple[torch.Tensor, ...], out: torch.Tensor,
                  lse: torch.Tensor, qk_scale: float, features: Features = _PLAIN) -> None:
    """One program per (query-block slot, KV head x V column block, split) writes a partial;
    then the merge. With
    one split per row (``num_splits == 1``: from checked lengths or the block table's bound) the
    programs write the results themselves and there is no merge (same bits, see the kernel)."""
    q, k_cache, v_cache, cu_seqlens_q, kv_lens, block_table = inputs
    T, Hq, D = q.shape
    Hkv = k_cache.shape[2]
    direct = lp.num_splits == 1
    if direct:
        ws_o, ws_ml = out, lse  # not read: the kernel writes out and lse
    else:
        # NOTE: uninitialised on purpose. Each row only reads the partials of splits at or below
        # its position, and those are always written.
        ws_o = torch.empty((T, Hq, lp.num_splits, D), dtype=torch.float32, device=q.device)
        ws_ml = torch.empty((T, Hq, lp.num_splits, 2), dtype=torch.float32, device=q.device)
    if lp.keys_rows:
        from kernels._gluon import launch_split_kt

        launch_split_kt(q, k_cache, v_cache, cu_seqlens_q, kv_lens, block_table, ws_o, ws_ml,
                        out, lse, qk_scale, num_slots=lp.num_slots, num_splits=lp.num_splits,
                        split_tiles=lp.split_tiles, block_q=lp.block_q, direct=direct,
                        value_blocks=lp.value_blocks, stages=lp.num_stages,
                        scores_ahead=lp.scores_ahead, dependent_merge=lp.dependent_merge,
                        lead_tiles=lp.lead_tiles, walk=lp.walk_lead,
                        walk_splits=lp.walk_splits, block_n=lp.block_n)
        if not direct:
            _launch_merge(lp, ws_o, ws_ml, inputs, out, lse, features)
        return
    if lp.gluon:
        from kernels._gluon import launch_split

        launch_split(q, k_cache, v_cache, cu_seqlens_q, kv_lens, block_table, ws_o, ws_ml, out,
                     lse, qk_scale, num_slots=lp.num_slots, num_splits=lp.num_splits,
                     split_tiles=lp.split_tiles, block_m=lp.block_m, block_q=lp.block_q,
                     block_n=lp.block_n, direct=direct, value_blocks=lp.value_blocks,
                     dependent_merge=lp.dependent_merge, lead_tiles=lp.lead_tiles)
        if not direct:
            _launch_merge(lp, ws_o, ws_ml, inputs, out, lse, features)
        return
    _unified_attention_split_kernel[(lp.num_slots, Hkv * lp.value_blocks, lp.num_splits)](
        q_ptr=q, k_ptr=k_cache, v_ptr=v_cache, cu_seqlens_q_ptr=cu_seqlens_q,
        kv_lens_ptr=kv_lens, block_table_ptr=block_table, ws_o_ptr=ws_o, ws_ml_ptr=ws_ml,
        out_ptr=out, lse_ptr=lse,
        num_splits=lp.num_splits, IS_DIRECT=direct, BLOCK_DV=D // lp.value_blocks,
        TILES_PER_STEP=lp.tiles_per_step, IS_PDL=lp.dependent_merge,
        **_attention_args(lp, q, k_cache, v_cache, block_table, qk_scale, features))
    if not direct:
        _launch_merge(lp, ws_o, ws_ml, inputs, out, lse, features)


def _launch_merge(lp: LaunchPlan, ws_o: torch.Tensor, ws_ml: torch.Tensor,
                  inputs: tuple[torch.Tensor, ...], out: torch.Tensor, lse: torch.Tensor,
                  features: Features = _PLAIN) -> None:
    """One program per (query token, block of query heads, block of head-dim columns) folds its
    rows' partials in split order. With ``lp.dependent_merge`` it is a programmatic dependent launch
    (``launch_pdl``): scheduled while the split kernel finishes, it waits in-kernel for that
    kernel's writes."""
    q, k_cache, _, cu_seqlens_q, kv_lens, block_table = inputs
    T, Hq, D = q.shape
    block_d, block_h = _merge_block_d(D), _merge_block_h(Hq)
    assert D % block_d == 0, (D, block_d)  # internal: every column belongs to one program
    f = _feature_args(features, q)
    _merge_splits_kernel[(T, triton.cdiv(Hq, block_h), D // block_d)](
        ws_o_ptr=ws_o, ws_ml_ptr=ws_ml, cu_seqlens_q_ptr=cu_seqlens_q, kv_lens_ptr=kv_lens,
        sinks_ptr=f["sinks_ptr"], v_scale_ptr=f["v_scale_ptr"], out_ptr=out, lse_ptr=lse,
        window_left=f["window_left"], split_tokens=lp.split_tokens,
        # A walking keys-as-rows program stores one state per split of split_tokens.
        lead_tokens=lp.split_tokens if lp.walk_lead else lp.lead_tokens, B=kv_lens.shape[0],
        Hq=Hq, num_splits=lp.num_splits,
        max_kv_len=block_table.shape[1] * k_cache.shape[1],
        G=Hq // k_cache.shape[2], HEAD_DIM=D, BLOCK_H=block_h, BLOCK_D=block_d,
        CHUNK=_merge_chunk(), HAS_WINDOW=f["HAS_WINDOW"], HAS_SINKS=f["HAS_SINKS"],
        HAS_KV_SCALE=f["HAS_KV_SCALE"], IS_PDL=lp.dependent_merge, num_warps=_MERGE_NUM_WARPS,
        **({"launch_pdl": True} if lp.dependent_merge else {}))
