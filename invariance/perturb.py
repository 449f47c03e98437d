"""The perturbation catalogue: named generators of schedule pairs (DESIGN.md section 5).

Each perturbation yields :class:`Case` objects: a workload and two schedules that compute some of
the same (request, token) pairs in different ways. An invariant backend gives identical bits for
every token the two schedules share. Names and descriptions are public: reports show them.

Sizes come from a :class:`Scale`: ``small`` keeps every call tiny (CPU, Triton interpreter),
``large`` uses production shapes (32k-token neighbours, batches up to 256) for GPUs.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from invariance.schedule import Chunk, PageLayout, Schedule, Step
from invariance.workload import HeadConfig, Request, Workload

__all__ = [
    "PERTURBATIONS",
    "SCALES",
    "Case",
    "Perturbation",
    "Scale",
    "get_perturbation",
    "resolve_perturbations",
]


@dataclass(frozen=True)
class Scale:
    """Sizes the perturbations draw from.

    - ``short``: (min, max) length in tokens of an ordinary request's context.
    - ``long``: length of the hostile long neighbour.
    - ``batch_sizes``: batch sizes to sweep; they cross the usual split-heuristic thresholds
      (batch x heads against the SM count).
    - ``prefill``: (min, max) new tokens in a prefill chunk.
    - ``chunk_sizes``: chunk sizes for chunked prefill.
    - ``page_sizes``: page sizes for the paging perturbation; ``page_size`` is the default.
    - ``decode_tokens``: tokens decoded one at a time in ``prefill_vs_decode``.
    - ``prefill_len``: length of requests prefilled whole (chunked_prefill, prefill_vs_decode).
    """

    name: str
    short: tuple[int, int]
    long: int
    batch_sizes: tuple[int, ...]
    prefill: tuple[int, int]
    chunk_sizes: tuple[int, ...]
    page_sizes: tuple[int, ...]
    page_size: int
    decode_tokens: int
    prefill_len: tuple[int, int]


SCALES: dict[str, Scale] = {
    "small": Scale(
        name="small", short=(4, 96), long=1100, batch_sizes=(1, 2, 3, 5, 8, 13),
        prefill=(2, 24), chunk_sizes=(3, 7, 16), page_sizes=(1, 4, 16), page_size=4,
        decode_tokens=3, prefill_len=(24, 140),
    ),
    "large": Scale(
        name="large", short=(64, 4096), long=32768,
        batch_sizes=(1, 2, 4, 8, 16, 32, 64, 128, 256), prefill=(32, 512),
        chunk_sizes=(64, 256, 1000), page_sizes=(16, 32, 64), page_size=16,
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
class _Ctx:
    """What a generator needs: sizes, heads, dtype, a seeded RNG and id allocation."""

    scale: Scale
    heads: HeadConfig
    dtype: object
    seed: int
    rng: random.Random
    requests: list[Request] = field(default_factory=list)

    def request(self, length: int, padding: bool = False) -> Request:
        r = Request(len(self.requests), length, padding)
        self.requests.append(r)
        return r

    def short_len(self) -> int:
        return self.rng.randint(*self.scale.short)

    def decode(self, length: int | None = None) -> Chunk:
        """A decode step: the last token of a fresh request."""
        r = self.request(length if length is not None else self.short_len())
        return Chunk(r.id, r.length - 1, r.length)

    def prefill_chunk(self, context: int | None = None) -> Chunk:
        """A chunk of new tokens on top of an existing context (possibly empty)."""
        new = self.rng.randint(*self.scale.prefill)
        ctx = context if context is not None else self.rng.choice([0, self.short_len()])
        r = self.request(ctx + new)
        return Chunk(r.id, ctx, ctx + new)

    def target(self) -> Chunk:
        return self.decode() if self.rng.random() < 0.6 else self.prefill_chunk()

    def workload(self) -> Workload:
        return Workload(tuple(self.requests), self.heads, self.dtype, self.seed)  # type: ignore[arg-type]

    def layout(self, **kw: object) -> PageLayout:
        return PageLayout(page_size=self.scale.page_size, **kw)  # type: ignore[arg-type]


def _one_step(chunks: list[Chunk], layout: PageLayout, label: str) -> Schedule:
    return Schedule((Step(tuple(chunks)),), layout, label)


def _words(c: Chunk) -> str:
    return c.describe()


@dataclass(frozen=True)
class Perturbation:
    """A named generator of schedule pairs.

    ``cases_per_budget`` is how many cases one unit of budget buys (``check``'s ``budget``
    multiplies it).
    """

    name: str
    description: str
    generate: Callable[[_Ctx], Case]
    cases_per_budget: int = 3
    requires_cuda: bool = False

    def cases(
        self, *, scale: Scale, heads: HeadConfig, dtype: object, seed: int, budget: int
    ) -> Iterator[Case]:
        """Yield ``budget * cases_per_budget`` cases, each from its own seeded RNG."""
        for i in range(max(1, budget) * self.cases_per_budget):
            case_seed = zlib.crc32(f"{self.name}/{seed}/{i}".encode())
            ctx = _Ctx(scale, heads, dtype, case_seed, random.Random(case_seed))
            yield self.generate(ctx)


# --------------------------------------------------------------------------------------------
# Generators
# --------------------------------------------------------------------------------------------

def _batch_size(ctx: _Ctx) -> Case:
    sizes = [s for s in ctx.scale.batch_sizes if s > 1]
    n = sizes[ctx.rng.randrange(len(sizes))]
    target = ctx.target()
    others = [ctx.decode() for _ in range(n - 1)]
    wl = ctx.workload()
    layout = ctx.layout()
    return Case(
        "batch_size", wl,
        _one_step([target], layout, f"{_words(target)} alone"),
        _one_step([target, *others], layout,
                  f"{_words(target)} first in a batch of {n} decode requests"),
        (target.request_id,), {"batch_size": float(n)},
    )


def _position(ctx: _Ctx) -> Case:
    n = max(2, ctx.rng.choice([s for s in ctx.scale.batch_sizes if s > 1]))
    target = ctx.target()
    others = [ctx.target() for _ in range(n - 1)]
    k = ctx.rng.randrange(1, n)
    b_chunks = list(others)
    b_chunks.insert(k, target)
    layout = ctx.layout()
    return Case(
        "position", ctx.workload(),
        _one_step([target, *others], layout, f"{_words(target)} at position 0 of {n}"),
        _one_step(b_chunks, layout, f"{_words(target)} at position {k} of {n}"),
        (target.request_id,), {"batch_size": float(n), "position": float(k)},
    )


def _order(ctx: _Ctx) -> Case:
    n = max(2, ctx.rng.choice([s for s in ctx.scale.batch_sizes if s > 1]))
    chunks = [ctx.target() for _ in range(n)]
    shuffled = chunks[:]
    while n > 1 and shuffled == chunks:
        ctx.rng.shuffle(shuffled)
    layout = ctx.layout()
    order = " ".join(str(c.request_id) for c in shuffled)
    return Case(
        "order", ctx.workload(),
        _one_step(chunks, layout, f"{n} requests in order 0..{n - 1}"),
        _one_step(shuffled, layout, f"the same {n} requests in order {order}"),
        tuple(c.request_id for c in chunks), {"batch_size": float(n)},
    )


def _neighbors(ctx: _Ctx) -> Case:
    target = ctx.decode() if ctx.rng.random() < 0.7 else ctx.prefill_chunk()
    variant = ctx.rng.randrange(3)
    sizes = ctx.scale.batch_sizes
    layout = ctx.layout()
    if variant == 0:
        # One very long neighbour next to the target.
        long = ctx.decode(ctx.scale.long)
        a = _one_step([target], layout, f"{_words(target)} alone")
        b = _one_step([long, target], layout,
                      f"{_words(target)} next to a {ctx.scale.long}-token neighbour")
        feats = {"batch_size": 2.0, "neighbor_len": float(ctx.scale.long)}
    elif variant == 1:
        # One long neighbour among many short ones: the longest sequence and the batch size
        # both change, the two inputs of FA2/FlashInfer's split heuristic.
        n = sizes[-1]
        shorts = [ctx.decode(ctx.rng.randint(1, ctx.scale.short[0] + 8)) for _ in range(n - 2)]
        long = ctx.decode(ctx.scale.long)
        pos = ctx.rng.randrange(n - 1)
        chunks = [*shorts]
        chunks.insert(pos, target)
        chunks.append(long)
        few = [ctx.decode(ctx.rng.randint(1, ctx.scale.short[0] + 8)) for _ in range(2)]
        a = _one_step([target, *few], layout, f"{_words(target)} with 2 short neighbours")
        b = _one_step(chunks, layout,
                      f"{_words(target)} at position {pos} of {n} next to a "
                      f"{ctx.scale.long}-token neighbour and {n - 2} short ones")
        feats = {"batch_size": float(n), "neighbor_len": float(ctx.scale.long)}
    else:
        # Many short neighbours: batch sizes on either side of the heuristics' thresholds.
        lo, hi = sizes[1], sizes[-1]
        chunks_lo = [target, *[ctx.decode() for _ in range(lo - 1)]]
        extra = [ctx.decode() for _ in range(hi - lo)]
        a = _one_step(chunks_lo, layout, f"{_words(target)} first of {lo}")
        b = _one_step([*chunks_lo, *extra], layout, f"{_words(target)} first of {hi}")
        feats = {"batch_size": float(hi), "neighbor_len": float(ctx.scale.short[1])}
    return Case("neighbors", ctx.workload(), a, b, (target.request_id,), feats)


def _mixed(ctx: _Ctx) -> Case:
    n = ctx.rng.choice([s for s in ctx.scale.batch_sizes if 1 < s <= 64])
    layout = ctx.layout()
    if ctx.rng.random() < 0.6:
        target = ctx.decode()
        decodes = [ctx.decode() for _ in range(n - 1)]
        prefills = [ctx.prefill_chunk() for _ in range(max(1, n // 4))]
        chunks = [target, *decodes]
        mixed = [*chunks]
        for p in prefills:
            mixed.insert(ctx.rng.randrange(len(mixed) + 1), p)
        return Case(
            "mixed", ctx.workload(),
            _one_step(chunks, layout, f"{_words(target)} in a decode-only batch of {n}"),
            _one_step(mixed, layout, f"{_words(target)} in a batch of {n} decodes and "
                                     f"{len(prefills)} prefill chunk"
                                     f"{'s' if len(prefills) > 1 else ''}"),
            (target.request_id,), {"batch_size": float(len(mixed))},
        )
    target = ctx.prefill_chunk()
    decodes = [ctx.decode() for _ in range(n - 1)]
    return Case(
        "mixed", ctx.workload(),
        _one_step([target], layout, f"{_words(target)} alone"),
        _one_step([*decodes, target], layout, f"{_words(target)} after {n - 1} decode requests"),
        (target.request_id,), {"batch_size": float(n)},
    )


def _chunked_prefill(ctx: _Ctx) -> Case:
    r = ctx.request(ctx.rng.randint(*ctx.scale.prefill_len))
    size = ctx.rng.choice(ctx.scale.chunk_sizes)
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


def _prefill_vs_decode(ctx: _Ctx) -> Case:
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


def _paging(ctx: _Ctx) -> Case:
    n = ctx.rng.choice([s for s in ctx.scale.batch_sizes if 1 < s <= 16])
    chunks = [ctx.target() for _ in range(n)]
    a_layout = ctx.layout()
    b_layout = PageLayout(
        page_size=ctx.rng.choice(ctx.scale.page_sizes),
        placement=ctx.rng.choice(["shuffled", "reversed", "interleaved"]),
        extra_pages=ctx.rng.randint(0, 8),
        seed=ctx.seed,
    )
    return Case(
        "paging", ctx.workload(),
        _one_step(chunks, a_layout, f"{n} requests"),
        _one_step(chunks, b_layout, f"the same {n} requests"),
        tuple(c.request_id for c in chunks), {"page_size": float(b_layout.page_size)},
    )


def _padding(ctx: _Ctx) -> Case:
    n = ctx.rng.choice([s for s in ctx.scale.batch_sizes if 1 < s <= 16])
    chunks = [ctx.target() for _ in range(n)]
    padded = list(chunks)
    pads = []
    for kind in ("empty", "no-query", "dummy-decode", "dummy-decode"):
        if kind == "empty":
            r = ctx.request(0, padding=True)
            c = Chunk(r.id, 0, 0)
        elif kind == "no-query":
            r = ctx.request(ctx.short_len(), padding=True)
            c = Chunk(r.id, r.length, r.length)
        else:
            r = ctx.request(1, padding=True)
            c = Chunk(r.id, 0, 1)
        pads.append(kind)
        padded.insert(ctx.rng.randrange(len(padded) + 1), c)
    a_layout = ctx.layout()
    b_layout = ctx.layout(extra_pages=3, extra_columns=ctx.rng.randint(1, 5), seed=ctx.seed)
    return Case(
        "padding", ctx.workload(),
        _one_step(chunks, a_layout, f"{n} requests"),
        _one_step(padded, b_layout,
                  f"the same {n} requests padded with dummy requests "
                  "(empty, KV-only, 1-token decodes)"),
        tuple(c.request_id for c in chunks), {"batch_size": float(len(padded))},
    )


def _repeat(ctx: _Ctx) -> Case:
    n = ctx.rng.choice([s for s in ctx.scale.batch_sizes if 1 < s <= 64])
    chunks = [ctx.target() for _ in range(n)]
    s = _one_step(chunks, ctx.layout(), f"{n} mixed requests")
    return Case("repeat", ctx.workload(), s,
                Schedule(s.steps, s.layout, f"the same {n} mixed requests, run again"),
                tuple(c.request_id for c in chunks), {"batch_size": float(n)})


def _uninitialized(ctx: _Ctx) -> Case:
    n = ctx.rng.choice([s for s in ctx.scale.batch_sizes if 1 < s <= 16])
    chunks = [ctx.target() for _ in range(n)]
    a = _one_step(chunks, ctx.layout(), f"{n} requests")
    b = Schedule(a.steps, ctx.layout(fill="nan", extra_pages=2, extra_columns=2, seed=ctx.seed),
                 f"the same {n} requests, unused cache slots and block-table columns "
                 "pointing at NaN", poison=True)
    return Case("uninitialized", ctx.workload(), a, b,
                tuple(c.request_id for c in chunks), {"batch_size": float(n)})


def _cuda_graph(ctx: _Ctx) -> Case:
    n = ctx.rng.choice([s for s in ctx.scale.batch_sizes if 1 < s <= 64])
    chunks = [ctx.target() for _ in range(n)]
    a = _one_step(chunks, ctx.layout(), f"{n} requests, eager")
    b = Schedule(a.steps, a.layout, f"the same {n} requests", graph=True)
    return Case("cuda_graph", ctx.workload(), a, b,
                tuple(c.request_id for c in chunks), {"batch_size": float(n)})


PERTURBATIONS: dict[str, Perturbation] = {
    p.name: p
    for p in [
        Perturbation("batch_size", "the same request alone vs in batches of other sizes",
                     _batch_size, cases_per_budget=4),
        Perturbation("position", "the same request at another position in the same batch",
                     _position),
        Perturbation("order", "the same batch with its requests in another order", _order),
        Perturbation("neighbors",
                     "the same request next to other neighbours: one very long neighbour, "
                     "many short ones, batch sizes across split-heuristic thresholds",
                     _neighbors, cases_per_budget=4),
        Perturbation("mixed", "a decode (or prefill) request in a decode-only batch vs a batch "
                     "mixing prefill chunks and decodes", _mixed, cases_per_budget=4),
        Perturbation("chunked_prefill",
                     "a prompt prefilled in one call vs in chunks over several calls",
                     _chunked_prefill, cases_per_budget=2),
        Perturbation("prefill_vs_decode",
                     "tokens computed inside a prefill vs one at a time as decode steps",
                     _prefill_vs_decode, cases_per_budget=2),
        Perturbation("paging", "the same batch with another page size and physical page "
                     "placement (shuffled, reversed, interleaved, with holes)", _paging),
        Perturbation("padding", "the same batch padded with dummy requests and block-table "
                     "columns, as CUDA-graph padding does", _padding),
        Perturbation("repeat", "the same batch run twice (run-to-run determinism)", _repeat),
        Perturbation("uninitialized", "the same batch with unused cache slots, block-table "
                     "padding and free device memory filled with NaN", _uninitialized,
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
