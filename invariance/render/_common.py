"""What every renderer shares: cell verdict words, the perturbation x dtype grid, violation and
diff rows, accuracy and environment rows. Renderers only lay these out; none of this imports
rich."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from invariance.compare import TensorDiff
from invariance.perturb import ranges
from invariance.report import (
    AccuracyResult,
    PerturbationResult,
    Report,
    Violation,
    describe_features,
)

__all__ = [
    "FEATURE_ORDER",
    "MAX_VIOLATIONS_SHOWN",
    "STATUS_WORD",
    "DiffRow",
    "Grid",
    "accuracy_header",
    "accuracy_row",
    "cell_name",
    "cell_text",
    "coverage_header",
    "coverage_line",
    "coverage_rows",
    "coverage_text",
    "diff_rows",
    "environment_rows",
    "fmt_float",
    "grid",
    "more_violations",
    "plot_feature",
    "plural",
    "row_label",
    "shown_case",
    "shown_violations",
    "verdict",
    "violation_heading",
    "violation_lines",
    "violation_title",
    "worst_case",
]

#: Violations shown per cell (the report keeps a few; the rest are only counted).
MAX_VIOLATIONS_SHOWN = 3

#: How a cell's status reads. Skipped is never shown as a pass.
STATUS_WORD: dict[str, str] = {
    "passed": "PASS",
    "failed": "FAIL",
    "error": "ERROR",
    "skipped": "skipped",
}

#: Case features a figure can put on its x axis, in order of preference.
FEATURE_ORDER = ("batch_size", "neighbor_len", "chunk_size", "page_size", "position",
                 "decode_tokens")


def verdict(report: Report) -> str:
    return report.verdict()


def plural(n: int, word: str, words: str | None = None) -> str:
    """``1 case``, ``2 cases`` (``words`` for irregular plurals)."""
    return f"{n} {word if n == 1 else (words or word + 's')}"


def fmt_float(x: float) -> str:
    if math.isnan(x) or math.isinf(x):
        return str(x)
    if x == 0:
        return "0"
    return f"{x:.3g}"




def cell_text(cell: PerturbationResult) -> str:
    """One grid cell in words: verdict, violating cases / cases run, worst ULP distance."""
    word = STATUS_WORD.get(cell.status, cell.status)
    if cell.status == "passed":
        return f"{word} · {plural(cell.cases, 'case')} · 0 ULP"
    if cell.status == "failed":
        return f"{word} · {cell.num_violations}/{cell.cases} cases · {cell.max_ulp} ULP"
    if cell.status == "error":
        return f"{word} · after {plural(cell.cases, 'case')}"
    return f"{word}" + (f" ({cell.error})" if cell.error else "")


@dataclass
class Grid:
    """The perturbation x dtype table: ``cells[(row, dtype)]``. A row is a perturbation; in a
    combined report (cells of several checks) it is ``check: perturbation``
    (:func:`row_label`), so that no check's cell hides another's."""

    perturbations: list[str]
    dtypes: list[str]
    cells: dict[tuple[str, str], PerturbationResult]
    descriptions: dict[str, str]

    def get(self, perturbation: str, dtype: str) -> PerturbationResult | None:
        return self.cells.get((perturbation, dtype))


def row_label(check: str, perturbation: str) -> str:
    """A grid row: the perturbation, prefixed by its check's id in a combined report."""
    return f"{check}: {perturbation}" if check else perturbation


def cell_name(cell: PerturbationResult) -> str:
    """``perturbation [dtype]``, prefixed by the check's id in a combined report."""
    return f"{row_label(cell.check, cell.perturbation)} [{cell.dtype}]"


def grid(report: Report) -> Grid:
    combined = any(r.check for r in report.results)
    rows: list[str] = [] if combined else list(report.perturbations)
    dtypes: list[str] = list(report.dtypes)
    cells: dict[tuple[str, str], PerturbationResult] = {}
    descriptions: dict[str, str] = {}
    for r in report.results:
        row = row_label(r.check, r.perturbation)
        if row not in rows:
            rows.append(row)
        if r.dtype not in dtypes:
            dtypes.append(r.dtype)
        cells[(row, r.dtype)] = r
        descriptions.setdefault(row, r.description)
    return Grid(rows, dtypes, cells, descriptions)


def worst_case(cell: PerturbationResult) -> int | None:
    """The index of the case whose ULP distance is the cell's worst (its points hold one per
    case); ``None`` when the points do not say."""
    ulps = [p.get("max_ulp") for p in cell.points]
    for i, ulp in enumerate(ulps):
        if ulp is not None and ulp == cell.max_ulp:
            return i
    return None


def violation_title(cell: PerturbationResult) -> str:
    """A failed cell's headline: violating cases, the worst ULP distance and the case it comes
    from, and, when the case shown below is another one or shrunk to another distance, that
    case and its own distance."""
    if cell.status == "error":
        return f"{cell_name(cell)}: error after {cell.cases} cases"
    worst = worst_case(cell)
    where = f" in case {worst}" if worst is not None else ""
    return (f"{cell_name(cell)}: {cell.num_violations} of {cell.cases} cases "
            f"not bitwise identical (max {cell.max_ulp} ULP{where})" + shown_case(cell))


def shown_case(cell: PerturbationResult) -> str:
    """``; the case shown: case 0, shrunk, 438 ULP`` when the violation a failed cell shows
    first is not its worst case as it is (another case, or shrunk to another distance);
    ``""`` otherwise."""
    if not cell.violations:
        return ""
    v = cell.violations[0]
    if v.case == worst_case(cell) and v.max_ulp == cell.max_ulp:
        return ""
    return f"; the case shown: case {v.case}{', shrunk' if v.shrunk else ''}, {v.max_ulp} ULP"


def _int(cov: dict[str, object], key: str) -> int | None:
    value = cov.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _sizes(cov: dict[str, object]) -> list[int]:
    sizes = cov.get("batch_sizes")
    if not isinstance(sizes, list):
        return []
    return [n for n in sizes if isinstance(n, int) and not isinstance(n, bool)]


def coverage_text(cell: PerturbationResult) -> str:
    """What a cell compared, in words: ``rows up to 2563 tokens · batches 1-17, 24 · calls up
    to 4097 KV / 257 query tokens · 425 rows compared (256 within a schedule)``; ``-`` when
    it recorded nothing."""
    cov = cell.coverage
    parts = []
    longest = _int(cov, "max_compared_kv_len")
    if longest is not None:
        parts.append(f"rows up to {longest} tokens")
    sizes = _sizes(cov)
    if sizes:
        parts.append(f"batches {ranges(sizes)}")
    kv, q = _int(cov, "max_call_kv_tokens"), _int(cov, "max_call_query_tokens")
    if kv is not None and q is not None:
        parts.append(f"calls up to {kv} KV / {q} query tokens")
    rows, repeated = _int(cov, "compared_rows"), _int(cov, "repeated_rows")
    if rows is not None:
        parts.append(f"{rows} rows compared" + (f" ({repeated} within a schedule)"
                                                if repeated else ""))
    return " · ".join(parts) or "-"


def coverage_header() -> tuple[str, ...]:
    return ("perturbation", "dtype", "longest row (KV)", "batch sizes",
            "largest call (KV / query tokens)", "rows compared (repeated in a schedule)")


def coverage_rows(report: Report) -> list[tuple[str, ...]]:
    """One row per cell that ran (:func:`coverage_header`)."""
    rows: list[tuple[str, ...]] = []
    for cell in report.results:
        cov = cell.coverage
        if cell.status == "skipped" or not cov:
            continue
        kv, q = _int(cov, "max_call_kv_tokens"), _int(cov, "max_call_query_tokens")
        rows_compared, repeated = _int(cov, "compared_rows"), _int(cov, "repeated_rows")
        longest = _int(cov, "max_compared_kv_len")
        rows.append((
            cell.perturbation, cell.dtype, "-" if longest is None else str(longest),
            ranges(_sizes(cov)) or "-",
            "-" if kv is None or q is None else f"{kv} / {q}",
            "-" if rows_compared is None else str(rows_compared)
            + (f" ({repeated})" if repeated else "")))
    return rows


def coverage_line(report: Report) -> str:
    """The whole report's coverage in one line (every cell that ran together)."""
    cells = [c for c in report.results if c.status != "skipped" and c.coverage]
    if not cells:
        return "coverage: nothing compared"
    longest = max((_int(c.coverage, "max_compared_kv_len") or 0 for c in cells), default=0)
    sizes = sorted({n for c in cells for n in _sizes(c.coverage)})
    kv = max((_int(c.coverage, "max_call_kv_tokens") or 0 for c in cells), default=0)
    q = max((_int(c.coverage, "max_call_query_tokens") or 0 for c in cells), default=0)
    rows = sum(_int(c.coverage, "compared_rows") or 0 for c in cells)
    repeated = sum(_int(c.coverage, "repeated_rows") or 0 for c in cells)
    text = (f"coverage: {rows} rows compared in {plural(len(cells), 'cell')}"
            + (f" ({repeated} of them computed twice within a schedule)" if repeated else "")
            + f"; rows up to {longest} KV tokens; batch sizes {ranges(sizes) or '-'}")
    if kv or q:
        text += f"; calls up to {kv} KV tokens and {q} query tokens"
    return text


def violation_heading(v: Violation) -> str:
    """``case 2, request 0 (batch-variant): 3 of 19 tokens differ, shrunk``; a
    nondeterministic violation says so in capitals, it is not about this perturbation."""
    shrunk = ", shrunk" if v.shrunk else ""
    kind = {"nondeterministic": " (NONDETERMINISTIC: a schedule disagrees with itself)",
            "batch-variant": " (batch-variant)"}.get(v.classification, "")
    note = f" [{v.note}]" if v.note else ""
    return (f"case {v.case}, request {v.request_id}{kind}: {v.differing_tokens} of "
            f"{plural(v.compared_tokens, 'token')} differ{shrunk}{note}")


def more_violations(cell: PerturbationResult, shown: int) -> int:
    """How many of the cell's violations are counted but not shown."""
    return max(0, cell.num_violations - shown)


def shown_violations(cell: PerturbationResult) -> list[Violation]:
    return cell.violations[:MAX_VIOLATIONS_SHOWN]


@dataclass
class DiffRow:
    """One tensor's comparison, as text columns."""

    tensor: str
    differing: str
    max_abs_diff: str
    max_ulp: str
    first_index: str
    values: str

    HEADER = ("tensor", "differing elements", "max |diff|", "max ULP", "first differing index",
              "values there (a vs b)")

    def cells(self) -> tuple[str, str, str, str, str, str]:
        return (self.tensor, self.differing, self.max_abs_diff, self.max_ulp, self.first_index,
                self.values)


def diff_rows(diffs: Sequence[TensorDiff]) -> list[DiffRow]:
    rows = []
    for d in diffs:
        where = (", ".join(f"{k}={v}" for k, v in d.first_index.items())
                 if d.first_index else "-")
        values = f"{d.first_values[0]} vs {d.first_values[1]}" if d.first_values else "-"
        differing = f"{d.num_different} of {d.num_elements}"
        if d.nan_mismatches:
            differing += f" ({d.nan_mismatches} NaN)"
        rows.append(DiffRow(d.name, differing, fmt_float(d.max_abs_diff) if d.num_different
                            else "0", str(d.max_ulp), where, values))
    return rows


def violation_lines(v: Violation) -> list[str]:
    """A violation as plain text lines (JUnit failure bodies, plain logs)."""
    lines = [violation_heading(v), f"  a: {v.schedule_a}", f"  b: {v.schedule_b}"]
    lines += [f"  {d.summary()}" for d in v.diffs]
    return lines


def accuracy_header() -> tuple[str, ...]:
    return ("dtype", "rows", "max abs err out", "rel err out", "max abs err lse",
            "worst / tolerance", "result")


def accuracy_row(a: AccuracyResult) -> tuple[str, ...]:
    result = "PASS" if a.passed else "FAIL"
    if a.nan_rows:
        result += f" ({a.nan_rows} NaN rows)"
    elif a.rows == 0:
        result += " (no rows)"
    return (f"{a.check}: {a.dtype}" if a.check else a.dtype, str(a.rows),
            fmt_float(a.max_abs_err_out), fmt_float(a.rel_err_out),
            fmt_float(a.max_abs_err_lse), fmt_float(a.worst_ratio), result)


def environment_rows(report: Report) -> list[tuple[str, str]]:
    e = report.environment
    rows = [
        ("device", f"{e.device} ({e.device_name})"),
        ("GPUs", str(e.gpu_count)),
        ("driver", e.driver or "-"),
        ("CUDA", e.cuda or "-"),
        ("torch", e.torch),
        ("triton", e.triton or "-"),
        ("python", e.python),
        ("platform", e.platform),
        ("settings", f"heads {report.heads}, scale {report.scale}, budget {report.budget}, "
                     f"seed {report.seed}"),
    ]
    if report.features:
        rows.append(("features", describe_features(report.features)))
    if report.started_at:
        rows.append(("started", report.started_at))
    cmd = report.command
    if cmd:
        rows.append(("command", cmd))
    return rows


def plot_feature(points: Sequence[dict[str, float]]) -> str | None:
    """The case feature to plot mismatch rate against: the one with the most distinct values
    (ties go to :data:`FEATURE_ORDER`'s order); ``None`` when no feature varies or exists."""
    best: tuple[int, int, str] | None = None
    names = [k for p in points for k in p if k not in ("mismatch_rate", "max_ulp")]
    for name in dict.fromkeys(names):
        distinct = len({p[name] for p in points if name in p})
        rank = FEATURE_ORDER.index(name) if name in FEATURE_ORDER else len(FEATURE_ORDER)
        key = (distinct, -rank, name)
        if best is None or key[:2] > best[:2]:
            best = key
    return best[2] if best else None
