"""Hypothesis strategies for workloads and schedules, to write your own invariance properties.

The central one is :func:`schedule_pairs`: a workload and two different schedules that compute
the same (request, token) pairs (other batch compositions, orders, chunkings, page layouts). An
invariant backend gives identical bits for every one of them::

    from hypothesis import given, settings
    from invariance import replay
    from invariance.strategies import schedule_pairs

    @settings(max_examples=25, deadline=None)
    @given(pair=schedule_pairs())
    def test_my_backend_is_batch_invariant(pair):
        replay(my_backend, pair.workload, pair.a, pair.b, device="cpu")

Every size is drawn with a small lower bound, so that hypothesis shrinks a failure towards few
requests, short requests, small batches, one step, contiguous pages of size 1, seed 0: the
falsifying example it prints is a reproducer (its ``repr`` is Python code).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from hypothesis import strategies as st

from invariance.compare import CaseComparison
from invariance.replay import replay
from invariance.schedule import Chunk, PageLayout, Schedule, Step
from invariance.workload import HeadConfig, Request, Workload, parse_dtype

__all__ = [
    "PLACEMENTS",
    "SchedulePair",
    "head_configs",
    "page_layouts",
    "requests",
    "schedule_pairs",
    "schedules",
    "steps",
    "workloads",
]

#: Page placements in shrinking order: hypothesis prefers the first.
PLACEMENTS = ("contiguous", "reversed", "shuffled", "interleaved")

_REQUEST_IDS = st.integers(0, 1 << 16)
_SEEDS = st.integers(0, (1 << 32) - 1)  # workload content seeds; shrink to 0


def _strategy(value: Any) -> st.SearchStrategy[Any]:
    """``value`` itself when it is a strategy, else a strategy that always gives ``value``."""
    return value if isinstance(value, st.SearchStrategy) else st.just(value)


@st.composite
def head_configs(
    draw: st.DrawFn,
    *,
    max_kv_heads: int = 2,
    max_group: int = 2,
    head_dims: Sequence[int] = (64, 128),
) -> HeadConfig:
    """Head configurations: ``1..max_kv_heads`` KV heads, each shared by ``1..max_group`` query
    heads (GQA), head size from ``head_dims`` (shrinks to the first).

    >>> head_configs().example()  # doctest: +SKIP
    HeadConfig(num_q_heads=4, num_kv_heads=2, head_dim=64)
    """
    kv = draw(st.integers(1, max_kv_heads))
    group = draw(st.integers(1, max_group))
    head_dim = draw(st.sampled_from(list(head_dims)))
    return HeadConfig(kv * group, kv, head_dim)


@st.composite
def requests(
    draw: st.DrawFn,
    *,
    ids: int | st.SearchStrategy[int] = _REQUEST_IDS,
    min_length: int = 1,
    max_length: int = 64,
    padding: bool | st.SearchStrategy[bool] = False,
) -> Request:
    """One :class:`Request` of ``min_length..max_length`` tokens (shrinks to ``min_length``).

    >>> requests(ids=0, max_length=8).example()  # doctest: +SKIP
    Request(id=0, length=5, padding=False)
    """
    return Request(draw(_strategy(ids)), draw(st.integers(min_length, max_length)),
                   draw(_strategy(padding)))


@st.composite
def workloads(
    draw: st.DrawFn,
    *,
    min_requests: int = 1,
    max_requests: int = 4,
    min_length: int = 1,
    max_length: int = 64,
    heads: HeadConfig | st.SearchStrategy[HeadConfig] | None = None,
    dtypes: Sequence[torch.dtype | str] = ("float32",),
    seeds: int | st.SearchStrategy[int] = _SEEDS,
) -> Workload:
    """A :class:`Workload` of ``min_requests..max_requests`` requests with ids ``0..n-1``, each
    of ``min_length..max_length`` tokens, heads from :func:`head_configs` unless given, a dtype
    from ``dtypes`` (shrinks to the first) and a content seed.

    >>> workloads(max_requests=2, max_length=8, heads=HeadConfig(2, 1, 64)).example()
    ... # doctest: +SKIP
    Workload(requests=(Request(id=0, length=3, padding=False), ...), ...)
    """
    n = draw(st.integers(min_requests, max_requests))
    reqs = tuple(draw(requests(ids=i, min_length=min_length, max_length=max_length))
                 for i in range(n))
    head_cfg = draw(head_configs() if heads is None else _strategy(heads))
    dtype = parse_dtype(draw(st.sampled_from(list(dtypes))))
    return Workload(reqs, head_cfg, dtype, draw(_strategy(seeds)))


@st.composite
def page_layouts(
    draw: st.DrawFn,
    *,
    max_page_size: int = 16,
    placements: Sequence[str] = PLACEMENTS,
    max_extra_pages: int = 4,
    max_extra_columns: int = 2,
    fills: Sequence[str] = ("zeros",),
) -> PageLayout:
    """A :class:`PageLayout`: page size ``1..max_page_size`` (shrinks to 1), a placement from
    ``placements`` (shrinks to ``contiguous``), ``0..max_extra_pages`` unused pages,
    ``0..max_extra_columns`` padded block-table columns, an unused-memory fill from ``fills``.

    >>> page_layouts(fills=("zeros", "nan")).example()  # doctest: +SKIP
    PageLayout(page_size=3, placement='shuffled', extra_pages=1, extra_columns=0, ...)
    """
    return PageLayout(
        page_size=draw(st.integers(1, max_page_size)),
        placement=draw(st.sampled_from(list(placements))),  # type: ignore[arg-type]
        extra_pages=draw(st.integers(0, max_extra_pages)),
        extra_columns=draw(st.integers(0, max_extra_columns)),
        fill=draw(st.sampled_from(list(fills))),  # type: ignore[arg-type]
        seed=draw(st.integers(0, 1 << 16)),
    )


def _compute(workload: Workload) -> dict[int, tuple[int, int]]:
    """Every token of every request that is not padding."""
    return {r.id: (0, r.length) for r in workload.requests if not r.padding and r.length}


@st.composite
def steps(
    draw: st.DrawFn,
    workload: Workload,
    *,
    min_batch: int = 1,
    max_batch: int | None = None,
) -> Step:
    """One :class:`Step` (attention call) over ``workload``: ``min_batch..max_batch`` distinct
    requests (default: all) in any order, each with a chunk ``[start, stop)`` of at least one
    query token (a request of length 0 gets an empty chunk). Shrinks to one request, one-token
    prefill.

    >>> wl = Workload((Request(0, 10), Request(1, 4)))
    >>> steps(wl).example()  # doctest: +SKIP
    Step(chunks=(Chunk(request_id=1, start=2, stop=4), Chunk(request_id=0, start=0, stop=7)))
    """
    ids = [r.id for r in workload.requests]
    if not ids:
        raise ValueError("steps: the workload has no request")
    hi = len(ids) if max_batch is None else min(max_batch, len(ids))
    picked = draw(st.lists(st.sampled_from(ids), min_size=min(min_batch, hi), max_size=hi,
                           unique=True))
    chunks = []
    for rid in picked:
        length = workload.request(rid).length
        if length == 0:
            chunks.append(Chunk(rid, 0, 0))
            continue
        stop = draw(st.integers(1, length))
        start = draw(st.integers(0, stop - 1))
        chunks.append(Chunk(rid, start, stop))
    return Step(tuple(chunks))


#: ``(step index, order key, chunk)``: where a chunk goes; a step sorts its chunks by
#: ``(key, request id)``.
_Placed = tuple[int, int, Chunk]


def _plan(draw: st.DrawFn, rid: int, start: int, stop: int, n_steps: int) -> list[_Placed]:
    """Cut query tokens ``[start, stop)`` of request ``rid`` into consecutive chunks placed in
    consecutive steps of ``n_steps``, with one order key for the request's place in its steps.

    Everything about the request is drawn here, in one block, so that hypothesis can delete a
    request whole while shrinking; it shrinks to one chunk in the first step, key 0.
    """
    if stop <= start:
        return []
    pieces = draw(st.integers(1, min(n_steps, stop - start)))
    cuts = sorted(draw(st.lists(st.integers(start + 1, stop - 1), min_size=pieces - 1,
                                max_size=pieces - 1, unique=True))) if pieces > 1 else []
    first = draw(st.integers(0, n_steps - pieces))
    key = draw(st.integers(0, 255))
    bounds = [start, *cuts, stop]
    return [(first + j, key, Chunk(rid, bounds[j], bounds[j + 1])) for j in range(pieces)]


def _assemble(draw: st.DrawFn, placed: list[_Placed],
              layouts: PageLayout | st.SearchStrategy[PageLayout] | None) -> Schedule:
    """Steps from placed chunks (empty steps dropped) and a drawn page layout."""
    slots: dict[int, list[tuple[int, Chunk]]] = {}
    for i, key, chunk in placed:
        slots.setdefault(i, []).append((key, chunk))
    step_list = [Step(tuple(c for _, c in sorted(slots[i], key=lambda kc: (kc[0],
                                                                           kc[1].request_id))))
                 for i in sorted(slots)]
    layout = draw(page_layouts() if layouts is None else _strategy(layouts))
    return Schedule(tuple(step_list), layout)


@st.composite
def schedules(
    draw: st.DrawFn,
    workload: Workload,
    *,
    compute: dict[int, tuple[int, int]] | None = None,
    max_steps: int = 3,
    layouts: PageLayout | st.SearchStrategy[PageLayout] | None = None,
) -> Schedule:
    """A :class:`Schedule` computing exactly the query tokens ``compute`` (request id ->
    ``(start, stop)``; default: every token of every non-padding request) once each.

    A request's tokens are cut into consecutive chunks placed in consecutive steps (as a server
    does chunked prefill), ``1..max_steps`` steps in all, each step's chunks in any order; the
    page layout comes from ``layouts`` (default :func:`page_layouts`). Shrinks to one step with
    the requests in order and contiguous pages of size 1.

    >>> wl = Workload((Request(0, 10), Request(1, 4)))
    >>> schedules(wl, max_steps=2).example()  # doctest: +SKIP
    Schedule(steps=(Step(chunks=(Chunk(request_id=0, start=0, stop=6),)), Step(...)), ...)
    """
    todo = _compute(workload) if compute is None else dict(compute)
    n_steps = draw(st.integers(1, max(1, max_steps)))
    placed = [p for rid, (start, stop) in todo.items()
              for p in _plan(draw, rid, start, stop, n_steps)]
    return _assemble(draw, placed, layouts)


_default_workloads = workloads  # ``schedule_pairs``' argument of the same name shadows it


@dataclass(frozen=True)
class SchedulePair:
    """A workload and two schedules computing the same (request, token) pairs."""

    workload: Workload
    a: Schedule
    b: Schedule

    def replay(self, backend: Any, *, device: str | torch.device = "cpu") -> CaseComparison:
        """:func:`invariance.replay` of this pair: ``AssertionError`` with the diff if any shared
        token differs."""
        return replay(backend, self.workload, self.a, self.b, device=device)

    def describe(self) -> str:
        return f"a: {self.a.describe()}\nb: {self.b.describe()}"


@dataclass(frozen=True)
class _RequestPlan:
    length: int
    start: int
    a: list[_Placed]  # chunks of request 0, renumbered when the workload is assembled
    b: list[_Placed]


@st.composite
def schedule_pairs(
    draw: st.DrawFn,
    workloads: Workload | st.SearchStrategy[Workload] | None = None,
    *,
    max_requests: int = 4,
    min_length: int = 1,
    max_length: int = 64,
    heads: HeadConfig | st.SearchStrategy[HeadConfig] | None = None,
    dtypes: Sequence[torch.dtype | str] = ("float32",),
    max_steps: int = 3,
    layouts: PageLayout | st.SearchStrategy[PageLayout] | None = None,
    decode_only: bool = False,
) -> SchedulePair:
    """A :class:`SchedulePair`: a workload and two different schedules (as :func:`schedules`
    draws them) over the same query tokens.

    Each request computes its tokens ``[start, length)`` for a drawn ``start`` (shrinks to 0, a
    whole prefill; ``decode_only`` computes only the last token). The two schedules differ in
    batch composition, order, chunking over ``1..max_steps`` steps and page layout; when the
    draws happen to coincide, ``b`` gets a page size one larger, so the pair is never the same
    schedule twice.

    By default the workload has ``1..max_requests`` requests of ``min_length..max_length``
    tokens, heads from ``heads`` (default :func:`head_configs`) and a dtype from ``dtypes``;
    everything about one request is drawn together, so that hypothesis can drop a request
    whole and failures shrink to the fewest, shortest requests. A ``workloads`` strategy (or
    workload) replaces that default (shrinking is then coarser).

    >>> @settings(max_examples=25, deadline=None)  # doctest: +SKIP
    ... @given(pair=schedule_pairs(max_requests=3, heads=HeadConfig(8, 2, 128)))
    ... def test_backend(pair):
    ...     pair.replay(my_backend, device="cpu")
    """
    if workloads is not None:
        wl = draw(_strategy(workloads))
        compute: dict[int, tuple[int, int]] = {}
        for r in wl.requests:
            if r.padding or r.length == 0:
                continue
            first = r.length - 1 if decode_only else draw(st.integers(0, r.length - 1))
            compute[r.id] = (first, r.length)
        a = draw(schedules(wl, compute=compute, max_steps=max_steps, layouts=layouts))
        b = draw(schedules(wl, compute=compute, max_steps=max_steps, layouts=layouts))
    else:
        head_cfg = draw(head_configs() if heads is None else _strategy(heads))
        dtype = parse_dtype(draw(st.sampled_from(list(dtypes))))
        seed = draw(_SEEDS)
        steps_a = draw(st.integers(1, max(1, max_steps)))
        steps_b = draw(st.integers(1, max(1, max_steps)))

        @st.composite
        def plan(d: st.DrawFn) -> _RequestPlan:
            length = d(st.integers(max(1, min_length), max(1, min_length, max_length)))
            first = length - 1 if decode_only else d(st.integers(0, length - 1))
            return _RequestPlan(length, first, _plan(d, 0, first, length, steps_a),
                                _plan(d, 0, first, length, steps_b))

        plans = draw(st.lists(plan(), min_size=1, max_size=max(1, max_requests)))
        wl = Workload(tuple(Request(i, p.length) for i, p in enumerate(plans)), head_cfg, dtype,
                      seed)
        a = _assemble(draw, [(s, k, replace(c, request_id=i)) for i, p in enumerate(plans)
                             for s, k, c in p.a], layouts)
        b = _assemble(draw, [(s, k, replace(c, request_id=i)) for i, p in enumerate(plans)
                             for s, k, c in p.b], layouts)
    if a == b:
        b = replace(b, layout=replace(b.layout, page_size=b.layout.page_size + 1))
    return SchedulePair(wl, a, b)
