"""Saved reports: the versioned schema, its validator (every malformed input is a ReportError naming
file, field path, expected and actual), and comparing two reports (nothing lost silently)."""

from __future__ import annotations

import copy
import json
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from invariance.compare import TensorDiff
from invariance.outputs import OutputError
from invariance.render.comparison import COMPARISON_HEADER, compare_reports
from invariance.report import (
    SCHEMA_VERSION,
    AccuracyResult,
    Environment,
    PerturbationResult,
    Report,
    ReportError,
    Violation,
)

ENV = Environment(device="cpu", device_name="x86_64", gpu_count=0, driver=None, cuda=None,
                  torch="2.4.0", triton="3.2.0", python="3.11.9", platform="Linux")


def _diff(name: str, ulp: int) -> TensorDiff:
    return TensorDiff(name=name, shape=(2, 4), dtype="float32", num_elements=8,
                      num_different=1, nan_mismatches=0, max_abs_diff=float("inf"),
                      max_ulp=ulp, first_index={"request": 0, "token": 1},
                      first_values=("1.0 (0x3f800000)", "inf (0x7f800000)"))


def sample(incomplete: str | None = "interrupted (KeyboardInterrupt) after 2 of 3 cells"
           ) -> Report:
    """A report using every field: violations with diffs, coverage, NaN accuracy, incomplete."""
    v = Violation(perturbation="batch_size", dtype="float32", case=1, schedule_a="alone",
                  schedule_b="batched", request_id=0, differing_tokens=1, compared_tokens=2,
                  diffs=[_diff("out", 3), _diff("lse", 1)], reproducer="invariance.replay()",
                  shrunk=True, classification="nondeterministic", note="shrunk in 4 runs",
                  case_data={"schema": "invariance.case", "focus": [0]})
    failed = PerturbationResult(
        backend="b", perturbation="batch_size", dtype="float32", description="batching",
        status="failed", cases=3, compared_tokens=12, num_violations=1, max_ulp=3,
        seconds=0.25, points=[{"batch_size": 2, "mismatch_rate": 0.5, "max_ulp": 3.0}],
        violations=[v], coverage={"batch_sizes": [1, 2], "paged": True})
    skipped = PerturbationResult(backend="b", perturbation="cuda_graph", dtype="float32",
                                 description="graphs", status="skipped",
                                 error="needs a CUDA device")
    acc = AccuracyResult(backend="b", dtype="float32", rows=8, max_abs_err_out=float("nan"),
                         worst_ratio=float("inf"), atol=1e-5, nan_rows=1, passed=False)
    return Report(backend="b", device="cpu", dtypes=["float32"], heads="4:2:64",
                  scale="small", budget=3, seed=7, perturbations=["batch_size", "cuda_graph"],
                  environment=ENV, results=[failed, skipped], accuracy=[acc],
                  started_at="2025-01-01T00:00:00Z", seconds=1.5, command="invariance check",
                  incomplete=incomplete)


def sample_dict() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(sample().to_json())
    return data


# --- round trip ---------------------------------------------------------------------------

def test_round_trip_keeps_every_field(tmp_path: Path) -> None:
    r = sample()
    text = r.to_json()
    data = json.loads(text)
    assert data["version"] == SCHEMA_VERSION == "1.2"
    assert data["incomplete"] == r.incomplete and data["passed"] is False
    back = Report.from_json(text)
    assert back.to_dict() == data
    assert back.incomplete == r.incomplete
    assert back.results[0].coverage == {"batch_sizes": [1, 2], "paged": True}
    v = back.violations[0]
    assert (v.classification, v.note, v.shrunk) == ("nondeterministic", "shrunk in 4 runs", True)
    assert v.case_data == {"schema": "invariance.case", "focus": [0]}
    assert v.diffs == r.violations[0].diffs and v.max_ulp == 3
    assert str(back.accuracy[0].max_abs_err_out) == "nan"
    assert back.accuracy[0].worst_ratio == float("inf")
    path = tmp_path / "r.json"
    r.to_json(path)
    assert Report.from_json(path).to_dict() == data
    assert Report.from_json(str(path)).to_dict() == data
    assert Report.from_json(path.read_bytes()).to_dict() == data


def test_incomplete_report_never_passes() -> None:
    r = sample()
    r.results = [r.results[1], PerturbationResult(
        backend="b", perturbation="repeat", dtype="float32", description="", status="passed",
        cases=3)]
    r.accuracy = []
    assert r.invariant and r.accurate and not r.passed
    assert r.summary().startswith("INCOMPLETE: backend b on cpu")
    assert "stopped early: interrupted (KeyboardInterrupt) after 2 of 3 cells" in r.summary()
    r.incomplete = None
    assert r.passed and r.summary().startswith("PASSED")
    failing = sample()
    assert failing.summary().startswith("FAILED, INCOMPLETE: ")
    both = Report.combine([r, failing])
    assert both.incomplete == failing.incomplete and not both.passed


def test_newer_minor_version_keeps_unknown_fields(tmp_path: Path) -> None:
    data = sample_dict()
    data["version"] = "1.9"
    data["future"] = {"x": [1, 2]}
    data["environment"]["npu"] = "none"
    data["results"][0]["flaky"] = False
    data["results"][0]["violations"][0]["hint"] = "look here"
    data["results"][0]["violations"][0]["diffs"][1]["bits"] = "0x1"
    data["accuracy"][0]["ref"] = "float64"
    r = Report.from_dict(data)
    assert r.extra == {"future": {"x": [1, 2]}}
    assert r.environment.extra == {"npu": "none"}
    assert r.results[0].extra == {"flaky": False}
    assert r.violations[0].extra == {"hint": "look here"}
    assert r.violations[0].diffs_extra == [{}, {"bits": "0x1"}]
    assert r.accuracy[0].extra == {"ref": "float64"}
    path = tmp_path / "again.json"
    r.to_json(path)
    again = json.loads(path.read_text(encoding="utf-8"))
    assert again["version"] == "1.2"
    data["version"] = "1.2"
    assert again == data
    assert Report.from_json(path).to_dict() == data


def test_old_integer_version_reads_as_1_0() -> None:
    """Schema 1.0 wrote ``"version": 1`` and let fields with defaults be absent."""
    data = sample_dict()
    data["version"] = 1
    for key in ("incomplete", "started_at", "seconds", "command", "passed"):
        del data[key]
    for key in ("coverage", "points", "cases", "violations"):
        del data["results"][1][key]
    del data["results"][0]["violations"][0]["classification"]
    del data["results"][0]["violations"][0]["note"]
    del data["accuracy"][0]["worst_ratio"]
    r = Report.from_dict(data)
    assert r.incomplete is None and r.results[1].coverage == {} and r.results[1].cases == 0
    assert r.violations[0].classification == "" and r.accuracy[0].worst_ratio == 0.0
    assert json.loads(r.to_json())["version"] == "1.2"
    assert Report.from_dict({**sample_dict(), "version": "1.0"}).incomplete is not None


def test_report_error_pickles() -> None:
    err = ReportError(file="a.json", field="budget", expected="int", actual="null")
    again = pickle.loads(pickle.dumps(err))
    assert str(again) == str(err) == "report a.json: budget: expected int, got null"


# --- malformed input: each class names file, field path, expected and actual ---------------

Mutation = Callable[[dict[str, Any]], None]


def _set(path: list[str | int], value: Any) -> Mutation:
    def mutate(d: dict[str, Any]) -> None:
        obj: Any = d
        for k in path[:-1]:
            obj = obj[k]
        obj[path[-1]] = value
    return mutate


def _delete(path: list[str | int]) -> Mutation:
    def mutate(d: dict[str, Any]) -> None:
        obj: Any = d
        for k in path[:-1]:
            obj = obj[k]
        del obj[path[-1]]
    return mutate


MALFORMED: list[tuple[str, Mutation, str, str, str]] = [
    # (id, mutation, field path, expected, actual)
    ("missing", _delete(["backend"]), "backend", "str", "nothing (field missing)"),
    ("missing-new-field", _delete(["incomplete"]), "incomplete", "str or null",
     "nothing (field missing)"),
    ("missing-deep", _delete(["results", 0, "violations", 0, "diffs", 1, "dtype"]),
     "results[0].violations[0].diffs[1].dtype", "str", "nothing (field missing)"),
    ("null", _set(["environment", "gpu_count"], None), "environment.gpu_count", "int", "null"),
    ("null-list", _set(["results"], None), "results", "list of object", "null"),
    ("wrong-type-deep", _set(["results", 0, "violations", 0, "diffs", 1, "max_ulp"], "12"),
     "results[0].violations[0].diffs[1].max_ulp", "int", "str '12'"),
    ("string-for-list", _set(["dtypes"], "float32"), "dtypes", "list of str",
     "str 'float32'"),
    ("list-item", _set(["perturbations", 1], 3), "perturbations[1]", "str", "int 3"),
    ("bool-for-int", _set(["budget"], True), "budget", "int", "bool true"),
    ("float-for-int", _set(["results", 0, "cases"], 3.0), "results[0].cases", "int",
     "float 3.0"),
    ("bad-status", _set(["results", 1, "status"], "ok"), "results[1].status",
     "one of 'passed', 'failed', 'error', 'skipped'", "str 'ok'"),
    ("bad-float-string", _set(["accuracy", 0, "atol"], "tiny"), "accuracy[0].atol",
     "number (or 'nan', 'inf', '-inf')", "str 'tiny'"),
    ("coverage-not-object", _set(["results", 0, "coverage"], [1]), "results[0].coverage",
     "object", "list [1]"),
    ("point-value", _set(["results", 0, "points", 0, "batch_size"], "2"),
     "results[0].points[0].batch_size", "number (or 'nan', 'inf', '-inf')", "str '2'"),
    ("first-values", _set(["results", 0, "violations", 0, "diffs", 0, "first_values"], ["a"]),
     "results[0].violations[0].diffs[0].first_values", "list of 2 str", "list [\"a\"]"),
    ("object-expected", _set(["results", 0, "violations", 0], "v"),
     "results[0].violations[0]", "object", "str 'v'"),
    ("environment", _set(["environment"], []), "environment", "object", "list []"),
    ("wrong-schema", _set(["schema"], "something else"), "schema", "'invariance.report'",
     "str 'something else'"),
    ("bad-version", _set(["version"], "1.x"), "version",
     "a string 'MAJOR.MINOR' (this invariance writes '1.2')", "str '1.x'"),
    ("float-version", _set(["version"], 1.1), "version",
     "a string 'MAJOR.MINOR' (this invariance writes '1.2')", "float 1.1"),
    ("huge-int-for-float", _set(["seconds"], 10**400), "seconds",
     "number (or 'nan', 'inf', '-inf')", "int 1" + "0" * 56 + "..."),
    ("long-value", _set(["heads"], ["x" * 200]), "heads", "str",
     "list [\"" + "x" * 55 + "..."),
]


@pytest.mark.parametrize(("mutate", "where", "expected", "actual"),
                         [m[1:] for m in MALFORMED], ids=[m[0] for m in MALFORMED])
def test_malformed_field_names_file_path_expected_actual(
        tmp_path: Path, mutate: Mutation, where: str, expected: str, actual: str) -> None:
    data = sample_dict()
    mutate(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(ReportError) as info:
        Report.from_json(path)
    err = info.value
    assert (err.file, err.field, err.expected, err.actual) == (str(path), where, expected, actual)
    assert str(err) == f"report {path}: {where}: expected {expected}, got {actual}"
    with pytest.raises(ReportError) as info:  # without a file: the same, unnamed
        Report.from_dict(data)
    assert str(info.value) == f"report: {where}: expected {expected}, got {actual}"


def test_newer_major_version_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "future.json"
    path.write_text(json.dumps({**sample_dict(), "version": "2.0", "backend": 5}))
    with pytest.raises(ReportError) as info:
        Report.from_json(path)
    assert str(info.value) == (f"report {path}: report schema 2.0 is newer than this invariance "
                               "(reads 1.x); upgrade invariance")
    with pytest.raises(ReportError, match=r"schema 3\.0 is newer"):
        Report.from_dict({**sample_dict(), "version": 3})


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b'{"schema": "invariance.report", "backend": "\xff\xfe"}',
         "not valid UTF-8 (byte 0xff at offset 44)"),
        (b'{"schema": "invariance.report", ', "not valid JSON: Expecting property name "
         "enclosed in double quotes at line 1 column 33"),
        (b"", "not valid JSON: Expecting value at line 1 column 1"),
        (b'{"a": 1, "a": 2}', "not valid JSON: field 'a' appears twice in one object"),
        (b"[" * 100_000, "not valid JSON: nested too deeply"),
        (b"[1, 2]", "expected a JSON object, got list [1, 2]"),
        (b'"report"', "expected a JSON object, got str 'report'"),
        (b"null", "expected a JSON object, got null"),
        (b'{"version": "1.1"}', "schema: expected 'invariance.report', got nothing (field "
         "missing; is this an invariance report?)"),
        (b'{"schema": "invariance.report"}', "version: expected a string 'MAJOR.MINOR' (this "
         "invariance writes '1.2'), got nothing (field missing)"),
        (b'{"schema": "invariance.report", "version": "0.9"}',
         "version: expected 1.x, got str '0.9' (an unknown, older schema)"),
        (b'{"schema": "invariance.report", "version": "1.1", "backend": "\\ud800"}',
         "backend: expected str, got str with a lone surrogate (not valid Unicode)"),
    ],
    ids=["utf8", "truncated", "empty", "duplicate-key", "deep", "list", "string", "null",
         "no-schema", "no-version", "older-major", "surrogate"],
)
def test_malformed_file_names_the_file(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    with pytest.raises(ReportError) as info:
        Report.from_json(path)
    assert str(info.value) == f"report {path}: {message}"
    assert info.value.file == str(path)


def test_unreadable_file_is_a_report_error(tmp_path: Path) -> None:
    with pytest.raises(ReportError, match=r"report .*missing\.json: cannot read it: No such"):
        Report.from_json(tmp_path / "missing.json")
    with pytest.raises(ReportError, match="cannot read it"):
        Report.from_json(tmp_path)  # a directory


def test_bom_and_non_finite_literals_are_read() -> None:
    data = sample_dict()
    text = json.dumps(data).replace('"seconds": 1.5', '"seconds": NaN')
    r = Report.from_json(b"\xef\xbb\xbf" + text.encode())
    assert r.seconds != r.seconds
    assert json.loads(r.to_json())["seconds"] == "nan"


def test_to_json_write_failure_is_an_output_error(tmp_path: Path) -> None:
    with pytest.raises(OutputError, match="no-such-dir"):
        sample().to_json(tmp_path / "no-such-dir" / "r.json")


# --- fuzz: corrupted JSON loads or raises ReportError, nothing else -----------------------

VALID = sample().to_json().encode()

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.just(10**400) | st.floats()
    | st.text(max_size=8)
    | st.sampled_from(["nan", "inf", "-inf", "passed", "skipped", "1.1", "2.0"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                max_size=3),
    max_leaves=6,
)


def _locations(obj: Any, out: list[tuple[Any, Any]]) -> list[tuple[Any, Any]]:
    """Every (container, key) in ``obj``."""
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) \
        if isinstance(obj, list) else ()
    for k, v in items:
        out.append((obj, k))
        _locations(v, out)
    return out


def _retype(value: Any) -> Any:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return {str(i): v for i, v in enumerate(value)}
    if isinstance(value, dict):
        return list(value.values())
    return 0


@st.composite
def corrupted(draw: st.DrawFn) -> bytes:
    op = draw(st.sampled_from(["delete", "replace", "retype", "truncate", "flip", "add"]))
    if op == "truncate":
        return VALID[:draw(st.integers(0, len(VALID) - 1))]
    if op == "flip":
        raw = bytearray(VALID)
        for _ in range(draw(st.integers(1, 4))):
            i = draw(st.integers(0, len(raw) - 1))
            raw[i] ^= draw(st.integers(1, 255))
        return bytes(raw)
    data = json.loads(VALID)
    for _ in range(draw(st.integers(1, 3))):
        locations = _locations(data, [])
        container, key = draw(st.sampled_from(locations))
        if op == "delete":
            del container[key]
        elif op == "replace":
            container[key] = draw(json_values)
        elif op == "retype":
            container[key] = _retype(container[key])
        else:
            target = container[key] if isinstance(container[key], dict) else data
            target[draw(st.text(max_size=6))] = draw(json_values)
    return json.dumps(data).encode()


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(corrupted())
def test_fuzz_corrupted_json_loads_or_raises_report_error(raw: bytes) -> None:
    try:
        r = Report.from_json(raw)
    except ReportError as exc:
        assert str(exc).startswith("report")
        return
    # Whatever loads is usable: it re-serialises, summarises and compares.
    again = Report.from_json(r.to_json())
    assert again.to_dict() == r.to_dict()
    assert r.summary()
    assert not compare_reports(r, r).regressed or r.incomplete is not None


# --- comparison: nothing lost silently ----------------------------------------------------

def make(cells: dict[tuple[str, str], str], *, accuracy: dict[str, bool] | None = None,
         dtypes: list[str] | None = None, incomplete: str | None = None) -> Report:
    results = [PerturbationResult(backend="b", perturbation=p, dtype=dt, description="",
                                  status=s, cases=1)  # type: ignore[arg-type]
               for (p, dt), s in cells.items()]
    acc = [AccuracyResult(backend="b", dtype=dt, rows=1, passed=ok)
           for dt, ok in (accuracy or {}).items()]
    return Report(backend="b", device="cpu",
                  dtypes=dtypes or list(dict.fromkeys(dt for _, dt in cells)), heads="h",
                  scale="small", budget=1, seed=0,
                  perturbations=list(dict.fromkeys(p for p, _ in cells)), environment=ENV,
                  results=results, accuracy=acc, incomplete=incomplete)


BASE = {("batch_size", "float32"): "passed", ("repeat", "float32"): "passed",
        ("order", "float32"): "failed", ("graph", "float32"): "skipped"}


@pytest.mark.parametrize(
    ("after", "name", "kind"),
    [
        ({**BASE, ("batch_size", "float32"): "failed"}, "batch_size[float32]", "now fails"),
        ({**BASE, ("batch_size", "float32"): "error"}, "batch_size[float32]", "now errors"),
        ({**BASE, ("batch_size", "float32"): "skipped"}, "batch_size[float32]", "now skipped"),
        ({**BASE, ("graph", "float32"): "failed"}, "graph[float32]", "now fails"),
        ({k: v for k, v in BASE.items() if k[0] != "repeat"}, "repeat[float32]", "lost"),
        ({k: v for k, v in BASE.items() if k[0] != "graph"}, "graph[float32]", "lost"),
    ],
    ids=["failed", "error", "skipped", "skipped-to-failed", "lost", "lost-skipped"],
)
def test_compare_worse(after: dict[tuple[str, str], str], name: str, kind: str) -> None:
    cmp = compare_reports(make(BASE), make(after))
    assert cmp.regressed
    assert [(c.name, c.change, c.kind) for c in cmp.worse] == [(name, "worse", kind)]
    assert cmp.summary().startswith("REGRESSED: ") and f"1 worse (1 {kind})" in cmp.summary()


def test_compare_disjoint_dtypes_regress() -> None:
    a = make({("batch_size", "float32"): "passed"}, accuracy={"float32": True})
    b = make({("batch_size", "float16"): "passed"}, accuracy={"float16": True})
    cmp = compare_reports(a, b)
    assert cmp.regressed
    kinds = {c.name: (c.change, c.kind) for c in cmp.cells}
    assert kinds == {
        "dtype float32": ("worse", "dtype lost"),
        "batch_size[float32]": ("worse", "lost"),
        "batch_size[float16]": ("only in B", "new"),
        "accuracy[float32]": ("worse", "lost"),
        "accuracy[float16]": ("only in B", "new"),
    }
    row = next(c for c in cmp.cells if c.scope == "dtype")
    assert row.columns() == ("dtype float32", "present", "absent", "worse", "dtype lost", "")


def test_compare_dtype_listed_but_without_cells_is_lost() -> None:
    a = make({("batch_size", "float32"): "passed"}, dtypes=["float32", "bfloat16"])
    b = make({("batch_size", "float32"): "passed"})
    assert [c.name for c in compare_reports(a, b).worse] == ["dtype bfloat16"]


def test_compare_every_cell_skipped_regresses() -> None:
    after = {k: "skipped" for k in BASE}
    cmp = compare_reports(make(BASE), make(after))
    assert cmp.regressed
    assert {c.name: c.kind for c in cmp.differences} == {
        "batch_size[float32]": "now skipped", "repeat[float32]": "now skipped",
        "order[float32]": "failed -> skipped"}
    assert [c.change for c in cmp.differences] == ["worse", "worse", "changed"]


def test_compare_incomplete_b_regresses_whatever_a_was() -> None:
    reason = "interrupted (KeyboardInterrupt) after 1 of 4 cells"
    cmp = compare_reports(make(BASE), make(BASE, incomplete=reason))
    assert cmp.regressed
    (row,) = cmp.worse
    assert (row.name, row.scope, row.kind) == ("run", "run", "B incomplete")
    assert row.columns() == ("run", "complete", "incomplete", "worse",
                             f"B incomplete: {reason}", "")
    assert row.label == f"worse (B incomplete): {reason}"
    both = compare_reports(make(BASE, incomplete="x"), make(BASE, incomplete="y"))
    assert both.regressed and both.worse[0].detail == "y"
    healed = compare_reports(make(BASE, incomplete="x"), make(BASE))
    assert not healed.regressed and [c.kind for c in healed.better] == ["now complete"]


def test_compare_accuracy() -> None:
    a = make(BASE, accuracy={"float32": True})
    b = make(BASE, accuracy={"float32": False})
    cmp = compare_reports(a, b)
    assert [(c.name, c.kind, c.columns()[1:3]) for c in cmp.worse] == [
        ("accuracy[float32]", "now inaccurate", ("PASS", "FAIL"))]
    back = compare_reports(b, a)
    assert not back.regressed and [c.kind for c in back.better] == ["now accurate"]


def test_compare_better_and_unchanged() -> None:
    after = {**BASE, ("order", "float32"): "passed", ("graph", "float32"): "passed",
             ("new", "float32"): "failed"}
    cmp = compare_reports(make(BASE), make(after))
    assert not cmp.regressed
    assert [(c.name, c.kind) for c in cmp.better] == [("order[float32]", "fixed"),
                                                      ("graph[float32]", "now runs and passes")]
    assert [(c.name, c.change) for c in cmp.differences][-1] == ("new[float32]", "only in B")
    assert cmp.summary().startswith("NO REGRESSION: ")
    assert "2 better, 1 only in B, 2 same" in cmp.summary()
    same = compare_reports(make(BASE), make(BASE))
    assert not same.regressed and not same.differences
    err = make({**BASE, ("order", "float32"): "error"})
    changed = compare_reports(make(BASE), err)
    assert not changed.regressed
    assert [(c.change, c.kind, c.label) for c in changed.differences] == [
        ("changed", "failed -> error", "changed (failed -> error)")]


def test_comparison_columns_match_header() -> None:
    cmp = compare_reports(make(BASE), make({**BASE, ("repeat", "float32"): "failed"}))
    assert len(COMPARISON_HEADER) == len(cmp.cells[0].columns())
    assert cmp.worse[0].columns() == ("repeat[float32]", "PASS", "FAIL", "worse", "now fails",
                                      "0 -> 0")


def test_sample_is_not_mutated_by_round_trip() -> None:
    r = sample()
    before = copy.deepcopy(r.to_dict())
    Report.from_dict(r.to_dict())
    assert r.to_dict() == before
