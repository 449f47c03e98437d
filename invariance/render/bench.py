"""A :class:`invariance.bench.BenchReport` as a rich table (console) and as Markdown.

Both lay out the same cells (:func:`bench_table`): per workload its kind, its ideal time at the
measured limits, and per backend the median time, the fraction of the ideal reached and, against
the baseline, the ratio of times (the invariance tax). Eager timings (not captured in a CUDA
graph) are marked with a dagger and explained below the table.
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from invariance.bench import BenchReport, WorkloadResult
from invariance.render.markdown import _esc
from invariance.render.markdown import _table as _md_table

__all__ = ["bench_table", "bench_to_markdown", "print_bench"]

EAGER_MARK = "†"


def _us(ms: float | None) -> str:
    if ms is None:
        return "n/a"
    us = ms * 1e3
    return f"{us:.1f}" if us < 100 else f"{us:.0f}"


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.0f}%"


def _ratio(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}x"


def _shape(report: BenchReport, r: WorkloadResult) -> str:
    """A workload's dtype, heads and page size where they differ from the run's."""
    parts = [x for x, run in ((r.dtype, report.dtype), (r.heads, report.heads)) if x and x != run]
    if r.page_size and r.page_size != report.page_size:
        parts.append(f"page {r.page_size}")
    return ", ".join(parts) or "-"


def _composites(report: BenchReport) -> set[str]:
    """Backends timed as composites (a fastest variant recorded)."""
    return {n for r in report.results for n, t in r.times.items() if t.variant or t.candidates}


def bench_table(report: BenchReport) -> tuple[list[str], list[list[str]]]:
    """``(header, rows)``: the cells every renderer shows."""
    composites = _composites(report)
    header = ["workload", "kind", "shape", "ideal us"]
    for name in report.backends:
        header += [f"{name} us", f"{name} % ideal"]
        if name in composites:
            header.append(f"{name} variant")
        if report.baseline is not None and name != report.baseline:
            header.append(f"{name} / {report.baseline}")
    rows: list[list[str]] = []
    for r in report.results:
        row = [r.workload, r.kind, _shape(report, r), f"{_us(r.ideal_ms)} ({r.bound})"]
        for name in report.backends:
            t = r.times.get(name)
            cell = "error" if t is not None and t.error else _us(report.ms(r, name))
            if t is not None and t.mode == "eager" and not t.error:
                cell += EAGER_MARK
            row += [cell, _pct(report.fraction(r, name))]
            if name in composites:
                row.append(t.variant if t is not None and t.variant else "-")
            if report.baseline is not None and name != report.baseline:
                row.append(_ratio(report.ratio(r, name)))
        rows.append(row)
    return header, rows


def _summary(report: BenchReport) -> list[str]:
    env = report.environment
    gpu = env.get("device_name") or env.get("device") or "?"
    sms = f" ({env['sms']} SMs)" if env.get("sms") else ""
    lim = report.limits
    lines = [
        f"GPU: {gpu}{sms}, driver {env.get('driver') or '?'}, torch {env.get('torch', '?')} "
        f"(CUDA {env.get('cuda') or '?'}).",
        f"Measured in this run: HBM read {lim.hbm_read_GBps:.0f} GB/s, copy "
        f"{lim.copy_GBps:.0f} GB/s (read + write), bf16 matmul {lim.matmul_TFLOPs:.0f} TFLOP/s.",
        f"{report.dtype}, heads {report.heads}, page size {report.page_size} unless a workload's "
        f"shape says otherwise; shuffled pages; features: {_features(report)}. "
        f"Times: {report.timing}. Ideal: decode KV bytes / HBM read bandwidth, prefill causal "
        f"FLOPs / matmul peak, mixed the larger.",
    ]
    if report.baseline is not None:
        lines.append(f"Ratios: a backend's time / {report.baseline}'s (the invariance tax when "
                     f"the backend is invariant and the baseline is not).")
    return lines


def _features(report: BenchReport) -> str:
    from invariance.features import Features

    return Features.from_dict(report.features).describe() if report.features else "none"


def _footnotes(report: BenchReport) -> tuple[list[str], list[str]]:
    notes = [f"{EAGER_MARK} {w} {b}: {n}" for w, b, n in report.notes()]
    errors = [f"{w} {b}: {e}" for w, b, e in report.errors()]
    return notes, errors


def print_bench(report: BenchReport, console: Console) -> None:
    """The report as a rich table with its summary and notes."""
    for line in _summary(report):
        console.print(Text(line, style="dim"))
    header, rows = bench_table(report)
    table = Table(title="invariance bench", title_justify="left")
    for i, col in enumerate(header):
        table.add_column(col, justify="left" if i < 3 else "right", no_wrap=i == 0)
    for row in rows:
        table.add_row(*(Text(c) for c in row))
    console.print(table)
    notes, errors = _footnotes(report)
    for line in notes:
        console.print(Text(line, style="yellow"))
    for line in errors:
        console.print(Text(f"error: {line}", style="red"))




def bench_to_markdown(report: BenchReport) -> str:
    """The report as GitHub-flavoured Markdown."""
    lines = ["# invariance bench", ""]
    lines += [line + "  " for line in _summary(report)]
    if report.command:
        lines.append(f"Command: `{report.command}`" + (
            f" ({report.environment['date_utc']} UTC)" if report.environment.get("date_utc")
            else ""))
    lines.append("")
    header, rows = bench_table(report)
    lines += _md_table(header, rows)
    notes, errors = _footnotes(report)
    workload_notes = [f"- {r.workload}: {r.notes}" for r in report.results if r.notes]
    if workload_notes:
        lines += ["", "Workloads:", *workload_notes]
    if notes:
        lines += ["", *[f"- {_esc(n)}" for n in notes]]
    if errors:
        lines += ["", "Errors:", *[f"- {_esc(e)}" for e in errors]]
    return "\n".join(lines) + "\n"
