"""The perturbation catalogue: named generators of schedule pairs (ARCHITECTURE.md, "The one
idea").

Each perturbation yields :class:`Case` objects: a workload and two schedules that compute some of
the same (request, token) pairs in different ways. An invariant backend gives identical bits for
every token the two schedules share. Names and descriptions are public: reports show them.

Coverage is by construction, not by luck:

- batch sizes come from the scale's *ladder* (1, 2, 3, the pairs around common thresholds and
  CUDA-graph bucket sizes), walked deterministically by case index: ``batch_size`` compares a
  target alone against every size of the ladder in each case;
- the longest request of the scale (longer than several KV splits of the backend, see
  :meth:`Scale.for_split`) is itself compared, alone vs inside hostile batches, in
  ``batch_size``, ``neighbors``, ``paging``, ``repeat`` and ``spec_verify``;
- ``mixed`` compares a decode target and a prefill target in every case;
- request content cycles through :data:`invariance.workload.FAMILIES` (exact zeros, ties,
  large magnitudes, alternating signs) by case and request;
- with attention features (:class:`invariance.Features`, in every case's workload), a sliding
  window's edge is crossed in every perturbation (:meth:`Scale.for_window`,
  :meth:`CaseContext.short_len`), sinks, soft-cap and FP8 content shape every request
  (``invariance.features``).

Sizes come from a :class:`Scale`: ``small`` keeps every call tiny (CPU, Triton interpreter),
``large`` uses production shapes (32k-token requests, batches up to 257) for GPUs.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Callable, Iterator
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

    @property
    def batch_sizes(self) -> tuple[int, ...]:
        """The ladder (kept under its old name)."""
        return self.ladder

    def for_split(self, split_tokens: int | None) -> Scale:
        """This scale with the longest request spanning at least 2.5 KV splits of
        ``split_tokens`` (a backend's split size), so rows on both sides of several split
        boundaries are compared."""
        if not split_tokens:
            return self
        return replace(self, long=max(self.long, split_tokens * 5 // 2 + 3))

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

    def request(self, length: int, padding: bool = False,
                prefix: tuple[int, int] | None = None) -> Request:
        rid = len(self.requests)
        family = FAMILIES[(self.index + rid) % len(FAMILIES)]
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

    def decode(self, length: int | None = None) -> Chunk:
        """A decode step: the last token of a fresh request."""
        r = self.request(length if length is not None else self.short_len())
        return Chunk(r.id, r.length - 1, r.length)

    def long(self) -> Chunk:
        """A decode of the scale's longest request."""
        return self.decode(self.scale.long)

    def prefill_chunk(self, context: int | None = None) -> Chunk:
        """A chunk of new tokens on top of an existing context (possibly empty)."""
        new = self.rng.randint(*self.scale.prefill)
        ctx = context if context is not None else self.rng.choice([0, self.short_len()])
        r = self.request(ctx + new)
        return Chunk(r.id, ctx, ctx + new)

    def target(self, k: int | None = None) -> Chunk:
        """A decode or a prefill chunk: alternating with ``k`` when given, else at random."""
        use_decode = (k % 2 == 0) if k is not None else self.rng.random() < 0.6
        return self.decode() if use_decode else self.prefill_chunk()

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
                              features=features if features is not None else Features())
            yield self.generate(ctx)


# --------------------------------------------------------------------------------------------
# Generators
# --------------------------------------------------------------------------------------------

def _batch_size(ctx: CaseContext) -> Case:
    """Every ladder size in one case: target k alone vs first in a batch of ladder[k]; targets
    cycle through a short decode, the longest request and a prefill chunk."""
    sizes = [n for n in ctx.scale.ladder if n > 1]
    alone, batched, targets = [], [], []
    for k, n in enumerate(sizes):
        kind = (k + ctx.index) % 3
        target = ctx.decode() if kind == 0 else ctx.long() if kind == 1 else ctx.prefill_chunk()
        targets.append(target)
        alone.append([target])
        # Short neighbours: the batch size is what changes (the longest request is a target).
        batched.append([target, *[ctx.decode(ctx.rng.randint(ctx.scale.short[0],
                                                             4 * ctx.scale.short[0]))
                                  for _ in range(n - 1)]])
    layout = ctx.layout()
    return Case(
        "batch_size", ctx.workload(),
        _steps(alone, layout, f"{len(sizes)} targets, each alone in its own call"),
        _steps(batched, layout, f"the same targets, each first in a batch of "
                                f"{', '.join(map(str, sizes))} decode requests"),
        tuple(t.request_id for t in targets), {"batch_size": float(max(sizes))},
    )


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
    n = ctx.ladder(ctx.index * 3 + 2)
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
    """A target and the longest request, each alone vs together in hostile batches."""
    target = ctx.target(ctx.index)
    long = ctx.long()
    variant = ctx.index % 3
    lo, hi = ctx.ladder(1), max(ctx.scale.ladder)
    layout = ctx.layout()
    if variant == 0:
        a = _steps([[target], [long]], layout, f"{target.describe()} and the "
                   f"{ctx.scale.long}-token request, each alone")
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
                   f"{target.describe()} with 2 short neighbours; the {ctx.scale.long}-token "
                   "request alone")
        b = _one_step(chunks, layout, f"both in one call of {hi} (target at position {pos}, "
                                      f"{hi - 2} short neighbours)")
        n = hi
    else:
        # Many short neighbours: batch sizes on either side of the heuristics' thresholds.
        chunks_lo = [target, *[ctx.decode() for _ in range(lo - 1)]]
        extra = [ctx.decode() for _ in range(hi - lo - 1)]
        a = _steps([chunks_lo, [long]], layout, f"{target.describe()} first of {lo}; the "
                   f"{ctx.scale.long}-token request alone")
        b = _one_step([*chunks_lo, *extra, long], layout, f"all in one call of {hi}")
        n = hi
    return Case("neighbors", ctx.workload(), a, b, (target.request_id, long.request_id),
                {"batch_size": float(n), "neighbor_len": float(ctx.scale.long)})


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
    chunks = [ctx.long(), *[ctx.target(k) for k in range(n - 1)]]
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
        _one_step(chunks, a_layout, f"{n} requests (one of {ctx.scale.long} tokens)"),
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
    private copies. The parent's last page is partly filled; a request that repeats the whole
    prompt shares that partly filled page too."""
    P = ctx.scale.page_size
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


def _spec_verify(ctx: CaseContext) -> Case:
    """A speculative-decoding verify step (k draft tokens appended to a long context) vs the
    same tokens decoded one at a time, or vs one plain prefill call of the whole request."""
    k = ctx.rng.randint(*ctx.scale.draft)
    r = ctx.request(ctx.scale.long + k if ctx.index % 2 == 0 else
                    ctx.rng.randint(*ctx.scale.prefill_len) + k)
    others = [ctx.decode() for _ in range(ctx.ladder(ctx.index, at_most=8) - 1)]
    layout = ctx.layout()
    verify = Chunk(r.id, r.length - k, r.length)
    a = _steps([[Chunk(r.id, 0, r.length - k)], [verify, *others]], layout,
               f"request {r.id}: prefill of {r.length - k} tokens, then a verify step of {k} "
               f"draft tokens next to {len(others)} decodes")
    if ctx.index % 2 == 0:
        steps = [[Chunk(r.id, 0, r.length - k)]]
        steps += [[Chunk(r.id, t, t + 1)] for t in range(r.length - k, r.length)]
        b = _steps(steps, layout, f"request {r.id}: the same {k} tokens decoded one at a time")
    else:
        b = _one_step([Chunk(r.id, 0, r.length)], layout,
                      f"request {r.id}: all {r.length} tokens in one prefill call")
    return Case("spec_verify", ctx.workload(), a, b, (r.id,), {"draft_tokens": float(k)})


PERTURBATIONS: dict[str, Perturbation] = {
    p.name: p
    for p in [
        Perturbation("batch_size", "the same requests (short, longest, prefill) alone vs in "
                     "batches of every ladder size", _batch_size, cases_per_budget=1),
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
                     "pages (prefix cache, partly filled page included) vs private copies",
                     _prefix_sharing, cases_per_budget=2),
        Perturbation("spec_verify", "a speculative verify step of 2-8 draft tokens vs the same "
                     "tokens decoded one at a time, or prefilled in one call", _spec_verify,
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
