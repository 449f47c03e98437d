"""The perturbation catalogue generates meaningful, reproducible schedule pairs."""

from __future__ import annotations

import pytest
import torch

from invariance import PERTURBATIONS, SCALES, HeadConfig, Step, materialize
from invariance.perturb import Case, Scale, resolve_perturbations

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
        # Every request the case is about has rows compared: across the schedules, or within
        # one (computed in two of its calls).
        compared = {rid for occ in _occurrences(case).values()  # type: ignore[arg-type]
                    if len(occ) > 1 for _, _, _, rid in occ}
        assert compared >= set(case.focus)  # type: ignore[attr-defined]
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


# --- coverage by construction --------------------------------------------------------------

def _occurrences(case: Case) -> dict[tuple[int, int], list[tuple[str, int, Step, int]]]:
    """Every row's occurrences by origin: (schedule, step index, step, request)."""
    wl = case.workload
    out: dict[tuple[int, int], list[tuple[str, int, Step, int]]] = {}
    for side in ("a", "b"):
        schedule = getattr(case, side)
        padding = schedule.padding_ids(wl)
        for i, st in enumerate(schedule.steps):
            for c in st.chunks:
                if c.request_id in padding:
                    continue
                for t in range(c.start, c.stop):
                    out.setdefault(wl.origin(c.request_id, t), []).append(
                        (side, i, st, c.request_id))
    return out


def _compared_steps(case: Case) -> list[Step]:
    """The steps holding a row that is compared (computed at least twice in the case)."""
    seen: dict[int, Step] = {}
    for occ in _occurrences(case).values():
        if len(occ) > 1:
            for _, _, st, _ in occ:
                seen[id(st)] = st
    return list(seen.values())


def _all_cases(scale: Scale, seed: int = 0) -> list[Case]:
    return [c for p in PERTURBATIONS.values() if not p.requires_cuda
            for c in p.cases(scale=scale, heads=HeadConfig(), dtype=torch.float32, seed=seed,
                             budget=1)]


@pytest.mark.parametrize("scale", [SMALL, SCALES["large"]], ids=["small", "large"])
def test_every_batch_size_is_compared_at_the_default_budget(scale: Scale) -> None:
    cases = list(PERTURBATIONS["batch_size"].cases(scale=scale, heads=HeadConfig(),
                                                   dtype=torch.float32, seed=3, budget=1))
    sizes = {st.batch_size for case in cases for st in _compared_steps(case)}
    wanted = set(range(1, scale.dense_batch + 1)) | set(scale.batch_thresholds)
    assert wanted <= sizes
    assert max(scale.batch_thresholds) > (64 if scale.name == "small" else 512)
    # Every compared row is computed in batches of at least two sizes, and each size's rows
    # are compared with rows in calls of another size: a switch at any size shows.
    for case in cases:
        for occ in _occurrences(case).values():
            if len(occ) > 1:
                assert len({st.batch_size for _, _, st, _ in occ}) > 1


def test_calls_cross_every_power_of_two_of_kv_and_query_tokens() -> None:
    for scale in (SMALL, SCALES["large"], SMALL.for_split(1024)):
        cases = list(PERTURBATIONS["call_totals"].cases(scale=scale, heads=HeadConfig(),
                                                        dtype=torch.float32, seed=1, budget=1))
        steps = [st for case in cases for st in _compared_steps(case)]
        kv = {sum(c.stop for c in st.chunks) for st in steps}
        q = {st.num_tokens for st in steps}
        top_kv = scale.max_call_kv.bit_length() - 1
        top_q = scale.max_call_tokens.bit_length() - 1
        assert {(1 << k) + 1 for k in range(top_kv - 4, top_kv + 1)} <= kv, scale
        assert {(1 << k) + 1 for k in range(top_q - 3, top_q + 1)} <= q, scale
        # The largest calls hold several long requests, compared.
        longest = max(steps, key=lambda st: sum(c.stop for c in st.chunks))
        assert sum(c.stop >= scale.long // 2 for c in longest.chunks) >= 2


def test_a_call_where_every_request_shares_the_prompt_pages() -> None:
    for index, case in enumerate(_cases("prefix_sharing", budget=4)):
        if index % 2:
            continue
        wl = case.workload  # type: ignore[attr-defined]
        (step,) = case.b.steps  # type: ignore[attr-defined]
        assert case.b.layout.share_prefix and not case.a.layout.share_prefix  # type: ignore[attr-defined]
        roots = {wl.origin(c.request_id, 0)[0] for c in step.chunks}
        assert len(roots) == 1 and step.batch_size >= 3  # one prompt under every request
        batch = materialize(wl, step, case.b.layout, "cpu")  # type: ignore[attr-defined]
        assert len(set(batch.block_table[:, 0].tolist())) == 1
        # a: the same requests next to an unrelated one, on private pages.
        assert case.a.steps[0].batch_size == step.batch_size + 1  # type: ignore[attr-defined]
        prefix = max(r.prefix[1] for r in wl.requests if r.prefix)
        partial = prefix % SMALL.page_size != 0
        assert partial == (index // 2 % 2 == 0)  # full pages and a partly filled one, by turns


def test_lockstep_groups_of_identical_requests() -> None:
    for case in _cases("lockstep", budget=2):
        groups = case.a.steps  # type: ignore[attr-defined]
        assert sorted(st.batch_size for st in groups) == sorted(SMALL.lockstep)
        for st in groups:
            assert len({(c.q_len, c.stop) for c in st.chunks}) == 1  # lock-step
        for st in case.b.steps:  # type: ignore[attr-defined]
            assert len({(c.q_len, c.stop) for c in st.chunks}) > 1
        origins = _occurrences(case)
        assert any(len(occ) > 2 and {s for s, _, _, _ in occ} == {"a", "b"}
                   for occ in origins.values())  # copies: one row, computed many times


@pytest.mark.parametrize(("split", "edges"), [(1024, [1024, 2048]), (256, [256, 512, 1024]),
                                              (None, [64, 128, 1024])])
def test_spec_verify_windows_straddle_split_boundaries(split: int | None,
                                                      edges: list[int]) -> None:
    """Rows on both sides of several split boundaries (the first two and the last below the
    longest request; powers of two for a backend that declares no split)."""
    scale = SMALL.for_split(split)
    case = next(iter(PERTURBATIONS["spec_verify"].cases(
        scale=scale, heads=HeadConfig(), dtype=torch.float32, seed=0, budget=1)))
    rows = {c.stop for st in case.b.steps for c in st.chunks}
    assert rows == {kv for edge in edges for kv in (edge, edge + 1)}
    # No step computes a long prompt the other schedule computes too (it proved nothing and
    # cost minutes under the Triton interpreter): only the draft windows and decodes.
    assert max(st.num_tokens for s in (case.a, case.b) for st in s.steps) <= 16


def test_longest_request_is_compared_in_one_case_per_budget_unit() -> None:
    for name in ("neighbors", "paging", "repeat", "call_totals"):
        cases = _cases(name, budget=2)
        per = PERTURBATIONS[name].cases_per_budget
        longest = [max(r.length for r in c.workload.requests) >= SMALL.long  # type: ignore[attr-defined]
                   for c in cases]
        assert longest[0] and longest[per], name
