"""A :class:`~invariance.model.ModelReport` (``invariance model``) as console output, Markdown,
a self-contained HTML page (the per-layer ULP curve as an inline SVG chart) and the text a
failing pytest check prints. The words come from :func:`scenario_row` and :func:`origin_lines`,
shared by every format."""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape

from rich.console import Console
from rich.table import Table
from rich.text import Text

from invariance.model.report import ModelReport, ScenarioResult
from invariance.render.html import PALETTE

__all__ = [
    "SCENARIO_HEADER",
    "model_failure_text",
    "model_to_html",
    "model_to_markdown",
    "origin_lines",
    "print_model_report",
    "same_origin_line",
    "scenario_row",
    "ulp_curve_figure",
]

#: How a scenario's status reads.
WORD = {"identical": "IDENTICAL", "diverged": "DIVERGED", "skipped": "skipped",
        "error": "ERROR"}
_STYLE = {"identical": "green", "diverged": "bold red", "skipped": "yellow",
          "error": "bold magenta"}
_MARK = {"identical": "✅", "diverged": "❌", "skipped": "⏭️", "error": "💥"}
SCENARIO_HEADER = ("scenario", "status", "run (vs the request alone)", "origin", "op",
                   "ULP at output")


def _output_ulp(s: ScenarioResult) -> str:
    point = next((p for p in s.curve if p.label == "output"), None)
    return "-" if point is None or s.status != "diverged" else str(point.max_ulp)


def scenario_row(s: ScenarioResult) -> tuple[str, ...]:
    """One scenario as the cells of :data:`SCENARIO_HEADER`."""
    origin = s.origin
    what = s.variant or s.description
    if s.status in ("skipped", "error"):
        what = s.reason
    return (s.name, WORD.get(s.status, s.status), what,
            f"{origin.label} [{origin.module_type}]" if origin is not None else "-",
            origin.op.name if origin is not None and origin.op is not None else "-",
            _output_ulp(s))


def _tokens(tokens: Sequence[int]) -> str:
    if not tokens:
        return "-"
    if list(tokens) == list(range(tokens[0], tokens[0] + len(tokens))) and len(tokens) > 2:
        return f"{tokens[0]}-{tokens[-1]}"
    return ", ".join(map(str, tokens))


def origin_lines(s: ScenarioResult) -> list[str]:
    """What a diverged scenario found, in lines: the runs, the origin and its op, the diff, the
    clean prefix, the independent origins, the curve and the flipped tokens."""
    lines = [f"{s.name}: {s.variant} vs {s.reference}"
             + (f" ({s.classification})" if s.classification else "")]
    o = s.origin
    if o is None:
        lines.append(f"  first difference at {s.first_divergence or '?'}; no module call "
                     f"diverged on identical inputs (the difference entered through inputs "
                     f"that could not be compared)")
    else:
        lines.append(f"  origin: {o.label} [{o.module_type}] in forward {o.step} (tokens "
                     f"{_tokens(o.tokens)}): its {o.inputs_compared} compared input(s) are "
                     f"bit-identical, its output is not")
        if o.op is not None:
            lines.append(f"  op: {o.op.name} (op #{o.op.index} of {o.op.ops_traced} traced): "
                         f"{o.op.cause}")
            if o.op.note:
                lines.append(f"  note: {o.op.note}")
        else:
            lines.append("  op: none of the traced ops' outputs differs for the request (the "
                         "difference comes from an op whose output cannot be mapped to it)")
        lines.append(f"  diff: {o.diff.summary()}"
                     + (f" (+{o.differing_leaves - 1} more output leaves)"
                        if o.differing_leaves > 1 else ""))
    lines.append(f"  clean prefix: {s.clean_prefix} of {s.calls_compared} compared module "
                 f"calls agreed bit for bit before the first difference "
                 f"({s.first_divergence or '-'})")
    if s.origins:
        groups = ", ".join(f"{g.module_type} x{g.calls}" + (f" ({g.op})" if g.op else "")
                           for g in s.origins)
        lines.append(f"  independent origins (diverge on identical inputs even with every "
                     f"earlier one reset): {groups}")
    if s.curve:
        lines.append("  ULP by layer: " + ", ".join(f"{p.label} {p.max_ulp}" for p in s.curve))
    if s.flips:
        shown = ", ".join(f"token {f.token}: {f.reference} -> {f.variant}" for f in s.flips[:5])
        more = f" (+{len(s.flips) - 5} more)" if len(s.flips) > 5 else ""
        lines.append(f"  greedy token flips: {shown}{more}")
    elif s.status == "diverged":
        lines.append("  greedy tokens: none flipped")
    if s.reproducer is not None:
        r = s.reproducer
        lines.append(f"  reproducer: batch of {r.batch_size}"
                     + (f" (shrunk from {s.batch_size} in {r.attempts} runs)" if r.shrunk
                        else ""))
    if s.unmapped:
        lines.append(f"  not compared: {s.unmapped} tensor leaves that could not be mapped to "
                     f"the request (e.g. {s.unmapped_examples[0] if s.unmapped_examples else '-'})")
    return lines


def _origin_key(s: ScenarioResult) -> tuple[str, int, str] | None:
    o = s.origin
    return None if o is None else (o.path, o.call, o.op.name if o.op is not None else "")


def same_origin_line(s: ScenarioResult, first: ScenarioResult) -> str:
    """One line for a scenario whose origin (module call and op) an earlier one showed."""
    r = s.reproducer
    return (f"{s.name}: {s.variant} vs {s.reference}: the same origin as {first.name}; "
            f"{_output_ulp(s)} ULP at the output"
            + (f"; reproducer: batch of {r.batch_size}" if r is not None else ""))


# --------------------------------------------------------------------------------------------
# Console and text
# --------------------------------------------------------------------------------------------

def print_model_report(report: ModelReport, console: Console, *,
                       reproducers: bool = True) -> None:
    """Print ``report``: summary, scenario table, what each diverged scenario found (the first
    one's reproducer), the model and environment, and the summary again as the last line."""
    style = "bold green" if report.passed else "bold red"
    console.print(Text(report.summary(), style=style), soft_wrap=True)
    table = Table(title=f"{report.model}: one request alone vs in other runs",
                  title_justify="left", caption="bit for bit, every module's output",
                  caption_justify="left")
    for h in SCENARIO_HEADER:
        table.add_column(h, overflow="fold")
    for s in report.scenarios:
        cells = scenario_row(s)
        table.add_row(Text(cells[0], style="bold"), Text(cells[1], style=_STYLE[s.status]),
                      *map(Text, cells[2:]))
    console.print(table)
    shown = False
    seen: dict[tuple[str, int, str], ScenarioResult] = {}
    for s in report.diverged:
        key = _origin_key(s)
        if key is not None and key in seen:
            console.print(Text(same_origin_line(s, seen[key]), style="dim"), soft_wrap=True)
            continue
        if key is not None:
            seen[key] = s
        console.print()
        console.rule(Text(f"{s.name}: {WORD[s.status]}", style=_STYLE[s.status]), align="left")
        if s.status == "error":
            console.print(Text(s.reason, style=_STYLE["error"]), soft_wrap=True)
            continue
        for line in origin_lines(s):
            console.print(Text(line), overflow="fold")
        if reproducers and not shown and s.reproducer is not None:
            console.print(Text("reproducer (paste into Python; raises while it diverges):",
                               style="dim"))
            console.print(Text(s.reproducer.code), soft_wrap=True)
            shown = True
    console.print()
    env = Table(title="model and environment", title_justify="left", show_header=False)
    env.add_column("key", style="dim")
    env.add_column("value", overflow="fold")
    for k, v in _model_rows(report):
        env.add_row(Text(k), Text(v))
    console.print(env)
    console.print()
    console.print(Text(report.summary(), style=style), soft_wrap=True)


def _model_rows(report: ModelReport) -> list[tuple[str, str]]:
    e = report.environment
    rows = [("model", f"{report.model} ({report.model_type}, {report.source})"),
            ("parameters", f"{report.parameters:,} in {report.modules} modules"),
            ("dtype / device", f"{report.dtype} on {report.device} ({e.device_name})"),
            ("attention", report.attention), ("inputs", report.inputs),
            ("requests", f"length {report.length}, decode steps {report.decode_steps}, batch "
                         f"sizes {', '.join(map(str, report.batch_sizes))}, seed {report.seed}"),
            ("torch / triton", f"{e.torch} / {e.triton or '-'}"),
            ("CUDA / driver", f"{e.cuda or '-'} / {e.driver or '-'}"),
            ("python / platform", f"{e.python} / {e.platform}")]
    if report.command:
        rows.append(("command", report.command))
    return rows


def model_failure_text(report: ModelReport, nodeid: str = "") -> str:
    """What a failing ``invariance_model`` check prints: the summary, what each diverged
    scenario found, and the first reproducer."""
    lines = [f"invariance model: {report.summary()}"]
    code = None
    seen: dict[tuple[str, int, str], ScenarioResult] = {}
    for s in report.diverged:
        if s.status == "error":
            lines.append(f"  {s.name}: ERROR {s.reason}")
            continue
        key = _origin_key(s)
        if key is not None and key in seen:
            lines.append(f"  {same_origin_line(s, seen[key])}")
            continue
        if key is not None:
            seen[key] = s
        lines += [f"  {line}" for line in origin_lines(s)]
        if code is None and s.reproducer is not None:
            code = "\n".join(f"    {x}".rstrip() for x in s.reproducer.code.splitlines())
            lines.append(f"  reproducer ({s.name}; raises while it diverges):\n{code}")
    if not any(s.status != "skipped" for s in report.scenarios):
        lines.append("  no scenario ran: " + "; ".join(f"{s.name}: {s.reason}"
                                                       for s in report.scenarios))
    if nodeid:
        lines.append(f"  (test {nodeid}; seed {report.seed})")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# Markdown
# --------------------------------------------------------------------------------------------

def _md(text: str) -> str:
    return (text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")
            .replace("<", "&lt;").replace(">", "&gt;"))


def _md_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    return (["| " + " | ".join(_md(h) for h in header) + " |",
             "|" + "|".join("---" for _ in header) + "|"]
            + ["| " + " | ".join(_md(c) for c in row) + " |" for row in rows])


def _fence(code: str, lang: str = "") -> list[str]:
    ticks = "```"
    while ticks in code:
        ticks += "`"
    return [f"{ticks}{lang}", code, ticks]


def model_to_markdown(report: ModelReport) -> str:
    """``report`` as GitHub-flavoured Markdown."""
    out = [f"# invariance model: {report.verdict()}", "", f"**{_md(report.summary())}**", "",
           "One request, alone and in other runs; every module's output compared bit for bit.",
           ""]
    rows = [(f"{_MARK.get(s.status, '')} {r[0]}", *r[1:])
            for s, r in ((s, scenario_row(s)) for s in report.scenarios)]
    out += _md_table(SCENARIO_HEADER, rows)
    for s in report.diverged:
        out += ["", f"## {_MARK[s.status]} {_md(s.name)}", ""]
        if s.status == "error":
            out += [*_fence(s.reason), ""]
            continue
        lines = origin_lines(s)
        out += [_md(lines[0]), ""] + [f"- {_md(line.strip())}" for line in lines[1:]]
        if s.curve:
            out += ["", *_md_table(("layer", "max ULP", "differing elements", "elements"),
                                   [(p.label, str(p.max_ulp), str(p.num_different),
                                     str(p.num_elements)) for p in s.curve])]
        if s.reproducer is not None:
            out += ["", "<details><summary>reproducer</summary>", ""]
            out += _fence(s.reproducer.code, "python")
            out += ["", "</details>"]
    out += ["", "## Model and environment", ""]
    out += _md_table(("what", "value"), _model_rows(report))
    return "\n".join(out).rstrip() + "\n"


# --------------------------------------------------------------------------------------------
# HTML
# --------------------------------------------------------------------------------------------

def _e(text: object) -> str:
    return escape(str(text), quote=True)


def ulp_curve_figure(scenarios: Sequence[ScenarioResult], *, width: int = 640,
                     height: int = 280) -> str | None:
    """An inline SVG: the worst ULP distance (log scale, 0 at the bottom) at each layer's
    output and at the model's output, one line per diverged scenario. ``None`` when no
    scenario diverged with a curve."""
    series = [s for s in scenarios if s.status == "diverged" and s.curve][:len(PALETTE)]
    if not series:
        return None
    labels: list[str] = []
    for s in series:
        for p in s.curve:
            if p.label not in labels:
                labels.append(p.label)
    top = max(max(p.max_ulp for p in s.curve) for s in series)
    decades = max(1, math.ceil(math.log10(top + 1)))
    left, right, up, bottom = 56, 16, 30, 70
    pw, ph = width - left - right, height - up - bottom

    def sx(i: int) -> float:
        return left + (i + 0.5) * pw / len(labels)

    def sy(ulp: int) -> float:
        return up + (1 - math.log10(ulp + 1) / decades) * ph

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" role="img" aria-label="worst ULP distance by '
             f'layer"><title>worst ULP distance by layer</title>',
             f'<rect x="{left}" y="{up}" width="{pw}" height="{ph}" fill="#fff" '
             f'stroke="#d0d7de"/>']
    for d in range(decades + 1):
        y = up + (1 - d / decades) * ph
        tick = "0" if d == 0 else f"1e{d}" if d > 2 else str(10 ** d)
        parts.append(f'<line x1="{left}" x2="{left + pw}" y1="{y:.1f}" y2="{y:.1f}" '
                     f'stroke="#eaeef2"/><text x="{left - 4}" y="{y + 4:.1f}" font-size="10" '
                     f'text-anchor="end" fill="#57606a">{tick}</text>')
    step = max(1, len(labels) // 16)
    for i, label in enumerate(labels):
        if i % step == 0 or label == "output":
            x = sx(i)
            parts.append(f'<text x="{x:.1f}" y="{up + ph + 10}" font-size="9" '
                         f'text-anchor="end" fill="#57606a" transform="rotate(-35 {x:.1f} '
                         f'{up + ph + 10})">{_e(label)}</text>')
    parts.append(f'<text x="14" y="{up + ph / 2:.1f}" font-size="11" text-anchor="middle" '
                 f'transform="rotate(-90 14 {up + ph / 2:.1f})">max ULP (log)</text>')
    for k, s in enumerate(series):
        colour = PALETTE[k % len(PALETTE)]
        pts = [(labels.index(p.label), p) for p in s.curve]
        line = " ".join(f"{sx(i):.1f},{sy(p.max_ulp):.1f}" for i, p in pts)
        parts.append(f'<polyline points="{line}" fill="none" stroke="{colour}" '
                     f'stroke-width="1.6"/>')
        for i, p in pts:
            parts.append(f'<circle cx="{sx(i):.1f}" cy="{sy(p.max_ulp):.1f}" r="3" '
                         f'fill="{colour}"><title>{_e(s.name)}: {_e(p.label)}: {p.max_ulp} ULP, '
                         f'{p.num_different} of {p.num_elements} elements differ</title>'
                         f'</circle>')
        lx = left + 8 + k * 110
        parts.append(f'<circle cx="{lx}" cy="{up - 12}" r="4" fill="{colour}"/>'
                     f'<text x="{lx + 7}" y="{up - 8}" font-size="10">{_e(s.name)}</text>')
    parts.append("</svg>")
    return "".join(parts)


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2rem auto;
max-width:72rem;padding:0 1rem;color:#1f2328;line-height:1.45}
h1.passed{color:#1a7f37} h1.failed{color:#cf222e} .summary{font-weight:600}
table{border-collapse:collapse;margin:.6rem 0 1.2rem}
th,td{border:1px solid #d0d7de;padding:.25rem .55rem;text-align:left;vertical-align:top}
th{background:#f6f8fa} td.identical{background:#dafbe1} td.diverged{background:#ffebe9;
font-weight:600} td.skipped{background:#fff8c5} td.error{background:#e8d5f5}
pre{background:#f6f8fa;padding:.6rem;overflow-x:auto;font-size:.8rem}
ul.found{font-family:ui-monospace,monospace;font-size:.85rem} .dim{color:#57606a}
"""


def _html_table(header: Sequence[str], rows: Sequence[Sequence[str]],
                classes: Sequence[str] = ()) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = []
    for i, row in enumerate(rows):
        cls = classes[i] if i < len(classes) else ""
        cells = "".join(f'<td class="{_e(cls)}">{_e(c)}</td>' if j == 1 and cls else
                        f"<td>{_e(c)}</td>" for j, c in enumerate(row))
        body.append(f"<tr>{cells}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def model_to_html(report: ModelReport) -> str:
    """``report`` as one self-contained HTML page (inline CSS and SVG, no scripts)."""
    v = report.verdict()
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             '<meta name="viewport" content="width=device-width, initial-scale=1">',
             f"<title>invariance model: {_e(v)}: {_e(report.model)}</title>",
             f"<style>{_CSS}</style></head><body>",
             f'<h1 class="{"passed" if report.passed else "failed"}">invariance model: '
             f"{_e(v)}</h1>", f'<p class="summary">{_e(report.summary())}</p>',
             "<h2>Scenarios</h2><p class=\"dim\">One request, alone and in other runs; every "
             "module's output compared bit for bit.</p>",
             _html_table(SCENARIO_HEADER, [scenario_row(s) for s in report.scenarios],
                         [s.status for s in report.scenarios])]
    figure = ulp_curve_figure(report.scenarios)
    if figure is not None:
        parts.append("<h2>How the difference grows</h2><p class=\"dim\">Worst ULP distance of "
                     "the request's rows at each layer's output and at the model's output "
                     "(log scale; 0 = bit-identical).</p>" + f"<figure>{figure}</figure>")
    for s in report.diverged:
        parts.append(f"<h2>{_e(s.name)}: {_e(WORD[s.status])}</h2>")
        if s.status == "error":
            parts.append(f"<pre>{_e(s.reason)}</pre>")
            continue
        lines = origin_lines(s)
        parts.append(f"<p>{_e(lines[0])}</p><ul class=\"found\">"
                     + "".join(f"<li>{_e(line.strip())}</li>" for line in lines[1:]) + "</ul>")
        if s.reproducer is not None:
            parts.append("<details><summary>reproducer (paste into Python)</summary>"
                         f'<pre><code class="language-python">{_e(s.reproducer.code)}'
                         "</code></pre></details>")
    parts.append("<h2>Model and environment</h2>")
    parts.append(_html_table(("what", "value"), _model_rows(report)))
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"
