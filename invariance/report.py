"""The result of :func:`invariance.check`: a ``Report`` and its versioned, validated JSON form.

JSON schema ``"schema": "invariance.report"``, ``"version": "1.2"`` (``"MAJOR.MINOR"``)::

    {schema, version, backend, device, dtypes[], heads, scale, budget, seed, perturbations[],
     features{...}, started_at, seconds, command, incomplete, passed, environment{...},
     checks[ {id, backend, device, dtypes[], heads, scale, budget, seed, perturbations[],
              command, incomplete} ],
     results[ {check, backend, perturbation, dtype, description, status, cases, compared_tokens,
               num_violations, max_ulp, seconds, error, points[{...}], coverage{...},
               violations[ {perturbation, dtype, case, schedule_a, schedule_b, request_id,
                            differing_tokens, compared_tokens, reproducer, shrunk,
                            classification, note, case_data{...},
                            diffs[{...}]} ]} ],
     accuracy[ {check, backend, dtype, rows, max_abs_err_out, rel_err_out, max_abs_err_lse,
                worst_ratio, atol, rtol, lse_atol, nan_rows, passed} ]}

A report of one check has ``checks: []`` and every ``check`` is ``""``. A combined report
(:meth:`Report.combine`, e.g. a pytest session's) lists each check's id and settings in
``checks``, and each cell and accuracy row names its check: a cell is identified by (check,
perturbation, dtype), an accuracy row by (check, dtype), and no two may share an identity.

``status`` is one of ``passed``, ``failed``, ``error`` (the backend raised) or ``skipped`` (the
perturbation needs something absent here, e.g. CUDA; never counted as passed). ``incomplete`` is
``null`` when the run finished, else why it stopped. Non-finite floats are written as the strings
``"nan"``, ``"inf"``, ``"-inf"``.

Versions: a MINOR version only adds fields (1.1: every field written; 1.2: ``check``,
``checks``, ``features``). Reading checks every field's presence and type, and that the file
agrees with itself (a cell's status with its violations and error, an accuracy verdict with its
errors, distinct cell identities), and raises :class:`ReportError` naming the file, the field path
(``results[3].violations[0].diffs[1].max_ulp``), what was expected and what was found. A file
of a newer MINOR version loads: fields this version does not know are kept in each object's
``extra`` and written back on save. A newer MAJOR version is refused. Version 1.0 files
(``"version": 1``) load as before: a field with a default may be absent. In a 1.0 or 1.1 file
(which had no check ids) a cell or accuracy row repeating an earlier one's identity is given the
check id ``#2``, ``#3``, ... in file order, so that every cell stays visible and is judged.
``features`` (1.2) holds the check's attention features as ``invariance.Features.to_dict``
writes them (``{}``: none; a combined report of checks with different features holds
``{"per_check": [...]}``); files before 1.2 read as ``{}``.
"""

from __future__ import annotations

import codecs
import copy
import importlib.metadata
import json
import os
import platform
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Generic, Literal, NoReturn, TypeVar, cast

from invariance.compare import TensorDiff
from invariance.outputs import write_atomic

__all__ = [
    "SCHEMA",
    "SCHEMA_VERSION",
    "AccuracyResult",
    "CheckInfo",
    "Environment",
    "PerturbationResult",
    "Report",
    "ReportError",
    "Violation",
    "describe_features",
]

SCHEMA = "invariance.report"
#: The schema version written ("MAJOR.MINOR"); this version reads every 1.x.
SCHEMA_VERSION = "1.2"
_VERSION = (1, 2)

Status = Literal["passed", "failed", "error", "skipped"]
_STATUSES: tuple[str, ...] = ("passed", "failed", "error", "skipped")


class ReportError(ValueError):
    """A saved report that cannot be read: which file, which field, what was expected, what
    was found.

    ``str(error)`` reads ``report FILE: FIELD: expected EXPECTED, got ACTUAL`` (or ``report
    FILE: PROBLEM`` for a file-level problem such as invalid JSON); ``file`` is ``None`` when the
    report did not come from a file, ``field`` is ``""`` for the whole document.
    """

    def __init__(self, problem: str = "", *, file: str | None = None, field: str = "",
                 expected: str = "", actual: str = "") -> None:
        self.problem = problem
        self.file = file
        self.field = field
        self.expected = expected
        self.actual = actual
        super().__init__(self.message)

    @property
    def message(self) -> str:
        parts = [f"report {self.file}" if self.file else "report"]
        if self.field:
            parts.append(self.field)
        parts.append(f"expected {self.expected}, got {self.actual}" if self.expected
                     else self.problem)
        return ": ".join(parts)

    def in_file(self, file: str | Path) -> ReportError:
        """The same error, naming ``file``."""
        return ReportError(self.problem, file=str(file), field=self.field,
                           expected=self.expected, actual=self.actual)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_report_error, (self.problem, self.file, self.field, self.expected,
                                self.actual))


def _report_error(problem: str, file: str | None, field: str, expected: str,
                  actual: str) -> ReportError:
    return ReportError(problem, file=file, field=field, expected=expected, actual=actual)


@dataclass
class Environment:
    """Where a report was produced: what a bug report needs."""

    device: str
    device_name: str
    gpu_count: int
    driver: str | None
    cuda: str | None
    torch: str
    triton: str | None
    python: str
    platform: str
    #: Fields of a newer schema this version does not know: kept, and written back on save.
    extra: dict[str, Any] = field(default_factory=dict, repr=False)

    def to_dict(self) -> dict[str, Any]:
        return _with_extra(_plain(self), self.extra)

    @classmethod
    def capture(cls, device: str = "cpu") -> Environment:
        import torch

        # NOTE: the version from the package metadata, not ``import triton``: importing triton
        # here would fix its interpreter mode (TRITON_INTERPRET) before a backend can set it.
        try:
            triton_version: str | None = importlib.metadata.version("triton")
        except importlib.metadata.PackageNotFoundError:
            triton_version = None
        gpu_count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        name = platform.processor() or platform.machine()
        driver = None
        if device.startswith("cuda") and gpu_count:
            name = torch.cuda.get_device_name(torch.device(device))
            driver = _driver_version()
        elif gpu_count:
            driver = _driver_version()
        return cls(
            device=device,
            device_name=name,
            gpu_count=gpu_count,
            driver=driver,
            cuda=torch.version.cuda,
            torch=torch.__version__,
            triton=triton_version,
            python=sys.version.split()[0],
            platform=platform.platform(),
        )


def _driver_version() -> str | None:
    import subprocess

    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return out.strip().splitlines()[0] if out.strip() else None



@dataclass
class Violation:
    """Two schedules that disagree on the bits of some (request, token)."""

    perturbation: str
    dtype: str
    case: int
    schedule_a: str
    schedule_b: str
    request_id: int
    differing_tokens: int
    compared_tokens: int
    diffs: list[TensorDiff]
    reproducer: str
    shrunk: bool = False
    #: What kind of disagreement this is (e.g. ``"nondeterministic"``); ``""`` when unclassified.
    classification: str = ""
    #: A remark on how the violation was found (e.g. why shrinking stopped); ``""`` when none.
    note: str = ""
    #: The failing case as JSON data (``invariance.replay.case_to_dict``), for ``invariance
    #: replay``; ``{}`` when not recorded.
    case_data: dict[str, Any] = field(default_factory=dict)
    #: Unknown fields of a newer schema: kept, written back on save.
    extra: dict[str, Any] = field(default_factory=dict, repr=False)
    #: Unknown fields of each of ``diffs`` (same order), kept likewise.
    diffs_extra: list[dict[str, Any]] = field(default_factory=list, repr=False)

    @property
    def max_ulp(self) -> int:
        return max((d.max_ulp for d in self.diffs), default=0)

    def to_dict(self) -> dict[str, Any]:
        d = _plain(self)
        d["diffs"] = [
            _with_extra(_jsonable(x.to_dict()),
                        self.diffs_extra[i] if i < len(self.diffs_extra) else {})
            for i, x in enumerate(self.diffs)
        ]
        return _with_extra(d, self.extra)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Violation:
        """Read one violation (missing defaulted fields are filled, as in schema 1.0)."""
        return _Reader((1, 0)).violation(d, "")


@dataclass
class PerturbationResult:
    """One cell of the report: a perturbation run at one dtype."""

    backend: str
    perturbation: str
    dtype: str
    description: str
    status: Status
    cases: int = 0
    compared_tokens: int = 0
    num_violations: int = 0
    max_ulp: int = 0
    seconds: float = 0.0
    error: str | None = None
    #: One point per case, for plots: features (e.g. batch_size, neighbor_len) + mismatch_rate
    #: + max_ulp.
    points: list[dict[str, float]] = field(default_factory=list)
    #: The first violations found (at most ``max_violations``); ``num_violations`` counts all.
    violations: list[Violation] = field(default_factory=list)
    #: What the cell's cases covered (JSON-serialisable; filled by the check).
    coverage: dict[str, Any] = field(default_factory=dict)
    #: The check this cell belongs to in a combined report (:meth:`Report.combine`); ``""`` in
    #: a report of one check. A cell is identified by (check, perturbation, dtype).
    check: str = ""
    #: Unknown fields of a newer schema: kept, written back on save.
    extra: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    @property
    def key(self) -> tuple[str, str, str]:
        """The cell's identity in its report: (check, perturbation, dtype)."""
        return (self.check, self.perturbation, self.dtype)

    def to_dict(self) -> dict[str, Any]:
        d = _plain(self)
        d["violations"] = [v.to_dict() for v in self.violations]
        return _with_extra(d, self.extra)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> PerturbationResult:
        """Read one cell (missing defaulted fields are filled, as in schema 1.0)."""
        return _Reader((1, 0)).result(d, "")


@dataclass
class AccuracyResult:
    """Accuracy of a backend against the float64 reference at one dtype.

    Passes when every compared element satisfies ``|out - ref| <= atol + rtol * |ref|``, every
    LSE ``|lse - ref| <= lse_atol``, and no row holds NaN.
    """

    backend: str
    dtype: str
    rows: int = 0
    max_abs_err_out: float = 0.0
    rel_err_out: float = 0.0
    max_abs_err_lse: float = 0.0
    worst_ratio: float = 0.0  # max over elements of |err| / (atol + rtol*|ref|); <= 1 passes
    atol: float = 0.0
    rtol: float = 0.0
    lse_atol: float = 0.0
    nan_rows: int = 0
    passed: bool = True
    #: The check this row belongs to in a combined report; ``""`` in a report of one check.
    check: str = ""
    #: Unknown fields of a newer schema: kept, written back on save.
    extra: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def key(self) -> tuple[str, str]:
        """The row's identity in its report: (check, dtype)."""
        return (self.check, self.dtype)

    def to_dict(self) -> dict[str, Any]:
        return _with_extra(_plain(self), self.extra)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> AccuracyResult:
        """Read one accuracy row (missing defaulted fields are filled, as in schema 1.0)."""
        return _Reader((1, 0)).accuracy(d, "")


def describe_features(features: Mapping[str, Any]) -> str:
    """A report's ``features`` in words, e.g. ``"window 128, sinks, softcap 50, fp8_e4m3 KV
    (per-tensor scales)"`` (``"none"`` for ``{}``; checks of a combined report joined by
    ``" | "``)."""
    if "per_check" in features and isinstance(features["per_check"], list):
        return " | ".join(describe_features(f) if isinstance(f, Mapping) else str(f)
                          for f in features["per_check"])
    words = []
    for key, value in features.items():
        if key == "sinks":
            words.append("sinks" if value else "no sinks")
        elif key == "kv_dtype":
            scale = features.get("kv_scale", "tensor")
            words.append(f"{value} KV ({'per-head' if scale == 'head' else 'per-tensor'} "
                         "scales)")
        elif key == "kv_scale":
            continue
        elif isinstance(value, float):
            words.append(f"{key} {value:g}")
        else:
            words.append(f"{key} {value}")
    return ", ".join(words) or "none"


def _json_float(x: float) -> float | str:
    return x if x == x and abs(x) != float("inf") else str(x)


def _text(x: str) -> str:
    """``x``, with what is not valid Unicode (lone surrogates, e.g. from a file name that is not
    UTF-8) escaped as ``\\udcff``: JSON would write them, and no reader accepts them."""
    try:
        x.encode("utf-8")
    except UnicodeEncodeError:
        return x.encode("utf-8", "backslashreplace").decode("utf-8")
    return x


def _jsonable(x: Any) -> Any:
    """``x`` as plain JSON data: new containers, tuples as lists, non-finite floats as strings,
    text escaped where it is not valid Unicode."""
    if isinstance(x, float):
        return _json_float(x)
    if isinstance(x, str):
        return _text(x)
    if isinstance(x, dict):
        return {_text(str(k)): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    return x


_NOT_SAVED = ("extra", "diffs_extra")


def _plain(obj: Any) -> dict[str, Any]:
    """A dataclass's saved fields as JSON data (nested dataclasses are the caller's job)."""
    return {f.name: _jsonable(getattr(obj, f.name)) for f in fields(obj)
            if f.name not in _NOT_SAVED}


def _with_extra(d: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    for k, v in extra.items():
        if k not in d:
            d[k] = _jsonable(v)
    return d


@dataclass
class CheckInfo:
    """One check of a combined report (:meth:`Report.combine`): its id (e.g. a pytest node id)
    and the settings it ran with, as :class:`Report` holds them for a single check."""

    id: str
    backend: str
    device: str
    dtypes: list[str]
    heads: str
    scale: str
    budget: int
    seed: int
    perturbations: list[str]
    command: str = ""
    incomplete: str | None = None
    #: Unknown fields of a newer schema: kept, written back on save.
    extra: dict[str, Any] = field(default_factory=dict, repr=False)

    def to_dict(self) -> dict[str, Any]:
        return _with_extra(_plain(self), self.extra)


@dataclass
class Report:
    """Everything one :func:`invariance.check` run found (or, combined, several runs: see
    :meth:`combine`)."""

    backend: str
    device: str
    dtypes: list[str]
    heads: str
    scale: str
    budget: int
    seed: int
    perturbations: list[str]
    environment: Environment
    results: list[PerturbationResult] = field(default_factory=list)
    accuracy: list[AccuracyResult] = field(default_factory=list)
    started_at: str = ""
    seconds: float = 0.0
    #: The command line that produced the report, when a face (CLI, pytest) knows it.
    command: str = ""
    #: ``None`` when the run finished; otherwise why it stopped (e.g. ``"interrupted
    #: (KeyboardInterrupt) after 5 of 12 cells"``). An incomplete report never passes.
    incomplete: str | None = None
    #: The checks of a combined report (:meth:`combine`), each cell naming one of them;
    #: empty for a report of one check (its settings are the fields above).
    checks: list[CheckInfo] = field(default_factory=list)
    #: The attention features every batch of the check used (``Features.to_dict``; ``{}``:
    #: none).
    features: dict[str, Any] = field(default_factory=dict)
    #: Unknown top-level fields of a newer schema: kept, written back on save.
    extra: dict[str, Any] = field(default_factory=dict, repr=False)

    # --- verdicts ------------------------------------------------------------------------
    @property
    def invariant(self) -> bool:
        """No cell failed or errored (skipped cells do not count either way)."""
        return all(r.status in ("passed", "skipped") for r in self.results)

    @property
    def accurate(self) -> bool:
        return all(a.passed for a in self.accuracy)

    @property
    def complete(self) -> bool:
        return self.incomplete is None

    @property
    def passed(self) -> bool:
        """Complete, invariant, accurate, and at least one cell actually ran."""
        ran = any(r.status != "skipped" for r in self.results)
        return ran and self.complete and self.invariant and self.accurate

    @property
    def violations(self) -> list[Violation]:
        return [v for r in self.results for v in r.violations]

    def failed_cells(self) -> list[PerturbationResult]:
        return [r for r in self.results if r.status in ("failed", "error")]

    def counts(self) -> dict[str, int]:
        out = {"passed": 0, "failed": 0, "error": 0, "skipped": 0}
        for r in self.results:
            out[r.status] += 1
        return out

    def cell(self, perturbation: str, dtype: str, check: str | None = None
             ) -> PerturbationResult:
        """The cell of ``perturbation`` at ``dtype`` (of ``check`` in a combined report).
        ``KeyError`` when there is none, or when ``check`` is not given and several checks
        have one."""
        found = [r for r in self.results if r.perturbation == perturbation and r.dtype == dtype
                 and (check is None or r.check == check)]
        if len(found) == 1:
            return found[0]
        if not found:
            where = f" of check {check!r}" if check is not None else ""
            raise KeyError(f"no result for perturbation {perturbation!r} at dtype {dtype!r}"
                           f"{where}")
        raise KeyError(f"perturbation {perturbation!r} at dtype {dtype!r} ran in several checks "
                       f"({', '.join(repr(r.check) for r in found)}); give check=")

    def settings(self) -> dict[str, dict[str, Any]]:
        """Each check's settings by check id (``""``: the report's own, for a report of one
        check): backend, device, dtypes, heads, scale, budget, seed, perturbations."""
        if not self.checks:
            return {"": {k: getattr(self, k) for k in _SETTING_FIELDS}}
        return {c.id: {k: getattr(c, k) for k in _SETTING_FIELDS} for c in self.checks}

    def verdict(self) -> str:
        """``PASSED``, ``FAILED``, ``INCOMPLETE`` (stopped early, nothing failed so far) or
        ``FAILED, INCOMPLETE``."""
        if self.passed:
            return "PASSED"
        if self.complete:
            return "FAILED"
        failing = bool(self.failed_cells()) or not self.accurate
        return "FAILED, INCOMPLETE" if failing else "INCOMPLETE"

    def summary(self) -> str:
        c = self.counts()
        # No accuracy word when no accuracy row ran: nothing was measured either way.
        acc = ("" if not self.accuracy else
               "accurate; " if self.accurate else "INACCURATE; ")
        errors = f"{c['error']} error{'' if c['error'] == 1 else 's'}"
        what = ", ".join(self.dtypes)
        if self.features:
            what += f"; {describe_features(self.features)}"
        text = (f"{self.verdict()}: backend {self.backend} on {self.device} "
                f"({what}): {c['passed']} passed, {c['failed']} failed, "
                f"{errors}, {c['skipped']} skipped; {acc}{self.seconds:.1f}s")
        if self.incomplete is not None:
            text += f"; stopped early: {self.incomplete}"
        return text

    # --- JSON ----------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d = {
            "schema": SCHEMA,
            "version": SCHEMA_VERSION,
            "backend": self.backend,
            "device": self.device,
            "dtypes": list(self.dtypes),
            "heads": self.heads,
            "scale": self.scale,
            "budget": self.budget,
            "seed": self.seed,
            "perturbations": list(self.perturbations),
            "features": _jsonable(self.features),
            "started_at": self.started_at,
            "seconds": _json_float(self.seconds),
            "command": self.command,
            "incomplete": self.incomplete,
            "passed": self.passed,
            "environment": self.environment.to_dict(),
            "checks": [c.to_dict() for c in self.checks],
            "results": [r.to_dict() for r in self.results],
            "accuracy": [a.to_dict() for a in self.accuracy],
        }
        # Text that is not valid Unicode (a file name from a non-UTF-8 argv) is escaped, so that
        # the reader of this version accepts everything this version writes.
        return cast(dict[str, Any], _jsonable(_with_extra(d, self.extra)))

    def to_json(self, path: str | Path | None = None, *, indent: int = 2) -> str:
        """The report as JSON text; also written to ``path`` when given, atomically (see
        :func:`invariance.outputs.write_atomic`; failures raise ``OutputError``)."""
        text = json.dumps(self.to_dict(), indent=indent, allow_nan=False)
        if path is not None:
            write_atomic(Path(path), text + "\n")
        return text

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Report:
        """Validate and read a report's JSON data; :class:`ReportError` on any problem."""
        if not isinstance(d, Mapping):
            raise ReportError(expected="a JSON object", actual=_describe(d))
        version = _read_version(d)
        try:
            return _Reader(version).report(d)
        except RecursionError:
            raise ReportError("nested too deeply") from None

    @classmethod
    def from_json(cls, path: str | os.PathLike[str] | bytes | None = None, *,
                  text: str | bytes | None = None) -> Report:
        """Read a report from the file ``path``, or from JSON ``text``.

        The rule has no guessing: a ``str`` or path-like positional argument is always a file
        name (``"[gpu0] report.json"`` and ``"{run}.json"`` included); JSON content is passed as
        ``text=`` (``str`` or UTF-8 ``bytes``), or positionally as ``bytes``. Raises
        :class:`ReportError`, naming the file, on an unreadable file, invalid UTF-8, invalid
        JSON or an invalid report."""
        if (path is None) == (text is None):
            raise TypeError("Report.from_json: expected a path or text=, got "
                            + ("both" if path is not None else "neither"))
        if isinstance(path, bytes):
            path, text = None, path
        file: str | None = None
        try:
            if text is None:
                file = os.fspath(cast("str | os.PathLike[str]", path))
                if not isinstance(file, str):
                    raise TypeError(f"Report.from_json: expected a str or path-like path, got "
                                    f"{type(path).__name__}")
                try:
                    raw = Path(file).read_bytes()
                except OSError as exc:
                    hint = (" (JSON text is read with Report.from_json(text=...))"
                            if file.lstrip().startswith(("{", "[")) else "")
                    raise ReportError(f"cannot read it: {exc.strerror or exc}{hint}") from None
                content = _decode(raw)
            elif isinstance(text, bytes):
                content = _decode(text)
            elif isinstance(text, str):
                content = text
            else:
                raise TypeError(f"Report.from_json: expected text= as str or bytes, got "
                                f"{type(text).__name__}")
            return cls.from_dict(_parse(content))
        except ReportError as exc:
            if file is None:
                raise exc from None
            shown = file if len(file) <= 200 and "\n" not in file else repr(file[:60]) + "..."
            raise exc.in_file(shown) from None

    @classmethod
    def combine(cls, reports: Sequence[Report], *, ids: Sequence[str] | None = None
                ) -> Report:
        """One report holding the cells of several (e.g. a pytest session's checks), each
        cell and accuracy row keeping the id of its check, so that two checks' cells of the same
        perturbation and dtype stay distinct; incomplete when any of them is.

        ``ids`` names the checks (e.g. pytest node ids; default ``check 1``, ``check 2``, ...);
        a repeated id gets `` #2``, `` #3``, ... A combined report combined again keeps its
        checks, their ids prefixed with its own (``outer / inner``)."""
        if not reports:
            raise ValueError("combine: expected at least one report")
        if ids is not None and len(ids) != len(reports):
            raise ValueError(f"combine: expected {len(reports)} ids (one per report), got "
                             f"{len(ids)}")
        names = _unique([str(i) for i in ids] if ids is not None
                        else [f"check {n + 1}" for n in range(len(reports))])
        first = reports[0]

        def union(values: list[str]) -> list[str]:
            return list(dict.fromkeys(values))

        checks: list[CheckInfo] = []
        results: list[PerturbationResult] = []
        accuracy: list[AccuracyResult] = []
        for name, r in zip(names, reports, strict=True):
            if r.checks:
                def inner(check: str, name: str = name) -> str:
                    return f"{name} / {check}"
                checks += [replace(c, id=inner(c.id)) for c in r.checks]
            else:
                def inner(check: str, name: str = name) -> str:
                    return name if not check else f"{name} / {check}"
                checks.append(CheckInfo(
                    id=name, **{k: copy.copy(getattr(r, k)) for k in _SETTING_FIELDS},
                    command=r.command, incomplete=r.incomplete))
            results += [replace(c, check=inner(c.check)) for c in r.results]
            accuracy += [replace(a, check=inner(a.check)) for a in r.accuracy]
        stopped = [r.incomplete for r in reports if r.incomplete is not None]
        distinct = list({json.dumps(r.features, sort_keys=True): r.features
                         for r in reports}.values())
        return cls(
            backend=", ".join(union([r.backend for r in reports])),
            device=", ".join(union([r.device for r in reports])),
            dtypes=union([d for r in reports for d in r.dtypes]),
            heads=", ".join(union([r.heads for r in reports])),
            scale=", ".join(union([r.scale for r in reports])),
            budget=max(r.budget for r in reports),
            seed=first.seed,
            perturbations=union([p for r in reports for p in r.perturbations]),
            environment=first.environment,
            results=results,
            accuracy=accuracy,
            started_at=first.started_at,
            seconds=sum(r.seconds for r in reports),
            incomplete="; ".join(union(stopped)) if stopped else None,
            checks=checks,
            features=distinct[0] if len(distinct) == 1 else {"per_check": distinct},
        )


#: The settings of a check, as :meth:`Report.settings` and :class:`CheckInfo` hold them.
_SETTING_FIELDS = ("backend", "device", "dtypes", "heads", "scale", "budget", "seed",
                   "perturbations")


def _unique(names: list[str]) -> list[str]:
    """``names`` with a repeated name suffixed `` #2``, `` #3``, ... (never colliding)."""
    seen: set[str] = set()
    out = []
    for name in names:
        candidate, n = name, 1
        while candidate in seen:
            n += 1
            candidate = f"{name} #{n}"
        seen.add(candidate)
        out.append(candidate)
    return out


# --- reading and validation ---------------------------------------------------------------

def _decode(raw: bytes) -> str:
    if raw.startswith(codecs.BOM_UTF8):
        raw = raw[len(codecs.BOM_UTF8):]
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        bad = raw[exc.start:exc.start + 1].hex()
        raise ReportError(f"not valid UTF-8 (byte 0x{bad} at offset {exc.start})") from None


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise ReportError(f"not valid JSON: field {k!r} appears twice in one object")
        out[k] = v
    return out


def _parse(text: str) -> Any:
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates)
    except json.JSONDecodeError as exc:
        raise ReportError(f"not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
                          ) from None
    except RecursionError:
        raise ReportError("not valid JSON: nested too deeply") from None
    except ReportError:
        raise
    except ValueError as exc:  # e.g. an integer too long to convert
        raise ReportError(f"not valid JSON: {exc}") from None


_VERSION_RE = re.compile(r"([0-9]{1,6})\.([0-9]{1,6})")


def _read_version(d: Mapping[str, Any]) -> tuple[int, int]:
    """Check ``schema`` and ``version``; return the file's (MAJOR, MINOR)."""
    if "schema" not in d:
        raise ReportError(field="schema", expected=repr(SCHEMA),
                          actual="nothing (field missing; is this an invariance report?)")
    if d["schema"] != SCHEMA:
        raise ReportError(field="schema", expected=repr(SCHEMA), actual=_describe(d["schema"]))
    expected = f"a string 'MAJOR.MINOR' (this invariance writes {SCHEMA_VERSION!r})"
    if "version" not in d:
        raise ReportError(field="version", expected=expected, actual="nothing (field missing)")
    v = d["version"]
    if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 10**6:
        version = (v, 0)  # schema 1.0 wrote the integer 1
    elif isinstance(v, str) and (m := _VERSION_RE.fullmatch(v)):
        version = (int(m.group(1)), int(m.group(2)))
    else:
        raise ReportError(field="version", expected=expected, actual=_describe(v))
    if version[0] > _VERSION[0]:
        raise ReportError(f"report schema {version[0]}.{version[1]} is newer than this "
                          f"invariance (reads {_VERSION[0]}.x); upgrade invariance")
    if version[0] < _VERSION[0]:
        raise ReportError(field="version", expected=f"{_VERSION[0]}.x",
                          actual=_describe(v) + " (an unknown, older schema)")
    return version


_JSON_TYPE = {type(None): "null", bool: "bool", int: "int", float: "float", str: "str",
              list: "list", dict: "object"}


def _describe(value: Any, limit: int = 60) -> str:
    """A value's JSON type and a shortened rendering, e.g. ``str '12'``, ``list [1, 2, ...]``."""
    if value is None:
        return "null"
    kind = _JSON_TYPE.get(type(value), type(value).__name__)
    if isinstance(value, str):
        shown = repr(value)
    else:
        try:
            shown = json.dumps(value, default=repr, ensure_ascii=True)
        except (TypeError, ValueError, RecursionError):
            shown = repr(value)
    if len(shown) > limit:
        shown = shown[:limit - 3] + "..."
    return f"{kind} {shown}"


_T = TypeVar("_T")
_MISSING = object()
_NON_FINITE = {"nan": float("nan"), "inf": float("inf"), "-inf": float("-inf")}


class _Field(Generic[_T]):
    """How one field is read: a description of what is expected, and the reading function
    (``value, path -> T``; it raises :class:`ReportError`)."""

    def __init__(self, expected: str, read: Callable[[Any, str], _T]) -> None:
        self.expected = expected
        self.read = read


def _fail(path: str, expected: str, value: Any) -> NoReturn:
    raise ReportError(field=path, expected=expected, actual=_describe(value))


def _check_text(value: str, path: str, expected: str) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ReportError(field=path, expected=expected,
                          actual="str with a lone surrogate (not valid Unicode)") from None
    return value


def _str(value: Any, path: str) -> str:
    if not isinstance(value, str):
        _fail(path, "str", value)
    return _check_text(value, path, "str")


def _int(value: Any, path: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        _fail(path, "int", value)
    return value


_FLOAT_EXPECTED = "number (or 'nan', 'inf', '-inf')"


def _float(value: Any, path: str) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            return float(value)
        except OverflowError:  # an integer beyond any float
            _fail(path, _FLOAT_EXPECTED, value)
    if isinstance(value, str) and value in _NON_FINITE:
        return _NON_FINITE[value]
    _fail(path, _FLOAT_EXPECTED, value)


def _number(value: Any, path: str) -> float:
    """A number kept as read (an int stays an int), or a non-finite float string."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value in _NON_FINITE:
        return _NON_FINITE[value]
    _fail(path, _FLOAT_EXPECTED, value)


def _bool(value: Any, path: str) -> bool:
    if not isinstance(value, bool):
        _fail(path, "bool", value)
    return value


def _status(value: Any, path: str) -> Status:
    if not isinstance(value, str) or value not in _STATUSES:
        _fail(path, "one of " + ", ".join(repr(s) for s in _STATUSES), value)
    return cast(Status, value)


def _key(k: Any, path: str) -> str:
    if not isinstance(k, str):
        raise ReportError(field=path, expected="str keys", actual=_describe(k))
    return _check_text(k, path, "str keys")


def _json(value: Any, path: str) -> Any:
    """Any JSON value (checked: JSON types only, valid Unicode strings); a new copy."""
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, str):
        return _check_text(value, path, "a JSON value")
    if isinstance(value, list):
        return [_json(v, f"{path}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, dict):
        return {_key(k, path): _json(v, f"{path}.{k}") for k, v in value.items()}
    _fail(path, "a JSON value", value)


def _json_object(value: Any, path: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        _fail(path, "object", value)
    return cast(dict[str, Any], _json(value, path))


def _opt(f: _Field[_T]) -> _Field[_T | None]:
    return _Field(f"{f.expected} or null", lambda v, p: None if v is None else f.read(v, p))


def _list(f: _Field[_T]) -> _Field[list[_T]]:
    def read(value: Any, path: str) -> list[_T]:
        if not isinstance(value, list):
            _fail(path, f"list of {f.expected}", value)
        return [f.read(v, f"{path}[{i}]") for i, v in enumerate(value)]
    return _Field(f"list of {f.expected}", read)


def _mapping(f: _Field[_T]) -> _Field[dict[str, _T]]:
    expected = f"object of {f.expected}"

    def read(value: Any, path: str) -> dict[str, _T]:
        if not isinstance(value, dict):
            _fail(path, expected, value)
        return {_key(k, path): f.read(v, f"{path}.{k}") for k, v in value.items()}
    return _Field(expected, read)


def _pair(value: Any, path: str) -> tuple[str, str]:
    if not isinstance(value, list) or len(value) != 2:
        _fail(path, "list of 2 str", value)
    return (_str(value[0], f"{path}[0]"), _str(value[1], f"{path}[1]"))


_STR = _Field("str", _str)
_INT = _Field("int", _int)
_FLOAT = _Field(_FLOAT_EXPECTED, _float)
_BOOL = _Field("bool", _bool)
_OPT_STR = _opt(_STR)

#: (type, the first version every file of which holds it) per field, in the order they are
#: checked: a field may be absent from files older than its version (its default is used).
_Spec = dict[str, tuple[_Field[Any], tuple[int, int]]]
_ALWAYS = (1, 0)
_V11 = (1, 1)  # 1.0 files may leave out a field with a default; from 1.1 on every field is written
_V12 = (1, 2)  # check ids

_ENVIRONMENT: _Spec = {
    "device": (_STR, _ALWAYS), "device_name": (_STR, _ALWAYS), "gpu_count": (_INT, _ALWAYS),
    "driver": (_OPT_STR, _ALWAYS), "cuda": (_OPT_STR, _ALWAYS), "torch": (_STR, _ALWAYS),
    "triton": (_OPT_STR, _ALWAYS), "python": (_STR, _ALWAYS), "platform": (_STR, _ALWAYS),
}
_DIFF: _Spec = {
    "name": (_STR, _ALWAYS),
    "shape": (_Field("list of int", lambda v, p: tuple(_list(_INT).read(v, p))), _ALWAYS),
    "dtype": (_STR, _ALWAYS), "num_elements": (_INT, _ALWAYS),
    "num_different": (_INT, _ALWAYS), "nan_mismatches": (_INT, _ALWAYS),
    "max_abs_diff": (_FLOAT, _ALWAYS), "max_ulp": (_INT, _ALWAYS),
    "first_index": (_opt(_mapping(_INT)), _ALWAYS),
    "first_values": (_opt(_Field("list of 2 str", _pair)), _V11),
}
_ACCURACY: _Spec = {
    "backend": (_STR, _ALWAYS), "dtype": (_STR, _ALWAYS), "check": (_STR, _V12),
    "rows": (_INT, _V11),
    "max_abs_err_out": (_FLOAT, _V11), "rel_err_out": (_FLOAT, _V11),
    "max_abs_err_lse": (_FLOAT, _V11), "worst_ratio": (_FLOAT, _V11), "atol": (_FLOAT, _V11),
    "rtol": (_FLOAT, _V11), "lse_atol": (_FLOAT, _V11), "nan_rows": (_INT, _V11),
    "passed": (_BOOL, _V11),
}
_POINTS = _list(_mapping(_Field(_FLOAT_EXPECTED, _number)))
_OBJECT = _Field("object", _json_object)


class _Reader:
    """Validates and reads report data of one schema version."""

    def __init__(self, version: tuple[int, int]) -> None:
        #: 1.0 files may leave out a field with a default; from 1.1 on every field is written
        #: (fields added later may be absent from files older than their version, ``_Spec``).
        self.version = version

    def fields(self, d: Any, path: str, spec: _Spec) -> tuple[dict[str, Any], dict[str, Any]]:
        """Read ``spec``'s fields of object ``d``; return them and the unknown fields."""
        if not isinstance(d, Mapping):
            _fail(path or "(report)", "object", d)
        values: dict[str, Any] = {}
        for name, (f, since) in spec.items():
            where = f"{path}.{name}" if path else name
            value = d.get(name, _MISSING)
            if value is _MISSING:
                if self.version < since:
                    continue
                raise ReportError(field=where, expected=f.expected,
                                  actual="nothing (field missing)")
            values[name] = f.read(value, where)
        extra = {_key(k, path or "(report)"): _json(v, f"{path}.{k}" if path else str(k))
                 for k, v in d.items() if k not in spec}
        return values, extra

    def environment(self, d: Any, path: str) -> Environment:
        values, extra = self.fields(d, path, _ENVIRONMENT)
        return Environment(**values, extra=extra)

    def diff(self, d: Any, path: str) -> tuple[TensorDiff, dict[str, Any]]:
        values, extra = self.fields(d, path, _DIFF)
        values.setdefault("first_values", None)
        return TensorDiff(**values), extra

    def violation(self, d: Any, path: str) -> Violation:
        diffs = _Field("list of object", lambda v, p: _list(
            _Field("object", self.diff)).read(v, p))
        spec: _Spec = {
            "perturbation": (_STR, _ALWAYS), "dtype": (_STR, _ALWAYS), "case": (_INT, _ALWAYS),
            "schedule_a": (_STR, _ALWAYS), "schedule_b": (_STR, _ALWAYS),
            "request_id": (_INT, _ALWAYS), "differing_tokens": (_INT, _ALWAYS),
            "compared_tokens": (_INT, _ALWAYS), "diffs": (diffs, _ALWAYS),
            "reproducer": (_STR, _ALWAYS), "shrunk": (_BOOL, _V11), "classification": (_STR, _V11),
            "note": (_STR, _V11), "case_data": (_OBJECT, _V11),
        }
        values, extra = self.fields(d, path, spec)
        pairs = values.pop("diffs")
        return Violation(**values, diffs=[x for x, _ in pairs],
                         diffs_extra=[e for _, e in pairs], extra=extra)

    def result(self, d: Any, path: str) -> PerturbationResult:
        spec: _Spec = {
            "backend": (_STR, _ALWAYS), "perturbation": (_STR, _ALWAYS), "dtype": (_STR, _ALWAYS),
            "description": (_STR, _ALWAYS), "status": (_Field("status", _status), _ALWAYS),
            "cases": (_INT, _V11), "compared_tokens": (_INT, _V11),
            "num_violations": (_INT, _V11), "max_ulp": (_INT, _V11), "seconds": (_FLOAT, _V11),
            "error": (_OPT_STR, _V11), "points": (_POINTS, _V11), "coverage": (_OBJECT, _V11),
            "violations": (_list(_Field("object", self.violation)), _V11),
            "check": (_STR, _V12),
        }
        values, extra = self.fields(d, path, spec)
        _consistent_cell(values, path)
        return PerturbationResult(**values, extra=extra)

    def accuracy(self, d: Any, path: str) -> AccuracyResult:
        values, extra = self.fields(d, path, _ACCURACY)
        _consistent_accuracy(values, path)
        return AccuracyResult(**values, extra=extra)

    def check(self, d: Any, path: str) -> CheckInfo:
        spec: _Spec = {
            "id": (_STR, _ALWAYS), "backend": (_STR, _ALWAYS), "device": (_STR, _ALWAYS),
            "dtypes": (_list(_STR), _ALWAYS), "heads": (_STR, _ALWAYS),
            "scale": (_STR, _ALWAYS), "budget": (_INT, _ALWAYS), "seed": (_INT, _ALWAYS),
            "perturbations": (_list(_STR), _ALWAYS), "command": (_STR, _ALWAYS),
            "incomplete": (_OPT_STR, _ALWAYS),
        }
        values, extra = self.fields(d, path, spec)
        return CheckInfo(**values, extra=extra)

    def identities(self, report: Report) -> None:
        """Distinct (check, perturbation, dtype) cells and (check, dtype) accuracy rows, each
        naming a listed check. Files older than 1.2 had no check ids: a repeated identity there
        (a combined report of that version) is told apart by ``#2``, ``#3``, ... in file
        order."""
        ids = [c.id for c in report.checks]
        for i, c in enumerate(report.checks):
            if c.id in ids[:i]:
                raise ReportError(field=f"checks[{i}].id", expected="an id no other check has",
                                  actual=_describe(c.id))
        items: list[tuple[str, list[Any]]] = [("results", report.results),
                                              ("accuracy", report.accuracy)]
        for name, rows in items:
            seen: dict[tuple[str, ...], int] = {}
            for i, row in enumerate(rows):
                if self.version < _V12:
                    n = seen.get(row.key, 0) + 1
                    seen[row.key] = n
                    if n > 1:
                        row.check = f"#{n}"
                        seen[row.key] = n
                    continue
                if row.key in seen:
                    what = " at ".join(repr(k) for k in row.key[1:])
                    raise ReportError(
                        field=f"{name}[{i}]", expected="a (check, perturbation, dtype) no other "
                        "cell has" if name == "results" else "a (check, dtype) no other row has",
                        actual=f"{what} of check {row.check!r} again (as {name}[{seen[row.key]}])")
                seen[row.key] = i
                if ids and row.check not in ids:
                    raise ReportError(field=f"{name}[{i}].check",
                                      expected="the id of a check listed in 'checks'",
                                      actual=_describe(row.check))
                if not ids and row.check:
                    raise ReportError(field=f"{name}[{i}].check",
                                      expected="'' (the report lists no checks)",
                                      actual=_describe(row.check))

    def report(self, d: Mapping[str, Any]) -> Report:
        spec: _Spec = {
            "schema": (_STR, _ALWAYS), "version": (_Field("version", lambda v, p: v), _ALWAYS),
            "backend": (_STR, _ALWAYS), "device": (_STR, _ALWAYS), "dtypes": (_list(_STR), _ALWAYS),
            "heads": (_STR, _ALWAYS), "scale": (_STR, _ALWAYS), "budget": (_INT, _ALWAYS),
            "seed": (_INT, _ALWAYS), "perturbations": (_list(_STR), _ALWAYS),
            "features": (_OBJECT, _V12),
            "started_at": (_STR, _V11), "seconds": (_FLOAT, _V11), "command": (_STR, _V11),
            "incomplete": (_OPT_STR, _V11),
            "passed": (_BOOL, _V11),  # derived from the cells: checked, not trusted
            "environment": (_Field("object", self.environment), _ALWAYS),
            "checks": (_list(_Field("object", self.check)), _V12),
            "results": (_list(_Field("object", self.result)), _V11),
            "accuracy": (_list(_Field("object", self.accuracy)), _V11),
        }
        values, extra = self.fields(d, "", spec)
        for derived in ("schema", "version", "passed"):
            values.pop(derived, None)
        report = Report(**values, extra=extra)
        self.identities(report)
        return report


def _inconsistent(path: str, expected: str, actual: str) -> NoReturn:
    raise ReportError(field=path, expected=expected, actual=actual)


def _consistent_cell(v: Mapping[str, Any], path: str) -> None:
    """A cell's status agrees with its counts, violations and error (a hand-edited ``"status":
    "passed"`` that still holds violations is refused, not believed)."""
    status = v["status"]
    count = v.get("num_violations")
    kept = len(v.get("violations", []))
    where = f"{path}.status" if path else "status"
    if count is not None and kept > count:
        _inconsistent(f"{path}.num_violations", f"at least the {kept} violations kept",
                      str(count))
    if status in ("passed", "skipped"):
        if count or kept:
            _inconsistent(where, "'failed' (the cell holds violations)",
                          f"{status!r} with {max(count or 0, kept)} violation(s)")
        if status == "passed" and v.get("max_ulp"):
            _inconsistent(where, "'failed' (the cell has a nonzero ULP distance)",
                          f"'passed' with max_ulp {v['max_ulp']}")
        if status == "passed" and v.get("error"):
            _inconsistent(where, "'error' (the cell holds an error)",
                          f"'passed' with error {_describe(v['error'])}")
        if status == "passed" and v.get("cases") == 0:
            _inconsistent(where, "'skipped' or a cell that ran (a passed cell ran at least one "
                          "case)", "'passed' with 0 cases")
    elif status == "failed" and count is not None and count == 0 and not kept:
        _inconsistent(where, "'passed' or 'error' (a failed cell holds at least one violation)",
                      "'failed' with 0 violations")


def _consistent_accuracy(v: Mapping[str, Any], path: str) -> None:
    """An accuracy verdict agrees with its numbers: passing means no NaN row and the worst error
    within tolerance (``worst_ratio <= 1``)."""
    if "passed" not in v or "nan_rows" not in v or "worst_ratio" not in v:
        return
    within = v["nan_rows"] == 0 and v["worst_ratio"] <= 1.0
    if v["passed"] and not within:
        _inconsistent(f"{path}.passed", "false (NaN rows or an error beyond the tolerance)",
                      f"true with {v['nan_rows']} NaN row(s) and worst ratio {v['worst_ratio']}")
