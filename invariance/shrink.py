"""Shrinking a failing case to the smallest pair of schedules that still disagrees.

A violation is about one *focus* request. Other requests are removed from one schedule at a time
(halves first, then one by one) while the focus request still differs; a request that only one
schedule needs (a neighbour, a padding request) is removed from that schedule alone. The budget
of backend runs is explicit and the result says whether it ran out.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from invariance.compare import compare_outputs
from invariance.perturb import Case
from invariance.schedule import Schedule, Step, run_schedule

__all__ = ["ShrinkResult", "shrink"]

#: Backend runs (pairs of schedules) a shrink may spend.
DEFAULT_MAX_TRIES = 40


@dataclass(frozen=True)
class ShrinkResult:
    """The smallest failing case found; ``tries`` runs were spent; ``exhausted`` says the budget
    ran out before no further removal helped."""

    case: Case
    shrunk: bool
    tries: int
    exhausted: bool


def _requests(schedule: Schedule) -> list[int]:
    return sorted({c.request_id for st in schedule.steps for c in st.chunks})


def _without(schedule: Schedule, drop: set[int]) -> Schedule:
    steps = []
    for step in schedule.steps:
        chunks = tuple(c for c in step.chunks if c.request_id not in drop)
        if chunks:
            steps.append(Step(chunks))
    return replace(schedule, steps=tuple(steps), label="")


def _prune_workload(case: Case) -> Case:
    """Keep the requests the schedules use and the prompt-prefix parents their content needs."""
    used = set(_requests(case.a)) | set(_requests(case.b))
    wl = case.workload
    parents = {r.id: r.prefix[0] for r in wl.requests if r.prefix is not None}
    todo = list(used)
    while todo:
        parent = parents.get(todo.pop())
        if parent is not None and parent not in used:
            used.add(parent)
            todo.append(parent)
    return replace(case, workload=replace(
        wl, requests=tuple(r for r in wl.requests if r.id in used)))


def _focus_steps(schedule: Schedule, focus: int) -> Schedule:
    """Only the steps that compute tokens of ``focus`` (every step materialises its whole KV
    from the requests' content, so steps are independent)."""
    steps = tuple(st for st in schedule.steps
                  if any(c.request_id == focus and c.q_len for c in st.chunks))
    return replace(schedule, steps=steps, label="")


def shrink(backend: Callable[..., object], case: Case, focus: int, device: torch.device,
           max_tries: int = DEFAULT_MAX_TRIES) -> ShrinkResult:
    """Remove steps and requests other than ``focus``'s while ``focus`` still differs between
    the schedules.

    First every step that computes no token of ``focus`` goes (one try); then each pass tries,
    for both sides and for each side alone, groups of other requests (halving the group size
    down to one); a removal is kept when the focus request still differs."""
    tries = 0
    shrunk = False

    def still_fails(candidate: Case) -> bool:
        nonlocal tries
        tries += 1
        if not candidate.a.steps or not candidate.b.steps:
            return False
        cache: dict[tuple[int, str], torch.Tensor] = {}
        cmp = compare_outputs(run_schedule(backend, candidate.workload, candidate.a, device, cache),
                              run_schedule(backend, candidate.workload, candidate.b, device, cache))
        return bool(cmp.differing_keys(focus))

    candidate = replace(case, a=_focus_steps(case.a, focus), b=_focus_steps(case.b, focus))
    fewer = (len(candidate.a.steps), len(candidate.b.steps)) != (len(case.a.steps),
                                                                 len(case.b.steps))
    if fewer and still_fails(candidate):
        case, shrunk = candidate, True
    progressed = True
    while progressed and tries < max_tries:
        progressed = False
        for side in ("both", "a", "b"):
            others = sorted(
                (set(_requests(case.a)) | set(_requests(case.b)) if side == "both"
                 else set(_requests(getattr(case, side)))) - {focus})
            size = max(1, len(others) // 2)
            while others and tries < max_tries:
                i, removed = 0, False
                while i < len(others) and tries < max_tries:
                    group = set(others[i:i + size])
                    a = _without(case.a, group) if side in ("both", "a") else case.a
                    b = _without(case.b, group) if side in ("both", "b") else case.b
                    candidate = replace(case, a=a, b=b)
                    if still_fails(candidate):
                        case, shrunk, removed, progressed = candidate, True, True, True
                        others = [r for r in others if r not in group]
                    else:
                        i += size
                if not removed:
                    if size == 1:
                        break
                    size = max(1, size // 2)
    exhausted = tries >= max_tries
    return ShrinkResult(_prune_workload(case) if shrunk else case, shrunk, tries, exhausted)
