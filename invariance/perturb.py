"""The perturbation catalogue: named generators of schedule pairs (ARCHITECTURE.md, "The one
idea").

Each perturbation yields :class:`Case` objects: a workload and two schedules that compute some of
the same (request, token) pairs in different ways. An invariant backend gives identical bits for
every token the two schedules share. Names and descriptions are public: reports show them.

Rows that must agree are compared across the two schedules and within each (a row computed in
two calls of one schedule, or by two requests with one prompt: :func:`invariance.compare_outputs`),
so one schedule may hold a row in many calls. Coverage is by construction, not by luck, at the
default budget:

- every batch size from 1 to ``dense_batch`` (17) and the thresholds above it (one in every
  CUDA-graph bucket of 8 up to 64 and 65 at small scale; to 513 at large): ``batch_size``
  compares the same rows in calls of different sizes, each row in two sizes or more;
- calls where every request shares one prompt on its physical pages (an engine's cascade
  path; full pages, and by turns a partly filled one): ``prefix_sharing``;
- calls of 2, 3, 8, 16 identical requests in lock-step (one prompt sampled N times):
  ``lockstep``;
- calls whose total KV tokens (several long requests) and total query tokens lie just past
  every power of two up to the scale's largest (``max_call_kv``, ``max_call_tokens``):
  ``call_totals``;
- rows on both sides of every split boundary of the backend (:meth:`Scale.for_split`) in one
  speculative verify call vs decoded one by one: ``spec_verify``;
- the longest request of the scale (longer than several KV splits of the backend) in the
  first case of every budget unit of ``neighbors`` (next to many short requests), ``paging``,
  ``repeat`` and ``call_totals``; a long one (:attr:`Scale.medium`) in their other cases;
- ``mixed`` compares a decode target and a prefill target in every case;
- request content cycles through :data:`invariance.workload.FAMILIES` (exact zeros, ties,
  large magnitudes, alternating signs) by case and request; the rows a case hinges on (probes)
  have content that shows a changed reduction;
- with attention features (:class:`invariance.Features`, in every case's workload), a sliding
  window's edge is crossed in every perturbation (:meth:`Scale.for_window`,
  :meth:`CaseContext.short_len`), sinks, soft-cap and FP8 content shape every request
  (``invariance.features``).

Sizes come from a :class:`Scale`: ``small`` keeps every call tiny (CPU, Triton interpreter),
``large`` uses production shapes (32k-token requests, batches up to 513) for GPUs.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace

from invariance.features import Features
from invariance.schedule import Chunk, PageLayout, Schedule, Step
from invariance.workload import FAMILIES, HeadConfig, Request, Workload

__all__ = [
    "PERTURBATIONS",
    "SCALES",
    "Case",
    "CaseContext",
    "Perturbation",
    "Scale",
    "get_perturbation",
    "ranges",
    "resolve_perturbations",
]


@dataclass(frozen=True)
class Scale:
    """Sizes the perturbations draw from.

    - ``short``: (min, max) context length of an ordinary request.
    - ``long``: length of the longest request (compared, and a hostile neighbour).
    - ``ladder``: batch sizes, walked deterministically: 1, 2, 3 and the pairs around common
      thresholds (16/17, 32/33, ...).
    - ``buckets``: CUDA-graph bucket sizes a server pads batches to (``padding``).
    - ``prefill``: (min, max) new tokens in a prefill chunk.
    - ``chunk_sizes``: chunk sizes for chunked prefill.
    - ``page_sizes``: page sizes for the paging perturbation; ``page_size`` is the default.
    - ``decode_tokens``: tokens decoded one at a time in ``prefill_vs_decode``.
    - ``prefill_len``: (min, max) length of prompts prefilled whole.
    - ``draft``: (min, max) draft tokens of a speculative verify step.
    - ``dense_batch``: every batch size from 1 to this occurs in ``batch_size``.
    - ``batch_thresholds``: batch sizes above ``dense_batch`` that ``batch_size`` builds too,
      each compared with every other and with small batches: one in every CUDA-graph bucket
      of 8 (16-24, 24-32, ...) up to 64 and one past it at small scale, powers of two and
      their successors to 513 at large. A switch at any size up to the largest shows; one
      that holds only inside a window shows where a size lies in it.
    - ``lockstep``: sizes of the groups of identical requests ``lockstep`` runs in lock-step.
    - ``max_call_kv``: ``call_totals`` builds calls whose total KV tokens lie just past every
      power of two up to this; ``max_call_tokens``: likewise for total query tokens.
    - ``shared_prefix``: (min, max) length of the prompt every request of a call shares in
      ``prefix_sharing``'s cascade case.
    - ``split``: the backend's KV split size in tokens, when it declares one
      (:meth:`for_split`): ``spec_verify`` puts draft windows across its boundaries.
    """

    name: str
    short: tuple[int, int]
    long: int
    ladder: tuple[int, ...]
    buckets: tuple[int, ...]
    prefill: tuple[int, int]
    chunk_sizes: tuple[int, ...]
    page_sizes: tuple[int, ...]
    page_size: int
    decode_tokens: int
    prefill_len: tuple[int, int]
    draft: tuple[int, int] = (2, 8)
    dense_batch: int = 17
    batch_thresholds: tuple[int, ...] = (24, 32, 40, 48, 56, 64, 65)
    lockstep: tuple[int, ...] = (2, 3, 8, 16)
    max_call_kv: int = 4096
    max_call_tokens: int = 256
    shared_prefix: tuple[int, int] = (64, 320)
    split: int | None = None

    @property
    def batch_sizes(self) -> tuple[int, ...]:
        """The ladder (kept under its old name)."""
        return self.ladder

    @property
    def medium(self) -> int:
        """The length of a long neighbour in the cases that do not use the longest request."""
        return max(self.short[1], self.long // 4)

    def for_split(self, split_tokens: int | None) -> Scale:
        """This scale with the longest request spanning at least 2.5 KV splits of
        ``split_tokens`` (a backend's split size), so rows on both sides of several split
        boundaries are compared, and ``split`` set to it."""
        if not split_tokens:
            return self
        return replace(self, long=max(self.long, split_tokens * 5 // 2 + 3), split=split_tokens)

    def for_window(self, window: int | None) -> Scale:
        """This scale with requests longer than a sliding window of ``window`` keys
        (``window_left``), so that every perturbation compares rows on both sides of the
        window edge: the longest request spans more than twice the window, ordinary requests
        reach twice the window (:meth:`CaseContext.short_len` then alternates between lengths
        inside and past it), and whole prompts are longer than the window, so each holds rows
        on both sides."""
        if window is None:
            return self
        reach = 2 * window + 2
        return replace(self, long=max(self.long, reach + 1),
                       short=(self.short[0], max(self.short[1], reach)),
                       prefill_len=(max(self.prefill_len[0], window + 2),
                                    max(self.prefill_len[1], reach)))


SCALES: dict[str, Scale] = {
    "small": Scale(
        name="small", short=(4, 96), long=1100,
        ladder=(1, 2, 3, 4, 5, 8, 13, 16, 17, 32, 33), buckets=(1, 2, 4, 8, 16, 24, 32, 40),
        prefill=(2, 24), chunk_sizes=(3, 7, 16), page_sizes=(1, 4, 16), page_size=4,
        decode_tokens=3, prefill_len=(24, 140),
    ),
    "large": Scale(
        name="large", short=(64, 4096), long=32768,
        ladder=(1, 2, 3, 4, 8, 16, 17, 32, 33, 64, 65, 128, 129, 256, 257),
        buckets=(1, 2, 4, 8, 16, 24, 32, 48, 64, 80, 96, 128, 160, 192, 256, 512),
        prefill=(32, 512), chunk_sizes=(64, 256, 1000), page_sizes=(16, 32, 64), page_size=16,
        decode_tokens=4, prefill_len=(1024, 4096),
        batch_thresholds=(24, 32, 40, 48, 56, 64, 65, 96, 128, 129, 192, 256, 257, 384, 512,
                          513),
        max_call_kv=1 << 18, max_call_tokens=1 << 14, shared_prefix=(256, 4096),
    ),
}


@dataclass(frozen=True)
class Case:
    """Two schedules over one workload; every (request, token) both compute must agree.

    ``focus`` names the requests the case is about (for the words in reports); ``features`` are
    numbers for plots (e.g. ``batch_size``, ``neighbor_len``).
    """

    perturbation: str
    workload: Workload
    a: Schedule
    b: Schedule
    focus: tuple[int, ...]
    features: dict[str, float] = field(default_factory=dict)


@dataclass
class CaseContext:
    """What a generator needs: sizes, heads, dtype, the case index (which walks the ladder and
    the content families), a seeded RNG and request allocation; ``features`` go into the
    workload."""

    scale: Scale
    heads: HeadConfig
    dtype: object
    seed: int
    index: int
    rng: random.Random
    requests: list[Request] = field(default_factory=list)
    features: Features = field(default_factory=Features)
    short_draws: int = 0
    #: Whether this case uses the scale's longest request (the first case of every budget
    #: unit); the others use a shorter long one (:attr:`Scale.medium`).
    longest: bool = True

    def request(self, length: int, padding: bool = False,
                prefix: tuple[int, int] | None = None, family: str | None = None) -> Request:
        """A new request; its content family cycles with the case and the request id unless
        ``family`` names one (a probe row: the ``large`` and ``zeros`` families often round a
        changed reduction to the same bits, a row a case hinges on should not be one)."""
        rid = len(self.requests)
        family = family or FAMILIES[(self.index + rid) % len(FAMILIES)]
        r = Request(rid, length, padding, family, prefix)
        self.requests.append(r)
        return r

    def ladder(self, k: int, *, at_least: int = 2, at_most: int | None = None) -> int:
        """The ``k``-th batch size of the ladder within ``[at_least, at_most]`` (cyclic)."""
        sizes = [n for n in self.scale.ladder
                 if n >= at_least and (at_most is None or n <= at_most)]
        return sizes[k % len(sizes)]

    def short_len(self) -> int:
        """An ordinary request's length. With a sliding window that the scale's lengths reach
        past, draws alternate (first past, then inside) between lengths whose last position
        the window cuts (``> window + 1`` tokens) and lengths it does not: a case's decodes
        sit on both sides of the window edge by construction."""
        lo, hi = self.scale.short
        w = self.features.window
        if w is not None and lo <= w + 1 < hi:
            self.short_draws += 1
            return (self.rng.randint(w + 2, hi) if self.short_draws % 2
                    else self.rng.randint(lo, w + 1))
        return self.rng.randint(lo, hi)

    def decode(self, length: int | None = None, family: str | None = None) -> Chunk:
        """A decode step: the last token of a fresh request."""
        r = self.request(length if length is not None else self.short_len(), family=family)
        return Chunk(r.id, r.length - 1, r.length)

    def long_len(self) -> int:
        """The length of this case's long request (:attr:`longest`)."""
        return self.scale.long if self.longest else self.scale.medium

    def long(self) -> Chunk:
        """A decode of this case's long request: the scale's longest in the first case of every
        budget unit, a medium one in the others."""
        return self.decode(self.long_len())

    def clone(self, prompt: Request, length: int | None = None) -> Request:
        """A request that repeats the first ``length`` tokens of ``prompt`` (all of them by
        default) and has ``length`` tokens: its rows are ``prompt``'s rows, by content."""
        n = prompt.length if length is None else length
        return self.request(n, prefix=(prompt.id, n))

    def sample(self, prompt: Request, extra: int) -> Request:
        """A request that continues the whole of ``prompt`` with ``extra`` tokens of its own
        (one prompt sampled several times)."""
        return self.request(prompt.length + extra, prefix=(prompt.id, prompt.length))

    def prefill_chunk(self, context: int | None = None) -> Chunk:
        """A chunk of new tokens on top of an existing context (possibly empty)."""
        new = self.rng.randint(*self.scale.prefill)
        ctx = context if context is not None else self.rng.choice([0, self.short_len()])
        r = self.request(ctx + new)
        return Chunk(r.id, ctx, ctx + new)

    def target(self, k: int | None = None, spans: bool = False) -> Chunk:
        """A decode or a prefill chunk: alternating with ``k`` when given, else at random.
        ``spans``: its context is in the upper half of ordinary lengths, so any KV split
        smaller than that cuts it (a row shorter than one split shows no change of split)."""
        use_decode = (k % 2 == 0) if k is not None else self.rng.random() < 0.6
        lo, hi = self.scale.short
        n = self.rng.randint(max(lo, hi // 2), hi) if spans else None
        return self.decode(n) if use_decode else self.prefill_chunk(n)

    def workload(self) -> Workload:
        return Workload(tuple(self.requests), self.heads, self.dtype, self.seed,  # type: ignore[arg-type]
                        self.features)

    def layout(self, **kw: object) -> PageLayout:
        return PageLayout(page_size=self.scale.page_size, **kw)  # type: ignore[arg-type]


def _one_step(chunks: list[Chunk], layout: PageLayout, label: str) -> Schedule:
    return Schedule((Step(tuple(chunks)),), layout, label)


def _steps(groups: list[list[Chunk]], layout: PageLayout, label: str) -> Schedule:
    return Schedule(tuple(Step(tuple(g)) for g in groups if g), layout, label)


@dataclass(frozen=True)
class Perturbation:
    """A named generator of schedule pairs.

    ``cases_per_budget`` is how many cases one unit of budget buys (``check``'s ``budget``
    multiplies it).
    """

    name: str
    description: str
    generate: Callable[[CaseContext], Case]
    cases_per_budget: int = 3
    requires_cuda: bool = False

    def cases(
        self, *, scale: Scale, heads: HeadConfig, dtype: object, seed: int, budget: int,
        features: Features | None = None,
    ) -> Iterator[Case]:
        """Yield ``budget * cases_per_budget`` cases, each from its own seeded RNG; their
        workloads carry ``features`` (pass a ``scale`` made :meth:`Scale.for_window`)."""
        for i in range(max(1, budget) * self.cases_per_budget):
            case_seed = zlib.crc32(f"{self.name}/{seed}/{i}".encode())
            ctx = CaseContext(scale, heads, dtype, case_seed, i, random.Random(case_seed),
                              features=features if features is not None else Features(),
                              longest=i % self.cases_per_budget == 0)
            yield self.generate(ctx)


# --------------------------------------------------------------------------------------------
# Generators
# --------------------------------------------------------------------------------------------

def _sizes_apart(total: int, sizes: list[int], avoid: list[int]) -> list[int]:
    """``sizes`` (descending), then the largest of ``sizes`` or 1 that still fit, to sum to
    ``total``; ``avoid`` is the other partition, whose sizes the leftovers should not repeat
    where they can."""
    out = sorted(sizes, reverse=True)
    rest = total - sum(out)
    while rest > 0:
        fit = [n for n in [*sizes, 1] if n <= rest]
        n = max((m for m in fit if m not in avoid), default=max(fit))
        out.append(n)
        rest -= n
    return out


def _small_row(ctx: CaseContext, k: int, probe: bool = False) -> Chunk:
    """A compared row of a batch of many: a short decode, every fifth a chunk of 2-8 query
    tokens (decode rows and prefill rows both see the batch change). A ``probe`` row (one or
    two per call) is a decode of an ordinary length, of content that shows a changed
    reduction (see :meth:`CaseContext.request`): a reduction that changes with the batch
    changes the bits of rows long enough to span several of its pieces."""
    short = ctx.scale.short
    if probe:
        return ctx.decode(ctx.rng.randint(short[1] // 2, short[1]),
                          family=("gaussian", "ties")[k % 2])
    if k % 5 == 4:
        q = ctx.rng.randint(2, 8)
        r = ctx.request(ctx.rng.randint(short[0], 4 * short[0]) + q)
        return Chunk(r.id, r.length - q, r.length)
    return ctx.decode(ctx.rng.randint(short[0], 4 * short[0]))


def _partitioned(chunks: list[Chunk], sizes: list[int]) -> list[list[Chunk]]:
    out, i = [], 0
    for n in sizes:
        out.append(chunks[i:i + n])
        i += n
    return out


def ranges(values: Sequence[int]) -> str:
    """``1-17, 24, 32, 33``: sorted distinct values, runs of three or more collapsed (batch
    sizes in words, for labels and reports)."""
    runs: list[list[int]] = []
    for n in sorted(set(values)):
        if runs and n == runs[-1][-1] + 1:
            runs[-1].append(n)
        else:
            runs.append([n])
    return ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 2 else ", ".join(map(str, r)) for r in runs)


def _batch_size(ctx: CaseContext) -> Case:
    """Every batch size, by construction. Even cases: every size from 1 to ``dense_batch``,
    the same rows in calls of odd sizes (ascending) vs even sizes (descending), so every row
    sits in batches of two different sizes, small in one schedule where large in the other.
    Odd cases: the threshold sizes above it (``batch_thresholds``), nested (the first rows of
    the largest call are in every call: compared with themselves across every threshold)
    vs the same rows in small calls."""
    layout = ctx.layout()
    if ctx.index % 2 == 0:
        top = ctx.scale.dense_batch
        odd = list(range(1, top + 1, 2))
        even = list(range(2, top + 1, 2))
        a_sizes = odd
        b_sizes = _sizes_apart(sum(odd), even, odd)
        firsts = {sum(a_sizes[:i]) for i in range(len(a_sizes))}
        firsts |= {sum(b_sizes[:i]) for i in range(len(b_sizes))}
        rows = [_small_row(ctx, k, k in firsts) for k in range(sum(odd))]
        a = _steps(_partitioned(rows, a_sizes), layout,
                   f"{len(rows)} requests in calls of {ranges(a_sizes)} (odd sizes)")
        b = _steps(_partitioned(rows, b_sizes), layout,
                   f"the same requests in calls of {', '.join(map(str, b_sizes))}")
        return Case("batch_size", ctx.workload(), a, b, tuple(c.request_id for c in rows),
                    {"batch_size": float(top)})
    sizes = sorted(set(ctx.scale.batch_thresholds), reverse=True)
    rows = [_small_row(ctx, k, k < 2) for k in range(sizes[0])]
    small = min(ctx.scale.dense_batch, len(rows)) - 1
    a = _steps([[rows[0]], rows[1:small + 1]], layout,
               f"the first of {len(rows)} requests alone, the next {small} in one call")
    b = _steps([rows[:n] for n in sizes], layout,
               f"the first {', '.join(map(str, sizes))} of the {len(rows)} requests, one call "
               "each (the first ones are in every call)")
    # Compared: the rows of a, and those in two calls of b or more.
    compared = rows[:max(small + 1, sizes[1] if len(sizes) > 1 else 0)]
    return Case("batch_size", ctx.workload(), a, b, tuple(c.request_id for c in compared),
                {"batch_size": float(sizes[0])})


def _position(ctx: CaseContext) -> Case:
    n = ctx.ladder(ctx.index * 3 + 1)
    target = ctx.target(ctx.index)
    others = [ctx.target() for _ in range(n - 1)]
    k = ctx.rng.randrange(1, n)
    b_chunks = list(others)
    b_chunks.insert(k, target)
    layout = ctx.layout()
    return Case(
        "position", ctx.workload(),
        _one_step([target, *others], layout, f"{target.describe()} at position 0 of {n}"),
        _one_step(b_chunks, layout, f"{target.describe()} at position {k} of {n}"),
        (target.request_id,), {"batch_size": float(n), "position": float(k)},
    )


def _order(ctx: CaseContext) -> Case:
    # Batches up to dense_batch requests: batch_size builds the larger ones.
    n = ctx.ladder(ctx.index * 5 + 2, at_most=ctx.scale.dense_batch)
    chunks = [ctx.target(k) for k in range(n)]
    shuffled = chunks[:]
    while shuffled == chunks:
        ctx.rng.shuffle(shuffled)
    layout = ctx.layout()
    order = " ".join(str(c.request_id) for c in shuffled)
    return Case(
        "order", ctx.workload(),
        _one_step(chunks, layout, f"{n} requests in order 0..{n - 1}"),
        _one_step(shuffled, layout, f"the same {n} requests in order {order}"),
        tuple(c.request_id for c in chunks), {"batch_size": float(n)},
    )


def _neighbors(ctx: CaseContext) -> Case:
    """A target and a long request (the longest in the first case of every budget unit), each
    alone vs together in hostile batches."""
    # The case with the longest request (the first of a budget unit) is the hostile batch of
    # many short neighbours; its target spans several splits of any split a longest-request
    # heuristic would choose between.
    variant = (ctx.index + 1) % 3
    target = ctx.target(ctx.index, spans=variant == 1)
    long = ctx.long()
    lo, hi = ctx.ladder(1), max(ctx.scale.ladder)
    layout = ctx.layout()
    if variant == 0:
        a = _steps([[target], [long]], layout, f"{target.describe()} and the "
                   f"{long.stop}-token request, each alone")
        b = _one_step([long, target], layout, "the same two requests in one call")
        n = 2
    elif variant == 1:
        # The longest sequence and the batch size both change: the two inputs of
        # FA2/FlashInfer's split heuristic.
        shorts = [ctx.decode(ctx.rng.randint(1, ctx.scale.short[0] + 8)) for _ in range(hi - 2)]
        pos = ctx.rng.randrange(hi - 1)
        chunks = [*shorts]
        chunks.insert(pos, target)
        chunks.append(long)
        few = [ctx.decode(ctx.rng.randint(1, ctx.scale.short[0] + 8)) for _ in range(2)]
        a = _steps([[target, *few], [long]], layout,
                   f"{target.describe()} with 2 short neighbours; the {long.stop}-token "
                   "request alone")
        b = _one_step(chunks, layout, f"both in one call of {hi} (target at position {pos}, "
                                      f"{hi - 2} short neighbours)")
        n = hi
    else:
        # Many short neighbours: batch sizes on either side of the heuristics' thresholds.
        chunks_lo = [target, *[ctx.decode() for _ in range(lo - 1)]]
        extra = [ctx.decode() for _ in range(hi - lo - 1)]
        a = _steps([chunks_lo, [long]], layout, f"{target.describe()} first of {lo}; the "
                   f"{long.stop}-token request alone")
        b = _one_step([*chunks_lo, *extra, long], layout, f"all in one call of {hi}")
        n = hi
    return Case("neighbors", ctx.workload(), a, b, (target.request_id, long.request_id),
                {"batch_size": float(n), "neighbor_len": float(long.stop)})


def _mixed(ctx: CaseContext) -> Case:
    """Both directions in every case: a decode target and a prefill target, each in a batch of
    its own kind vs in one batch mixing decodes and prefill chunks."""
    n = ctx.ladder(ctx.index, at_most=64)
    decode_target = ctx.decode()
    prefill_target = ctx.prefill_chunk()
    decodes = [ctx.decode() for _ in range(n - 1)]
    prefills = [ctx.prefill_chunk() for _ in range(max(1, n // 4))]
    mixed = [decode_target, *decodes]
    for p in [*prefills, prefill_target]:
        mixed.insert(ctx.rng.randrange(len(mixed) + 1), p)
    layout = ctx.layout()
    return Case(
        "mixed", ctx.workload(),
        _steps([[decode_target, *decodes], [prefill_target]], layout,
               f"{decode_target.describe()} in a decode-only batch of {n}; "
               f"{prefill_target.describe()} alone"),
        _one_step(mixed, layout, f"both in one batch of {n} decodes and {len(prefills) + 1} "
                                 "prefill chunks"),
        (decode_target.request_id, prefill_target.request_id),
        {"batch_size": float(len(mixed))},
    )


def _chunked_prefill(ctx: CaseContext) -> Case:
    r = ctx.request(ctx.rng.randint(*ctx.scale.prefill_len))
    size = ctx.scale.chunk_sizes[ctx.index % len(ctx.scale.chunk_sizes)]
    neighbour = ctx.decode()
    steps = []
    for start in range(0, r.length, size):
        stop = min(start + size, r.length)
        steps.append(Step((neighbour, Chunk(r.id, start, stop))))
    layout = ctx.layout()
    return Case(
        "chunked_prefill", ctx.workload(),
        _one_step([Chunk(r.id, 0, r.length)], layout,
                  f"request {r.id} prefilled whole ({r.length} tokens) in one call"),
        Schedule(tuple(steps), layout,
                 f"request {r.id} prefilled in {len(steps)} chunks of {size} tokens, "
                 "each next to a decode request"),
        (r.id,), {"chunk_size": float(size)},
    )


def _prefill_vs_decode(ctx: CaseContext) -> Case:
    r = ctx.request(ctx.rng.randint(*ctx.scale.prefill_len))
    d = min(ctx.scale.decode_tokens, r.length - 1)
    steps = [Step((Chunk(r.id, 0, r.length - d),))]
    steps += [Step((Chunk(r.id, t, t + 1),)) for t in range(r.length - d, r.length)]
    layout = ctx.layout()
    return Case(
        "prefill_vs_decode", ctx.workload(),
        _one_step([Chunk(r.id, 0, r.length)], layout,
                  f"request {r.id}: all {r.length} tokens in one prefill call"),
        Schedule(tuple(steps), layout,
                 f"request {r.id}: prefill of {r.length - d} tokens, then {d} decode steps"),
        (r.id,), {"decode_tokens": float(d)},
    )


def _paging(ctx: CaseContext) -> Case:
    n = ctx.ladder(ctx.index, at_most=16)
    long = ctx.long()
    chunks = [long, *[ctx.target(k) for k in range(n - 1)]]
    a_layout = ctx.layout()
    placements = ("shuffled", "reversed", "interleaved")
    b_layout = PageLayout(
        page_size=ctx.scale.page_sizes[ctx.index % len(ctx.scale.page_sizes)],
        placement=placements[ctx.index % len(placements)],  # type: ignore[arg-type]
        extra_pages=ctx.rng.randint(1, 8),
        seed=ctx.seed,
    )
    return Case(
        "paging", ctx.workload(),
        _one_step(chunks, a_layout, f"{n} requests (one of {long.stop} tokens)"),
        _one_step(chunks, b_layout, f"the same {n} requests"),
        tuple(c.request_id for c in chunks), {"page_size": float(b_layout.page_size)},
    )


def _padding(ctx: CaseContext) -> Case:
    """The batch padded to the next CUDA-graph bucket with dummy requests."""
    n = ctx.ladder(ctx.index, at_most=16)
    chunks = [ctx.target(k) for k in range(n)]
    bucket = min((b for b in ctx.scale.buckets if b >= n + 3), default=n + 3)
    padded = list(chunks)
    for i in range(bucket - n):
        kind = ("empty", "no-query", "dummy-decode")[i % 3]
        if kind == "empty":
            r = ctx.request(0, padding=True)
            c = Chunk(r.id, 0, 0)
        elif kind == "no-query":
            r = ctx.request(ctx.short_len(), padding=True)
            c = Chunk(r.id, r.length, r.length)
        else:
            r = ctx.request(1, padding=True)
            c = Chunk(r.id, 0, 1)
        padded.insert(ctx.rng.randrange(len(padded) + 1), c)
    a_layout = ctx.layout()
    b_layout = ctx.layout(extra_pages=3, extra_columns=ctx.rng.randint(1, 5), seed=ctx.seed)
    return Case(
        "padding", ctx.workload(),
        _one_step(chunks, a_layout, f"{n} requests"),
        _one_step(padded, b_layout,
                  f"the same {n} requests padded to a bucket of {bucket} with dummy requests "
                  "(empty, KV-only, 1-token decodes)"),
        tuple(c.request_id for c in chunks), {"batch_size": float(len(padded))},
    )


def _repeat(ctx: CaseContext) -> Case:
    n = ctx.ladder(ctx.index, at_most=64)
    chunks = [ctx.long(), *[ctx.target(k) for k in range(n - 1)]]
    s = _one_step(chunks, ctx.layout(), f"{n} mixed requests")
    return Case("repeat", ctx.workload(), s,
                Schedule(s.steps, s.layout, f"the same {n} mixed requests, run again"),
                tuple(c.request_id for c in chunks), {"batch_size": float(n)})


def _uninitialized(ctx: CaseContext) -> Case:
    n = ctx.ladder(ctx.index, at_most=16)
    chunks = [ctx.target(k) for k in range(n)]
    a = _one_step(chunks, ctx.layout(), f"{n} requests")
    b = Schedule(a.steps, ctx.layout(fill="nan", extra_pages=2, extra_columns=2, seed=ctx.seed),
                 f"the same {n} requests, unused cache slots and block-table columns "
                 "pointing at NaN", poison=True)
    return Case("uninitialized", ctx.workload(), a, b,
                tuple(c.request_id for c in chunks), {"batch_size": float(n)})


def _cuda_graph(ctx: CaseContext) -> Case:
    n = ctx.ladder(ctx.index, at_most=64)
    chunks = [ctx.target(k) for k in range(n)]
    a = _one_step(chunks, ctx.layout(), f"{n} requests, eager")
    b = Schedule(a.steps, a.layout, f"the same {n} requests", graph=True)
    return Case("cuda_graph", ctx.workload(), a, b,
                tuple(c.request_id for c in chunks), {"batch_size": float(n)})


def _prefix_sharing(ctx: CaseContext) -> Case:
    """Requests with a common prompt prefix read the same physical pages (a prefix cache) vs
    private copies.

    Even cases (an engine's cascade path): every request of the call shares the prompt (its
    full pages, and in every other such case a partly filled last page too; one request's KV
    ends inside the prompt), on shared pages, vs the same requests on private pages next to an
    unrelated request. Odd cases: the prompt's owner, requests extending or repeating it and an
    unrelated request, on shared pages vs private ones (the parent's last page partly filled;
    a request that repeats the whole prompt shares that page too)."""
    P = ctx.scale.page_size
    if ctx.index % 2 == 0:
        sizes = sorted(n for n in ctx.scale.lockstep if n >= 3) or [3]
        n = sizes[(ctx.index // 2 + 1) % len(sizes)]  # the second size first (8, small scale)
        lo, hi = ctx.scale.shared_prefix
        prefix_len = max(P, ctx.rng.randint(lo, hi) // P * P)
        partial = ctx.index // 2 % 2 == 0
        if partial:
            prefix_len += ctx.rng.randint(1, P - 1) if P > 1 else 0
        prompt = ctx.request(prefix_len + ctx.rng.randint(1, 8))
        # Two extend the prompt by a prefill chunk, one repeats it (KV ending inside it: the
        # partly filled page), the rest continue it and decode (samples of one prompt).
        others = [ctx.request(prefix_len + ctx.rng.randint(1, 24), prefix=(prompt.id, prefix_len))
                  for _ in range(n - 2)]
        repeat = ctx.request(prefix_len, prefix=(prompt.id, prefix_len))
        chunks = [Chunk(prompt.id, prompt.length - 1, prompt.length),
                  Chunk(repeat.id, prefix_len - 1, prefix_len)]
        for k, r in enumerate(others):
            start = prefix_len if k < 2 else r.length - 1
            chunks.append(Chunk(r.id, start, r.length))
        ctx.rng.shuffle(chunks)
        unrelated = ctx.decode()
        mixed = list(chunks)
        mixed.insert(ctx.rng.randrange(len(mixed) + 1), unrelated)
        pages = "full pages and a partly filled one" if partial else "full pages only"
        a = _one_step(mixed, ctx.layout(), f"{n} requests sharing a {prefix_len}-token prompt, "
                      "each on private pages, and an unrelated request")
        b = _one_step(chunks, ctx.layout(share_prefix=True),
                      f"the {n} requests alone in the call, every one reading the prompt's "
                      f"physical pages ({pages}): all requests share a prefix")
        return Case("prefix_sharing", ctx.workload(), a, b, tuple(c.request_id for c in chunks),
                    {"prefix_len": float(prefix_len), "batch_size": float(n)})
    prefix_len = max(P + 1, (ctx.rng.randint(*ctx.scale.prefill_len) // P) * P + P // 2 + 1)
    parent = ctx.request(prefix_len)
    children = [ctx.request(prefix_len + ctx.rng.randint(*ctx.scale.prefill),
                            prefix=(parent.id, prefix_len)) for _ in range(2)]
    repeat = ctx.request(prefix_len, prefix=(parent.id, prefix_len))
    chunks = [Chunk(parent.id, prefix_len - 1, prefix_len),
              *[Chunk(c.id, prefix_len, c.length) for c in children],
              Chunk(repeat.id, prefix_len - 1, prefix_len), ctx.decode()]
    ctx.rng.shuffle(chunks)
    a = _one_step(chunks, ctx.layout(), f"a {prefix_len}-token prompt and 3 requests extending "
                                        "or repeating it, each on private pages")
    b = _one_step(chunks, ctx.layout(share_prefix=True),
                  "the same requests reading the prompt's physical pages (prefix cache), its "
                  "partly filled last page included")
    return Case("prefix_sharing", ctx.workload(), a, b,
                (parent.id, *[c.id for c in children], repeat.id),
                {"prefix_len": float(prefix_len)})


def _lockstep(ctx: CaseContext) -> Case:
    """Groups of identical requests in lock-step (one prompt sampled N times, as in best-of-N
    and RL rollouts), each group alone in its call (every request of the call with the same
    query and KV lengths) vs the same rows in calls mixing two groups of other lengths.

    Per group, by turns: exact copies of one prompt decoding its last token (identical rows,
    compared with each other too), samples continuing one prompt by the same number of tokens
    of their own, or copies prefilling the same chunk of the prompt. Even cases put the copies
    on the prompt's physical pages (a prefix cache), odd cases on private pages."""
    groups: list[list[Chunk]] = []
    used: set[int] = set()
    words = []
    for g, n in enumerate(ctx.scale.lockstep):
        length = ctx.short_len()
        while length in used:
            length += 1
        used.add(length)
        mode = (ctx.index + g) % 3
        # The rows of one group are copies of one prompt: a probe (see CaseContext.request).
        if mode == 1:
            base = max(1, length - ctx.rng.randint(1, 4))
            prompt = ctx.request(base, family="gaussian")
            members = [ctx.sample(prompt, length - base) for _ in range(n)]
            chunks = [Chunk(r.id, length - 1, length) for r in members]
            words.append(f"{n} samples")
        else:
            prompt = ctx.request(length, family="gaussian")
            members = [prompt, *[ctx.clone(prompt) for _ in range(n - 1)]]
            start = length - 1 if mode == 0 else max(0, length - ctx.rng.randint(2, 8))
            chunks = [Chunk(r.id, start, length) for r in members]
            words.append(f"{n} copies" + (" prefilling" if mode == 2 else ""))
        groups.append(chunks)
    layout = ctx.layout(share_prefix=ctx.index % 2 == 0)
    # The smallest group with the largest, and so on: no call of b is uniform.
    order = sorted(groups, key=len)
    mixed = []
    while len(order) >= 2:
        mixed.append([*order.pop(0), *order.pop()])
    if order:  # a group left alone gets a decode of another length
        length = max(used) + 1
        mixed.append([*order.pop(), ctx.decode(length)])
    a = _steps(groups, layout, f"groups of {', '.join(words)} in lock-step, each group alone "
                               "in its call")
    b = _steps(mixed, layout, "the same rows in calls of two groups of different lengths")
    focus = tuple(c.request_id for grp in groups for c in grp)
    return Case("lockstep", ctx.workload(), a, b, focus,
                {"batch_size": float(max(len(gr) for gr in groups))})


def _fill(ctx: CaseContext, base: list[Chunk], total: int, pool: list[Chunk],
          what: Callable[[Chunk], int], filler: Callable[[int], list[Chunk]]) -> list[Chunk]:
    """``base``, then chunks of ``pool`` while they fit, then fillers: a call whose chunks sum
    to exactly ``total`` by ``what`` (KV tokens, query tokens)."""
    call = list(base)
    used = sum(what(c) for c in call)
    for c in pool:
        if used + what(c) < total:
            call.append(c)
            used += what(c)
    if total > used:
        call += filler(total - used)
    return call


def _call_totals(ctx: CaseContext) -> Case:
    """Calls whose totals cross every power of two, a launcher's grid and workspace
    thresholds. Even cases: total KV tokens 2^k + 1 up to ``max_call_kv``, each call holding a
    short decode, the long requests that fit (several of about the longest length in the
    largest calls) and a filler request; vs the short decode and the longest alone. Odd cases:
    total query tokens 2^k + 1 up to ``max_call_tokens`` (a decode, a prefill chunk, prefill
    chunks as fillers); vs each compared request alone. A compared request sits in several
    calls of one schedule: its rows are compared across every total too."""
    layout = ctx.layout()
    short = ctx.scale.short
    if ctx.index % 2 == 0:
        # Probes (see CaseContext.request): a short decode and the long requests.
        w = ctx.features.window
        # With a window, a short decode inside its edge (the long ones are past it).
        n_short = (ctx.rng.randint(max(1, w // 2), w + 1) if w is not None and w >= 1
                   else ctx.rng.randint(4 * short[0], 8 * short[0]))
        base = [ctx.decode(n_short, family="gaussian")]
        top = ctx.scale.max_call_kv.bit_length() - 1
        long = ctx.long_len()
        pool = [ctx.decode(n, family=f) for n, f in ((long, "gaussian"), (long - 1, "ties"),
                                                     (long - 2, None), (long // 2 + 1, "ties"))]
        first = max(1, (2 * base[0].stop).bit_length())
        totals = [(1 << k) + 1 for k in range(first, top + 1)]

        def kv_filler(n: int) -> list[Chunk]:
            return [ctx.decode(n)]

        calls = [_fill(ctx, base, t, pool, lambda c: c.stop, kv_filler) for t in totals]
        # The short decode and the longest request alone too; the others where two calls
        # hold them.
        alone = [*base, pool[0]]
        compared = [pool[0], *(c for c in pool[1:] if sum(c in call for call in calls) > 1)]
        a = _steps([[c] for c in alone], layout,
                   f"a short decode and the {alone[-1].stop}-token request, each alone")
        b = _steps(calls, layout, f"the same requests in calls of {totals[0]} .. {totals[-1]} "
                                  "KV tokens in all (2^k + 1), filled up with other requests")
        return Case("call_totals", ctx.workload(), a, b,
                    tuple(c.request_id for c in [*base, *compared]),
                    {"kv_tokens": float(totals[-1])})
    chunk = 2 * ctx.scale.prefill[1]  # prefill chunks as fillers: fewer calls, few tiles
    q = ctx.rng.randint(2, 4)
    r = ctx.request(ctx.rng.randint(short[1] // 2, short[1]) + q, family="ties")
    base = [ctx.decode(ctx.rng.randint(short[1] // 2, short[1]), family="gaussian"),
            Chunk(r.id, r.length - q, r.length)]
    top = ctx.scale.max_call_tokens.bit_length() - 1
    first = max(1, (2 * sum(c.q_len for c in base)).bit_length())
    totals = [(1 << k) + 1 for k in range(first, top + 1)]

    def q_filler(n: int) -> list[Chunk]:
        out = []
        while n > 0:
            q = min(n, chunk)
            ctx_len = ctx.rng.choice([0, ctx.short_len()])
            r = ctx.request(ctx_len + q)
            out.append(Chunk(r.id, ctx_len, ctx_len + q))
            n -= q
        return out

    calls = [_fill(ctx, base, t, [], lambda c: c.q_len, q_filler) for t in totals]
    a = _steps([[c] for c in base], layout, "a decode and a prefill chunk, each alone")
    b = _steps(calls, layout, f"the same two in calls of {totals[0]} .. {totals[-1]} query "
                              "tokens in all (2^k + 1), filled up with prefill chunks")
    return Case("call_totals", ctx.workload(), a, b, tuple(c.request_id for c in base),
                {"query_tokens": float(totals[-1])})


def _boundaries(scale: Scale, limit: int) -> list[int]:
    """KV positions where a backend's splits or tiles end, below ``limit``: multiples of the
    declared split size, else the powers of two from 64; the first two and the last."""
    if scale.split and scale.split < limit:
        edges = list(range(scale.split, limit, scale.split))
    else:
        edges = [1 << k for k in range(6, limit.bit_length()) if 1 << k < limit]
    return edges if len(edges) <= 3 else [*edges[:2], edges[-1]]


def _spec_verify(ctx: CaseContext) -> Case:
    """A speculative-decoding verify step (draft tokens appended to each request's context)
    vs the same tokens decoded one at a time, or vs one prefill chunk.

    Even cases: one verify call holding a window of 2 draft tokens across each split
    boundary of the backend (the powers of two when it declares none) up to this case's long
    request, so rows on both sides of every boundary are compared, next to short decodes; vs
    the windows decoded token by token (every request one token per call). Odd cases: 2-8
    draft tokens after a short prompt, next to decodes; vs one prefill chunk holding them
    and the tokens before."""
    others = [ctx.decode() for _ in range(ctx.ladder(ctx.index, at_most=8) - 1)]
    layout = ctx.layout()
    if ctx.index % 2 == 0:
        k = 2  # few decode steps over the long contexts
        windows = []
        for edge in _boundaries(ctx.scale, ctx.long_len()):
            before = ctx.rng.randint(1, k - 1)  # rows at edge - before + 1 .. edge - before + k
            r = ctx.request(edge - before + k)
            windows.append(Chunk(r.id, r.length - k, r.length))
        a = _one_step([*windows, *others], layout,
                      f"one verify call: {k} draft tokens of each of {len(windows)} requests "
                      f"(across KV {', '.join(str(w.start + 1) for w in windows)}.. ), next to "
                      f"{len(others)} decodes")
        steps = [[Chunk(w.request_id, w.start + t, w.start + t + 1) for w in windows]
                 for t in range(k)]
        b = _steps(steps, layout, f"the same {k} tokens of each decoded one at a time")
        return Case("spec_verify", ctx.workload(), a, b, tuple(w.request_id for w in windows),
                    {"draft_tokens": float(k)})
    k = ctx.rng.randint(*ctx.scale.draft)
    r = ctx.request(ctx.short_len() + k)
    verify = Chunk(r.id, r.length - k, r.length)
    a = _one_step([verify, *others], layout,
                  f"request {r.id}: a verify step of {k} draft tokens after {r.length - k} "
                  f"tokens of context, next to {len(others)} decodes")
    start = max(0, verify.start - ctx.rng.randint(*ctx.scale.prefill))
    b = _one_step([Chunk(r.id, start, r.length)], layout,
                  f"request {r.id}: the same tokens in one prefill chunk of tokens "
                  f"{start}..{r.length - 1}")
    return Case("spec_verify", ctx.workload(), a, b, (r.id,), {"draft_tokens": float(k)})


PERTURBATIONS: dict[str, Perturbation] = {
    p.name: p
    for p in [
        Perturbation("batch_size", "the same requests in batches of every size up to 17 (odd "
                     "vs even sizes) and of the thresholds above (24, 32, ..., 64, 65 at small "
                     "scale, to 513 at large), vs small batches", _batch_size,
                     cases_per_budget=2),
        Perturbation("position", "the same request at another position in the same batch",
                     _position),
        Perturbation("order", "the same batch with its requests in another order", _order),
        Perturbation("neighbors",
                     "a request and the longest request, each alone vs together with many "
                     "short neighbours, batch sizes across split-heuristic thresholds",
                     _neighbors, cases_per_budget=3),
        Perturbation("mixed", "a decode and a prefill request, each in a batch of its own "
                     "kind vs in one batch mixing prefill chunks and decodes", _mixed,
                     cases_per_budget=3),
        Perturbation("chunked_prefill",
                     "a prompt prefilled in one call vs in chunks over several calls",
                     _chunked_prefill, cases_per_budget=3),
        Perturbation("prefill_vs_decode",
                     "tokens computed inside a prefill vs one at a time as decode steps",
                     _prefill_vs_decode, cases_per_budget=2),
        Perturbation("paging", "the same batch (the longest request included) with another "
                     "page size and physical page placement (shuffled, reversed, interleaved, "
                     "with holes)", _paging),
        Perturbation("padding", "the same batch padded to a CUDA-graph bucket with dummy "
                     "requests and block-table columns", _padding),
        Perturbation("repeat", "the same batch run twice (run-to-run determinism)", _repeat),
        Perturbation("uninitialized", "the same batch with unused cache slots, block-table "
                     "padding and free device memory filled with NaN", _uninitialized,
                     cases_per_budget=2),
        Perturbation("prefix_sharing", "requests sharing a prompt prefix on the same physical "
                     "pages (prefix cache, partly filled page included) vs private copies; "
                     "calls where every request shares it (an engine's cascade path)",
                     _prefix_sharing, cases_per_budget=2),
        Perturbation("lockstep", "groups of 2, 3, 8, 16 identical requests in lock-step (one "
                     "prompt sampled N times: copies, samples, copies prefilling), each group "
                     "alone in its call vs mixed with another group", _lockstep,
                     cases_per_budget=1),
        Perturbation("call_totals", "calls whose total KV tokens (several long requests) or "
                     "total query tokens lie just past every power of two, vs each compared "
                     "request alone", _call_totals, cases_per_budget=2),
        Perturbation("spec_verify", "a speculative verify step of draft tokens (windows across "
                     "every KV split boundary, or 2-8 after a short prompt) vs the same tokens "
                     "decoded one at a time, or in one prefill chunk", _spec_verify,
                     cases_per_budget=2),
        Perturbation("cuda_graph", "the same batch captured and replayed as a CUDA graph vs "
                     "run eagerly", _cuda_graph, cases_per_budget=2, requires_cuda=True),
    ]
}


def get_perturbation(name: str) -> Perturbation:
    """The perturbation called ``name``; ``ValueError`` listing the known names otherwise."""
    try:
        return PERTURBATIONS[name]
    except KeyError:
        raise ValueError(
            f"perturbation: unknown name {name!r}; expected one of {sorted(PERTURBATIONS)}"
        ) from None


def resolve_perturbations(names: str | list[str] | tuple[str, ...] | None) -> list[Perturbation]:
    """``None`` or ``"all"`` -> every perturbation; otherwise the named ones, in order."""
    if names is None or names == "all" or (isinstance(names, (list, tuple)) and "all" in names):
        return list(PERTURBATIONS.values())
    if isinstance(names, str):
        names = [n.strip() for n in names.split(",") if n.strip()]
    if not names:
        raise ValueError("perturbations: expected at least one name or 'all', got none")
    return [get_perturbation(n) for n in dict.fromkeys(names)]
