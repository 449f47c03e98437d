"""unified_attention against the float64 reference (``kernels.reference``), within the bound
of the harness, ``invariance.accuracy.accuracy_bound`` (conftest.py)."""

from __future__ import annotations

import pytest
import torch

from invariance import HeadConfig, PageLayout
from kernels import DEFAULT_SPLIT_SIZE, tile_config, unified_attention

# (q_len, kv_len) per request: decode rows, prefill chunks, and the edge cases of the contract:
# q_len == 0 (no rows), kv_len == q_len == 0, a prefill from position 0, a one-token request,
# lengths that are multiples of no tile or page size.
MIXED = [(1, 97), (17, 120), (0, 40), (0, 0), (5, 5), (1, 1), (12, 150)]

CASES = [
    # page size 1: every key gathers its own page; 4: several pages per tile; 64: one page per
    # tile of 32 or 64 keys (one block-table read per tile), two per 128-key tile.
    pytest.param(HeadConfig(4, 2, 64), 1, MIXED, id="Hq4-Hkv2-D64-page1"),
    pytest.param(HeadConfig(4, 2, 64), 4, [(1, 70), (6, 6), (9, 100)], id="Hq4-Hkv2-D64-page4"),
    pytest.param(HeadConfig(4, 4, 64), 64, [(3, 150), (1, 64)], id="Hq4-Hkv4-D64-page64-MHA"),
    # GQA group of 3 (not a power of two: padding rows in the tile).
    pytest.param(HeadConfig(6, 2, 64), 8, [(9, 70), (1, 33)], id="Hq6-Hkv2-D64-page8-G3"),
    # MQA group of 8, head dim 128.
    pytest.param(HeadConfig(8, 1, 128), 16, [(2, 90), (1, 17)], id="Hq8-Hkv1-D128-page16"),
]


@pytest.mark.parametrize(("heads", "page_size", "shape"), CASES)
def test_matches_reference(dtype, make_batch, args_of, assert_accurate, heads: HeadConfig,
                           page_size: int, shape: list[tuple[int, int]]) -> None:
    # Shuffled pages, unused pages and block-table columns, unused memory NaN: a kernel reading
    # past a request's KV length poisons its rows.
    layout = PageLayout(page_size, "shuffled", extra_pages=3, extra_columns=2, fill="nan")
    batch = make_batch(dtype, shape, layout, heads)
    # One tile per split: rows of up to 150 keys span 2 (128-key tiles) to 5 (32) splits.
    split = tile_config(dtype, heads.head_dim).block_n
    out, lse = unified_attention(*args_of(batch), split_size=split)
    assert_accurate(out, lse, args_of(batch))


def test_default_split_and_custom_scale(dtype, make_batch, args_of, assert_accurate) -> None:
    # Two decode rows past DEFAULT_SPLIT_SIZE (two splits at the default), a short prefill.
    n = DEFAULT_SPLIT_SIZE + 40
    batch = make_batch(dtype, [(2, n), (3, 3)])
    out, lse = unified_attention(*args_of(batch), sm_scale=0.3)
    assert_accurate(out, lse, args_of(batch), sm_scale=0.3)


def test_no_query_tokens(dtype, make_batch, args_of) -> None:
    # Every request has q_len == 0: no rows at all, and no kernel launch.
    batch = make_batch(dtype, [(0, 10), (0, 4)])
    out, lse = unified_attention(*args_of(batch))
    assert out.shape == (0, 4, 64) and out.dtype == dtype
    assert lse.shape == (0, 4) and lse.dtype == torch.float32
