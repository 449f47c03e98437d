"""The report as GitHub-flavoured Markdown (a PR comment, a job summary)."""

from __future__ import annotations

from collections.abc import Sequence

from invariance.render._common import (
    DiffRow,
    accuracy_header,
    accuracy_row,
    cell_text,
    coverage_header,
    coverage_line,
    coverage_rows,
    diff_rows,
    environment_rows,
    grid,
    more_violations,
    plural,
    shown_violations,
    verdict,
    violation_heading,
    violation_title,
)
from invariance.render.comparison import COMPARISON_HEADER, ReportComparison
from invariance.report import Report

__all__ = ["comparison_to_markdown", "to_markdown"]

_MARK = {"passed": "✅", "failed": "❌", "error": "💥", "skipped": "⏭️"}


def _esc(text: str) -> str:
    """Text safe inside a Markdown table cell."""
    return (text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")
            .replace("<", "&lt;").replace(">", "&gt;"))


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(_esc(h) for h in header) + " |",
             "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(_esc(c) for c in row) + " |" for row in rows]
    return lines


def _fence(code: str, lang: str = "") -> list[str]:
    ticks = "```"
    while ticks in code:
        ticks += "`"
    return [f"{ticks}{lang}", code, ticks]


def to_markdown(report: Report) -> str:
    """``report`` as Markdown: summary, perturbation x dtype table and the coverage line,
    violations with reproducers, accuracy, coverage per cell, environment."""
    g = grid(report)
    out = [f"# invariance: {verdict(report)}", "", f"**{_esc(report.summary())}**", ""]
    out += ["## Perturbations", "",
            "Each cell: verdict · violating / run cases · worst ULP distance.", ""]
    rows = []
    for p in g.perturbations:
        row = [f"`{p}`"]
        for dt in g.dtypes:
            cell = g.get(p, dt)
            row.append(f"{_MARK.get(cell.status, '')} {cell_text(cell)}" if cell else "-")
        row.append(g.descriptions.get(p, ""))
        rows.append(row)
    out += _table(["perturbation", *g.dtypes, "what changes"], rows)
    out += ["", f"_{_esc(coverage_line(report))}_"]

    failed = report.failed_cells()
    if failed:
        out += ["", "## Violations"]
    for cell in failed:
        out += ["", f"### {_MARK[cell.status]} {_esc(violation_title(cell))}", "",
                f"_{_esc(cell.description)}_", ""]
        if cell.status == "error":
            out += [*_fence(cell.error or "the backend raised"), ""]
        shown = shown_violations(cell)
        for v in shown:
            out += [f"**{_esc(violation_heading(v))}**", "",
                    f"- a: {_esc(v.schedule_a)}", f"- b: {_esc(v.schedule_b)}", ""]
            out += _table(DiffRow.HEADER, [d.cells() for d in diff_rows(v.diffs)])
            out += ["", "<details><summary>reproducer</summary>", ""]
            out += _fence(v.reproducer, "python")
            out += ["", "</details>", ""]
        extra = more_violations(cell, len(shown))
        if extra:
            out += [f"… and {plural(extra, 'more violating case')} in this cell.", ""]

    if report.accuracy:
        out += ["", "## Accuracy against the float64 reference", ""]
        out += _table(accuracy_header(), [accuracy_row(a) for a in report.accuracy])

    cov_rows = coverage_rows(report)
    if cov_rows:
        out += ["", "## Coverage", "", "What each cell compared.", ""]
        out += _table(coverage_header(), cov_rows)

    out += ["", "## Environment", ""]
    out += _table(["what", "value"], [(k, v) for k, v in environment_rows(report)])
    return "\n".join(out).rstrip() + "\n"


def comparison_to_markdown(comparison: ReportComparison) -> str:
    """The cells whose verdict changed between two reports, as Markdown."""
    out = [f"# invariance compare: {_esc(comparison.summary())}", "",
           f"- A: {_esc(comparison.a.summary())}", f"- B: {_esc(comparison.b.summary())}"]
    out += [f"- differs: {_esc(s.text())}" + ("" if s.comparable else
                                               " (different cases: not comparable)")
            for s in comparison.settings]
    out.append("")
    rows = [c.columns() for c in comparison.differences]
    out += _table(list(COMPARISON_HEADER), rows) if rows else ["No cell changed verdict."]
    return "\n".join(out) + "\n"
