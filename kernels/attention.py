"""Unified paged attention (prefill + decode in one call): checks, launch plan and launchers.

Three layers (kernels/README.md, "Layers"):

1. :func:`unified_attention` checks its arguments and returns ``(out, lse)``;
2. :func:`plan_attention` turns shapes (and, with ``validate=True``, lengths read back to the
   host) into a :class:`LaunchPlan`: tile sizes, warps, stages, split size in tokens and in
   tiles, number of splits, plan;
3. ``_launch_fused``, ``_launch_split`` and ``_launch_merge`` turn a plan into grids and kernel
   arguments.

Units: ``split_tokens`` and ``lead_tokens`` count KV tokens, ``split_tiles`` and ``lead_tiles``
count KV tiles of ``block_n`` tokens (``split_tokens = split_tiles * block_n``). The public
arguments ``split_size`` and ``lead_split_size`` are in tokens.
"""

from __future__ import annotations

import functools
import math
import numbers
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
import triton

from kernels._triton.attention_kernels import (
    HAS_GDC,
    _merge_splits_kernel,
    _slot_keys_kernel,
    _slot_rank_kernel,
    _unified_attention_fused_kernel,
    _unified_attention_split_kernel,
)
from kernels.config import (
    DEFAULT_LEAD_SPLIT_SIZE,
    DEFAULT_SPLIT_SIZE,
    NOMINAL_NUM_SMS,
    SUPPORTED_DTYPES,
    SUPPORTED_HEAD_DIMS,
    WIDE_BLOCK_N,
    batch_tuning,
    choose_plan,
    control_num_splits,
    count_splits,
    decode_stages,
    fused_loop,
    gluon_prefill,
    gluon_tile,
    gluon_value_blocks,
    kt_scores_ahead,
    kt_value_blocks,
    kt_walk_lead,
    kt_walk_splits,
    prefill_like,
    rows_per_block,
    slot_order,
    tile_config,
    tiles_per_step,
    value_blocks,
    wide_tile,
)

__all__ = ["PLANS", "HostStats", "LaunchPlan", "Tuning", "plan_attention", "unified_attention"]

PLANS: tuple[str, ...] = ("auto", "fused", "split")
_LOG2E = 1.4426950408889634
# sm_scale * log2(e) reaches the kernels as a float32 scalar: it must be a normal float32.
_FP32_MIN_NORMAL = 1.1754943508222875e-38
_FP32_MAX = 3.4028234663852886e38
_NUM_WARPS = (1, 2, 4, 8, 16)
# Fewest V columns a value block may have: tl.dot needs N >= 16.
_MIN_DOT_COLUMNS = 16
# Split partials the merge kernel loads per step (their loads are in flight together; 1 under the
# interpreter, where it only costs time: the chunk size never changes the merge order).
_MERGE_CHUNK = 8
# Head-dim columns and query heads per merge program on a GPU; every column runs the same
# arithmetic, so the blocks are bit-neutral. Round 4 (reports/h100-round4) cut the head dim into
# blocks of 32 columns (the merge at batch 1 went from 12.8 to 2.9 us with 1k keys and 47.6 to
# 9.3 us with 32k). Round 29 (reports/h100-round29/README.md; H100, CUDA graphs, medians of 5
# interleaved repeats): one query head per program with 128 columns took batch 1 with 32k keys
# from 70.1 to 68.7 us against round 28's merge (4 heads x 32 columns per program), 0.98-1.00x
# on the other 6 of 8 decodes; one head with 32 columns made the control's short rows slower
# (2k x 1: 16.4 against 15.4 us).
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


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@functools.cache
def _cuda_num_sms(index: int) -> int:
    return int(torch.cuda.get_device_properties(index).multi_processor_count)


@functools.cache
def _cuda_sm_major(index: int) -> int:
    return torch.cuda.get_device_capability(index)[0]


def _sm_major(device: torch.device) -> int | None:
    """Compute capability major of a CUDA device; ``None`` elsewhere (the interpreter, and ROCm,
    whose devices report their own architecture numbers: every rule measured on NVIDIA GPUs
    stays off there)."""
    if device.type != "cuda" or _interpreting() or torch.version.hip is not None:
        return None
    return _cuda_sm_major(device.index if device.index is not None else
                          torch.cuda.current_device())


def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return _cuda_num_sms(device.index if device.index is not None else 0)
    return NOMINAL_NUM_SMS


def _capturing(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _is_pow2(x: int) -> bool:
    return x >= 1 and x & (x - 1) == 0


# ------------------------------------------------------------------------------------------------
# Public data: tuning overrides, host statistics, the launch plan
# ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Tuning:
    """Overrides of the launch settings that :func:`~kernels.tile_config` fixes per
    (dtype, head_dim). ``None`` keeps the default. What each may change (kernels/README.md,
    "Bit-defining and bit-neutral settings"):

    - ``num_stages``: software-pipelining depth. It schedules loads, not arithmetic: 2-6 and 8
      were bit-neutral on an H100 (half precision, head dim 128; rounds 3-15; the fused plan
      measured up to 6).
    - ``block_m`` (tile rows, a power of two; raised to the GQA group size) and ``num_warps``:
      they change neither the tiles and splits a row sees nor their order, but on a GPU they
      pick the tensor-core layout of ``tl.dot``: on an H100, BLOCK_M 64/128 and 4/8 warps, and
      256 on 8 warps, were bit-neutral for half precision at head dim 128 (``wgmma``), BLOCK_M
      16/32 (``mma.sync``) and float32's 64 vs 32 were not (kernels/README.md). Vary them per
      batch only where the harness has shown, on the target GPU, that the values used agree bit
      for bit. A ``block_m`` given without warps or stages takes those from ``tile_config``.
    - ``value_blocks`` (1, 2, 4 or 8; split plan only, but the bound is checked whatever the
      plan: at least 16 columns each, ``head_dim / value_blocks >= 16``): V column blocks per
      (slot, KV head, split), each its own program. Bit-neutral on an H100 for half precision
      at head dim 128 (kernels/README.md); ``None`` takes :func:`~kernels.config.value_blocks`'
      choice. The 128-key Gluon split kernel takes 1, 2 or 4 (its rule:
      :func:`~kernels.config.gluon_value_blocks`); 8 runs the Triton kernels.
    - ``tiles_per_step`` (1 or 2; split plan, and the fused plan's nested loop): fully visible
      KV tiles per loop step (both tiles' scores and exponentials ahead of the first ``p @ v``).
      The same arithmetic per row: bit-neutral on an H100 for half precision at head dim 128
      (kernels/README.md); ``None`` takes :func:`~kernels.config.tiles_per_step`' choice.
    - ``dependent_merge`` (bool; split plan with several splits only): launch the merge kernel
      as a programmatic dependent launch of the split kernel (``griddepcontrol``, sm_90 and
      later), so that it is scheduled while the split kernel finishes and waits for its writes
      in-kernel. Scheduling only, no arithmetic changes. ``None`` or ``True``: wherever it is
      available (compute capability 9 or more on an NVIDIA GPU, Triton 3.4 or later; never
      under the interpreter), ``False``: never.
    - ``slot_order`` (bool; fused plan only): programs take their query-block slots with the
      requests sorted by KV length, longest first, each request's last blocks first (sorted on
      the device), instead of the last slots first. Scheduling only; ``None`` takes
      :func:`~kernels.config.slot_order`'s choice.
    - ``nested_loop`` (bool; fused plan only): a fused program walks each split in its own inner
      loop (the split kernel's loop) and folds the split's state after it, instead of one flat
      loop over every tile with the fold at each split boundary. The same operations in the
      same order per row; only the loop structure (hence register allocation and pipelining)
      changes. ``None`` takes :func:`~kernels.config.fused_loop`'s choice (with its tiles per
      step unless ``tiles_per_step`` is given; the flat loop walks one tile per step).
    - ``gluon`` (bool): run the Gluon kernels (kernels/_gluon: a TMA loader warp, two
      warpgroups) instead of the Triton ones. At 128 keys (the contract on Hopper with Triton
      3.6 for half precision at head dim 128, :func:`~kernels.config.tile_config`) both plans
      run them where :func:`~kernels.config.gluon_tile` allows (pages of >= 16 tokens) and no
      other override asks for what they do not take (``block_m`` other than 128, ``num_warps``
      other than 8, ``nested_loop=False``, ``value_blocks`` 8, ``tiles_per_step`` 2); at
      64 keys only the fused plan's prefill tile does (:func:`~kernels.config.gluon_prefill`:
      128 rows on 8 warps in the nested loop, pages of >= 16 tokens). Both also need caches
      TMA can read (contiguous, 16-byte aligned, under 2**31 token rows) and Triton 3.6
      (kernels/README.md, "The 128-key contract" and "The Gluon prefill tile"). The same
      operations in the same order per row as the Triton kernels. ``None``: wherever allowed;
      ``False``: never (the Triton kernels at the same tile width: the same bits, slower);
      ``True``: required (a ``ValueError`` names every unmet condition, including, at 64 keys, a
      split plan that ``plan="auto"`` chose). :attr:`LaunchPlan.gluon` says which kernels a
      call runs.
    - ``keys_rows`` (bool; split plan at 128 keys on the Gluon kernels only): the keys-as-rows
      decode tile (``kernels._gluon``'s ``_split_kt_kernel``): blocks of 8-32 rows with the KV
      tile on the MMA's M dimension, the same bits as the 128-row split tile
      (kernels/README.md, "The keys-as-rows decode tile"). ``None``: for decode batches (at
      most ``kt_rows(G) // G`` query tokens per request on average) with GQA groups of at most
      16 heads and no launch override; ``False``: never; ``True``: on any batch of the split
      plan (a ``ValueError`` names an unmet condition: another plan, no Gluon, a group above 32,
      a ``block_m``, ``num_warps``, ``value_blocks`` or ``tiles_per_step`` it does not take:
      it takes ``value_blocks`` 1 or 2, default :func:`~kernels.config.kt_value_blocks`).
    - ``scores_ahead`` (bool; the keys-as-rows tile only): its issue order, each next tile's
      scores issued before this tile's ``p @ v`` and its weights computed while that runs.
      Scheduling only, no bit. ``None``: :func:`~kernels.config.kt_scores_ahead` with 2 V
      blocks; ``True`` where the tile does not run, or with one V block at 32 rows (its second
      p buffer would overflow shared memory), raises a ``ValueError``.
    - ``walk_lead`` (bool; the keys-as-rows tile only): one program per split of ``split_size``
      that folds the lead splits in it, as the fused plan does (``True``), or one program per
      lead split and the merge folds them (``False``). Scheduling only, no bit. ``None``:
      :func:`~kernels.config.kt_walk_lead`; ``True`` where the tile does not run raises a
      ``ValueError``; without lead splits (one split size) it has no effect.
    - ``block_n`` (KV tokens per tile, a power of two >= 16): BIT-DEFINING, it moves the tile
      grid: another contract. For experiments (tile sweeps, the 64-key contract on Hopper with
      ``block_n=64``); ``split_size`` must be a multiple of it.
    """

    block_m: int | None = None
    num_warps: int | None = None
    num_stages: int | None = None
    block_n: int | None = None
    value_blocks: int | None = None
    tiles_per_step: int | None = None
    dependent_merge: bool | None = None
    slot_order: bool | None = None
    nested_loop: bool | None = None
    gluon: bool | None = None
    keys_rows: bool | None = None
    scores_ahead: bool | None = None
    walk_lead: bool | None = None

    def __post_init__(self) -> None:
        checks = (
            ("block_m", self.block_m, lambda v: _is_pow2(v), "a power of two"),
            ("num_warps", self.num_warps, lambda v: v in _NUM_WARPS, f"one of {_NUM_WARPS}"),
            ("num_stages", self.num_stages, lambda v: 1 <= v <= 8, "an int in [1, 8]"),
            ("block_n", self.block_n, lambda v: _is_pow2(v) and v >= 16,
             "a power of two >= 16"),
            ("value_blocks", self.value_blocks, lambda v: v in (1, 2, 4, 8), "1, 2, 4 or 8"),
            ("tiles_per_step", self.tiles_per_step, lambda v: v in (1, 2), "1 or 2"),
        )
        for name, value, ok, expected in checks:
            if value is not None and not (isinstance(value, int) and not isinstance(value, bool)
                                          and ok(value)):
                raise ValueError(f"Tuning.{name}: expected {expected} or None, got {value!r}")
        for name in ("dependent_merge", "slot_order", "nested_loop", "gluon", "keys_rows",
                     "scores_ahead", "walk_lead"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, bool):
                raise ValueError(f"Tuning.{name}: expected a bool or None, got {value!r}")


@dataclass(frozen=True)
class HostStats:
    """Batch statistics on the host: read back from the device (one sync, ``validate=True``) or
    computed from the caller's ``host_lens`` (no sync; used for speed decisions only)."""

    max_kv_len: int  # longest KV length of the batch
    num_q_blocks: int  # sum over requests of ceil(q_len / block_q)
    longest_tiles: int  # KV tiles of the longest request
    total_tiles: int  # sum over query blocks of the KV tiles they walk (one KV head)


@dataclass(frozen=True)
class LaunchPlan:
    """How one :func:`unified_attention` call runs. Computed by :func:`plan_attention`.

    Bit-defining (fixed per dtype, head_dim and deployment, kernels/README.md): ``block_n``,
    ``split_tokens``, ``lead_tokens``. Everything else only changes speed, except in the control
    mode (``is_control``), where ``split_tokens`` comes from the batch (and ``lead_tokens``
    equals it).
    """

    plan: str  # "fused" or "split"
    block_m: int  # tile rows: (query token, query head) pairs
    block_q: int  # query tokens per tile: block_m // G
    block_n: int  # KV tokens per tile
    num_warps: int
    num_stages: int  # pipeline stages; on the Gluon kernels their TMA ring's K/V slots
    split_tokens: int  # KV tokens per split (a multiple of block_n)
    split_tiles: int  # KV tiles per split: split_tokens // block_n
    lead_tokens: int  # KV tokens per lead split (the first split_tokens of every row), divides it
    lead_tiles: int  # KV tiles per lead split: lead_tokens // block_n
    num_splits: int  # splits of the longest KV length (or its bound): the workspace depth
    num_slots: int  # query-block slots, grid dim 0: T // block_q + B (an upper bound)
    value_blocks: int  # split plan: V column blocks per (slot, KV head, split); fused: 1
    tiles_per_step: int  # fully visible KV tiles per loop step (1 or 2); flat fused loop: 1
    dependent_merge: bool  # split plan's merge as a programmatic dependent launch (sm_90+)
    slot_order: bool  # fused plan: requests with the most KV first (sorted on the device)
    nested_loop: bool  # fused plan: an inner loop per split, its fold after it (else one loop)
    gluon: bool  # the Gluon kernels (kernels/_gluon) instead of Triton's
    keys_rows: bool  # split plan: the keys-as-rows decode tile (block_m: its rows, <= 32)
    scores_ahead: bool  # keys-as-rows tile: next tile's scores issued before this p @ v
    # keys-as-rows tile: a program per split of split_tokens, lead splits folded in it (the
    # workspace and the merge then count splits of split_tokens), not one per lead split
    walk_lead: bool
    walk_splits: int  # walk_lead: splits of split_tokens per program (each stored); else 1
    max_kv_len: int  # longest KV length (host statistics) or the block table's bound
    is_control: bool  # split_size=None: split count chosen from the batch (not invariant)
    # From the lengths read back (validate=True) or from host_lens; counted in blocks of the
    # 128-row tile's block_q (the plan is chosen from them) even where keys_rows gives block_q.
    stats: HostStats | None


# ------------------------------------------------------------------------------------------------
# Argument checks
# ------------------------------------------------------------------------------------------------

def _check_tensor(name: str, t: object, ndim: int) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.ndim != ndim:
        raise ValueError(f"{name}: expected {ndim} dims, got {t.ndim} (shape {tuple(t.shape)})")
    return t


def _check_types(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 index_tensors: dict[str, torch.Tensor]) -> None:
    """Dtypes and devices (no device-to-host copy)."""
    if q.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"q: expected dtype in {SUPPORTED_DTYPES}, got {q.dtype}")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if t.dtype != q.dtype:
            raise ValueError(f"{name}: expected dtype {q.dtype} (same as q), got {t.dtype}")
    for name, t in index_tensors.items():
        if t.dtype != torch.int32:
            raise ValueError(f"{name}: expected dtype torch.int32, got {t.dtype}")
    if q.device.type not in ("cuda", "cpu"):
        raise ValueError(f"q: expected a CUDA tensor (or CPU under TRITON_INTERPRET=1), got "
                         f"device {q.device}")
    if q.device.type == "cpu" and not _interpreting():
        raise ValueError(
            "q: expected a CUDA tensor, or a CPU tensor with the Triton interpreter on (set "
            f"TRITON_INTERPRET=1 before triton is first imported), got device {q.device} with "
            "TRITON_INTERPRET unset")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache), *index_tensors.items()):
        if t.device != q.device:
            raise ValueError(f"{name}: expected device {q.device} (same as q), got {t.device}")


def _check_shapes(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  cu_seqlens_q: torch.Tensor, kv_lens: torch.Tensor,
                  block_table: torch.Tensor) -> None:
    """Shapes and strides (no device-to-host copy)."""
    T, Hq, D = q.shape
    if D not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"q: expected head_dim in {SUPPORTED_HEAD_DIMS}, got {D}")
    num_pages, page_size, Hkv, Dk = k_cache.shape
    if Dk != D:
        raise ValueError(f"k_cache: expected head_dim {D} (same as q), got {Dk}")
    if k_cache.shape != v_cache.shape:
        raise ValueError(f"v_cache: expected shape {tuple(k_cache.shape)} (same as k_cache), "
                         f"got {tuple(v_cache.shape)}")
    if Hq == 0:
        raise ValueError(f"q: expected num_q_heads >= 1, got shape {tuple(q.shape)}")
    if Hkv == 0 or Hq % Hkv != 0:
        raise ValueError(f"k_cache: expected num_kv_heads dividing num_q_heads={Hq}, got {Hkv}")
    if not _is_pow2(page_size):
        raise ValueError(f"k_cache: expected page_size a power of two >= 1, got {page_size}")
    B = kv_lens.shape[0]
    if cu_seqlens_q.shape[0] != B + 1:
        raise ValueError(f"cu_seqlens_q: expected shape ({B + 1},) (kv_lens has {B} requests), "
                         f"got {tuple(cu_seqlens_q.shape)}")
    if block_table.shape[0] != B:
        raise ValueError(
            f"block_table: expected {B} rows (one per request), got {block_table.shape[0]}")
    # Consequences of the shapes alone when there are query tokens: some request has q_len >= 1,
    # hence kv_len >= 1, a block-table column and a page.
    if T > 0 and B == 0:
        raise ValueError(f"kv_lens: expected at least one request for T={T} query tokens, got 0")
    if T > 0 and (num_pages == 0 or block_table.shape[1] == 0):
        raise ValueError(
            f"k_cache, block_table: expected at least one page and one block-table column for "
            f"T={T} query tokens, got {num_pages} pages and {block_table.shape[1]} columns")
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache),
                    ("block_table", block_table)):
        if t.numel() > 0 and t.stride(-1) != 1:
            raise ValueError(
                f"{name}: expected a contiguous last dim (stride 1), got stride {t.stride(-1)}")


def _check_structure(q: object, k_cache: object, v_cache: object, cu_seqlens_q: object,
                     kv_lens: object, block_table: object) -> None:
    """Every check that needs no device-to-host copy: types, ranks, dtypes, devices, shapes."""
    q = _check_tensor("q", q, 3)
    k_cache = _check_tensor("k_cache", k_cache, 4)
    v_cache = _check_tensor("v_cache", v_cache, 4)
    index = {"cu_seqlens_q": _check_tensor("cu_seqlens_q", cu_seqlens_q, 1),
             "kv_lens": _check_tensor("kv_lens", kv_lens, 1),
             "block_table": _check_tensor("block_table", block_table, 2)}
    _check_types(q, k_cache, v_cache, index)
    _check_shapes(q, k_cache, v_cache, index["cu_seqlens_q"], index["kv_lens"],
                  index["block_table"])


def _check_sm_scale(sm_scale: object) -> float | None:
    """The softmax scale as a float (None stays None): a finite positive real (not bool) whose
    ``sm_scale * log2(e)`` is a normal float32, the scalar the kernels receive."""
    if sm_scale is None:
        return None
    expected = (f"a finite positive real with sm_scale * log2(e) in float32's normal range "
                f"[{_FP32_MIN_NORMAL:.3g}, {_FP32_MAX:.3g}], or None")
    if isinstance(sm_scale, bool) or not isinstance(sm_scale, numbers.Real):
        raise ValueError(f"sm_scale: expected {expected}, got {sm_scale!r} "
                         f"({type(sm_scale).__name__})")
    value = float(sm_scale)
    if not (math.isfinite(value) and _FP32_MIN_NORMAL <= value * _LOG2E <= _FP32_MAX):
        raise ValueError(f"sm_scale: expected {expected}, got {sm_scale!r}")
    return value


def _check_options(split_size: object, lead_split_size: object, plan: object, validate: object,
                   block_n: int, q: torch.Tensor) -> None:
    tile = (f"BLOCK_N={block_n} KV tokens (dtype {q.dtype}, head_dim {q.shape[2]} on "
            f"{q.device}: kernels.tile_config; 128 for half precision at head dim 128 on Hopper "
            f"with Triton 3.6)")
    if split_size is not None and not (
            isinstance(split_size, int) and not isinstance(split_size, bool)
            and split_size > 0 and split_size % block_n == 0):
        raise ValueError(
            f"split_size: expected a positive multiple of {tile} or None, got {split_size!r}")
    if lead_split_size is not None and not (
            isinstance(lead_split_size, int) and not isinstance(lead_split_size, bool)
            and lead_split_size > 0 and lead_split_size % block_n == 0):
        raise ValueError(
            f"lead_split_size: expected a positive multiple of {tile} or None, got "
            f"{lead_split_size!r}")
    if (isinstance(split_size, int) and lead_split_size is not None
            and lead_split_size < split_size and split_size % lead_split_size != 0):
        raise ValueError(
            f"lead_split_size: expected a divisor of split_size={split_size}, or at least it "
            f"(one split size), got {lead_split_size!r}")
    if not isinstance(plan, str) or plan not in PLANS:
        raise ValueError(f"plan: expected one of {PLANS}, got {plan!r}")
    if not isinstance(validate, bool):
        raise ValueError(f"validate: expected a bool, got {validate!r}")


def _check_lengths(cu: torch.Tensor, kv: torch.Tensor, T: int) -> None:
    """Values of cu_seqlens_q and kv_lens (host int64 copies)."""
    q_lens = cu[1:] - cu[:-1]
    if int(cu[0]) != 0:
        raise ValueError(f"cu_seqlens_q: expected cu_seqlens_q[0] == 0, got {int(cu[0])}")
    if bool((q_lens < 0).any()):
        b = int(torch.nonzero(q_lens < 0)[0])
        raise ValueError(
            f"cu_seqlens_q: expected non-decreasing values, got cu_seqlens_q[{b}]="
            f"{int(cu[b])} > cu_seqlens_q[{b + 1}]={int(cu[b + 1])}")
    if int(cu[-1]) != T:
        raise ValueError(f"cu_seqlens_q: expected cu_seqlens_q[-1] == T == {T}, got {int(cu[-1])}")
    if bool((kv < 0).any()):
        b = int(torch.nonzero(kv < 0)[0])
        raise ValueError(f"kv_lens: expected kv_lens >= 0, got kv_lens[{b}]={int(kv[b])}")
    if bool((kv < q_lens).any()):
        b = int(torch.nonzero(kv < q_lens)[0])
        raise ValueError(
            f"kv_lens: expected kv_lens[b] >= q_len[b], got kv_lens[{b}]={int(kv[b])} < "
            f"q_len[{b}]={int(q_lens[b])}")


def _check_pages(block_table: torch.Tensor, kv: torch.Tensor, num_pages: int,
                 page_size: int) -> None:
    """Block-table width and the page ids of every needed page (columns past
    ``ceil(kv_lens[b] / page_size)`` are never read, hence never checked)."""
    pages = (kv + page_size - 1) // page_size
    max_pages = block_table.shape[1]
    if bool((pages > max_pages).any()):
        b = int(torch.nonzero(pages > max_pages)[0])
        raise ValueError(
            f"block_table: expected at least ceil(kv_lens[{b}] / page_size) = {int(pages[b])}"
            f" columns, got {max_pages}")
    if kv.shape[0] == 0 or max_pages == 0:
        return
    bt = block_table.cpu().to(torch.int64)
    needed = torch.arange(max_pages)[None, :] < pages[:, None]
    bad = needed & ((bt < 0) | (bt >= num_pages))
    if bool(bad.any()):
        b, c = (int(x) for x in torch.nonzero(bad)[0])
        raise ValueError(
            f"block_table: expected page ids in [0, {num_pages}) for needed pages, got "
            f"block_table[{b}, {c}]={int(bt[b, c])}")


def _host_stats(cu: torch.Tensor, kv: torch.Tensor, block_q: int, block_n: int) -> HostStats:
    """Statistics of checked lengths (host int64 copies)."""
    B = kv.shape[0]
    q_lens = cu[1:] - cu[:-1]
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
    return HostStats(max_kv_len=max_kv, num_q_blocks=int(n_blocks.sum()),
                     longest_tiles=_cdiv(max_kv, block_n), total_tiles=total_tiles)


def _check_host_lens(host_lens: object, B: int, T: int) -> tuple[Sequence[int], Sequence[int]]:
    """The caller's host copies ``(q_lens, kv_lens)``, checked for shape and sign only: they only
    steer the plan (bit-neutral); memory sizes never come from them."""
    if not isinstance(host_lens, (tuple, list)) or len(host_lens) != 2:
        raise ValueError(f"host_lens: expected a pair (q_lens, kv_lens) of int sequences or "
                         f"None, got {type(host_lens).__name__}")
    q_lens, kv_lens = host_lens
    for name, xs in (("q_lens", q_lens), ("kv_lens", kv_lens)):
        if not isinstance(xs, Sequence) or isinstance(xs, str):
            raise ValueError(f"host_lens: expected {name} as a list or tuple of host ints (e.g. "
                             f"tensor.tolist()), got {type(xs).__name__}")
        if len(xs) != B:
            raise ValueError(f"host_lens: expected {B} {name} (one per request), got {len(xs)}")
        bad = [x for x in xs if isinstance(x, bool) or not isinstance(x, numbers.Integral)
               or not 0 <= int(x) < 2**31]
        if bad:
            raise ValueError(f"host_lens: expected ints in [0, 2**31) in {name}, got "
                             f"{bad[0]!r}")
    if sum(q_lens) != T:
        raise ValueError(f"host_lens: expected q_lens to sum to q.shape[0]={T}, got "
                         f"{sum(q_lens)}")
    return q_lens, kv_lens


def _read_and_check_values(q: torch.Tensor, k_cache: torch.Tensor, cu_seqlens_q: torch.Tensor,
                           kv_lens: torch.Tensor, block_table: torch.Tensor, block_q: int,
                           block_n: int) -> HostStats:
    """``validate=True``: copy the index tensors to the host (one sync), check every value the
    kernels use, return the batch statistics."""
    cu = cu_seqlens_q.cpu().to(torch.int64)
    kv = kv_lens.cpu().to(torch.int64)
    _check_lengths(cu, kv, q.shape[0])
    _check_pages(block_table, kv, k_cache.shape[0], k_cache.shape[1])
    return _host_stats(cu, kv, block_q, block_n)


# ------------------------------------------------------------------------------------------------
# Plan
# ------------------------------------------------------------------------------------------------

def _split_tokens(split_size: int | None, block_n: int, max_kv: int, num_programs: int,
                  num_sms: int) -> int:
    """``split_size`` itself, or in the control mode (None) FA2's batch-dependent choice."""
    if split_size is not None:
        return int(split_size)
    n_tiles = max(1, _cdiv(max_kv, block_n))
    n_splits = control_num_splits(num_programs, num_sms, n_tiles)
    return _cdiv(_cdiv(max(max_kv, 1), n_splits), block_n) * block_n


def _lead_tokens(split_size: int | None, lead_split_size: int | None, split_tokens: int,
                 block_n: int) -> int:
    """KV tokens per lead split (checked by ``_check_options``): ``lead_split_size`` where it is
    below the split size, else the split size (one size). ``None``: the default contract's
    ``DEFAULT_LEAD_SPLIT_SIZE`` with a split size of 1024 (where the tile divides it), else one
    size, so that ``split_size=N`` alone (N other than 1024) means splits of N. The control mode
    has one size."""
    if split_size is None:
        return split_tokens
    if lead_split_size is None:
        lead = DEFAULT_LEAD_SPLIT_SIZE
        usable = split_tokens == DEFAULT_SPLIT_SIZE and lead % block_n == 0
        return lead if usable else split_tokens
    return min(int(lead_split_size), split_tokens)


def plan_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    kv_lens: torch.Tensor,
    block_table: torch.Tensor,
    *,
    split_size: int | None = DEFAULT_SPLIT_SIZE,
    lead_split_size: int | None = None,
    plan: str = "auto",
    validate: bool = True,
    tuning: Tuning | None = None,
    host_lens: tuple[Sequence[int], Sequence[int]] | None = None,
) -> LaunchPlan:
    """The :class:`LaunchPlan` :func:`unified_attention` would run for these arguments.

    Same arguments, shapes and checks as :func:`unified_attention` (without ``sm_scale``). With
    ``validate=True`` (outside CUDA-graph capture) the lengths and page ids are read back and
    checked, and ``plan="auto"`` uses their statistics; otherwise it uses ``host_lens`` when
    given, else shapes alone. Workspace sizes never depend on ``host_lens``.
    """
    _check_structure(q, k_cache, v_cache, cu_seqlens_q, kv_lens, block_table)
    if tuning is not None and not isinstance(tuning, Tuning):
        raise ValueError(f"tuning: expected a kernels.Tuning or None, got {tuning!r}")
    tuning = tuning or Tuning()
    T, Hq, D = q.shape
    _, page_size, Hkv, _ = k_cache.shape
    B = kv_lens.shape[0]
    G = Hq // Hkv
    sm_major = _sm_major(q.device)
    # The contract's tile width: 128 keys where the Gluon kernels can be built (Hopper, half
    # precision, head dim 128, Triton 3.6), else tile_config's; a Tuning may name another.
    contract = tile_config(q.dtype, D, sm_major, _gluon_installed(q.dtype, D, sm_major))
    cfg = batch_tuning(q.dtype, D, G, T, B, sm_major, tuning.block_n or contract.block_n)
    block_n = cfg.block_n
    _check_options(split_size, lead_split_size, plan, validate, block_n, q)
    # The 128-key contract (kernels/README.md): the Gluon tile in both plans where it can run,
    # else the Triton kernels with tile_config's fixed launch.
    wide = wide_tile(q.dtype, D, block_n, sm_major)
    wide_gluon = wide and tuning.gluon is not False and _gluon_ready(
        q, k_cache, v_cache, _wide_gluon_misfit(q, k_cache, block_n, sm_major, tuning),
        required=bool(tuning.gluon))
    # The Gluon tile runs 128 rows on 8 warps and 3 ring slots (the per-batch choice at 128
    # keys); a 128-key launch on the Triton kernels takes tile_config's fixed launch, and so does
    # an explicit block_m elsewhere (its warps and stages from tile_config, not from the per-batch
    # choice, which pairs 128 rows with 8 warps and 3 stages).
    if wide_gluon or (tuning.block_m is None and not wide):
        launch = cfg
    else:
        launch = replace(tile_config(q.dtype, D, sm_major, wide), block_n=block_n)
    block_m, block_q = rows_per_block(tuning.block_m or launch.block_m, G)
    if tuning.value_blocks is not None and D // tuning.value_blocks < _MIN_DOT_COLUMNS:
        raise ValueError(
            f"tuning: expected value_blocks <= head_dim / {_MIN_DOT_COLUMNS} = "
            f"{D // _MIN_DOT_COLUMNS} (each block keeps at least {_MIN_DOT_COLUMNS} V columns), "
            f"got value_blocks={tuning.value_blocks} at head_dim {D}")
    hint = None if host_lens is None else _check_host_lens(host_lens, B, T)
    trusted = validate and not _capturing(q.device)
    stats: HostStats | None = None
    if trusted:
        stats = _read_and_check_values(q, k_cache, cu_seqlens_q, kv_lens, block_table, block_q,
                                       block_n)
    elif hint is not None:  # the caller's lengths: statistics for the plan only
        cu = torch.tensor([0, *hint[0]], dtype=torch.int64).cumsum(0)
        stats = _host_stats(cu, torch.tensor(list(hint[1]), dtype=torch.int64), block_q, block_n)
    # Without checked statistics, bounds from shapes (no sync): every KV length fits the table.
    bound = block_table.shape[1] * page_size
    max_kv = stats.max_kv_len if stats is not None else bound
    num_q_blocks = stats.num_q_blocks if stats is not None else T // block_q + B
    num_sms = _num_sms(q.device)
    # The split size (the control mode's too) and so the workspace: from checked statistics or
    # shapes, never from host_lens.
    split_tokens = _split_tokens(split_size, block_n, max_kv if trusted else bound,
                                 (num_q_blocks if trusted else T // block_q + B) * Hkv, num_sms)
    lead_tokens = _lead_tokens(split_size, lead_split_size, split_tokens, block_n)
    num_splits = max(1, count_splits(max_kv if trusted else bound, split_tokens, lead_tokens))
    # Why the split plan could not run the keys-as-rows tile (None: it could), asked once: for
    # the split plan use_gluon below equals wide_gluon.
    kt_misfit = (None if tuning.keys_rows is False
                 else _keys_rows_misfit("split", wide_gluon, G, T, B, tuning))
    auto = plan == "auto"
    if auto:
        plan = choose_plan(
            num_q_blocks * Hkv, num_sms, max_kv, split_tokens,
            longest_tiles=stats.longest_tiles if stats is not None else None,
            total_tiles=stats.total_tiles * Hkv if stats is not None else None,
            decode=not prefill_like(T, G, B), gluon=wide_gluon,
            # Whether the split plan would run the keys-as-rows tile (speed only).
            keys_rows=tuning.keys_rows is not False and kt_misfit is None,
            num_splits=num_splits, lead_tokens=lead_tokens)
    num_warps = tuning.num_warps or launch.num_warps
    v_blocks, step, split_programs = 1, 1, 0
    if plan == "split":
        # Split programs that do work: every query block times the longest row's splits, or
        # with statistics at most each block's own splits (its tiles / split_tiles, plus one).
        # Without statistics (a CUDA-graph capture without host_lens) the block table's width
        # bounds the lengths, so a wide table keeps the defaults. Speed only.
        # Splits per row by the longest length known (checked, or the caller's host_lens), else
        # by the table's bound.
        row_splits = count_splits(max_kv, split_tokens, lead_tokens)
        live = num_q_blocks * row_splits
        # The keys-as-rows rules count programs in splits of split_tokens (one program per lead
        # split adds short programs, not chains).
        live_one = num_q_blocks * _cdiv(max_kv, split_tokens)
        if stats is not None:
            live = min(live, _cdiv(stats.total_tiles * block_n, split_tokens)
                       + num_q_blocks * (split_tokens // lead_tokens))
            live_one = min(live_one,
                           _cdiv(stats.total_tiles * block_n, split_tokens) + num_q_blocks)
        split_programs = live_one * Hkv
        if wide_gluon:  # the Gluon split kernel's rules (kernels.config)
            v_blocks = tuning.value_blocks or gluon_value_blocks(live * Hkv, num_sms)
        elif wide:  # the 64-key rules do not apply (kernels.config.wide_tile)
            v_blocks = tuning.value_blocks or 1
            step = tuning.tiles_per_step or 1
        else:
            v_blocks = tuning.value_blocks or value_blocks(q.dtype, D, live * Hkv, num_sms,
                                                           sm_major)
            step = tuning.tiles_per_step or tiles_per_step(q.dtype, D, live * Hkv, num_sms,
                                                           sm_major, block_m, num_warps,
                                                           v_blocks,
                                                           several_splits=row_splits > 1)
    # Only where the hardware has griddepcontrol (sm_90+) and Triton exposes it (3.4+), and only
    # when there is a merge.
    has_pdl = HAS_GDC and sm_major is not None and sm_major >= 9
    dependent = (plan == "split" and num_splits > 1 and has_pdl
                 and (tuning.dependent_merge is None or tuning.dependent_merge))
    nested = False
    num_stages = launch.num_stages
    if tuning.block_m is None and not wide:  # an explicit block_m keeps tile_config's stages
        num_stages = decode_stages(q.dtype, D, block_m, num_warps, num_stages, sm_major)
    if plan == "fused" and wide:
        # The Gluon kernel walks each split in its own inner loop; Triton's flat loop otherwise.
        nested = wide_gluon if tuning.nested_loop is None else tuning.nested_loop
        step = (tuning.tiles_per_step or 1) if nested else 1
    elif plan == "fused":
        nested, rule_step = fused_loop(q.dtype, D, block_m, num_warps, sm_major)
        nested = nested if tuning.nested_loop is None else tuning.nested_loop
        # The flat loop walks one tile per step.
        step = (tuning.tiles_per_step or rule_step) if nested else 1
    use_gluon = False
    if wide:
        use_gluon = wide_gluon
    elif plan == "fused" and tuning.gluon is not False:
        page_size = k_cache.shape[1]
        shape_misfit = None if gluon_prefill(q.dtype, D, block_m, block_n, num_warps, page_size,
                                             nested, sm_major) else (
            f"the prefill tile on Hopper (fp16/bf16, head_dim 128, block_m 128 on 8 warps, "
            f"block_n 64, nested loop, page_size >= 16), got {q.dtype}, head_dim {D}, "
            f"block_m {block_m} on {num_warps} warps, block_n {block_n}, nested {nested}, "
            f"page_size {page_size}, compute capability major {sm_major}")
        use_gluon = _gluon_ready(q, k_cache, v_cache, shape_misfit, required=bool(tuning.gluon))
    elif tuning.gluon:
        chosen = " (plan='auto' chose it for this batch; pass plan='fused')" if auto else ""
        raise ValueError(
            f"tuning: gluon=True needs the 128-key contract for the split plan (Hopper, "
            f"fp16/bf16, head_dim 128, Triton 3.6) or the fused plan, got plan {plan!r}{chosen} "
            f"at block_n {block_n}, {q.dtype}, head_dim {D}, compute capability major "
            f"{sm_major}")
    num_stages = tuning.num_stages or num_stages
    if use_gluon:  # the Gluon kernels pipeline through their TMA ring (kernels._gluon.ring_slots)
        from kernels import _gluon  # light: imports no Triton

        num_stages = _gluon.ring_slots(block_n, v_blocks)
    keys_rows = ahead = walk = False
    walk_splits = 1
    if tuning.keys_rows is not False:
        misfit = (kt_misfit if plan == "split"
                  else _keys_rows_misfit(plan, use_gluon, G, T, B, tuning))
        if misfit is None:
            from kernels import _gluon  # light: imports no Triton

            keys_rows = True
            block_m = _gluon.kt_rows(G)
            block_q = block_m // G
            lead_splits = split_tokens // lead_tokens
            walk = lead_splits > 1 and (
                kt_walk_lead(live * Hkv, max_kv <= split_tokens, num_sms)
                if tuning.walk_lead is None else tuning.walk_lead)
            if walk:  # the workspace and the merge count splits of split_tokens
                num_splits = max(1, _cdiv(max_kv if trusted else bound, split_tokens))
                dependent = dependent and num_splits > 1
                walk_splits = kt_walk_splits(split_programs, num_sms)
            # The schedule rules count the programs launched (one per lead split, or walking).
            programs = _cdiv(split_programs, walk_splits) if walk else live * Hkv
            v_blocks = tuning.value_blocks or kt_value_blocks(programs, num_sms)
            # Measured faster only on the 4-slot ring of 2 V blocks (kt_scores_ahead).
            ahead = (v_blocks == 2 and kt_scores_ahead(programs, num_sms)
                     if tuning.scores_ahead is None else tuning.scores_ahead)
            num_warps, num_stages = 4, _gluon.kt_ring_slots(v_blocks, block_m)
        elif tuning.keys_rows:
            chosen = (" (plan='auto' chose another plan; pass plan='split')"
                      if auto and plan != "split" else "")
            raise ValueError(f"tuning: keys_rows=True needs {misfit}{chosen}")
    if tuning.walk_lead and not keys_rows:
        raise ValueError("tuning: walk_lead=True needs the keys-as-rows tile "
                         "(LaunchPlan.keys_rows; Tuning(keys_rows=True) names why it is off)")
    if tuning.scores_ahead and not keys_rows:
        raise ValueError("tuning: scores_ahead=True needs the keys-as-rows tile "
                         "(LaunchPlan.keys_rows; Tuning(keys_rows=True) names why it is off)")
    if keys_rows:
        from kernels import _gluon  # light: imports no Triton

        misfit = _gluon.kt_schedule_misfit(block_m, D, v_blocks, num_stages, ahead)
        if misfit is not None:  # reachable: scores_ahead=True on one V block at 32 rows
            raise ValueError(f"tuning: the keys-as-rows tile (GQA group {G}) needs {misfit}")
    ordered = plan == "fused" and (
        slot_order(num_q_blocks * Hkv, num_sms, T, G, B)
        if tuning.slot_order is None else tuning.slot_order)
    return LaunchPlan(
        plan=plan, block_m=block_m, block_q=block_q, block_n=block_n,
        num_warps=num_warps,
        num_stages=num_stages,
        split_tokens=split_tokens, split_tiles=split_tokens // block_n,
        lead_tokens=lead_tokens, lead_tiles=lead_tokens // block_n,
        # The workspace depth: from checked lengths or the table's bound, never from host_lens.
        num_splits=num_splits,
        num_slots=T // block_q + B, value_blocks=v_blocks, tiles_per_step=step,
        dependent_merge=dependent, slot_order=ordered, nested_loop=nested, gluon=use_gluon,
        keys_rows=keys_rows, scores_ahead=ahead, walk_lead=walk, walk_splits=walk_splits,
        max_kv_len=max_kv, is_control=split_size is None, stats=stats)


def _keys_rows_misfit(plan: str, use_gluon: bool, G: int, T: int, B: int,
                      tuning: Tuning) -> str | None:
    """Why the keys-as-rows decode tile cannot serve this call (None: it can). It needs the
    split plan on the 128-key Gluon kernels, a GQA group of at most 32 heads, and none of the
    launch overrides it does not take (``block_m``, ``num_warps``, ``value_blocks`` other than
    1 or 2, ``tiles_per_step`` other than 1: ``num_stages`` other than 3 already leaves the
    Gluon kernels). With ``tuning.keys_rows`` True any such batch qualifies (prompts too:
    correct, not fast); otherwise, from shapes alone, only batches of at most ``kt_rows(G) //
    G`` query tokens per request on average (decode; its blocks hold that many tokens, and
    each block walks its request's keys) with GQA groups of at most 16 (groups of 17-32 were
    not run on a GPU), and no ``num_stages`` override either: where the split plan runs such
    batches it was 1-7% faster than the 128-row tile on every one timed
    (reports/h100-round23/README.md)."""
    if plan != "split" or not use_gluon:
        return (f"the split plan on the 128-key Gluon kernels, got plan {plan!r}, gluon "
                f"{use_gluon} (LaunchPlan.gluon; Tuning(gluon=True) names why it is off)")
    if G > 32:
        return f"a GQA group of at most 32 query heads, got {G}"
    given = [f"{name}={getattr(tuning, name)}" for name, free in (
        ("block_m", None), ("num_warps", None), ("tiles_per_step", 1))
        if getattr(tuning, name) not in (None, free)]
    if tuning.value_blocks not in (None, 1, 2):
        given.append(f"value_blocks={tuning.value_blocks}")
    if given:
        return (f"no block_m, num_warps or tiles_per_step override and value_blocks 1 or 2, "
                f"got {given}")
    if tuning.keys_rows:
        return None
    from kernels import _gluon  # light: imports no Triton

    per_request = _gluon.kt_rows(G) // G
    if G > 16 or per_request * B < T or tuning.num_stages is not None \
            or tuning.value_blocks is not None or tuning.tiles_per_step is not None:
        return (f"(for the default) a GQA group of at most 16, at most {per_request} query "
                f"tokens per request and no launch override")
    return None


def _gluon_installed(dtype: torch.dtype, head_dim: int, sm_major: int | None) -> bool:
    """Whether the Gluon kernels can be built for this call's (dtype, head_dim, GPU): asked
    (importing them) only where they could serve it, half precision at head dim 128 on Hopper
    (:func:`~kernels.config.wide_tile`). Fixed per deployment: it picks the contract's tile
    width (:func:`~kernels.config.tile_config`)."""
    if not wide_tile(dtype, head_dim, WIDE_BLOCK_N, sm_major):
        return False
    from kernels import _gluon  # light: imports no Triton until asked

    return _gluon.available()


def _wide_gluon_misfit(q: torch.Tensor, k_cache: torch.Tensor, block_n: int,
                       sm_major: int | None, tuning: Tuning) -> str | None:
    """Why a 128-key launch cannot run the Gluon tile by its shapes and ``Tuning`` (None: it
    can): :func:`~kernels.config.gluon_tile`, and no override the tile cannot take (it runs
    128 rows on two warpgroups, one inner loop per split, one tile per step, all V columns or
    2 or 4 V column blocks in the split plan)."""
    D, page_size = q.shape[2], k_cache.shape[1]
    if not gluon_tile(q.dtype, D, block_n, page_size, sm_major):
        return f"pages of at least 16 tokens for the 128-key Gluon tile, got page_size {page_size}"
    G = q.shape[1] // k_cache.shape[2]
    if rows_per_block(128, G)[0] != 128:
        return (f"a GQA group of at most 128 query heads per KV head for the 128-key Gluon tile "
                f"(128 rows), got {G}")
    fixed = {"block_m": (128,), "num_warps": (8,), "num_stages": (3,), "nested_loop": (True,),
             "value_blocks": (1, 2, 4), "tiles_per_step": (1,)}
    bad = [f"{k}={getattr(tuning, k)!r}" for k, v in fixed.items()
           if getattr(tuning, k) not in (None, *v)]
    if bad:
        return ("no Tuning override the 128-key Gluon tile cannot take (block_m 128, num_warps "
                f"8, num_stages 3 (its ring slots with one V block), nested_loop True, "
                f"value_blocks 1, 2 or 4, tiles_per_step 1), got {', '.join(bad)}")
    return None


def _gluon_ready(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 shape_misfit: str | None, required: bool) -> bool:
    """Whether this launch runs the Gluon kernels: the shape rule (``shape_misfit`` None:
    :func:`~kernels.config.gluon_prefill` at 64 keys, :func:`_wide_gluon_misfit` at 128), caches
    TMA can read and Triton 3.6's Gluon. With ``required`` (``Tuning(gluon=True)``) a launch
    that is not eligible raises, naming every reason."""
    from kernels import _gluon  # light: the kernels are imported by _gluon_installed, if at all

    reasons = [] if shape_misfit is None else [shape_misfit]
    misfit = _gluon.cache_misfit(k_cache, v_cache)
    if misfit is not None:
        reasons.append(misfit)
    # Only where the rest allows it (cached after the first import).
    if not reasons or required:
        missing = _gluon.unavailable_reason()
        if missing is not None:
            reasons.append(missing)
    if reasons and required:
        raise ValueError("tuning: gluon=True needs " + "; ".join(reasons))
    return not reasons


# ------------------------------------------------------------------------------------------------
# Launchers
# ------------------------------------------------------------------------------------------------

def _k_rows(lp: LaunchPlan, dtype: torch.dtype) -> bool:
    """``IS_K_ROWS``: load K as ``[BLOCK_N, D]`` rows like V (the same keys per thread, so the
    page ids and slots of a thread's keys serve both loads; the dot reads it transposed) rather
    than as ``[D, BLOCK_N]`` columns. Bit-neutral: the same values reach the same dot (on an H100,
    bf16: 32 of 32 output hashes equal to round 4's column-only kernels and 0 of 96 probe runs
    differing; every perturbation of the full check that compares a decode tile with a 128-row
    tile compares the two loads, at fp16 and bf16; CPU tests). So it follows speed, measured on
    an H100 in one session (reports/h100-round5/final/probe-k-rows.jsonl): rows in the split
    kernel (decode-b1-ctx1k 33.3 -> 32.4 us; prefill-varlen and mixed64 5% faster when forced
    there) and in the fused kernel's tiles of up to 64 rows (decode-b8-ctx32k 1209 -> 1119 us);
    columns in the fused kernel's 128-row tiles on 4 warps (prefill-varlen 9003 -> 9639 us and
    mixed64 +7% with rows), its 256-row tiles (round 11: 1.0-1.6% faster with rows, still slower
    than the nested loop) and for float32 (FMA dots). The fused kernel's nested loop takes rows
    (round 11, 128 rows on 8 warps: mixed64 2221 -> 2116 us, prefill-varlen 8788 -> 8245 us;
    reports/h100-round11/README.md)."""
    return dtype != torch.float32 and (lp.plan == "split" or lp.block_m <= 64 or lp.nested_loop)


def _attention_args(lp: LaunchPlan, q: torch.Tensor, k_cache: torch.Tensor,
                    v_cache: torch.Tensor, block_table: torch.Tensor,
                    qk_scale: float) -> dict[str, Any]:
    """Scalar, stride and constexpr arguments shared by the fused and the split kernels."""
    T, Hq, D = q.shape
    num_pages, page_size, Hkv, _ = k_cache.shape
    return dict(
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
                  lse: torch.Tensor, qk_scale: float) -> None:
    """One program per (query-block slot, KV head): all splits, merged in registers. With
    ``lp.slot_order`` the slots are first sorted on the device, requests with the most KV first
    and each request's last blocks first (``_slot_keys_kernel``, then ``_slot_rank_kernel``:
    two small launches, no sync, so CUDA graphs capture them), and program i takes slot
    ``order[i]``. (``torch.argsort`` took about 40 us on an H100, round 10.)"""
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
        q, k_cache, v_cache, cu_seqlens_q, kv_lens, block_table, order, out, lse,
        IS_SLOT_ORDER=lp.slot_order, IS_NESTED=lp.nested_loop, TILES_PER_STEP=lp.tiles_per_step,
        **_attention_args(lp, q, k_cache, v_cache, block_table, qk_scale))


def _launch_split(lp: LaunchPlan, inputs: tuple[torch.Tensor, ...], out: torch.Tensor,
                  lse: torch.Tensor, qk_scale: float) -> None:
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
                        walk_splits=lp.walk_splits)
        if not direct:
            _launch_merge(lp, ws_o, ws_ml, inputs, out, lse)
        return
    if lp.gluon:
        from kernels._gluon import launch_split

        launch_split(q, k_cache, v_cache, cu_seqlens_q, kv_lens, block_table, ws_o, ws_ml, out,
                     lse, qk_scale, num_slots=lp.num_slots, num_splits=lp.num_splits,
                     split_tiles=lp.split_tiles, block_m=lp.block_m, block_q=lp.block_q,
                     block_n=lp.block_n, direct=direct, value_blocks=lp.value_blocks,
                     dependent_merge=lp.dependent_merge, lead_tiles=lp.lead_tiles)
        if not direct:
            _launch_merge(lp, ws_o, ws_ml, inputs, out, lse)
        return
    _unified_attention_split_kernel[(lp.num_slots, Hkv * lp.value_blocks, lp.num_splits)](
        q, k_cache, v_cache, cu_seqlens_q, kv_lens, block_table, ws_o, ws_ml, out, lse,
        num_splits=lp.num_splits, IS_DIRECT=direct, BLOCK_DV=D // lp.value_blocks,
        TILES_PER_STEP=lp.tiles_per_step, IS_PDL=lp.dependent_merge,
        **_attention_args(lp, q, k_cache, v_cache, block_table, qk_scale))
    if not direct:
        _launch_merge(lp, ws_o, ws_ml, inputs, out, lse)


def _launch_merge(lp: LaunchPlan, ws_o: torch.Tensor, ws_ml: torch.Tensor,
                  inputs: tuple[torch.Tensor, ...], out: torch.Tensor, lse: torch.Tensor) -> None:
    """One program per (query token, block of query heads, block of head-dim columns) folds its
    rows' partials in split order. With ``lp.dependent_merge`` it is a programmatic dependent launch
    (``launch_pdl``): scheduled while the split kernel finishes, it waits in-kernel for that
    kernel's writes."""
    q, k_cache, _, cu_seqlens_q, kv_lens, block_table = inputs
    T, Hq, D = q.shape
    block_d, block_h = _merge_block_d(D), _merge_block_h(Hq)
    assert D % block_d == 0, (D, block_d)  # internal: every column belongs to one program
    _merge_splits_kernel[(T, triton.cdiv(Hq, block_h), D // block_d)](
        ws_o, ws_ml, cu_seqlens_q, kv_lens, out, lse,
        split_tokens=lp.split_tokens,
        # A walking keys-as-rows program stores one state per split of split_tokens.
        lead_tokens=lp.split_tokens if lp.walk_lead else lp.lead_tokens, B=kv_lens.shape[0],
        Hq=Hq, num_splits=lp.num_splits,
        max_kv_len=block_table.shape[1] * k_cache.shape[1],
        HEAD_DIM=D, BLOCK_H=block_h, BLOCK_D=block_d,
        CHUNK=_merge_chunk(), IS_PDL=lp.dependent_merge, num_warps=_MERGE_NUM_WARPS,
        **({"launch_pdl": True} if lp.dependent_merge else {}))


# ------------------------------------------------------------------------------------------------
# Public entry point
# ------------------------------------------------------------------------------------------------

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
) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal attention of a varlen batch of requests over a paged KV cache.

    ``B`` requests with ``T`` query tokens in total; ``Hq`` query heads, ``Hkv`` KV heads
    (``G = Hq / Hkv`` query heads per KV head), head dim ``D`` (64, 128 or 256).

    Args:
        q: ``[T, Hq, D]`` queries, requests concatenated (float16, bfloat16 or float32), last dim
            contiguous.
        k_cache, v_cache: ``[num_pages, page_size, Hkv, D]``, q's dtype; ``Hq % Hkv == 0``,
            ``page_size`` a power of two.
        cu_seqlens_q: ``[B + 1]`` int32 query offsets: 0, non-decreasing, last == T.
        kv_lens: ``[B]`` int32 KV length of each request, ``kv_lens[b] >= q_len[b]``. Query token
            i of request b sits at position ``kv_lens[b] - q_len[b] + i`` and sees ``[0, pos]``.
        block_table: ``[B, max_pages]`` int32, logical page -> physical page of ``k/v_cache``;
            only the first ``ceil(kv_lens[b] / page_size)`` entries of row b are read.
        sm_scale: softmax scale, a finite positive real (``sm_scale * log2(e)`` a normal
            float32); default ``1 / sqrt(D)``.
        split_size: KV tokens per split, a positive multiple of the tile config's BLOCK_N (64,
            or 128 for half precision at head dim 128 on Hopper with Triton 3.6; bit-defining:
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
            trusted (kernels/README.md, "What validate=False trusts"): malformed values give
            garbage rows but never an out-of-bounds access.
        tuning: launch-setting overrides (:class:`Tuning`; its docstring says which are
            bit-neutral). Default: :func:`~kernels.config.batch_tuning` (shapes only).
        host_lens: optional host copies ``(q_lens, kv_lens)`` of the batch's lengths (an engine
            has them before it launches or captures a CUDA graph): they steer ``plan="auto"``
            when the lengths are not read back (``validate=False`` or during capture), without a
            sync. Speed only: plans are bit-identical, and memory sizes never come from them.

    Returns:
        ``(out [T, Hq, D] in q's dtype, lse [T, Hq] float32)``; lse is the natural log of
        ``sum exp(sm_scale * q.k)``. A row attending to nothing gets ``out = 0, lse = -inf``.

    Raises:
        ValueError: naming the argument, the expected and the actual value.
    """
    scale = _check_sm_scale(sm_scale)
    lp = plan_attention(q, k_cache, v_cache, cu_seqlens_q, kv_lens, block_table,
                        split_size=split_size, lead_split_size=lead_split_size, plan=plan,
                        validate=validate, tuning=tuning, host_lens=host_lens)
    T, Hq, D = q.shape
    if scale is None:
        scale = 1.0 / math.sqrt(D)
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty((T, Hq), dtype=torch.float32, device=q.device)
    if T == 0:
        return out, lse
    inputs = (q, k_cache, v_cache, cu_seqlens_q.contiguous(), kv_lens.contiguous(), block_table)
    launch = _launch_fused if lp.plan == "fused" else _launch_split
    launch(lp, inputs, out, lse, scale * _LOG2E)
    return out, lse
