"""The report as one self-contained HTML file: inline CSS and inline SVG figures drawn here (no
network, no plotting library). Every piece of text goes through :func:`html.escape`."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from html import escape

from invariance.render._common import (
    DiffRow,
    Grid,
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
    plot_feature,
    plural,
    shown_violations,
    verdict,
    violation_heading,
    violation_title,
)
from invariance.report import PerturbationResult, Report

__all__ = ["mismatch_figure", "to_html"]

#: Series colours (one per dtype), colour-blind friendly (Okabe-Ito).
PALETTE = ("#0072b2", "#d55e00", "#009e73", "#cc79a7", "#e69f00", "#56b4e9")

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2rem auto;
max-width:72rem;padding:0 1rem;color:#1f2328;line-height:1.45}
h1{margin-bottom:.2rem} h1.passed{color:#1a7f37} h1.failed{color:#cf222e}
.summary{font-weight:600}
table{border-collapse:collapse;margin:.6rem 0 1.2rem}
th,td{border:1px solid #d0d7de;padding:.25rem .55rem;text-align:left;vertical-align:top}
th{background:#f6f8fa}
table.heatmap td.cell{font-family:ui-monospace,monospace;font-size:.85rem;white-space:nowrap}
td.passed{background:#dafbe1} td.skipped{background:#fff8c5;color:#6e5600}
td.error{background:#e8d5f5;color:#5a1f87;font-weight:600}
td.failed{color:#fff;font-weight:600}
td.desc{color:#57606a;font-size:.85rem}
.figures{display:flex;flex-wrap:wrap;gap:1rem}
figure{margin:0;border:1px solid #d0d7de;border-radius:6px;padding:.4rem}
figcaption{font-size:.85rem;color:#57606a;max-width:340px}
pre{background:#f6f8fa;padding:.6rem;overflow-x:auto;font-size:.8rem}
.violation{margin-left:1rem}
.dim{color:#57606a}
details summary{cursor:pointer}
"""


def _e(text: object) -> str:
    return escape(str(text), quote=True)


def _table(header: Sequence[str], rows: Iterable[Sequence[str]], cls: str = "") -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in row) + "</tr>" for row in rows)
    attr = f' class="{_e(cls)}"' if cls else ""
    return f"<table{attr}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _failed_colour(max_ulp: int) -> str:
    """Red, darker for larger ULP distances (1 ULP light, ~1e6 ULP dark)."""
    t = min(1.0, math.log10(max(1, max_ulp)) / 6)
    light, dark = (0xE5, 0x6A, 0x6A), (0x8B, 0x0A, 0x0A)
    r, g, b = (round(lo + (hi - lo) * t) for lo, hi in zip(light, dark, strict=True))
    return f"#{r:02x}{g:02x}{b:02x}"


def _heatmap(g: Grid) -> str:
    head = "<th>perturbation</th>" + "".join(f"<th>{_e(dt)}</th>" for dt in g.dtypes)
    head += "<th>what changes between the two schedules</th>"
    rows = []
    for p in g.perturbations:
        tds = [f"<th><code>{_e(p)}</code></th>"]
        for dt in g.dtypes:
            cell = g.get(p, dt)
            if cell is None:
                tds.append('<td class="cell dim">-</td>')
                continue
            style = (f' style="background:{_failed_colour(cell.max_ulp)}"'
                     if cell.status == "failed" else "")
            tip = cell.error or cell.description
            tds.append(f'<td class="cell {_e(cell.status)}"{style} title="{_e(tip)}">'
                       f"{_e(cell_text(cell))}</td>")
        tds.append(f'<td class="desc">{_e(g.descriptions.get(p, ""))}</td>')
        rows.append("<tr>" + "".join(tds) + "</tr>")
    return (f'<table class="heatmap"><thead><tr>{head}</tr></thead><tbody>'
            f'{"".join(rows)}</tbody></table>')


def _ticks(lo: float, hi: float, n: int = 5, *, integer: bool = False) -> list[float]:
    """Round tick values over ``[lo, hi]``; whole numbers only when ``integer`` (batch sizes,
    lengths: no 2.5 on an axis of counts)."""
    if hi <= lo:
        return [lo]
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    steps = (1, 2, 5, 10) if integer else (1, 2, 2.5, 5, 10)
    step = next(m * mag for m in steps if m * mag >= raw)
    if integer:
        step = max(1.0, math.ceil(step))
    start = math.ceil(lo / step) * step
    out = []
    x = start
    while x <= hi + step * 1e-9:
        out.append(round(x, 10))
        x += step
    return out


def mismatch_figure(perturbation: str, cells: Sequence[PerturbationResult], *,
                    width: int = 340, height: int = 220) -> str | None:
    """An inline SVG: the fraction of compared tokens whose bits differ (y) against the case
    feature that varies most (x, e.g. batch size or neighbour length), one series per dtype.
    ``None`` when no cell has points."""
    series = [(c.dtype, c.points) for c in cells if c.points]
    if not series:
        return None
    feature = plot_feature([p for _, pts in series for p in pts])
    left, right, top, bottom = 46, 12, 26, 40
    pw, ph = width - left - right, height - top - bottom
    xs = [p.get(feature, 0.0) if feature else float(i)
          for _, pts in series for i, p in enumerate(pts)]
    x_lo, x_hi = min(xs), max(xs)
    pad = (x_hi - x_lo) * 0.05 or 1.0
    x_lo, x_hi = x_lo - pad, x_hi + pad

    def sx(x: float) -> float:
        return left + (x - x_lo) / (x_hi - x_lo) * pw

    def sy(y: float) -> float:
        return top + (1 - y) * ph

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" role="img" '
             f'aria-label="{_e(perturbation)}: mismatch rate by {_e(feature or "case")}">',
             f"<title>{_e(perturbation)}: mismatch rate by {_e(feature or 'case')}</title>",
             f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="#fff" '
             f'stroke="#d0d7de"/>']
    for y in (0.0, 0.25, 0.5, 0.75, 1.0):
        parts.append(f'<line x1="{left}" x2="{left + pw}" y1="{sy(y):.1f}" y2="{sy(y):.1f}" '
                     f'stroke="#eaeef2"/>')
        parts.append(f'<text x="{left - 4}" y="{sy(y) + 4:.1f}" font-size="10" '
                     f'text-anchor="end" fill="#57606a">{y:g}</text>')
    integer = all(float(x).is_integer() for x in xs)
    for x in _ticks(x_lo + pad, x_hi - pad, integer=integer) if feature else []:
        parts.append(f'<text x="{sx(x):.1f}" y="{top + ph + 14}" font-size="10" '
                     f'text-anchor="middle" fill="#57606a">{x:g}</text>')
    parts.append(f'<text x="{left + pw / 2:.1f}" y="{height - 6}" font-size="11" '
                 f'text-anchor="middle">{_e(feature or "case")}</text>')
    parts.append(f'<text x="12" y="{top + ph / 2:.1f}" font-size="11" text-anchor="middle" '
                 f'transform="rotate(-90 12 {top + ph / 2:.1f})">mismatch rate</text>')
    parts.append(f'<text x="{left}" y="14" font-size="12" font-weight="600">'
                 f"{_e(perturbation)}</text>")
    for k, (dtype, pts) in enumerate(series):
        colour = PALETTE[k % len(PALETTE)]
        coords = [((p.get(feature, 0.0) if feature else float(i)), p.get("mismatch_rate", 0.0),
                   p) for i, p in enumerate(pts)]
        by_x: dict[float, list[float]] = {}
        for x, y, _ in coords:
            by_x.setdefault(x, []).append(y)
        # A line only joins one point per x: through several at one x it would pass through
        # their mean, where no case is.
        if len(by_x) > 1 and all(len(v) == 1 for v in by_x.values()):
            line = " ".join(f"{sx(x):.1f},{sy(v[0]):.1f}" for x, v in sorted(by_x.items()))
            parts.append(f'<polyline points="{line}" fill="none" stroke="{colour}" '
                         f'stroke-width="1.5" opacity="0.7"/>')
        for x, y, p in coords:
            tip = ", ".join(f"{name}={value:g}" for name, value in p.items())
            parts.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3.5" fill="{colour}" '
                         f'fill-opacity="0.75"><title>{_e(dtype)}: {_e(tip)}</title></circle>')
        lx = left + pw - 70 * (len(series) - k) + 10
        parts.append(f'<circle cx="{lx}" cy="{top - 10}" r="4" fill="{colour}"/>'
                     f'<text x="{lx + 7}" y="{top - 6}" font-size="10">{_e(dtype)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _figures(report: Report, g: Grid) -> str:
    figs = []
    for p in g.perturbations:
        cells = [c for dt in g.dtypes if (c := g.get(p, dt)) is not None]
        svg = mismatch_figure(p, cells)
        if svg is None:
            continue
        caption = "; ".join(f"{c.dtype}: {c.status}, worst {c.max_ulp} ULP" for c in cells
                            if c.points)
        figs.append(f"<figure>{svg}<figcaption>{_e(caption)}</figcaption></figure>")
    if not figs:
        return ""
    return ("<h2>Mismatch rate by case</h2><p class=\"dim\">Fraction of the compared tokens "
            "whose bits differ between the two schedules of each case, against the case "
            "feature that varies most; one colour per dtype. An invariant kernel sits on zero."
            "</p><div class=\"figures\">" + "".join(figs) + "</div>")


def _violations(report: Report) -> str:
    failed = report.failed_cells()
    if not failed:
        return ""
    out = ["<h2>Violations</h2>"]
    for cell in failed:
        out.append(f'<section class="cell-violations"><h3>{_e(violation_title(cell))}</h3>'
                   f'<p class="dim">{_e(cell.description)}</p>')
        if cell.status == "error":
            out.append(f"<pre>{_e(cell.error or 'the backend raised')}</pre>")
        shown = shown_violations(cell)
        for v in shown:
            out.append(f'<div class="violation"><h4>{_e(violation_heading(v))}</h4>'
                       f"<ul><li>a: {_e(v.schedule_a)}</li><li>b: {_e(v.schedule_b)}</li></ul>")
            out.append(_table(DiffRow.HEADER, [d.cells() for d in diff_rows(v.diffs)]))
            out.append("<details><summary>reproducer (paste into Python)</summary>"
                       f'<pre><code class="language-python">{_e(v.reproducer)}</code></pre>'
                       "</details></div>")
        extra = more_violations(cell, len(shown))
        if extra:
            more = plural(extra, "more violating case")
            out.append(f'<p class="dim">… and {more} in this cell.</p>')
        out.append("</section>")
    return "".join(out)


def to_html(report: Report) -> str:
    """``report`` as a self-contained HTML page."""
    g = grid(report)
    v = verdict(report)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>invariance: {_e(v)}: {_e(report.backend)}</title>",
        f"<style>{_CSS}</style></head><body>",
        f'<h1 class="{v.lower()}">invariance: {_e(v)}</h1>',
        f'<p class="summary">{_e(report.summary())}</p>',
        "<h2>Perturbation × dtype</h2>",
        '<p class="dim">Each cell: verdict · violating / run cases · worst ULP distance; '
        "darker red means a larger ULP distance. Skipped cells are never counted as passed."
        "</p>",
        _heatmap(g),
        f'<p class="dim">{_e(coverage_line(report))}</p>',
        _figures(report, g),
        _violations(report),
    ]
    if report.accuracy:
        parts.append("<h2>Accuracy against the float64 reference</h2>")
        parts.append(_table(accuracy_header(), [accuracy_row(a) for a in report.accuracy]))
    cov_rows = coverage_rows(report)
    if cov_rows:
        parts.append("<h2>Coverage</h2><p class=\"dim\">What each cell compared.</p>")
        parts.append(_table(coverage_header(), cov_rows))
    parts.append("<h2>Environment</h2>")
    parts.append(_table(("", ""), environment_rows(report)))
    parts.append("</body></html>")
    return "\n".join(p for p in parts if p) + "\n"

