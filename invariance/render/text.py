"""Plain-text renderings: what a failing pytest check prints, the plugin's terminal summary and
the CLI's line per finished cell.

All text comes from the report itself; a violation describes the case it shows (the shrunk one
when shrinking succeeded), so its numbers are what its reproducer replays.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from invariance.render._common import (
    cell_name,
    cell_text,
    fmt_float,
    shown_case,
    violation_lines,
    worst_case,
)
from invariance.report import PerturbationResult, Report

__all__ = ["cell_line", "failure_text", "summary_lines"]


def cell_line(cell: PerturbationResult, done: int, total: int) -> str:
    """One finished cell as a log line, e.g. ``[3/15] neighbors · float32: PASS · 3 cases ·
    0 ULP (4.2s)``."""
    return (f"[{done}/{total}] {cell.perturbation} · {cell.dtype}: {cell_text(cell)} "
            f"({cell.seconds:.1f}s)")


def failure_text(report: Report, nodeid: str = "") -> str:
    """What a failing check prints: verdict, failed cells with their worst difference and both
    schedules in words, accuracy failures, and one minimal reproducer."""
    lines = [f"invariance: {report.summary()}"]
    if report.incomplete:
        lines.append(f"  INCOMPLETE: {report.incomplete}")
    reproducer: str | None = None
    for cell in report.failed_cells():
        if cell.status == "error":
            lines.append(f"  {cell_name(cell)}: ERROR {cell.error}")
            continue
        worst = max((d.max_abs_diff for v in cell.violations for d in v.diffs), default=0.0)
        case = worst_case(cell)
        lines.append(
            f"  {cell_name(cell)}: {cell.num_violations} of {cell.cases} "
            f"case(s) differ, max {cell.max_ulp} ULP, max |diff| {fmt_float(worst)} "
            + (f"(worst in case {case}{shown_case(cell)}) " if case is not None else "")
            + f"({cell.description})")
        if not cell.violations:
            continue
        v = cell.violations[0]
        lines += [f"    {line}" for line in violation_lines(v)]
        if reproducer is None:
            shrunk = "shrunk " if v.shrunk else ""
            code = "\n".join(f"    {line}".rstrip() for line in v.reproducer.splitlines())
            reproducer = (f"minimal reproducer ({shrunk}{cell_name(cell)}; "
                          f"raises with the diff):\n{code}")
    for acc in report.accuracy:
        if acc.passed:
            continue
        lines.append(
            f"  accuracy [{acc.dtype}] vs float64 reference: max |err| "
            f"{fmt_float(acc.max_abs_err_out)} (out), {fmt_float(acc.max_abs_err_lse)} (lse), "
            f"worst {fmt_float(acc.worst_ratio)}x the tolerance (atol {acc.atol:g}, rtol "
            f"{acc.rtol:g}, lse atol {acc.lse_atol:g}); {acc.nan_rows} NaN row(s) of {acc.rows}")
    if not any(r.status != "skipped" for r in report.results):
        lines.append("  no perturbation ran (all skipped): "
                     + "; ".join(f"{r.perturbation}: {r.error}" for r in report.results))
    if reproducer:
        lines.append(reproducer)
    if nodeid:
        lines.append(f"  (test {nodeid}; seed {report.seed}, budget {report.budget})")
    return "\n".join(lines)


def summary_lines(checks: Sequence[tuple[str, Report]], seed: int) -> Iterator[str]:
    """One line per check of a test session (``(nodeid, report)`` pairs), after a count."""
    passed = sum(r.passed for _, r in checks)
    yield (f"{len(checks)} check(s): {passed} passed, {len(checks) - passed} failed "
           f"(seed {seed})")
    for nodeid, r in checks:
        word = "PASSED" if r.passed else "FAILED" if r.complete else r.verdict()
        line = f"{word} {nodeid}: backend {r.backend} on {r.device} [{', '.join(r.dtypes)}]"
        cells = r.failed_cells()
        failed = [f"{c.perturbation}[{c.dtype}]" for c in cells if c.status == "failed"]
        errors = [f"{c.perturbation}[{c.dtype}]" for c in cells if c.status == "error"]
        if failed:
            line += f"; not invariant under {', '.join(failed)}"
        if errors:
            line += f"; backend raised in {', '.join(errors)}"
        inaccurate = [a.dtype for a in r.accuracy if not a.passed]
        if inaccurate:
            line += f"; inaccurate at {', '.join(inaccurate)}"
        if r.incomplete is not None:
            line += f"; stopped early: {r.incomplete}"
        elif not (r.passed or cells or inaccurate):
            line += "; no perturbation ran"
        yield line
