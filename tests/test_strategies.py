"""The hypothesis strategies: valid objects, pairs sharing their tokens, small shrunk failures."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import HealthCheck, find, given, settings
from hypothesis import strategies as st

from invariance import HeadConfig, Request, Schedule, Workload, materialize, replay
from invariance.backends import resolve
from invariance.strategies import (
    SchedulePair,
    head_configs,
    page_layouts,
    requests,
    schedule_pairs,
    schedules,
    steps,
    workloads,
)

# Structural properties run no backend: cheap, so a few more examples.
STRUCTURE = settings(max_examples=40, deadline=None, database=None)
# Properties that run a backend on CPU stay under a second or two each.
BACKEND = settings(max_examples=15, deadline=None, database=None,
                   suppress_health_check=[HealthCheck.too_slow])


def tokens(schedule: Schedule) -> Counter[tuple[int, int]]:
    """How many times the schedule computes each (request, token)."""
    return Counter((c.request_id, t) for step in schedule.steps for c in step.chunks
                   for t in range(c.start, c.stop))


@STRUCTURE
@given(head_configs())
def test_head_configs_are_valid_gqa(heads: HeadConfig) -> None:
    assert heads.num_q_heads % heads.num_kv_heads == 0
    assert heads.head_dim in (64, 128)


@STRUCTURE
@given(requests(ids=7, min_length=2, max_length=9))
def test_requests_respect_bounds(request_: Request) -> None:
    assert request_.id == 7
    assert 2 <= request_.length <= 9
    assert not request_.padding


@STRUCTURE
@given(workloads(max_requests=5, max_length=20, dtypes=("float16", "bfloat16")))
def test_workloads_have_ids_0_to_n(wl: Workload) -> None:
    assert [r.id for r in wl.requests] == list(range(len(wl.requests)))
    assert 1 <= len(wl.requests) <= 5
    assert all(1 <= r.length <= 20 for r in wl.requests)
    assert str(wl.dtype) in ("torch.float16", "torch.bfloat16")


@STRUCTURE
@given(page_layouts(max_page_size=5, fills=("zeros", "nan")))
def test_page_layouts_respect_bounds(layout: object) -> None:
    from invariance import PageLayout

    assert isinstance(layout, PageLayout)
    assert 1 <= layout.page_size <= 5


@STRUCTURE
@given(st.data())
def test_steps_chunks_fit_their_requests(data: st.DataObject) -> None:
    wl = data.draw(workloads(max_requests=4, max_length=12))
    step = data.draw(steps(wl, max_batch=3))
    ids = [c.request_id for c in step.chunks]
    assert 1 <= len(ids) <= 3
    assert len(set(ids)) == len(ids)
    for c in step.chunks:
        assert 0 <= c.start < c.stop <= wl.request(c.request_id).length


@STRUCTURE
@given(st.data())
def test_schedules_compute_every_token_once(data: st.DataObject) -> None:
    wl = data.draw(workloads(max_requests=3, max_length=16))
    schedule = data.draw(schedules(wl, max_steps=3))
    assert 1 <= len(schedule.steps) <= 3
    assert tokens(schedule) == Counter((r.id, t) for r in wl.requests for t in range(r.length))
    # Each step is a valid attention batch.
    for step in schedule.steps:
        materialize(wl, step, schedule.layout, "cpu").validate()


@STRUCTURE
@given(schedule_pairs(max_requests=3, max_length=16))
def test_schedule_pairs_cover_the_same_tokens_differently(pair: SchedulePair) -> None:
    assert pair.a != pair.b
    assert tokens(pair.a) == tokens(pair.b)
    assert set(tokens(pair.a).values()) == {1}


@STRUCTURE
@given(schedule_pairs(workloads(max_requests=2, max_length=8), decode_only=True))
def test_schedule_pairs_from_a_workload_strategy(pair: SchedulePair) -> None:
    assert tokens(pair.a) == tokens(pair.b) == Counter(
        (r.id, r.length - 1) for r in pair.workload.requests)


@BACKEND
@given(pair=schedule_pairs(max_requests=3, max_length=40))
def test_reference_backend_is_invariant_on_any_pair(pair: SchedulePair) -> None:
    replay("reference", pair.workload, pair.a, pair.b, device="cpu")


def test_batch_variant_failure_shrinks_to_a_small_batch() -> None:
    """The control backend fails and hypothesis shrinks its counterexample to a handful of short
    requests, small batches, few steps, contiguous pages of size 1, seed 0.

    Derandomised, so that it is reproducible: from some starting points shrinking stops in a
    local minimum (e.g. 5 one-token neighbours of a 26-token request, since dropping a
    neighbour would need a longer request to keep failing), still small but above the bound.
    """
    backend = resolve("torch-batch-variant")

    def disagrees(pair: SchedulePair) -> bool:
        try:
            pair.replay(backend, device="cpu")
        except AssertionError:
            return True
        return False

    pair = find(
        schedule_pairs(max_requests=6, max_length=48, heads=HeadConfig(2, 1, 64)), disagrees,
        settings=settings(max_examples=200, deadline=None, database=None, derandomize=True),
    )
    batches = [step.batch_size for s in (pair.a, pair.b) for step in s.steps]
    assert max(batches) <= 3, pair
    assert len(pair.workload.requests) <= 3, pair
    assert max(len(pair.a.steps), len(pair.b.steps)) <= 3, pair
    assert all(r.length <= 48 for r in pair.workload.requests)
    assert pair.workload.seed == 0
    assert pair.a.layout.page_size == 1 or pair.b.layout.page_size == 1
    # The shrunk pair still fails, and its repr is a reproducer.
    with pytest.raises(AssertionError, match="schedules disagree"):
        pair.replay(backend)
    assert "Workload(requests=(Request(id=0" in repr(pair)
