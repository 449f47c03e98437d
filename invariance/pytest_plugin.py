"""pytest plugin: check attention backends for batch invariance from a test suite.

Registered through the ``pytest11`` entry point, so installing ``invariance`` is enough. It adds:

- the fixture ``invariance_check``: :func:`invariance.check` with defaults from the command line
  and the ``@pytest.mark.invariance(...)`` marker; it fails the test with a readable summary when
  the backend is not invariant (or not accurate) and returns the :class:`~invariance.Report`
  otherwise;
- the marker ``@pytest.mark.invariance(**defaults)`` (select with ``-m invariance``); a test that
  takes an ``invariance_dtype`` argument runs once per configured dtype (ids like ``float16``);
- the options ``--invariance-dtype`` (repeatable), ``--invariance-budget``, ``--invariance-seed``,
  ``--invariance-device`` and ``--invariance-report PATH`` (the session's checks as one JSON report,
  the schema ``invariance report PATH`` renders), and the matching ini settings;
- a terminal summary of every check that ran.

# NOTE: pytest loads this module in every session of every project where ``invariance`` is
# installed. It must import nothing heavy (no torch, no invariance core: those load inside the
# fixture) and its hooks return early when no check ran, so that a session which does not use it
# looks and runs exactly as without it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from invariance.report import Report

__all__ = [
    "MARKER",
    "InvarianceCheck",
    "Settings",
    "add_options",
]

MARKER = "invariance"
FIXTURE = "invariance_check"
DTYPE_ARG = "invariance_dtype"

# Option names (command line ``--invariance-<name>``, ini ``invariance_<name>``).
DTYPE = "dtype"
BUDGET = "budget"
SEED = "seed"
DEVICE = "device"
REPORT = "report"
PREFIX = "invariance-"

#: Public dtype names and their aliases, mirrored from ``invariance.workload`` so that options can
#: be validated and tests parametrised without importing torch.
_DTYPE_NAMES = ("float16", "bfloat16", "float32")
_DTYPE_ALIASES = {"fp16": "float16", "half": "float16", "bf16": "bfloat16", "fp32": "float32",
                  "float": "float32"}

#: ``check`` arguments the marker may set (besides ``backend``).
_CHECK_KWARGS = frozenset({
    "backend", "dtype", "heads", "perturbations", "budget", "seed", "device", "scale",
    "accuracy_rows", "max_violations", "shrink",
})

CUDA_SKIP_REASON = "invariance: CUDA requested but not available"


def add_options(addoption: Callable[..., Any], prefix: str = PREFIX) -> None:
    """Define the check options through ``addoption`` (pytest's ``group.addoption`` or
    argparse's ``parser.add_argument``) as ``--{prefix}dtype`` etc., with ``dest`` following the
    prefix (``invariance_dtype`` for the default prefix, ``dtype`` for ``prefix=""``).

    Defaults are ``None`` so that a caller can tell "not given" from a value and fall back on
    its own configuration (pytest: the ini file).
    """
    dest = prefix.replace("-", "_")
    addoption(f"--{prefix}{DTYPE}", action="append", dest=f"{dest}{DTYPE}", default=None,
              metavar="DTYPE",
              help="dtype to check (float16, bfloat16, float32); repeat for several. "
                   "Default: float32.")
    addoption(f"--{prefix}{BUDGET}", dest=f"{dest}{BUDGET}", default=None, metavar="N",
              help="schedule pairs per perturbation, in units of its base count (>= 1). "
                   "Default: 1.")
    addoption(f"--{prefix}{SEED}", dest=f"{dest}{SEED}", default=None, metavar="SEED",
              help="seed of the workloads and schedules; the same seed gives the same cases. "
                   "Default: 0.")
    addoption(f"--{prefix}{DEVICE}", dest=f"{dest}{DEVICE}", default=None, metavar="DEVICE",
              help="cpu or cuda. Default: cuda when available, else cpu.")
    addoption(f"--{prefix}{REPORT}", dest=f"{dest}{REPORT}", default=None, metavar="PATH",
              help="write every check of the session as one JSON report "
                   "(render it with `invariance report PATH`).")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("invariance", "invariance: batch-invariance checks of attention")
    add_options(group.addoption)
    ini = PREFIX.replace("-", "_")
    parser.addini(f"{ini}{DTYPE}", type="linelist", default=[],
                  help="dtypes to check (one per line); --invariance-dtype overrides.")
    parser.addini(f"{ini}{BUDGET}", default="", help="default budget of invariance checks.")
    parser.addini(f"{ini}{SEED}", default="", help="default seed of invariance checks.")
    parser.addini(f"{ini}{DEVICE}", default="", help="default device of invariance checks.")
    parser.addini(f"{ini}{REPORT}", default="",
                  help="path of the session's JSON report of invariance checks.")


# ------------------------------------------------------------------------------------------
# Settings and session state
# ------------------------------------------------------------------------------------------

def _dtype_name(value: str) -> str:
    name = value.strip().removeprefix("torch.")
    name = _DTYPE_ALIASES.get(name, name)
    if name not in _DTYPE_NAMES:
        raise pytest.UsageError(
            f"invariance dtype: expected one of {', '.join(_DTYPE_NAMES)}, got {value!r}")
    return name


def _int(value: str, what: str, minimum: int) -> int:
    try:
        number = int(value)
    except ValueError:
        number = minimum - 1
    if number < minimum:
        raise pytest.UsageError(f"invariance {what}: expected an int >= {minimum}, got {value!r}")
    return number


@dataclass(frozen=True)
class Settings:
    """The session's defaults for ``invariance_check``: options first, then ini, then the
    defaults of :func:`invariance.check`. ``configured`` says whether any was given."""

    dtypes: tuple[str, ...] = ("float32",)
    budget: int = 1
    seed: int = 0
    device: str | None = None
    report: str | None = None
    configured: bool = False

    @classmethod
    def from_config(cls, config: pytest.Config) -> Settings:
        ini = PREFIX.replace("-", "_")

        def get(name: str) -> Any:
            value = config.getoption(f"{ini}{name}")
            return value if value not in (None, []) else (config.getini(f"{ini}{name}") or None)

        dtypes, budget, seed = get(DTYPE), get(BUDGET), get(SEED)
        device, report = get(DEVICE), get(REPORT)
        return cls(
            dtypes=tuple(dict.fromkeys(_dtype_name(d) for d in dtypes)) if dtypes else
            cls.dtypes,
            budget=_int(str(budget), "budget", 1) if budget is not None else cls.budget,
            seed=_int(str(seed), "seed", 0) if seed is not None else cls.seed,
            device=(str(device).strip() or None) if device is not None else None,
            report=str(report) if report else None,
            configured=any(v is not None for v in (dtypes, budget, seed, device, report)),
        )


@dataclass
class _Check:
    """One call of the fixture: where it ran and what it found."""

    nodeid: str
    report: Report


@dataclass
class InvarianceSession:
    """What the plugin keeps for a session: settings and every report, in call order."""

    settings: Settings
    checks: list[_Check] = field(default_factory=list)
    report_written: str | None = None
    report_error: str | None = None

    def record(self, nodeid: str, report: Report) -> None:
        self.checks.append(_Check(nodeid, report))

    def write_report(self) -> None:
        path = self.settings.report
        if not path or not self.checks:
            return
        from invariance.report import Report

        try:
            Report.combine([c.report for c in self.checks]).to_json(path)
        except (OSError, ValueError) as exc:
            self.report_error = f"cannot write {path}: {exc}"
        else:
            self.report_written = path

    def summary_lines(self) -> Iterator[str]:
        """The terminal summary, one line at a time."""
        passed = sum(c.report.passed for c in self.checks)
        yield (f"{len(self.checks)} check(s): {passed} passed, {len(self.checks) - passed} "
               f"failed (seed {self.settings.seed})")
        for c in self.checks:
            r = c.report
            verdict = "PASSED" if r.passed else "FAILED"
            line = (f"{verdict} {c.nodeid}: backend {r.backend} on {r.device} "
                    f"[{', '.join(r.dtypes)}]")
            cells = r.failed_cells()
            failed = [f"{c.perturbation}[{c.dtype}]" for c in cells if c.status == "failed"]
            errors = [f"{c.perturbation}[{c.dtype}]" for c in cells if c.status == "error"]
            if failed:
                line += f"; not invariant under {', '.join(failed)}"
            if errors:
                line += f"; backend raised in {', '.join(errors)}"
            inaccurate = [a.dtype for a in r.accuracy if not a.passed]
            if inaccurate:
                line += f"; inaccurate at {', '.join(inaccurate)}"
            if r.passed or cells or inaccurate:
                yield line
            else:
                yield line + "; no perturbation ran"
        if self.report_written:
            yield f"report written to {self.report_written}"
        if self.report_error:
            yield f"report NOT written: {self.report_error}"


_SESSION = pytest.StashKey[InvarianceSession]()


def _session(config: pytest.Config) -> InvarianceSession:
    return config.stash[_SESSION]


# ------------------------------------------------------------------------------------------
# Hooks
# ------------------------------------------------------------------------------------------

def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(**defaults): an invariance check; keyword arguments (backend=, "
        "perturbations=, budget=, dtype=, ...) become defaults of the invariance_check fixture; "
        "a test taking an invariance_dtype argument runs once per configured dtype.",
    )
    config.stash[_SESSION] = InvarianceSession(Settings.from_config(config))


def pytest_report_header(config: pytest.Config) -> str | None:
    settings = _session(config).settings
    if not settings.configured:
        return None
    device = settings.device or "auto"
    return (f"invariance: dtypes {', '.join(settings.dtypes)}, budget {settings.budget}, "
            f"seed {settings.seed}, device {device}")


def _marker_kwargs(node: Any) -> dict[str, Any]:
    """Keyword arguments of the ``invariance`` markers on ``node``, closest last (so it wins)."""
    kwargs: dict[str, Any] = {}
    for mark in reversed(list(node.iter_markers(MARKER))):
        if mark.args:
            raise pytest.UsageError(
                f"@pytest.mark.{MARKER}: expected keyword arguments only, got {mark.args!r}")
        unknown = set(mark.kwargs) - _CHECK_KWARGS
        if unknown:
            raise pytest.UsageError(
                f"@pytest.mark.{MARKER}: unknown argument(s) {sorted(unknown)}; expected some "
                f"of {sorted(_CHECK_KWARGS)}")
        kwargs.update(mark.kwargs)
    return kwargs


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if DTYPE_ARG not in metafunc.fixturenames:
        return
    for mark in metafunc.definition.iter_markers("parametrize"):  # the test's own values win
        names = mark.args[0] if mark.args else mark.kwargs.get("argnames", "")
        if DTYPE_ARG in ([n.strip() for n in names.split(",")] if isinstance(names, str)
                         else list(names)):
            return
    settings = _session(metafunc.config).settings
    marked = _marker_kwargs(metafunc.definition).get("dtype")
    if marked is None:
        dtypes: Sequence[str] = settings.dtypes
    elif isinstance(marked, (list, tuple)):
        dtypes = [_dtype_name(str(d)) for d in marked]
    else:
        dtypes = [_dtype_name(str(marked))]
    metafunc.parametrize(DTYPE_ARG, list(dtypes), ids=list(dtypes))


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Tests that call a check carry the marker, so that ``-m invariance`` selects them.
    for item in items:
        names = getattr(item, "fixturenames", ())
        if (FIXTURE in names or DTYPE_ARG in names) and item.get_closest_marker(MARKER) is None:
            item.add_marker(MARKER)


def pytest_sessionfinish(session: pytest.Session) -> None:
    if hasattr(session.config, "workerinput"):  # pytest-xdist worker: the controller writes
        return
    _session(session.config).write_report()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter,
                            config: pytest.Config) -> None:
    state = _session(config)
    if not state.checks:
        if state.settings.report and state.settings.configured:
            terminalreporter.write_sep("-", "invariance")
            terminalreporter.write_line(
                f"no invariance check ran; no report written to {state.settings.report}")
        return
    terminalreporter.write_sep("-", "invariance")
    for line in state.summary_lines():
        terminalreporter.write_line(line)


# ------------------------------------------------------------------------------------------
# The fixture
# ------------------------------------------------------------------------------------------

def _fmt_float(x: float) -> str:
    return f"{x:.3g}"


def failure_text(report: Report, nodeid: str = "") -> str:
    """What a failing check prints: verdict, failed cells with their worst difference and both
    schedules in words, accuracy failures, and one minimal reproducer."""
    lines = [f"invariance: {report.summary()}"]
    reproducer: str | None = None
    for cell in report.failed_cells():
        if cell.status == "error":
            lines.append(f"  {cell.perturbation} [{cell.dtype}]: ERROR {cell.error}")
            continue
        worst = max((d.max_abs_diff for v in cell.violations for d in v.diffs), default=0.0)
        lines.append(
            f"  {cell.perturbation} [{cell.dtype}]: {cell.num_violations} of {cell.cases} "
            f"case(s) differ, max {cell.max_ulp} ULP, max |diff| {_fmt_float(worst)} "
            f"({cell.description})")
        if not cell.violations:
            continue
        v = cell.violations[0]
        lines.append(f"    a: {v.schedule_a}")
        lines.append(f"    b: {v.schedule_b}")
        lines.append(f"    request {v.request_id}: {v.differing_tokens} of {v.compared_tokens} "
                     "token(s) differ")
        lines += [f"    {d.summary()}" for d in v.diffs if not d.equal]
        if reproducer is None:
            shrunk = "shrunk " if v.shrunk else ""
            code = "\n".join(f"    {line}".rstrip() for line in v.reproducer.splitlines())
            reproducer = (f"minimal reproducer ({shrunk}{cell.perturbation} [{cell.dtype}]; "
                          f"raises with the diff):\n{code}")
    for acc in report.accuracy:
        if acc.passed:
            continue
        lines.append(
            f"  accuracy [{acc.dtype}] vs float64 reference: max |err| "
            f"{_fmt_float(acc.max_abs_err_out)} (out), {_fmt_float(acc.max_abs_err_lse)} (lse), "
            f"worst {_fmt_float(acc.worst_ratio)}x the tolerance (atol {acc.atol:g}, rtol "
            f"{acc.rtol:g}, lse atol {acc.lse_atol:g}); {acc.nan_rows} NaN row(s) of {acc.rows}")
    if not any(r.status != "skipped" for r in report.results):
        lines.append("  no perturbation ran (all skipped): "
                     + "; ".join(f"{r.perturbation}: {r.error}" for r in report.results))
    if reproducer:
        lines.append(reproducer)
    if nodeid:
        lines.append(f"  (test {nodeid}; seed {report.seed}, budget {report.budget})")
    return "\n".join(lines)


class InvarianceCheck:
    """The ``invariance_check`` fixture's value: :func:`invariance.check` with the session's and
    the marker's defaults, failing the test on a violation.

    Precedence of every argument: the call, then ``@pytest.mark.invariance(...)``, then the
    ``--invariance-*`` options / ini settings, then :func:`invariance.check`'s own defaults. In a
    test parametrised by ``invariance_dtype``, that dtype is the default ``dtype``.
    """

    def __init__(self, request: pytest.FixtureRequest) -> None:
        self._request = request
        self._session = _session(request.config)
        self.defaults: dict[str, Any] = _marker_kwargs(request.node)
        callspec = getattr(request.node, "callspec", None)
        if callspec is not None and DTYPE_ARG in callspec.params:
            self.defaults["dtype"] = callspec.params[DTYPE_ARG]

    def __call__(
        self,
        backend: Any = None,
        *,
        dtype: Any = None,
        heads: Any = None,
        perturbations: str | Sequence[str] | None = None,
        budget: int | None = None,
        seed: int | None = None,
        device: Any = None,
        scale: Any = None,
        accuracy_rows: int | None = None,
        max_violations: int | None = None,
        shrink: bool | None = None,
        progress: Callable[[int, int, str], None] | None = None,
    ) -> Report:
        """Run :func:`invariance.check` and return its report; ``pytest.fail`` with a summary
        when it did not pass; ``pytest.skip`` when CUDA is requested but absent."""
        settings = self._session.settings
        given = {
            "backend": backend, "dtype": dtype, "heads": heads, "perturbations": perturbations,
            "budget": budget, "seed": seed, "device": device, "scale": scale,
            "accuracy_rows": accuracy_rows, "max_violations": max_violations, "shrink": shrink,
        }
        session_defaults = {
            "dtype": list(settings.dtypes), "budget": settings.budget, "seed": settings.seed,
            "device": settings.device,
        }
        kwargs: dict[str, Any] = {}
        for name, value in given.items():
            if value is None:
                value = self.defaults.get(name, session_defaults.get(name))
            if value is not None:
                kwargs[name] = value
        backend_spec = kwargs.pop("backend", None)
        if backend_spec is None:
            pytest.fail(
                f"{FIXTURE}: no backend given; call it with one (a name, 'module:attr' or a "
                f"callable) or set @pytest.mark.{MARKER}(backend=...)", pytrace=False)
        import torch

        dev = kwargs.get("device")
        if dev is not None and str(dev).startswith("cuda") and not torch.cuda.is_available():
            pytest.skip(CUDA_SKIP_REASON)
        from invariance.check import check

        try:
            report = check(backend_spec, progress=progress, **kwargs)
        except ValueError as exc:
            pytest.fail(f"{FIXTURE}: {exc}", pytrace=False)
        nodeid = self._request.node.nodeid
        self._session.record(nodeid, report)
        self._request.node.user_properties.append(("invariance", report.summary()))
        if not report.passed:
            pytest.fail(failure_text(report, nodeid), pytrace=False)
        return report


@pytest.fixture
def invariance_check(request: pytest.FixtureRequest) -> InvarianceCheck:
    """:func:`invariance.check` as a test step: ``report = invariance_check("my-backend")``.

    Defaults come from ``@pytest.mark.invariance(...)`` and the ``--invariance-*`` options; the
    test fails with the violations, the worst difference, both schedules in words and a minimal
    reproducer when the backend is not batch-invariant or not accurate. Every report is kept for
    the terminal summary and ``--invariance-report``.
    """
    return InvarianceCheck(request)
