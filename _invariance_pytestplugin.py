"""pytest plugin of ``invariance``: check attention backends for batch invariance in a test suite.

Registered through the ``pytest11`` entry point, so installing ``invariance`` is enough. It adds
the fixture ``invariance_check`` (:func:`invariance.check` with defaults from the options and the
marker; it fails the test with a readable summary and a minimal reproducer), the marker
``@pytest.mark.invariance(**defaults)``, the ``invariance_dtype`` parametrisation, the options
``--invariance-<setting>`` of every check setting (declared once, in ``_invariance_options``) plus
``--invariance-report PATH``, the matching ini keys, a terminal summary, and the fixture
``invariance_model`` (:func:`invariance.check_model` as a test step).

The session's report combines every check, each cell keeping its test's node id. Its path is
checked when the session starts; it is written when the session ends (an interrupted session's
report, marked incomplete, goes beside it as ``PATH.partial``, so a complete earlier report is
kept). Under pytest-xdist each worker hands its checks to the controller, which writes the one
report (a worker that goes down is named, and the report marked incomplete). Ctrl-C (or SIGTERM)
during a check stops the session, the check's finished cells kept in the report.

# NOTE: this module lives outside the ``invariance`` package (as Hypothesis' plugin does) because
# pytest loads it in every session of every project where invariance is installed: it imports
# only pytest and the standard-library options module at load time, never torch, and its hooks
# return early when no check ran. The fixture imports the package when a test calls it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from _invariance_options import OPTIONS, OptionError, add_options, collect, dtype_names

if TYPE_CHECKING:
    from invariance.model.report import ModelReport
    from invariance.report import Report

__all__ = ["MARKER", "InvarianceCheck", "InvarianceModel", "Settings"]

MARKER = "invariance"
FIXTURE = "invariance_check"
MODEL_FIXTURE = "invariance_model"
DTYPE_ARG = "invariance_dtype"
PREFIX = "invariance-"
INI = "invariance_"
REPORT = "report"
CUDA_SKIP_REASON = "invariance: CUDA requested but not available"
_SETTINGS = frozenset(o.name for o in OPTIONS)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("invariance", "invariance: batch-invariance checks of attention")
    add_options(group.addoption, PREFIX)
    group.addoption(f"--{PREFIX}{REPORT}", dest=f"{INI}{REPORT}", default=None, metavar="PATH",
                    help="write every check of the session as one JSON report "
                         "(render it with `invariance report PATH`).")
    for o in OPTIONS:
        what = f"default of --{PREFIX}{o.flag}: {o.help}"
        if o.switch:
            value = "false" if o.switch_value else "true"
            what = (f"true or false (default {value}): {o.name}; the ini form of "
                    f"--{PREFIX}{o.flag}: {o.help}")
        if o.multiple:
            parser.addini(f"{INI}{o.name}", type="linelist", default=[], help=what)
        else:
            parser.addini(f"{INI}{o.name}", type="string", default="", help=what)
    parser.addini(f"{INI}{REPORT}", default="", help="path of the session's JSON report.")


@dataclass(frozen=True)
class Settings:
    """The session's defaults for ``invariance_check``: options first, then ini. ``check``
    holds them as keyword arguments of :func:`invariance.check` (parsed, not yet validated
    against a backend); ``dtypes`` are the names ``invariance_dtype`` parametrises over."""

    check: dict[str, Any] = field(default_factory=dict)
    report: str | None = None

    @property
    def dtypes(self) -> list[str]:
        return list(self.check.get("dtype", ["float32"]))

    @property
    def configured(self) -> bool:
        return bool(self.check) or self.report is not None

    @classmethod
    def from_config(cls, config: pytest.Config) -> Settings:
        raw: dict[str, Any] = {}
        for o in OPTIONS:
            value = config.getoption(f"{INI}{o.name}")
            if value in (None, []):
                value = config.getini(f"{INI}{o.name}") or None
                if o.switch and value is not None:
                    # The ini key holds the setting's value (invariance_shrink = false turns
                    # shrinking off); the switch is on when that value is the switch's.
                    value = True if _ini_bool(f"{INI}{o.name}", value) == o.switch_value \
                        else None
            raw[o.name] = value
        try:
            kwargs = collect(raw)
        except OptionError as exc:
            raise pytest.UsageError(f"invariance: {exc}") from None
        report = config.getoption(f"{INI}{REPORT}") or config.getini(f"{INI}{REPORT}") or None
        return cls(kwargs, str(report) if report else None)


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def _ini_bool(key: str, value: object) -> bool:
    """An ini boolean: true/false, yes/no, on/off, 1/0 (any case); anything else is a usage
    error (``ture`` must not silently mean false)."""
    word = str(value).strip().lower()
    if word in _TRUE or word in _FALSE:
        return word in _TRUE
    raise pytest.UsageError(f"invariance: ini {key}: expected true or false (yes/no, on/off, "
                            f"1/0), got {value!r}")


def _report_problem(path: str) -> str | None:
    """Why the session's report could not be written at ``path`` when the session ends, or
    ``None`` (checked at its start; the standard library only, so no torch is loaded)."""
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return "the name is not valid UTF-8 (the report could not be read back); choose another"
    if path == "-":
        return None
    p = Path(path)
    if p.is_dir():
        return f"{path} is a directory"
    if p.exists() and not p.is_file():  # a device, a pipe: written directly
        return None if os.access(p, os.W_OK) else f"{path} is not writable"
    parent = p.resolve().parent
    if not parent.exists():
        return f"directory {parent} does not exist"
    if not parent.is_dir():
        return f"{parent} is not a directory"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"cannot create a file in {parent}: permission denied"
    return None


@dataclass
class InvarianceSession:
    """What the plugin keeps for a session: settings and every (nodeid, report), in call
    order (under xdist, the controller's holds the workers' checks too)."""

    settings: Settings
    checks: list[tuple[str, Report]] = field(default_factory=list)
    report_written: str | None = None
    report_error: str | None = None
    #: Why the session stopped early (an interrupt), or ``None``.
    interrupted: str | None = None
    #: xdist workers that went down without handing over their checks.
    lost_workers: list[str] = field(default_factory=list)

    def combined(self) -> Report:
        from invariance.report import Report

        report = Report.combine([r for _, r in self.checks], ids=[n for n, _ in self.checks])
        stopped = [s for s in (report.incomplete, self.interrupted) if s]
        if self.lost_workers:
            stopped.append(f"xdist worker(s) {', '.join(self.lost_workers)} went down; their "
                           f"checks are missing")
        report.incomplete = "; ".join(stopped) if stopped else None
        return report

    def write_report(self) -> None:
        path = self.settings.report
        if not path or not (self.checks or self.lost_workers):
            return
        if not self.checks:
            self.report_error = (f"xdist worker(s) {', '.join(self.lost_workers)} went down "
                                 f"before handing over any check")
            return
        from invariance.outputs import OutputError, target, write_output

        report = self.combined()
        out = target(f"--{PREFIX}{REPORT}", path)
        where = out.path if out.kind != "file" or report.complete else out.partial
        try:
            write_output(replace(out, path=where), report.to_json() + "\n")
        except (OutputError, OSError) as exc:
            self.report_error = str(exc)
            return
        if out.kind == "file" and report.complete:
            with contextlib.suppress(OSError):
                out.partial.unlink()
        self.report_written = str(where) + (
            "" if where == out.path else f" (the session is incomplete; {path} is written only "
                                         f"by a complete one)")


_SESSION = pytest.StashKey[InvarianceSession]()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(**defaults): an invariance check; keyword arguments (backend=, "
        "perturbations=, budget=, dtype=, ...) become defaults of the invariance_check fixture; "
        "a test taking an invariance_dtype argument runs once per configured dtype.",
    )
    settings = Settings.from_config(config)
    config.stash[_SESSION] = InvarianceSession(settings)
    if settings.report and not hasattr(config, "workerinput"):  # the controller writes it
        problem = _report_problem(settings.report)
        if problem is not None:
            where = (f"--{PREFIX}{REPORT}" if config.getoption(f"{INI}{REPORT}")
                     else f"ini {INI}{REPORT}")
            raise pytest.UsageError(f"invariance: {where} {settings.report}: {problem}")


def pytest_report_header(config: pytest.Config) -> str | None:
    settings = config.stash[_SESSION].settings
    if not settings.configured:
        return None
    shown = ", ".join(f"{k} {', '.join(map(str, v)) if isinstance(v, list) else v}"
                      for k, v in settings.check.items())
    return f"invariance: {shown or 'defaults'}"


def _marker_kwargs(node: Any) -> dict[str, Any]:
    """Keyword arguments of the ``invariance`` markers on ``node``, closest last (so it wins)."""
    kwargs: dict[str, Any] = {}
    for mark in reversed(list(node.iter_markers(MARKER))):
        if mark.args:
            raise pytest.UsageError(
                f"@pytest.mark.{MARKER}: expected keyword arguments only, got {mark.args!r}")
        unknown = set(mark.kwargs) - _SETTINGS
        if unknown:
            raise pytest.UsageError(
                f"@pytest.mark.{MARKER}: unknown argument(s) {sorted(unknown)}; expected some "
                f"of {sorted(_SETTINGS)}")
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
    marked = _marker_kwargs(metafunc.definition).get("dtype")
    try:
        dtypes = (metafunc.config.stash[_SESSION].settings.dtypes if marked is None
                  else dtype_names(marked))
    except OptionError as exc:
        raise pytest.UsageError(f"@pytest.mark.{MARKER}: {exc}") from None
    metafunc.parametrize(DTYPE_ARG, dtypes, ids=dtypes)


_PREVIOUS_SIGTERM = pytest.StashKey[Any]()


def pytest_sessionstart(session: pytest.Session) -> None:
    """With a report to write, SIGTERM (a CI timeout, ``kill``) stops the session as Ctrl-C
    does, so that the checks that finished reach the report (as ``PATH.partial``) instead of
    dying with the process. Controller only; the main thread only; restored at the end."""
    config = session.config
    if not config.stash[_SESSION].settings.report or hasattr(config, "workerinput"):
        return
    from_pytest = signal.getsignal(signal.SIGTERM) if hasattr(signal, "SIGTERM") else None
    if from_pytest not in (signal.SIG_DFL, None):
        return  # someone else handles it: leave it to them

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")

    with contextlib.suppress(ValueError):  # not the main thread
        config.stash[_PREVIOUS_SIGTERM] = signal.signal(signal.SIGTERM, stop)


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Tests that call a check carry the marker, so that ``-m invariance`` selects them.
    for item in items:
        names = getattr(item, "fixturenames", ())
        if ((FIXTURE in names or MODEL_FIXTURE in names or DTYPE_ARG in names)
                and item.get_closest_marker(MARKER) is None):
            item.add_marker(MARKER)


_WORKER_KEY = "invariance_checks"


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    previous = session.config.stash.get(_PREVIOUS_SIGTERM, None)
    if previous is not None:
        with contextlib.suppress(ValueError):
            signal.signal(signal.SIGTERM, previous)
    state = session.config.stash[_SESSION]
    if exitstatus == pytest.ExitCode.INTERRUPTED and state.interrupted is None:
        state.interrupted = "the session was interrupted"
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # pytest-xdist worker: hand the checks to the controller
        if state.checks:
            workeroutput[_WORKER_KEY] = json.dumps(
                [[nodeid, r.to_dict()] for nodeid, r in state.checks])
        return
    state.write_report()
    if state.report_error and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED  # the report asked for is missing


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook: present only with xdist
def pytest_testnodedown(node: Any, error: Any) -> None:
    """On the xdist controller: take over a worker's checks, or note that it lost them."""
    state = node.config.stash[_SESSION]
    data = getattr(node, "workeroutput", None) or {}
    name = getattr(getattr(node, "gateway", None), "id", None) or str(node)
    if _WORKER_KEY in data:
        from invariance.report import Report

        for nodeid, report in json.loads(data[_WORKER_KEY]):
            state.checks.append((nodeid, Report.from_dict(report)))
    elif error is not None and (state.settings.report or state.checks):
        state.lost_workers.append(name)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter,
                            config: pytest.Config) -> None:
    state = config.stash[_SESSION]
    if not state.checks:
        if state.settings.report:
            terminalreporter.write_sep("-", "invariance")
            why = state.report_error or "no invariance check ran"
            terminalreporter.write_line(f"{why}; no report written to {state.settings.report}")
        return
    from invariance.render.text import summary_lines

    terminalreporter.write_sep("-", "invariance")
    seed = state.settings.check.get("seed", 0)
    for line in summary_lines(state.checks, seed):
        terminalreporter.write_line(line)
    if state.lost_workers:
        terminalreporter.write_line(
            f"xdist worker(s) {', '.join(state.lost_workers)} went down: their checks are not "
            f"in this summary or the report (marked incomplete)")
    if state.interrupted:
        terminalreporter.write_line(state.interrupted)
    if state.report_written:
        terminalreporter.write_line(f"report written to {state.report_written}")
    if state.report_error:
        terminalreporter.write_line(f"report NOT written: {state.report_error}")


class InvarianceCheck:
    """The ``invariance_check`` fixture's value: :func:`invariance.check` with the session's and
    the marker's defaults, failing the test on a violation.

    Precedence of every argument: the call, then ``@pytest.mark.invariance(...)``, then the
    ``--invariance-*`` options / ini settings, then :func:`invariance.check`'s own defaults. In a
    test parametrised by ``invariance_dtype``, that dtype is the default ``dtype``.
    """

    def __init__(self, request: pytest.FixtureRequest) -> None:
        self._request = request
        self._session = request.config.stash[_SESSION]
        self.defaults: dict[str, Any] = _marker_kwargs(request.node)
        callspec = getattr(request.node, "callspec", None)
        if callspec is not None and DTYPE_ARG in callspec.params:
            self.defaults["dtype"] = callspec.params[DTYPE_ARG]

    def __call__(self, backend: Any = None, *, progress: Any = None, **given: Any) -> Report:
        """Run :func:`invariance.check` (same keyword arguments) and return its report;
        ``pytest.fail`` with a summary when it did not pass; ``pytest.skip`` when CUDA is
        requested but absent."""
        unknown = set(given) - _SETTINGS
        if unknown:
            pytest.fail(f"{FIXTURE}: unknown argument(s) {sorted(unknown)}; expected some of "
                        f"{sorted(_SETTINGS)}", pytrace=False)
        kwargs = {**self._session.settings.check, **self.defaults,
                  **{k: v for k, v in given.items() if v is not None}}
        if backend is not None:
            kwargs["backend"] = backend
        backend_spec = kwargs.pop("backend", None)
        if backend_spec is None:
            pytest.fail(
                f"{FIXTURE}: no backend given; call it with one (a name, 'module:attr' or a "
                f"callable), set @pytest.mark.{MARKER}(backend=...) or --{PREFIX}backend",
                pytrace=False)
        import torch

        dev = kwargs.get("device")
        if dev is not None and str(dev).startswith("cuda") and not torch.cuda.is_available():
            pytest.skip(CUDA_SKIP_REASON)
        from invariance.render.text import failure_text
        from invariance.runner import CheckInterrupted, run_spec
        from invariance.spec import CheckSpec

        try:
            spec = CheckSpec.build(backend_spec, **kwargs)
        except ValueError as exc:
            pytest.fail(f"{FIXTURE}: {exc}", pytrace=False)
        nodeid = self._request.node.nodeid
        try:
            with _terminating_interrupts():
                report = run_spec(spec, progress=progress)
        except CheckInterrupted as exc:
            # The finished cells go into the session's report; the interrupt itself goes on to
            # pytest, which stops the session (a KeyboardInterrupt is not a test failure).
            self._session.checks.append((nodeid, exc.report))
            self._session.interrupted = f"the session was interrupted during {nodeid}"
            raise exc.cause from None
        self._session.checks.append((nodeid, report))
        self._request.node.user_properties.append(("invariance", report.summary()))
        if not report.passed:
            pytest.fail(failure_text(report, nodeid), pytrace=False)
        return report


@contextlib.contextmanager
def _terminating_interrupts() -> Any:
    """While a check runs: SIGTERM ends it as Ctrl-C does (the check's finished cells kept, the
    session stopped), from the main thread only; the previous handler is restored after."""
    from invariance.runner import SignalInterrupt

    def handle(signum: int, frame: object) -> None:
        raise SignalInterrupt(signum)

    try:
        previous = signal.signal(signal.SIGTERM, handle)
    except (ValueError, AttributeError):  # not the main thread, or no SIGTERM here
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@pytest.fixture
def invariance_check(request: pytest.FixtureRequest) -> InvarianceCheck:
    """:func:`invariance.check` as a test step: ``report = invariance_check("my-backend")``.

    Defaults come from ``@pytest.mark.invariance(...)`` and the ``--invariance-*`` options; the
    test fails with the violations, the worst difference, both schedules in words and a minimal
    reproducer when the backend is not batch-invariant or not accurate. Every report is kept for
    the terminal summary and ``--invariance-report``.
    """
    return InvarianceCheck(request)


class InvarianceModel:
    """The ``invariance_model`` fixture's value: :func:`invariance.check_model` (same arguments)
    as a test step, failing the test with what the check found when the model is not
    batch-invariant; ``pytest.skip`` when CUDA is requested but absent."""

    def __init__(self, request: pytest.FixtureRequest) -> None:
        self._request = request

    def __call__(self, model: Any, **kwargs: Any) -> ModelReport:
        import torch

        dev = kwargs.get("device")
        if dev is not None and str(dev).startswith("cuda") and not torch.cuda.is_available():
            pytest.skip(CUDA_SKIP_REASON)
        from invariance.model import check_model
        from invariance.render.model import model_failure_text

        try:
            report = check_model(model, **kwargs)
        except (TypeError, ValueError) as exc:
            pytest.fail(f"{MODEL_FIXTURE}: {exc}", pytrace=False)
        nodeid = self._request.node.nodeid
        self._request.node.user_properties.append(("invariance_model", report.summary()))
        if not report.passed:
            pytest.fail(model_failure_text(report, nodeid), pytrace=False)
        return report


@pytest.fixture
def invariance_model(request: pytest.FixtureRequest) -> InvarianceModel:
    """:func:`invariance.check_model` as a test step: ``report = invariance_model("pkg:build",
    device="cpu")``. The test fails with the origin (module and torch op), the per-layer ULP
    curve and a reproducer when a request's bits change with the batch."""
    return InvarianceModel(request)
