"""Report renderers: console (rich), Markdown, self-contained HTML, JUnit XML, and the
comparison of two reports.

The core never imports this package; it imports the core. Each renderer takes a
:class:`invariance.Report`::

    from rich.console import Console
    from invariance.render import print_report, to_html

    print_report(report, Console())
    Path("report.html").write_text(to_html(report))
"""

from __future__ import annotations

from invariance.render.comparison import CellChange, ReportComparison, compare_reports
from invariance.render.console import print_comparison, print_report
from invariance.render.html import to_html
from invariance.render.junit import to_junit
from invariance.render.markdown import comparison_to_markdown, to_markdown

__all__ = [
    "CellChange",
    "ReportComparison",
    "compare_reports",
    "comparison_to_markdown",
    "print_comparison",
    "print_report",
    "to_html",
    "to_junit",
    "to_markdown",
]
