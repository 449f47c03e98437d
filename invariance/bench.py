"""Time attention backends on named workloads against the GPU's limits measured in the same run.

    report = run_bench(["kernels"], names=["decode-b64-ctx8k"], baseline="flashinfer")

- **Workloads** (:data:`WORKLOADS`, or :func:`parse_lengths` for your own): query and KV lengths
  per request; the tensors are random (seed-fixed), bf16 by default, heads 32:8:128, page size
  16, physical pages shuffled. ``decode-b{1,8,64}-ctx{1k,8k,32k}`` and ``decode-b256-ctx8k``:
  B decodes at one KV length; ``decode-prod64``: 64 decodes with production-like mixed KV
  lengths; ``mixed64``: 32 decodes plus 32 prefill chunks; ``prefill-varlen``: 8 prompts of mixed
  lengths, causal from position 0.
- **Timing** (:class:`CudaTimer`): the backend's planning step (if any) outside the timed region,
  then CUDA-graph capture and the median of ``iters`` replays, each after an L2 flush (a write of
  a buffer larger than L2), timed by CUDA events: GPU time without launch overhead, as an engine
  replaying graphs pays. A backend that cannot be captured (its capabilities say so, or the
  capture fails) is timed eagerly, launch overhead included, with a note.
- **Limits** (:func:`measure_limits`): HBM read bandwidth (a float32 sum over a large bf16
  buffer), copy bandwidth and the bf16 matmul peak (8192³), measured with the same timer.
- **Ideal time** (:func:`ideal_ms`): decode, KV bytes (each request's K and V read once) / HBM
  read bandwidth; prefill, causal FLOPs (``4 * D * Hq * attended keys``) / matmul peak; mixed,
  the larger of the two. A backend's *fraction of ideal* is ideal / its time.
- **Invariance tax**: each backend's time / the ``baseline``'s time on the same workload.

The timer and the limits are injectable (``timer=``, ``limits=``), so everything but the GPU
timing runs and is tested on a CPU. The core imports no rich; ``invariance.render.bench`` renders
a :class:`BenchReport`; ``invariance bench`` is the CLI.
"""

from __future__ import annotations

import json
import math
import re
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal, Protocol

import torch

from invariance.backends import Backend, ResolvedBackend, capabilities, planner, resolve
from invariance.batch import AttentionBatch
from invariance.features import Features, sink_values
from invariance.workload import HeadConfig, dtype_name, parse_dtype

__all__ = [
    "BENCH_HEADS",
    "BENCH_PAGE_SIZE",
    "BEST_OF",
    "GRIDS",
    "SCHEMA",
    "WORKLOADS",
    "BenchReport",
    "BenchWorkload",
    "CudaTimer",
    "Limits",
    "Timer",
    "Timing",
    "WorkloadResult",
    "build_batch",
    "causal_flops",
    "first_line",
    "graph_replay",
    "ideal_ms",
    "kv_bytes",
    "measure_limits",
    "parse_lengths",
    "run_bench",
    "select_workloads",
]

SCHEMA = "invariance-bench/1"
BENCH_HEADS = HeadConfig(32, 8, 128)
BENCH_PAGE_SIZE = 16


# --------------------------------------------------------------------------------------------
# Workloads
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class BenchWorkload:
    """Query and KV lengths of each request of one attention call (``q_len <= kv_len``)."""

    name: str
    q_lens: tuple[int, ...]
    kv_lens: tuple[int, ...]
    notes: str = ""
    #: The workload's own head configuration, dtype name and page size (None: the run's).
    heads: HeadConfig | None = None
    dtype: str | None = None
    page_size: int | None = None

    def __post_init__(self) -> None:
        if not self.q_lens or len(self.q_lens) != len(self.kv_lens):
            raise ValueError(f"workload {self.name}: expected one q_len per kv_len and at least "
                             f"one request, got {len(self.q_lens)} and {len(self.kv_lens)}")
        for q, kv in zip(self.q_lens, self.kv_lens, strict=True):
            if not 1 <= q <= kv:
                raise ValueError(f"workload {self.name}: expected 1 <= q_len <= kv_len, got "
                                 f"q_len={q}, kv_len={kv}")

    @property
    def kind(self) -> str:
        """``decode`` (every q_len 1), ``prefill`` (every request from position 0) or
        ``mixed``."""
        if all(q == 1 for q in self.q_lens):
            return "decode"
        if all(q == kv for q, kv in zip(self.q_lens, self.kv_lens, strict=True)):
            return "prefill"
        return "mixed"

    @property
    def query_tokens(self) -> int:
        return sum(self.q_lens)


def _workloads() -> dict[str, BenchWorkload]:
    w: dict[str, BenchWorkload] = {}
    for b in (1, 8, 64, 256):
        for ctx_name, ctx in (("1k", 1024), ("8k", 8192), ("32k", 32768)):
            if b == 256 and ctx != 8192:
                continue
            name = f"decode-b{b}-ctx{ctx_name}"
            w[name] = BenchWorkload(name, (1,) * b, (ctx,) * b)
    g = torch.Generator().manual_seed(64)
    choices = torch.tensor([4096, 8192, 16384, 32768])
    idx = torch.multinomial(torch.tensor([35.0, 20.0, 15.0, 12.0]), 64, replacement=True,
                            generator=g)
    w["decode-prod64"] = BenchWorkload(
        "decode-prod64", (1,) * 64, tuple(choices[idx].tolist()),
        "KV lengths from [4k, 8k, 16k, 32k] with weights [35, 20, 15, 12]")
    g = torch.Generator().manual_seed(65)
    q_lens: list[int] = []
    kv_lens: list[int] = []
    for i in range(64):
        if i % 2 == 0:
            q_lens.append(1)
            kv_lens.append(int(torch.randint(1, 8193, (1,), generator=g)))
        else:
            q = int(torch.randint(32, 513, (1,), generator=g))
            ctx = int(torch.randint(1, 8193, (1,), generator=g))
            q_lens.append(q)
            kv_lens.append(max(ctx, q))
    w["mixed64"] = BenchWorkload(
        "mixed64", tuple(q_lens), tuple(kv_lens),
        "32 decode rows on KV 1..8192 + 32 prefill chunks of 32..512 tokens")
    lens = (16384, 8192, 4096, 4096, 2048, 1024, 512, 512)
    w["prefill-varlen"] = BenchWorkload("prefill-varlen", lens, lens, "causal prefill from 0")
    return w


#: The named workloads (module docstring).
WORKLOADS: dict[str, BenchWorkload] = _workloads()


def _variant(prefix: str, w: BenchWorkload, **shape: Any) -> BenchWorkload:
    """``w`` under another head configuration, dtype or page size, named ``prefix/name``."""
    return replace(w, name=f"{prefix}/{w.name}", **shape)


def _shapes_grid() -> list[BenchWorkload]:
    """The shape classes a model server meets beyond the default set: head dims 64 and 256,
    GQA groups 1 and 8, fp16, page sizes 1 and 64, decode batches of 512 and of one very long
    row, ragged decode, short and long prompts, chunked prefill, a speculative verify step and
    an engine-style mixed step."""
    W = WORKLOADS
    g = torch.Generator().manual_seed(66)
    ragged = tuple(int(x) for x in torch.randint(1024, 32769, (64,), generator=g))
    extra = [
        BenchWorkload("decode-b512-ctx1k", (1,) * 512, (1024,) * 512),
        BenchWorkload("decode-b32-ctx2k", (1,) * 32, (2048,) * 32),
        BenchWorkload("decode-b1-ctx64k", (1,), (65536,)),
        BenchWorkload("decode-b1-ctx128k", (1,), (131072,)),
        BenchWorkload("decode-ragged64", (1,) * 64, ragged, "KV lengths uniform in 1k..32k"),
        BenchWorkload("prefill-short64", (128,) * 64, (128,) * 64, "64 prompts of 128 tokens"),
        BenchWorkload("prefill-long32k", (32768,), (32768,), "one prompt of 32k tokens"),
        BenchWorkload("chunked-prefill", (2048,) * 2 + (1,) * 32, (16384,) * 2 + (8192,) * 32,
                      "2 chunks of 2k tokens at 16k + 32 decodes of 8k"),
        BenchWorkload("spec-verify32", (4,) * 32, (8192,) * 32,
                      "32 verify steps of 4 query tokens at 8k"),
    ]
    hd64, hd256 = HeadConfig(64, 8, 64), HeadConfig(16, 8, 256)
    mha, gqa8 = HeadConfig(32, 32, 128), HeadConfig(64, 8, 128)
    return [
        *(_variant("hd64", W[n], heads=hd64)
          for n in ("decode-b8-ctx8k", "decode-b64-ctx8k", "prefill-varlen")),
        *(_variant("hd256", W[n], heads=hd256)
          for n in ("decode-b8-ctx8k", "decode-b64-ctx8k", "prefill-varlen")),
        *(_variant("mha", W[n], heads=mha) for n in ("decode-b8-ctx8k", "decode-b64-ctx8k")),
        *(_variant("gqa8", W[n], heads=gqa8) for n in ("decode-b8-ctx8k", "decode-b64-ctx8k")),
        *(_variant("fp16", W[n], dtype="float16") for n in ("decode-b8-ctx8k", "prefill-varlen")),
        *(_variant("page1", W[n], page_size=1)
          for n in ("decode-b8-ctx8k", "decode-b64-ctx8k", "mixed64")),
        *(_variant("page64", W[n], page_size=64) for n in ("decode-b8-ctx8k", "decode-b64-ctx8k")),
        *extra,
    ]


#: Named sets of workloads (``invariance bench --grid NAME``): ``default`` is
#: :data:`WORKLOADS`; ``shapes`` the classes of :func:`_shapes_grid`.
GRIDS: dict[str, list[BenchWorkload]] = {"default": list(WORKLOADS.values()),
                                         "shapes": _shapes_grid()}

#: Composite baselines: every variant timed on each workload, the fastest kept and named.
#: ``flashinfer-best``: FlashInfer's decode wrapper on CUDA cores and on tensor cores (its
#: own choice of prefill kernel and fa2), its prefill wrapper for every row (fa2) and FA3.
BEST_OF: dict[str, tuple[str, ...]] = {
    "flashinfer-best": ("flashinfer", "flashinfer:use_tensor_cores=true",
                        "flashinfer:use_tensor_cores=true,backend=fa2",
                        "flashinfer-prefill:backend=fa2", "flashinfer-fa3"),
}

_LENGTH = re.compile(r"\s*([0-9]+)\s*([kK]?)\s*")


def _length(text: str, spec: str) -> int:
    m = _LENGTH.fullmatch(text)
    if not m or int(m.group(1)) < 1:
        raise ValueError(f"lengths {spec!r}: expected a length like 4096 or 4k, got {text!r}")
    return int(m.group(1)) * (1024 if m.group(2) else 1)


def _count(text: str, spec: str) -> tuple[str, int]:
    head, sep, n = text.rpartition("x")
    if not sep:
        return text, 1
    if not n.strip().isdigit() or int(n) < 1:
        raise ValueError(f"lengths {spec!r}: expected a count >= 1 after 'x', got {text!r}")
    return head, int(n)


def parse_lengths(spec: str) -> BenchWorkload:
    """A workload from text: parts joined by ``+``, each ``KIND:ITEM[,ITEM...]`` with an item
    ``L[xN]`` (N requests of length L; ``k`` = 1024):

    - ``decode:4096x32``: 32 decodes with 4096 tokens of KV;
    - ``prefill:2048x4,512``: prompts of 2048 (four) and 512 tokens, causal from position 0;
    - ``chunk:256/4096x8``: 8 prefill chunks of 256 query tokens ending at KV 4096.

    E.g. ``decode:8kx48+chunk:512/2048x2``. The workload is named by the text."""
    q_lens: list[int] = []
    kv_lens: list[int] = []
    for part in spec.split("+"):
        kind, sep, items = part.partition(":")
        kind = kind.strip()
        if not sep or kind not in ("decode", "prefill", "chunk") or not items.strip():
            raise ValueError(f"lengths {spec!r}: expected parts 'decode:L[xN],...', "
                             f"'prefill:L[xN],...' or 'chunk:Q/L[xN],...' joined by '+', got "
                             f"{part!r}")
        for item in items.split(","):
            body, n = _count(item, spec)
            if kind == "chunk":
                q_text, slash, kv_text = body.partition("/")
                if not slash:
                    raise ValueError(f"lengths {spec!r}: expected a chunk as Q/L, got {item!r}")
                q, kv = _length(q_text, spec), _length(kv_text, spec)
                if q > kv:
                    raise ValueError(f"lengths {spec!r}: a chunk's {q} query tokens exceed its "
                                     f"KV length {kv}")
            else:
                kv = _length(body, spec)
                q = 1 if kind == "decode" else kv
            q_lens += [q] * n
            kv_lens += [kv] * n
    return BenchWorkload(spec.strip(), tuple(q_lens), tuple(kv_lens), "from --lengths")


def select_workloads(names: Sequence[str] | None = None,
                     lengths: Sequence[str] | None = None,
                     grids: Sequence[str] | None = None) -> list[BenchWorkload]:
    """The workloads of the named ``grids`` (:data:`GRIDS`), then the named workloads, then one
    per ``lengths`` spec (all of :data:`WORKLOADS` when none is given); each once, in that
    order. ``ValueError`` naming an unknown grid or workload."""
    names, lengths, grids = list(names or []), list(lengths or []), list(grids or [])
    bad_grids = [g for g in grids if g not in GRIDS]
    if bad_grids:
        raise ValueError(f"grid: unknown {', '.join(bad_grids)}; expected one of "
                         f"{', '.join(GRIDS)}")
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        raise ValueError(f"workload: unknown {', '.join(unknown)}; expected one of "
                         f"{', '.join(WORKLOADS)}")
    if not names and not lengths and not grids:
        names = list(WORKLOADS)
    chosen = [w for g in grids for w in GRIDS[g]] + [WORKLOADS[n] for n in names]
    chosen += [parse_lengths(s) for s in lengths]
    unique: dict[str, BenchWorkload] = {}
    for w in chosen:
        unique.setdefault(w.name, w)
    return list(unique.values())


def build_batch(w: BenchWorkload, heads: HeadConfig = BENCH_HEADS,
                dtype: torch.dtype = torch.bfloat16, page_size: int = BENCH_PAGE_SIZE,
                device: torch.device | str = "cuda", seed: int = 0,
                features: Features | None = None) -> AttentionBatch:
    """The workload's tensors: random q, K, V (normal, seed-fixed) on shuffled physical pages,
    with ``features`` (a window, sinks of :func:`~invariance.features.sink_values`, a
    soft-cap, an FP8 cache: K and V divided by the fixed scales of
    :meth:`~invariance.features.Features.kv_scale_values` and rounded to ``float8_e4m3fn``)."""
    dev = torch.device(device)
    g = torch.Generator(device=dev).manual_seed(seed)
    n_pages = [math.ceil(k / page_size) for k in w.kv_lens]
    total = sum(n_pages)
    perm = torch.randperm(total, device=dev, generator=g).to(torch.int32)
    table = torch.zeros((len(n_pages), max(n_pages)), dtype=torch.int32, device=dev)
    off = 0
    for b, n in enumerate(n_pages):
        table[b, :n] = perm[off:off + n]
        off += n
    Hq, Hkv, D = heads.num_q_heads, heads.num_kv_heads, heads.head_dim
    shape = (total, page_size, Hkv, D)
    k = torch.randn(shape, device=dev, dtype=dtype, generator=g)
    v = torch.randn(shape, device=dev, dtype=dtype, generator=g)
    q = torch.randn((w.query_tokens, Hq, D), device=dev, dtype=dtype, generator=g)
    cu = [0]
    for n in w.q_lens:
        cu.append(cu[-1] + n)
    extra: dict[str, Any] = {}
    if features:
        extra = {"window_left": features.window_left,
                 "logits_soft_cap": features.logits_soft_cap}
        if features.sinks:
            extra["sinks"] = torch.tensor(sink_values(seed, Hq), dtype=torch.float32,
                                          device=dev)
        if features.kv_dtype is not None:
            k, extra["k_scale"] = _fp8_cache(k, features, "k")
            v, extra["v_scale"] = _fp8_cache(v, features, "v")
    return AttentionBatch(
        q=q, k_cache=k, v_cache=v,
        cu_seqlens_q=torch.tensor(cu, dtype=torch.int32, device=dev),
        kv_lens=torch.tensor(w.kv_lens, dtype=torch.int32, device=dev),
        block_table=table, sm_scale=1.0 / math.sqrt(D), **extra)


def _fp8_cache(x: torch.Tensor, features: Features, kind: Literal["k", "v"]
               ) -> tuple[torch.Tensor, float | torch.Tensor]:
    """``x`` as the FP8 cache of ``features`` and its dequantization scale (per tensor or per
    KV head, the check's fixed values)."""
    values = features.kv_scale_values(kind, x.shape[2])
    scale = torch.tensor(values, dtype=torch.float32, device=x.device)
    q8 = (x.float() / scale[:, None]).to(features.cache_dtype(x.dtype))
    return q8, (scale if features.kv_scale == "head" else float(values[0]))


# --------------------------------------------------------------------------------------------
# Physical limits and the ideal time
# --------------------------------------------------------------------------------------------

def _visible_keys(q_len: int, kv_len: int, window: int) -> tuple[int, int]:
    """``(keys read, attended (row, key) pairs)`` of one request whose last ``q_len`` of
    ``kv_len`` tokens are queries: row ``i`` (absolute position ``p``) attends to ``p + 1`` keys,
    at most ``window + 1`` with a window (``window < 0``: none)."""
    first = kv_len - q_len
    if window < 0:
        return kv_len, q_len * first + q_len * (q_len + 1) // 2
    read = kv_len - max(0, first - window)
    # rows at positions p < window attend p + 1 keys, the rest window + 1
    full = max(0, min(kv_len, window) - first)  # rows below the window's reach
    pairs = full * first + full * (full + 1) // 2 + (q_len - full) * (window + 1)
    return read, pairs


def kv_bytes(w: BenchWorkload, heads: HeadConfig = BENCH_HEADS,
             dtype: torch.dtype = torch.bfloat16, features: Features | None = None) -> int:
    """Bytes of K and V the call must read: each request's visible KV once (in the cache's
    dtype: one byte per value with an FP8 cache)."""
    window = features.window_left if features else -1
    itemsize = (features.cache_dtype(dtype) if features else dtype).itemsize
    keys = sum(_visible_keys(q, k, window)[0] for q, k in zip(w.q_lens, w.kv_lens, strict=True))
    return keys * heads.num_kv_heads * heads.head_dim * 2 * itemsize


def causal_flops(w: BenchWorkload, heads: HeadConfig = BENCH_HEADS,
                 features: Features | None = None) -> int:
    """``4 * D * Hq * sum over query rows of attended keys`` (q·kᵀ and p·v, 2 FLOPs per MAC);
    row ``i`` of a request with ``q_len`` Q and ``kv_len`` K attends to ``K - Q + i + 1`` keys
    (at most ``window + 1`` with a window)."""
    window = features.window_left if features else -1
    rows = sum(_visible_keys(q, k, window)[1] for q, k in zip(w.q_lens, w.kv_lens, strict=True))
    return 4 * heads.head_dim * heads.num_q_heads * rows


@dataclass(frozen=True)
class Limits:
    """The GPU's limits measured in the run: HBM read and copy bandwidth (GB/s, 1e9 bytes) and
    the bf16 matmul peak (TFLOP/s)."""

    hbm_read_GBps: float
    copy_GBps: float
    matmul_TFLOPs: float


def ideal_ms(w: BenchWorkload, limits: Limits, heads: HeadConfig = BENCH_HEADS,
             dtype: torch.dtype = torch.bfloat16,
             features: Features | None = None) -> tuple[float, str]:
    """``(milliseconds, bound)``: the time the workload needs at the measured limits, and
    whether it is ``memory`` (KV bytes / HBM read bandwidth) or ``compute`` (causal FLOPs /
    matmul peak) bound. Decode is memory, prefill compute, mixed the larger of the two."""
    mem = kv_bytes(w, heads, dtype, features) / (limits.hbm_read_GBps * 1e6)
    flop = causal_flops(w, heads, features) / (limits.matmul_TFLOPs * 1e9)
    if w.kind == "decode":
        return mem, "memory"
    if w.kind == "prefill":
        return flop, "compute"
    return (mem, "memory") if mem >= flop else (flop, "compute")


# --------------------------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------------------------

@dataclass
class Timing:
    """One backend on one workload: the median ``ms`` (``None`` when it failed), how it was run
    (``graph`` replay or ``eager`` calls), a ``note`` (why eager) and the ``error``."""

    ms: float | None
    mode: str = "graph"
    note: str = ""
    error: str = ""
    #: A composite backend (:data:`BEST_OF`): which variant was fastest, and each variant's ms.
    variant: str = ""
    candidates: dict[str, float | None] = field(default_factory=dict)


class Timer(Protocol):
    """What :func:`run_bench` times with (inject a fake one to run without a GPU)."""

    def time_backend(self, backend: ResolvedBackend, batch: AttentionBatch) -> Timing: ...

    def time_fn(self, fn: Callable[[], object]) -> float: ...


def first_line(exc: BaseException) -> str:
    """An exception as one short line: its type and the first line of its message."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def graph_replay(fn: Callable[[], object], device: torch.device | str) -> Callable[[], object]:
    """``fn`` captured in a CUDA graph after one warm-up call on a side stream (as an engine
    replays its step): the replay. ``fn`` itself on a CPU device."""
    device = torch.device(device)
    if device.type != "cuda":
        return fn
    stream = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


class CudaTimer:
    """Median CUDA-event time of ``iters`` runs after ``warmup``, each after an L2 flush (a
    ``zero_()`` of a buffer of twice the L2 size, at least 256 MiB); backends are captured in a
    CUDA graph and replayed (module docstring)."""

    def __init__(self, iters: int = 50, warmup: int = 10,
                 device: torch.device | str = "cuda") -> None:
        if iters < 1 or warmup < 0:
            raise ValueError(f"iters: expected >= 1 (warmup >= 0), got {iters} ({warmup})")
        self.iters, self.warmup = iters, warmup
        self.device = torch.device(device)
        l2 = int(getattr(torch.cuda.get_device_properties(self.device), "L2_cache_size",
                         64 << 20))
        self._flush = torch.empty(max(2 * l2, 256 << 20), dtype=torch.uint8,
                                  device=self.device)

    def time_fn(self, fn: Callable[[], object]) -> float:
        fn()
        torch.cuda.synchronize(self.device)
        for _ in range(self.warmup):
            fn()
        starts = [torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
                  for _ in range(self.iters)]
        ends = [torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
                for _ in range(self.iters)]
        for s, e in zip(starts, ends, strict=True):
            self._flush.zero_()
            s.record()  # type: ignore[no-untyped-call]
            fn()
            e.record()  # type: ignore[no-untyped-call]
        torch.cuda.synchronize(self.device)
        return float(statistics.median(s.elapsed_time(e)  # type: ignore[no-untyped-call]
                                       for s, e in zip(starts, ends, strict=True)))

    def _capture(self, backend: ResolvedBackend, batch: AttentionBatch) -> Callable[[], object]:
        plan = planner(backend)
        if plan is not None:
            plan(batch, True)
        return graph_replay(lambda: backend(batch), self.device)

    def time_backend(self, backend: ResolvedBackend, batch: AttentionBatch) -> Timing:
        note = ""
        if capabilities(backend).cuda_graphs:
            try:
                return Timing(self.time_fn(self._capture(backend, batch)), "graph")
            except Exception as exc:  # a capture that fails: time it eagerly, say why
                torch.cuda.synchronize(self.device)
                note = f"eager: CUDA-graph capture failed ({first_line(exc)})"
        else:
            note = "eager: the backend declares that it cannot be captured in a CUDA graph"
        plan = planner(backend)
        if plan is not None:
            plan(batch, False)  # planned once, not timed (an engine plans once per step)
        return Timing(self.time_fn(lambda: backend(batch)), "eager", note)


def _bandwidth(timer: Timer, device: torch.device | str, nbytes: int) -> tuple[float, float]:
    x = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=device).normal_()
    y = torch.empty_like(x)
    return (timer.time_fn(lambda: x.sum(dtype=torch.float32)),
            timer.time_fn(lambda: y.copy_(x)))


def measure_limits(timer: Timer, device: torch.device | str = "cuda",
                   nbytes: int = 2 << 30, matmul: int = 8192) -> Limits:
    """HBM read bandwidth (float32 sum of ``nbytes`` of bf16), copy bandwidth (read + write of
    ``nbytes``) and the bf16 matmul peak (``matmul``³), timed with ``timer``."""
    t_sum, t_copy = _bandwidth(timer, device, nbytes)
    a = torch.randn(matmul, matmul, dtype=torch.bfloat16, device=device)
    b = torch.randn(matmul, matmul, dtype=torch.bfloat16, device=device)
    t_mm = timer.time_fn(lambda: torch.matmul(a, b))
    return Limits(hbm_read_GBps=nbytes / t_sum / 1e6, copy_GBps=2 * nbytes / t_copy / 1e6,
                  matmul_TFLOPs=2 * matmul**3 / t_mm / 1e9)


# --------------------------------------------------------------------------------------------
# The run and its report
# --------------------------------------------------------------------------------------------

@dataclass
class WorkloadResult:
    """One workload: its sizes, its ideal time and every backend's :class:`Timing`."""

    workload: str
    kind: str
    requests: int
    query_tokens: int
    max_kv: int
    kv_bytes: int
    flops: int
    ideal_ms: float
    bound: str
    notes: str
    times: dict[str, Timing] = field(default_factory=dict)
    #: The workload's head configuration, dtype and page size.
    heads: str = ""
    dtype: str = ""
    page_size: int = 0


@dataclass
class BenchReport:
    """What ``invariance bench`` measured (JSON: :meth:`to_json`, schema :data:`SCHEMA`)."""

    backends: list[str]
    baseline: str | None
    dtype: str
    heads: str
    page_size: int
    limits: Limits
    results: list[WorkloadResult]
    environment: dict[str, Any] = field(default_factory=dict)
    timing: str = ""
    command: str = ""
    #: The features every workload ran with (:meth:`~invariance.features.Features.to_dict`;
    #: ``{}``: none).
    features: dict[str, Any] = field(default_factory=dict)

    def ms(self, result: WorkloadResult, backend: str) -> float | None:
        t = result.times.get(backend)
        return t.ms if t is not None else None

    def ratio(self, result: WorkloadResult, backend: str) -> float | None:
        """``backend``'s time / the baseline's (the invariance tax); ``None`` when either is
        missing or there is no baseline."""
        if self.baseline is None:
            return None
        a, b = self.ms(result, backend), self.ms(result, self.baseline)
        return a / b if a is not None and b else None

    def fraction(self, result: WorkloadResult, backend: str) -> float | None:
        """Ideal time / ``backend``'s time (1.0 = at the measured limit)."""
        t = self.ms(result, backend)
        return result.ideal_ms / t if t else None

    def errors(self) -> list[tuple[str, str, str]]:
        """``(workload, backend, error)`` of every failed timing."""
        return [(r.workload, name, t.error) for r in self.results
                for name, t in r.times.items() if t.error]

    def notes(self) -> list[tuple[str, str, str]]:
        """``(workload, backend, note)`` of every timing with a note (eager fallbacks)."""
        return [(r.workload, name, t.note) for r in self.results
                for name, t in r.times.items() if t.note]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d = {"schema": SCHEMA, **d}
        return d

    def to_json(self, indent: int = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)


def _unsupported(b: ResolvedBackend, dtype: torch.dtype, heads: HeadConfig,
                 device: torch.device, features: Features | None = None) -> str | None:
    """Why backend ``b`` cannot run this dtype, head dim, device or these features (None: it
    can)."""
    caps = capabilities(b)
    lacks = caps.lacks(features.required if features else frozenset())
    if lacks is not None:
        return f"features: backend {b.name} {lacks}"
    name = dtype_name(dtype)
    if name not in caps.dtypes:
        return f"dtype: backend {b.name} supports {', '.join(caps.dtypes)}, got {name}"
    if caps.head_dims is not None and heads.head_dim not in caps.head_dims:
        return (f"heads: backend {b.name} supports head dims "
                f"{', '.join(map(str, caps.head_dims))}, got {heads}")
    if device.type not in caps.devices:
        return f"device: backend {b.name} runs on {', '.join(caps.devices)}, got {device.type}"
    return None


@dataclass
class _BestOf:
    """A composite backend (:data:`BEST_OF`): its variants, each timed, the fastest kept."""

    name: str
    variants: list[ResolvedBackend]


_Timed = ResolvedBackend | _BestOf


def _resolve_timed(spec: str | Backend) -> _Timed:
    if isinstance(spec, str) and spec in BEST_OF:
        return _BestOf(spec, [resolve(v) for v in BEST_OF[spec]])
    return resolve(spec)


def _time_one(timer: Timer, b: _Timed, batch: AttentionBatch, dtype: torch.dtype,
              heads: HeadConfig, device: torch.device,
              features: Features | None = None) -> Timing:
    """One backend (or every variant of a composite one) on one batch; a failure or an
    unsupported shape is recorded, never raised."""
    variants = b.variants if isinstance(b, _BestOf) else [b]
    timings: dict[str, Timing] = {}
    for v in variants:
        reason = _unsupported(v, dtype, heads, device, features)
        if reason is not None:
            timings[v.name] = Timing(None, "", "", f"unsupported: {reason}")
            continue
        try:
            timings[v.name] = timer.time_backend(v, batch)
        except Exception as exc:  # one failing backend must not hide the others
            timings[v.name] = Timing(None, "", "", first_line(exc))
    if not isinstance(b, _BestOf):
        return timings[b.name]
    ok = {n: t for n, t in timings.items() if t.ms is not None}
    candidates = {n: t.ms for n, t in timings.items()}
    if not ok:
        errors = "; ".join(f"{n}: {t.error}" for n, t in timings.items())
        return Timing(None, "", "", f"every variant failed ({errors})"[:600],
                      candidates=candidates)
    best = min(ok, key=lambda n: ok[n].ms or 0.0)
    t = ok[best]
    return Timing(t.ms, t.mode, t.note, "", variant=best, candidates=candidates)


def run_bench(
    backends: Sequence[str | Backend],
    workloads: Sequence[BenchWorkload] | None = None,
    *,
    names: Sequence[str] | None = None,
    baseline: str | Backend | None = None,
    dtype: torch.dtype | str = torch.bfloat16,
    heads: HeadConfig | str = BENCH_HEADS,
    page_size: int = BENCH_PAGE_SIZE,
    iters: int = 50,
    seed: int = 0,
    device: torch.device | str = "cuda",
    timer: Timer | None = None,
    limits: Limits | None = None,
    progress: Callable[[int, int, str], None] | None = None,
    features: Features | None = None,
) -> BenchReport:
    """Time each backend (names, ``module:attr``, callables, or a composite of
    :data:`BEST_OF`; the ``baseline`` first) on each workload (``workloads``, or those ``names``
    of :data:`WORKLOADS`, default all), each at its own head configuration, dtype and page size
    where it names them, else at the run's.

    ``timer`` defaults to a :class:`CudaTimer` of ``iters`` replays; ``limits`` to
    :func:`measure_limits` with that timer. A backend that fails on a workload is recorded with
    its error and the run goes on, and so is a workload shape a backend cannot run.
    ``features`` (:class:`~invariance.features.Features`) turn on a window, sinks, a soft-cap
    or an FP8 cache in every workload (:func:`build_batch`); the ideal time counts the keys a
    window leaves and the cache's bytes. ``ValueError`` for a backend that cannot run the run's
    own dtype, head dim, device or features, before anything is timed."""
    dt = parse_dtype(dtype)
    head_cfg = HeadConfig.parse(heads) if isinstance(heads, str) else heads
    dev = torch.device(device)
    wls = list(workloads) if workloads is not None else select_workloads(names)
    resolved = [_resolve_timed(b) for b in backends]
    base = _resolve_timed(baseline) if baseline is not None else None
    if base is not None:
        resolved = [base] + [b for b in resolved if b.name != base.name]
    if not resolved:
        raise ValueError("backend: expected at least one backend to time, got none")
    for b in resolved:  # the run's own shape: every backend must take it
        for v in (b.variants if isinstance(b, _BestOf) else [b]):
            reason = _unsupported(v, dt, head_cfg, dev, features)
            if reason is not None and not isinstance(b, _BestOf):
                raise ValueError(reason)
        if isinstance(b, _BestOf) and all(_unsupported(v, dt, head_cfg, dev, features)
                                          for v in b.variants):
            raise ValueError(f"{b.name}: no variant takes "
                             f"{features.describe() if features else 'this shape'}")
    timer = timer if timer is not None else CudaTimer(iters, device=dev)
    if limits is None:
        if progress is not None:
            progress(0, len(wls) * len(resolved), "measuring HBM bandwidth and matmul peak")
        limits = measure_limits(timer, dev)
    results: list[WorkloadResult] = []
    for i, w in enumerate(wls):
        results.append(_time_workload(w, resolved, timer, limits, head_cfg, dt, page_size, dev,
                                      seed, progress, i * len(resolved),
                                      len(wls) * len(resolved), features))
    done = len(wls) * len(resolved)
    if progress is not None:
        progress(done, len(wls) * len(resolved), "done")
    timing = (f"CUDA-graph replay, median of {iters} after an L2 flush (CUDA events)"
              if isinstance(timer, CudaTimer) else type(timer).__name__)
    return BenchReport(
        backends=[b.name for b in resolved], baseline=base.name if base is not None else None,
        dtype=dtype_name(dt), heads=str(head_cfg), page_size=page_size, limits=limits,
        results=results, timing=timing, features=features.to_dict() if features else {},
        environment=_environment(dev) | {"date_utc": time.strftime("%Y-%m-%d %H:%M:%S",
                                                                     time.gmtime())})


def _time_workload(w: BenchWorkload, resolved: Sequence[_Timed], timer: Timer, limits: Limits,
                   heads: HeadConfig, dtype: torch.dtype, page_size: int, dev: torch.device,
                   seed: int, progress: Callable[[int, int, str], None] | None, done: int,
                   total: int, features: Features | None = None) -> WorkloadResult:
    """Every backend on one workload, at the workload's own shape where it names one."""
    w_heads, w_page = w.heads or heads, w.page_size or page_size
    w_dtype = parse_dtype(w.dtype) if w.dtype else dtype
    ideal, bound = ideal_ms(w, limits, w_heads, w_dtype, features)
    res = WorkloadResult(w.name, w.kind, len(w.q_lens), w.query_tokens, max(w.kv_lens),
                         kv_bytes(w, w_heads, w_dtype, features),
                         causal_flops(w, w_heads, features), ideal,
                         bound, w.notes, heads=str(w_heads), dtype=dtype_name(w_dtype),
                         page_size=w_page)
    batch = build_batch(w, w_heads, w_dtype, w_page, dev, seed, features)
    for i, b in enumerate(resolved):
        if progress is not None:
            progress(done + i, total, f"{w.name}: {b.name}")
        res.times[b.name] = _time_one(timer, b, batch, w_dtype, w_heads, dev, features)
    del batch
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return res


def _environment(dev: torch.device) -> dict[str, Any]:
    from invariance.report import Environment

    env = Environment.capture(str(dev)).to_dict()
    if dev.type == "cuda":
        env["sms"] = torch.cuda.get_device_properties(dev).multi_processor_count
    return env
