"""unified_attention against the float64 reference, within a dtype tolerance."""

from __future__ import annotations

import pytest
import torch

from kernels import DEFAULT_SPLIT_SIZE, tile_config, unified_attention
from kernels.reference import reference_attention
from kernels.testing import LSE_TOLERANCE, OUT_TOLERANCE, build_batch, make_request

# (q_len, kv_len) per request. Mixed prefill chunks, decode rows, and the edge cases of the
# contract: q_len == 0 (no rows), kv_len == q_len == 0, a prefill from position 0, a length that
# is not a multiple of any tile or page size.
MIXED = [(1, 97), (37, 150), (0, 40), (0, 0), (5, 5), (1, 1), (20, 300)]

CASES = [
    # page_size 1: every key gathers its own page; 4 and 16: several pages per tile (16 is one
    # page per tile when BLOCK_N = 16).
    pytest.param(4, 2, 64, 1, MIXED, id="Hq4-Hkv2-D64-page1"),
    pytest.param(4, 2, 64, 4, MIXED, id="Hq4-Hkv2-D64-page4"),
    pytest.param(4, 2, 64, 16, MIXED, id="Hq4-Hkv2-D64-page16"),
    # page larger than every BLOCK_N: one block-table read per tile.
    pytest.param(4, 4, 64, 128, [(3, 200), (1, 64)], id="Hq4-Hkv4-D64-page128-MHA"),
    # GQA group of 3 (not a power of two: padding rows in the tile).
    pytest.param(6, 2, 64, 8, [(9, 70), (1, 33)], id="Hq6-Hkv2-D64-page8-G3"),
    # MQA group of 8, head dim 128.
    pytest.param(8, 1, 128, 16, [(2, 90), (1, 17)], id="Hq8-Hkv1-D128-page16"),
]


def _check(out: torch.Tensor, lse: torch.Tensor, ref_out: torch.Tensor, ref_lse: torch.Tensor,
           dtype: torch.dtype) -> None:
    atol, rtol = OUT_TOLERANCE[dtype]
    torch.testing.assert_close(out.double(), ref_out, atol=atol, rtol=rtol)
    atol, rtol = LSE_TOLERANCE[dtype]
    torch.testing.assert_close(lse.double(), ref_lse, atol=atol, rtol=rtol)


@pytest.mark.parametrize(("Hq", "Hkv", "D", "page_size", "shape"), CASES)
def test_matches_reference(dtype: torch.dtype, device: torch.device, Hq: int, Hkv: int, D: int,
                           page_size: int, shape: list[tuple[int, int]]) -> None:
    items = []
    for i, (q_len, kv_len) in enumerate(shape):
        req = make_request(100 + i, kv_len, Hq, Hkv, D, dtype, device)
        items.append((req, kv_len - q_len, kv_len))
    batch = build_batch(items, page_size, seed=7, extra_columns=2)
    split = 2 * tile_config(dtype, D).block_n
    out, lse = unified_attention(*batch.args(), split_size=split)
    ref_out, ref_lse = reference_attention(*batch.args(), out_dtype=torch.float64)
    assert out.dtype == dtype and lse.dtype == torch.float32
    assert out.shape == batch.q.shape and lse.shape == batch.q.shape[:2]
    _check(out, lse, ref_out, ref_lse, dtype)


def test_default_split_and_custom_scale(dtype: torch.dtype, device: torch.device) -> None:
    # Rows longer than DEFAULT_SPLIT_SIZE so that the default split count is > 1.
    n = DEFAULT_SPLIT_SIZE + 100
    req = make_request(5, n, 4, 2, 64, dtype, device)
    batch = build_batch([(req, n - 3, n), (req, 0, 3)], 16, seed=1)
    out, lse = unified_attention(*batch.args(), sm_scale=0.3)
    ref_out, ref_lse = reference_attention(*batch.args(), sm_scale=0.3, out_dtype=torch.float64)
    _check(out, lse, ref_out, ref_lse, dtype)


def test_empty_batch(dtype: torch.dtype, device: torch.device) -> None:
    # Every request has q_len == 0: no rows at all.
    req = make_request(1, 10, 4, 2, 64, dtype, device)
    batch = build_batch([(req, 10, 10), (req, 4, 4)], 4)
    out, lse = unified_attention(*batch.args())
    assert out.shape == (0, 4, 64) and lse.shape == (0, 4)
