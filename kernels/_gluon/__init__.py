"""Gluon kernels for Hopper: the fused plan's tile and, at 128 keys, the split plan's two
(the 128-row tile and the keys-as-rows decode tile; kernels/README.md, "The 128-key contract
and the Gluon kernels" and "The keys-as-rows decode tile"). This module is light
(no Triton import); the kernel module (``attention_kernels``, Triton 3.6's Gluon) is imported
where :func:`available` is first asked, which the launcher does only for half precision at head
dim 128 on Hopper (the calls it serves by default) or where a measured table entry or a
``Tuning`` asks for it (head dim 64, whose contract is 128-key tiles too)."""

from __future__ import annotations

import functools
from typing import Any

import torch

#: The Triton release line whose Gluon the kernels are written and proven for. Gluon is
#: experimental and its API moves between releases, so any other release runs the Triton
#: kernels.
GLUON_TRITON = "3.6."
#: K/V slots of the Gluon kernels' TMA ring for 64-key tiles (each 2 x 64 x 128 half-precision
#: elements, 32 KB): scheduling only, like Triton's pipeline stages.
RING_SLOTS = 4
#: K/V slots for 128-key tiles (64 KB each; with q's 32 KB a fourth does not fit in 227 KB).
RING_SLOTS_128 = 3
#: K/V slots for 128-key tiles whose V slots hold half or a quarter of the columns (48 or 40 KB
#: each: four fit with q's 32 KB).
RING_SLOTS_128_BLOCKED = 4


def ring_slots(block_n: int, value_blocks: int = 1) -> int:
    """K/V slots of the TMA ring for ``block_n``-key tiles (with ``value_blocks`` V column
    blocks per program at 128 keys)."""
    if block_n == 64:
        return RING_SLOTS
    return RING_SLOTS_128 if value_blocks == 1 else RING_SLOTS_128_BLOCKED


def _descriptors(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 block_n: int, value_blocks: int = 1) -> tuple[list[Any], int]:
    """TMA descriptors of the caches seen as ``[pages * page_size, Hkv * D]`` rows, boxes of
    ``min(page_size, block_n)`` rows (one per page, or the tile inside a larger page) and, for V,
    ``D / value_blocks`` columns; and that box height. Built on the host from shapes and pointers
    alone (no sync: a CUDA graph captures them as kernel parameters)."""
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from kernels._gluon import attention_kernels as ak

    D = q.shape[2]
    num_pages, page_size, Hkv, _ = k_cache.shape
    box = min(page_size, block_n)
    dv = D // value_blocks
    v_layout = ak.SMEM_L.value if dv == D else gl.NVMMASharedLayout(
        swizzle_byte_width=min(128, dv * q.element_size()), element_bitwidth=16, rank=2)
    return [TensorDescriptor.from_tensor(k_cache.view(num_pages * page_size, Hkv * D), [box, D],
                                         ak.SMEM_L.value),
            TensorDescriptor.from_tensor(v_cache.view(num_pages * page_size, Hkv * D), [box, dv],
                                         v_layout)], box


@functools.cache
def unavailable_reason() -> str | None:
    """Why the Gluon kernels cannot be compiled here (None: they can): they need Triton 3.6.x,
    whose Gluon module must import them."""
    try:
        import triton
    except ImportError:
        return "Triton is not installed"
    if not triton.__version__.startswith(GLUON_TRITON):
        return f"Triton {GLUON_TRITON}x with Gluon, got Triton {triton.__version__}"
    try:
        import kernels._gluon.attention_kernels  # noqa: F401
    except Exception as exc:  # any failure means: not this Triton's Gluon
        return f"Triton {triton.__version__}'s Gluon to import the kernel, got {exc!r}"
    return None


def available() -> bool:
    """Whether the Gluon kernels can be compiled here (:func:`unavailable_reason`)."""
    return unavailable_reason() is None


def cache_misfit(k_cache: torch.Tensor, v_cache: torch.Tensor) -> str | None:
    """Why TMA cannot read the caches as ``[pages * page_size, Hkv * D]`` rows (None: it can):
    they must be contiguous, start 16-byte aligned, and have fewer than ``2**31`` token rows
    (TMA coordinates are int32)."""
    rows = k_cache.shape[0] * k_cache.shape[1]
    for name, c in (("k_cache", k_cache), ("v_cache", v_cache)):
        if not c.is_contiguous():
            return f"{name} contiguous, got strides {tuple(c.stride())}"
        if c.data_ptr() % 16 != 0:
            return f"{name} 16-byte aligned, got data_ptr % 16 == {c.data_ptr() % 16}"
    if rows >= 2**31:
        return f"fewer than 2**31 token rows in the caches, got {rows}"
    return None


def launch_fused_prefill(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                         cu_seqlens_q: torch.Tensor, kv_lens: torch.Tensor,
                         block_table: torch.Tensor, slot_order: torch.Tensor, out: torch.Tensor,
                         lse: torch.Tensor, qk_scale: float, *, num_slots: int, split_tiles: int,
                         block_m: int, block_q: int, block_n: int, is_slot_order: bool,
                         lead_tiles: int | None = None) -> None:
    """The fused plan's grid ``(num_slots, Hkv)`` on the Gluon kernel (``block_m`` 128,
    ``block_n`` 64 or 128). ``split_tiles`` and ``lead_tiles`` (default ``split_tiles``: no
    lead splits) are the contract's splits in KV tiles (kernels/README.md, "Lead splits").

    Shapes: q ``[T, Hq, D]``; k_cache, v_cache ``[P, PS, Hkv, D]`` contiguous; cu_seqlens_q
    ``[B + 1]``, kv_lens ``[B]``, block_table ``[B, max_pages]`` int32; slot_order
    ``[num_slots]`` int32 (read only with ``is_slot_order``); out ``[T, Hq, D]``, lse
    ``[T, Hq]`` fp32, contiguous."""
    from kernels._gluon import attention_kernels as ak

    T, Hq, D = q.shape
    num_pages, page_size, Hkv, _ = k_cache.shape
    descs, box = _descriptors(q, k_cache, v_cache, block_n)
    ak._fused_prefill_kernel[(num_slots, Hkv)](
        q, *descs, cu_seqlens_q, kv_lens, block_table, slot_order, out, lse,
        qk_scale, split_tiles, lead_tiles or split_tiles, block_table.shape[0], T, Hq, num_pages,
        block_table.shape[1] * page_size, q.stride(0), q.stride(1), block_table.stride(0),
        G=Hq // Hkv, HEAD_DIM=D, PAGE_SIZE=page_size, BLOCK_M=block_m, BLOCK_Q=block_q,
        BLOCK_N=block_n, BOX=box, IS_SLOT_ORDER=is_slot_order, STAGES=ring_slots(block_n),
        num_warps=4)


def launch_split(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 cu_seqlens_q: torch.Tensor, kv_lens: torch.Tensor, block_table: torch.Tensor,
                 ws_o: torch.Tensor, ws_ml: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                 qk_scale: float, *, num_slots: int, num_splits: int, split_tiles: int,
                 block_m: int, block_q: int, block_n: int, direct: bool, value_blocks: int = 1,
                 dependent_merge: bool = False, lead_tiles: int | None = None) -> None:
    """The split plan's first phase, grid ``(num_slots, Hkv * value_blocks, num_splits)``, on
    the Gluon kernel (``block_m`` 128, ``block_n`` 128): each split's raw state where the Triton
    split kernel writes it, for the package's merge; with ``direct`` (``num_splits == 1``) the
    result itself into out and lse, as the Triton split kernel's ``IS_DIRECT``. Scheduling only
    (``_split_kernel``): ``value_blocks`` (1, 2 or 4) V column blocks per (slot, KV head,
    split); ``dependent_merge``: the merge that follows is a programmatic dependent launch,
    which every program lets start at once. ``split_tiles`` and ``lead_tiles`` as
    :func:`launch_fused_prefill`'s.

    Shapes: as :func:`launch_fused_prefill`; ws_o ``[T, Hq, num_splits, D]`` and ws_ml
    ``[T, Hq, num_splits, 2]`` fp32, contiguous (not read with ``direct``)."""
    from kernels._gluon import attention_kernels as ak

    T, Hq, D = q.shape
    num_pages, page_size, Hkv, _ = k_cache.shape
    if value_blocks not in (1, 2, 4):
        raise ValueError(f"launch_split: expected value_blocks 1, 2 or 4, got {value_blocks}")
    descs, box = _descriptors(q, k_cache, v_cache, block_n, value_blocks)
    ak._split_kernel[(num_slots, Hkv * value_blocks, num_splits)](
        q, *descs, cu_seqlens_q, kv_lens, block_table, ws_o, ws_ml, out, lse, qk_scale,
        split_tiles, lead_tiles or split_tiles,
        block_table.shape[0], T, Hq, num_pages, block_table.shape[1] * page_size, num_splits,
        q.stride(0), q.stride(1), block_table.stride(0),
        G=Hq // Hkv, HEAD_DIM=D, PAGE_SIZE=page_size, BLOCK_M=block_m, BLOCK_Q=block_q,
        BLOCK_N=block_n, BOX=box, STAGES=ring_slots(block_n, value_blocks), IS_DIRECT=direct,
        VALUE_BLOCKS=value_blocks, IS_PDL=dependent_merge and not direct, num_warps=4)


#: K/V slots of the keys-as-rows decode tile's ring (64 KB each: 128-key tiles at head dim 128,
#: 64-key tiles at head dim 256).
RING_SLOTS_KT = 3
#: K/V slots of that ring when its V slots hold half the columns or fewer (48 KB each at most),
#: for blocks of at most 16 rows (at 32 rows q, p and the row sum's scratch leave room for 3).
RING_SLOTS_KT_BLOCKED = 4
#: The keys-as-rows tile's (head dim, KV tile width) pairs: the contract's tile at each head dim
#: it serves (kernels.config.CONTRACT / WIDE_CONTRACT for half precision on Hopper).
KT_TILES = ((64, 128), (128, 128), (256, 64))


def kt_rows(group: int) -> int:
    """Rows per block of the keys-as-rows decode tile (the MMA's N) for GQA group ``group``:
    the smallest of 8, 16, 32 that holds one token's group."""
    if not 1 <= group <= 32:
        raise ValueError(f"kt_rows: expected a GQA group of 1 to 32 query heads, got {group}")
    from kernels.config import rows_per_block  # no Triton import

    return rows_per_block(8, group)[0]


def kt_ring_slots(value_blocks: int = 1, rows: int = 8, head_dim: int = 128) -> int:
    """K/V slots of the keys-as-rows tile's ring with ``value_blocks`` V column blocks, blocks
    of ``rows`` rows and ``head_dim``: 4 with V blocks at up to 16 rows, else 3; 2 at head dim
    256 with 32 rows on one V block (the state's 256 x 32 float32 store scratch: 3 slots need
    250 KB, over Hopper's 227; ``benchmarks/kernel_stats.py`` prints each build's)."""
    if head_dim > 128 and rows > 16 and value_blocks == 1:
        return 2
    return RING_SLOTS_KT_BLOCKED if value_blocks >= 2 and rows <= 16 else RING_SLOTS_KT


def kt_schedule_misfit(rows: int, head_dim: int, value_blocks: int, stages: int,
                       scores_ahead: bool) -> str | None:
    """Why the keys-as-rows tile cannot run these scheduling settings (None: it can): 1, 2 or
    4 V column blocks of at least 64 columns each (the ``p @ v`` MMA's M), at least 2 ring
    slots (at head dim 256 no more than :func:`kt_ring_slots` gives: its slots and store
    scratch fill the shared memory), and with the scores ahead 2 V blocks at 32 rows (one
    block's ring and the second p buffer overflow Hopper's shared memory)."""
    if value_blocks not in (1, 2, 4) or head_dim // value_blocks < 64:
        return (f"value_blocks 1, 2 or 4 with at least 64 V columns each (the p @ v MMA's M), "
                f"got {value_blocks} at head dim {head_dim}")
    if stages < 2:
        return f"at least 2 ring slots, got {stages}"
    most = kt_ring_slots(value_blocks, rows, head_dim)
    if head_dim > 128 and stages > most:
        return (f"at most {most} ring slots at head dim {head_dim} with {rows} rows and "
                f"{value_blocks} V block(s) (shared memory), got {stages}")
    if scores_ahead and value_blocks == 1 and rows > 16:
        if head_dim // 2 < 64:
            return (f"scores_ahead=False at {rows} rows and head dim {head_dim} (its shared "
                    f"memory needs 2 V blocks, which head dim {head_dim} cannot have), got "
                    f"scores_ahead=True")
        return (f"value_blocks=2 for the scores ahead at {rows} rows (shared memory), got "
                f"value_blocks=1")
    return None


def launch_split_kt(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    cu_seqlens_q: torch.Tensor, kv_lens: torch.Tensor, block_table: torch.Tensor,
                    ws_o: torch.Tensor, ws_ml: torch.Tensor, out: torch.Tensor,
                    lse: torch.Tensor, qk_scale: float, *, num_slots: int, num_splits: int,
                    split_tiles: int, block_q: int, direct: bool, value_blocks: int = 1,
                    stages: int | None = None, scores_ahead: bool = False,
                    dependent_merge: bool = False, lead_tiles: int | None = None,
                    walk: bool = False, walk_splits: int = 1, block_n: int = 128) -> None:
    """:func:`launch_split` on the keys-as-rows decode tile (``_split_kt_kernel``; ``block_n``
    the contract's tile, one of :data:`KT_TILES` with the head dim): blocks of ``block_q``
    tokens (``kt_rows(G) // G``), grid ``(num_slots, Hkv * value_blocks, num_splits)`` with
    ``num_slots = T // block_q + B``; ``value_blocks`` 1, 2 or 4 (V column blocks of 64
    columns at least), ``stages`` the ring's slots (default :func:`kt_ring_slots`),
    ``scores_ahead`` the issue order (the next tile's scores before this tile's ``p @ v``):
    scheduling only, no bit. Same shapes and stores as :func:`launch_split`.
    ``walk``: program ``i`` walks splits ``[i * walk_splits, (i + 1) * walk_splits)`` of
    ``split_tiles``, folds the lead splits in the first and stores each
    (``_split_kt_kernel``'s ``WALK``): ``num_splits`` and ``direct`` count splits of
    ``split_tiles``, as the merge must (scheduling only, no bit).
    The settings are checked before the kernel module is imported."""
    T, Hq, D = q.shape
    num_pages, page_size, Hkv, _ = k_cache.shape
    if (D, block_n) not in KT_TILES:
        raise ValueError(f"launch_split_kt: expected (head dim, block_n) in {KT_TILES}, got "
                         f"({D}, {block_n})")
    G = Hq // Hkv
    rows = kt_rows(G)
    if block_q != rows // G:
        raise ValueError(f"launch_split_kt: expected block_q {rows // G} (kt_rows({G}) // {G}), "
                         f"got {block_q}")
    slots = kt_ring_slots(value_blocks, rows, D) if stages is None else stages
    misfit = kt_schedule_misfit(rows, D, value_blocks, slots, scores_ahead)
    if misfit is not None:
        raise ValueError(f"launch_split_kt: expected {misfit}")
    from kernels._gluon import attention_kernels as ak

    descs, box = _descriptors(q, k_cache, v_cache, block_n, value_blocks)
    grid_splits = -(-num_splits // walk_splits) if walk else num_splits
    ak._split_kt_kernel[(num_slots, Hkv * value_blocks, grid_splits)](
        q, *descs, cu_seqlens_q, kv_lens, block_table, ws_o, ws_ml, out, lse, qk_scale,
        split_tiles, lead_tiles or split_tiles, block_table.shape[0], T, Hq, num_pages,
        block_table.shape[1] * page_size, num_splits, walk_splits, q.stride(0), q.stride(1),
        block_table.stride(0), G=G, HEAD_DIM=D, PAGE_SIZE=page_size, ROWS=rows, BLOCK_Q=block_q,
        BLOCK_N=block_n, BOX=box, STAGES=slots, IS_DIRECT=direct,
        VALUE_BLOCKS=value_blocks, AHEAD=scores_ahead, IS_PDL=dependent_merge and not direct,
        WALK=walk, num_warps=4)
