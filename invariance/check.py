"""``check``: run every perturbation's schedule pairs through a backend and report.

For each (dtype, perturbation) cell, every case runs its two schedules, compares the bits of each
(request, token) both computed (output row and LSE), and records violations with diagnostics, a
shrunk reproducer and both schedules in words. Every case's first schedule is also compared
against the float64 reference within a dtype tolerance, so that a backend returning zeros (which
is perfectly invariant) fails.
"""

from __future__ import annotations

import datetime as _dt
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from invariance.backends import Backend, ResolvedBackend, resolve
from invariance.backends.reference import reference_rows
from invariance.compare import TensorDiff, compare_bits
from invariance.perturb import SCALES, Case, Perturbation, Scale, resolve_perturbations
from invariance.report import AccuracyResult, Environment, PerturbationResult, Report, Violation
from invariance.schedule import Schedule, ScheduleOutput, Step, run_schedule
from invariance.workload import HeadConfig, Workload, dtype_name, parse_dtype

__all__ = [
    "DEFAULT_HEADS",
    "TOLERANCES",
    "CaseComparison",
    "Progress",
    "check",
    "compare_outputs",
    "replay",
    "reproducer",
]

#: Default head configuration per scale: small for the CPU interpreter, production-like on GPU.
DEFAULT_HEADS: dict[str, HeadConfig] = {
    "small": HeadConfig(4, 2, 64),
    "large": HeadConfig(32, 8, 128),
}

#: Accuracy tolerance per dtype: ``(atol, rtol)`` on outputs and ``lse_atol`` on the LSE.
#: Float32 is held to float32 arithmetic (TF32 dots do not pass); fp16/bf16 allow rounding of
#: the output and of the probabilities fed to the PV product.
TOLERANCES: dict[torch.dtype, tuple[float, float, float]] = {
    torch.float32: (1e-4, 1e-4, 1e-4),
    torch.float16: (2e-3, 4e-3, 1e-3),
    torch.bfloat16: (1.6e-2, 3.2e-2, 1e-3),
}

#: ``progress(done, total, label)`` is called after every case.
Progress = Callable[[int, int, str], None]


@dataclass
class CaseComparison:
    """Bitwise comparison of the tokens two schedules share."""

    keys: list[tuple[int, int]]
    out: TensorDiff
    lse: TensorDiff
    differing_rows: list[int]

    @property
    def equal(self) -> bool:
        return self.out.equal and self.lse.equal


def compare_outputs(a: ScheduleOutput, b: ScheduleOutput) -> CaseComparison:
    """Compare every (request, token) computed by both ``a`` and ``b``, in ``a``'s order."""
    b_index = b.index()
    rows_a = [i for i, k in enumerate(a.keys) if k in b_index]
    keys = [a.keys[i] for i in rows_a]
    rows_b = [b_index[k] for k in keys]
    dev = a.out.device
    ia = torch.tensor(rows_a, dtype=torch.long, device=dev)
    ib = torch.tensor(rows_b, dtype=torch.long, device=b.out.device)
    out_a, out_b = a.out[ia], b.out[ib].to(dev)
    lse_a, lse_b = a.lse[ia], b.lse[ib].to(dev)
    out = compare_bits(out_a, out_b, name="out", dims=("request", "token", "head", "dim"),
                       row_labels=keys)
    lse = compare_bits(lse_a, lse_b, name="lse", dims=("request", "token", "head"),
                       row_labels=keys)
    differing: list[int] = []
    if not (out.equal and lse.equal):
        from invariance.compare import bits

        row_diff = (bits(out_a) != bits(out_b)).flatten(1).any(1) | (
            bits(lse_a) != bits(lse_b)).any(1)
        differing = torch.nonzero(row_diff).flatten().tolist()
    return CaseComparison(keys, out, lse, differing)


# --------------------------------------------------------------------------------------------
# Shrinking and reproducers
# --------------------------------------------------------------------------------------------

def _without(schedule: Schedule, drop: set[int]) -> Schedule:
    steps = []
    for step in schedule.steps:
        chunks = tuple(c for c in step.chunks if c.request_id not in drop)
        if chunks:
            steps.append(Step(chunks))
    return replace(schedule, steps=tuple(steps), label="")


def _shrink(backend: Backend, case: Case, focus: int, device: torch.device,
            max_tries: int = 12) -> tuple[Case, bool]:
    """Drop other requests from both schedules (halves, then one by one) while the focus request
    still disagrees. Returns the smallest failing case found and whether it shrank."""
    others = sorted({c.request_id for s in (case.a, case.b) for st in s.steps for c in st.chunks}
                    - {focus})
    tries = 0
    shrunk = False

    def still_fails(candidate: Case) -> bool:
        a = run_schedule(backend, candidate.workload, candidate.a, device)
        b = run_schedule(backend, candidate.workload, candidate.b, device)
        cmp = compare_outputs(a, b)
        return any(cmp.keys[i][0] == focus for i in cmp.differing_rows)

    size = max(1, len(others) // 2)
    while others and size >= 1 and tries < max_tries:
        i = 0
        progressed = False
        while i < len(others) and tries < max_tries:
            group = set(others[i:i + size])
            candidate = replace(case, a=_without(case.a, group), b=_without(case.b, group))
            tries += 1
            if candidate.a.steps and candidate.b.steps and still_fails(candidate):
                case, shrunk, progressed = candidate, True, True
                others = [r for r in others if r not in group]
            else:
                i += size
        if not progressed:
            if size == 1:
                break
            size = max(1, size // 2)
    if shrunk:
        used = {c.request_id for s in (case.a, case.b) for st in s.steps for c in st.chunks}
        wl = case.workload
        case = replace(case, workload=replace(
            wl, requests=tuple(r for r in wl.requests if r.id in used)))
    return case, shrunk


def reproducer(case: Case, backend: str, device: str) -> str:
    """Python code that replays ``case`` and raises with the bitwise diff."""
    wl = case.workload
    lines = [
        "import torch",
        "import invariance",
        "from invariance import Chunk, HeadConfig, PageLayout, Request, Schedule, Step, Workload",
        "",
        f"workload = {wl!r}",
        f"a = {case.a!r}",
        f"b = {case.b!r}",
        f"invariance.replay({backend!r}, workload, a, b, device={device!r})",
    ]
    return "\n".join(lines)


def replay(backend: str | Backend, workload: Workload, a: Schedule, b: Schedule, *,
           device: str | torch.device = "cpu") -> CaseComparison:
    """Run two schedules and raise ``AssertionError`` with the diff if any shared token differs.

    Returns the comparison when they agree.
    """
    fn = resolve(backend)
    dev = torch.device(device)
    cmp = compare_outputs(run_schedule(fn, workload, a, dev), run_schedule(fn, workload, b, dev))
    if not cmp.equal:
        raise AssertionError(
            f"schedules disagree on {len(cmp.differing_rows)} of {len(cmp.keys)} tokens\n"
            f"  a: {a.describe()}\n  b: {b.describe()}\n  {cmp.out.summary()}\n  "
            f"{cmp.lse.summary()}"
        )
    return cmp


# --------------------------------------------------------------------------------------------
# Accuracy
# --------------------------------------------------------------------------------------------

@dataclass
class _AccuracyAcc:
    rows: int = 0
    max_abs_out: float = 0.0
    max_abs_lse: float = 0.0
    worst: float = 0.0
    err_sq: float = 0.0
    ref_sq: float = 0.0
    nan_rows: int = 0


def _accuracy(acc: _AccuracyAcc, workload: Workload, out: ScheduleOutput, max_rows: int,
              tol: tuple[float, float, float]) -> None:
    n = len(out.keys)
    if n == 0:
        return
    picks = sorted({round(i * (n - 1) / max(1, max_rows - 1)) for i in range(min(n, max_rows))})
    by_request: dict[int, list[int]] = {}
    for i in picks:
        by_request.setdefault(out.keys[i][0], []).append(i)
    atol, rtol, lse_atol = tol
    dev = out.out.device
    for rid, rows in by_request.items():
        tokens = [out.keys[i][1] for i in rows]
        stop = max(tokens) + 1
        k = workload.content(rid, "k", 0, stop, dev)
        v = workload.content(rid, "v", 0, stop, dev)
        q = torch.cat([workload.content(rid, "q", t, t + 1, dev) for t in tokens])
        ref_out, ref_lse = reference_rows(q, tokens, k, v, workload.sm_scale)
        idx = torch.tensor(rows, device=dev)
        got_out = out.out[idx].to(torch.float64)
        got_lse = out.lse[idx].to(torch.float64)
        bad_rows = (~torch.isfinite(got_out).flatten(1).all(1)) | torch.isnan(got_lse).any(1)
        acc.nan_rows += int(bad_rows.sum())
        err = (got_out - ref_out).abs()
        err = torch.where(torch.isnan(err), torch.full_like(err, float("inf")), err)
        acc.max_abs_out = max(acc.max_abs_out, float(err.max()))
        acc.worst = max(acc.worst, float((err / (atol + rtol * ref_out.abs())).max()))
        finite_err = torch.where(torch.isinf(err), torch.zeros_like(err), err)
        acc.err_sq += float((finite_err**2).sum())
        acc.ref_sq += float((ref_out**2).sum())
        lse_err = torch.where(
            torch.isinf(ref_lse) & (got_lse == ref_lse), torch.zeros_like(ref_lse),
            (got_lse - ref_lse).abs())
        lse_err = torch.where(torch.isnan(lse_err), torch.full_like(lse_err, float("inf")),
                              lse_err)
        acc.max_abs_lse = max(acc.max_abs_lse, float(lse_err.max()))
        acc.worst = max(acc.worst, float(lse_err.max()) / lse_atol)
        acc.rows += len(rows)


def _accuracy_result(backend: str, dtype: torch.dtype, acc: _AccuracyAcc) -> AccuracyResult:
    atol, rtol, lse_atol = TOLERANCES[dtype]
    rel = (acc.err_sq / acc.ref_sq) ** 0.5 if acc.ref_sq else 0.0
    passed = acc.nan_rows == 0 and acc.worst <= 1.0
    return AccuracyResult(
        backend=backend, dtype=dtype_name(dtype), rows=acc.rows,
        max_abs_err_out=acc.max_abs_out, rel_err_out=rel, max_abs_err_lse=acc.max_abs_lse,
        worst_ratio=acc.worst, atol=atol, rtol=rtol, lse_atol=lse_atol, nan_rows=acc.nan_rows,
        passed=passed,
    )


# --------------------------------------------------------------------------------------------
# check
# --------------------------------------------------------------------------------------------

def _resolve_device(device: str | torch.device | None) -> torch.device:
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device: CUDA was requested but torch sees no CUDA GPU here")
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device: expected 'cpu' or 'cuda', got {device!r}")
    return dev


def _as_dtypes(dtype: torch.dtype | str | Sequence[torch.dtype | str]) -> list[torch.dtype]:
    if isinstance(dtype, (torch.dtype, str)):
        return [parse_dtype(dtype)]
    dtypes = [parse_dtype(d) for d in dtype]
    if not dtypes:
        raise ValueError("dtype: expected at least one dtype, got none")
    return list(dict.fromkeys(dtypes))


def check(
    backend: str | Backend,
    *,
    dtype: torch.dtype | str | Sequence[torch.dtype | str] = torch.float32,
    heads: HeadConfig | str | None = None,
    perturbations: str | Sequence[str] | None = "all",
    budget: int = 1,
    seed: int = 0,
    device: str | torch.device | None = None,
    scale: str | Scale | None = None,
    accuracy_rows: int = 16,
    max_violations: int = 3,
    shrink: bool = True,
    progress: Progress | None = None,
) -> Report:
    """Check that ``backend`` is batch-invariant, deterministic and accurate.

    - ``backend``: a name (``invariance list`` shows them), ``"module:attr"``, or any callable
      ``AttentionBatch -> AttentionResult | (out, lse)``.
    - ``dtype``: one dtype or several (``torch.float16`` or ``"float16"``; float16, bfloat16,
      float32).
    - ``heads``: :class:`HeadConfig` or ``"Hq:Hkv:D"``; default per scale (``4:2:64`` small,
      ``32:8:128`` large).
    - ``perturbations``: names or ``"all"`` (``invariance.PERTURBATIONS``).
    - ``budget``: multiplies the number of schedule pairs per perturbation (>= 1).
    - ``seed``: seeds the workloads and schedules; the same seed gives the same cases.
    - ``device``: ``"cpu"`` or ``"cuda"``; default CUDA when available.
    - ``scale``: ``"small"`` or ``"large"`` sizes; default small on CPU, large on CUDA.
    - ``accuracy_rows``: rows per case compared against the float64 reference.
    - ``max_violations``: violations kept per cell (all are counted); the first of each cell
      is shrunk (``shrink``) to the smallest batch that still disagrees.
    - ``progress``: called as ``progress(done, total, label)`` after each case.
    """
    t_start = time.perf_counter()
    started_at = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    if not isinstance(budget, int) or budget < 1:
        raise ValueError(f"budget: expected an int >= 1, got {budget!r}")
    dev = _resolve_device(device)
    if scale is None:
        scale_obj = SCALES["large" if dev.type == "cuda" else "small"]
    elif isinstance(scale, Scale):
        scale_obj = scale
    elif scale in SCALES:
        scale_obj = SCALES[scale]
    else:
        raise ValueError(f"scale: expected one of {sorted(SCALES)}, got {scale!r}")
    if heads is None:
        head_cfg = DEFAULT_HEADS.get(scale_obj.name, HeadConfig())
    elif isinstance(heads, str):
        head_cfg = HeadConfig.parse(heads)
    else:
        head_cfg = heads
    dtypes = _as_dtypes(dtype)
    perts = resolve_perturbations(perturbations if perturbations is None or isinstance(
        perturbations, str) else list(perturbations))
    fn: ResolvedBackend = resolve(backend)
    env = Environment.capture(str(dev))
    report = Report(
        backend=fn.name, device=str(dev), dtypes=[dtype_name(d) for d in dtypes],
        heads=str(head_cfg), scale=scale_obj.name, budget=budget, seed=seed,
        perturbations=[p.name for p in perts], environment=env, started_at=started_at,
    )
    total = sum(budget * p.cases_per_budget for p in perts if not _skip_reason(p, dev)) * len(
        dtypes)
    done = 0
    for dt in dtypes:
        acc = _AccuracyAcc()
        for p in perts:
            cell, n = _run_cell(fn, p, dt, head_cfg, scale_obj, budget, seed, dev, acc,
                                accuracy_rows, max_violations, shrink, progress, done, total)
            done += n
            report.results.append(cell)
        if acc.rows:  # nothing ran (all skipped or errored): no accuracy claim either way
            report.accuracy.append(_accuracy_result(fn.name, dt, acc))
    report.seconds = time.perf_counter() - t_start
    return report


def _where(exc: BaseException) -> str:
    """The innermost frames of ``exc``'s traceback, as ``file:line in function`` (for reports)."""
    frames = traceback.extract_tb(exc.__traceback__)[-3:]
    return " <- ".join(f"{Path(f.filename).name}:{f.lineno} in {f.name}" for f in reversed(frames))


def _skip_reason(p: Perturbation, dev: torch.device) -> str | None:
    if p.requires_cuda and dev.type != "cuda":
        return "needs a CUDA device"
    return None


def _run_cell(
    fn: ResolvedBackend, p: Perturbation, dt: torch.dtype, heads: HeadConfig, scale: Scale,
    budget: int, seed: int, dev: torch.device, acc: _AccuracyAcc, accuracy_rows: int,
    max_violations: int, shrink: bool, progress: Progress | None, done: int, total: int,
) -> tuple[PerturbationResult, int]:
    cell = PerturbationResult(backend=fn.name, perturbation=p.name, dtype=dtype_name(dt),
                              description=p.description, status="passed")
    reason = _skip_reason(p, dev)
    if reason:
        cell.status, cell.error = "skipped", reason
        return cell, 0
    t0 = time.perf_counter()
    tol = TOLERANCES[dt]
    cases = p.cases(scale=scale, heads=heads, dtype=dt, seed=seed, budget=budget)
    for i, case in enumerate(cases):
        n = i + 1
        try:
            cache: dict[tuple[int, str], torch.Tensor] = {}
            out_a = run_schedule(fn, case.workload, case.a, dev, cache)
            out_b = run_schedule(fn, case.workload, case.b, dev, cache)
            cmp = compare_outputs(out_a, out_b)
            _accuracy(acc, case.workload, out_a, accuracy_rows, tol)
        except Exception as exc:  # a crashing backend is a result, not a crash of the check
            cell.status = "error"
            cell.error = f"case {i}: {type(exc).__name__}: {exc} [{_where(exc)}]"
            cell.cases = n
            break
        cell.cases = n
        cell.compared_tokens += len(cmp.keys)
        rate = len(cmp.differing_rows) / max(1, len(cmp.keys))
        ulp = max(cmp.out.max_ulp, cmp.lse.max_ulp)
        cell.points.append({**case.features, "mismatch_rate": rate, "max_ulp": float(ulp)})
        if not cmp.equal:
            cell.status = "failed"
            cell.num_violations += 1
            cell.max_ulp = max(cell.max_ulp, ulp)
            if len(cell.violations) < max_violations:
                cell.violations.append(
                    _violation(fn, p, dt, i, case, cmp, dev, shrink and not cell.violations))
        if progress is not None:
            progress(done + n, total, f"{p.name} [{dtype_name(dt)}]")
    cell.seconds = time.perf_counter() - t0
    return cell, budget * p.cases_per_budget


def _violation(fn: ResolvedBackend, p: Perturbation, dt: torch.dtype, i: int, case: Case,
               cmp: CaseComparison, dev: torch.device, shrink: bool) -> Violation:
    focus = cmp.keys[cmp.differing_rows[0]][0]
    differing = sum(1 for r in cmp.differing_rows if cmp.keys[r][0] == focus)
    compared = sum(1 for k in cmp.keys if k[0] == focus)
    shown, shrunk = case, False
    if shrink:
        try:
            shown, shrunk = _shrink(fn, case, focus, dev)
        except Exception:
            shown, shrunk = case, False
    return Violation(
        perturbation=p.name, dtype=dtype_name(dt), case=i,
        schedule_a=case.a.describe(), schedule_b=case.b.describe(), request_id=focus,
        differing_tokens=differing, compared_tokens=compared, diffs=[cmp.out, cmp.lse],
        reproducer=reproducer(shown, fn.name, str(dev)), shrunk=shrunk,
    )
