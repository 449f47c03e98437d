"""The report on a rich console: summary, perturbation x dtype table, violations with
reproducers, accuracy, environment."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from invariance.render._common import (
    STATUS_WORD,
    accuracy_header,
    accuracy_row,
    cell_text,
    coverage_header,
    coverage_line,
    coverage_rows,
    environment_rows,
    grid,
    more_violations,
    plural,
    shown_violations,
    violation_lines,
    violation_title,
)
from invariance.render.comparison import COMPARISON_HEADER, ReportComparison
from invariance.report import PerturbationResult, Report

__all__ = ["STYLES", "print_comparison", "print_report"]

#: rich style per cell status.
STYLES: dict[str, str] = {
    "passed": "green",
    "failed": "bold red",
    "error": "bold magenta",
    "skipped": "yellow",
}


def _cell(text: str, status: str) -> Text:
    return Text(text, style=STYLES.get(status, ""))


def print_report(report: Report, console: Console, *, reproducers: bool = True) -> None:
    """Print ``report`` on ``console``: summary, perturbation × dtype table and the coverage in
    one line, the first violations of each failed cell (with the shrunk reproducer), accuracy,
    what each cell compared, environment, and the summary again as the last line.
    ``reproducers=False`` leaves out the reproducer code."""
    style = "bold green" if report.passed else "bold red"
    console.print(Text(report.summary(), style=style), soft_wrap=True)
    console.print(_grid_table(report))
    console.print(Text(coverage_line(report), style="dim"), soft_wrap=True)
    for cell in report.failed_cells():
        _print_failed_cell(cell, console, reproducers)
    for table in (_accuracy_table(report), _coverage_table(report), _environment_table(report)):
        if table is not None:
            console.print()
            console.print(table)
    console.print()
    console.print(Text(report.summary(), style=style), soft_wrap=True)


def _grid_table(report: Report) -> Table:
    g = grid(report)
    table = Table(title="perturbation × dtype", title_justify="left",
                  caption="verdict · violating/run cases · worst ULP",
                  caption_justify="left")
    table.add_column("perturbation", style="bold", no_wrap=True)
    for dt in g.dtypes:
        table.add_column(dt)
    for p in g.perturbations:
        row: list[Text] = [Text(p)]
        for dt in g.dtypes:
            cell = g.get(p, dt)
            row.append(_cell(cell_text(cell), cell.status) if cell else Text("-", style="dim"))
        table.add_row(*row)
    return table


def _print_failed_cell(cell: PerturbationResult, console: Console, reproducers: bool) -> None:
    console.print()
    console.rule(Text(f"{cell.perturbation} [{cell.dtype}]", style=STYLES[cell.status]),
                 align="left")
    console.print(Text(violation_title(cell), style=STYLES[cell.status]))
    console.print(Text(cell.description, style="dim"))
    if cell.status == "error":
        console.print(Text(cell.error or "the backend raised", style=STYLES["error"]))
    shown = shown_violations(cell)
    for i, v in enumerate(shown):
        lines = violation_lines(v)
        console.print(Text(lines[0], style="bold"))
        for line in lines[1:]:
            console.print(Text(line), overflow="fold")
        # The first violation of a cell is the shrunk one: its reproducer is the minimal
        # one. The others' reproducers are in the JSON, Markdown and HTML reports.
        if reproducers and i == 0:
            console.print(Text("reproducer (paste into Python):", style="dim"))
            # soft_wrap: never insert line breaks into code meant for pasting.
            console.print(Text(v.reproducer), soft_wrap=True)
    extra = more_violations(cell, len(shown))
    if extra:
        console.print(Text(f"... and {plural(extra, 'more violating case')} in this cell",
                           style="dim"))


def _accuracy_table(report: Report) -> Table | None:
    if not report.accuracy:
        return None
    acc = Table(title="accuracy against the float64 reference", title_justify="left")
    for h in accuracy_header():
        acc.add_column(h)
    for a in report.accuracy:
        cells = accuracy_row(a)
        acc.add_row(*map(Text, cells[:-1]), _cell(cells[-1], "passed" if a.passed else "failed"))
    return acc


def _coverage_table(report: Report) -> Table | None:
    cov_rows = coverage_rows(report)
    if not cov_rows:
        return None
    cov = Table(title="coverage: what each cell compared", title_justify="left")
    sizes = min(40, max(len(r[3]) for r in cov_rows))  # batch sizes on one line if they fit
    for col, h in enumerate(coverage_header()):
        cov.add_column(h, overflow="fold", no_wrap=col in (0, 1),
                       min_width=sizes if col == 3 else None)
    for r in cov_rows:
        cov.add_row(*map(Text, r))
    return cov


def _environment_table(report: Report) -> Table:
    env = Table(title="environment", title_justify="left", show_header=False)
    env.add_column("key", style="dim")
    env.add_column("value", overflow="fold")
    for k, val in environment_rows(report):
        env.add_row(Text(k), Text(val))
    return env


def print_comparison(comparison: ReportComparison, console: Console, *,
                     all_cells: bool = False) -> None:
    """Print the cells whose verdict changed (every cell with ``all_cells``)."""
    a, b = comparison.a, comparison.b
    console.print(Text(f"A: {a.summary()}"), soft_wrap=True)
    console.print(Text(f"B: {b.summary()}"), soft_wrap=True)
    for s in comparison.settings:
        note = "" if s.comparable else " (different cases: not comparable)"
        console.print(Text(f"differs: {s.text()}{note}",
                           style="" if s.comparable else "bold yellow"), soft_wrap=True)
    rows = comparison.cells if all_cells else comparison.differences
    if rows:
        table = Table(title="cells whose verdict changed" if not all_cells else "all cells",
                      title_justify="left")
        for h in COMPARISON_HEADER:
            table.add_column(h)
        for c in rows:
            style = {"worse": "bold red", "better": "green", "same": ""}.get(c.change, "yellow")
            name, _, _, change, *rest = c.columns()
            table.add_row(Text(name), _status_text(c.before), _status_text(c.after),
                          Text(change, style=style), *map(Text, rest))
        console.print(table)
    else:
        console.print("no cell changed verdict")
    style = "bold red" if comparison.regressed else "bold green"
    console.print(Text(comparison.summary(), style=style))


def _status_text(status: str | None) -> Text:
    if status is None:
        return Text("absent", style="dim")
    return _cell(STATUS_WORD.get(status, status), status)
