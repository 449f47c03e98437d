"""Tile configurations and launch heuristics (pure functions, no tensors touched).

The bit-defining settings (BLOCK_N, the split size, and for float32 BLOCK_M too) come from
:func:`tile_config`, a pure function of (dtype, head_dim). :func:`batch_tuning` may change only
settings measured bit-neutral on the target GPU (kernels/README.md, "Bit-defining and bit-neutral
settings"), from shapes the host knows without a sync. The plan is bit-neutral by construction;
the control mode's split count is computed from the batch and changes bits (on purpose).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

__all__ = [
    "DEFAULT_LEAD_SPLIT_SIZE",
    "DEFAULT_SPLIT_SIZE",
    "NOMINAL_NUM_SMS",
    "SUPPORTED_DTYPES",
    "SUPPORTED_HEAD_DIMS",
    "WIDE_BLOCK_N",
    "TileConfig",
    "batch_tuning",
    "control_num_splits",
    "count_splits",
    "decode_stages",
    "fused_loop",
    "gluon_tile",
    "gluon_value_blocks",
    "kt_scores_ahead",
    "kt_value_blocks",
    "kt_walk_lead",
    "kt_walk_splits",
    "slot_order",
    "tile_config",
    "tiles_per_step",
    "value_blocks",
    "wide_tile",
]

# KV tokens per split, a multiple of every BLOCK_N below. Bit-defining. Measured on an H100 with
# the round-4 merge (reports/h100-round4/README.md): 1024 beats 512 and 256 on long contexts
# (decode b1-32k 75 vs 91 vs 116 us, b8-32k 414 vs 443 vs 489 us), on prefill (9.5 vs 10.3 vs
# 11.7 ms: the fused plan folds a split every split/64 tiles) and on mixed batches, and loses on
# short ones (b1-1k 38 vs 27 vs 20 us, b8-1k 47 vs 34 vs 30 us). Decode at batch 1 with 32k
# context gets 32 splits per KV head (256 programs with Hkv = 8). Re-measured on round 15's
# kernels (reports/h100-round16/README.md, section 1): b1-32k 70 vs 82 vs 95 us, prefill-varlen
# 6.45 vs 6.57 vs 6.81 ms, b1-1k 20.3 vs 17.2 vs 16.0 us, b8-1k 28.1 vs 28.2 vs 30.9 us (no
# longer faster at smaller splits); 1024 stays.
DEFAULT_SPLIT_SIZE: int = 1024

# KV tokens per lead split: the first DEFAULT_SPLIT_SIZE tokens of every row are cut into splits
# of this size, at absolute positions (kernels/README.md, "Lead splits"). Bit-defining. A row of
# at most 1024 keys then runs as 8 programs per KV head and a merge, as the control does at
# batch 1, instead of one chain of 8 tiles. Measured on an H200 (reports/h100-round28/README.md,
# call 2, bf16, forced lead sizes): batch 1 with 1k keys 11.7 us at 128, 12.3 at 256, 14.2 with
# one split size (the control 11.7); at 1k x 2 13.8 / 13.1 / 14.4 (13.8); prefill-varlen and
# mixed64 within 2.2% of one size at either lead.
DEFAULT_LEAD_SPLIT_SIZE: int = 128

# SM count used when the tensors are not on a CUDA device (the interpreter); the H100 SXM value.
NOMINAL_NUM_SMS: int = 132

SUPPORTED_DTYPES: tuple[torch.dtype, ...] = (torch.float16, torch.bfloat16, torch.float32)
SUPPORTED_HEAD_DIMS: tuple[int, ...] = (64, 128, 256)


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


def tile_config(dtype: torch.dtype, head_dim: int, sm_major: int | None = None,
                gluon: bool = False) -> TileConfig:
    """Tile configuration for (dtype, head_dim) on a GPU of compute capability major
    ``sm_major`` (``None``: not a CUDA device, the interpreter) in a deployment where the Gluon
    kernels can be built (``gluon``: Triton 3.6, :func:`kernels._gluon.available`), which picks
    the 128-key contract. Pure: never looks at a batch. At 128 keys the launch settings returned
    are the Triton kernels' (for calls the Gluon tile cannot take); the Gluon tile itself runs
    128 rows on 8 warps (:func:`batch_tuning`).

    Half precision at head dim 128 on Hopper (``sm_major == 9``) with Gluon takes 128-key tiles
    (:func:`wide_tile`, kernels/README.md, "The 128-key contract"); everything else keeps the
    tiles below, 64 keys there. The GPU and the Triton release are fixed per deployment, and
    the bits differ between GPU generations and compiler releases anyway.

    Raises ValueError for unsupported dtypes or head dims.
    """
    if dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"dtype: expected one of {SUPPORTED_DTYPES}, got {dtype}")
    if head_dim not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"head_dim: expected one of {SUPPORTED_HEAD_DIMS}, got {head_dim}")
    if _measured_neutral(dtype, head_dim, sm_major) and gluon:
        # The Triton kernels' launch where the Gluon kernels cannot run a call (pages under 16
        # tokens, caches TMA cannot read; kernels/README.md): 64 rows on 4 warps, 2 stages
        # (2 x 64 KB of K/V in shared memory).
        return TileConfig(block_m=64, block_n=WIDE_BLOCK_N, num_warps=4, num_stages=2)
    if dtype in (torch.float16, torch.bfloat16):
        if head_dim <= 64:
            return TileConfig(block_m=64, block_n=64, num_warps=4, num_stages=3)
        if head_dim <= 128:
            return TileConfig(block_m=64, block_n=64, num_warps=4, num_stages=2)
        return TileConfig(block_m=64, block_n=32, num_warps=8, num_stages=2)
    # float32: exact IEEE dots (FMA, no tensor cores), so smaller tiles.
    if head_dim <= 128:
        return TileConfig(block_m=32, block_n=32, num_warps=4, num_stages=2)
    return TileConfig(block_m=32, block_n=16, num_warps=8, num_stages=2)


#: Tile rows a request fills on average (``num_tokens * group_size / batch_size``) from which a
#: batch counts as prefill-like: it gets 128-row tiles on 8 warps (:func:`batch_tuning`) and,
#: without host statistics, the fused plan; below it is decode-like.
PREFILL_ROWS_PER_REQUEST = 128


def prefill_like(num_tokens: int, group_size: int, batch_size: int) -> bool:
    """Whether the batch's requests fill a 128-row tile on average (prefill and mixed batches:
    128-row tiles on 8 warps); from shapes alone (no sync)."""
    return num_tokens * group_size >= PREFILL_ROWS_PER_REQUEST * max(batch_size, 1)


#: Query tokens per request on average from which a prefill-like batch counts as long prompts:
#: the fused plan keeps its plain slot order there (:func:`slot_order`). Rounds 6-10 also gave
#: such batches 256-row tiles on 8 warps; round 11's tile (:func:`batch_tuning`) serves every
#: prefill-like batch.
LONG_PROMPT_TOKENS = 1024


def long_prompts(num_tokens: int, batch_size: int) -> bool:
    """Whether the batch averages at least :data:`LONG_PROMPT_TOKENS` query tokens per request
    (the fused plan keeps its plain slot order); from shapes alone (no sync)."""
    return num_tokens >= LONG_PROMPT_TOKENS * max(batch_size, 1)


#: KV tokens per tile of the 128-key contract (:func:`wide_tile`).
WIDE_BLOCK_N = 128


def wide_tile(dtype: torch.dtype, head_dim: int, block_n: int, sm_major: int | None) -> bool:
    """Whether a launch runs the 128-key contract: half precision at head dim 128 on Hopper with
    :data:`WIDE_BLOCK_N`-key tiles (:func:`tile_config`'s choice there with Gluon, or a
    ``Tuning``'s ``block_n``). Its kernels are the Gluon tile in both plans
    (:func:`gluon_tile`), or the Triton kernels with :func:`tile_config`'s fixed launch where
    Gluon cannot run the call: the per-batch rules below were measured at 64 keys and do not
    apply."""
    return _measured_neutral(dtype, head_dim, sm_major) and block_n == WIDE_BLOCK_N


def gluon_tile(dtype: torch.dtype, head_dim: int, block_n: int, page_size: int,
               sm_major: int | None = None) -> bool:
    """Whether a 128-key launch (:func:`wide_tile`) may run the Gluon kernels: pages of at least
    16 tokens (one TMA box per page, 128-byte swizzled; V boxes of 32 columns 64-byte). Shapes
    only; the launcher also needs Triton 3.6's Gluon and dense caches
    (:func:`kernels._gluon.available`, :func:`kernels._gluon.cache_misfit`). Both plans: the
    fused plan on ``_fused_prefill_kernel`` (the serial order), the split plan on
    ``_split_kernel`` with the package's merge (one split per row: the split kernel stores the
    result itself)."""
    return wide_tile(dtype, head_dim, block_n, sm_major) and page_size >= 16


def _measured_neutral(dtype: torch.dtype, head_dim: int, sm_major: int | None) -> bool:
    """Whether the per-batch settings below were measured bit-neutral for this call: half
    precision at head dim 128 on Hopper (``sm_major == 9``: ``wgmma``), the scope of the H100
    evidence in reports/. Elsewhere (other GPUs, float32's FMA dots, other head dims, the
    interpreter: ``None``) every call keeps :func:`tile_config`'s fixed launch."""
    return sm_major == 9 and dtype in (torch.float16, torch.bfloat16) and head_dim == 128


def _small_split_grid(num_programs: int, num_sms: int) -> bool:
    """A split-plan grid with at most one program per two SMs: each program's chain of tiles,
    not the SMs' throughput, is the time (short decode at batch 1-8)."""
    return num_programs * 2 <= num_sms


def batch_tuning(dtype: torch.dtype, head_dim: int, group_size: int, num_tokens: int,
                 batch_size: int, sm_major: int | None = None,
                 block_n: int | None = None) -> TileConfig:
    """The tile configuration of one call: :func:`tile_config` (with ``block_n``, the contract's
    tile width, when given), with BLOCK_M raised to 128 on 8 warps (two warpgroups of 64 rows)
    and 3 pipeline stages for half precision at head dim 128 on Hopper (``sm_major == 9``, where
    every one of these compiles to ``wgmma``): at 128 keys (:func:`wide_tile`) for every batch,
    the Gluon tile's shape; at 64 keys when the batch's requests fill 128-row tiles on average
    (``num_tokens * group_size >= 128 * batch_size``, :func:`prefill_like`; decode keeps 64 rows
    on 4 warps). Elsewhere (other
    GPUs, where 64 and 128 both take ``mma.sync``, the family whose row counts changed bits on
    the H100; the interpreter: ``None``) it is :func:`tile_config` itself.

    Shapes only (no device read, so CUDA graphs can capture it). BLOCK_M 64/128/256, 4 vs 8
    warps and 2-4 stages changed no bit of out or LSE on an H100 (rounds 3, 6 and 11: every row
    on an m64 ``wgmma``); BLOCK_M 32 (``mma.sync``) did, and for float32 (FMA dots) BLOCK_M 64
    vs 32 did too, so float32 keeps its fixed BLOCK_M (reports/h100-round3/README.md).

    The tile is paired with the fused plan's nested loop and two tiles per step
    (:func:`fused_loop`) and K loaded as rows: on an H100 (round 11,
    reports/h100-round11/README.md) that took a mixed batch 8% and a varlen prefill 2% below
    rounds 6-10's tiles (128 rows on 4 warps for mixed batches, 256 rows on 8 warps for long
    prompts), both of which spill registers; 128 rows on 8 warps in the flat loop ran 24-37%
    slower (2 or 3 stages)."""
    cfg = tile_config(dtype, head_dim, sm_major)
    if block_n is not None and block_n != cfg.block_n:
        # The 128-key contract, or another width (``Tuning.block_n``).
        cfg = replace(cfg, block_n=block_n)
    if wide_tile(dtype, head_dim, cfg.block_n, sm_major):
        return replace(cfg, block_m=128, num_warps=8, num_stages=3)
    if (_measured_neutral(dtype, head_dim, sm_major)
            and prefill_like(num_tokens, group_size, batch_size)):
        return replace(cfg, block_m=128, num_warps=8, num_stages=3)
    return cfg


def _prefill_tile(block_m: int, num_warps: int) -> bool:
    """Round 11's prefill tile (:func:`batch_tuning`): 128 rows on 8 warps, which walks two
    fully visible tiles per step in either plan (:func:`fused_loop`, :func:`tiles_per_step`)."""
    return block_m == 128 and num_warps == 8


def fused_loop(dtype: torch.dtype, head_dim: int, block_m: int, num_warps: int,
               sm_major: int | None = None) -> tuple[bool, int]:
    """(nested, tiles per step) of the fused kernel's loop for a launch of ``block_m`` rows on
    ``num_warps`` warps.

    Nested: each split is walked in its own inner loop (the split kernel's loop, with one or
    two fully visible tiles per step) and folded after it, instead of one flat loop over every
    tile with the fold at each split boundary. The same operations in the same order per row
    (bit-neutral by construction; 0 of 137 comparisons differing on an H100, round 11); only
    register allocation and the schedule change. Taken for 128 rows on 8 warps, with two tiles
    per step, half precision at head dim 128 on Hopper: there (round 11, bf16, at 2 stages) the
    flat loop ran 27-36% above the default tiles of rounds 6-10, the nested loop 14-21%, with
    two tiles per step 1-8%; with 3 stages and K rows 2-9% below them. Other shapes keep the
    flat loop: nested, 128 rows on 4 warps ran 2.3-2.7x slower (they spill; where was not
    profiled), 256 rows on 8 warps 2-30% slower (3 stages), and 64-row decode tiles gained
    0.5-2% with one tile per step and lost 15-18% with two."""
    if _measured_neutral(dtype, head_dim, sm_major) and _prefill_tile(block_m, num_warps):
        return True, 2
    return False, 1


def gluon_prefill(dtype: torch.dtype, head_dim: int, block_m: int, block_n: int,
                  num_warps: int, page_size: int, nested: bool,
                  sm_major: int | None = None) -> bool:
    """Whether a fused-plan launch at 64 keys (``Tuning(block_n=64)`` on Hopper; at 128 keys
    :func:`gluon_tile` decides) runs the Gluon prefill kernel (kernels/_gluon) instead of the
    Triton fused kernel: round 11's prefill tile (128 rows on 8 warps, BLOCK_N 64) in the nested
    loop, half precision at head dim 128 on Hopper, pages of at least 16 tokens (one TMA box per
    page, 128-byte swizzled). Shapes only; the launcher also needs Triton 3.6's Gluon and dense
    caches (:func:`kernels._gluon.available`, :func:`kernels._gluon.cache_misfit`).

    The same operations in the same order per row as the Triton kernel, which the H100 checks
    (kernels/README.md, "The Gluon prefill tile"); what it changes is the schedule: a loader
    warp (TMA), two consumer warpgroups on mbarriers, and each tile's exponentials computed while
    the tensor cores run the next scores and this tile's ``p @ v``."""
    return (_measured_neutral(dtype, head_dim, sm_major) and _prefill_tile(block_m, num_warps)
            and block_n == 64 and page_size >= 16 and nested)


def decode_stages(dtype: torch.dtype, head_dim: int, block_m: int, num_warps: int,
                  num_stages: int, sm_major: int | None = None) -> int:
    """Pipeline stages of a launch of ``block_m`` rows on ``num_warps`` warps, in either plan,
    whose tile configuration gives ``num_stages``: 5 for the 64-row decode tile on 4 warps, half
    precision at head dim 128 on Hopper; else ``num_stages``. (In the fused plan that tile serves
    decode batches whose grid fills the GPU, batch 64-256 at 1k-32k tokens in the bench; in the
    split plan short decode at batch 1-8 and decode-prod64.)

    Compiled by Triton 3.6 for sm_90a (reports/h100-round15/cpu/), the split kernel's tile loop
    issues the next step's page-id loads and K/V copies at the end of a step, after its ``p @
    v``, and waits for them at the top of the next step. At 2 stages a step therefore pays the
    block table's and then the cache's memory latency in full; at 3 and 4 the page ids move a
    step earlier but the K/V copies stay one step ahead; from 5 they are two or more steps
    ahead. The fused decode loop waits for every copy at 3 stages and keeps 3 groups in flight
    at 5. Stages schedule loads, not arithmetic.

    On an H100 (bf16 times, CUDA graphs, L2 flushed; bits compared at fp16 and bf16):

    - fused plan: round 12 (reports/h100-round12/README.md) took 3 stages instead of 2 (0.5-2.2%
      faster at batch 64-256, 7.5% at batch 8 with 32k forced fused; 4 the same as 3); round 15
      (reports/h100-round15/README.md, call 2) measured 5 and 6: no bit changed, 5 took batch 64
      with 8k and 32k tokens 3.1% and 3.4% below 3 stages (735 and 2855 us) and batch 256 with
      8k 4.2% (2873 us), batch 64 with 1k stayed at 119 us, 6 gave the times of 5;
    - split plan (round 15): 3-6 and 8 stages changed no bit on nine decode batches. Against
      round 14's launch (2 stages), 5 stages took decode at batch 1 with 1k tokens from 23.5 to
      20.2 us, batch 8 with 1k from 34.7 to 28.0, decode-prod64 from 1110 to 1058 and batch 8
      with 32k from 400 to 390, while batch 8 with 8k and batch 1 with 32k ran 1.1% and 0.6%
      slower (call 2); batch 1 with 8k went from 37.9 to 32.8 with :func:`value_blocks`' and
      :func:`tiles_per_step`'s rules (call 7). 3 and 4 stages ran -0.5% to +8.2% against 2; 8
      stages were slower than 5 except at batch 8 with 1k tokens with one tile per step (27.8
      us; call 1)."""
    if _measured_neutral(dtype, head_dim, sm_major) and block_m == 64 and num_warps == 4:
        return max(num_stages, 5)
    return num_stages


def value_blocks(dtype: torch.dtype, head_dim: int, num_programs: int, num_sms: int,
                 sm_major: int | None = None) -> int:
    """V column blocks per split-plan program (the grid multiplies by it): 1, 2, 4 or 8.

    A small split-plan grid (few requests, few splits: short decode at batch 1-8) leaves SMs
    idle while each program walks its split's tiles in sequence. Cutting the V columns into
    blocks gives each (slot, KV head, split) several programs that compute the same scores and
    each its own columns of ``p @ v``: bit-neutral where the dot's per-element results do not
    depend on its column count (measured on an H100 for half precision at head dim 128,
    ``wgmma``, with 2, 4 and 8 blocks: reports/h100-round8/README.md and
    reports/h100-round10/README.md), so only there (``sm_major == 9``); 1 elsewhere.

    Doubles the blocks, up to 8 (16 columns each), while the grid (``num_programs`` x blocks)
    stays within half the SMs' count before the doubling. 8 blocks took 8-16-program grids
    0.5-0.8 us lower than 4 on the H100 (round 10, bf16; batch 1-2 with 1k-2k tokens). Rounds
    10-14 gave rows over several splits 4 blocks where this gives 2 (at 2 stages: decode at
    batch 1 with 8k tokens, batch 2 with 4k and batch 4 with 2k, 64 programs, from 42.7-43.0 to
    39.3-39.8 us); with :func:`decode_stages`' 5 stages 2 blocks and one tile per step are
    faster there (32.6-33.1 us against 35.7-36.6 with 4 blocks; round 15, call 7), so the rule
    is the doubling alone. Shapes only (no sync)."""
    if not _measured_neutral(dtype, head_dim, sm_major):
        return 1
    blocks = 1
    while blocks < 8 and _small_split_grid(num_programs * blocks, num_sms):
        blocks *= 2
    return blocks


def gluon_value_blocks(num_programs: int, num_sms: int) -> int:
    """V column blocks per program of the 128-key Gluon split kernel: 4 where the grid with 4
    blocks fits the SMs once (``num_programs * 4 <= num_sms``), else 1. ``num_programs``: the
    split grid's working programs at one block (query blocks x KV heads x splits). Shapes only
    (no sync).

    Scheduling only: every block computes the same scores, max and denominator and ``p @ v``
    for its quarter of V's columns (the ``wgmma`` per-element results do not depend on the
    column count: 0 bits differing with 2 and 4 blocks on 7 workloads at fp16 and bf16,
    reports/h100-round21/README.md). Measured on an H100 (bf16, round 21, call 1): decode at
    batch 1 with 1k / 2k / 4k tokens (8 / 16 / 32 programs) 19.2 -> 16.8, 21.1 -> 18.8 and
    22.3 -> 20.2 us with 4 blocks (2 blocks: 17.8, 19.4, 20.4); on 64 programs (batch 1 with
    8k, batch 4 with 2k) 2 blocks ran 1% faster and 4-5% slower and 4 blocks 24% and 33%
    slower; larger grids lose with either (4 blocks: 1.4-2.1x)."""
    return 4 if num_programs * 4 <= num_sms else 1


def kt_value_blocks(num_programs: int, num_sms: int) -> int:
    """V column blocks per program of the keys-as-rows decode tile: 2 where 4 times the grid
    would fit the SMs once (``num_programs * 4 <= num_sms``), else 1. ``num_programs``: the
    split grid's working programs at one block, counted in the 128-row tile's query blocks
    (``plan_attention``; exact for decode, fewer than launched for longer chunks, which the
    tile takes only when forced). Shapes only (no sync). Scheduling only, as
    :func:`gluon_value_blocks`: every block computes the same scores, max and denominator and
    ``p @ v`` for its half of V's columns (the tile's ``p @ v`` has V's columns on the MMA's M,
    64 at least, so 2 blocks at most at head dim 128); 0 bits differing against the 128-row
    tile in 68 comparisons (reports/h100-round25/README.md). Measured on an H100 (bf16, round
    25, call 1, one tile per step in the serial order): decodes of 1k-4k keys at batch 1, 1k-2k
    at batch 2 and 1k at batch 4 (8-32 programs) 2-5% faster (batch 1 with 1k: 15.8 -> 15.0
    us); on 64 programs (8k x 1, 4k x 2, 2k x 4, 8 decodes of 1k) 2-11% slower."""
    return 2 if num_programs * 4 <= num_sms else 1


def kt_scores_ahead(num_programs: int, num_sms: int) -> bool:
    """Whether the keys-as-rows decode tile issues each next tile's scores before this tile's
    ``p @ v`` (``Tuning.scores_ahead``): where ``num_programs * 8 <= num_sms`` (the split grid's
    working programs at one V block); ``plan_attention`` asks it only with 2 V blocks. Shapes
    only (no sync); issue order only, no bit (0 of 68 comparisons differing, round 25).
    Measured on an H100 (bf16, round 25, call 1): with 2 V blocks (a ring of 4 slots) 3%
    faster on 8-16 programs (batch 1 with 1k: 15.0 -> 14.5 us, 2k x 1 17.5 -> 16.9, 1k x 2
    15.6 -> 15.1), 1-2% slower on 32 (4k x 1, 2k x 2, 1k x 4); with one block (3 slots) 6-9%
    slower on 8-32 programs (it waits for the next tile before this tile's ``p @ v`` frees a
    slot: inferred, not profiled)."""
    return num_programs * 8 <= num_sms


def kt_walk_lead(lead_programs: int, lead_only: bool, num_sms: int) -> bool:
    """Whether each program of the keys-as-rows tile walks a whole split of ``split_size`` and
    folds the lead splits in it (``Tuning.walk_lead``), instead of one program per lead split:
    unless every row lies within the lead splits (``lead_only``: the longest row has at most
    ``split_size`` keys) and one program per lead split fits the SMs once (``lead_programs``,
    the split grid's working programs counted that way, at most ``num_sms``). Past the lead
    splits a row's chain is a split of ``split_size`` whichever way the lead runs; the short
    programs only crowd the grid. Shapes only (no sync); scheduling only, no bit
    (kernels/README.md, "Lead splits"). Measured on an H200 (bf16, round 28, calls 2-4; lead
    splits of 128, call 3, both forced): one program per lead split took batch 1 with 1k keys
    from 15.2 to 11.9 us (64 programs) and 1k x 2 from 15.1 to 17.2 (128 programs; 13.7 against
    15.1 in call 4, once the schedule rules counted the programs launched), and lost from 1k x 4
    on (16.9 -> 25.3 us), 1.9x on 64 decodes of 1k; past 1k keys walking was as fast or faster
    (2k x 1 16.8 against 19.0-21.5 us)."""
    return not (lead_only and lead_programs <= num_sms)


def kt_walk_splits(num_programs: int, num_sms: int) -> int:
    """Splits of ``split_size`` per walking program of the keys-as-rows tile (``kt_walk_lead``):
    2 where one per program would take a second wave of the SMs and two per program would not
    (``num_sms < num_programs <= 2 * num_sms``, ``num_programs`` the working programs at one
    split each), else 1. Each split is still stored on its own and the merge folds them:
    scheduling only, no bit (kernels/README.md, "Lead splits"). Shapes only (no sync).
    Measured on an H200 (bf16, round 28, call 5, forced): 2 against 1 took batch 1 with 32k
    keys from 56.0 to 55.0 us, 24k x 1 46.6 -> 44.6, 16k x 2 54.4 -> 53.3 (256 programs at one
    split each); 3% slower at 128 programs (16k x 1: 33.5 -> 34.4) and 0.7% on 8k x 4."""
    return 2 if num_sms < num_programs <= 2 * num_sms else 1


def tiles_per_step(dtype: torch.dtype, head_dim: int, num_programs: int, num_sms: int,
                   sm_major: int | None = None, block_m: int = 64, num_warps: int = 4,
                   value_blocks: int = 1, several_splits: bool = False) -> int:
    """Fully visible KV tiles a split-plan program walks per loop step: 1 or 2.

    With 2, the program loads two tiles and computes both tiles' scores, maxima and exponentials
    before the first tile's ``p @ v``: the arithmetic of two one-tile steps, in the same order per
    row, with a shorter chain of dependent instructions per tile (and 1.7x the shared memory per
    pipeline stage). Bit-neutral on an H100 for half precision at head dim 128 (0 of 54 comparisons
    differing; reports/h100-round9/README.md), so only there (``sm_major == 9``); 1 elsewhere.
    Rounds 9-14 took it on the small grids where each program's tile chain is the time
    (``num_programs * 2 <= num_sms``; since round 15 also with the conditions below): on the H100
    decode at batch 1 with 1k tokens went from 29.5 to 24.3 us and batch 8 with 1k from 39.3 to 35.0
    us (batch 1 with 8k: 42.8 to 43.1), while larger grids got 17-19% slower (decode at batch 8 with
    8k and 32k, batch 1 with 32k, decode-prod64).

    Also taken, on any grid, by the prefill tile (``block_m`` 128 on ``num_warps`` 8, from
    :func:`batch_tuning`), as in the fused plan's nested loop (:func:`fused_loop`): on the H100
    (round 11, bf16, prefill-like batches whose grid is smaller than the GPU, so split) it was
    6-13% faster than one tile per step on five of six (chunks of 64-512 tokens at 2k-32k) and
    3% slower on two prompts of 256 tokens (18.6 -> 19.2 us); against round 10's launch (128
    rows on 4 warps, 2 stages, one tile) 1-31% faster on all six, and 7-9% faster on two large
    grids forced to the split plan (mixed64, 8 prompts of 4k). Shapes only (no sync).

    With :func:`decode_stages`' 5 stages (round 15), the 64-row tile takes two tiles only where
    the grid with its ``value_blocks`` also fits the SMs once (``num_programs * value_blocks
    <= num_sms``: two tiles per step take 1.7x the shared memory per stage, and a larger grid
    then runs in two waves) and its rows have one split (``several_splits`` False: by the
    longest length the caller knows). On the H100 decode at batch 1 with 8k tokens, batch 2
    with 4k and batch 4 with 2k (64 programs, several splits) took 32.6-33.1 us with 2 blocks
    and one tile per step, 33.8-34.2 with two tiles, 47.2-47.9 with 4 blocks and two tiles;
    batch 1 and 8 with 1k (one split) 20.2 and 28.0 us with two tiles, 20.6 and 30.0 with
    one. These rules were measured at 5 stages; a ``Tuning`` with other stages gets them too."""
    if not _measured_neutral(dtype, head_dim, sm_major):
        return 1
    if _prefill_tile(block_m, num_warps):
        return 2
    return 2 if (_small_split_grid(num_programs, num_sms) and not several_splits
                 and num_programs * value_blocks <= num_sms) else 1


def slot_order(num_programs: int, num_sms: int, num_tokens: int, group_size: int,
               batch_size: int) -> bool:
    """Whether the fused plan's programs take their query-block slots with the requests sorted
    by KV length, longest first (each request's last blocks first, as in the plain order),
    sorted on the device (two small kernels, no sync), instead of the last slots first.

    Which program takes which slot is scheduling only, bit-neutral by construction (a program's
    arithmetic depends on its slot alone), so this is about the tail: in a mixed batch the
    requests with the most KV sit anywhere in the batch, and a long program that starts last
    runs alone at the end (a list-scheduling model of mixed64, programs as long as the tiles
    they walk, puts the plain order 10% above this one; benchmarks/slot_order_model.py). On an
    H100 (round 10, reports/h100-round10/README.md) it took mixed64 6% and 32 decodes plus 32
    chunks of 256 tokens 8% lower; of three batches of long prompts (256-row tiles) two were
    0.3% and 0.9% slower and one 1.4% faster; re-measured on round 11's tile (128 rows on 8
    warps, nested loop): mixed64 -3.5%, the decode + chunk mix -2.7%, the long prompts +0.7% to
    +2.5% (reports/h100-round11/README.md). So: batches that are prefill-like
    (:func:`prefill_like`) but not long prompts (:func:`long_prompts`: mixed batches), with
    more than two programs per SM (a smaller grid starts every program at once). Decode batches
    keep the plain order. Shapes only."""
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

    Split when the fused grid (``num_programs`` = query blocks x Hkv) leaves SMs idle (even for
    one split), or when rows span several splits of ``split_tokens`` KV tokens and, with host
    statistics (KV tiles of the longest request and over all programs), the longest program would
    run longer than a third of the average work per SM (a few programs share an SM, so a long one
    is a tail). Without statistics (``max_kv_len`` is then the block table's bound), a decode
    batch (``decode``) splits too: its lengths may differ, and on an H100 the split plan took
    1.14 ms where fused took 1.81 ms on 64 decodes of 4k-32k tokens, while costing -1 to +1.4%
    on equal lengths. Prefill batches stay fused (the split plan took 11.0 ms where fused took
    9.5 ms on a varlen prefill). Tuned on an H100 (reports/h100-round4/README.md).

    On the 128-key Gluon kernels (``gluon``; kernels/README.md, "The 128-key contract") the
    fused kernel streams an under-filled grid faster than the split kernel and its merge: on an
    H100 (reports/h100-round20/README.md, call 3) decode batches of 8 and 16 requests (64 and
    128 programs) took 0.93-1.01x the split plan's time fused, batches of 2 and 4 (16 and 32
    programs) 1.08-3.07x. So there the split plan takes grids of at most a quarter of the SMs,
    and a larger under-filled grid is fused when its lengths are balanced (with statistics: the
    longest program walks at most twice the average); the other rules follow.

    Where the split plan would run the keys-as-rows decode tile (``keys_rows``: a decode batch
    it takes by shapes, or any batch with ``Tuning(keys_rows=True)``; kernels/README.md, "The
    keys-as-rows decode tile") the split plan is faster still (reports/h100-round24/README.md,
    GQA group 4): it takes every batch whose rows lie within the lead splits (``num_splits``,
    the split plan's splits per row as launched, at most ``split_tokens // lead_tokens``, else
    ``max_kv_len <= split_tokens``: one split per row before round 28, the tile's direct store;
    0.93-0.98x the fused plan's time on 8-256 decodes of 512-1024 keys, whatever the grid; with
    lead splits the tile walks them and stores directly on grids past the SMs, and on smaller
    ones runs one program per lead split and the merge, ``kt_walk_lead``), and an
    under-filled grid is fused only when the longest program walks at most 1.5 times the
    average (the two mixed-length batches at 1.6 and 1.74 times took 0.63-0.86x split; equal
    lengths of 2k-8k keys 1.00-1.07x).
    """
    if gluon and num_programs * 4 <= num_sms:
        return "split"
    # Rows within the lead splits: at most split_tokens // lead_tokens splits each.
    lead_splits = split_tokens // lead_tokens if lead_tokens else 1
    if keys_rows and (num_splits <= lead_splits if num_splits is not None
                      else max_kv_len <= split_tokens):
        return "split"
    balanced = 3 if keys_rows else 4  # the longest program, in halves of the average
    if (gluon and num_programs < num_sms and longest_tiles is not None
            and total_tiles is not None
            and 2 * longest_tiles * num_programs <= balanced * total_tiles):
        return "fused"
    if num_programs < num_sms:
        # Even with one split: the split kernel's tile loop has no split-boundary branch, and on
        # an H100 it ran one 1024-token decode in 24 us where the fused loop took 35 us.
        return "split"
    if max_kv_len <= split_tokens:
        return "fused"
    if longest_tiles is not None and total_tiles is not None:
        return "split" if 3 * longest_tiles * num_sms > total_tiles else "fused"
    return "split" if decode else "fused"
