"""The execution plans (fused, split, auto) give identical bits for a fixed split size."""

from __future__ import annotations

import functools
import random
from dataclasses import replace
from typing import Any

import pytest
import torch

import kernels._device
import kernels.config
import kernels.launch
import kernels.plan
from invariance import HeadConfig, PageLayout
from kernels import Tuning, plan_attention, tile_config, unified_attention

# (seed, split size in units of BLOCK_N, page size). Seeds pick random mixed batches (decode rows
# and prefill chunks, KV lengths up to 128, so a row spans up to 4 splits of one tile at float32's
# 32-key tile, one or two at half precision's 64 or 128 keys); the tile config fixes BLOCK_N per
# (dtype, head_dim), so split sizes are multiples of it; page size 1 is the per-key gather, 64 a
# page per tile of 32 or 64 keys and two pages per 128-key tile, 4 in between.
CASES = [
    pytest.param(0, 1, 1, id="seed0-split1xBN-page1"),
    pytest.param(1, 3, 64, id="seed1-split3xBN-page64"),
    pytest.param(2, 2, 4, id="seed2-split2xBN-page4"),
]


#: The 64-key contract on Hopper, where the per-batch rules below were measured.
N64 = Tuning(block_n=64)


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


@pytest.mark.parametrize("blocks", [2, 4])
@pytest.mark.parametrize(("seed", "split_tiles", "page_size"), CASES)
def test_value_blocks_give_the_same_bits(dtype: torch.dtype, make_batch, args_of,
                                         assert_same_bits, seed: int, split_tiles: int,
                                         page_size: int, blocks: int) -> None:
    """The split plan with the V columns cut into 2 or 4 programs per (slot, KV head, split) vs
    one, with one split per row (direct stores) and several (merge)."""
    batch = make_batch(dtype, _random_shape(seed), PageLayout(page_size, "shuffled", seed=seed))
    split = split_tiles * tile_config(dtype, 64).block_n
    for size in (split, 1 << 20):  # several splits per row; one (written directly)
        one = unified_attention(*args_of(batch), split_size=size, plan="split",
                                tuning=Tuning(value_blocks=1))
        cut = unified_attention(*args_of(batch), split_size=size, plan="split",
                                tuning=Tuning(value_blocks=blocks))
        assert_same_bits(cut, one, f"{blocks} value blocks vs 1, split size {size}")


@pytest.mark.slow
def test_eight_value_blocks_give_the_same_bits(dtype: torch.dtype, make_batch, args_of,
                                               assert_same_bits) -> None:
    """Eight V column blocks of 16 columns (head dim 128) vs one, with two tiles per loop step
    as the rule pairs them: a decode over 1-3 splits, a prefill chunk, one split per row."""
    block_n = tile_config(dtype, 128).block_n
    batch = make_batch(dtype, [(1, 5 * block_n + 3), (4, 2 * block_n)],
                       PageLayout(4, "shuffled", seed=5), heads=HeadConfig(4, 2, 128), seed=2)
    for size in (2 * block_n, 1 << 20):
        one = unified_attention(*args_of(batch), split_size=size, plan="split",
                                tuning=Tuning(value_blocks=1, tiles_per_step=1))
        cut = unified_attention(*args_of(batch), split_size=size, plan="split",
                                tuning=Tuning(value_blocks=8, tiles_per_step=2))
        assert_same_bits(cut, one, f"8 value blocks vs 1, split size {size}")


def test_split_settings_apply_to_the_split_plan_only(dtype: torch.dtype, make_batch, args_of,
                                                     monkeypatch) -> None:
    """V column blocks and tiles per loop step: forced by Tuning for the split plan only, else
    the shape rules, through plan_attention."""
    batch = make_batch(dtype, [(1, 40)])

    def picks(*args: torch.Tensor, **kwargs: Any) -> tuple[int, int]:
        lp = plan_attention(*args, **kwargs)
        return lp.value_blocks, lp.tiles_per_step

    for plan, expected in (("split", (2, 2)), ("fused", (1, 1))):
        tuning = Tuning(value_blocks=2, tiles_per_step=2)
        assert picks(*args_of(batch), plan=plan, tuning=tuning) == expected, plan
    # No tuning: the shape rules, which leave the interpreter (no GPU measured) at 1.
    assert picks(*args_of(batch), plan="split") == (1, 1)
    # The rules through plan_attention, as on an H100 (132 SMs), head dim 128: one decode of a
    # short row and 8 decodes of 2 KV heads over 1-4 splits of 64 tokens (a 4096-token table
    # bound without host_lens).
    monkeypatch.setattr(kernels.plan, "_sm_major", lambda device: 9)
    monkeypatch.setattr(kernels.plan, "_num_sms", lambda device: 132)
    heads = HeadConfig(4, 2, 128)
    half = dtype != torch.float32
    one = make_batch(dtype, [(1, 40)], heads=heads)
    assert picks(*args_of(one), plan="split", tuning=N64) == ((8, 2) if half else (1, 1))
    many = make_batch(dtype, [(1, 40 + 20 * i) for i in range(8)], heads=heads)
    args = args_of(many)
    wide = (*args[:5], torch.cat([args[5], args[5].new_zeros(8, 250)], 1))  # 4096 tokens
    lens = ([1] * 8, [40 + 20 * i for i in range(8)])
    # With host_lens: 8 query blocks, 17 tiles of 64 in all -> min(8 x 3, 17 + 8) = 24 live splits
    # x 2 heads = 48 programs (2 blocks; one tile per step, as rows span several splits); the
    # table bound alone counts 8 x 64 x 2 (1 block, 1 tile).
    assert picks(*wide, plan="split", split_size=64, validate=False,
                 host_lens=lens, tuning=N64) == ((2, 1) if half else (1, 1))
    assert picks(*wide, plan="split", split_size=64, validate=False, tuning=N64) == (1, 1)
    # Several splits are judged from the longest length known, not the table's bound: 24
    # decodes of one split each (40 tokens) in a 4096-token table, 48 programs: 2 blocks and
    # two tiles per step, not the one tile of rows over several splits.
    short = make_batch(dtype, [(1, 40)] * 24, heads=heads)
    args = args_of(short)
    wide = (*args[:5], torch.cat([args[5], args[5].new_zeros(24, 250)], 1))
    assert picks(*wide, plan="split", split_size=64, validate=False,
                 host_lens=([1] * 24, [40] * 24), tuning=N64) == ((2, 2) if half else (1, 1))
    assert picks(*wide, plan="split", split_size=64, tuning=N64) == ((2, 2) if half else (1, 1))


@pytest.mark.parametrize(("rule", "small_to_large"), [
    ("value_blocks", [8, 2, 2, 1, 1]), ("tiles_per_step", [2, 2, 2, 1, 1])])
def test_split_rules_only_on_small_grids_where_measured_neutral(
        rule: str, small_to_large: list[int]) -> None:
    """The shape rules of the split plan, with one split per row (several splits:
    test_two_tiles_per_step_only_where_the_grid_with_its_value_blocks_fits_the_sms): decode at
    batch 1 with 1k tokens is 8 programs (8 KV heads, one split), batch 8 with 1k 64, batch 1
    with 32k 256 (with its 32 splits)."""
    pick = getattr(kernels.config, rule)
    bf16, fp32 = torch.bfloat16, torch.float32
    assert [pick(bf16, 128, n, 132, 9) for n in (8, 64, 66, 67, 256)] == small_to_large
    assert pick(torch.float16, 128, 8, 132, 9) == small_to_large[0]
    # Unmeasured: other GPUs, the interpreter, float32, other head dims.
    assert pick(bf16, 128, 8, 132, 8) == 1
    assert pick(bf16, 128, 8, 132, None) == 1
    assert pick(fp32, 128, 8, 132, 9) == 1
    assert pick(bf16, 64, 8, 132, 9) == 1


def test_value_blocks_double_while_the_grid_stays_small() -> None:
    """The doubling rule alone: rows over several splits get no more blocks than one split."""
    pick = kernels.config.value_blocks
    grids = (8, 16, 17, 32, 33, 64, 66, 67, 128)
    assert [pick(torch.bfloat16, 128, n, 132, 9) for n in grids] == [8, 8, 4, 4, 4, 2, 2, 1, 1]


@pytest.mark.parametrize("blocks", [1, 2])
@pytest.mark.slow
def test_two_tiles_per_step_give_the_same_bits(dtype: torch.dtype, make_batch, args_of,
                                               assert_same_bits, blocks: int) -> None:
    """The split plan walking its fully visible tiles two per loop step vs one: rows over 0-7
    tiles, splits of 3 and 4 tiles (an odd tile left over, a masked last tile) and one split
    per row (direct stores), with one or two V column blocks."""
    block_n = tile_config(dtype, 64).block_n
    shape = [(1, 7 * block_n + 5), (3, 5 * block_n), (1, 2 * block_n), (6, 3 * block_n + 1),
             (0, 16), (1, 1)]
    batch = make_batch(dtype, shape, PageLayout(4, "shuffled", seed=2), seed=1)
    for size in (3 * block_n, 4 * block_n, 1 << 20):
        one = unified_attention(*args_of(batch), split_size=size, plan="split",
                                tuning=Tuning(tiles_per_step=1, value_blocks=blocks))
        two = unified_attention(*args_of(batch), split_size=size, plan="split",
                                tuning=Tuning(tiles_per_step=2, value_blocks=blocks))
        assert_same_bits(two, one, f"2 tiles per step vs 1, split size {size}")


@pytest.mark.slow
def test_the_fused_nested_loop_gives_the_flat_loops_bits(dtype: torch.dtype, make_batch,
                                                         args_of, assert_same_bits) -> None:
    """The fused plan with an inner loop per split (one and two fully visible tiles per step)
    vs its flat loop: prefill and decode rows over 0-7 tiles, splits of 2 and 3 tiles (a fold
    inside a query block's masked tiles, an odd tile left over, a split ending exactly at the
    last tile, a last split cut short); 16-row tiles so that the prompt spans several blocks."""
    block_n = tile_config(dtype, 64).block_n
    shape = [(1, 7 * block_n + 5), (block_n + 3, 4 * block_n), (6, 3 * block_n + 1), (0, 16),
             (1, 1)]
    batch = make_batch(dtype, shape, PageLayout(4, "shuffled", seed=2), seed=1)
    for size in (2 * block_n, 3 * block_n):
        flat = unified_attention(*args_of(batch), split_size=size, plan="fused",
                                 tuning=Tuning(block_m=16, nested_loop=False))
        for step in (1, 2):
            nested = unified_attention(*args_of(batch), split_size=size, plan="fused",
                                       tuning=Tuning(block_m=16, nested_loop=True,
                                                     tiles_per_step=step))
            assert_same_bits(nested, flat, f"nested loop ({step} tiles per step) vs flat, "
                                           f"split size {size}")


def test_the_fused_nested_loop_with_a_split_near_two_to_the_31_tiles(
        dtype: torch.dtype, make_batch, args_of, assert_same_bits) -> None:
    """A split size of 2**31 - 1 tiles (a valid ``split_size``: one split per row) walks every
    row's one split in the nested loop too: its split count must not wrap in int32."""
    block_n = tile_config(dtype, 64).block_n
    batch = make_batch(dtype, [(2, 3 * block_n), (1, block_n + 1)])
    size = (2**31 - 1) * block_n
    flat = unified_attention(*args_of(batch), split_size=size, plan="fused",
                             tuning=Tuning(nested_loop=False))
    nested = unified_attention(*args_of(batch), split_size=size, plan="fused",
                               tuning=Tuning(nested_loop=True))
    assert_same_bits(nested, flat, "nested loop vs flat, split size (2**31 - 1) tiles")
    assert bool(torch.isfinite(nested[1]).all()), "every row sees keys: a finite LSE"


def test_the_launch_passes_the_plans_fused_loop(dtype: torch.dtype, make_batch, args_of,
                                                monkeypatch) -> None:
    """The fused kernel is launched with the plan's loop (a launcher that dropped it would make
    the comparison above compare the flat loop with itself); the flat loop takes one tile per
    step whatever Tuning says."""
    real = kernels.launch._unified_attention_fused_kernel
    seen: list[object] = []

    class Spy:
        def __getitem__(self, grid: tuple[int, ...]):
            def launch(*args: object, **kwargs: object) -> None:
                seen.append((kwargs["IS_NESTED"], kwargs["TILES_PER_STEP"]))
                real[grid](*args, **kwargs)
            return launch

    monkeypatch.setattr(kernels.launch, "_unified_attention_fused_kernel", Spy())
    batch = make_batch(dtype, [(1, 40)])
    for nested, step in ((True, 2), (True, None), (False, 2), (None, None)):
        unified_attention(*args_of(batch), plan="fused",
                          tuning=Tuning(nested_loop=nested, tiles_per_step=step))
    assert seen == [(True, 2), (True, 1), (False, 1), (False, 1)]


def test_the_launch_passes_the_plans_tiles_per_step(dtype: torch.dtype, make_batch, args_of,
                                                    monkeypatch) -> None:
    """The split kernel is launched with the plan's tiles per step (a launcher that dropped it
    would make the bit comparison above compare one tile per step with itself)."""
    real = kernels.launch._unified_attention_split_kernel
    seen: list[object] = []

    class Spy:
        def __getitem__(self, grid: tuple[int, ...]):
            def launch(*args: object, **kwargs: object) -> None:
                seen.append(kwargs["TILES_PER_STEP"])
                real[grid](*args, **kwargs)
            return launch

    monkeypatch.setattr(kernels.launch, "_unified_attention_split_kernel", Spy())
    batch = make_batch(dtype, [(1, 40)])
    for step in (2, 1, None):
        unified_attention(*args_of(batch), plan="split", tuning=Tuning(tiles_per_step=step))
    assert seen == [2, 1, 1]


def test_dependent_merge_where_the_gpu_has_it(dtype: torch.dtype, make_batch, args_of,
                                              monkeypatch) -> None:
    """The merge is a programmatic dependent launch only for the split plan with several
    splits, on compute capability 9 or more, unless Tuning turns it off; the interpreter never
    takes it (griddepcontrol is PTX). The compute capability is set here, so the test means
    the same on a CPU and on any GPU."""
    batch = make_batch(dtype, [(1, 200), (3, 90)])
    block_n = tile_config(dtype, 64).block_n

    def dependent(**kwargs: Any) -> bool:
        return plan_attention(*args_of(batch), **kwargs).dependent_merge

    monkeypatch.setattr(kernels.plan, "HAS_GDC", True)  # Triton 3.4+ (gdc_wait)
    monkeypatch.setattr(kernels.plan, "_sm_major", lambda device: None)  # the interpreter
    assert not dependent(plan="split", split_size=block_n)
    monkeypatch.setattr(kernels.plan, "_sm_major", lambda device: 9)
    assert dependent(plan="split", split_size=block_n)
    assert not dependent(plan="split", split_size=block_n,
                         tuning=Tuning(dependent_merge=False))
    assert not dependent(plan="split", split_size=1 << 20)  # one split: no merge
    assert not dependent(plan="fused", split_size=block_n)
    monkeypatch.setattr(kernels.plan, "_sm_major", lambda device: 8)
    assert not dependent(plan="split", split_size=block_n)
    # A Triton without griddepcontrol (before 3.4): never, even on sm_90.
    monkeypatch.setattr(kernels.plan, "_sm_major", lambda device: 9)
    monkeypatch.setattr(kernels.plan, "HAS_GDC", False)
    assert not dependent(plan="split", split_size=block_n)


def test_the_merge_launch_follows_the_plans_dependent_merge(dtype: torch.dtype, make_batch,
                                                            args_of, monkeypatch) -> None:
    """Both kernels get the plan's setting: the split kernel's trigger (IS_PDL) and the merge
    kernel's wait (IS_PDL) with the launch attribute (launch_pdl). Recorded, not launched: the
    interpreter has no griddepcontrol."""
    seen: list[tuple[str, object, object]] = []

    class Spy:
        def __init__(self, name: str) -> None:
            self.name = name

        def __getitem__(self, grid: tuple[int, ...]):
            def launch(*args: object, **kwargs: object) -> None:
                seen.append((self.name, kwargs["IS_PDL"], kwargs.get("launch_pdl", False)))
            return launch

    monkeypatch.setattr(kernels.launch, "_unified_attention_split_kernel", Spy("split"))
    monkeypatch.setattr(kernels.launch, "_merge_splits_kernel", Spy("merge"))
    monkeypatch.setattr(kernels.plan, "HAS_GDC", True)
    batch = make_batch(dtype, [(1, 200)])
    split = tile_config(dtype, 64).block_n
    monkeypatch.setattr(kernels.plan, "_sm_major", lambda device: None)  # the interpreter
    unified_attention(*args_of(batch), plan="split", split_size=split)
    monkeypatch.setattr(kernels.plan, "_sm_major", lambda device: 9)
    unified_attention(*args_of(batch), plan="split", split_size=split)
    assert seen == [("split", False, False), ("merge", False, False),
                    ("split", True, False), ("merge", True, True)]


def test_the_merge_grid_covers_every_head_and_column(dtype: torch.dtype, make_batch, args_of,
                                                     monkeypatch) -> None:
    """The merge's grid is (tokens, head blocks, column blocks): one program per head and
    16-column block when the blocks say so (6 heads, head dim 64), one per token under the
    interpreter's defaults (every head, the whole head dim). Recorded, not launched."""
    grids: list[tuple[int, ...]] = []

    class Spy:
        def __getitem__(self, grid: tuple[int, ...]):
            def launch(*args: object, **kwargs: object) -> None:
                grids.append((*grid, kwargs["BLOCK_H"], kwargs["BLOCK_D"]))
            return launch

    monkeypatch.setattr(kernels.launch, "_merge_splits_kernel", Spy())
    batch = make_batch(dtype, [(1, 200), (2, 300)], heads=HeadConfig(6, 2, 64))
    split = tile_config(dtype, 64).block_n
    unified_attention(*args_of(batch), plan="split", split_size=split)
    monkeypatch.setattr(kernels.launch, "_merge_block_h", lambda num_q_heads: 4)
    monkeypatch.setattr(kernels.launch, "_merge_block_d", lambda head_dim: 16)
    unified_attention(*args_of(batch), plan="split", split_size=split)
    assert grids == [(3, 1, 1, 8, 64), (3, 2, 4, 4, 16)]


def test_merge_matches_the_serial_fold(dtype: torch.dtype, make_batch, args_of, assert_same_bits,
                                       monkeypatch) -> None:
    """The merge kernel's schedule (a step's weights before its fmas, loads a step ahead, (m, l)
    in one 8-byte load, head blocks) changes none of its operations: against the frozen serial
    fold (frozen_merge.py), the same bits on rows of 1 to 10 splits (float32's 32-key tiles; 1
    to 3 at half precision's 128), a GQA group of 3 (head blocks that are not a KV head's group)
    and 3 partials per step."""
    from frozen_merge import SerialMerge

    batch = make_batch(dtype, [(1, 300), (4, 190), (1, 70), (2, 40)],
                       PageLayout(4, "shuffled", seed=6), heads=HeadConfig(6, 2, 64))
    split = tile_config(dtype, 64).block_n
    monkeypatch.setattr(kernels.launch, "_merge_chunk", lambda: 3)
    new = unified_attention(*args_of(batch), split_size=split, plan="split")
    monkeypatch.setattr(kernels.launch, "_merge_splits_kernel", SerialMerge(3))
    old = unified_attention(*args_of(batch), split_size=split, plan="split")
    assert_same_bits(new, old, "the merge kernel vs the serial fold")


@pytest.mark.parametrize("sign", ["-0.0", "+0.0"])
def test_fused_equals_split_with_zero_values(dtype: torch.dtype, make_batch, args_of,
                                             assert_same_bits, sign: str) -> None:
    """V exactly zero, of either sign: every output is a zero whose sign is the plans' to
    agree on (the fused plan folds each row's first split into the empty state, the split plan
    with one split writes it directly). An end-to-end property only: on the H100 it passed
    with state_fold's literal -0.0 weight too (which Triton 3.6 compiles to +0.0), because the
    tile loop's accumulator starts at +0 and no partial state holds a -0.0 there; the fold
    test in test_merge.py is the one that catches that constant."""
    # A decode over 1-4 splits, a prefill chunk over 1-3, an empty request.
    batch = make_batch(dtype, [(1, 200), (5, 130), (0, 16)], PageLayout(4, "shuffled", seed=3))
    batch.v_cache.fill_(float(sign))
    split = 2 * tile_config(dtype, 64).block_n
    fused = unified_attention(*args_of(batch), split_size=split, plan="fused")
    split_plan = unified_attention(*args_of(batch), split_size=split, plan="split")
    assert_same_bits(split_plan, fused, f"plan split vs fused, V = {sign}")


@pytest.mark.parametrize("block_d", [16, 32])
def test_merge_column_blocks_are_bit_neutral(dtype: torch.dtype, make_batch, args_of,
                                             assert_same_bits, monkeypatch,
                                             block_d: int) -> None:
    # On a GPU the merge kernel cuts the head dim into column blocks (one program each); the
    # interpreter merges whole heads. Every column runs the same arithmetic on the same LSEs, so
    # the split plan must give the same bits with any column block.

    batch = make_batch(dtype, [*_random_shape(3), (2, 150)], PageLayout(4, "shuffled", seed=3))
    split = tile_config(dtype, 64).block_n
    monkeypatch.setattr(kernels.launch, "_merge_block_d", lambda head_dim: head_dim)
    whole = unified_attention(*args_of(batch), split_size=split, plan="split")
    monkeypatch.setattr(kernels.launch, "_merge_block_d", lambda head_dim: block_d)
    blocked = unified_attention(*args_of(batch), split_size=split, plan="split")
    assert_same_bits(blocked, whole, f"merge in {block_d}-column blocks vs whole heads")


@pytest.mark.parametrize("block_h", [1, 4])
def test_merge_head_blocks_are_bit_neutral(dtype: torch.dtype, make_batch, args_of,
                                           assert_same_bits, monkeypatch, block_h: int) -> None:
    # On a GPU the merge kernel takes one query head per program; the interpreter every head.
    # Each row's fold is the same arithmetic whichever program runs it, so the split plan must
    # give the same bits with any head block (4 of 6 heads: a block that ends past the last).

    batch = make_batch(dtype, [*_random_shape(5), (2, 150)], PageLayout(4, "shuffled", seed=5),
                       heads=HeadConfig(6, 2, 64))
    split = tile_config(dtype, 64).block_n
    whole = unified_attention(*args_of(batch), split_size=split, plan="split")
    monkeypatch.setattr(kernels.launch, "_merge_block_h", lambda num_q_heads: block_h)
    blocked = unified_attention(*args_of(batch), split_size=split, plan="split")
    assert_same_bits(blocked, whole, f"merge in blocks of {block_h} heads vs every head")


def test_merge_chunks_are_bit_neutral(dtype: torch.dtype, make_batch, args_of, assert_same_bits,
                                      monkeypatch) -> None:
    # On a GPU the merge kernel loads 8 partials per step, one step ahead of their folds; the
    # interpreter 1. Loads of splits past a row's last one must be exact no-ops: chunks of 3 over
    # rows of 1 to 10 splits (float32; the merge reads float32 partials whatever q's dtype).

    batch = make_batch(dtype, [(1, 300), (4, 190), (1, 70)], PageLayout(4, "shuffled", seed=4))
    split = tile_config(dtype, 64).block_n
    one = unified_attention(*args_of(batch), split_size=split, plan="split")
    monkeypatch.setattr(kernels.launch, "_merge_chunk", lambda: 3)
    chunked = unified_attention(*args_of(batch), split_size=split, plan="split")
    assert_same_bits(chunked, one, "merge loading 3 splits per step vs 1")


def test_split_plan_with_one_split_writes_directly(dtype: torch.dtype, make_batch, args_of,
                                                  assert_same_bits) -> None:
    # Every row within one split: the split kernel writes out and LSE itself (no merge launch).
    batch = make_batch(dtype, [(1, 60), (5, 64), (0, 10), (12, 30)], PageLayout(4, "shuffled"))
    split = 2 * tile_config(dtype, 64).block_n
    assert plan_attention(*args_of(batch), split_size=split, plan="split").num_splits == 1
    direct = unified_attention(*args_of(batch), split_size=split, plan="split")
    fused = unified_attention(*args_of(batch), split_size=split, plan="fused")
    assert_same_bits(direct, fused, "split plan writing directly vs fused")


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


def test_merge_reads_no_unwritten_partial(dtype: torch.dtype, make_batch, args_of,
                                          assert_same_bits, monkeypatch) -> None:
    # The workspace is torch.empty: filled with NaN here, the merge must give the same bits with
    # 3 partials per step (its loads a step ahead reach past a row's last split, masked) and one
    # head per program, so it reads no partial the split kernel did not write.

    batch = make_batch(dtype, [(1, 300), (4, 190), (1, 70)], PageLayout(4, "shuffled", seed=7),
                       heads=HeadConfig(6, 2, 64))
    split = tile_config(dtype, 64).block_n
    clean = unified_attention(*args_of(batch), split_size=split, plan="split")
    empty = torch.empty

    def nan_empty(*args, **kwargs):
        t = empty(*args, **kwargs)
        return t.fill_(float("nan")) if t.is_floating_point() else t

    monkeypatch.setattr(kernels.launch.torch, "empty", nan_empty)
    monkeypatch.setattr(kernels.launch, "_merge_chunk", lambda: 3)
    monkeypatch.setattr(kernels.launch, "_merge_block_h", lambda num_q_heads: 1)
    poisoned = unified_attention(*args_of(batch), split_size=split, plan="split")
    assert_same_bits(poisoned, clean, "merge over a NaN-filled workspace vs a fresh one")


# ------------------------------------------------------------------------------------------------
# Per-batch choices from shapes and host lengths (speed only: checked bit-neutral on the GPU)
# ------------------------------------------------------------------------------------------------


def test_batch_tuning_raises_block_m_only_where_measured_neutral() -> None:
    from kernels.config import batch_tuning

    for dt in (torch.float16, torch.bfloat16):
        # At 64 keys, 32 tokens x 4 heads each, below and at long prompts: two 64-row
        # warpgroups, 3 stages; decode keeps tile_config's 64 rows.
        for tokens in (32, 1023, 1024, 4096):
            cfg = batch_tuning(dt, 128, 4, 8 * tokens, 8, 9, block_n=64)
            assert (cfg.block_m, cfg.num_warps, cfg.num_stages, cfg.block_n) == (128, 8, 3, 64)
        decode = batch_tuning(dt, 128, 4, 8, 8, 9, block_n=64)
        assert decode == tile_config(dt, 128, 9)  # Hopper without Gluon: the 64-key contract
        assert decode == replace(tile_config(dt, 128, 9, gluon=True), block_n=64)
        # At 128 keys (Hopper's default with Gluon): the Gluon tile's 128 rows on 8 warps for
        # every batch.
        for tokens, batch in ((8, 8), (8 * 4096, 8), (0, 0)):
            cfg = batch_tuning(dt, 128, 4, tokens, batch, 9, block_n=128)
            assert (cfg.block_m, cfg.num_warps, cfg.num_stages, cfg.block_n) == (128, 8, 3, 128)
        assert batch_tuning(dt, 64, 4, 4096, 8, 9) == tile_config(dt, 64)  # not measured
        batch_tuning(dt, 128, 4, 0, 0, 9)  # an empty batch: no error
        # Not Hopper (64 and 128 both mma.sync there, unmeasured) or the interpreter: fixed.
        for sm in (8, 10, None):
            assert batch_tuning(dt, 128, 4, 4096, 1, sm) == tile_config(dt, 128)
    # float32: BLOCK_M 64 vs 32 changed bits on an H100: never varied.
    assert batch_tuning(torch.float32, 128, 4, 4096, 1, 9) == tile_config(torch.float32, 128)
    for dt in (torch.float16, torch.bfloat16, torch.float32):  # BLOCK_N never moves per batch
        for tokens in (1, 4096):
            assert (batch_tuning(dt, 128, 4, tokens, 1, 9).block_n
                    == tile_config(dt, 128, 9).block_n)
            assert batch_tuning(dt, 128, 4, tokens, 1, 9, block_n=128).block_n == 128


def test_prefills_get_the_nested_tile_and_overrides_keep_their_own_warps(monkeypatch,
                                                                         device) -> None:
    # As on an H100 (sm 9): a 2048-token prompt gets 128 rows on 8 warps and 3 stages, the fused
    # plan's nested loop with two tiles per step; a Tuning that names only block_m takes warps
    # and stages from tile_config, not from that, and with them the flat loop.

    monkeypatch.setattr(kernels.plan, "_sm_major", lambda device: 9)
    bf16, i32 = torch.bfloat16, torch.int32
    args = tuple(t.to(device) for t in (
        torch.zeros(2048, 8, 128, dtype=bf16), torch.zeros(130, 16, 2, 128, dtype=bf16),
        torch.zeros(130, 16, 2, 128, dtype=bf16), torch.tensor([0, 2048], dtype=i32),
        torch.tensor([2048], dtype=i32), torch.arange(128, dtype=i32)[None]))
    lp = plan_attention(*args, validate=False, plan="split", tuning=N64)
    assert (lp.block_m, lp.num_warps, lp.num_stages, lp.tiles_per_step) == (128, 8, 3, 2)
    lp = plan_attention(*args, validate=False, plan="split",
                        tuning=Tuning(block_n=64, num_warps=4))
    assert (lp.block_m, lp.num_warps, lp.tiles_per_step) == (128, 4, 1)
    lp = plan_attention(*args, validate=False, plan="fused", tuning=N64)
    assert (lp.block_m, lp.num_warps, lp.num_stages) == (128, 8, 3)
    assert (lp.nested_loop, lp.tiles_per_step) == (True, 2)
    assert kernels.launch._k_rows(lp, bf16)
    cfg = tile_config(bf16, 128)
    lp = plan_attention(*args, validate=False, plan="fused",
                        tuning=Tuning(block_n=64, block_m=128))
    assert (lp.block_m, lp.num_warps, lp.num_stages) == (128, cfg.num_warps, cfg.num_stages)
    assert (lp.nested_loop, lp.tiles_per_step) == (False, 1)
    assert not kernels.launch._k_rows(lp, bf16)
    lp = plan_attention(*args, validate=False, plan="fused",
                        tuning=Tuning(block_n=64, num_stages=2))
    assert (lp.block_m, lp.num_warps, lp.num_stages) == (128, 8, 2)
    assert (lp.nested_loop, lp.tiles_per_step) == (True, 2)
    lp = plan_attention(*args, validate=False, plan="fused",
                        tuning=Tuning(block_n=64, nested_loop=False, tiles_per_step=2))
    assert (lp.nested_loop, lp.tiles_per_step) == (False, 1)
    lp = plan_attention(*args, validate=False, plan="fused",
                        tuning=Tuning(block_n=64, tiles_per_step=1))
    assert (lp.nested_loop, lp.tiles_per_step) == (True, 1)


def test_the_prefill_tile_takes_two_tiles_per_step_in_the_split_plan_too() -> None:
    """128 rows on 8 warps walk two fully visible tiles per step on any grid; other tiles only
    on small grids; nothing off Hopper or outside half precision at head dim 128."""
    from kernels.config import tiles_per_step

    for dt in (torch.float16, torch.bfloat16):
        assert tiles_per_step(dt, 128, 1000, 132, 9, 128, 8) == 2
        assert tiles_per_step(dt, 128, 1000, 132, 9, 128, 4) == 1
        assert tiles_per_step(dt, 128, 1000, 132, 9) == 1
        assert tiles_per_step(dt, 128, 66, 132, 9) == 2
        assert tiles_per_step(dt, 128, 1000, 132, None, 128, 8) == 1
        assert tiles_per_step(dt, 64, 1000, 132, 9, 128, 8) == 1
    assert tiles_per_step(torch.float32, 128, 1000, 132, 9, 128, 8) == 1


def test_fused_loop_rule() -> None:
    """The nested loop with two tiles per step for 128 rows on 8 warps, half precision at head
    dim 128 on Hopper only; the flat loop elsewhere."""
    from kernels.config import fused_loop

    for dt in (torch.float16, torch.bfloat16):
        assert fused_loop(dt, 128, 128, 8, 9) == (True, 2)
        for bm, w in ((128, 4), (256, 8), (64, 4), (64, 8)):
            assert fused_loop(dt, 128, bm, w, 9) == (False, 1), (bm, w)
        for sm in (8, 10, None):
            assert fused_loop(dt, 128, 128, 8, sm) == (False, 1)
        assert fused_loop(dt, 64, 128, 8, 9) == (False, 1)
    assert fused_loop(torch.float32, 128, 128, 8, 9) == (False, 1)


def test_decode_stages_rule() -> None:
    """5 stages for the 64-row decode tile on 4 warps (either plan), half precision at head dim
    128 on Hopper only (measured on an H100: CHANGELOG.md); elsewhere the tile configuration's
    stages."""
    stages = kernels.config.decode_stages
    for dt in (torch.float16, torch.bfloat16):
        assert stages(dt, 128, 64, 4, 2, 9) == 5
        assert stages(dt, 128, 64, 4, 6, 9) == 6  # never fewer than asked
        for bm, w in ((64, 8), (128, 4), (128, 8), (32, 4)):
            assert stages(dt, 128, bm, w, 3, 9) == 3, (bm, w)
        for sm in (8, 10, None):
            assert stages(dt, 128, 64, 4, 2, sm) == 2
        for d in (64, 256):
            assert stages(dt, d, 64, 4, 2, 9) == 2
    assert stages(torch.float32, 128, 64, 4, 2, 9) == 2


def test_two_tiles_per_step_only_where_the_grid_with_its_value_blocks_fits_the_sms() -> None:
    """The 64-row tile walks two tiles per step on small grids whose programs times value
    blocks fit the SMs once and whose rows have one split; the
    prefill tile on any grid."""
    from kernels.config import tiles_per_step

    bf16 = torch.bfloat16
    assert [tiles_per_step(bf16, 128, 64, 132, 9, 64, 4, vb) for vb in (1, 2, 4)] == [2, 2, 1]
    assert [tiles_per_step(bf16, 128, 8, 132, 9, 64, 4, vb) for vb in (1, 8)] == [2, 2]
    assert tiles_per_step(bf16, 128, 67, 132, 9, 64, 4, 1) == 1  # not a small grid
    assert tiles_per_step(bf16, 128, 64, 132, 9, 64, 4, 2, several_splits=True) == 1
    assert tiles_per_step(bf16, 128, 64, 132, 9, 128, 8, 2, several_splits=True) == 2
    assert tiles_per_step(bf16, 128, 64, 132, 9, 128, 8, 4) == 2  # the prefill tile


def test_gluon_prefill_rule() -> None:
    """The Gluon prefill kernel for the prefill tile only: 128 rows on 8 warps, BLOCK_N
    64, the nested loop, pages of >= 16 tokens, half precision at head dim 128 on Hopper."""
    from kernels.config import gluon_prefill

    for dt in (torch.float16, torch.bfloat16):
        assert gluon_prefill(dt, 128, 128, 64, 8, 16, True, 9)
        assert gluon_prefill(dt, 128, 128, 64, 8, 1024, True, 9)
        for bm, bn, w, ps, nested in ((64, 64, 4, 16, True), (128, 64, 4, 16, True),
                                      (256, 64, 8, 16, True), (128, 32, 8, 16, True),
                                      (128, 64, 8, 8, True), (128, 64, 8, 1, True),
                                      (128, 64, 8, 16, False)):
            assert not gluon_prefill(dt, 128, bm, bn, w, ps, nested, 9), (bm, bn, w, ps, nested)
        for sm in (8, 10, None):
            assert not gluon_prefill(dt, 128, 128, 64, 8, 16, True, sm)
        for d in (64, 256):
            assert not gluon_prefill(dt, d, 128, 64, 8, 16, True, 9)
    assert not gluon_prefill(torch.float32, 128, 128, 64, 8, 16, True, 9)


def test_gluon_value_blocks_only_where_four_blocks_fit_the_sms(monkeypatch, device) -> None:
    # The 128-key Gluon split kernel's rule: 4 V column blocks where the grid times 4 fits the
    # SMs once, else 1.
    pick = kernels.config.gluon_value_blocks
    assert [pick(n, 132) for n in (1, 8, 32, 33, 34, 64, 256)] == [4, 4, 4, 4, 1, 1, 1]
    assert pick(8, 16) == 1
    import kernels._gluon as gluon_module

    monkeypatch.setattr(kernels.plan, "_sm_major", lambda device: 9)
    monkeypatch.setattr(kernels.plan, "_num_sms", lambda device: 132)
    monkeypatch.setattr(gluon_module, "unavailable_reason", lambda: None)
    _, decode = _hopper_batches(device)  # 4 decodes of 2048 tokens on 2 KV heads
    q, k, v, cu, kv_lens, table = decode
    # By the caller's lengths (host_lens), on the 128-row tile (decode batches take the
    # keys-as-rows tile by default: test_decode_takes_the_keys_as_rows_tile): 1 request of
    # 1024 tokens on 2 KV heads is a grid of 2 programs, 4 blocks; 64 requests of 2048 tokens,
    # 256 programs, 1 block.
    rows128 = Tuning(keys_rows=False)
    one = plan_attention(q[:1], k, v, cu[:2], kv_lens[:1], table[:1], validate=False,
                         plan="split", host_lens=([1], [1024]), tuning=rows128)
    assert one.gluon and one.value_blocks == 4 and one.num_stages == 4  # the ring's slots
    many = plan_attention(q.repeat(16, 1, 1), k, v, torch.arange(65, dtype=torch.int32,
                          device=device), kv_lens.repeat(16), table.repeat(16, 1),
                          validate=False, plan="split", host_lens=([1] * 64, [2048] * 64),
                          tuning=rows128)
    assert many.gluon and many.value_blocks == 1 and many.num_stages == 3
    # The Triton kernels at 128 keys (gluon=False) keep one block: the 64-key rules do not apply.
    assert plan_attention(*decode, validate=False, plan="split",
                          tuning=Tuning(gluon=False)).value_blocks == 1


def test_decode_takes_the_keys_as_rows_tile(monkeypatch, device) -> None:
    # As on an H100 with Triton 3.6's Gluon: a decode batch in the split plan takes the
    # keys-as-rows tile (rows: the GQA group rounded up to 8, 16 or 32; 4 warps; on this small
    # grid 2 V blocks, 4 ring slots and the scores ahead); prompts, chunks of more tokens than
    # its blocks hold, the fused plan, overrides and keys_rows=False keep the 128-row tile;
    # keys_rows=True forces it on prompts and names what is missing elsewhere.
    import kernels._gluon as gluon_module

    monkeypatch.setattr(kernels.plan, "_sm_major", lambda device: 9)
    monkeypatch.setattr(kernels.plan, "_num_sms", lambda device: 132)
    monkeypatch.setattr(gluon_module, "unavailable_reason", lambda: None)
    prompt, decode = _hopper_batches(device)  # GQA group 4
    lp = plan_attention(*decode, validate=False, plan="split")
    assert lp.keys_rows and lp.gluon and (lp.block_m, lp.block_q) == (8, 2)
    # 4 blocks x 2 splits x 2 KV heads: 16 programs, so 2 V blocks (16 * 4 <= 132) and the
    # scores ahead (16 * 8 <= 132).
    assert (lp.num_warps, lp.num_stages, lp.value_blocks, lp.scores_ahead) == (4, 4, 2, True)
    assert lp.num_slots == 4 // 2 + 4  # T // block_q + B
    # The same grid from a 1-block or a no-ahead override: 3 slots, no ahead (it was slower
    # there), or 4 slots in the serial order; forced ahead on one block.
    for kw, want in ((dict(value_blocks=1), (1, 3, False)),
                     (dict(scores_ahead=False), (2, 4, False)),
                     (dict(value_blocks=1, scores_ahead=True), (1, 3, True))):
        got = plan_attention(*decode, validate=False, plan="split",
                             tuning=Tuning(keys_rows=True, **kw))
        assert (got.value_blocks, got.num_stages, got.scores_ahead) == want, kw
    with pytest.raises(ValueError, match="scores_ahead=True needs the keys-as-rows tile"):
        plan_attention(*decode, validate=False, plan="split",
                       tuning=Tuning(keys_rows=False, scores_ahead=True))
    with pytest.raises(ValueError, match=r"Tuning\.scores_ahead: expected a bool"):
        Tuning(scores_ahead=1)  # type: ignore[arg-type]
    # 32 query heads on one KV head: blocks of 32 rows, whose second p buffer and 3 ring slots
    # of one V block exceed shared memory; forced ahead there names the fix (2 blocks fit).
    g32 = (torch.zeros(4, 32, 128, dtype=torch.bfloat16, device=device),
           *((torch.zeros(130, 16, 1, 128, dtype=torch.bfloat16, device=device),) * 2),
           *decode[3:])
    with pytest.raises(ValueError, match=r"tile \(GQA group 32\) needs value_blocks=2 for the "
                                         r"scores ahead at 32 rows \(shared memory\), got "
                                         r"value_blocks=1$"):
        plan_attention(*g32, validate=False, plan="split",
                       tuning=Tuning(keys_rows=True, value_blocks=1, scores_ahead=True))
    both = plan_attention(*g32, validate=False, plan="split",
                          tuning=Tuning(keys_rows=True, value_blocks=2, scores_ahead=True))
    assert (both.block_m, both.value_blocks, both.num_stages, both.scores_ahead) == (
        32, 2, 3, True)
    # A 64-program grid (8 KV heads, as the bench's): 1 V block, serial order.
    for sms, want in ((132, (1, 3, False)), (256, (2, 4, False)), (512, (2, 4, True))):
        monkeypatch.setattr(kernels.plan, "_num_sms", lambda device, n=sms: n)
        wide = plan_attention(decode[0].repeat(1, 4, 1), *((decode[1].repeat(1, 1, 4, 1),) * 2),
                              *decode[3:], validate=False, plan="split")
        assert wide.keys_rows and (wide.value_blocks, wide.num_stages,
                                   wide.scores_ahead) == want, sms
    monkeypatch.setattr(kernels.plan, "_num_sms", lambda device: 132)
    # The kernel's rows are the MMA's N: the group rounded up to 8, 16 or 32, never above.
    assert [gluon_module.kt_rows(g) for g in (1, 3, 4, 8, 9, 16, 17, 32)] == \
        [8, 8, 8, 8, 16, 16, 32, 32]
    with pytest.raises(ValueError, match="1 to 32 query heads, got 33"):
        gluon_module.kt_rows(33)
    # The launcher checks its scheduling settings before importing the kernel module (on CPU
    # too): V blocks of fewer than 64 columns (the p @ v MMA's M), fewer than 2 ring slots, and
    # the scores ahead on one V block at 32 rows (over the shared memory) raise.
    g4 = dict(num_slots=6, num_splits=2, split_tiles=8, block_q=2, direct=False)
    launch = functools.partial(gluon_module.launch_split_kt, *decode, *((None,) * 4), 0.1)
    for kw, match in ((dict(value_blocks=4), "value_blocks 1, 2 or 4 with at least 64"),
                      (dict(stages=1), "at least 2 ring slots, got 1")):
        with pytest.raises(ValueError, match=match):
            launch(**g4, **kw)
    q32, cache32 = (torch.zeros(4, 32, 128, dtype=torch.bfloat16, device=device),
                    torch.zeros(130, 16, 1, 128, dtype=torch.bfloat16, device=device))
    with pytest.raises(ValueError, match="expected value_blocks=2 for the scores ahead at 32 rows"):
        gluon_module.launch_split_kt(q32, cache32, cache32, *decode[3:], *((None,) * 4), 0.1,
                                     num_slots=5, num_splits=2, split_tiles=8, block_q=1,
                                     direct=False, scores_ahead=True)
    auto = plan_attention(*decode, validate=False)
    assert auto.plan == "split" and auto.keys_rows  # 4 requests on 2 KV heads: a small grid
    # 160 decodes of 1024 tokens (320 programs, more than the SMs): rows of one split take the
    # tile in the split plan; on the 128-row tile they are fused.
    cache = decode[1]
    many = (torch.zeros(160, 8, 128, dtype=torch.bfloat16, device=device), cache, cache.clone(),
            torch.arange(161, dtype=torch.int32, device=device),
            torch.full((160,), 1024, dtype=torch.int32, device=device),
            torch.arange(64, dtype=torch.int32, device=device).repeat(160, 1))
    # The tile walks each row's 8 lead splits (kt_walk_lead: 2560 programs would not fit the
    # SMs): one split of 1024 per row, the direct store. The fused plan counts the lead splits.
    for tuning, plan, keys_rows, splits in ((None, "split", True, 1),
                                            (Tuning(keys_rows=False), "fused", False, 8)):
        lp = plan_attention(*many, validate=False, host_lens=([1] * 160, [1024] * 160),
                            tuning=tuning)
        assert (lp.plan, lp.keys_rows, lp.num_splits) == (plan, keys_rows, splits), tuning
        assert lp.walk_lead == keys_rows
    # The same lengths under a table twice as wide: the workspace (sized by the table's bound
    # without checked lengths) has 9 splits per row (8 lead splits and one), past the lead
    # splits, so no keys-as-rows rule: fused.
    wide = (*many[:5], torch.arange(128, dtype=torch.int32, device=device).repeat(160, 1))
    lp = plan_attention(*wide, validate=False, host_lens=([1] * 160, [1024] * 160))
    assert (lp.plan, lp.keys_rows, lp.num_splits) == ("fused", False, 9)
    # Overrides the Gluon tile takes (it stays on) but the keys-as-rows tile does not.
    for tuning in (Tuning(block_m=128), Tuning(num_warps=8), Tuning(num_stages=3),
                   Tuning(value_blocks=2), Tuning(value_blocks=1), Tuning(tiles_per_step=1)):
        lp = plan_attention(*decode, validate=False, plan="split", tuning=tuning)
        assert lp.gluon and not lp.keys_rows, tuning
    # Chunks of 3 tokens (more than the 2 a block of group 4 holds): the 128-row tile.
    chunks = (torch.zeros(12, 8, 128, dtype=torch.bfloat16, device=device), *decode[1:3],
              torch.arange(0, 13, 3, dtype=torch.int32, device=device), *decode[4:])
    assert not plan_attention(*chunks, validate=False, plan="split").keys_rows
    assert plan_attention(*chunks, validate=False, plan="split",
                          tuning=Tuning(keys_rows=True)).keys_rows
    for args, kw in ((prompt, dict(plan="split")), (decode, dict(plan="fused")),
                     (decode, dict(plan="split", tuning=Tuning(keys_rows=False))),
                     (decode, dict(plan="split", tuning=Tuning(gluon=False)))):
        lp = plan_attention(*args, validate=False, **kw)  # type: ignore[arg-type]
        assert not lp.keys_rows, kw
    forced = plan_attention(*prompt, validate=False, plan="split", tuning=Tuning(keys_rows=True))
    assert forced.keys_rows and forced.block_q == 2 and forced.num_slots == 2048 // 2 + 1
    with pytest.raises(ValueError, match="keys_rows=True needs the split plan on the 128-key "
                                         "Gluon kernels or, at head dim 256, its 64-key tile, "
                                         "got plan 'fused'"):
        plan_attention(*decode, validate=False, plan="fused", tuning=Tuning(keys_rows=True))
    with pytest.raises(ValueError, match=r"gluon False \(LaunchPlan.gluon"):
        plan_attention(*decode, validate=False, plan="split",
                       tuning=Tuning(keys_rows=True, gluon=False))
    with pytest.raises(ValueError, match=r"value_blocks 1, 2 or 4 with at least 64 V columns "
                                         r"each \(the p @ v MMA's M\), got 4 at head dim 128$"):
        plan_attention(*decode, validate=False, plan="split",
                       tuning=Tuning(keys_rows=True, value_blocks=4))
    # 2 V column blocks: the grid doubles its KV-head axis, the ring takes 4 slots of 48 KB.
    two = plan_attention(*decode, validate=False, plan="split",
                         tuning=Tuning(keys_rows=True, value_blocks=2))
    assert (two.keys_rows, two.value_blocks, two.num_stages) == (True, 2, 4)
    # auto chose the fused plan (64 balanced decodes, a grid more than half full, by the
    # caller's lengths): the message says so; for a group above 32 it does not (auto's split
    # choice is not the problem).
    q, k, v, _, kv, table = decode
    many = (q.repeat(16, 1, 1), k, v, torch.arange(65, dtype=torch.int32, device=device),
            kv.repeat(16), table.repeat(16, 1))
    with pytest.raises(ValueError, match=r"got plan 'fused'.*\(plan='auto' chose another"):
        plan_attention(*many, validate=False, host_lens=([1] * 64, [2048] * 64),
                       tuning=Tuning(keys_rows=True))
    wide_group = (torch.zeros(4, 128, 128, dtype=torch.bfloat16, device=device), *decode[1:])
    assert plan_attention(*wide_group, validate=False).plan == "split"
    with pytest.raises(ValueError, match=r"at most 32 query heads, got 64$") as info:
        plan_attention(*wide_group, validate=False, tuning=Tuning(keys_rows=True))
    assert "chose another plan" not in str(info.value)
    # Off Hopper (or without Gluon) there is no such tile: the default never takes it.
    monkeypatch.setattr(kernels.plan, "_sm_major", lambda device: 8)
    assert not plan_attention(*decode, validate=False, plan="split").keys_rows


def test_tuning_keys_rows_is_a_bool_or_none() -> None:
    for bad in (1, "yes"):
        with pytest.raises(ValueError, match=r"Tuning\.keys_rows: expected a bool or None"):
            Tuning(keys_rows=bad)  # type: ignore[arg-type]
    assert Tuning(keys_rows=True).keys_rows is True and Tuning().keys_rows is None


def _hopper_batches(device) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
    """(a 2048-token prompt, 4 decodes over 2048 tokens): bf16, 8 query heads on 2 KV heads,
    head dim 128, pages of 16 tokens; the plan-rule tests' shapes (nothing is launched)."""
    bf16, i32 = torch.bfloat16, torch.int32
    cache = torch.zeros(130, 16, 2, 128, dtype=bf16, device=device)
    prompt = (torch.zeros(2048, 8, 128, dtype=bf16, device=device), cache, cache.clone(),
              torch.tensor([0, 2048], dtype=i32, device=device),
              torch.tensor([2048], dtype=i32, device=device),
              torch.arange(128, dtype=i32, device=device)[None])
    decode = (torch.zeros(4, 8, 128, dtype=bf16, device=device), cache, cache.clone(),
              torch.arange(5, dtype=i32, device=device),
              torch.full((4,), 2048, dtype=i32, device=device),
              torch.arange(128, dtype=i32, device=device).repeat(4, 1))
    return prompt, decode


def _head_dim(batch: tuple[torch.Tensor, ...], d: int) -> tuple[torch.Tensor, ...]:
    """``batch`` (of :func:`_hopper_batches`) at head dim ``d``."""
    q, k, v, *rest = batch
    return (q[..., :d].contiguous(), k[..., :d].contiguous(), v[..., :d].contiguous(), *rest)


def test_head_dim_64_runs_gluon_only_when_asked(monkeypatch, device) -> None:
    # As on an H100 with Triton 3.6's Gluon: at head dim 64 (128-key tiles, like head dim 128)
    # the rules keep the Triton kernels; Tuning(gluon=True) or keys_rows=True (what a measured
    # table entry holds) runs the Gluon tile in its shape (128 rows on 8 warps, the ring's
    # slots), at most 2 V blocks (32 columns each) on the 128-row tile and one on the
    # keys-as-rows tile (its p @ v needs 64 V columns on the MMA's M); head dim 256 (64-key
    # tiles) and float32 cannot, and say why.
    import kernels._gluon as gluon_module

    monkeypatch.setattr(kernels.plan, "_sm_major", lambda device: 9)
    monkeypatch.setattr(kernels.plan, "_num_sms", lambda device: 132)
    monkeypatch.setattr(gluon_module, "unavailable_reason", lambda: None)
    prompt, decode = (_head_dim(b, 64) for b in _hopper_batches(device))
    for batch, plan in ((prompt, "fused"), (decode, "split"), (prompt, "auto"), (decode, "auto")):
        lp = plan_attention(*batch, validate=False, plan=plan)
        assert not lp.gluon and not lp.keys_rows and lp.block_n == 128, (plan, lp)
    fused = plan_attention(*prompt, validate=False, plan="fused", tuning=Tuning(gluon=True))
    assert fused.gluon and (fused.block_m, fused.num_warps, fused.num_stages) == (128, 8, 3)
    assert fused.nested_loop and fused.block_n == 128
    q, k, v, cu, kv_lens, table = decode
    split = plan_attention(q[:1], k, v, cu[:2], kv_lens[:1], table[:1], validate=False,
                           plan="split", host_lens=([1], [1024]),
                           tuning=Tuning(gluon=True, keys_rows=False))
    assert split.gluon and not split.keys_rows and split.value_blocks == 2  # 32 columns each
    kt = plan_attention(*decode, validate=False, plan="split", tuning=Tuning(keys_rows=True))
    assert kt.gluon and kt.keys_rows and (kt.block_m, kt.num_warps) == (8, 4)
    assert kt.value_blocks == 1
    # V blocks of 16 columns: not on the Gluon tile (its bit tests cover 32 to 128).
    with pytest.raises(ValueError, match=r"V column blocks of at least 32 columns on the 128-key "
                                         r"Gluon tile .* got value_blocks=4 at head_dim 64"):
        plan_attention(*prompt, validate=False, plan="split",
                       tuning=Tuning(gluon=True, value_blocks=4))
    assert "scores_ahead=False" in gluon_module.kt_schedule_misfit(32, 64, 1, 3, True)
    # gluon=True on a decode batch takes the keys-as-rows tile by default, as at head dim 128.
    assert plan_attention(*decode, validate=False, plan="split",
                          tuning=Tuning(gluon=True)).keys_rows
    with pytest.raises(ValueError, match=r"keys-as-rows tile .* needs value_blocks 1, 2 or 4 "
                                         r"with at least 64 V columns each"):
        plan_attention(*decode, validate=False, plan="split",
                       tuning=Tuning(keys_rows=True, value_blocks=2))
    # gluon=False wins over keys_rows=True: the Triton kernels, and keys_rows names why.
    with pytest.raises(ValueError, match=r"keys_rows=True needs the split plan on the 128-key "
                                         r"Gluon kernels or, at head dim 256, its 64-key tile, "
                                         r"got plan 'split', gluon False"):
        plan_attention(*decode, validate=False, plan="split",
                       tuning=Tuning(keys_rows=True, gluon=False))
    for d, dtype in ((256, torch.bfloat16), (64, torch.float32)):
        q, k, v, *rest = prompt  # head dim 64
        q, k, v = (torch.cat([x] * (d // 64), -1).to(dtype) for x in (q, k, v))
        with pytest.raises(ValueError, match=r"tuning: gluon=True needs"):
            plan_attention(q, k, v, *rest, validate=False, plan="fused",
                           tuning=Tuning(gluon=True))
    # Pages under 16 tokens: TMA reads one box per page; the message names the shapes.
    q, k, v, cu, kv_lens, _ = prompt
    small = (q, k.view(-1, 8, 2, 64), v.view(-1, 8, 2, 64), cu, kv_lens,
             torch.arange(256, dtype=torch.int32, device=device)[None])
    with pytest.raises(ValueError, match=r"head_dim 64 or 128, 128-key tiles, page_size >= 16, "
                                         r"compute capability 9\), got torch\.bfloat16, "
                                         r"head_dim 64, block_n 128, page_size 8"):
        plan_attention(*small, validate=False, plan="fused", tuning=Tuning(gluon=True))


def test_head_dim_256_decode_takes_the_64_key_keys_as_rows_tile(monkeypatch, device) -> None:
    # As on an H100 with Triton 3.6's Gluon: head dim 256's contract is 64-key tiles, which the
    # 128-key Gluon kernels do not take; the keys-as-rows tile runs them. Decode batches take
    # it in the split plan by default (as at head dim 128), keys_rows=False keeps the Triton
    # kernels, and so do prompts and groups above 16 unless keys_rows=True: blocks of the group
    # rounded up to 8 rows on 4 warps, one tile per step, 1, 2 or 4 V blocks of 64+ columns, a
    # ring the shared memory holds. Where it cannot run, the message names each reason.
    import kernels._gluon as gluon_module

    monkeypatch.setattr(kernels.plan, "_sm_major", lambda device: 9)
    monkeypatch.setattr(kernels.plan, "_num_sms", lambda device: 132)
    monkeypatch.setattr(gluon_module, "unavailable_reason", lambda: None)
    decode = _hopper_batches(device)[1]

    def at_256(batch: tuple[torch.Tensor, ...], heads: int = 8) -> tuple[torch.Tensor, ...]:
        q, k, v, *rest = batch
        return (torch.cat([q[:, :1]] * heads, 1).repeat(1, 1, 2), k.repeat(1, 1, 1, 2),
                v.repeat(1, 1, 1, 2), *rest)

    decode = at_256(decode)  # 4 decodes, 8 query heads on 2 KV heads, head dim 256
    for plan in ("split", "auto"):
        lp = plan_attention(*decode, validate=False, plan=plan)
        assert lp.plan == "split" and lp.keys_rows and lp.gluon and lp.block_n == 64, (plan, lp)
        lp = plan_attention(*decode, validate=False, plan=plan, tuning=Tuning(keys_rows=False))
        assert not lp.keys_rows and not lp.gluon and lp.block_n == 64, (plan, lp)
    assert not plan_attention(*decode, validate=False, plan="fused").keys_rows
    prompt = at_256(_hopper_batches(device)[0])
    assert not plan_attention(*prompt, validate=False, plan="split").keys_rows
    assert plan_attention(*prompt, validate=False, plan="split",
                          tuning=Tuning(keys_rows=True)).keys_rows
    kt = plan_attention(*decode, validate=False, plan="split", tuning=Tuning(keys_rows=True))
    assert kt.keys_rows and kt.gluon and kt.block_n == 64 and kt.split_tiles == 1024 // 64
    assert (kt.block_m, kt.block_q, kt.num_warps, kt.tiles_per_step) == (8, 2, 4, 1)
    assert kt.num_slots == 4 // 2 + 4
    # 16 programs: 2 V blocks by kt_value_blocks' rule, 4 ring slots; each block count asked.
    assert (kt.value_blocks, kt.num_stages) == (2, 4)
    for blocks, stages in ((1, 3), (2, 4), (4, 4)):
        lp = plan_attention(*decode, validate=False, plan="split",
                            tuning=Tuning(keys_rows=True, value_blocks=blocks))
        assert (lp.keys_rows, lp.value_blocks, lp.num_stages) == (True, blocks, stages)
    with pytest.raises(ValueError, match=r"value_blocks 1, 2 or 4, got \['value_blocks=8'\]"):
        plan_attention(*decode, validate=False, plan="split",
                       tuning=Tuning(keys_rows=True, value_blocks=8))
    # 32 query heads per KV head: blocks of 32 rows; on one V block the store's scratch leaves
    # room for 2 ring slots (kernel_stats: 3 need 250 KB).
    wide = at_256(_hopper_batches(device)[1], heads=64)
    assert not plan_attention(*wide, validate=False, plan="split").keys_rows
    lp = plan_attention(*wide, validate=False, plan="split",
                        tuning=Tuning(keys_rows=True, value_blocks=1))
    assert (lp.block_m, lp.block_q, lp.num_stages) == (32, 1, 2)
    assert gluon_module.kt_ring_slots(1, 32, 256) == 2 and gluon_module.kt_ring_slots(1, 32) == 3
    # The launcher refuses a tile width the head dim's contract does not have.
    with pytest.raises(ValueError, match=r"expected \(head dim, block_n\) in .*, got \(256, 128\)"):
        gluon_module.launch_split_kt(*decode, *((None,) * 4), 0.1, num_slots=6, num_splits=1,
                                     split_tiles=16, block_q=2, direct=True, block_n=128)
    # Where it cannot run, keys_rows=True names why: the fused plan; a feature; pages of 8
    # tokens; another GPU; no Gluon.
    with pytest.raises(ValueError, match=r"at head dim 256, its 64-key tile, got plan 'fused'"):
        plan_attention(*decode, validate=False, plan="fused", tuning=Tuning(keys_rows=True))
    with pytest.raises(ValueError, match=r"at 64-key tiles it needs a call without window, "
                                         r"sinks, soft-cap or FP8 cache"):
        plan_attention(*decode, validate=False, plan="split", window_left=100,
                       tuning=Tuning(keys_rows=True))
    q, k, v, cu, kv_lens, _ = decode
    small = (q, k.view(-1, 8, 2, 256), v.view(-1, 8, 2, 256), cu, kv_lens,
             torch.arange(256, dtype=torch.int32, device=device).repeat(4, 1))
    with pytest.raises(ValueError, match=r"page_size >= 16, compute capability 9\), got "
                                         r"torch\.bfloat16, \(256, 64\), page_size 8"):
        plan_attention(*small, validate=False, plan="split", tuning=Tuning(keys_rows=True))
    monkeypatch.setattr(gluon_module, "unavailable_reason", lambda: "Triton 3.6.x, got 9.9")
    with pytest.raises(ValueError, match=r"at 64-key tiles it needs Triton 3\.6\.x, got 9\.9$"):
        plan_attention(*decode, validate=False, plan="split", tuning=Tuning(keys_rows=True))
    assert not plan_attention(*decode, validate=False, plan="split").keys_rows
    monkeypatch.setattr(gluon_module, "unavailable_reason", lambda: None)
    # gluon=False means the Triton kernels (keys_rows=True with it names why not); gluon=True
    # takes the tile (the only Gluon kernel here) and names why where it cannot.
    lp = plan_attention(*decode, validate=False, plan="split", tuning=Tuning(gluon=False))
    assert not lp.keys_rows and not lp.gluon
    with pytest.raises(ValueError, match=r"at 64-key tiles it needs the Gluon kernels, got "
                                         r"gluon=False"):
        plan_attention(*decode, validate=False, plan="split",
                       tuning=Tuning(keys_rows=True, gluon=False))
    lp = plan_attention(*decode, validate=False, plan="split", tuning=Tuning(gluon=True))
    assert lp.keys_rows and lp.gluon
    with pytest.raises(ValueError, match=r"gluon=True needs the keys-as-rows tile at 64-key "
                                         r"tiles, which this call does not take: \(for the "
                                         r"default\) a GQA group of at most 16"):
        plan_attention(*prompt, validate=False, plan="split", tuning=Tuning(gluon=True))
    with pytest.raises(ValueError, match=r"gluon=True needs the 128-key contract .* at head_dim "
                                         r"256 the keys-as-rows tile\) or the fused plan"):
        plan_attention(*wide, validate=False, plan="split",
                       tuning=Tuning(gluon=True, keys_rows=False))
    # More bad settings: float32 (16-key tiles), caches TMA cannot read, a group above 32, the
    # scores ahead on one V block at 32 rows, a ring larger than the shared memory holds.
    q, k, v, *rest = decode
    with pytest.raises(ValueError, match=r"got torch\.float32, \(256, 16\)"):
        plan_attention(q.float(), k.float(), v.float(), *rest, validate=False, plan="split",
                       tuning=Tuning(keys_rows=True))
    strided = torch.cat([k, k])[::2]  # every other page: not contiguous
    with pytest.raises(ValueError, match=r"at 64-key tiles it needs k_cache contiguous"):
        plan_attention(q, strided, v, *rest, validate=False, plan="split",
                       tuning=Tuning(keys_rows=True))
    wider = (torch.cat([q] * 16, 1), k[:, :, :1].contiguous(), v[:, :, :1].contiguous(), *rest)
    with pytest.raises(ValueError, match=r"a GQA group of at most 32 query heads, got 128"):
        plan_attention(*wider, validate=False, plan="split", tuning=Tuning(keys_rows=True))
    with pytest.raises(ValueError, match=r"value_blocks=2 for the scores ahead at 32 rows"):
        plan_attention(*wide, validate=False, plan="split",
                       tuning=Tuning(keys_rows=True, value_blocks=1, scores_ahead=True))
    assert "at most 2 ring slots at head dim 256" in gluon_module.kt_schedule_misfit(
        32, 256, 1, 3, False)
    assert gluon_module.kt_schedule_misfit(32, 128, 1, 3, False) is None
    # plan="auto": 64 balanced decodes of 2048 keys on a GPU they fill (32 SMs here) split onto
    # the tile, where without it they fuse (the fused plan's Triton tile pads each token's 4
    # heads to 64 rows: 1.8x slower at 64 decodes of 8k, reports/h200/tune/tune-d256.md).
    monkeypatch.setattr(kernels.plan, "_num_sms", lambda device: 32)
    many = (q.repeat(16, 1, 1), k, v, torch.arange(65, dtype=torch.int32, device=device),
            rest[1].repeat(16), rest[2].repeat(16, 1))
    lp = plan_attention(*many, validate=False, host_lens=([1] * 64, [2048] * 64))
    assert lp.plan == "split" and lp.keys_rows
    assert plan_attention(*many, validate=False, host_lens=([1] * 64, [2048] * 64),
                          tuning=Tuning(keys_rows=False)).plan == "fused"
    monkeypatch.setattr(kernels.plan, "_num_sms", lambda device: 132)
    monkeypatch.setattr(kernels.plan, "_sm_major", lambda device: 8)
    with pytest.raises(ValueError, match=r"compute capability major 8"):
        plan_attention(*decode, validate=False, plan="split", tuning=Tuning(keys_rows=True))
    assert not plan_attention(*decode, validate=False, plan="split").keys_rows


def test_gluon_is_planned_only_where_it_can_run(monkeypatch, device) -> None:
    # As on an H100 (sm 9): a prompt's fused plan asks for the Gluon kernel, which also needs
    # dense caches and Triton 3.6's Gluon (kernels._gluon.available). Without them, or with
    # Tuning(gluon=False), the Triton kernel; Tuning(gluon=True) then names what is missing.
    import kernels._gluon as gluon_module

    monkeypatch.setattr(kernels.plan, "_sm_major", lambda device: 9)
    bf16 = torch.bfloat16
    args, decode = _hopper_batches(device)
    monkeypatch.setattr(gluon_module, "unavailable_reason", lambda: None)
    lp = plan_attention(*args, validate=False, plan="fused", tuning=N64)
    assert lp.gluon and (lp.block_m, lp.num_warps, lp.nested_loop) == (128, 8, True)
    assert lp.num_stages == 4  # the 64-key tile's TMA ring (kernels._gluon.RING_SLOTS)
    assert not plan_attention(*args, validate=False, plan="fused",
                              tuning=Tuning(block_n=64, gluon=False)).gluon
    assert not plan_attention(*args, validate=False, plan="split", tuning=N64).gluon
    assert not plan_attention(*args, validate=False, plan="fused",
                              tuning=Tuning(block_n=64, nested_loop=False)).gluon
    with pytest.raises(ValueError,
                       match=r"gluon=True needs the 128-key contract for the split plan .* or "
                             r"the fused plan, got plan 'split' at block_n 64, torch\.bfloat16, "
                             r"head_dim 128, compute capability major 9$"):
        plan_attention(*args, validate=False, plan="split",
                       tuning=Tuning(block_n=64, gluon=True))
    # auto on a decode batch (64 rows: the split plan): the message says auto chose it.
    with pytest.raises(ValueError, match=r"got plan 'split' \(plan='auto' chose it for this "
                                         r"batch; pass plan='fused'\)"):
        plan_attention(*decode, validate=False, tuning=Tuning(block_n=64, gluon=True))
    with pytest.raises(ValueError, match=r"gluon=True needs the prefill tile on Hopper .* "
                                         r"block_m 64 on 4 warps"):
        plan_attention(*args, validate=False, plan="fused", tuning=Tuning(block_n=64, gluon=True,
                                                                          block_m=64))
    # A cache that is a strided view (K and V of one tensor) cannot be read by TMA as 2-D rows.
    kv = torch.zeros(130, 2, 16, 2, 128, dtype=bf16, device=device)
    strided = (args[0], kv[:, 0], kv[:, 1], *args[3:])
    assert not plan_attention(*strided, validate=False, plan="fused", tuning=N64).gluon
    with pytest.raises(ValueError, match=r"k_cache contiguous, got strides \(8192, 256, 128, 1\)"):
        plan_attention(*strided, validate=False, plan="fused",
                       tuning=Tuning(block_n=64, gluon=True))
    # A cache that does not start 16-byte aligned (a view one element in): TMA cannot read it.
    flat = torch.zeros(130 * 16 * 2 * 128 + 1, dtype=bf16, device=device)
    shifted = flat[1:].view(130, 16, 2, 128)
    misaligned = (args[0], shifted, shifted, *args[3:])
    assert not plan_attention(*misaligned, validate=False, plan="fused", tuning=N64).gluon
    with pytest.raises(ValueError, match="k_cache 16-byte aligned, got data_ptr % 16 == 2"):
        plan_attention(*misaligned, validate=False, plan="fused",
                       tuning=Tuning(block_n=64, gluon=True))
    monkeypatch.setattr(gluon_module, "unavailable_reason",
                        lambda: "Triton 3.6.x with Gluon, got Triton 3.9.0")
    assert not plan_attention(*args, validate=False, plan="fused", tuning=N64).gluon
    with pytest.raises(ValueError, match=r"Triton 3\.6\.x with Gluon, got Triton 3\.9\.0"):
        plan_attention(*args, validate=False, plan="fused", tuning=Tuning(block_n=64, gluon=True))
    # Every reason at once: the shape rule and the cache.
    with pytest.raises(ValueError, match=r"block_m 64 on 4 warps.*; k_cache 16-byte aligned"):
        plan_attention(*misaligned, validate=False, plan="fused",
                       tuning=Tuning(block_n=64, gluon=True, block_m=64))
    # The interpreter (and every GPU other than Hopper) never plans it.
    monkeypatch.setattr(kernels.plan, "_sm_major", lambda device: None)
    assert not plan_attention(*args, validate=False, plan="fused", tuning=N64).gluon


def test_the_128_key_contract_plans_gluon_in_both_plans_else_triton_at_128_keys(
        monkeypatch, device) -> None:
    # As on an H100 (sm 9) with Gluon, half precision at head dim 128: 128-key tiles. Both
    # plans run the Gluon tile (128 rows on 8 warps, one inner loop per split); a call it cannot
    # run (pages of 8 tokens, gluon=False) runs the Triton kernels at 128 keys with tile_config's
    # fixed launch (the 64-key rules do not apply). Without Gluon: the 64-key contract.
    # Tuning(gluon=True) names what is missing; other dtypes and head dims keep their tiles.
    import kernels._gluon as gluon_module

    monkeypatch.setattr(kernels.plan, "_sm_major", lambda device: 9)
    monkeypatch.setattr(kernels.plan, "_num_sms", lambda device: 132)
    bf16, i32 = torch.bfloat16, torch.int32
    prompt, decode = _hopper_batches(device)
    monkeypatch.setattr(gluon_module, "unavailable_reason", lambda: None)
    for args in (prompt, decode):
        for plan in ("auto", "fused", "split"):
            lp = plan_attention(*args, validate=False, plan=plan)
            assert lp.gluon and lp.block_n == 128, plan
            # The decode batch's split plan takes the keys-as-rows tile (8 rows on 4 warps, 2 V
            # blocks on its 16 walking programs: test_decode_takes_the_keys_as_rows_tile); on
            # the 128-row tile, one program per split (8 lead splits and one of 1024 per row:
            # 72 programs) takes one V column block, as one split size takes 4 on its 16.
            if lp.plan == "split" and args is decode:
                assert lp.keys_rows and (lp.block_m, lp.num_warps, lp.value_blocks) == (8, 4, 2)
                one = plan_attention(*args, validate=False, plan=plan, lead_split_size=1024,
                                     tuning=Tuning(keys_rows=False))
                assert (one.num_splits, one.value_blocks) == (2, 4)
                lp = plan_attention(*args, validate=False, plan=plan,
                                    tuning=Tuning(keys_rows=False))
                assert lp.num_splits == 9
            blocks = 1
            assert not lp.keys_rows
            assert (lp.block_m, lp.num_warps, lp.value_blocks, lp.tiles_per_step) == (
                128, 8, blocks, 1)
            assert lp.split_tiles == 1024 // 128
            if lp.plan == "fused":
                assert lp.nested_loop
    with pytest.raises(ValueError, match="split_size: expected a positive multiple of "
                                         "BLOCK_N=128"):
        plan_attention(*decode, validate=False, split_size=64)
    # Overrides the Gluon tile cannot take: the Triton kernels, or a message naming them.
    lp = plan_attention(*decode, validate=False, plan="split", tuning=Tuning(value_blocks=8))
    assert not lp.gluon and lp.value_blocks == 8
    for blocks in (1, 2):
        lp = plan_attention(*decode, validate=False, plan="split",
                            tuning=Tuning(value_blocks=blocks))
        assert lp.gluon and lp.value_blocks == blocks
    with pytest.raises(ValueError, match=r"got block_m=64, num_warps=4"):
        plan_attention(*prompt, validate=False, tuning=Tuning(gluon=True, block_m=64,
                                                              num_warps=4))
    # A GQA group above 128 (256 query heads on one KV head: 256-row blocks): the Triton kernels.
    wide_group = (torch.zeros(4, 256, 128, dtype=bf16, device=device),
                  torch.zeros(130, 16, 1, 128, dtype=bf16, device=device),
                  torch.zeros(130, 16, 1, 128, dtype=bf16, device=device), *decode[3:])
    lp = plan_attention(*wide_group, validate=False)
    assert not lp.gluon and lp.block_n == 128
    with pytest.raises(ValueError, match=r"at most 128 query heads per KV head .* got 256"):
        plan_attention(*wide_group, validate=False, tuning=Tuning(gluon=True))
    assert plan_attention(*wide_group[:1], torch.zeros(130, 16, 2, 128, dtype=bf16,
                                                       device=device),
                          torch.zeros(130, 16, 2, 128, dtype=bf16, device=device),
                          *decode[3:], validate=False).gluon  # a group of 128
    # Tuning that names the Gluon tile's own settings keeps it, and the plan reports them.
    lp = plan_attention(*prompt, validate=False, tuning=Tuning(block_m=128, num_warps=8,
                                                               num_stages=3))
    assert lp.gluon and (lp.block_m, lp.num_warps, lp.num_stages) == (128, 8, 3)
    assert not plan_attention(*prompt, validate=False, tuning=Tuning(num_stages=5)).gluon
    # Pages of 8 tokens (no TMA box per page): the Triton kernels.
    small = torch.zeros(260, 8, 2, 128, dtype=bf16, device=device)
    paged8 = (prompt[0], small, small.clone(), *prompt[3:5],
              torch.arange(256, dtype=i32, device=device)[None])
    assert not plan_attention(*paged8, validate=False).gluon
    with pytest.raises(ValueError, match="page_size 8, compute capability major 9"):
        plan_attention(*paged8, validate=False, tuning=Tuning(gluon=True))
    # Tuning(gluon=False) keeps the contract: the Triton kernels at 128 keys, with
    # tile_config's fixed launch, in both plans.
    for args in (prompt, decode):
        for plan in ("fused", "split"):
            lp = plan_attention(*args, validate=False, plan=plan, tuning=Tuning(gluon=False))
            assert not lp.gluon and lp.block_n == 128
            assert (lp.block_m, lp.num_warps, lp.num_stages) == (64, 4, 2), plan
            assert (lp.value_blocks, lp.tiles_per_step, lp.nested_loop) == (1, 1, False)
    # Without Gluon (another Triton release): the 64-key contract and its per-batch rules.
    monkeypatch.setattr(gluon_module, "unavailable_reason",
                        lambda: "Triton 3.6.x with Gluon, got Triton 3.9.0")
    lp = plan_attention(*prompt, validate=False, plan="fused")
    assert (lp.block_n, lp.block_m, lp.num_warps, lp.nested_loop, lp.gluon) == (64, 128, 8,
                                                                                 True, False)
    assert plan_attention(*decode, validate=False, plan="split").block_n == 64
    with pytest.raises(ValueError, match=r"Triton 3\.6\.x with Gluon, got Triton 3\.9\.0"):
        plan_attention(*decode, validate=False, plan="fused", tuning=Tuning(gluon=True))
    # float32, other head dims, other GPUs, no Gluon: their own tiles.
    assert (tile_config(torch.float32, 128, 9, gluon=True).block_n
            == tile_config(torch.float32, 128).block_n)
    assert tile_config(bf16, 64, 9, gluon=True) == tile_config(bf16, 64)
    for sm in (None, 8, 10):
        assert tile_config(bf16, 128, sm, gluon=True).block_n == 64
    assert tile_config(bf16, 128, 9).block_n == 64
    assert tile_config(bf16, 128, 9, gluon=True).block_n == 128


def test_gluon_needs_triton_3_6(monkeypatch) -> None:
    import triton

    import kernels._gluon as gluon_module

    gluon_module.unavailable_reason.cache_clear()
    try:
        monkeypatch.setattr(triton, "__version__", "3.9.0")
        assert not gluon_module.available()
        assert gluon_module.unavailable_reason() == "Triton 3.6.x with Gluon, got Triton 3.9.0"
    finally:
        gluon_module.unavailable_reason.cache_clear()


def test_tuning_gluon_is_a_bool_or_none() -> None:
    for bad in (1, "true", 0.0):
        with pytest.raises(ValueError, match=r"Tuning\.gluon: expected a bool or None"):
            Tuning(gluon=bad)  # type: ignore[arg-type]
    assert Tuning(gluon=False).gluon is False


def test_decode_batches_get_five_stages_on_either_plan(monkeypatch, device) -> None:
    # As on an H100 (sm 9): 64 decodes take 5 stages on the fused plan and on the split plan
    # (CHANGELOG.md); an explicit num_stages wins, and a Tuning that names block_m keeps
    # tile_config's stages.

    monkeypatch.setattr(kernels.plan, "_sm_major", lambda device: 9)
    bf16, i32 = torch.bfloat16, torch.int32
    args = tuple(t.to(device) for t in (
        torch.zeros(64, 8, 128, dtype=bf16), torch.zeros(130, 16, 2, 128, dtype=bf16),
        torch.zeros(130, 16, 2, 128, dtype=bf16), torch.arange(65, dtype=i32),
        torch.full((64,), 512, dtype=i32), torch.arange(128, dtype=i32).repeat(64, 1)))
    cfg = tile_config(bf16, 128)
    assert cfg.num_stages == 2
    for plan in ("fused", "split"):
        lp = plan_attention(*args, validate=False, plan=plan, tuning=N64)
        assert (lp.block_m, lp.num_warps, lp.num_stages) == (64, 4, 5), plan
        lp = plan_attention(*args, validate=False, plan=plan,
                            tuning=Tuning(block_n=64, num_stages=2))
        assert lp.num_stages == 2, plan
        lp = plan_attention(*args, validate=False, plan=plan,
                            tuning=Tuning(block_n=64, block_m=64))
        assert lp.num_stages == cfg.num_stages, plan
        lp = plan_attention(*args, validate=False, plan=plan,
                            tuning=Tuning(block_n=64, num_warps=8))
        assert (lp.num_warps, lp.num_stages) == (8, cfg.num_stages), plan
    # auto: 160 decodes of one split each on 2 KV heads (320 programs, more than the SMs):
    # the fused plan, 5 stages; the same batch forced to the split plan too.
    many = tuple(t.to(device) for t in (
        torch.zeros(160, 8, 128, dtype=bf16), torch.zeros(130, 16, 2, 128, dtype=bf16),
        torch.zeros(130, 16, 2, 128, dtype=bf16), torch.arange(161, dtype=i32),
        torch.full((160,), 512, dtype=i32), torch.arange(128, dtype=i32).repeat(160, 1)))
    lens = ([1] * 160, [512] * 160)
    lp = plan_attention(*many, validate=False, host_lens=lens, tuning=N64)
    assert (lp.plan, lp.num_stages) == ("fused", 5)
    assert plan_attention(*many, validate=False, host_lens=lens, plan="split",
                          tuning=N64).num_stages == 5
    monkeypatch.setattr(kernels.plan, "_sm_major", lambda device: None)
    assert plan_attention(*args, validate=False, plan="fused",
                          tuning=N64).num_stages == cfg.num_stages


def test_auto_plan_without_statistics_splits_decode_batches() -> None:
    from kernels.config import choose_plan

    # 64 decodes (544 programs >= 132 SMs) under a 32k table bound: split, since lengths may
    # differ; a prefill batch of the same size stays fused; statistics override both.
    assert choose_plan(544, 132, 32768, 1024, decode=True) == "split"
    assert choose_plan(544, 132, 32768, 1024, decode=False) == "fused"
    assert choose_plan(544, 132, 32768, 1024, longest_tiles=128, total_tiles=544 * 128,
                       decode=True) == "fused"
    assert choose_plan(544, 132, 1024, 1024, decode=True) == "fused"  # one split: nothing to split
    # A grid smaller than the GPU splits even with one split (the split kernel's loop is faster).
    assert choose_plan(8, 132, 1024, 1024, decode=True) == "split"
    assert choose_plan(64, 132, 512, 1024, decode=False) == "split"


def test_the_gluon_kernels_fuse_balanced_under_filled_grids() -> None:
    from kernels.config import choose_plan

    # 8 decodes of 8k on 8 KV heads (64 programs, 64 tiles each): fused on the Gluon kernels,
    # split on Triton's; 4 decodes (32 programs, a quarter of the SMs) split on both.
    kw = dict(longest_tiles=64, decode=True)
    assert choose_plan(64, 132, 8192, 1024, total_tiles=64 * 64, gluon=True, **kw) == "fused"
    assert choose_plan(64, 132, 8192, 1024, total_tiles=64 * 64, **kw) == "split"
    assert choose_plan(32, 132, 8192, 1024, total_tiles=32 * 64, gluon=True, **kw) == "split"
    # Unbalanced (the longest program walks more than twice the average) or no statistics: the
    # split plan.
    assert choose_plan(64, 132, 8192, 1024, total_tiles=64 * 31, gluon=True, **kw) == "split"
    assert choose_plan(64, 132, 8192, 1024, total_tiles=64 * 32, gluon=True, **kw) == "fused"
    assert choose_plan(64, 132, 8192, 1024, gluon=True, decode=True) == "split"
    # A full grid: the rules of the Triton kernels.
    assert choose_plan(544, 132, 32768, 1024, longest_tiles=128, total_tiles=544 * 128,
                       decode=True, gluon=True) == "fused"
    assert choose_plan(544, 132, 32768, 1024, decode=True, gluon=True) == "split"


def test_the_keys_as_rows_tile_takes_one_split_rows_and_mixed_lengths() -> None:
    from kernels.config import choose_plan

    kw = dict(decode=True, gluon=True)
    # Rows that fit one split (the tile's direct store): split on the tile whatever the grid,
    # fused on the 128-row tile once the grid is a quarter of the SMs or more.
    for programs in (64, 512, 2048):
        stats = dict(longest_tiles=8, total_tiles=programs * 8)
        assert choose_plan(programs, 132, 1024, 1024, keys_rows=True, **stats, **kw) == "split"
        assert choose_plan(programs, 132, 1024, 1024, **stats, **kw) == "fused"
    # Two splits, equal lengths: on the tile a grid of at most half the SMs splits (8 decodes
    # of 8k-32k keys: the split plan 13-23% faster on an H200, reports/h200/), a fuller one
    # fuses (16 decodes of 8k: fused 4% faster there).
    assert choose_plan(64, 132, 1025, 1024, keys_rows=True, longest_tiles=9, total_tiles=64 * 9,
                       **kw) == "split"
    assert choose_plan(128, 132, 8192, 1024, keys_rows=True, longest_tiles=64,
                       total_tiles=128 * 64, **kw) == "fused"
    # An under-filled grid more than half full fuses on the tile only up to 1.5x the average
    # walk, else 2x; at half or less it splits on the tile.
    for total, with_tile, without in ((96 * 43, "fused", "fused"), (96 * 42, "split", "fused"),
                                      (96 * 31, "split", "split")):
        got = [choose_plan(96, 132, 8192, 1024, longest_tiles=64, total_tiles=total,
                           keys_rows=kt, **kw) for kt in (True, False)]
        assert got == [with_tile, without], total
    assert choose_plan(64, 132, 8192, 1024, longest_tiles=64, total_tiles=64 * 64,
                       keys_rows=True, **kw) == "split"
    # A workspace of several splits per row (the bound above the split) keeps the other rules.
    for stats in ({}, dict(longest_tiles=8, total_tiles=544 * 8)):
        assert (choose_plan(544, 132, 1024, 1024, keys_rows=True, num_splits=4, **stats, **kw)
                == choose_plan(544, 132, 1024, 1024, num_splits=4, **stats, **kw) == "fused")
    assert choose_plan(544, 132, 32768, 1024, keys_rows=True, decode=False, gluon=True) == \
        "fused"
    assert choose_plan(544, 132, 1024, 1024, keys_rows=True, num_splits=1, **kw) == "split"
    assert choose_plan(544, 132, 2048, 1024, keys_rows=True, longest_tiles=16,
                       total_tiles=544 * 16, **kw) == "fused"


def test_host_lens_steer_the_plan_without_a_sync(dtype: torch.dtype, make_batch, args_of,
                                                 assert_same_bits) -> None:
    shape = [(1, 90), (1, 20), (1, 5)]
    batch = make_batch(dtype, shape, PageLayout(16, "shuffled"))
    split = tile_config(dtype, 64).block_n
    q_lens, kv_lens = [q for q, _ in shape], [kv for _, kv in shape]
    lp = plan_attention(*args_of(batch), split_size=split, validate=False,
                        host_lens=(q_lens, kv_lens))
    assert lp.stats is not None and lp.stats.max_kv_len == 90
    # The workspace depth follows the table's bound, never the (untrusted) host lengths.
    bound = plan_attention(*args_of(batch), split_size=split, validate=False)
    assert lp.num_splits == bound.num_splits
    understated = plan_attention(*args_of(batch), split_size=split, validate=False,
                                 host_lens=(q_lens, [1, 1, 1]))
    assert understated.num_splits == bound.num_splits
    out = unified_attention(*args_of(batch), split_size=split, validate=False,
                            host_lens=(q_lens, kv_lens))
    assert_same_bits(out, unified_attention(*args_of(batch), split_size=split), "host_lens")


@pytest.mark.parametrize(("host_lens", "expected"), [
    ("12", "a pair (q_lens, kv_lens)"),
    (([1, 1], [5, 5, 5]), "expected 3 q_lens"),
    (([1, 1, 1], [5, 5]), "expected 3 kv_lens"),
    (([1, 1, -1], [5, 5, 5]), "ints in [0, 2**31) in q_lens, got -1"),
    (([1, 1, 1.5], [5, 5, 5]), "ints in [0, 2**31) in q_lens, got 1.5"),
    (([1, 1, 1], [5, 5, 2**40]), "in kv_lens, got 1099511627776"),
    ((torch.ones(3, dtype=torch.int32), [5, 5, 5]), "q_lens as a list or tuple"),
    (([1, 1, 2], [5, 5, 5]), "sum to q.shape[0]=3"),
])
def test_bad_host_lens_are_named(dtype: torch.dtype, make_batch, args_of, host_lens: object,
                                 expected: str) -> None:
    batch = make_batch(dtype, [(1, 5)] * 3, PageLayout(4))
    for validate in (False, True):  # checked even when the lengths are read back
        with pytest.raises(ValueError, match="host_lens") as info:
            plan_attention(*args_of(batch), validate=validate,
                           host_lens=host_lens)  # type: ignore[arg-type]
        assert expected in str(info.value)


def test_control_mode_ignores_host_lens_for_sizes(dtype: torch.dtype, make_batch,
                                                  args_of) -> None:
    # The control's split count follows the batch, but from checked lengths or shapes: host
    # lengths that understate everything must not shrink the split (and grow the workspace).
    batch = make_batch(dtype, [(1, 90), (1, 20)], PageLayout(16))
    plain = plan_attention(*args_of(batch), split_size=None, validate=False)
    hinted = plan_attention(*args_of(batch), split_size=None, validate=False,
                            host_lens=([1, 1], [1, 1]))
    assert (hinted.split_tokens, hinted.num_splits) == (plain.split_tokens, plain.num_splits)


# ------------------------------------------------------------------------------------------------
# How K is loaded (IS_K_ROWS) and how caches are laid out: addresses only, never bits
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("seed", "split_tiles", "page_size"), CASES)
@pytest.mark.slow
def test_k_rows_and_k_columns_give_the_same_bits(dtype: torch.dtype, make_batch, args_of,
                                                 assert_same_bits, monkeypatch, seed: int,
                                                 split_tiles: int, page_size: int) -> None:
    # K loaded as [BN, D] rows (like V) or as [D, BN] columns, under both plans and three tile
    # heights: the same bits.

    batch = make_batch(dtype, [*_random_shape(seed), (1, 130), (9, 100)],
                       PageLayout(page_size, "shuffled", seed=seed))
    split = split_tiles * tile_config(dtype, 64).block_n
    runs = [dict(plan="split"), dict(plan="fused"), dict(plan="fused", tuning=Tuning(block_m=128)),
            dict(plan="fused", tuning=Tuning(block_m=256, num_warps=8))]
    results = {}
    for k_rows in (False, True):
        monkeypatch.setattr(kernels.launch, "_k_rows", lambda lp, dt, r=k_rows: r)
        results[k_rows] = [unified_attention(*args_of(batch), split_size=split, **kw)
                           for kw in runs]
    for kw, cols, rows in zip(runs, results[False], results[True], strict=True):
        assert_same_bits(rows, cols, f"K rows vs K columns ({kw})")
    # And every tile height against the split plan: 256-row tiles hold 64 tokens here, so more
    # of their rows fold splits that only a neighbour reaches (empty states).
    # float32 keeps its own BLOCK_M: its FMA dots change bits with the tile height on a GPU
    # (kernels/README.md; on an H100 128 vs the split plan's 32 differed in up to 26% of
    # elements by 1-4 ULP), so there only the default height is compared.
    n = 1 if dtype == torch.float32 else 3
    for kw, got in zip(runs[1:1 + n], results[True][1:1 + n], strict=True):
        assert_same_bits(got, results[True][0], f"{kw} vs the split plan")


def test_caches_with_other_layouts_give_the_same_bits(make_batch, args_of,
                                                      assert_same_bits) -> None:
    # K and V as views of one [num_pages, 2, page_size, Hkv, D] tensor (an engine's combined
    # cache), and V with other strides than K: the same results as contiguous caches.
    batch = make_batch(torch.float16, [(1, 70), (5, 40)], PageLayout(4, "shuffled"))
    q, k, v, cu, kv, bt = args_of(batch)
    combined = torch.stack([k, v], dim=1)
    k2, v2 = combined[:, 0], combined[:, 1]
    v3 = v.transpose(1, 2).contiguous().transpose(1, 2)  # same values, other strides
    split = tile_config(torch.float16, q.shape[2]).block_n
    for plan in ("split", "fused"):
        ref = unified_attention(q, k, v, cu, kv, bt, split_size=split, plan=plan)
        assert_same_bits(unified_attention(q, k2, v2, cu, kv, bt, split_size=split, plan=plan),
                         ref, f"combined KV cache ({plan})")
        assert_same_bits(unified_attention(q, k, v3, cu, kv, bt, split_size=split, plan=plan),
                         ref, f"V with other strides ({plan})")


@pytest.mark.parametrize(("seed", "split_tiles", "page_size"), CASES)
def test_slot_order_gives_the_same_bits(dtype: torch.dtype, make_batch, args_of,
                                        assert_same_bits, seed: int, split_tiles: int,
                                        page_size: int) -> None:
    """The fused plan with its slots taken longest first (sorted on the device) vs the plain
    order: which program takes which slot is scheduling only."""
    batch = make_batch(dtype, [*_random_shape(seed), (37, 120), (1, 128)],
                       PageLayout(page_size, "shuffled", seed=seed))
    split = split_tiles * tile_config(dtype, 64).block_n
    plain = unified_attention(*args_of(batch), split_size=split, plan="fused",
                              tuning=Tuning(slot_order=False))
    ordered = unified_attention(*args_of(batch), split_size=split, plan="fused",
                                tuning=Tuning(slot_order=True))
    assert_same_bits(ordered, plain, "slot order vs plain order")


def _host_slot_keys(shape: list[tuple[int, int]], num_slots: int, block_q: int,
                    block_n: int) -> list[int]:
    """The slot order's key per query-block slot, on the host: the KV tiles of the slot's
    request (``ceil(kv_len / block_n)``) times 2**32 plus the slot; the slot alone for slots
    past a request's blocks. Request b owns the slots from ``cu[b] // block_q + b``."""
    keys, cu = list(range(num_slots)), 0
    for b, (q_len, kv_len) in enumerate(shape):
        first = cu // block_q + b
        for i in range(-(-q_len // block_q)):
            keys[first + i] += -(-kv_len // block_n) << 32
        cu += q_len
    return keys


def test_slot_keys_match_a_host_count(dtype: torch.dtype, make_batch, args_of) -> None:
    """The sort key of every query-block slot (request KV tiles x 2**32 + slot), against the
    same key computed on the host; the order it gives is checked at the launch below."""
    shape = [(37, 120), (1, 128), (0, 5), (16, 16), (5, 300)]
    batch = make_batch(dtype, shape, PageLayout(4, "shuffled", seed=1))
    args = args_of(batch)
    lp = plan_attention(*args, plan="fused")
    keys = torch.empty(lp.num_slots, dtype=torch.int64, device=batch.q.device)
    T, Hq, _ = batch.q.shape
    Hkv = batch.k_cache.shape[2]
    kernels.launch._slot_keys_kernel[(lp.num_slots,)](
        args[3], args[4], keys, len(shape), T, args[5].shape[1] * batch.k_cache.shape[1],
        G=Hq // Hkv, BLOCK_M=lp.block_m, BLOCK_Q=lp.block_q, BLOCK_N=lp.block_n, num_warps=1)
    assert keys.cpu().tolist() == _host_slot_keys(shape, lp.num_slots, lp.block_q, lp.block_n)


def test_slot_keys_do_not_wrap_near_two_to_the_31_tokens(make_batch, args_of) -> None:
    """A KV length near 2**31 (a block table that wide): the request's tiles,
    ``ceil(kv_len / BLOCK_N)``, in int64, so the key stays positive and ordered (int32 would
    wrap ``kv_len + BLOCK_N - 1`` negative). The kernel alone, on made-up lengths."""
    batch = make_batch(torch.float16, [(1, 40), (2, 60)])
    args = args_of(batch)
    big = 2**31 - 1
    dev = batch.q.device
    kv = torch.tensor([big, 60], dtype=torch.int32, device=dev)
    lp = plan_attention(*args, plan="fused")
    keys = torch.empty(lp.num_slots, dtype=torch.int64, device=dev)
    Hq, Hkv = batch.q.shape[1], batch.k_cache.shape[2]
    kernels.launch._slot_keys_kernel[(lp.num_slots,)](
        args[3], kv, keys, 2, batch.q.shape[0], big, G=Hq // Hkv, BLOCK_M=lp.block_m,
        BLOCK_Q=lp.block_q, BLOCK_N=lp.block_n, num_warps=1)
    got = keys.cpu().tolist()
    assert got[0] == (-(-big // lp.block_n) << 32), got  # request 0's one slot, slot 0
    assert all(k >= 0 for k in got) and got[0] == max(got), got


def test_slot_rank_is_a_permutation_for_any_distinct_keys(device: Any) -> None:
    """The rank kernel: ``order[rank] = slot`` by descending key, with a key count that is not a
    multiple of the block (padded lanes never counted, even against keys below their
    padding value)."""
    keys = torch.tensor([3, -2, 7, 0, -9], dtype=torch.int64, device=device)
    order = torch.full((5,), -1, dtype=torch.int32, device=device)
    kernels.launch._slot_rank_kernel[(5,)](keys, order, 5, BLOCK=4, num_warps=1)
    assert order.cpu().tolist() == [2, 0, 3, 1, 4]


def test_slot_order_rule_and_plan(dtype: torch.dtype, make_batch, args_of) -> None:
    """kernels.config.slot_order: mixed batches (prefill-like on average, not long prompts) of
    more than two programs per SM; the plan takes it for the fused plan only, and Tuning
    overrides it."""
    rule = kernels.config.slot_order
    # 64 requests, G = 4: 148 query tokens each on average (mixed64) is prefill-like; 16 each
    # is decode-like; 1024 each is long prompts.
    assert rule(265, 132, 64 * 148, 4, 64) and not rule(264, 132, 64 * 148, 4, 64)
    assert not rule(10_000, 132, 64 * 16, 4, 64)
    assert not rule(10_000, 132, 64 * 1024, 4, 64) and rule(10_000, 132, 64 * 1023, 4, 64)
    batch = make_batch(dtype, [(40, 60), (1, 30)])

    def ordered(**kwargs: Any) -> bool:
        return plan_attention(*args_of(batch), **kwargs).slot_order

    assert not ordered(plan="fused")  # a small grid
    assert ordered(plan="fused", tuning=Tuning(slot_order=True))
    assert not ordered(plan="split", tuning=Tuning(slot_order=True))


def test_the_fused_launch_takes_the_slots_longest_first(dtype: torch.dtype, make_batch,
                                                         args_of, monkeypatch) -> None:
    """With the slot order the fused kernel gets IS_SLOT_ORDER and, as its slot_order
    argument, the slots of the requests with the most KV first, each request's last block
    first: a permutation, so every slot has exactly one program."""
    real = kernels.launch._unified_attention_fused_kernel
    seen: list[tuple[object, list[int]]] = []

    class Spy:
        def __getitem__(self, grid: tuple[int, ...]):
            def launch(*args: object, **kwargs: object) -> None:
                order = kwargs["slot_order_ptr"]
                assert isinstance(order, torch.Tensor)
                seen.append((kwargs["IS_SLOT_ORDER"], order.tolist()))
                real[grid](*args, **kwargs)
            return launch

    monkeypatch.setattr(kernels.launch, "_unified_attention_fused_kernel", Spy())
    shape = [(1, 30), (40, 200), (0, 3), (9, 70)]
    batch = make_batch(dtype, shape)
    lp = plan_attention(*args_of(batch), plan="fused")
    unified_attention(*args_of(batch), plan="fused", tuning=Tuning(slot_order=True))
    flag, order = seen[0]
    keys = _host_slot_keys(shape, lp.num_slots, lp.block_q, lp.block_n)
    assert flag is True
    assert order == sorted(range(lp.num_slots), key=lambda i: -keys[i]), (order, keys)
    # Not the plain order (last slots first): request 1 (200 tokens of KV) goes before 3 (70).
    assert order != list(range(lp.num_slots))[::-1]


def test_no_measured_rule_on_rocm(monkeypatch) -> None:
    """ROCm devices report their own architecture numbers (9 for an MI300): the rules measured
    on NVIDIA GPUs (wgmma tiles, value blocks, tiles per step, the dependent merge) see no
    compute capability there, as under the interpreter."""
    monkeypatch.setattr(torch.version, "hip", "6.2")
    monkeypatch.setattr(kernels._device, "_interpreting", lambda: False)
    assert kernels.plan._sm_major(torch.device("cuda", 0)) is None


# Lead splits (kernels/README.md, "Lead splits"): (seed, split size and lead split size in units
# of BLOCK_N, page size). The longest row crosses the lead splits and the first split's end.
LEAD_CASES = [
    pytest.param(0, 4, 1, 4, id="seed0-split4xBN-lead1xBN-page4"),
    pytest.param(1, 4, 2, 64, id="seed1-split4xBN-lead2xBN-page64"),
    pytest.param(2, 6, 2, 1, id="seed2-split6xBN-lead2xBN-page1"),
]


@pytest.mark.parametrize(("seed", "split_tiles", "lead_tiles", "page_size"), LEAD_CASES)
@pytest.mark.slow
def test_lead_splits_give_the_same_bits_in_every_plan(
        dtype: torch.dtype, make_batch, args_of, assert_same_bits, seed: int, split_tiles: int,
        lead_tiles: int, page_size: int) -> None:
    """The fused plan (flat loop; nested loop) and the split plan with
    its merge fold the lead splits and the later splits in the same order: the same bits. The
    control: one split size (no lead splits) differs in some bit, so the comparison can fail."""
    rng = random.Random(seed)
    block_n = tile_config(dtype, 64).block_n
    # Past the first split's end by a quarter split and half a tile (a partial last tile).
    longest = split_tiles * block_n * 5 // 4 + block_n // 2
    shape = [(min(kv, rng.choice([1, 1, 3, 17])), kv)
             for kv in [rng.randint(1, longest) for _ in range(3)] + [longest]]
    batch = make_batch(dtype, shape, PageLayout(page_size, "shuffled", seed=seed))
    kw = dict(split_size=split_tiles * block_n, lead_split_size=lead_tiles * block_n)
    lp = plan_attention(*args_of(batch), plan="split", **kw)
    assert (lp.split_tiles, lp.lead_tiles) == (split_tiles, lead_tiles)
    assert lp.num_splits == kernels.config.count_splits(longest, split_tiles * block_n,
                                                        lead_tiles * block_n)
    ref = unified_attention(*args_of(batch), plan="split", **kw)
    for plan, tuning in (("fused", Tuning(nested_loop=False)), ("fused", Tuning(nested_loop=True)),
                         ("split", Tuning(value_blocks=2))):
        assert_same_bits(unified_attention(*args_of(batch), plan=plan, tuning=tuning, **kw), ref,
                         f"lead splits: {plan} {tuning} vs split")
    one = unified_attention(*args_of(batch), plan="split", split_size=kw["split_size"])
    assert not (torch.equal(one[0].view(torch.int16 if dtype != torch.float32 else torch.int32),
                            ref[0].view(torch.int16 if dtype != torch.float32 else torch.int32))
                and torch.equal(one[1].view(torch.int32), ref[1].view(torch.int32)))


def test_lead_split_sizes_and_their_rules() -> None:
    """How many splits a row has, which lead size a call gets, and the keys-as-rows rules."""
    from kernels.config import choose_plan, count_splits, kt_walk_lead, kt_walk_splits
    from kernels.plan import _lead_tokens

    # 8 lead splits of 128 in the first 1024 keys, then one per 1024.
    assert [count_splits(n, 1024, 128) for n in (0, 1, 128, 129, 1024, 1025, 2048, 3000)] == \
        [0, 1, 1, 2, 8, 9, 9, 10]
    assert [count_splits(n, 1024, 1024) for n in (1, 1024, 1025)] == [1, 1, 2]  # one size
    # The default lead comes with the default split size only; an explicit one is kept (capped
    # at the split size); the control has one size.
    assert _lead_tokens(1024, None, 1024, 128) == 128
    assert _lead_tokens(1024, None, 1024, 32) == 128
    assert _lead_tokens(2048, None, 2048, 128) == 2048
    assert _lead_tokens(1024, None, 1024, 256) == 1024  # a wider tile than the lead
    assert _lead_tokens(2048, 256, 2048, 128) == 256
    assert _lead_tokens(512, 4096, 512, 128) == 512
    assert _lead_tokens(None, 128, 640, 128) == 640
    # One program per lead split only where every row lies in them and the grid fits the SMs.
    assert not kt_walk_lead(64, True, 132) and not kt_walk_lead(132, True, 132)
    assert kt_walk_lead(133, True, 132) and kt_walk_lead(16, False, 132)
    # Two splits per walking program only between one and two waves of the SMs.
    assert [kt_walk_splits(n, 132) for n in (8, 132, 133, 264, 265, 2048)] == [1, 1, 2, 2, 1, 1]
    # The keys-as-rows tile's split plan takes rows within the lead splits (at most 8 here).
    kw = dict(keys_rows=True, lead_tokens=128)
    assert choose_plan(544, 132, 1024, 1024, num_splits=8, **kw) == "split"
    # Past them the rule no longer applies: 544 programs, more than the SMs, and rows of 2048
    # keys on balanced lengths stay fused.
    assert choose_plan(544, 132, 2048, 1024, num_splits=9, longest_tiles=16,
                       total_tiles=544 * 16, gluon=True, **kw) == "fused"


def test_an_fp8_cache_keeps_one_value_block_by_the_rules(monkeypatch, device) -> None:
    # As on a Hopper deployment without Gluon (the 64-key contract at head dim 128): a small
    # decode grid takes several V blocks by the rules, but with an FP8 cache one (the tuner
    # rejected 4 V blocks there on an H200: not shown bit-neutral); a Tuning may still ask.
    import kernels._gluon as gluon_module

    monkeypatch.setattr(kernels.plan, "_sm_major", lambda device: 9)
    monkeypatch.setattr(kernels.plan, "_num_sms", lambda device: 132)
    monkeypatch.setattr(gluon_module, "unavailable_reason", lambda: "not in this test")
    _, decode = _hopper_batches(device)
    q, k, v, cu, kv_lens, table = decode
    one = (q[:1], k, v, cu[:2], kv_lens[:1], table[:1])
    plain = plan_attention(*one, validate=False, plan="split", host_lens=([1], [1024]))
    assert plain.block_n == 64 and plain.value_blocks > 1
    fp8 = (q[:1], k.to(torch.float8_e4m3fn), v.to(torch.float8_e4m3fn), *one[3:])
    kw = dict(validate=False, plan="split", host_lens=([1], [1024]), k_scale=1.0, v_scale=1.0)
    assert plan_attention(*fp8, **kw).value_blocks == 1
    assert plan_attention(*fp8, tuning=Tuning(value_blocks=2), **kw).value_blocks == 2
    # 32-column V blocks with an FP8 cache compute wrong values on an H200: refused, named.
    with pytest.raises(ValueError, match=r"expected value_blocks other than 4 with an FP8 cache "
                                         r"at head_dim 128 .* got value_blocks=4"):
        plan_attention(*fp8, tuning=Tuning(value_blocks=4), **kw)
    assert plan_attention(*one, validate=False, plan="split", host_lens=([1], [1024]),
                          tuning=Tuning(value_blocks=4)).value_blocks == 4  # without FP8
