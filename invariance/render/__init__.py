"""Report renderers: console (rich), Markdown, self-contained HTML, JUnit XML, the
comparison of two reports, and ``invariance bench`` reports (console and Markdown).

The core never imports this package; it imports the core. Each renderer takes a
:class:`invariance.Report`::

    from rich.console import Console
    from invariance.render import print_report, to_html

    print_report(report, Console())
    Path("report.html").write_text(to_html(report))
"""

from __future__ import annotations

from invariance.render.bench import bench_to_markdown, print_bench
from invariance.render.comparison import CellChange, ReportComparison, compare_reports
from invariance.render.console import print_comparison, print_report
from invariance.render.html import to_html
from invariance.render.junit import to_junit
from invariance.render.markdown import comparison_to_markdown, to_markdown
from invariance.render.model import (
    model_failure_text,
    model_to_html,
    model_to_markdown,
    print_model_report,
)
from invariance.render.tables import print_environment, print_listing
from invariance.render.text import cell_line, failure_text, summary_lines

__all__ = [
    "CellChange",
    "ReportComparison",
    "bench_to_markdown",
    "cell_line",
    "compare_reports",
    "comparison_to_markdown",
    "failure_text",
    "model_failure_text",
    "model_to_html",
    "model_to_markdown",
    "print_bench",
    "print_comparison",
    "print_environment",
    "print_listing",
    "print_model_report",
    "print_report",
    "summary_lines",
    "to_html",
    "to_junit",
    "to_markdown",
]
