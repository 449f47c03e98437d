"""Unified paged attention (prefill + decode in one call): validation, plans and launch."""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass

import torch
import triton

from kernels._triton.attention_kernels import (
    _merge_splits_kernel,
    _unified_attention_fused_kernel,
    _unified_attention_split_kernel,
)
from kernels.config import (
    DEFAULT_SPLIT_SIZE,
    NOMINAL_NUM_SMS,
    SUPPORTED_DTYPES,
    SUPPORTED_HEAD_DIMS,
    choose_plan,
    control_num_splits,
    rows_per_block,
    tile_config,
)

__all__ = ["PLANS", "unified_attention"]

PLANS: tuple[str, ...] = ("auto", "fused", "split")
_LOG2E = 1.4426950408889634
# Split partials the merge kernel loads at once (hides load latency on long folds; 1 under the
# interpreter, where it only costs time: the chunk size never changes the merge order).
_MERGE_CHUNK = 8


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@functools.cache
def _cuda_num_sms(index: int) -> int:
    return int(torch.cuda.get_device_properties(index).multi_processor_count)


def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return _cuda_num_sms(device.index if device.index is not None else 0)
    return NOMINAL_NUM_SMS


def _capturing(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


@dataclass(frozen=True)
class _HostStats:
    """Batch statistics read back from the device (one sync); used by validation and heuristics."""

    max_kv_len: int
    num_q_blocks: int  # sum over requests of ceil(q_len / BLOCK_Q)
    longest_tiles: int  # KV tiles of the longest request
    total_tiles: int  # sum over query blocks of the KV tiles they walk


def _check_tensor(name: str, t: object, ndim: int) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.ndim != ndim:
        raise ValueError(f"{name}: expected {ndim} dims, got {t.ndim} (shape {tuple(t.shape)})")
    return t


def _check_structure(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    kv_lens: torch.Tensor,
    block_table: torch.Tensor,
) -> None:
    """Checks that need no device-to-host copy: ranks, shapes, dtypes, devices, strides."""
    _check_tensor("q", q, 3)
    _check_tensor("k_cache", k_cache, 4)
    _check_tensor("v_cache", v_cache, 4)
    _check_tensor("cu_seqlens_q", cu_seqlens_q, 1)
    _check_tensor("kv_lens", kv_lens, 1)
    _check_tensor("block_table", block_table, 2)
    if q.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"q: expected dtype in {SUPPORTED_DTYPES}, got {q.dtype}")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if t.dtype != q.dtype:
            raise ValueError(f"{name}: expected dtype {q.dtype} (same as q), got {t.dtype}")
    for name, t in (("cu_seqlens_q", cu_seqlens_q), ("kv_lens", kv_lens),
                    ("block_table", block_table)):
        if t.dtype != torch.int32:
            raise ValueError(f"{name}: expected dtype torch.int32, got {t.dtype}")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache), ("cu_seqlens_q", cu_seqlens_q),
                    ("kv_lens", kv_lens), ("block_table", block_table)):
        if t.device != q.device:
            raise ValueError(f"{name}: expected device {q.device} (same as q), got {t.device}")
    Hq, D = q.shape[1], q.shape[2]
    if D not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"q: expected head_dim in {SUPPORTED_HEAD_DIMS}, got {D}")
    if k_cache.shape != v_cache.shape:
        raise ValueError(
            f"v_cache: expected shape {tuple(k_cache.shape)} (same as k_cache), "
            f"got {tuple(v_cache.shape)}")
    _, page_size, Hkv, Dk = k_cache.shape
    if Dk != D:
        raise ValueError(f"k_cache: expected head_dim {D} (same as q), got {Dk}")
    if Hkv == 0 or Hq % Hkv != 0:
        raise ValueError(
            f"k_cache: expected num_kv_heads dividing num_q_heads={Hq}, got {Hkv}")
    if page_size < 1 or page_size & (page_size - 1):
        raise ValueError(f"k_cache: expected page_size a power of two >= 1, got {page_size}")
    B = kv_lens.shape[0]
    if cu_seqlens_q.shape[0] != B + 1:
        raise ValueError(
            f"cu_seqlens_q: expected shape ({B + 1},) (kv_lens has {B} requests), "
            f"got {tuple(cu_seqlens_q.shape)}")
    if block_table.shape[0] != B:
        raise ValueError(
            f"block_table: expected {B} rows (one per request), got {block_table.shape[0]}")
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache),
                    ("block_table", block_table)):
        if t.numel() > 0 and t.stride(-1) != 1:
            raise ValueError(
                f"{name}: expected a contiguous last dim (stride 1), got stride {t.stride(-1)}")


def _host_stats(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    kv_lens: torch.Tensor,
    block_table: torch.Tensor,
    block_q: int,
    block_n: int,
    check: bool,
) -> _HostStats:
    """Read lengths (and, when ``check``, the needed block-table entries) back to the host."""
    T = q.shape[0]
    num_pages, page_size = k_cache.shape[0], k_cache.shape[1]
    cu = cu_seqlens_q.cpu().to(torch.int64)
    kv = kv_lens.cpu().to(torch.int64)
    B = kv.shape[0]
    q_lens = cu[1:] - cu[:-1]
    if check:
        if int(cu[0]) != 0:
            raise ValueError(f"cu_seqlens_q: expected cu_seqlens_q[0] == 0, got {int(cu[0])}")
        if B > 0 and bool((q_lens < 0).any()):
            b = int(torch.nonzero(q_lens < 0)[0])
            raise ValueError(
                f"cu_seqlens_q: expected non-decreasing values, got cu_seqlens_q[{b}]="
                f"{int(cu[b])} > cu_seqlens_q[{b + 1}]={int(cu[b + 1])}")
        if int(cu[-1]) != T:
            raise ValueError(
                f"cu_seqlens_q: expected cu_seqlens_q[-1] == T == {T}, got {int(cu[-1])}")
        if B > 0 and bool((kv < 0).any()):
            b = int(torch.nonzero(kv < 0)[0])
            raise ValueError(f"kv_lens: expected kv_lens >= 0, got kv_lens[{b}]={int(kv[b])}")
        if B > 0 and bool((kv < q_lens).any()):
            b = int(torch.nonzero(kv < q_lens)[0])
            raise ValueError(
                f"kv_lens: expected kv_lens[b] >= q_len[b], got kv_lens[{b}]={int(kv[b])} < "
                f"q_len[{b}]={int(q_lens[b])}")
        pages = (kv + page_size - 1) // page_size
        max_pages = block_table.shape[1]
        if B > 0 and bool((pages > max_pages).any()):
            b = int(torch.nonzero(pages > max_pages)[0])
            raise ValueError(
                f"block_table: expected at least ceil(kv_lens[{b}] / page_size) = {int(pages[b])}"
                f" columns, got {max_pages}")
        if B > 0 and max_pages > 0:
            bt = block_table.cpu().to(torch.int64)
            needed = torch.arange(max_pages)[None, :] < pages[:, None]
            bad = needed & ((bt < 0) | (bt >= num_pages))
            if bool(bad.any()):
                b, c = (int(x) for x in torch.nonzero(bad)[0])
                raise ValueError(
                    f"block_table: expected page ids in [0, {num_pages}) for needed pages, got "
                    f"block_table[{b}, {c}]={int(bt[b, c])}")
    q_lens = q_lens.clamp(min=0)
    n_blocks = (q_lens + block_q - 1) // block_q
    max_kv = int(kv.max()) if B > 0 else 0
    # KV tiles walked by each query block: up to the block's last position.
    total_tiles = 0
    if B > 0 and int(n_blocks.sum()) > 0:
        req = torch.repeat_interleave(torch.arange(B), n_blocks)
        first = torch.repeat_interleave(torch.cumsum(n_blocks, 0) - n_blocks, n_blocks)
        i_blk = torch.arange(req.shape[0]) - first
        end = torch.minimum((i_blk + 1) * block_q, q_lens[req])
        max_pos = kv[req] - q_lens[req] + end - 1
        total_tiles = int((max_pos // block_n + 1).sum())
    longest = (max_kv + block_n - 1) // block_n
    return _HostStats(max_kv, int(n_blocks.sum()), longest, total_tiles)


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
    plan: str = "auto",
    validate: bool = True,
    _block_m: int | None = None,
    _num_warps: int | None = None,
    _block_n: int | None = None,
    _num_stages: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal attention of a varlen batch of requests over a paged KV cache.

    Args:
        q: ``[T, Hq, D]`` queries, requests concatenated (float16, bfloat16 or float32).
        k_cache, v_cache: ``[num_pages, page_size, Hkv, D]``, q's dtype; ``Hq % Hkv == 0``,
            page_size a power of two.
        cu_seqlens_q: ``[B + 1]`` int32 query offsets (0, non-decreasing, last == T).
        kv_lens: ``[B]`` int32 KV length of each request, ``kv_lens[b] >= q_len[b]``. Query token
            i of request b sits at position ``kv_lens[b] - q_len[b] + i`` and sees ``[0, pos]``.
        block_table: ``[B, max_pages]`` int32, logical page -> physical page of ``k/v_cache``.
        sm_scale: softmax scale, default ``1 / sqrt(D)``.
        split_size: KV tokens per split (a positive multiple of the tile config's BLOCK_N).
            Batch-invariant: every row reduces over tiles and splits at absolute positions.
            ``None`` is the CONTROL mode: the split count comes from the batch (FA2 heuristic),
            which is deliberately not batch-invariant.
        plan: ``"fused"``, ``"split"`` or ``"auto"``. All plans give identical bits for a given
            split size; ``"auto"`` picks the faster one for the batch (from the lengths when
            ``validate`` read them back, else from shapes only: see ``config.choose_plan``).
        validate: check values (lengths, page ids). This costs a device-to-host copy of
            ``cu_seqlens_q``, ``kv_lens`` and ``block_table`` and a sync; it is skipped
            automatically while a CUDA graph is being captured. Shape/dtype checks always run.
        _block_m, _num_warps, _block_n, _num_stages: TESTING ONLY overrides of the tile config,
            for experiments that measure whether a row's bits (or the speed) depend on them.
            ``_block_n`` changes the tile grid, hence the bits, by definition.

    Returns:
        ``(out [T, Hq, D] in q's dtype, lse [T, Hq] float32)``; lse is the natural log of
        ``sum exp(sm_scale * q.k)``. A row attending to nothing gets ``out = 0, lse = -inf``.
    """
    _check_structure(q, k_cache, v_cache, cu_seqlens_q, kv_lens, block_table)
    T, Hq, D = q.shape
    _, page_size, Hkv, _ = k_cache.shape
    B = kv_lens.shape[0]
    G = Hq // Hkv
    cfg = tile_config(q.dtype, D)
    if _block_m is not None and (_block_m < 1 or _block_m & (_block_m - 1)):
        raise ValueError(f"_block_m: expected a power of two, got {_block_m}")
    if _num_warps is not None and _num_warps not in (1, 2, 4, 8, 16):
        raise ValueError(f"_num_warps: expected one of 1, 2, 4, 8, 16, got {_num_warps}")
    BLOCK_M, BLOCK_Q = rows_per_block(_block_m if _block_m is not None else cfg.block_m, G)
    if _block_n is not None and (_block_n < 16 or _block_n & (_block_n - 1)):
        raise ValueError(f"_block_n: expected a power of two >= 16, got {_block_n}")
    BLOCK_N = _block_n if _block_n is not None else cfg.block_n
    num_warps = _num_warps if _num_warps is not None else cfg.num_warps
    num_stages = _num_stages if _num_stages is not None else cfg.num_stages
    if split_size is not None and (
            isinstance(split_size, bool) or not isinstance(split_size, int) or split_size <= 0
            or split_size % BLOCK_N):
        raise ValueError(
            f"split_size: expected a positive multiple of BLOCK_N={BLOCK_N} "
            f"(dtype {q.dtype}, head_dim {D}) or None, got {split_size!r}")
    if plan not in PLANS:
        raise ValueError(f"plan: expected one of {PLANS}, got {plan!r}")
    if sm_scale is None:
        sm_scale = 1.0 / math.sqrt(D)

    if q.device.type == "cpu" and not _interpreting():
        raise ValueError(
            "q: CPU tensors need the Triton interpreter: set TRITON_INTERPRET=1 before triton is "
            f"first imported (got device {q.device}, TRITON_INTERPRET unset)")
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty((T, Hq), dtype=torch.float32, device=q.device)
    if T == 0:
        return out, lse

    cu_seqlens_q = cu_seqlens_q.contiguous()
    kv_lens = kv_lens.contiguous()
    capturing = _capturing(q.device)
    stats: _HostStats | None = None
    if validate and not capturing:
        stats = _host_stats(q, k_cache, cu_seqlens_q, kv_lens, block_table, BLOCK_Q, BLOCK_N,
                            check=True)
    # Without host statistics, bound from shapes (no sync): every KV length fits the block table.
    max_kv = stats.max_kv_len if stats is not None else block_table.shape[1] * page_size
    num_q_blocks = stats.num_q_blocks if stats is not None else T // BLOCK_Q + B
    num_sms = _num_sms(q.device)

    if split_size is None:
        n_tiles = max(1, triton.cdiv(max_kv, BLOCK_N))
        n_splits = control_num_splits(num_q_blocks * Hkv, num_sms, n_tiles)
        split = triton.cdiv(triton.cdiv(max(max_kv, 1), n_splits), BLOCK_N) * BLOCK_N
    else:
        split = split_size
    if plan == "auto":
        plan = choose_plan(
            num_q_blocks * Hkv, num_sms, max_kv, split,
            longest_tiles=stats.longest_tiles if stats is not None else None,
            total_tiles=stats.total_tiles * Hkv if stats is not None else None,
        )

    interpreting = _interpreting()
    common = dict(
        G=G,
        HEAD_DIM=D,
        PAGE_SIZE=page_size,
        BLOCK_M=BLOCK_M,
        BLOCK_Q=BLOCK_Q,
        BLOCK_N=BLOCK_N,
        IS_PAGE_PER_TILE=page_size >= BLOCK_N,
        IS_INTERPRET=interpreting,
        # NOTE: fp32 must not silently run in tf32: "ieee" is exact fp32 FMA.
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        num_warps=num_warps,
        num_stages=num_stages,
    )
    strides = dict(
        stride_qt=q.stride(0),
        stride_qh=q.stride(1),
        stride_kp=k_cache.stride(0),
        stride_ks=k_cache.stride(1),
        stride_kh=k_cache.stride(2),
        stride_vp=v_cache.stride(0),
        stride_vs=v_cache.stride(1),
        stride_vh=v_cache.stride(2),
        stride_bt=block_table.stride(0),
    )
    n_slots = T // BLOCK_Q + B
    qk_scale = float(sm_scale) * _LOG2E
    split_tiles = split // BLOCK_N
    if plan == "fused":
        _unified_attention_fused_kernel[(n_slots, Hkv)](
            q, k_cache, v_cache, cu_seqlens_q, kv_lens, block_table, out, lse,
            qk_scale, split_tiles, B, Hq, **strides, **common)
        return out, lse

    NS = max(1, triton.cdiv(max_kv, split))
    # NOTE: uninitialised on purpose. Each row only reads the partials of splits at or below its
    # position, and those are always written.
    ws_o = torch.empty((T, Hq, NS, D), dtype=torch.float32, device=q.device)
    ws_lse = torch.empty((T, Hq, NS), dtype=torch.float32, device=q.device)
    _unified_attention_split_kernel[(n_slots, Hkv, NS)](
        q, k_cache, v_cache, cu_seqlens_q, kv_lens, block_table, ws_o, ws_lse,
        qk_scale, split_tiles, B, Hq, NS, **strides, **common)
    _merge_splits_kernel[(T, Hkv)](
        ws_o, ws_lse, cu_seqlens_q, kv_lens, out, lse, split, B, Hq, NS,
        G=G, HEAD_DIM=D, BLOCK_G=triton.next_power_of_2(G),
        CHUNK=1 if interpreting else _MERGE_CHUNK, num_warps=4)
    return out, lse
