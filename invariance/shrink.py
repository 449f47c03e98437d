"""Shrinking a failing case to the smallest pair of schedules that still disagrees.

A violation is about one *focus* request. Shrinking keeps a change only while the focus request
still differs between the two schedules, or within one of them (a row it computed twice, in two
steps or for two requests with one prompt, with two results: :func:`invariance.compare_outputs`).
Such a difference first becomes a case of its own: the two steps that computed the row, each a
schedule. Then four passes:

1. **Requests**: the fewest other requests (in id order) that still fail are found by
   bisection (a trigger that counts requests, such as a batch size threshold, needs a few
   tries, not one per request); then other requests are removed from one schedule at a time
   (halves first, then one by one while few remain); a request that only one schedule needs
   (a neighbour, a padding request) is removed from that schedule alone.
2. **Steps**: steps are removed one at a time, each schedule keeping at least one.
3. **KV lengths**: each request is cut shorter in both schedules (its chunks end at a new
   length, halving while the disagreement persists); the focus request never below its first
   differing token.
4. **Chunks**: each chunk computing several query tokens is cut to its last one (other
   requests) or to the tokens from the first differing one (the focus request); the KV a chunk
   sees is unchanged, only the query rows it computes shrink.

The budget of backend runs is explicit (``max_tries`` plus two per request of the case: a case
of many requests may need one try per request) and the result says whether it ran out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field, replace

import torch

from invariance.compare import compare_outputs
from invariance.perturb import Case
from invariance.schedule import Chunk, Schedule, Step, run_schedule

__all__ = ["ShrinkResult", "shrink"]

#: Backend runs (pairs of schedules) a shrink may spend.
DEFAULT_MAX_TRIES = 100


@dataclass(frozen=True)
class ShrinkResult:
    """The smallest failing case found; ``tries`` runs were spent; ``exhausted`` says the budget
    ran out before no further change helped."""

    case: Case
    shrunk: bool
    tries: int
    exhausted: bool


def _requests(schedule: Schedule) -> list[int]:
    return sorted({c.request_id for st in schedule.steps for c in st.chunks})


def _map_chunks(schedule: Schedule, f: Callable[[Chunk], Chunk | None]) -> Schedule:
    """``schedule`` with every chunk replaced by ``f(chunk)`` (``None`` drops it; a step left
    without chunks is dropped)."""
    steps = []
    for step in schedule.steps:
        chunks = tuple(c for c in (f(c) for c in step.chunks) if c is not None)
        if chunks:
            steps.append(Step(chunks))
    return replace(schedule, steps=tuple(steps), label="")


def _without(schedule: Schedule, drop: AbstractSet[int]) -> Schedule:
    return _map_chunks(schedule, lambda c: None if c.request_id in drop else c)


def _cut(schedule: Schedule, request: int, length: int) -> Schedule:
    """Request ``request`` cut to its first ``length`` tokens, keeping its chunks' kinds: a chunk
    that ends past ``length`` ends there; the first chunk entirely past it moves to end at
    ``length`` (a decode neighbour stays a decode, of an earlier token) unless an earlier chunk
    already reaches it; later ones are dropped. A chunk without query tokens keeps its slot."""
    reached = 0  # the furthest stop of the request's chunks kept so far

    def cut(c: Chunk) -> Chunk | None:
        nonlocal reached
        if c.request_id != request:
            return c
        if c.q_len == 0:
            return Chunk(request, min(c.start, length), min(c.stop, length))
        if c.stop <= length:
            out = c
        elif c.start < length:
            out = Chunk(request, c.start, length)
        elif reached < length:
            out = Chunk(request, max(reached, length - c.q_len), length)
        else:
            return None
        reached = max(reached, out.stop)
        return out
    return _map_chunks(schedule, cut)


def _trim(schedule: Schedule, target: Chunk, start: int) -> Schedule:
    """``schedule`` with the first chunk equal to ``target`` starting at ``start`` instead."""
    done = False

    def trim(c: Chunk) -> Chunk:
        nonlocal done
        if done or c != target:
            return c
        done = True
        return Chunk(c.request_id, start, c.stop)
    return _map_chunks(schedule, trim)


def _lengths(case: Case) -> dict[int, int]:
    """Each request's furthest chunk stop over both schedules: the tokens the case reads."""
    out: dict[int, int] = {}
    for s in (case.a, case.b):
        for st in s.steps:
            for c in st.chunks:
                out[c.request_id] = max(out.get(c.request_id, 0), c.stop)
    return out


def _prune_workload(case: Case) -> Case:
    """Keep the requests the schedules use and the prompt-prefix parents their content needs,
    each only as long as its chunks (and its children's shared prefixes) read."""
    wl = case.workload
    need = _lengths(case)
    parents = {r.id: r.prefix for r in wl.requests if r.prefix is not None}
    todo = list(need)
    while todo:
        child = todo.pop()
        if child not in parents:
            continue
        parent, n = parents[child]  # type: ignore[misc]
        reads = n  # the child's content reads parent[0, n) (the child request keeps >= n, below)
        if need.get(parent, -1) < reads:
            need[parent] = reads
            todo.append(parent)
    requests = []
    for r in wl.requests:
        if r.id not in need:
            continue
        length = max(need[r.id], r.prefix[1] if r.prefix is not None else 0)
        requests.append(replace(r, length=min(r.length, length)))
    return replace(case, workload=replace(wl, requests=tuple(requests)))


def _focus_steps(schedule: Schedule, focus: int) -> Schedule:
    """Only the steps that compute tokens of ``focus`` (every step materialises its whole KV
    from the requests' content, so steps are independent)."""
    steps = tuple(st for st in schedule.steps
                  if any(c.request_id == focus and c.q_len for c in st.chunks))
    return replace(schedule, steps=steps, label="")


@dataclass
class _Shrinker:
    """One shrink in progress: ``case`` is the current failing case (a kept candidate replaces
    it), ``tries`` the runs spent, ``first_diff`` the focus request's first differing token in
    the last failing run and ``within`` where it lay when it was a row computed twice within
    one schedule, as ``(schedule, step, step)``. The passes are generators of candidates made
    lazily from the current ``case``: each looks at ``case`` after a yield to learn whether
    its candidate was kept."""

    backend: Callable[..., object]
    case: Case
    focus: int
    device: torch.device
    first_diff: int = 0
    within: tuple[str, int, int] | None = None
    tries: int = 0
    # Request content is a function of the workload, which stays the same until the end: one
    # cache for every try.
    cache: dict[tuple[int, str], torch.Tensor] = field(default_factory=dict)

    def still_fails(self, candidate: Case) -> bool:
        """Run ``candidate``'s two schedules; whether the focus request still differs (and
        where, in :attr:`first_diff` and :attr:`within`)."""
        self.tries += 1
        if not candidate.a.steps or not candidate.b.steps:
            return False
        run = run_schedule
        cmp = compare_outputs(
            run(self.backend, candidate.workload, candidate.a, self.device, self.cache),
            run(self.backend, candidate.workload, candidate.b, self.device, self.cache),
            request=self.focus)
        token = cmp.first_differing_token(self.focus)
        if token is not None:
            self.first_diff = token
            row = cmp.differing_rows[0]
            side = cmp.within(row)
            (_, s1), (_, s2) = cmp.sources[row]
            self.within = (side, s1, s2) if side is not None else None
        return token is not None

    def attempts(self) -> Iterator[Case]:
        """Every pass's candidates, in the module docstring's order."""
        yield from self.remove_requests()
        yield from self.remove_steps()
        yield from self.shorten()
        yield from self.trim_chunks()

    def remove_steps(self) -> Iterator[Case]:
        """Steps left holding only what another step computes too (the focus alone, once its
        neighbours are gone): each schedule keeps at least one."""
        for side in ("a", "b"):
            k = 0
            while len(getattr(self.case, side).steps) > 1 and k < len(getattr(self.case,
                                                                                side).steps):
                own: Schedule = getattr(self.case, side)
                fewer = replace(own, steps=own.steps[:k] + own.steps[k + 1:])
                before = self.case
                yield replace(before, a=fewer) if side == "a" else replace(before, b=fewer)
                if self.case is before:
                    k += 1

    def remove_requests(self) -> Iterator[Case]:
        """Bisection on how many other requests are kept, then groups of them from one or both
        schedules. Candidates already run are not run again (delta debugging's cache, keyed on
        the candidate's requests per schedule; lengths do not change in this pass): a batch
        needing many requests would otherwise spend its budget re-trying them."""
        tried: set[tuple[frozenset[int], frozenset[int]]] = set()
        yield from self._bisect_requests(tried)
        yield from self._remove_groups(tried)

    def _bisect_requests(self, tried: set[tuple[frozenset[int], frozenset[int]]]
                         ) -> Iterator[Case]:
        """Bisection on how many of the other requests (by id) are kept, from both schedules."""
        case = self.case
        others = sorted((set(_requests(case.a)) | set(_requests(case.b))) - {self.focus})
        lo, hi = 0, len(others)  # keeping others[:hi] fails
        while lo < hi:
            mid = (lo + hi) // 2
            drop = frozenset(others[mid:hi])
            before = self.case
            candidate = replace(before, a=_without(before.a, drop), b=_without(before.b, drop))
            tried.add((frozenset(_requests(candidate.a)), frozenset(_requests(candidate.b))))
            yield candidate
            if self.case is not before:
                hi = mid
            else:
                lo = mid + 1

    def _remove_groups(self, tried: set[tuple[frozenset[int], frozenset[int]]]
                       ) -> Iterator[Case]:
        """Groups of other requests (halves, down to single ones while few remain) from both
        schedules, then from each alone. Requests whose removal from both schedules, alone,
        made the case pass are not tried again after another side's progress (which hardly
        ever frees them)."""
        needed: set[int] = set()
        progressed = True
        while progressed:
            progressed = False
            for side in ("both", "a", "b"):
                # A request in one schedule only was already tried under "both".
                in_a, in_b = set(_requests(self.case.a)), set(_requests(self.case.b))
                others = sorted((in_a | in_b if side == "both" else in_a & in_b) - {self.focus})
                if side == "both":
                    others = [r for r in others if r not in needed]
                size = max(1, len(others) // 2)
                # Groups of one only among a few: many requests of which no eighth can go are
                # a batch the trigger needs whole (a batch size), not worth one try each.
                smallest = max(1, len(others) // 8)
                while others:
                    i, removed = 0, False
                    while i < len(others):
                        group = frozenset(others[i:i + size])
                        before = self.case
                        new_a = _without(before.a, group) if side in ("both", "a") else before.a
                        new_b = _without(before.b, group) if side in ("both", "b") else before.b
                        key = (frozenset(_requests(new_a)), frozenset(_requests(new_b)))
                        if key in tried:
                            i += size
                            continue
                        tried.add(key)
                        yield replace(before, a=new_a, b=new_b)
                        if self.case is not before:  # kept
                            removed = progressed = True
                            others = [r for r in others if r not in group]
                        else:
                            if size == 1 and side == "both":
                                needed |= group
                            i += size
                    if not removed:
                        if size <= smallest:
                            break
                        size = (size + 1) // 2  # 3 -> 2 -> 1: pairs too (a slot's parity)

    def shorten(self) -> Iterator[Case]:
        """Every other request halved at once while that still fails; then each request (the
        focus first) cut on its own."""
        while True:
            lengths = _lengths(self.case)
            cuts = {r: n // 2 for r, n in lengths.items() if r != self.focus and n > 1}
            if not cuts:
                break
            before = self.case
            a, b = before.a, before.b
            for r, n in cuts.items():
                a, b = _cut(a, r, n), _cut(b, r, n)
            yield replace(before, a=a, b=b)
            if self.case is before:
                break
        for rid in [self.focus, *sorted(set(_lengths(self.case)) - {self.focus})]:
            yield from self._shorten_one(rid)

    def _cut_both(self, rid: int, length: int) -> Case:
        return replace(self.case, a=_cut(self.case.a, rid, length),
                       b=_cut(self.case.b, rid, length))

    def _shorten_one(self, rid: int) -> Iterator[Case]:
        """Request ``rid`` halved while that still fails; the focus cut once, to just past its
        first differing token (or halfway there when that passes)."""
        focus = rid == self.focus
        while True:
            length = _lengths(self.case).get(rid, 0)
            new = self.first_diff + 1 if focus else max(1, length // 2)
            if new >= length:
                return
            before = self.case
            yield self._cut_both(rid, new)
            if self.case is before:
                if focus and new < length - 1:  # the tight cut failed: try halfway
                    half = (new + length) // 2
                    before = self.case
                    yield self._cut_both(rid, half)
                    if self.case is not before:
                        continue
                return
            if focus:
                return

    def trim_chunks(self) -> Iterator[Case]:
        """Chunks of several query tokens cut to their last one (other requests) or to the
        tokens from the first differing one (the focus)."""
        for side in ("a", "b"):
            for chunk in [c for st in getattr(self.case, side).steps for c in st.chunks
                          if c.q_len > 1]:
                start = (max(chunk.start, min(self.first_diff, chunk.stop - 1))
                         if chunk.request_id == self.focus else chunk.stop - 1)
                if start <= chunk.start:
                    continue
                own = _trim(getattr(self.case, side), chunk, start)
                yield replace(self.case, a=own) if side == "a" else replace(self.case, b=own)


def shrink(backend: Callable[..., object], case: Case, focus: int, device: torch.device,
           max_tries: int = DEFAULT_MAX_TRIES, first_token: int | None = None,
           repeated: tuple[str, int, int] | None = None) -> ShrinkResult:
    """Shrink ``case`` while ``focus`` still differs between its schedules, or within one of
    them (module docstring): steps without ``focus`` first (one try); a row computed twice
    within one schedule that differs: the two steps that computed it, each a schedule of its
    own (one try); then requests, KV lengths and chunks.

    ``max_tries``: runs of the pair of schedules, plus two per request of ``case``.
    ``first_token``: the focus request's first differing token in ``case``, when the caller has
    compared it already (else one more run finds it); ``repeated``: when that first difference
    is a row computed twice within schedule ``side``, ``(side, step, step)``."""
    state = _Shrinker(backend, case, focus, device, first_diff=first_token or 0,
                      within=repeated)
    shrunk = False
    candidate = replace(case, a=_focus_steps(case.a, focus), b=_focus_steps(case.b, focus))
    fewer = (len(candidate.a.steps), len(candidate.b.steps)) != (len(case.a.steps),
                                                                 len(case.b.steps))
    if fewer and state.still_fails(candidate):
        state.case, shrunk = candidate, True
    elif first_token is None:
        state.still_fails(case)  # where the original case differs
    if state.within is not None:
        # One row computed twice within one schedule differs: the two steps that computed it,
        # as schedules of their own, disagree (one step: it disagrees with itself).
        side, s1, s2 = state.within
        now = state.case
        own: Schedule = getattr(now, side)
        candidate = replace(now, a=replace(own, steps=(own.steps[s1],), label=""),
                            b=replace(own, steps=(own.steps[s2],), label=""))
        if candidate != now and state.still_fails(candidate):
            state.case, shrunk = candidate, True
    budget = max_tries + 2 * len(set(_requests(state.case.a)) | set(_requests(state.case.b)))
    exhausted = False
    for candidate in state.attempts():
        if state.tries >= budget:
            exhausted = True
            break
        if state.still_fails(candidate):
            state.case, shrunk = candidate, True
    case = state.case
    return ShrinkResult(_prune_workload(case) if shrunk else case, shrunk, state.tries, exhausted)
