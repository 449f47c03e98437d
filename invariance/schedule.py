"""Steps, schedules and page layouts; materialising a step into an :class:`AttentionBatch`.

A *step* is one attention call: an ordered tuple of chunks, each naming the query tokens
``[start, stop)`` of one request; the request's KV length in that call is ``stop`` (causal: the
chunk's tokens see every earlier token of their request). A *schedule* is an ordered tuple of
steps plus the page layout used to place KV in the paged cache. Materialising a step writes the
K/V of tokens ``[0, stop)`` of every chunk into freshly allocated physical pages, then builds the
query tensor and the index tensors.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Literal

import torch

from invariance.backends import planner
from invariance.batch import AttentionBatch, as_result
from invariance.workload import Workload

__all__ = [
    "Chunk",
    "PageLayout",
    "Schedule",
    "ScheduleOutput",
    "Step",
    "materialize",
    "run_schedule",
]

Placement = Literal["contiguous", "shuffled", "reversed", "interleaved"]
Fill = Literal["zeros", "nan"]


@dataclass(frozen=True)
class Chunk:
    """Query tokens ``[start, stop)`` of request ``request_id``; the call's KV length is ``stop``.

    ``start == stop`` is a request with no query token (it still occupies a batch slot).
    """

    request_id: int
    start: int
    stop: int

    def __post_init__(self) -> None:
        if not 0 <= self.start <= self.stop:
            raise ValueError(
                f"Chunk: expected 0 <= start <= stop, got start={self.start}, stop={self.stop}"
            )

    @property
    def q_len(self) -> int:
        return self.stop - self.start

    def describe(self) -> str:
        if self.q_len == 0:
            return f"request {self.request_id} with no query token (kv {self.stop})"
        if self.q_len == 1:
            kind = "decode" if self.start > 0 else "one-token prefill"
            return f"request {self.request_id} {kind} of token {self.start} (kv {self.stop})"
        return (f"request {self.request_id} prefill of tokens {self.start}..{self.stop - 1} "
                f"(kv {self.stop})")


@dataclass(frozen=True)
class Step:
    """One attention call: chunks in batch order."""

    chunks: tuple[Chunk, ...]

    @property
    def batch_size(self) -> int:
        return len(self.chunks)

    @property
    def num_tokens(self) -> int:
        return sum(c.q_len for c in self.chunks)


@dataclass(frozen=True)
class PageLayout:
    """How KV lands in the paged cache.

    - ``page_size``: tokens per page.
    - ``placement``: order of the physical pages handed out: ``contiguous`` (in order),
      ``shuffled`` (random permutation from ``seed``), ``reversed``, ``interleaved`` (requests'
      pages alternate, as in a fragmented cache).
    - ``extra_pages``: unused physical pages scattered among the used ones.
    - ``extra_columns``: unused block-table columns past the longest request (they point at a
      poisoned page when ``fill == "nan"``, at page 0 otherwise).
    - ``fill``: what unused cache slots (tails of last pages, extra pages) hold: ``zeros`` or
      ``nan`` (a kernel that reads them without masking then produces NaN or different bits).
    - ``share_prefix``: requests with a common prompt prefix (``Request.prefix``) read the same
      physical pages for it, as a prefix cache serves them: every full page of the prefix, and
      the partly filled last one for a request whose KV ends inside the prefix.
    """

    page_size: int = 16
    placement: Placement = "contiguous"
    extra_pages: int = 0
    extra_columns: int = 0
    fill: Fill = "zeros"
    seed: int = 0
    share_prefix: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.page_size, int) or self.page_size < 1:
            raise ValueError(f"PageLayout.page_size: expected an int >= 1, got {self.page_size!r}")
        if self.placement not in ("contiguous", "shuffled", "reversed", "interleaved"):
            raise ValueError(
                "PageLayout.placement: expected contiguous, shuffled, reversed or interleaved, "
                f"got {self.placement!r}"
            )
        if self.extra_pages < 0 or self.extra_columns < 0:
            raise ValueError("PageLayout: extra_pages and extra_columns must be >= 0")
        if self.fill not in ("zeros", "nan"):
            raise ValueError(f"PageLayout.fill: expected 'zeros' or 'nan', got {self.fill!r}")

    def describe(self) -> str:
        words = [f"page size {self.page_size}", f"{self.placement} pages"]
        if self.extra_pages:
            words.append(f"{self.extra_pages} unused pages")
        if self.extra_columns:
            words.append(f"{self.extra_columns} padded block-table columns")
        if self.fill == "nan":
            words.append("unused memory NaN-filled")
        if self.share_prefix:
            words.append("shared prefix pages")
        return ", ".join(words)


@dataclass(frozen=True)
class Schedule:
    """An ordered tuple of steps over one page layout.

    ``graph`` runs every step through CUDA-graph capture and replay instead of eagerly;
    ``poison`` fills the device allocator's free memory with NaN before each step so that reads
    of uninitialised workspace show. ``label`` is the schedule in words, for reports.
    """

    steps: tuple[Step, ...]
    layout: PageLayout = field(default_factory=PageLayout)
    label: str = ""
    graph: bool = False
    poison: bool = False

    def padding_ids(self, workload: Workload) -> frozenset[int]:
        return frozenset(r.id for r in workload.requests if r.padding)

    def describe(self) -> str:
        """The schedule in words."""
        if self.label:
            head = self.label
        else:
            head = "; then ".join(_describe_step(st) for st in self.steps[:4])
            if len(self.steps) > 4:
                head += f"; then {len(self.steps) - 4} more calls"
        extras = [self.layout.describe()]
        if self.graph:
            extras.append("captured and replayed as a CUDA graph")
        if self.poison:
            extras.append("allocator pre-filled with NaN")
        return f"{head} ({'; '.join(extras)})"



def _describe_step(step: Step) -> str:
    """One call in words, listing its chunks when there are few."""
    n = step.batch_size
    if n == 1:
        return f"{step.chunks[0].describe()} alone"
    if n <= 4:
        return f"one call of {n} requests: " + " + ".join(c.describe() for c in step.chunks)
    return f"one call of {n} requests"


# --------------------------------------------------------------------------------------------
# Materialisation
# --------------------------------------------------------------------------------------------

def _page_order(layout: PageLayout, pages_per_chunk: list[int]) -> list[list[int]]:
    """Physical page ids for each chunk's logical pages (plus unused ones, not returned)."""
    used = sum(pages_per_chunk)
    total = used + layout.extra_pages
    if layout.placement == "interleaved":
        # Round-robin: request 0 page 0, request 1 page 0, ..., request 0 page 1, ...
        order: list[tuple[int, int]] = []
        depth = max(pages_per_chunk, default=0)
        for p in range(depth):
            for c, n in enumerate(pages_per_chunk):
                if p < n:
                    order.append((c, p))
        assigned: list[list[int]] = [[0] * n for n in pages_per_chunk]
        physical = list(range(total))
        rng = random.Random(layout.seed)
        unused = set(rng.sample(physical, layout.extra_pages)) if layout.extra_pages else set()
        free = [p for p in physical if p not in unused]
        for (c, p), phys in zip(order, free, strict=True):
            assigned[c][p] = phys
        return assigned
    physical = list(range(total))
    if layout.placement == "shuffled":
        random.Random(layout.seed).shuffle(physical)
    elif layout.placement == "reversed":
        physical.reverse()
    elif layout.extra_pages:
        # Scatter the unused pages deterministically among used ones.
        rng = random.Random(layout.seed)
        unused = set(rng.sample(range(total), layout.extra_pages))
        physical = [p for p in range(total) if p not in unused] + sorted(unused)
    out: list[list[int]] = []
    i = 0
    for n in pages_per_chunk:
        out.append(physical[i:i + n])
        i += n
    return out


def materialize(
    workload: Workload,
    step: Step,
    layout: PageLayout,
    device: torch.device | str,
    content_cache: dict[tuple[int, str], torch.Tensor] | None = None,
) -> AttentionBatch:
    """Build the :class:`AttentionBatch` of one step: K/V of tokens ``[0, stop)`` of every chunk
    written into fresh pages placed by ``layout`` (in the workload's cache dtype), queries
    concatenated in chunk order, the workload's features set on the batch.

    ``content_cache`` (optional) memoises each request's full K/V content and its chunks'
    query rows across steps.
    """
    device = torch.device(device)
    heads, dtype = workload.heads, workload.dtype
    P = layout.page_size
    for c in step.chunks:
        length = workload.request(c.request_id).length
        if c.stop > length:
            raise ValueError(
                f"step chunk {c}: stop={c.stop} exceeds request {c.request_id}'s length {length}"
            )
    pages_per_chunk = [-(-c.stop // P) for c in step.chunks]
    placement = _page_order(layout, pages_per_chunk)
    if layout.share_prefix:
        _share_prefix_pages(workload, step, P, placement)
    num_pages = max(1, sum(pages_per_chunk) + layout.extra_pages + (layout.fill == "nan"))
    shape = (num_pages, P, heads.num_kv_heads, heads.head_dim)
    fill_value = float("nan") if layout.fill == "nan" else 0.0
    k_cache = torch.full(shape, fill_value, dtype=workload.kv_dtype, device=device)
    v_cache = torch.full(shape, fill_value, dtype=workload.kv_dtype, device=device)
    max_pages = max(pages_per_chunk, default=0) + layout.extra_columns
    # Unused block-table columns point at the poisoned last page (NaN fill) or at page 0.
    pad_page = num_pages - 1 if layout.fill == "nan" else 0
    table = torch.full((len(step.chunks), max(max_pages, 1)), pad_page, dtype=torch.int32)
    queries: list[torch.Tensor] = []
    for b, (c, phys) in enumerate(zip(step.chunks, placement, strict=True)):
        if phys:
            pages = torch.tensor(phys, dtype=torch.long, device=device)
            full, rem = divmod(c.stop, P)
            for kind, cache in (("k", k_cache), ("v", v_cache)):
                kv = _full_content(workload, c.request_id, kind, device, content_cache)[:c.stop]
                if cache.element_size() == 1:  # FP8: written as bytes (the same bits; byte
                    cache, kv = cache.view(torch.uint8), kv.view(torch.uint8)  # indexing)
                # Only the chunk's own slots: the tail of its last page keeps the layout's fill,
                # or a longer sharer's tokens when prefix pages are shared (writing whole pages
                # would overwrite those with fill).
                cache[pages[:full]] = kv[: full * P].view(full, P, *kv.shape[1:])
                if rem:
                    cache[pages[full], :rem] = kv[full * P:]
            table[b, : len(phys)] = torch.tensor(phys, dtype=torch.int32)
        # Only the chunk's query tokens (a decode needs one row, not the whole request's q).
        queries.append(_query_content(workload, c, device, content_cache))
    q_lens = [c.q_len for c in step.chunks]
    cu = [0]
    for n in q_lens:
        cu.append(cu[-1] + n)
    q = (torch.cat(queries) if queries else
         torch.empty(0, heads.num_q_heads, heads.head_dim, dtype=dtype, device=device))
    return AttentionBatch(
        q=q.contiguous(),
        k_cache=k_cache,
        v_cache=v_cache,
        cu_seqlens_q=torch.tensor(cu, dtype=torch.int32, device=device),
        kv_lens=torch.tensor([c.stop for c in step.chunks], dtype=torch.int32, device=device),
        block_table=table.to(device),
        sm_scale=workload.sm_scale,
        request_ids=tuple(c.request_id for c in step.chunks),
        window_left=workload.features.window_left,
        sinks=workload.sinks(device),
        logits_soft_cap=workload.features.logits_soft_cap,
        k_scale=workload.kv_scale("k", device),
        v_scale=workload.kv_scale("v", device),
    )


def _share_prefix_pages(workload: Workload, step: Step, page_size: int,
                        placement: list[list[int]]) -> None:
    """Point the prefix pages of requests sharing a prompt at one owner's physical pages (the
    prompt's own request when it is in the step, else the first sharer)."""
    owners: dict[int, list[int]] = {}
    for b, c in enumerate(step.chunks):
        req = workload.request(c.request_id)
        if req.prefix is None:
            owners.setdefault(req.id, placement[b])
    for b, c in enumerate(step.chunks):
        req = workload.request(c.request_id)
        if req.prefix is None:
            continue
        parent, n = req.prefix
        shared = -(-c.stop // page_size) if c.stop <= n else n // page_size
        owner = owners.setdefault(parent, placement[b])
        shared = min(shared, len(owner))
        placement[b][:shared] = owner[:shared]


def _query_content(workload: Workload, chunk: Chunk, device: torch.device,
                   cache: dict[tuple[int, str], torch.Tensor] | None) -> torch.Tensor:
    """The query rows of ``chunk`` (memoised per (request, start, stop): a chunk recurs in
    both schedules of a case, and across a shrink's tries)."""
    if cache is None:
        return workload.content(chunk.request_id, "q", chunk.start, chunk.stop, device)
    key = (chunk.request_id, f"q{chunk.start}:{chunk.stop}")
    if key not in cache:
        cache[key] = workload.content(chunk.request_id, "q", chunk.start, chunk.stop, device)
    return cache[key]


def _full_content(
    workload: Workload, request_id: int, kind: str, device: torch.device,
    cache: dict[tuple[int, str], torch.Tensor] | None,
) -> torch.Tensor:
    length = workload.request(request_id).length
    if cache is None:
        return workload.content(request_id, kind, 0, length, device)  # type: ignore[arg-type]
    key = (request_id, kind)
    if key not in cache:
        cache[key] = workload.content(request_id, kind, 0, length, device)  # type: ignore[arg-type]
    return cache[key]


# --------------------------------------------------------------------------------------------
# Running a schedule
# --------------------------------------------------------------------------------------------

@dataclass
class ScheduleOutput:
    """Per-token results of one schedule: ``keys[i] = (request_id, token)`` is row ``i`` of
    ``out`` ``[N, Hq, D]`` and ``lse`` ``[N, Hq]``. Padding requests are left out.

    A (request, token) may occur several times (a decode neighbour repeated in every step of a
    chunked prefill): ``steps[i]`` is the step that computed row ``i``, so ``(keys[i],
    steps[i])`` names one occurrence. ``origins[i]`` is the row's origin
    (:meth:`Workload.origin`): rows of one origin are the same row by content (a request that
    repeats a prompt, one prompt sampled several times). Both are empty when unknown (then every
    row is its own origin, computed in step 0)."""

    keys: list[tuple[int, int]]
    out: torch.Tensor
    lse: torch.Tensor
    steps: list[int] = field(default_factory=list)
    origins: list[tuple[int, int]] = field(default_factory=list)

    def index(self) -> dict[tuple[int, int], int]:
        """Each key's first row."""
        out: dict[tuple[int, int], int] = {}
        for i, k in enumerate(self.keys):
            out.setdefault(k, i)
        return out

    def step_of(self, i: int) -> int:
        return self.steps[i] if self.steps else 0

    def origin_of(self, i: int) -> tuple[int, int]:
        return self.origins[i] if self.origins else self.keys[i]


BackendFn = Callable[[AttentionBatch], object]


def _poison_allocator(device: torch.device) -> None:
    """Fill the CUDA caching allocator's free blocks with NaN so that a kernel reading memory
    it never wrote sees NaN instead of stale valid data."""
    if device.type != "cuda":
        return
    # NOTE: release the cached segments first: they may be many and fragmented, and one blob the
    # size of all of them cannot be carved from them (it would ask the driver for that much
    # again). The freed blob stays cached, so the next allocations are carved from NaN.
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info(device)
    nbytes = min(free // 4, 1 << 30)
    blob = torch.full((nbytes // 4,), float("nan"), dtype=torch.float32, device=device)
    del blob


def _static_copy(batch: AttentionBatch) -> AttentionBatch:
    """The batch in fresh buffers: what an engine's CUDA graph is captured on."""
    return replace(batch, q=batch.q.clone(), k_cache=batch.k_cache.clone(),
                   v_cache=batch.v_cache.clone(), cu_seqlens_q=batch.cu_seqlens_q.clone(),
                   kv_lens=batch.kv_lens.clone(), block_table=batch.block_table.clone())


def _run_graphed(backend: BackendFn, batch: AttentionBatch) -> object:
    """Run ``backend(batch)`` as an engine runs a CUDA graph and return the replay's result.

    The batch is copied into static buffers; the backend's planning step (if any) runs on them
    outside the capture (``graph=True``); one warm-up call (compilation, workspace) runs on a
    side stream; the call is captured on the static buffers; then the static q, k_cache and
    v_cache are overwritten with zeros and the real values copied back in (new inputs copied
    into the graph's buffers, as engines do) and the graph is replayed once.
    """
    plan = planner(backend)
    static = _static_copy(batch)
    if plan is not None:
        plan(static, True)
    stream = torch.cuda.Stream(batch.device)  # type: ignore[no-untyped-call]
    stream.wait_stream(torch.cuda.current_stream(batch.device))
    with torch.cuda.stream(stream):
        backend(static)  # warm-up (compilation, workspace allocation) outside the capture
    torch.cuda.current_stream(batch.device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        result = backend(static)
    for name in ("q", "k_cache", "v_cache"):
        buffer: torch.Tensor = getattr(static, name)
        buffer.zero_()
        buffer.copy_(getattr(batch, name))
    graph.replay()
    torch.cuda.synchronize(batch.device)
    return result


def iter_step_results(
    backend: BackendFn, workload: Workload, schedule: Schedule, device: torch.device | str,
    cache: dict[tuple[int, str], torch.Tensor] | None = None,
) -> Iterator[tuple[Step, AttentionBatch, torch.Tensor, torch.Tensor]]:
    """Run each step of ``schedule`` and yield ``(step, batch, out, lse)``.

    A backend with a planning step (``invariance.backends.planner``) is planned on each batch
    before its call, outside any capture. ``cache`` memoises request content across steps (and
    across schedules of one workload)."""
    device = torch.device(device)
    cache = {} if cache is None else cache
    plan = planner(backend)
    for step in schedule.steps:
        batch = materialize(workload, step, schedule.layout, device, cache).validate()
        if schedule.poison:
            _poison_allocator(device)
        if schedule.graph:
            raw = _run_graphed(backend, batch)
        else:
            if plan is not None:
                plan(batch, False)
            raw = backend(batch)
        result = as_result(raw, batch)
        yield step, batch, result.out, result.lse


def run_schedule(
    backend: BackendFn, workload: Workload, schedule: Schedule, device: torch.device | str,
    cache: dict[tuple[int, str], torch.Tensor] | None = None,
) -> ScheduleOutput:
    """Run every step of ``schedule`` through ``backend`` and collect per-token rows.

    ``cache`` (optional) memoises request content; share one between schedules of a workload."""
    padding = schedule.padding_ids(workload)
    keys: list[tuple[int, int]] = []
    steps: list[int] = []
    outs: list[torch.Tensor] = []
    lses: list[torch.Tensor] = []
    results = iter_step_results(backend, workload, schedule, device, cache)
    for index, (step, _batch, out, lse) in enumerate(results):
        row = 0
        for c in step.chunks:
            if c.request_id not in padding and c.q_len:
                keys.extend((c.request_id, t) for t in range(c.start, c.stop))
                steps.extend([index] * c.q_len)
                outs.append(out[row:row + c.q_len].clone())
                lses.append(lse[row:row + c.q_len].clone())
            row += c.q_len
    heads = workload.heads
    dev = torch.device(device)
    return ScheduleOutput(
        keys=keys, steps=steps, origins=[workload.origin(r, t) for r, t in keys],
        out=torch.cat(outs) if outs else torch.empty(
            0, heads.num_q_heads, heads.head_dim, dtype=workload.dtype, device=dev),
        lse=torch.cat(lses) if lses else torch.empty(
            0, heads.num_q_heads, dtype=torch.float32, device=dev),
    )
