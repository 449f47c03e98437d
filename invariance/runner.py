"""The driver: :func:`check` runs every perturbation's cases through a backend and reports.

For each (dtype, perturbation) cell, every case runs its two schedules and compares the bits of
each (request, token) both computed (:mod:`invariance.compare`). A disagreement is run again to
tell nondeterminism from batch variance, shrunk (:mod:`invariance.shrink`) and turned into a
violation with a reproducer (:mod:`invariance.replay`). Rows of every case feed the accuracy
check (:mod:`invariance.accuracy`). Each finished cell is handed to ``on_cell`` as it completes;
an interrupt leaves a report marked incomplete (ARCHITECTURE.md, "The driver").
"""

from __future__ import annotations

import datetime as _dt
import signal
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from invariance.accuracy import AccuracyAccumulator
from invariance.backends import Backend, capabilities
from invariance.compare import CaseComparison, compare_outputs, compare_runs
from invariance.features import Features
from invariance.perturb import SCALES, Case, Perturbation, Scale
from invariance.replay import case_to_dict, reproducer
from invariance.report import Environment, PerturbationResult, Report, Violation
from invariance.schedule import ScheduleOutput, run_schedule
from invariance.shrink import shrink
from invariance.spec import CheckSpec
from invariance.workload import HeadConfig, dtype_name

__all__ = ["CheckInterrupted", "Progress", "SignalInterrupt", "check", "run_spec"]

#: ``progress(done, total, label)`` is called when a case starts (``label`` names the cell and
#: the case, ``done`` the cases finished before it) and after it finishes.
Progress = Callable[[int, int, str], None]
#: ``on_cell(report)`` is called after every finished cell with the report so far.
OnCell = Callable[[Report], None]


class SignalInterrupt(KeyboardInterrupt):
    """A termination signal (``SIGTERM``, ``SIGHUP``) turned into an interrupt by a face that
    installs a handler raising it, so that it ends a check as Ctrl-C does: the partial report
    is kept (:class:`CheckInterrupted`). ``signum`` is the signal's number."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum

    @property
    def name(self) -> str:
        try:
            return signal.Signals(self.signum).name
        except ValueError:
            return f"signal {self.signum}"


#: Set by :mod:`invariance.isolate` while a child process imports the parent's script or test
#: file to find the backend: a check started there is that file's unguarded top-level code.
IMPORTING_FOR_CHILD: str | None = None


class CheckInterrupted(Exception):
    """Raised by :func:`check` instead of a ``KeyboardInterrupt``/``SystemExit`` (from the user
    or the backend): ``report`` holds every finished cell and is marked incomplete."""

    def __init__(self, report: Report, cause: BaseException) -> None:
        super().__init__(report.incomplete)
        self.report = report
        self.cause = cause


def check(
    backend: str | Backend,
    *,
    dtype: torch.dtype | str | Sequence[torch.dtype | str] | None = None,
    heads: HeadConfig | str | None = None,
    perturbations: str | Sequence[str] | None = "all",
    budget: int = 1,
    seed: int = 0,
    device: str | torch.device | None = None,
    scale: str | Scale | None = None,
    accuracy_rows: int = 16,
    max_violations: int = 3,
    shrink: bool = True,
    isolate: bool = False,
    features: Features | dict[str, Any] | Sequence[str] | None = None,
    kv_dtype: str | None = None,
    progress: Progress | None = None,
    on_cell: OnCell | None = None,
) -> Report:
    """Check that ``backend`` is batch-invariant, deterministic and accurate.

    - ``backend``: a name (``invariance list`` shows them), ``"module:attr"``,
      ``"path/file.py:attr"``, or any callable ``AttentionBatch -> AttentionResult | (out, lse)``.
    - ``dtype``: one dtype or several (``torch.float16`` or ``"float16"``/``"fp16"``); default
      float16, bfloat16 and float32 on CUDA, float32 on CPU.
    - ``heads``: :class:`HeadConfig` or ``"Hq:Hkv:D"``; default per scale (``4:2:64`` small,
      ``32:8:128`` large).
    - ``perturbations``: names or ``"all"`` (``invariance.PERTURBATIONS``).
    - ``budget``: multiplies the number of schedule pairs per perturbation (>= 1).
    - ``seed``: seeds the workloads and schedules (>= 0); the same seed gives the same cases.
    - ``device``: ``"cpu"`` or ``"cuda"``; default CUDA when available.
    - ``scale``: ``"small"`` or ``"large"`` sizes; default small on CPU, large on CUDA.
    - ``accuracy_rows``: rows per schedule compared against the float64 reference (>= 1).
    - ``max_violations``: violations kept per cell (>= 0; all are counted); the first of each
      cell is shrunk (``shrink``) to the smallest batch that still disagrees.
    - ``isolate``: run each cell in a child process, so that a backend that crashes the process
      (segfault, CUDA illegal address) yields an error cell and the run goes on. The check is
      sent to the child by value (:mod:`invariance.isolate`); what cannot be (a lambda, a
      closure) is a ``ValueError`` before anything runs.
    - ``features``: attention features every batch of the check uses (default none): a dict
      ``{"window": 128, "sinks": True, "softcap": 50.0, "kv_scale": "head"}``, ``KEY[=VALUE]``
      strings (``["window=128", "sinks"]``, the CLI's ``--feature``) or an
      :class:`invariance.Features`. ``window``: ``window_left`` (keys ``[p - window, p]``);
      ``sinks``: per-head attention-sink logits; ``softcap``: logit soft-cap; ``kv_scale``:
      ``tensor`` or ``head`` FP8 scales. The backend must declare each in its
      ``Capabilities.features``; the check's requests grow past the window.
    - ``kv_dtype``: ``"fp8_e4m3"`` for an FP8 K/V cache with fixed dequantization scales
      (queries float16/bfloat16; default dtype then bfloat16 on CPU, both on CUDA).
    - ``progress``: called as ``progress(done, total, label)`` when each case starts and
      after it finishes.
    - ``on_cell``: called with the report so far after each finished cell.

    Raises ``ValueError`` for bad arguments (naming the argument, the expected and the actual)
    and :class:`CheckInterrupted` (holding the partial report) when interrupted.
    """
    spec = CheckSpec.build(
        backend, dtype=dtype, heads=heads, perturbations=perturbations, budget=budget, seed=seed,
        device=device, scale=scale, accuracy_rows=accuracy_rows, max_violations=max_violations,
        shrink=shrink, isolate=isolate, features=features, kv_dtype=kv_dtype)
    return run_spec(spec, progress=progress, on_cell=on_cell)


def run_spec(spec: CheckSpec, *, progress: Progress | None = None,
             on_cell: OnCell | None = None) -> Report:
    """Run a validated :class:`CheckSpec` (what :func:`check` does after validation)."""
    if IMPORTING_FOR_CHILD is not None:
        raise RuntimeError(
            f"a check started while a child process of isolate imported {IMPORTING_FOR_CHILD} "
            f"to find the backend: that file runs a check at import; guard its top-level code "
            f"with 'if __name__ == \"__main__\":'")
    t_start = time.perf_counter()
    report = Report(
        backend=spec.backend.name, device=str(spec.device),
        dtypes=[dtype_name(d) for d in spec.dtypes], heads=str(spec.heads),
        scale=_scale_name(spec), budget=spec.budget, seed=spec.seed,
        perturbations=[p.name for p in spec.perturbations],
        features=spec.features.to_dict(),
        environment=Environment.capture(str(spec.device)),
        started_at=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    )
    counter = _Counter(spec.total_cases(), progress)
    cells = len(spec.dtypes) * len(spec.perturbations)
    try:
        for dt in spec.dtypes:
            acc = AccuracyAccumulator(dt)
            for p in spec.perturbations:
                run = _run_isolated if spec.isolate and not spec.skip_reason(p) else _run_cell
                report.results.append(run(spec, p, dt, acc, counter))
                report.seconds = time.perf_counter() - t_start
                if on_cell is not None:
                    on_cell(report)
            if acc.rows:  # nothing ran (all skipped or errored): no accuracy claim either way
                report.accuracy.append(acc.result(spec.backend.name))
    except (KeyboardInterrupt, SystemExit) as exc:
        report.seconds = time.perf_counter() - t_start
        why = exc.name if isinstance(exc, SignalInterrupt) else type(exc).__name__
        report.incomplete = f"interrupted ({why}) after {len(report.results)} of {cells} cells"
        raise CheckInterrupted(report, exc) from exc
    report.seconds = time.perf_counter() - t_start
    return report


def _scale_name(spec: CheckSpec) -> str:
    """The scale's name, marked ``(custom)`` when its sizes are not the stock scale's of that
    name (reports that say ``small`` then ran the stock small cases)."""
    stock = SCALES.get(spec.scale.name)
    split = capabilities(spec.backend).split_tokens
    if stock is not None and stock.for_split(split) == spec.scale:
        return spec.scale.name
    return f"{spec.scale.name} (custom)"


@dataclass
class _Counter:
    total: int
    progress: Progress | None
    done: int = 0

    def step(self, label: str) -> None:
        self.done += 1
        if self.progress is not None:
            self.progress(self.done, self.total, label)

    def starting(self, label: str) -> None:
        """A case starts: show its label with the count of cases finished so far."""
        if self.progress is not None:
            self.progress(self.done, self.total, label)


def _where(exc: BaseException) -> str:
    """The innermost frames of ``exc``'s traceback, as ``file:line in function`` (for reports)."""
    frames = traceback.extract_tb(exc.__traceback__)[-3:]
    return " <- ".join(f"{Path(f.filename).name}:{f.lineno} in {f.name}" for f in reversed(frames))


def _coverage(case: Case, cmp: CaseComparison, cov: dict[str, Any]) -> None:
    """What a case compared: the longest compared row (its KV length), the batch sizes and the
    largest calls (KV tokens, query tokens) of its schedules, rows compared (pairs of rows that
    must agree) and how many of those were rows repeated within one schedule; with a window, the
    rows the window cuts (position > window) and those it does not."""
    if cmp.keys:
        cov["max_compared_kv_len"] = max(cov.get("max_compared_kv_len", 0),
                                         max(t for _, t in cmp.keys) + 1)
    steps = [st for s in (case.a, case.b) for st in s.steps]
    cov["batch_sizes"] = sorted(set(cov.get("batch_sizes", [])) |
                                {st.batch_size for st in steps})
    cov["max_call_kv_tokens"] = max([cov.get("max_call_kv_tokens", 0),
                                     *(sum(c.stop for c in st.chunks) for st in steps)])
    cov["max_call_query_tokens"] = max([cov.get("max_call_query_tokens", 0),
                                        *(st.num_tokens for st in steps)])
    cov["compared_rows"] = cov.get("compared_rows", 0) + len(cmp.keys)
    cov["repeated_rows"] = cov.get("repeated_rows", 0) + sum(
        1 for i in range(len(cmp.keys)) if cmp.within(i) is not None)
    window = case.workload.features.window
    if window is not None:
        past = sum(1 for _, t in cmp.keys if t > window)
        cov["rows_past_window_edge"] = cov.get("rows_past_window_edge", 0) + past
        cov["rows_inside_window"] = cov.get("rows_inside_window", 0) + len(cmp.keys) - past


def _run_cell(spec: CheckSpec, p: Perturbation, dt: torch.dtype, acc: AccuracyAccumulator,
              counter: _Counter) -> PerturbationResult:
    cell = PerturbationResult(backend=spec.backend.name, perturbation=p.name,
                              dtype=dtype_name(dt), description=p.description, status="passed")
    reason = spec.skip_reason(p)
    if reason:
        cell.status, cell.error = "skipped", reason
        return cell
    t0 = time.perf_counter()
    label = f"{p.name} · {dtype_name(dt)}"
    cases = p.cases(scale=spec.scale, heads=spec.heads, dtype=dt, seed=spec.seed,
                    budget=spec.budget, features=spec.features)
    count = max(1, spec.budget) * p.cases_per_budget
    for i, case in enumerate(cases):
        counter.starting(f"{label} · case {i + 1}/{count}")
        try:
            cache: dict[tuple[int, str], torch.Tensor] = {}
            out_a = run_schedule(spec.backend, case.workload, case.a, spec.device, cache)
            out_b = run_schedule(spec.backend, case.workload, case.b, spec.device, cache)
            cmp = compare_outputs(out_a, out_b)
            acc.add(case.workload, out_a, spec.accuracy_rows)
            acc.add(case.workload, out_b, spec.accuracy_rows)
            violation = None
            if not cmp.equal:
                cell.num_violations += 1
                cell.max_ulp = max(cell.max_ulp, cmp.out.max_ulp, cmp.lse.max_ulp)
                if len(cell.violations) < spec.max_violations:
                    counter.starting(f"{label} · case {i + 1}/{count} · a violation: re-run"
                                     + (", shrink" if spec.shrink and not cell.violations
                                        else ""))
                    violation = _violation(spec, p, dt, i, case, cmp, out_a, out_b,
                                           first=not cell.violations)
        except Exception as exc:  # a crashing backend is a result, not a crash of the check
            cell.status = "error"
            cell.error = f"case {i}: {type(exc).__name__}: {exc} [{_where(exc)}]"
            cell.cases = i + 1
            break
        cell.cases = i + 1
        _coverage(case, cmp, cell.coverage)
        cell.compared_tokens += len(cmp.keys)
        rate = len(cmp.differing_rows) / max(1, len(cmp.keys))
        ulp = max(cmp.out.max_ulp, cmp.lse.max_ulp)
        cell.points.append({**case.features, "mismatch_rate": rate, "max_ulp": float(ulp)})
        if not cmp.equal:
            cell.status = "failed"
        if violation is not None:
            cell.violations.append(violation)
        counter.step(label)
    cell.seconds = time.perf_counter() - t0
    return cell


def _deterministic(spec: CheckSpec, case: Case, out_a: ScheduleOutput,
                   out_b: ScheduleOutput) -> bool:
    """Run both schedules again: does each agree with itself, occurrence by occurrence (each
    (request, token, step) with the same one of the re-run)? A row computed in several steps
    of one schedule is compared with itself across steps by :func:`compare_outputs`, never
    here: its occurrences may differ from each other and still repeat exactly."""
    for schedule, first in ((case.a, out_a), (case.b, out_b)):
        again = run_schedule(spec.backend, case.workload, schedule, spec.device)
        if not compare_runs(first, again).equal:
            return False
    return True


def _repeated(cmp: CaseComparison, focus: int) -> tuple[str, int, int] | None:
    """``(schedule, step, step)`` when ``focus``'s first difference is a row computed twice
    within one schedule, else ``None``."""
    row = next(i for i in cmp.differing_rows if cmp.keys[i][0] == focus)
    side = cmp.within(row)
    if side is None:
        return None
    (_, s1), (_, s2) = cmp.sources[row]
    return side, s1, s2


def _repeated_note(cmp: CaseComparison) -> str:
    """A note when the first differing pair is one row computed twice within one schedule."""
    i = cmp.differing_rows[0] if cmp.differing_rows else None
    if i is None or cmp.within(i) is None:
        return ""
    return cmp.describe(i)


def _violation(spec: CheckSpec, p: Perturbation, dt: torch.dtype, i: int, case: Case,
               cmp: CaseComparison, out_a: ScheduleOutput, out_b: ScheduleOutput,
               first: bool) -> Violation:
    """A violation described from the case actually shown: the shrunk one when shrinking
    succeeded (its own comparison, restricted to the focus request)."""
    focus = cmp.keys[cmp.differing_rows[0]][0]
    nondeterministic = not _deterministic(spec, case, out_a, out_b)
    shown, note = case, ""
    if spec.shrink and first and not nondeterministic:
        try:
            result = shrink(spec.backend, case, focus, spec.device,
                            first_token=cmp.first_differing_token(focus),
                            repeated=_repeated(cmp, focus))
        except Exception as exc:  # the original case still stands
            note = f"shrinking failed: {type(exc).__name__}: {exc}"
        else:
            shown = result.case
            if result.exhausted:
                note = f"shrink budget ran out after {result.tries} runs"
    mine = compare_outputs(out_a, out_b, request=focus)
    if shown is not case:
        cache: dict[tuple[int, str], torch.Tensor] = {}
        shrunk_a, shrunk_b = (run_schedule(spec.backend, shown.workload, s, spec.device, cache)
                              for s in (shown.a, shown.b))
        shrunk_cmp = compare_outputs(shrunk_a, shrunk_b, request=focus)
        if shrunk_cmp.equal:  # cannot happen for a deterministic backend; keep the original
            shown = case
        else:
            mine = shrunk_cmp
    note = "; ".join(n for n in (_repeated_note(mine), note) if n)
    return Violation(
        perturbation=p.name, dtype=dtype_name(dt), case=i,
        schedule_a=shown.a.describe(), schedule_b=shown.b.describe(), request_id=focus,
        differing_tokens=len(mine.differing_rows), compared_tokens=len(mine.keys),
        diffs=[mine.out, mine.lse],
        reproducer=reproducer(shown, spec.backend.name, str(spec.device)),
        case_data=case_to_dict(shown, backend=spec.backend.name, device=str(spec.device)),
        shrunk=shown is not case,
        classification="nondeterministic" if nondeterministic else "batch-variant",
        note=note,
    )



# --------------------------------------------------------------------------------------------
# Isolation: one child process per cell (invariance.isolate)
# --------------------------------------------------------------------------------------------

def _run_isolated(spec: CheckSpec, p: Perturbation, dt: torch.dtype, acc: AccuracyAccumulator,
                  counter: _Counter) -> PerturbationResult:
    """:func:`_run_cell` in a child process, the check sent by value; a child that fails or dies
    becomes an error cell holding its reason."""
    from invariance.isolate import run_in_child

    t0 = time.perf_counter()
    counter.starting(f"{p.name} · {dtype_name(dt)} (in a child process)")
    result = run_in_child(spec, p, dtype_name(dt))
    for _ in range(spec.budget * p.cases_per_budget):
        counter.step(f"{p.name} · {dtype_name(dt)}")
    if result.cell is None or result.accuracy is None:
        return PerturbationResult(
            backend=spec.backend.name, perturbation=p.name, dtype=dtype_name(dt),
            description=p.description, status="error", seconds=time.perf_counter() - t0,
            error=result.error or "the backend's process gave no answer (--isolate)")
    state = result.accuracy
    acc.rows += state["rows"]
    acc.nan_rows += state["nan_rows"]
    acc.err_sq += state["err_sq"]
    acc.ref_sq += state["ref_sq"]
    for key in ("max_abs_out", "max_abs_lse", "worst"):
        setattr(acc, key, max(getattr(acc, key), state[key]))
    return PerturbationResult.from_dict(result.cell)
