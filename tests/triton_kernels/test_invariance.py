"""Kernel-level invariance: a (request, position) row gets the same bits under any schedule.

Every test builds two harness schedules that share the rows of one target request and compares
them bit for bit with ``invariance.replay``. ``test_control_mode_is_not_invariant`` is the negative
control: the same comparison fails for the batch-dependent split count of ``split_size=None``.
"""

from __future__ import annotations

import itertools

import pytest
import torch

import invariance
from invariance import Chunk, HeadConfig, PageLayout, Request, Schedule, Step, Workload
from invariance.backends.kernels import KernelsBackend
from kernels import plan_attention, tile_config

# A GQA group of 2 at head dim 128, whose contract tiles (64 keys at half precision, 32 at
# float32) give the target row several tiles and splits (head dim 64 runs 128-key tiles).
HEADS = HeadConfig(4, 2, 128)
TARGET = 0
# Several BLOCK_N tiles and several splits of 2 * BLOCK_N (3 splits at BLOCK_N 32, 2 at 64).
TARGET_LEN = 160
PAGES = PageLayout(16)


def _schedule(*chunks: Chunk, layout: PageLayout = PAGES) -> Schedule:
    """One step (one attention call) of ``chunks``, in that order."""
    return Schedule((Step(chunks),), layout)


def _workload(dtype: torch.dtype, neighbours: list[tuple[int, int]]) -> tuple[Workload,
                                                                               list[Chunk]]:
    """The target request plus neighbours ``(q_len, kv_len)`` (ids 1, 2, ...) and their chunks."""
    requests = [Request(TARGET, TARGET_LEN)]
    requests += [Request(i + 1, kv) for i, (_, kv) in enumerate(neighbours)]
    chunks = [Chunk(i + 1, kv - q, kv) for i, (q, kv) in enumerate(neighbours)]
    return Workload(tuple(requests), HEADS, dtype, seed=42), chunks


@pytest.fixture
def backend(dtype: torch.dtype) -> KernelsBackend:
    """The invariant kernels with a split of two tiles, fused plan. (The plans give identical
    bits, test_plans.py; the fused one is the cheaper one under the interpreter.)"""
    return KernelsBackend(split_size=2 * tile_config(dtype, HEADS.head_dim).block_n,
                          kernel_plan="fused")


# Neighbour sets: (q_len, kv_len) of the other requests. Longer and shorter than the target,
# prefill and decode, an empty request.
NEIGHBOURS = [
    pytest.param(1, [(1, 200), (1, 3)], id="decode-among-decodes"),
    pytest.param(19, [(40, 90), (0, 0), (1, 190)], id="chunk19-among-mixed"),
]


@pytest.mark.parametrize(("q_len", "neighbours"), NEIGHBOURS)
def test_batch_neighbours_and_position(dtype, device, backend, q_len, neighbours) -> None:
    workload, others = _workload(dtype, neighbours)
    target = Chunk(TARGET, TARGET_LEN - q_len, TARGET_LEN)
    alone = _schedule(target)
    first = _schedule(target, *others, layout=PageLayout(16, "shuffled", seed=1))
    last = _schedule(*others, target, layout=PageLayout(16, "shuffled", seed=2))
    invariance.replay(backend, workload, alone, first, device=device)
    invariance.replay(backend, workload, alone, last, device=device)


def test_prefill_vs_decode_vs_chunking(dtype, device, backend) -> None:
    workload, _ = _workload(dtype, [])
    full = _schedule(Chunk(TARGET, 0, TARGET_LEN))
    # The same rows in one batch: decode rows at tile and split boundaries (31 | 32, 63 | 64) and
    # at the end, between them prefill chunks of odd sizes, the first one from position 0.
    decode = [31, 32, 63, 64, 100, TARGET_LEN - 1]
    cuts = [0, 31, 33, 63, 65, 100, 101, TARGET_LEN - 1]
    chunks = [Chunk(TARGET, a, b) for a, b in itertools.pairwise(cuts) if a not in decode]
    mixed = _schedule(*chunks, *(Chunk(TARGET, p, p + 1) for p in decode))
    cmp = invariance.replay(backend, workload, full, mixed, device=device)
    assert len(cmp.keys) == TARGET_LEN


@pytest.mark.parametrize("page_size", [1, 64], ids=lambda p: f"page{p}")
def test_page_size_and_placement(dtype, device, backend, page_size) -> None:
    workload, _ = _workload(dtype, [])
    target = Chunk(TARGET, TARGET_LEN - 7, TARGET_LEN)
    other = PageLayout(page_size, "shuffled", extra_pages=9, extra_columns=2, fill="nan", seed=11)
    invariance.replay(backend, workload, _schedule(target), _schedule(target, layout=other),
                      device=device)


def test_run_to_run(dtype, device, backend) -> None:
    workload, _ = _workload(dtype, [])
    once = _schedule(Chunk(TARGET, 120, TARGET_LEN), layout=PageLayout(4))
    invariance.replay(backend, workload, once, once, device=device)


def _target_rows(backend, workload, schedule, device) -> tuple[torch.Tensor, torch.Tensor]:
    result = invariance.run_schedule(backend, workload, schedule, device)
    rows = [i for i, (rid, _) in enumerate(result.keys) if rid == TARGET]
    return result.out[rows], result.lse[rows]


def test_control_mode_is_not_invariant(dtype, device, backend, args_of) -> None:
    # Negative control: split_size=None picks the split count from the batch (FA2 heuristic).
    # Next to five short decodes and one long one (more programs, a longer longest row), the
    # target's decode row gets another split size, hence other bits.
    neighbours = [(1, 640), *[(1, 8 + 9 * i) for i in range(5)]]
    workload, others = _workload(dtype, neighbours)
    target = Chunk(TARGET, TARGET_LEN - 1, TARGET_LEN)
    alone, batched = _schedule(target), _schedule(target, *others)
    batches = [invariance.materialize(workload, s.steps[0], PAGES, device)
               for s in (alone, batched)]
    splits = [plan_attention(*args_of(b), split_size=None).split_tokens for b in batches]
    assert splits[0] != splits[1], f"setup: the control picks one split size {splits[0]} for both"
    control = KernelsBackend(split_size=None, kernel_plan="fused")
    a = _target_rows(control, workload, alone, device)
    b = _target_rows(control, workload, batched, device)
    differ = [not invariance.compare_bits(x, y).equal for x, y in zip(a, b, strict=True)]
    assert any(differ), (f"control mode unexpectedly invariant (split {splits[0]} vs "
                         f"{splits[1]} tokens): the negative control cannot fail")
    # ... while the invariant mode keeps the bits for the very same pair of batches.
    invariance.replay(backend, workload, alone, batched, device=device)
