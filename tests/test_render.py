"""The report renderers: console, Markdown, HTML (parsed), JUnit XML, and report comparison."""

from __future__ import annotations

import copy
import io
import xml.etree.ElementTree as ET
from html.parser import HTMLParser

import pytest
from rich.console import Console

import invariance
from invariance.render import (
    compare_reports,
    comparison_to_markdown,
    print_comparison,
    print_report,
    to_html,
    to_junit,
    to_markdown,
)
from invariance.render._common import (
    cell_text,
    coverage_line,
    coverage_text,
    plot_feature,
    violation_title,
)
from invariance.report import AccuracyResult, PerturbationResult, Report

PERTURBS = ["batch_size", "repeat"]


@pytest.fixture(scope="module")
def variant() -> Report:
    """The batch-variant control: ``batch_size`` fails, ``repeat`` passes."""
    return invariance.check("torch-batch-variant", device="cpu", dtype="float32",
                            perturbations=PERTURBS, shrink=False)


@pytest.fixture(scope="module")
def reference() -> Report:
    return invariance.check("reference", device="cpu", dtype="float32", perturbations=PERTURBS)


@pytest.fixture(scope="module")
def mixed(variant: Report) -> Report:
    """The variant report plus an error cell, a skipped cell and a second dtype."""
    r = copy.deepcopy(variant)
    r.dtypes.append("float16")
    r.perturbations.append("cuda_graph")
    r.results.append(PerturbationResult(
        backend=r.backend, perturbation="order", dtype="float16", description="reordered",
        status="error", cases=1, error="case 0: RuntimeError: boom <kernel>"))
    r.results.append(PerturbationResult(
        backend=r.backend, perturbation="cuda_graph", dtype="float32", description="graphs",
        status="skipped", error="needs a CUDA device"))
    r.accuracy.append(AccuracyResult(backend=r.backend, dtype="float16", rows=8,
                                     max_abs_err_out=1.0, worst_ratio=500.0, passed=False))
    return r


def render_console(report: Report, width: int = 120) -> str:
    console = Console(width=width, color_system=None, record=True, file=io.StringIO())
    report.command = "invariance check --backend x"
    print_report(report, console)
    return console.export_text()


def test_variant_fails_only_batch_size(variant: Report) -> None:
    assert not variant.passed
    assert variant.cell("batch_size", "float32").status == "failed"
    assert variant.cell("repeat", "float32").status == "passed"


def test_console_shows_table_violations_accuracy_environment(variant: Report) -> None:
    text = render_console(variant)
    assert text.splitlines()[0].startswith("FAILED: backend torch-batch-variant on cpu")
    assert "perturbation × dtype" in text
    cell = variant.cell("batch_size", "float32")
    assert f"FAIL · {cell.num_violations}/{cell.cases} cases · {cell.max_ulp} ULP" in text
    assert "PASS · 3 cases" in text
    v = cell.violations[0]
    flat = " ".join(text.split())
    assert f"a: {v.schedule_a}" in flat and f"b: {v.schedule_b}" in flat
    out = v.diffs[0]
    assert f"out: {out.num_different} of {out.num_elements} elements differ" in flat
    assert f"max {out.max_ulp} ULP" in flat and "first at request=" in flat
    assert "lse: " in flat
    assert "reproducer (paste into Python):" in text
    # The reproducer is printed unwrapped, so each line pastes as valid Python.
    start = text.index("import torch")
    code = text[start:text.index("invariance.replay(", start)]
    compile(code, "<reproducer>", "exec")
    assert "accuracy against the float64 reference" in text
    assert "torch" in text and invariance.report.Environment.capture().torch in text
    assert "invariance check --backend x" in text


def test_console_never_shows_skipped_as_pass(mixed: Report) -> None:
    text = render_console(mixed)
    line = next(ln for ln in text.splitlines() if "cuda_graph" in ln)
    assert "skipped" in line and "PASS" not in line
    assert "ERROR" in text and "boom <kernel>" in text
    assert "1 error, 1 skipped" in text


def test_cell_text_for_each_status(mixed: Report) -> None:
    texts = {c.status: cell_text(c) for c in mixed.results}
    assert texts["passed"].startswith("PASS")
    assert texts["failed"].startswith("FAIL")
    assert texts["error"].startswith("ERROR")
    assert texts["skipped"].startswith("skipped")


def test_markdown(mixed: Report) -> None:
    md = to_markdown(mixed)
    assert md.startswith("# invariance: FAILED")
    assert "| perturbation | float32 | float16 | what changes |" in md
    assert "| `batch_size` | ❌ FAIL" in md
    assert "## Violations" in md and "### ❌ batch_size [float32]" in md
    assert "```python\nimport torch" in md
    assert "max \\|diff\\|" in md  # pipes inside cells are escaped
    assert "## Accuracy against the float64 reference" in md
    assert "⏭️ skipped (needs a CUDA device)" in md
    assert "boom &lt;kernel&gt;" in md or "boom <kernel>" in md


class _Collector(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def test_html_is_self_contained_with_table_and_figure(mixed: Report) -> None:
    page = to_html(mixed)
    parser = _Collector()
    parser.feed(page)
    parser.close()
    names = [t for t, _ in parser.tags]
    assert "table" in names and "svg" in names and "circle" in names
    assert any(t == "table" and a.get("class") == "heatmap" for t, a in parser.tags)
    assert any(t == "td" and "failed" in (a.get("class") or "") for t, a in parser.tags)
    assert any(t == "td" and "skipped" in (a.get("class") or "") for t, a in parser.tags)
    # No network: nothing is loaded from elsewhere.
    assert not any(t in ("script", "link", "img", "iframe") for t in names)
    assert not any(a.get("src") or a.get("href") for _, a in parser.tags)
    text = "".join(parser.text)
    assert "batch_size [float32]" in text and "invariance.replay(" in text
    assert "boom <kernel>" in text  # escaped in the source, restored by the parser
    assert "<kernel>" not in page
    # Each figure is well-formed XML.
    start = page.index("<svg")
    ET.fromstring(page[start:page.index("</svg>", start) + len("</svg>")])


def test_html_escapes_everything(variant: Report) -> None:
    r = copy.deepcopy(variant)
    r.backend = "<script>alert(1)</script>"
    r.results[0].description = 'a "quoted" & <b>bold</b> description'
    page = to_html(r)
    assert "<script>" not in page and "<b>" not in page
    assert "&lt;script&gt;" in page


def test_junit(mixed: Report) -> None:
    mixed.command = "invariance check"
    root = ET.fromstring(to_junit(mixed))
    suite = root.find("testsuite")
    assert suite is not None
    cases = suite.findall("testcase")
    assert len(cases) == len(mixed.results) + len(mixed.accuracy)
    by_name = {c.get("name"): c for c in cases}
    assert {c.get("classname") for c in cases} == {"invariance.torch-batch-variant"}
    failure = by_name["batch_size[float32]"].find("failure")
    assert failure is not None and "not bitwise identical" in (failure.get("message") or "")
    assert "invariance.replay(" in (failure.text or "")
    assert by_name["repeat[float32]"].find("failure") is None
    assert by_name["order[float16]"].find("error") is not None
    assert by_name["cuda_graph[float32]"].find("skipped") is not None
    assert by_name["accuracy[float32]"].find("failure") is None
    assert by_name["accuracy[float16]"].find("failure") is not None
    assert suite.get("failures") == "2" and suite.get("errors") == "1"
    assert suite.get("skipped") == "1"
    props = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert props["command"] == "invariance check"


def test_json_round_trip_renders_the_same(variant: Report) -> None:
    again = Report.from_json(text=variant.to_json())
    assert to_markdown(again) == to_markdown(variant)
    assert to_junit(again) == to_junit(variant)


def test_compare_detects_the_changed_cell(reference: Report, variant: Report) -> None:
    assert reference.passed
    cmp = compare_reports(reference, variant)
    assert [c.name for c in cmp.worse] == ["batch_size[float32]"]
    assert cmp.regressed
    back = compare_reports(variant, reference)
    assert not back.regressed and [c.name for c in back.better] == ["batch_size[float32]"]
    assert not compare_reports(reference, reference).differences
    console = Console(width=120, color_system=None, record=True, file=io.StringIO())
    print_comparison(cmp, console)
    text = console.export_text()
    assert "batch_size[float32]" in text and "worse" in text and "REGRESSED" in text
    assert "repeat[float32]" not in text
    assert "| batch_size[float32] | PASS | FAIL | worse |" in comparison_to_markdown(cmp)


def test_compare_cells_only_in_one_report(reference: Report, mixed: Report) -> None:
    changes = {c.name: c.change for c in compare_reports(reference, mixed).cells}
    assert changes["order[float16]"] == "only in B"
    assert changes["accuracy[float16]"] == "only in B"
    changes = {c.name: c.change for c in compare_reports(mixed, reference).cells}
    assert changes["cuda_graph[float32]"] == "worse"  # a lost cell is worse


def test_plot_feature_prefers_the_feature_that_varies() -> None:
    pts = [{"batch_size": 2.0, "neighbor_len": 10.0, "mismatch_rate": 0.0, "max_ulp": 0.0},
           {"batch_size": 2.0, "neighbor_len": 300.0, "mismatch_rate": 1.0, "max_ulp": 5.0}]
    assert plot_feature(pts) == "neighbor_len"
    assert plot_feature([{"page_size": 4.0, "mismatch_rate": 0.0}]) == "page_size"
    assert plot_feature([{"mismatch_rate": 0.0}]) is None


def test_html_axes_of_counts_have_whole_ticks_and_no_line_through_a_mean() -> None:
    from invariance.render.html import _ticks, mismatch_figure
    from invariance.report import PerturbationResult

    assert _ticks(2, 9, integer=True) == [2, 4, 6, 8]
    assert all(float(t).is_integer() for t in _ticks(1, 13, integer=True))
    cell = PerturbationResult("b", "batch_size", "float32", "d", "failed", points=[
        {"batch_size": 2.0, "mismatch_rate": 0.0}, {"batch_size": 2.0, "mismatch_rate": 1.0},
        {"batch_size": 8.0, "mismatch_rate": 0.5}])
    svg = mismatch_figure("batch_size", [cell])
    assert svg is not None and "<polyline" not in svg and "2.5<" not in svg
    one_each = PerturbationResult("b", "batch_size", "float32", "d", "failed", points=[
        {"batch_size": 2.0, "mismatch_rate": 0.0}, {"batch_size": 8.0, "mismatch_rate": 0.5}])
    assert "<polyline" in (mismatch_figure("batch_size", [one_each]) or "")


def test_cosmetic_words_are_singular_when_one() -> None:
    from invariance.render._common import plural

    assert plural(1, "more violating case") == "1 more violating case"
    assert plural(2, "more violating case") == "2 more violating cases"


def test_coverage_in_every_format(variant: Report) -> None:
    cell = variant.cell("batch_size", "float32")
    sizes = "1-17, 24, 32, 40, 48, 56, 64, 65"
    rows = cell.coverage["compared_rows"]
    line = coverage_line(variant)
    rows += variant.cell("repeat", "float32").coverage["compared_rows"]
    assert line.startswith(f"coverage: {rows} rows compared in 2 cells")
    assert "rows up to" in line and f"batch sizes {sizes}" in line
    text = render_console(variant)
    flat = " ".join(text.split())
    assert line in flat and "coverage: what each cell compared" in text
    assert f"batch_size │ float32 │ {cell.coverage['max_compared_kv_len']} │ {sizes}" in flat
    md = to_markdown(variant)
    assert "## Coverage" in md and "| batch_size | float32 | " in md and sizes in md
    assert f"_{line}_" in md
    page = to_html(variant)
    assert "<h2>Coverage</h2>" in page and sizes in page and line in page
    suite = ET.fromstring(to_junit(variant)).find("testsuite")
    assert suite is not None
    props = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert props["coverage"] == line
    out = {c.get("name"): c.findtext("system-out") for c in suite.iter("testcase")}
    assert out["batch_size[float32]"] == f"coverage: {coverage_text(cell)}\n"
    assert f"batches {sizes}" in coverage_text(cell)


def test_headline_says_which_case_the_worst_ulp_comes_from(variant: Report) -> None:
    cell = copy.deepcopy(variant.cell("batch_size", "float32"))
    v = cell.violations[0]
    cell.points = [{"max_ulp": 10.0}, {"max_ulp": 8007.0}]
    cell.max_ulp = 8007
    v.case, v.shrunk = 0, True
    v.diffs[0].max_ulp, v.diffs[1].max_ulp = 438, 0
    assert violation_title(cell).endswith(
        "not bitwise identical (max 8007 ULP in case 1); the case shown: case 0, shrunk, "
        "438 ULP")
    # The case shown is the worst, unshrunk: the headline's number is its own.
    v.case, v.shrunk = 1, False
    v.diffs[0].max_ulp = 8007
    assert violation_title(cell).endswith("(max 8007 ULP in case 1)")
