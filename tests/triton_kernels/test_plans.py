"""The execution plans (fused, split, auto) give identical bits for a fixed split size."""

from __future__ import annotations

import random

import pytest
import torch

from kernels import tile_config, unified_attention
from kernels.testing import build_batch, describe_bit_mismatch, make_request

# (seed, split size in units of BLOCK_N, page size). Seeds pick random mixed batches (decode rows
# and prefill chunks, kv lengths up to 300, so a row spans up to ~10 splits of one tile); the tile
# config fixes BLOCK_N per (dtype, head_dim), so split sizes are multiples of it; page size 1 is
# the per-key gather, 16 one page per tile when BLOCK_N is 16 or less, 4 in between.
CASES = [
    pytest.param(0, 1, 1, id="seed0-split1xBN-page1"),
    pytest.param(1, 3, 16, id="seed1-split3xBN-page16"),
    pytest.param(2, 2, 4, id="seed2-split2xBN-page4"),
]


def _random_batch(seed: int, dtype: torch.dtype, device: torch.device, page_size: int,
                  Hq: int = 4, Hkv: int = 2, D: int = 64):
    rng = random.Random(seed)
    items = []
    for i in range(rng.randint(2, 6)):
        kv_len = rng.randint(0, 300)
        q_len = rng.choice([0, 1, 1, rng.randint(0, kv_len)])
        q_len = min(q_len, kv_len)
        req = make_request(1000 * seed + i, kv_len, Hq, Hkv, D, dtype, device)
        items.append((req, kv_len - q_len, kv_len))
    return build_batch(items, page_size, seed=seed)


@pytest.mark.parametrize(("seed", "split_tiles", "page_size"), CASES)
def test_fused_equals_split(dtype: torch.dtype, device: torch.device, seed: int,
                            split_tiles: int, page_size: int) -> None:
    batch = _random_batch(seed, dtype, device, page_size)
    split = split_tiles * tile_config(dtype, 64).block_n
    results = {plan: unified_attention(*batch.args(), split_size=split, plan=plan)
               for plan in ("fused", "split", "auto")}
    ref_out, ref_lse = results["fused"]
    for plan in ("split", "auto"):
        out, lse = results[plan]
        for name, x, y in (("out", out, ref_out), ("lse", lse, ref_lse)):
            msg = describe_bit_mismatch(x, y)
            assert msg is None, f"plan {plan} vs fused: {name} differs: {msg}"


def test_split_plan_ignores_uninitialised_workspace(dtype: torch.dtype,
                                                    device: torch.device) -> None:
    # Run twice with a caching allocator full of garbage in between: same bits.
    batch = _random_batch(3, dtype, device, 4)
    split = tile_config(dtype, 64).block_n
    first = unified_attention(*batch.args(), split_size=split, plan="split")
    junk = torch.full((1 << 20,), float("nan"), device=device)
    del junk
    second = unified_attention(*batch.args(), split_size=split, plan="split")
    for a, b in zip(first, second, strict=True):
        assert describe_bit_mismatch(a, b) is None
