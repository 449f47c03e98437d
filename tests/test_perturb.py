"""The perturbation catalogue generates meaningful, reproducible schedule pairs."""

from __future__ import annotations

import pytest
import torch

from invariance import PERTURBATIONS, SCALES, HeadConfig
from invariance.perturb import resolve_perturbations

SMALL = SCALES["small"]


def _cases(name: str, budget: int = 2, seed: int = 0) -> list[object]:
    return list(PERTURBATIONS[name].cases(scale=SMALL, heads=HeadConfig(), dtype=torch.float32,
                                          seed=seed, budget=budget))


def _computed(schedule: object) -> set[tuple[int, int]]:
    return {(c.request_id, t) for st in schedule.steps for c in st.chunks  # type: ignore[attr-defined]
            for t in range(c.start, c.stop)}


@pytest.mark.parametrize("name", sorted(PERTURBATIONS))
def test_every_pair_shares_tokens_and_is_described(name: str) -> None:
    cases = _cases(name)
    assert len(cases) == 2 * PERTURBATIONS[name].cases_per_budget
    for case in cases:
        shared = _computed(case.a) & _computed(case.b)  # type: ignore[attr-defined]
        assert shared, f"{name}: schedules share no token"
        assert {r for r, _ in shared} >= set(case.focus)  # type: ignore[attr-defined]
        assert case.a.describe() and case.b.describe()  # type: ignore[attr-defined]
    assert PERTURBATIONS[name].description


@pytest.mark.parametrize("name", sorted(PERTURBATIONS))
def test_cases_are_reproducible(name: str) -> None:
    assert _cases(name, seed=4) == _cases(name, seed=4)
    assert _cases(name, seed=4) != _cases(name, seed=5)


def test_neighbors_includes_the_hostile_cases() -> None:
    cases = _cases("neighbors", budget=6)
    longest = [max(r.length for r in c.workload.requests) for c in cases]  # type: ignore[attr-defined]
    assert SMALL.long in longest
    sizes = {c.b.steps[0].batch_size for c in cases}  # type: ignore[attr-defined]
    assert max(sizes) == SMALL.batch_sizes[-1]
    # one long neighbour next to many short ones
    assert any(c.b.steps[0].batch_size == SMALL.batch_sizes[-1]  # type: ignore[attr-defined]
               and max(r.length for r in c.workload.requests) == SMALL.long  # type: ignore[attr-defined]
               for c in cases)


def test_mixed_puts_prefill_next_to_decode() -> None:
    for case in _cases("mixed", budget=3):
        a_q = [c.q_len for c in case.a.steps[0].chunks]  # type: ignore[attr-defined]
        b_q = [c.q_len for c in case.b.steps[0].chunks]  # type: ignore[attr-defined]
        assert max(b_q) > 1  # a prefill chunk is in the mixed batch
        assert a_q != b_q


def test_large_scale_reaches_production_sizes() -> None:
    large = SCALES["large"]
    assert large.long == 32768 and {16, 17, 256, 257} <= set(large.ladder)


def test_resolve_perturbations() -> None:
    assert len(resolve_perturbations("all")) == len(PERTURBATIONS)
    assert [p.name for p in resolve_perturbations("order,repeat")] == ["order", "repeat"]
    with pytest.raises(ValueError, match="unknown name"):
        resolve_perturbations(["nope"])
