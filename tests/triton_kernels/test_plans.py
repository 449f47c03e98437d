"""The execution plans (fused, split, auto) give identical bits for a fixed split size."""

from __future__ import annotations

import random

import pytest
import torch

from invariance import PageLayout
from kernels import plan_attention, tile_config, unified_attention

# (seed, split size in units of BLOCK_N, page size). Seeds pick random mixed batches (decode rows
# and prefill chunks, KV lengths up to 128, so a row spans up to 4 splits of one tile); the tile
# config fixes BLOCK_N per (dtype, head_dim), so split sizes are multiples of it; page size 1 is
# the per-key gather, 64 one page per tile for every BLOCK_N, 4 in between.
CASES = [
    pytest.param(0, 1, 1, id="seed0-split1xBN-page1"),
    pytest.param(1, 3, 64, id="seed1-split3xBN-page64"),
    pytest.param(2, 2, 4, id="seed2-split2xBN-page4"),
]


def _random_shape(seed: int) -> list[tuple[int, int]]:
    rng = random.Random(seed)
    shape = []
    for _ in range(rng.randint(2, 4)):
        kv_len = rng.randint(0, 128)
        q_len = min(kv_len, rng.choice([0, 1, 1, rng.randint(0, 20)]))
        shape.append((q_len, kv_len))
    return shape


@pytest.mark.parametrize(("seed", "split_tiles", "page_size"), CASES)
def test_fused_equals_split(dtype: torch.dtype, make_batch, args_of, assert_same_bits, seed: int,
                            split_tiles: int, page_size: int) -> None:
    batch = make_batch(dtype, _random_shape(seed), PageLayout(page_size, "shuffled", seed=seed))
    split = split_tiles * tile_config(dtype, 64).block_n
    fused = unified_attention(*args_of(batch), split_size=split, plan="fused")
    split_plan = unified_attention(*args_of(batch), split_size=split, plan="split")
    assert_same_bits(split_plan, fused, "plan split vs fused")


def test_auto_runs_a_plan_with_the_same_bits(dtype: torch.dtype, make_batch, args_of,
                                             assert_same_bits) -> None:
    # Small batches (few programs) of rows longer than a split: auto picks the split plan.
    batch = make_batch(dtype, [(1, 90), (3, 50)], PageLayout(16, "shuffled"))
    split = tile_config(dtype, 64).block_n
    assert plan_attention(*args_of(batch), split_size=split).plan == "split"
    auto = unified_attention(*args_of(batch), split_size=split)
    fused = unified_attention(*args_of(batch), split_size=split, plan="fused")
    assert_same_bits(auto, fused, "plan auto (split) vs fused")


def test_split_plan_ignores_uninitialised_workspace(dtype: torch.dtype, make_batch, args_of,
                                                    assert_same_bits, device) -> None:
    # Run twice with the caching allocator full of NaN in between: same bits. (On a GPU the
    # harness's Schedule(poison=True) does the same at scale: see test_gpu.py.)
    batch = make_batch(dtype, [(1, 100), (7, 40)], PageLayout(4))
    split = tile_config(dtype, 64).block_n
    first = unified_attention(*args_of(batch), split_size=split, plan="split")
    junk = torch.full((1 << 20,), float("nan"), device=device)
    del junk
    second = unified_attention(*args_of(batch), split_size=split, plan="split")
    assert_same_bits(first, second, "split plan, run 1 vs run 2 after NaN garbage")
