"""Kernel-level invariance: a (request, position) row gets the same bits under any schedule.

Every test compares the rows of one target request computed under two schedules, bit for bit.
``test_control_mode_is_not_invariant`` is the negative control: the same comparison fails for the
batch-dependent split count of ``split_size=None``.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from kernels import tile_config, unified_attention
from kernels.testing import Batch, RequestData, build_batch, describe_bit_mismatch, make_request

Hq, Hkv, D = 4, 2, 64
# Long enough for several splits of 2 * BLOCK_N and several BLOCK_N tiles.
TARGET_LEN = 260


@pytest.fixture
def target(dtype: torch.dtype, device: torch.device) -> RequestData:
    return make_request(42, TARGET_LEN, Hq, Hkv, D, dtype, device)


@pytest.fixture
def split_size(dtype: torch.dtype) -> int:
    return 2 * tile_config(dtype, D).block_n


def _neighbours(dtype: torch.dtype, device: torch.device, lengths: list[tuple[int, int]]):
    """(request, q_start, q_end) items of other requests: (q_len, kv_len) each."""
    return [(make_request(7 + i, kv, Hq, Hkv, D, dtype, device), kv - q, kv)
            for i, (q, kv) in enumerate(lengths)]


def _rows(batch: Batch, item: int, split_size: int | None, **kw) -> tuple[torch.Tensor, ...]:
    out, lse = unified_attention(*batch.args(), split_size=split_size, **kw)
    rows = batch.row_slices[item]
    return out[rows], lse[rows]


def _assert_same(a: tuple[torch.Tensor, ...], b: tuple[torch.Tensor, ...], what: str) -> None:
    for name, x, y in (("out", a[0], b[0]), ("lse", a[1], b[1])):
        msg = describe_bit_mismatch(x, y)
        assert msg is None, f"{what}: {name} differs: {msg}"


# Neighbour sets: (q_len, kv_len) of the other requests. Longer and shorter than the target,
# prefill and decode, an empty request.
NEIGHBOURS = [
    pytest.param([(1, 300), (1, 3)], id="decode-neighbours"),
    pytest.param([(50, 120), (0, 0), (1, 299)], id="mixed-neighbours"),
]


@pytest.mark.parametrize("neighbours", NEIGHBOURS)
@pytest.mark.parametrize("q_len", [1, 19], ids=["decode", "chunk19"])
def test_batch_neighbours_and_position(dtype, device, target, split_size, neighbours,
                                       q_len) -> None:
    item = (target, TARGET_LEN - q_len, TARGET_LEN)
    alone = _rows(build_batch([item], 16, seed=0), 0, split_size)
    others = _neighbours(dtype, device, neighbours)
    first = _rows(build_batch([item, *others], 16, seed=1), 0, split_size)
    last = _rows(build_batch([*others, item], 16, seed=2), len(others), split_size)
    _assert_same(alone, first, "alone vs first in a batch")
    _assert_same(alone, last, "alone vs last in a batch")


def test_prefill_vs_decode_vs_chunking(dtype, device, target, split_size) -> None:
    full_out, full_lse = _rows(build_batch([(target, 0, TARGET_LEN)], 16), 0, split_size)
    # Decode steps at a few positions (tile and split boundaries and in between).
    positions = [0, 31, 63, 64, 100, TARGET_LEN - 1]
    decode = build_batch([(target, p, p + 1) for p in positions], 16, seed=3)
    out, lse = unified_attention(*decode.args(), split_size=split_size)
    for i, p in enumerate(positions):
        rows = decode.row_slices[i]
        _assert_same((full_out[p:p + 1], full_lse[p:p + 1]), (out[rows], lse[rows]),
                     f"prefill vs decode at position {p}")
    # The same prefill as three chunks of odd sizes, all three in one batch.
    cuts = [0, 45, 171, TARGET_LEN]
    chunks = build_batch([(target, a, b) for a, b in itertools.pairwise(cuts)], 16, seed=4)
    out, lse = unified_attention(*chunks.args(), split_size=split_size)
    for i, (a, b) in enumerate(itertools.pairwise(cuts)):
        rows = chunks.row_slices[i]
        _assert_same((full_out[a:b], full_lse[a:b]), (out[rows], lse[rows]),
                     f"full prefill vs chunk [{a}, {b})")


@pytest.mark.parametrize("page_size", [1, 4, 64], ids=lambda p: f"page{p}")
def test_page_size_and_placement(dtype, device, target, split_size, page_size) -> None:
    item = (target, TARGET_LEN - 7, TARGET_LEN)
    base = _rows(build_batch([item], 16, seed=0), 0, split_size)
    other = _rows(build_batch([item], page_size, seed=11, extra_pages=9), 0, split_size)
    _assert_same(base, other, f"page size 16 vs {page_size}, other placement")


def test_run_to_run(dtype, device, target, split_size) -> None:
    batch = build_batch([(target, 200, TARGET_LEN)], 4)
    _assert_same(_rows(batch, 0, split_size), _rows(batch, 0, split_size), "run 1 vs run 2")


def test_control_mode_is_not_invariant(dtype, device, target) -> None:
    # Negative control: split_size=None picks the split count from the batch (FA2 heuristic), so
    # the target's decode row changes bits when it is batched with 15 other decode requests.
    item = (target, TARGET_LEN - 1, TARGET_LEN)
    alone = _rows(build_batch([item], 16), 0, None)
    others = _neighbours(dtype, device, [(1, 30 + 17 * i) for i in range(15)])
    batched = _rows(build_batch([item, *others], 16, seed=5), 0, None)
    assert describe_bit_mismatch(alone[1], batched[1]) is not None or \
        describe_bit_mismatch(alone[0], batched[0]) is not None, \
        "control mode unexpectedly invariant: the negative control cannot fail"
    # ... while the invariant mode keeps the bits for the very same pair of batches.
    split = 2 * tile_config(dtype, D).block_n
    _assert_same(_rows(build_batch([item], 16), 0, split),
                 _rows(build_batch([item, *others], 16, seed=5), 0, split),
                 "invariant mode, alone vs batch of 16")
