"""The kernels' settings: the bit-defining contract and the bit-neutral schedule rules (pure
functions of shapes; no tensor is touched, nothing is read from the device).

Bit-defining (kernels/README.md, "Bit-defining and bit-neutral settings"): the KV tile width
(``BLOCK_N``), the split and lead-split sizes, the MMA family (fixed by :func:`tile_config` per
dtype, head dim and GPU) and the fold order. They never depend on a batch.

Bit-neutral: everything else this module decides (plan, rows per program within one MMA family,
warps, stages, V column blocks, tiles per loop step, loop structure, program order, the Gluon
kernels). Each rule below says what it controls and what it reads. The rules are the fallback
of the measured table (:mod:`kernels.tuned`): a call whose shape bucket the running GPU's table
names runs that entry's settings instead (ARCHITECTURE.md, "Tuning"). The rules were measured
for half precision at head dim 128 on Hopper (the history: CHANGELOG.md); elsewhere (other
head dims, float32, other GPUs, the interpreter) they keep :func:`tile_config`'s fixed launch.
The harness proves them bit-neutral on the GPU (reports/<gpu>/, the full check).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

__all__ = [
    "CONTRACT",
    "DEFAULT_LEAD_SPLIT_SIZE",
    "DEFAULT_SPLIT_SIZE",
    "GLUON_HEAD_DIMS",
    "NOMINAL_NUM_SMS",
    "SUPPORTED_DTYPES",
    "SUPPORTED_HEAD_DIMS",
    "WIDE_BLOCK_N",
    "WIDE_CONTRACT",
    "TileConfig",
    "batch_tuning",
    "control_num_splits",
    "count_splits",
    "decode_stages",
    "fused_loop",
    "gluon_tile",
    "gluon_value_blocks",
    "kt_scores_ahead",
    "kt_tile",
    "kt_value_blocks",
    "kt_walk_lead",
    "kt_walk_splits",
    "slot_order",
    "tile_config",
    "tiles_per_step",
    "value_blocks",
    "wide_tile",
]

#: KV tokens per split, a multiple of every BLOCK_N below. Bit-defining. The latency/throughput
#: knob of a deployment: smaller splits make short decodes faster and long contexts and prefill
#: slower (the measured trade-off: CHANGELOG.md).
DEFAULT_SPLIT_SIZE: int = 1024

#: KV tokens per lead split: the first :data:`DEFAULT_SPLIT_SIZE` tokens of every row are cut
#: into splits of this size, at absolute positions (kernels/README.md, "Lead splits"), so that
#: a short row runs as several programs and a merge. Bit-defining.
DEFAULT_LEAD_SPLIT_SIZE: int = 128

#: SM count used when the tensors are not on a CUDA device (the interpreter); the H100's.
NOMINAL_NUM_SMS: int = 132

SUPPORTED_DTYPES: tuple[torch.dtype, ...] = (torch.float16, torch.bfloat16, torch.float32)
SUPPORTED_HEAD_DIMS: tuple[int, ...] = (64, 128, 256)

#: KV tokens per tile of the 128-key contract (:func:`wide_tile`).
WIDE_BLOCK_N = 128

#: Tile rows a request fills on average (``num_tokens * group_size / batch_size``) from which a
#: batch counts as prefill-like (:func:`prefill_like`).
PREFILL_ROWS_PER_REQUEST = 128

#: Query tokens per request on average from which a prefill-like batch counts as long prompts
#: (:func:`long_prompts`).
LONG_PROMPT_TOKENS = 1024


@dataclass(frozen=True)
class TileConfig:
    """Tile shape and launch settings of the attention kernels for one (dtype, head_dim).

    ``block_m`` is the number of tile rows, i.e. (query token, query head) pairs; the launcher
    raises it to the next power of two of the GQA group size when a group is larger.
    """

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int


#: The bit-defining contract, one row per (precision, head dim): the KV tile width
#: (``block_n``) and the launch that goes with it by default (``block_m``, warps, stages:
#: bit-neutral, the rules' starting point). ``half`` (float16 and bfloat16) runs tensor-core
#: dots with float32 accumulation (``wgmma`` on Hopper, ``mma.sync`` elsewhere); ``fp32`` runs
#: exact IEEE FMA dots (never tf32). Every row splits at :data:`DEFAULT_SPLIT_SIZE` with lead
#: splits of :data:`DEFAULT_LEAD_SPLIT_SIZE`. Half precision at head dim 128 on Hopper, where
#: Triton 3.6's Gluon builds, takes :data:`WIDE_CONTRACT` instead. The half-precision widths at
#: head dims 64 and 256 were chosen by measurement (``invariance tune --block-n``, reports/h200/
#: contract): the widest each allows (128 keys: the lead split; 64 at head dim 256: two pipeline
#: stages of K and V in shared memory); the float32 rows were not measured.
CONTRACT: dict[tuple[str, int], TileConfig] = {
    ("half", 64): TileConfig(block_m=64, block_n=128, num_warps=4, num_stages=3),
    ("half", 128): TileConfig(block_m=64, block_n=64, num_warps=4, num_stages=2),
    ("half", 256): TileConfig(block_m=64, block_n=64, num_warps=8, num_stages=2),
    ("fp32", 64): TileConfig(block_m=32, block_n=32, num_warps=4, num_stages=2),
    ("fp32", 128): TileConfig(block_m=32, block_n=32, num_warps=4, num_stages=2),
    ("fp32", 256): TileConfig(block_m=32, block_n=16, num_warps=8, num_stages=2),
}

#: The 128-key contract: half precision at head dim 128 on Hopper with Triton 3.6's Gluon.
WIDE_CONTRACT = TileConfig(block_m=64, block_n=WIDE_BLOCK_N, num_warps=4, num_stages=2)


def tile_config(dtype: torch.dtype, head_dim: int, sm_major: int | None = None,
                gluon: bool = False) -> TileConfig:
    """The contract's tile for (dtype, head_dim) on a GPU of compute capability major
    ``sm_major`` (``None``: not a CUDA device, the interpreter), in a deployment where the
    Gluon kernels can be built (``gluon``: Triton 3.6): a row of :data:`CONTRACT`, or
    :data:`WIDE_CONTRACT` for half precision at head dim 128 on Hopper with Gluon (the launch
    returned is then the Triton kernels', for calls the Gluon tile cannot take). The GPU and
    the Triton release are fixed per deployment. Pure: never looks at a batch.

    Raises ValueError for unsupported dtypes or head dims.
    """
    if dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"dtype: expected one of {SUPPORTED_DTYPES}, got {dtype}")
    if head_dim not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"head_dim: expected one of {SUPPORTED_HEAD_DIMS}, got {head_dim}")
    if _measured_neutral(dtype, head_dim, sm_major) and gluon:
        return WIDE_CONTRACT
    return CONTRACT["fp32" if dtype == torch.float32 else "half", head_dim]


def prefill_like(num_tokens: int, group_size: int, batch_size: int) -> bool:
    """Whether the batch's requests fill a 128-row tile on average (prefill and mixed batches);
    from shapes alone."""
    return num_tokens * group_size >= PREFILL_ROWS_PER_REQUEST * max(batch_size, 1)


def long_prompts(num_tokens: int, batch_size: int) -> bool:
    """Whether the batch averages at least :data:`LONG_PROMPT_TOKENS` query tokens per request;
    from shapes alone."""
    return num_tokens >= LONG_PROMPT_TOKENS * max(batch_size, 1)


def wide_tile(dtype: torch.dtype, head_dim: int, block_n: int, sm_major: int | None) -> bool:
    """Whether a launch runs the 128-key contract: half precision at head dim 128 on Hopper with
    :data:`WIDE_BLOCK_N`-key tiles. Its kernels are the Gluon tile in both plans, or the Triton
    kernels with :func:`tile_config`'s fixed launch where Gluon cannot run the call."""
    return _measured_neutral(dtype, head_dim, sm_major) and block_n == WIDE_BLOCK_N


#: Head dims whose 128-key launches the Gluon kernels can run (half precision on Hopper): 128,
#: where the rules choose them (:func:`wide_tile`), and 64, whose contract is also 128 keys and
#: where only a measured table entry or a ``Tuning`` chooses them.
GLUON_HEAD_DIMS = (64, 128)


def gluon_tile(dtype: torch.dtype, head_dim: int, block_n: int, page_size: int,
               sm_major: int | None = None) -> bool:
    """Whether a 128-key launch may run the Gluon kernels by its shapes: half precision on
    Hopper at a head dim of :data:`GLUON_HEAD_DIMS`, pages of at least 16 tokens (one TMA box
    per page). The launcher also needs Triton 3.6's Gluon and caches TMA can read
    (:func:`kernels._gluon.available`, :func:`kernels._gluon.cache_misfit`)."""
    return (sm_major == 9 and dtype in (torch.float16, torch.bfloat16)
            and head_dim in GLUON_HEAD_DIMS and block_n == WIDE_BLOCK_N and page_size >= 16)


def kt_tile(dtype: torch.dtype, head_dim: int, block_n: int, page_size: int,
            sm_major: int | None = None) -> bool:
    """Whether the keys-as-rows decode tile (``kernels._gluon``) takes a launch by its shapes:
    half precision on Hopper, the contract's tile at a head dim it is written for (128 keys at
    head dims 64 and 128, 64 keys at head dim 256: ``kernels._gluon.KT_TILES``), pages of at
    least 16 tokens (one TMA box per page). The launcher also needs Triton 3.6's Gluon and
    caches TMA can read."""
    from kernels import _gluon  # light: imports no Triton

    return (sm_major == 9 and dtype in (torch.float16, torch.bfloat16)
            and (head_dim, block_n) in _gluon.KT_TILES and page_size >= 16)


def _measured_neutral(dtype: torch.dtype, head_dim: int, sm_major: int | None) -> bool:
    """Whether the per-batch rules below apply: half precision at head dim 128 on Hopper
    (``wgmma``), where the harness has shown them bit-neutral. Elsewhere every call keeps
    :func:`tile_config`'s fixed launch."""
    return sm_major == 9 and dtype in (torch.float16, torch.bfloat16) and head_dim == 128


def _small_split_grid(num_programs: int, num_sms: int) -> bool:
    """A split-plan grid with at most one program per two SMs: each program's chain of tiles,
    not the SMs' throughput, is the time."""
    return num_programs * 2 <= num_sms


def batch_tuning(dtype: torch.dtype, head_dim: int, group_size: int, num_tokens: int,
                 batch_size: int, sm_major: int | None = None,
                 block_n: int | None = None) -> TileConfig:
    """The tile configuration of one call: :func:`tile_config` (at ``block_n``, the contract's
    width, when given), with 128 rows on 8 warps and 3 stages for every 128-key launch (the
    Gluon tile's shape) and for prefill-like batches at 64 keys (:func:`prefill_like`; decode
    keeps 64 rows on 4 warps). Rows and warps within the ``wgmma`` family: bit-neutral. Shapes
    only."""
    cfg = tile_config(dtype, head_dim, sm_major)
    if block_n is not None and block_n != cfg.block_n:
        cfg = replace(cfg, block_n=block_n)
    if wide_tile(dtype, head_dim, cfg.block_n, sm_major):
        return replace(cfg, block_m=128, num_warps=8, num_stages=3)
    if (_measured_neutral(dtype, head_dim, sm_major)
            and prefill_like(num_tokens, group_size, batch_size)):
        return replace(cfg, block_m=128, num_warps=8, num_stages=3)
    return cfg


def _prefill_tile(block_m: int, num_warps: int) -> bool:
    """The prefill tile of :func:`batch_tuning`: 128 rows on 8 warps."""
    return block_m == 128 and num_warps == 8


def fused_loop(dtype: torch.dtype, head_dim: int, block_m: int, num_warps: int,
               sm_major: int | None = None) -> tuple[bool, int]:
    """(nested, tiles per step) of the fused kernel's loop: the prefill tile walks each split in
    its own inner loop, two fully visible tiles per step, and folds after it; other launches one
    flat loop over every tile. The same operations in the same order per row."""
    if _measured_neutral(dtype, head_dim, sm_major) and _prefill_tile(block_m, num_warps):
        return True, 2
    return False, 1


def gluon_prefill(dtype: torch.dtype, head_dim: int, block_m: int, block_n: int,
                  num_warps: int, page_size: int, nested: bool,
                  sm_major: int | None = None) -> bool:
    """Whether a 64-key fused-plan launch (``Tuning(block_n=64)`` on Hopper) runs the Gluon
    prefill kernel: the prefill tile in the nested loop, pages of at least 16 tokens. Shapes
    only; the launcher also needs Triton 3.6's Gluon and caches TMA can read."""
    return (_measured_neutral(dtype, head_dim, sm_major) and _prefill_tile(block_m, num_warps)
            and block_n == 64 and page_size >= 16 and nested)


def decode_stages(dtype: torch.dtype, head_dim: int, block_m: int, num_warps: int,
                  num_stages: int, sm_major: int | None = None) -> int:
    """Pipeline stages: at least 5 for the 64-row decode tile on 4 warps (so the next tiles'
    page ids and K/V copies are two or more steps ahead of their use); else ``num_stages``.
    Stages schedule loads, not arithmetic."""
    if _measured_neutral(dtype, head_dim, sm_major) and block_m == 64 and num_warps == 4:
        return max(num_stages, 5)
    return num_stages


def value_blocks(dtype: torch.dtype, head_dim: int, num_programs: int, num_sms: int,
                 sm_major: int | None = None) -> int:
    """V column blocks per split-plan program (1, 2, 4 or 8): doubled while the grid
    (``num_programs`` times the blocks) stays within half the SMs, so a small grid (short
    decode at a small batch) fills the GPU. Every block computes the same scores and its own
    columns of ``p @ v``. Shapes only."""
    if not _measured_neutral(dtype, head_dim, sm_major):
        return 1
    blocks = 1
    while blocks < 8 and _small_split_grid(num_programs * blocks, num_sms):
        blocks *= 2
    return blocks


def gluon_value_blocks(num_programs: int, num_sms: int, head_dim: int = 128) -> int:
    """V column blocks per program of the 128-key Gluon split kernel: 4 (at most one per 32 V
    columns) where the grid with 4 blocks fits the SMs once, else 1. ``num_programs``: the split
    grid's working programs at one block. Shapes only."""
    return min(4, head_dim // 32) if num_programs * 4 <= num_sms else 1


def kt_value_blocks(num_programs: int, num_sms: int, head_dim: int = 128) -> int:
    """V column blocks per program of the keys-as-rows decode tile: 2 where 4 times the grid
    would fit the SMs once and each block keeps at least 64 columns on the MMA's M, else 1.
    Shapes only."""
    return 2 if num_programs * 4 <= num_sms and head_dim >= 128 else 1


def kt_scores_ahead(num_programs: int, num_sms: int) -> bool:
    """Whether the keys-as-rows tile issues each next tile's scores before this tile's
    ``p @ v`` (asked only with 2 V blocks): on grids of at most an eighth of the SMs. Issue
    order only."""
    return num_programs * 8 <= num_sms


def kt_walk_lead(lead_programs: int, lead_only: bool, num_sms: int) -> bool:
    """Whether each program of the keys-as-rows tile walks a whole split and folds the lead
    splits in it, instead of one program per lead split: unless every row lies within the lead
    splits (``lead_only``) and one program per lead split fits the SMs once."""
    return not (lead_only and lead_programs <= num_sms)


def kt_walk_splits(num_programs: int, num_sms: int) -> int:
    """Splits per walking program of the keys-as-rows tile: 2 where one per program would take
    a second wave of the SMs and two would not, else 1. Each split is still stored on its own
    and the merge folds them."""
    return 2 if num_sms < num_programs <= 2 * num_sms else 1


def tiles_per_step(dtype: torch.dtype, head_dim: int, num_programs: int, num_sms: int,
                   sm_major: int | None = None, block_m: int = 64, num_warps: int = 4,
                   value_blocks: int = 1, several_splits: bool = False) -> int:
    """Fully visible KV tiles a split-plan program walks per loop step: 1 or 2 (both tiles'
    scores and exponentials before the first ``p @ v``: the same arithmetic per row, a shorter
    dependency chain). 2 for the prefill tile, and for the decode tile on small grids whose rows
    have one split and whose grid with its V blocks fits the SMs once. Shapes only."""
    if not _measured_neutral(dtype, head_dim, sm_major):
        return 1
    if _prefill_tile(block_m, num_warps):
        return 2
    return 2 if (_small_split_grid(num_programs, num_sms) and not several_splits
                 and num_programs * value_blocks <= num_sms) else 1


def slot_order(num_programs: int, num_sms: int, num_tokens: int, group_size: int,
               batch_size: int) -> bool:
    """Whether the fused plan's programs take their slots with the requests of most KV first
    (sorted on the device), so that a long program does not start last: for mixed batches
    (prefill-like, not long prompts) with more than two programs per SM. Which program takes
    which slot is scheduling only. Shapes only."""
    return (prefill_like(num_tokens, group_size, batch_size)
            and not long_prompts(num_tokens, batch_size)
            and num_programs > 2 * num_sms)


def rows_per_block(block_m: int, group_size: int) -> tuple[int, int]:
    """(BLOCK_M, BLOCK_Q): tile rows and query tokens per tile for a GQA group of ``group_size``."""
    m = max(block_m, 1 << (group_size - 1).bit_length())
    return m, m // group_size


def count_splits(kv_len: int, split_tokens: int, lead_tokens: int) -> int:
    """Splits of a row that sees ``kv_len`` keys: ``ceil(kv_len / lead_tokens)`` within the first
    ``split_tokens`` keys, then one per ``split_tokens`` (``lead_tokens`` divides
    ``split_tokens``; equal: one split size). 0 for ``kv_len <= 0``."""
    if kv_len <= 0:
        return 0
    if kv_len <= split_tokens:
        return -(-kv_len // lead_tokens)
    return split_tokens // lead_tokens + -(-(kv_len - split_tokens) // split_tokens)


def control_num_splits(
    batch_nheads_mblocks: int, num_sms: int, num_n_blocks: int, max_splits: int = 128
) -> int:
    """FA2's split-KV heuristic (``num_splits_heuristic``): the CONTROL mode, batch dependent.

    Picks the smallest split count whose wave efficiency is within 85% of the best one.
    """
    if batch_nheads_mblocks >= 0.8 * num_sms or batch_nheads_mblocks <= 0:
        return 1
    max_splits = max(1, min(max_splits, num_sms, num_n_blocks))

    def eligible(n: int) -> bool:
        return n == 1 or math.ceil(num_n_blocks / n) != math.ceil(num_n_blocks / (n - 1))

    efficiency = []
    for n in range(1, max_splits + 1):
        if not eligible(n):
            efficiency.append(0.0)
            continue
        waves = batch_nheads_mblocks * n / num_sms
        efficiency.append(waves / math.ceil(waves))
    best = max(efficiency)
    for n in range(1, max_splits + 1):
        if eligible(n) and efficiency[n - 1] >= 0.85 * best:
            return n
    return 1


def choose_plan(
    num_programs: int,
    num_sms: int,
    max_kv_len: int,
    split_tokens: int,
    longest_tiles: int | None = None,
    total_tiles: int | None = None,
    decode: bool = False,
    gluon: bool = False,
    keys_rows: bool = False,
    num_splits: int | None = None,
    lead_tokens: int | None = None,
) -> str:
    """The ``plan="auto"`` rule: "split" or "fused". Never changes bits, only speed.

    ``num_programs``: the fused grid (query blocks x KV heads). Split when the fused grid leaves
    SMs idle, or when rows span several splits and, with host statistics (KV tiles of the
    longest request and over all programs), the longest program would be a tail (longer than a
    third of the average work per SM); without statistics, decode batches split and prefill
    batches fuse. On the 128-key Gluon kernels (``gluon``) grids of at most a quarter of the
    SMs split and a larger under-filled grid fuses when its lengths are balanced (the longest
    program at most twice the average, 1.5 times where the split plan would run the
    keys-as-rows tile, ``keys_rows``, which also takes every batch whose rows lie within the
    lead splits, and there only a grid more than half full).
    """
    if gluon and num_programs * 4 <= num_sms:
        return "split"
    # Rows within the lead splits: at most split_tokens // lead_tokens splits each.
    lead_splits = split_tokens // lead_tokens if lead_tokens else 1
    if keys_rows and (num_splits <= lead_splits if num_splits is not None
                      else max_kv_len <= split_tokens):
        return "split"
    balanced = 3 if keys_rows else 4  # the longest program, in halves of the average
    # Decode on the keys-as-rows tile fuses only a grid more than half full: at half or less the
    # split plan's programs per split are the faster chains.
    fills = not keys_rows or 2 * num_programs > num_sms
    if (gluon and fills and num_programs < num_sms and longest_tiles is not None
            and total_tiles is not None
            and 2 * longest_tiles * num_programs <= balanced * total_tiles):
        return "fused"
    if num_programs < num_sms:
        # Even with one split: the split kernel's tile loop has no split-boundary branch.
        return "split"
    if max_kv_len <= split_tokens:
        return "fused"
    if longest_tiles is not None and total_tiles is not None:
        return "split" if 3 * longest_tiles * num_sms > total_tiles else "fused"
    return "split" if decode else "fused"
