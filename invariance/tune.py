"""Measure the bit-neutral launch settings of ``kernels`` on this GPU and write the table the
planner reads (:mod:`kernels.tuned`; ARCHITECTURE.md, "Tuning").

    result = run_tune(select_workloads(grids=["default", "shapes"]))
    Path("kernels/tuned/nvidia-h200.json").write_text(result.table_json())

For each shape bucket (:func:`kernels.tuned.bucket`) of the given workloads:

1. **Reference.** Every workload of the bucket runs with the rules (``Tuning()``, ``plan="auto"``):
   its output and LSE are the bits every candidate must reproduce, its time the one to beat.
2. **Search.** A coordinate search over :data:`kernels.tuned.TUNABLE`: both plans first, each
   also on each kernel family (the Triton kernels, the Gluon tile and, in the split plan, the
   keys-as-rows tile), then, from each of those
   within 1.5x of the fastest, one setting at a time, each value tried with the best settings
   so far. A candidate the
   planner refuses for one of the workloads (``ValueError``) is skipped; one whose launch plans
   equal a candidate already tried is not run again.
3. **Admission.** A candidate counts only if its output and LSE equal the reference's **bit for
   bit** on every workload of the bucket; otherwise it is recorded as rejected, with the number
   of differing elements. In every family (dtype, heads, page size) a *control* candidate with
   half the contract's KV tile (bit-defining, ``Tuning(block_n=...)``) must be rejected: if it
   is admitted the comparison cannot see a difference, and the run fails.
4. **Selection.** The fastest admitted candidate, if it beats the rules by ``margin`` in a
   re-timing of both (interleaved), becomes the bucket's entry; else the rules keep the bucket.

The table only picks among settings shown to change no bit on these workloads; the proof for
every batch is the full check with the table in force (``invariance check --backend kernels``),
which compares rows that land in different buckets. Timing: :class:`invariance.bench.CudaTimer`
(CUDA-graph replay, L2 flushed) on a GPU; injectable (``timer=``) so that everything else runs on
a CPU under the Triton interpreter.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import torch

from invariance.batch import AttentionBatch
from invariance.bench import (
    BENCH_HEADS,
    BENCH_PAGE_SIZE,
    BenchWorkload,
    build_batch,
    first_line,
    graph_replay,
)
from invariance.features import Features
from invariance.workload import HeadConfig

__all__ = ["TUNE_SCHEMA", "BucketResult", "FnTimer", "Trial", "TuneResult", "WallTimer",
           "default_timer", "run_tune"]

TUNE_SCHEMA = "invariance-tune/1"
_LAUNCH_FIELDS = ("plan", "block_m", "block_q", "block_n", "num_warps", "num_stages",
                  "value_blocks", "tiles_per_step", "dependent_merge", "slot_order",
                  "nested_loop", "gluon", "keys_rows", "scores_ahead", "walk_lead",
                  "walk_splits")


class FnTimer(Protocol):
    """What the tuner times with: milliseconds of ``fn`` (injectable, so that everything but
    the timing runs on a CPU)."""

    def time_fn(self, fn: Callable[[], object]) -> float: ...


class WallTimer:
    """Median wall-clock milliseconds of ``iters`` calls: the interpreter on a CPU, which has
    no CUDA events (a test of the method, not a time to ship)."""

    def __init__(self, iters: int = 10) -> None:
        self.iters = iters

    def time_fn(self, fn: Callable[[], object]) -> float:
        times = []
        for _ in range(self.iters):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1000.0)
        return float(statistics.median(times))


def default_timer(device: torch.device | str, iters: int = 10) -> FnTimer:
    """:class:`~invariance.bench.CudaTimer` (CUDA-graph replays, L2 flushed) on a GPU,
    :class:`WallTimer` elsewhere."""
    if torch.device(device).type == "cuda":
        from invariance.bench import CudaTimer

        return CudaTimer(iters=iters, warmup=3, device=device)
    return WallTimer(iters)


@dataclass
class Trial:
    """One candidate on one bucket: ``plan`` and the ``tuning`` overrides; ``us`` summed over
    the bucket's workloads (None when not timed); ``status``: ``rules`` (the reference),
    ``admitted``, ``rejected`` (bits differ: ``differing`` elements of out and LSE),
    ``control-rejected`` / ``control-admitted`` (the block_n control; ``control-refused`` or
    ``control-failed`` when it could not run: no bits compared), ``refused`` (the planner
    raised: ``error``), ``failed`` (compiling or running it raised, e.g. out of shared memory:
    ``error``) or ``duplicate`` (the same launch as ``same_as``)."""

    plan: str
    tuning: dict[str, Any]
    status: str
    us: float | None = None
    differing: int = 0
    error: str = ""
    same_as: str = ""

    def label(self) -> str:
        parts = [f"plan={self.plan}", *(f"{k}={v}" for k, v in self.tuning.items())]
        return ",".join(parts)


@dataclass
class BucketResult:
    """The search of one bucket: its workloads, every trial, the rules' time and the entry
    chosen (None: the rules keep the bucket)."""

    bucket: str
    workloads: list[str]
    rules_us: float
    trials: list[Trial] = field(default_factory=list)
    entry: dict[str, Any] | None = None
    seconds: float = 0.0
    #: The bucket's own control ran and was not rejected: the comparison could not see a
    #: difference here, so nothing of this bucket goes into the table (``--resume`` searches it
    #: again).
    unproven: bool = False

    @property
    def speedup(self) -> float | None:
        if self.entry is None or not self.entry.get("us"):
            return None
        return float(self.rules_us / self.entry["us"])


@dataclass
class TuneResult:
    """A tuning run: the GPU (``device``, its :func:`kernels.tuned.device_slug`), the Triton
    release, each bucket's search, the buckets left out for lack of time, and whether every
    control was rejected."""

    device: str
    triton: str
    buckets: list[BucketResult] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    controls_rejected: bool = True
    command: str = ""
    #: The contract tuned under (``run_tune(block_n=...)``); None: ``tile_config``'s.
    block_n: int | None = None
    #: Families (dtype, heads, page size) searched where no control could run: every row
    #: within one control tile, so the comparison's power is not shown there.
    uncontrolled: list[str] = field(default_factory=list)
    seconds: float = 0.0
    #: From an earlier table (``resume=``): its entries and the buckets its rules kept, for the
    #: buckets this run did not search.
    kept: dict[str, Any] = field(default_factory=dict)
    kept_rules: list[str] = field(default_factory=list)
    #: The earlier table's commands, which the written table keeps before this run's.
    kept_command: str = ""

    def table(self) -> dict[str, Any]:
        """The table file's content (:func:`kernels.tuned.load_table` reads it)."""
        from kernels.tuned import SCHEMA

        proven = [b for b in self.buckets if not b.unproven]
        entries = dict(self.kept)
        entries.update({b.bucket: b.entry for b in proven if b.entry is not None})
        for b in proven:  # searched again and the rules won: the old entry goes
            if b.entry is None:
                entries.pop(b.bucket, None)
        rules = (set(self.kept_rules) | {b.bucket for b in proven if b.entry is None})
        contract = {} if self.block_n is None else {"block_n": self.block_n}
        return {"schema": SCHEMA, "device": self.device, "triton": self.triton, **contract,
                "command": " ; ".join(c for c in (self.kept_command, self.command) if c),
                "entries": dict(sorted(entries.items())),
                "rules": sorted(rules - set(entries))}

    def table_json(self) -> str:
        return json.dumps(self.table(), indent=1) + "\n"

    def to_json(self) -> str:
        return json.dumps({"schema": TUNE_SCHEMA, **asdict(self)}, indent=1) + "\n"

    def to_markdown(self) -> str:
        contract = ("" if self.block_n is None
                    else f", contract: KV tiles of {self.block_n} keys (not tile_config's)")
        lines = [f"# Tuning: {self.device}, triton {self.triton}{contract}", "",
                 f"`{self.command}` ({self.seconds:.0f} s). Every candidate's output and LSE "
                 "compared bit for bit with the rules' on each workload of its bucket; the "
                 "control (half the KV tile: bit-defining) "
                 + ("rejected in every family where it ran." if self.controls_rejected
                    else "**NOT REJECTED somewhere: the comparison cannot see differences**.")
                 + (f" No control could run in {', '.join(self.uncontrolled)}: every row "
                    f"within one control tile." if self.uncontrolled else ""), "",
                 "| bucket | workloads | rules us | tuned us | speedup | settings | tried | "
                 "rejected |", "|---" * 8 + "|"]
        for b in self.buckets:
            tried = sum(t.status in ("admitted", "rejected") for t in b.trials)
            rejected = [t.label() for t in b.trials if t.status == "rejected"]
            if b.entry is None:
                tuned, speed, settings = "-", "-", "rules"
            else:
                tuned = f"{b.entry['us']:.1f}"
                speed = f"{b.speedup:.3f}x"
                settings = ",".join([f"plan={b.entry['plan']}",
                                     *(f"{k}={v}" for k, v in b.entry["tuning"].items())])
            lines.append(f"| {b.bucket} | {', '.join(b.workloads)} | {b.rules_us:.1f} | "
                         f"{tuned} | {speed} | {settings} | {tried} | "
                         f"{len(rejected)}{': ' + '; '.join(rejected) if rejected else ''} |")
        if self.skipped:
            lines += ["", "Not tuned (out of time): " + ", ".join(self.skipped)]
        return "\n".join(lines) + "\n"


class _Bucket:
    """The workloads of one bucket with their batches, reference bits and calls."""

    def __init__(self, key: str, batches: list[tuple[BenchWorkload, AttentionBatch]],
                 contract: dict[str, Any] | None = None,
                 features: dict[str, Any] | None = None) -> None:
        #: ``{"block_n": N}`` when tuning under another contract (``run_tune(block_n=N)``):
        #: merged under every candidate's settings and the reference's.
        self.contract = dict(contract or {})
        #: The workloads' features (``Features.to_dict()``; ``{}``: none), recorded in an entry.
        self.features = dict(features or {})
        self.key, self.batches = key, batches
        self.refs = [self.call(b, "auto", {})() for _, b in batches]

    def call(self, batch: AttentionBatch, plan: str, overrides: dict[str, Any]
             ) -> Callable[[], tuple[torch.Tensor, torch.Tensor]]:
        return self._call(batch, plan, {**self.contract, **overrides})

    @staticmethod
    def _call(batch: AttentionBatch, plan: str, overrides: dict[str, Any]
              ) -> Callable[[], tuple[torch.Tensor, torch.Tensor]]:
        import kernels
        from invariance.backends.kernels import feature_kwargs

        tuning = kernels.Tuning(**overrides)
        lens = (batch.q_lens(), batch.kv_lens.tolist())
        feats = feature_kwargs(batch, kernels.unified_attention)

        def fn() -> tuple[torch.Tensor, torch.Tensor]:
            return kernels.unified_attention(
                batch.q, batch.k_cache, batch.v_cache, batch.cu_seqlens_q, batch.kv_lens,
                batch.block_table, sm_scale=batch.sm_scale, plan=plan, tuning=tuning,
                validate=False, host_lens=lens, **feats)
        return fn

    def signature(self, plan: str, overrides: dict[str, Any]) -> tuple[Any, ...]:
        """The launch plans of a candidate on every workload (``ValueError``: refused)."""
        import kernels

        sig = []
        for _, b in self.batches:
            lp = _plan(b, plan=plan, tuning=kernels.Tuning(**{**self.contract, **overrides}),
                       host_lens=(b.q_lens(), b.kv_lens.tolist()))
            sig.append(tuple(getattr(lp, name) for name in _LAUNCH_FIELDS))
        return tuple(sig)

    def differing(self, plan: str, overrides: dict[str, Any]) -> int:
        """Elements of out and LSE whose bits differ from the reference, over the bucket."""
        from invariance.compare import compare_bits

        total = 0
        for (_, b), (ref_out, ref_lse) in zip(self.batches, self.refs, strict=True):
            out, lse = self.call(b, plan, overrides)()
            total += compare_bits(out, ref_out, name="out").num_different
            total += compare_bits(lse, ref_lse, name="lse").num_different
        return total

    def time_us(self, timer: FnTimer, plan: str, overrides: dict[str, Any]) -> float:
        return sum(1000.0 * timer.time_fn(graph_replay(self.call(b, plan, overrides), b.device))
                   for _, b in self.batches)


class _Search:
    """The coordinate search of one bucket (module docstring, steps 2-4)."""

    def __init__(self, bucket: _Bucket, timer: FnTimer, margin: float, control_block_n: int | None,
                 log: Callable[[str], None]) -> None:
        self.b, self.timer, self.margin, self.log = bucket, timer, margin, log
        self.seen: dict[tuple[Any, ...], str] = {}
        self.result = BucketResult(bucket.key, [w.name for w, _ in bucket.batches],
                                   rules_us=bucket.time_us(timer, "auto", {}))
        self.result.trials.append(Trial("auto", {}, "rules", us=self.result.rules_us))
        # A candidate with the rules' own launch is the rules: never an entry of its own.
        self.rules_sig = bucket.signature("auto", {})
        self.seen[self.rules_sig] = "rules"
        self.control_block_n = control_block_n

    def trial(self, plan: str, overrides: dict[str, Any]) -> Trial:
        try:
            sig = self.b.signature(plan, overrides)
        except ValueError as exc:
            t = Trial(plan, dict(overrides), "refused", error=first_line(exc))
            self.result.trials.append(t)
            return t
        label = Trial(plan, dict(overrides), "").label()
        if sig in self.seen:
            t = Trial(plan, dict(overrides), "duplicate", same_as=self.seen[sig],
                      us=self.result.rules_us if sig == self.rules_sig else None)
            self.result.trials.append(t)
            return t
        self.seen[sig] = label
        try:
            diff = self.b.differing(plan, overrides)
            if diff:
                t = Trial(plan, dict(overrides), "rejected", differing=diff)
            else:
                t = Trial(plan, dict(overrides), "admitted",
                          us=self.b.time_us(self.timer, plan, overrides))
        except Exception as exc:  # e.g. Triton's OutOfResources at compile time: recorded
            if self.b.batches[0][1].device.type == "cuda":
                torch.cuda.synchronize()  # an asynchronous error surfaces here, not later
            t = Trial(plan, dict(overrides), "failed", error=first_line(exc))
        self.log(f"  {label}: {t.status}" + (f" {t.us:.1f} us" if t.us is not None else
                                              f" ({t.differing} differing)" if t.differing
                                              else f" ({t.error})"))
        self.result.trials.append(t)
        return t

    def control(self) -> bool:
        """Whether the block_n control ran and was rejected (None block_n: no control here).
        A control the planner refused or that did not run compared no bits: not rejected."""
        if self.control_block_n is None:
            return True
        t = self.trial("auto", {"block_n": self.control_block_n})
        t.status = f"control-{t.status}"
        return t.status == "control-rejected"

    def run(self, space: dict[str, tuple[Any, ...]]) -> BucketResult:
        """Both plans, each also on each kernel family (``gluon``, and ``keys_rows`` in the
        split plan: the Gluon tiles take few of the Triton kernels' settings, so each family is
        a base of its own), then the
        settings one at a time from each base within 1.5x of the fastest; the fastest overall
        is re-timed against the rules (:meth:`_select`)."""
        bases: list[tuple[str, dict[str, Any], float]] = []
        for plan in space["plan"]:
            families: list[dict[str, Any]] = [{}, *({"gluon": v} for v in space.get("gluon", ()))]
            if plan == "split" and True in space.get("keys_rows", ()):
                families.append({"keys_rows": True})  # the keys-as-rows tile: a family too
            for base in families:
                t = self.trial(plan, base)
                # A base whose launch another base already has gets no time (searched once);
                # one with the rules' launch keeps the rules' time.
                if t.us is not None:
                    bases.append((plan, base, t.us))
        if not bases:
            return self.result
        fastest = min(us for _, _, us in bases)
        best: tuple[str, dict[str, Any], float] | None = None
        for plan, base, us in sorted(bases, key=lambda b: b[2]):
            if us > 1.5 * fastest:
                continue
            found = self._descend(plan, base, us, space)
            if best is None or found[2] < best[2]:
                best = found
        assert best is not None  # the fastest base is always searched
        if self.b.signature(best[0], best[1]) != self.rules_sig:
            self._select(*best)
        return self.result

    def _descend(self, plan: str, base: dict[str, Any], us: float,
                 space: dict[str, tuple[Any, ...]]) -> tuple[str, dict[str, Any], float]:
        best: tuple[str, dict[str, Any], float] = (plan, dict(base), us)
        for knob, values in space.items():
            if knob == "plan" or knob in base:
                continue
            for value in values:
                overrides = {**best[1], knob: value}
                t = self.trial(plan, overrides)
                if t.us is not None and t.us < best[2] * (1 - self.margin / 2):
                    best = (plan, overrides, t.us)
        return best

    def _select(self, plan: str, overrides: dict[str, Any], _: float) -> None:
        """Re-time the best and the rules, interleaved, the better of two each; keep the best
        only if it beats the rules by the margin."""
        rules, tuned = [], []
        for _i in range(2):
            rules.append(self.b.time_us(self.timer, "auto", {}))
            tuned.append(self.b.time_us(self.timer, plan, overrides))
        self.result.rules_us = min(rules)
        if min(tuned) < self.result.rules_us * (1 - self.margin):
            self.result.entry = {"plan": plan, "tuning": dict(overrides), "us": min(tuned),
                                 "rules_us": self.result.rules_us,
                                 "workloads": self.result.workloads}
            if self.b.features:  # the feature values it was proven with, for the record
                self.result.entry["features"] = self.b.features


def _plan(batch: AttentionBatch, **kwargs: Any) -> Any:
    """``kernels.plan_attention`` of ``batch`` with its features, unchecked values
    (``validate=False``): the launch a candidate, the control or a probe would run."""
    import kernels
    from invariance.backends.kernels import feature_kwargs

    return kernels.plan_attention(batch.q, batch.k_cache, batch.v_cache, batch.cu_seqlens_q,
                                  batch.kv_lens, batch.block_table, validate=False,
                                  **feature_kwargs(batch, kernels.plan_attention), **kwargs)


def check_features(features: Features, dtype: torch.dtype, heads: HeadConfig,
                   page_size: int, device: torch.device | str) -> str | None:
    """Why the kernels refuse ``features`` for workloads of ``dtype``, ``heads`` and
    ``page_size`` (None: they take them): the planner's own checks on a one-token batch built
    on the tuning run's ``device`` (planned only: no kernel runs, no sync), before the run
    starts."""
    probe = build_batch(BenchWorkload("probe", (1,), (1,)), heads, dtype, page_size, device,
                        features=features)
    try:
        _plan(probe)
    except ValueError as exc:
        return str(exc).splitlines()[0] if str(exc) else repr(exc)
    return None


def _family(w: BenchWorkload, dtype: torch.dtype, heads: HeadConfig,
            page_size: int) -> tuple[torch.dtype, HeadConfig, int]:
    from invariance.workload import parse_dtype

    return (parse_dtype(w.dtype) if w.dtype else dtype, w.heads or heads,
            w.page_size or page_size)


def _bucket_of(w: BenchWorkload, family: tuple[torch.dtype, HeadConfig, int],
               features: Features | None = None) -> str:
    from kernels.tuned import bucket, feature_tag

    dt, heads, page = family
    tag = "" if not features else feature_tag(features.window_left, features.sinks,
                                              features.softcap is not None,
                                              features.kv_dtype is not None)
    return bucket(dt, heads.head_dim, heads.num_q_heads // heads.num_kv_heads, page,
                  len(w.q_lens), w.query_tokens, max(w.kv_lens), tag)


def _control_block_n(batch: AttentionBatch, block_n: int | None = None) -> int | None:
    """Half the contract's KV tile for this batch (``block_n``, else ``tile_config``'s; None
    where that is below 16)."""
    import kernels

    lp = _plan(batch, tuning=kernels.Tuning(block_n=block_n))
    return lp.block_n // 2 if lp.block_n >= 32 else None


def run_tune(workloads: Sequence[BenchWorkload], *, dtype: torch.dtype = torch.bfloat16,
             heads: HeadConfig = BENCH_HEADS, page_size: int = BENCH_PAGE_SIZE,
             device: torch.device | str = "cuda", timer: FnTimer | None = None,
             space: dict[str, tuple[Any, ...]] | None = None, margin: float = 0.03,
             budget_s: float | None = None, seed: int = 0,
             log: Callable[[str], None] = lambda _: None,
             on_bucket: Callable[[TuneResult], None] | None = None,
             resume: dict[str, Any] | None = None, block_n: int | None = None,
             features: Features | None = None, again: Sequence[str] = ()) -> TuneResult:
    """Search each bucket of ``workloads`` (module docstring) and return the result; its
    :meth:`TuneResult.table_json` is the table. ``dtype``, ``heads``, ``page_size``: for
    workloads that name none.
    ``space``: the settings searched (default :data:`kernels.tuned.TUNABLE`); ``margin``: the
    fraction a candidate must beat the rules by; ``budget_s``: no new bucket starts after this
    many seconds (those left are listed in ``skipped``); ``on_bucket``: called after each bucket
    (write the table as you go); ``resume``: an earlier table of this GPU and Triton release
    (its file's content): the buckets it searched are not searched again and stay in the
    table. ``block_n``: tune under another contract, KV tiles of ``block_n`` keys
    (bit-defining: the reference and every candidate run at it, and the control halves it),
    to choose the contract by measurement; the table records it and the planner never applies
    such a table (:mod:`kernels.tuned`). ``features``: every workload carries them (as
    :func:`~invariance.bench.build_batch` builds them), every candidate and the reference run
    with them, and their :func:`~kernels.tuned.feature_tag` ends each bucket: the planner
    applies such entries only to calls with those features. ``again``: bucket keys or
    their leading fields (``bf16/d64``): the buckets of ``resume`` under them are searched again
    where ``workloads`` reach them (after a change to the kernels or the space they use); each
    keeps its earlier result until its new one is finished."""
    import triton

    import kernels  # noqa: F401  (the interpreter switch happens on import, see backends)
    from kernels._device import _device_slug
    from kernels.tuned import TUNABLE, release

    dev = torch.device(device)
    timer = timer if timer is not None else default_timer(dev)
    space = dict(space or TUNABLE)
    if "plan" not in space:
        raise ValueError(f"space: expected a 'plan' entry, got keys {sorted(space)}")
    unknown = sorted(set(space) - set(TUNABLE))
    if unknown:
        raise ValueError(f"space: unknown settings {unknown}; expected keys among "
                         f"{sorted(TUNABLE)}")
    if block_n is not None and (isinstance(block_n, bool) or not isinstance(block_n, int)
                                or block_n < 16 or block_n & (block_n - 1)):
        raise ValueError(f"block_n: expected a power of two >= 16 or None, got {block_n!r}")
    result = TuneResult(device=_device_slug(dev), triton=triton.__version__, block_n=block_n)
    if resume is not None:
        if (resume.get("device"), release(str(resume.get("triton"))), resume.get("block_n")) != (
                result.device, release(result.triton), block_n):
            def what(device: object, triton_version: object, tile: object) -> str:
                contract = "today's contract" if tile is None else f"KV tiles of {tile} keys"
                return (f"{device} under Triton {release(str(triton_version))} with "
                        f"{contract}")
            theirs = what(resume.get("device"), resume.get("triton"), resume.get("block_n"))
            raise ValueError(f"--resume: expected a table of "
                             f"{what(result.device, result.triton, block_n)}, got one of "
                             f"{theirs}")
        result.kept = dict(resume.get("entries") or {})
        result.kept_rules = list(resume.get("rules") or [])
        result.kept_command = str(resume.get("command") or "")
    # A bucket searched again replaces its kept result only once it finishes (table()).
    done = {k for k in (*result.kept, *result.kept_rules)
            if not any(_under(k, prefix) for prefix in again)}
    groups: dict[str, list[BenchWorkload]] = {}
    for w in workloads:
        groups.setdefault(_bucket_of(w, _family(w, dtype, heads, page_size), features),
                          []).append(w)
    start = time.monotonic()
    controlled: set[tuple[Any, ...]] = set()
    families: set[tuple[Any, ...]] = set()
    for key, members in groups.items():
        if key in done:
            continue
        if budget_s is not None and time.monotonic() - start > budget_s:
            result.skipped.append(key)
            continue
        t0 = time.monotonic()
        log(f"{key}: {', '.join(w.name for w in members)}")
        fam = _family(members[0], dtype, heads, page_size)
        families.add(fam)
        batches = [(w, build_batch(w, heads=fam[1], dtype=fam[0], page_size=fam[2], device=dev,
                                   seed=seed, features=features or None)) for w in members]
        contract = {} if block_n is None else {"block_n": block_n}
        bucket = _Bucket(key, batches, contract, features.to_dict() if features else None)
        family = (fam[0], fam[1], fam[2])
        control = None if family in controlled else _control_block_n(batches[0][1], block_n)
        if control is not None and max(max(w.kv_lens) for w in members) <= control:
            control = None  # every row within one control tile: it could not differ here
        if control is not None and features and features.window_left == 0:
            control = None  # every query sees its own key alone: no tile can change a bit
        if control is not None:
            controlled.add(family)
        search = _Search(bucket, timer, margin, control, log)
        unproven = not search.control()
        if unproven:
            result.controls_rejected = False
        result.buckets.append(search.run(space))
        result.buckets[-1].unproven = unproven
        result.buckets[-1].seconds = time.monotonic() - t0
        del bucket, batches, search
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        result.seconds = time.monotonic() - start
        result.uncontrolled = sorted({_family_name(f) for f in families} - {
            _family_name(f) for f in controlled})
        if on_bucket is not None:
            on_bucket(result)
    result.seconds = time.monotonic() - start
    return result


def _under(key: str, prefix: str) -> bool:
    """Whether bucket ``key`` is ``prefix`` or lies under it, field by field
    (``bf16/d64/g8/p16/b1`` does not take ``.../b16``)."""
    return key == prefix or key.startswith(prefix.rstrip("/") + "/")


def _family_name(family: tuple[torch.dtype, HeadConfig, int]) -> str:
    from invariance.workload import dtype_name

    return f"{dtype_name(family[0])} {family[1]} page {family[2]}"

