"""The result of :func:`invariance.check_model`: a ``ModelReport`` and its versioned JSON form.

JSON schema ``"schema": "invariance.model-report"``, ``"version": "1.0"`` (``"MAJOR.MINOR"``)::

    {schema, version, model, model_type, source, parameters, dtype, device, attention, inputs,
     seed, length, decode_steps, batch_sizes[], modules, started_at, seconds, command,
     incomplete, passed, environment{...},
     scenarios[ {name, family, description, status, reason, reference, variant, batch_size,
                 classification, calls_compared, clean_prefix, first_divergence, seconds,
                 unmapped, unmapped_examples[],
                 origin: null | {path, module_type, call, step, tokens[], diff{...},
                                 differing_leaves, inputs_compared, forced, op: null | {name,
                                 index, ops_traced, arg_shapes[[...]], reference_arg_shapes[[...]],
                                 cause, diff: null | {...}, note}},
                 origins[ {module_type, calls, paths[], max_ulp, op, cause} ],
                 curve[ {label, path, max_ulp, num_different, num_elements} ],
                 flips[ {token, reference, variant} ],
                 reproducer: null | {plan{...}, batch_size, shrunk, attempts, code, case{...}}}
     ]}

``status`` is ``identical`` (every compared bit agreed), ``diverged``, ``skipped`` (the model
cannot run the scenario; ``reason`` says why; never counted as passed) or ``error`` (the model
raised; ``reason``). ``diff`` objects are :class:`invariance.TensorDiff`\\s as in the attention
report. Versioning follows ``invariance.report``: a MINOR version only adds fields; unknown
fields of a newer MINOR version are kept in ``extra`` and written back; a newer MAJOR version is
refused; every field is checked on reading and a :class:`ReportError` names the file, the field
path, what was expected and what was found.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast

from invariance.compare import TensorDiff
from invariance.outputs import write_atomic
from invariance.report import (
    _ALWAYS,
    _BOOL,
    _FLOAT,
    _INT,
    _OBJECT,
    _OPT_STR,
    _STR,
    Environment,
    ReportError,
    _decode,
    _describe,
    _fail,
    _Field,
    _json_float,
    _jsonable,
    _list,
    _opt,
    _parse,
    _plain,
    _Reader,
    _Spec,
    _with_extra,
)

__all__ = [
    "MODEL_SCHEMA",
    "MODEL_SCHEMA_VERSION",
    "STATUSES",
    "LayerPoint",
    "ModelReport",
    "OpFinding",
    "Origin",
    "OriginGroup",
    "Reproducer",
    "ScenarioResult",
    "TokenFlip",
]

MODEL_SCHEMA = "invariance.model-report"
#: The schema version written ("MAJOR.MINOR"); this version reads every 1.x.
MODEL_SCHEMA_VERSION = "1.0"
_VERSION = (1, 0)

ScenarioStatus = Literal["identical", "diverged", "skipped", "error"]
STATUSES: tuple[str, ...] = ("identical", "diverged", "skipped", "error")


def _diff_dict(d: TensorDiff | None) -> dict[str, Any] | None:
    return None if d is None else cast(dict[str, Any], _jsonable(d.to_dict()))


@dataclass
class OpFinding:
    """The first torch op inside the origin module whose output differs for the request."""

    name: str
    index: int
    ops_traced: int
    arg_shapes: list[list[int]]
    reference_arg_shapes: list[list[int]]
    #: Why this op is batch-variant, in words (e.g. a GEMM whose M is the batch's token count).
    cause: str
    diff: TensorDiff | None = None
    #: How the op sequences of the two runs compare (e.g. another code path), ``""`` if alike.
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict, repr=False)

    def to_dict(self) -> dict[str, Any]:
        d = _plain(self)
        d["diff"] = _diff_dict(self.diff)
        return _with_extra(d, self.extra)


@dataclass
class Origin:
    """The first module call whose inputs are bit-identical for the request in both runs and
    whose output is not: everything after it inherits the difference."""

    path: str
    module_type: str
    call: int
    step: int
    tokens: list[int]
    diff: TensorDiff
    differing_leaves: int
    inputs_compared: int
    #: Whether the reference's rows could be written into its output (forcing, to find the
    #: next independent origin).
    forced: bool
    op: OpFinding | None = None
    extra: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def label(self) -> str:
        where = self.path or "(model)"
        return where + (f" (call {self.call})" if self.call else "")

    def to_dict(self) -> dict[str, Any]:
        d = _plain(self)
        d["diff"] = _diff_dict(self.diff)
        d["op"] = self.op.to_dict() if self.op is not None else None
        return _with_extra(d, self.extra)


@dataclass
class OriginGroup:
    """Independent origins of one module type: calls that diverge on identical inputs even after
    every earlier origin's output was reset to the reference's."""

    module_type: str
    calls: int
    paths: list[str]
    max_ulp: int
    op: str = ""
    cause: str = ""
    extra: dict[str, Any] = field(default_factory=dict, repr=False)

    def to_dict(self) -> dict[str, Any]:
        return _with_extra(_plain(self), self.extra)


@dataclass
class LayerPoint:
    """The request's worst ULP distance at one layer's output (the per-layer curve)."""

    label: str
    path: str
    max_ulp: int
    num_different: int
    num_elements: int
    extra: dict[str, Any] = field(default_factory=dict, repr=False)

    def to_dict(self) -> dict[str, Any]:
        return _with_extra(_plain(self), self.extra)


@dataclass
class TokenFlip:
    """A token position whose greedy (argmax) choice differs between the runs."""

    token: int
    reference: int
    variant: int
    extra: dict[str, Any] = field(default_factory=dict, repr=False)

    def to_dict(self) -> dict[str, Any]:
        return _with_extra(_plain(self), self.extra)


@dataclass
class Reproducer:
    """The smallest variant found that still diverges, as a case and as Python code."""

    plan: dict[str, Any]
    batch_size: int
    shrunk: bool
    attempts: int
    code: str
    case: dict[str, Any]
    extra: dict[str, Any] = field(default_factory=dict, repr=False)

    def to_dict(self) -> dict[str, Any]:
        return _with_extra(_plain(self), self.extra)


@dataclass
class ScenarioResult:
    """One scenario: the reference and variant runs and what their comparison found."""

    name: str
    family: str
    description: str
    status: ScenarioStatus
    reason: str = ""
    reference: str = ""
    variant: str = ""
    batch_size: int = 0
    #: ``batch-variant`` or ``nondeterministic`` (a run disagreed with itself); ``""`` if equal.
    classification: str = ""
    calls_compared: int = 0
    #: Module calls that agreed bit for bit before the first differing one.
    clean_prefix: int = 0
    first_divergence: str = ""
    seconds: float = 0.0
    #: Tensor leaves that could not be mapped to the request (not compared), and examples.
    unmapped: int = 0
    unmapped_examples: list[str] = field(default_factory=list)
    origin: Origin | None = None
    origins: list[OriginGroup] = field(default_factory=list)
    curve: list[LayerPoint] = field(default_factory=list)
    flips: list[TokenFlip] = field(default_factory=list)
    reproducer: Reproducer | None = None
    extra: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def passed(self) -> bool:
        return self.status == "identical"

    def to_dict(self) -> dict[str, Any]:
        d = _plain(self)
        d["origin"] = self.origin.to_dict() if self.origin is not None else None
        d["origins"] = [g.to_dict() for g in self.origins]
        d["curve"] = [p.to_dict() for p in self.curve]
        d["flips"] = [f.to_dict() for f in self.flips]
        d["reproducer"] = self.reproducer.to_dict() if self.reproducer is not None else None
        return _with_extra(d, self.extra)


@dataclass
class ModelReport:
    """Everything one :func:`invariance.check_model` run found."""

    model: str
    model_type: str
    source: str
    parameters: int
    dtype: str
    device: str
    attention: str
    inputs: str
    seed: int
    length: int
    decode_steps: int
    batch_sizes: list[int]
    modules: int
    environment: Environment
    scenarios: list[ScenarioResult] = field(default_factory=list)
    started_at: str = ""
    seconds: float = 0.0
    command: str = ""
    #: ``None`` when the run finished; otherwise why it stopped. An incomplete report never
    #: passes.
    incomplete: str | None = None
    extra: dict[str, Any] = field(default_factory=dict, repr=False)

    # --- verdicts ------------------------------------------------------------------------
    @property
    def passed(self) -> bool:
        """Complete, no scenario diverged or errored, and at least one ran."""
        ran = [s for s in self.scenarios if s.status != "skipped"]
        return bool(ran) and self.incomplete is None and all(s.passed for s in ran)

    @property
    def diverged(self) -> list[ScenarioResult]:
        return [s for s in self.scenarios if s.status in ("diverged", "error")]

    @property
    def origin(self) -> Origin | None:
        """The origin of the first diverging scenario."""
        return next((s.origin for s in self.scenarios if s.origin is not None), None)

    def counts(self) -> dict[str, int]:
        out = dict.fromkeys(STATUSES, 0)
        for s in self.scenarios:
            out[s.status] += 1
        return out

    def verdict(self) -> str:
        if self.passed:
            return "INVARIANT"
        if self.incomplete is not None:
            return "DIVERGED, INCOMPLETE" if self.diverged else "INCOMPLETE"
        return "DIVERGED" if self.diverged else "NOTHING RAN"

    def summary(self) -> str:
        c = self.counts()
        text = (f"{self.verdict()}: {self.model} ({self.model_type}, {self.dtype}, "
                f"{self.device}, attention {self.attention}): {c['identical']} identical, "
                f"{c['diverged']} diverged, {c['error']} errors, {c['skipped']} skipped; "
                f"{self.seconds:.1f}s")
        origin = self.origin
        if origin is not None:
            op = f" ({origin.op.name})" if origin.op is not None else ""
            text += f"; origin {origin.label} [{origin.module_type}]{op}"
        if self.incomplete is not None:
            text += f"; stopped early: {self.incomplete}"
        return text

    # --- JSON ----------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"schema": MODEL_SCHEMA, "version": MODEL_SCHEMA_VERSION}
        d.update(_plain(self))
        d["seconds"] = _json_float(self.seconds)
        d["passed"] = self.passed
        d["environment"] = self.environment.to_dict()
        d["scenarios"] = [s.to_dict() for s in self.scenarios]
        return _with_extra(d, self.extra)

    def to_json(self, path: str | Path | None = None, *, indent: int = 2) -> str:
        """The report as JSON text; also written to ``path`` when given, atomically."""
        text = json.dumps(self.to_dict(), indent=indent, allow_nan=False)
        if path is not None:
            write_atomic(Path(path), text + "\n")
        return text

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ModelReport:
        """Validate and read a model report's JSON data; :class:`ReportError` on any problem."""
        if not isinstance(d, Mapping):
            raise ReportError(expected="a JSON object", actual=_describe(d))
        _read_version(d)
        try:
            return _ModelReader().report(d)
        except RecursionError:
            raise ReportError("nested too deeply") from None

    @classmethod
    def from_json(cls, path: str | os.PathLike[str] | bytes | None = None, *,
                  text: str | bytes | None = None) -> ModelReport:
        """Read a model report from the file ``path``, or from JSON ``text`` (the rule of
        :meth:`invariance.Report.from_json`: a ``str`` or path-like positional argument is
        always a file name; ``bytes`` are content). :class:`ReportError` naming the file on an
        unreadable file, invalid JSON or an invalid report."""
        if (path is None) == (text is None):
            raise TypeError("ModelReport.from_json: expected a path or text=, got "
                            + ("both" if path is not None else "neither"))
        if isinstance(path, bytes):
            path, text = None, path
        file: str | None = None
        try:
            if text is None:
                assert path is not None  # internal: checked above
                file = os.fspath(path)
                try:
                    raw = Path(file).read_bytes()
                except OSError as exc:
                    raise ReportError(f"cannot read it: {exc.strerror or exc}") from None
                content = _decode(raw)
            else:
                content = _decode(text) if isinstance(text, bytes) else text
            return cls.from_dict(_parse(content))
        except ReportError as exc:
            raise (exc.in_file(file) if file else exc) from None


# --- reading and validation ---------------------------------------------------------------

_VERSION_RE = re.compile(r"([0-9]{1,6})\.([0-9]{1,6})")


def _read_version(d: Mapping[str, Any]) -> tuple[int, int]:
    if "schema" not in d:
        raise ReportError(field="schema", expected=repr(MODEL_SCHEMA),
                          actual="nothing (field missing; is this a model report?)")
    if d["schema"] != MODEL_SCHEMA:
        raise ReportError(field="schema", expected=repr(MODEL_SCHEMA),
                          actual=_describe(d["schema"]))
    expected = f"a string 'MAJOR.MINOR' (this invariance writes {MODEL_SCHEMA_VERSION!r})"
    v = d.get("version")
    m = _VERSION_RE.fullmatch(v) if isinstance(v, str) else None
    if m is None:
        raise ReportError(field="version", expected=expected,
                          actual="nothing (field missing)" if v is None else _describe(v))
    version = (int(m.group(1)), int(m.group(2)))
    if version[0] > _VERSION[0]:
        raise ReportError(f"model report schema {v} is newer than this invariance (reads "
                          f"{_VERSION[0]}.x); upgrade invariance")
    if version[0] < _VERSION[0]:
        raise ReportError(field="version", expected=f"{_VERSION[0]}.x",
                          actual=_describe(v) + " (an unknown, older schema)")
    return version


def _status(value: Any, path: str) -> ScenarioStatus:
    if not isinstance(value, str) or value not in STATUSES:
        _fail(path, "one of " + ", ".join(repr(s) for s in STATUSES), value)
    return cast(ScenarioStatus, value)


def _shapes(value: Any, path: str) -> list[list[int]]:
    return _list(_list(_INT)).read(value, path)


_SHAPES = _Field("list of list of int", _shapes)
_INTS = _list(_INT)


class _ModelReader(_Reader):
    """Validates and reads model-report data (every field required: schema 1.0 wrote all)."""

    def __init__(self) -> None:
        super().__init__((1, 1))

    def _diff(self, value: Any, path: str) -> TensorDiff:
        return self.diff(value, path)[0]

    def op(self, d: Any, path: str) -> OpFinding:
        spec: _Spec = {
            "name": (_STR, _ALWAYS), "index": (_INT, _ALWAYS), "ops_traced": (_INT, _ALWAYS),
            "arg_shapes": (_SHAPES, _ALWAYS), "reference_arg_shapes": (_SHAPES, _ALWAYS),
            "cause": (_STR, _ALWAYS), "diff": (_opt(_Field("object", self._diff)), _ALWAYS),
            "note": (_STR, _ALWAYS)}
        values, extra = self.fields(d, path, spec)
        return OpFinding(**values, extra=extra)

    def origin(self, d: Any, path: str) -> Origin:
        spec: _Spec = {
            "path": (_STR, _ALWAYS), "module_type": (_STR, _ALWAYS), "call": (_INT, _ALWAYS),
            "step": (_INT, _ALWAYS), "tokens": (_INTS, _ALWAYS),
            "diff": (_Field("object", self._diff), _ALWAYS),
            "differing_leaves": (_INT, _ALWAYS), "inputs_compared": (_INT, _ALWAYS),
            "forced": (_BOOL, _ALWAYS), "op": (_opt(_Field("object", self.op)), _ALWAYS)}
        values, extra = self.fields(d, path, spec)
        return Origin(**values, extra=extra)

    def group(self, d: Any, path: str) -> OriginGroup:
        spec: _Spec = {
            "module_type": (_STR, _ALWAYS), "calls": (_INT, _ALWAYS),
            "paths": (_list(_STR), _ALWAYS),
            "max_ulp": (_INT, _ALWAYS), "op": (_STR, _ALWAYS), "cause": (_STR, _ALWAYS)}
        values, extra = self.fields(d, path, spec)
        return OriginGroup(**values, extra=extra)

    def point(self, d: Any, path: str) -> LayerPoint:
        spec: _Spec = {
            "label": (_STR, _ALWAYS), "path": (_STR, _ALWAYS), "max_ulp": (_INT, _ALWAYS),
            "num_different": (_INT, _ALWAYS), "num_elements": (_INT, _ALWAYS)}
        values, extra = self.fields(d, path, spec)
        return LayerPoint(**values, extra=extra)

    def flip(self, d: Any, path: str) -> TokenFlip:
        spec: _Spec = {"token": (_INT, _ALWAYS), "reference": (_INT, _ALWAYS),
                       "variant": (_INT, _ALWAYS)}
        values, extra = self.fields(d, path, spec)
        return TokenFlip(**values, extra=extra)

    def reproducer(self, d: Any, path: str) -> Reproducer:
        spec: _Spec = {
            "plan": (_OBJECT, _ALWAYS), "batch_size": (_INT, _ALWAYS), "shrunk": (_BOOL, _ALWAYS),
            "attempts": (_INT, _ALWAYS), "code": (_STR, _ALWAYS), "case": (_OBJECT, _ALWAYS)}
        values, extra = self.fields(d, path, spec)
        return Reproducer(**values, extra=extra)

    def scenario(self, d: Any, path: str) -> ScenarioResult:
        spec: _Spec = {
            "name": (_STR, _ALWAYS), "family": (_STR, _ALWAYS), "description": (_STR, _ALWAYS),
            "status": (_Field("status", _status), _ALWAYS), "reason": (_STR, _ALWAYS),
            "reference": (_STR, _ALWAYS), "variant": (_STR, _ALWAYS),
            "batch_size": (_INT, _ALWAYS), "classification": (_STR, _ALWAYS),
            "calls_compared": (_INT, _ALWAYS), "clean_prefix": (_INT, _ALWAYS),
            "first_divergence": (_STR, _ALWAYS), "seconds": (_FLOAT, _ALWAYS),
            "unmapped": (_INT, _ALWAYS), "unmapped_examples": (_list(_STR), _ALWAYS),
            "origin": (_opt(_Field("object", self.origin)), _ALWAYS),
            "origins": (_list(_Field("object", self.group)), _ALWAYS),
            "curve": (_list(_Field("object", self.point)), _ALWAYS),
            "flips": (_list(_Field("object", self.flip)), _ALWAYS),
            "reproducer": (_opt(_Field("object", self.reproducer)), _ALWAYS)}
        values, extra = self.fields(d, path, spec)
        return ScenarioResult(**values, extra=extra)

    def report(self, d: Mapping[str, Any]) -> ModelReport:  # type: ignore[override]
        spec: _Spec = {
            "schema": (_STR, _ALWAYS), "version": (_Field("version", lambda v, p: v), _ALWAYS),
            "model": (_STR, _ALWAYS), "model_type": (_STR, _ALWAYS), "source": (_STR, _ALWAYS),
            "parameters": (_INT, _ALWAYS), "dtype": (_STR, _ALWAYS), "device": (_STR, _ALWAYS),
            "attention": (_STR, _ALWAYS), "inputs": (_STR, _ALWAYS), "seed": (_INT, _ALWAYS),
            "length": (_INT, _ALWAYS), "decode_steps": (_INT, _ALWAYS),
            "batch_sizes": (_INTS, _ALWAYS), "modules": (_INT, _ALWAYS),
            "started_at": (_STR, _ALWAYS), "seconds": (_FLOAT, _ALWAYS), "command": (_STR, _ALWAYS),
            "incomplete": (_OPT_STR, _ALWAYS),
            "passed": (_BOOL, _ALWAYS),  # derived from the scenarios: checked, not trusted
            "environment": (_Field("object", self.environment), _ALWAYS),
            "scenarios": (_list(_Field("object", self.scenario)), _ALWAYS),
        }
        values, extra = self.fields(d, "", spec)
        for derived in ("schema", "version", "passed"):
            values.pop(derived, None)
        return ModelReport(**values, extra=extra)

