"""The ``invariance`` command: a thin face over :func:`invariance.check` and the renderers.

``check`` (run a check), ``report`` (re-render a saved report), ``compare`` (two saved reports),
``replay`` (a saved case or a report's violation), ``list`` (backends, perturbations), ``env``.
The check settings are declared once in ``_invariance_options`` (shared with the pytest plugin)
and validated once by :class:`invariance.CheckSpec`; this module parses and renders.

Exit status: 0 invariant and accurate (``compare``: nothing got worse); 1 a violation, an
accuracy failure, a backend error inside a cell or an incomplete run (``compare``: something got
worse); 2 a usage or runtime error (one line on stderr; ``--debug`` shows the traceback);
130 interrupted (the partial report is still written, marked incomplete).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import traceback
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.text import Text

from _invariance_options import OPTIONS, OptionError, add_options, collect

if TYPE_CHECKING:
    from invariance.report import Report

__all__ = ["main"]

PROG = "invariance"
DEFAULT_BACKEND = "kernels"
_OUTPUTS = (("json", "JSON (written after every cell; marked incomplete until the end)"),
            ("markdown", "Markdown"), ("html", "a self-contained HTML page"),
            ("junit", "JUnit XML"))


class UsageError(Exception):
    """A problem with what the user asked for: one line, exit 2."""


# --------------------------------------------------------------------------------------------
# Argument parsing
# --------------------------------------------------------------------------------------------

def _add_outputs(p: argparse.ArgumentParser, formats: Sequence[str]) -> None:
    g = p.add_argument_group("outputs (checked before the run, written atomically)")
    for name, what in _OUTPUTS:
        if name in formats:
            g.add_argument(f"--{name}", metavar="PATH", type=Path,
                           help=f"write the report as {what}")


class _StoreOnce(argparse.Action):
    """``store`` for a single-valued option, but a usage error when it is given twice: argparse
    alone keeps the last value and silently drops the first (``check --backend a --backend b``
    would check only ``b``). The CLI only: pytest's convention (an ``addopts`` value overridden
    on the command line) keeps the last one in the plugin."""

    _namespace: argparse.Namespace | None = None  # the namespace of this action's last use

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        if self._namespace is namespace:
            hint = ("; 'invariance bench' times several backends"
                    if option_string == "--backend" else "")
            parser.error(f"argument {option_string}: expected one value, got "
                         f"{getattr(namespace, self.dest)!r} and {values!r}{hint}")
        self._namespace = namespace
        setattr(namespace, self.dest, values)


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser (and, through ``add_subparsers``, subcommand parsers) whose
    single-valued options are :class:`_StoreOnce`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.register("action", None, _StoreOnce)
        self.register("action", "store", _StoreOnce)


def build_parser() -> argparse.ArgumentParser:
    common = _Parser(add_help=False)
    common.add_argument("--debug", action="store_true",
                        help="show the full traceback of runtime errors")
    parser = _Parser(
        prog=PROG,
        description="Prove attention kernels deterministic and batch-invariant, bit for bit.",
        epilog="exit status: 0 invariant and accurate, 1 violations, accuracy failures or an "
               "incomplete run, 2 usage or runtime errors, 130 interrupted")
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    c = sub.add_parser(
        "check", parents=[common], help="check a backend over every (dtype, perturbation)",
        description="Run every perturbation's schedule pairs through a backend at each dtype, "
                    "compare the bits, check accuracy against the float64 reference, and "
                    f"print the report. The backend defaults to {DEFAULT_BACKEND}.")
    add_options(c.add_argument)
    c.add_argument("--no-progress", action="store_true",
                   help="never show progress on stderr (a bar on a terminal, else a line per "
                        "finished cell)")
    c.add_argument("--cases", metavar="DIR", type=Path,
                   help="save each shown violation as a case file (replay it with "
                        "'invariance replay')")
    _add_outputs(c, ("json", "markdown", "html", "junit"))

    r = sub.add_parser("report", parents=[common], help="re-render a saved JSON report",
                       description="Print a saved report and write it in other formats.")
    r.add_argument("path", metavar="PATH.json", type=Path)
    _add_outputs(r, ("markdown", "html", "junit"))

    cmp = sub.add_parser("compare", parents=[common],
                         help="what changed between two saved reports",
                         description="Compare two saved reports (before/after a change, two "
                                     "GPUs). Exit 1 when anything got worse: a cell passed -> "
                                     "failed/error/skipped, a lost cell or dtype, accuracy, an "
                                     "incomplete run.")
    cmp.add_argument("a", metavar="A.json", type=Path)
    cmp.add_argument("b", metavar="B.json", type=Path)
    cmp.add_argument("--all", action="store_true", help="show unchanged cells too")
    _add_outputs(cmp, ("markdown",))

    rp = sub.add_parser("replay", parents=[common], help="replay a saved case in this process",
                        description="Run the two schedules of a case file (check --cases) or "
                                    "of a report's violation and compare their bits. Exit 1 "
                                    "when they still differ.")
    rp.add_argument("path", metavar="CASE.json|REPORT.json", type=Path)
    rp.add_argument("--backend", metavar="NAME|module:attr",
                    help="default: the backend the case failed on")
    rp.add_argument("--device", choices=("cpu", "cuda"), help="default: the case's device")
    rp.add_argument("--index", type=int, default=0, metavar="N",
                    help="which violation of a report (default: 0, the first)")

    bn = sub.add_parser(
        "bench", parents=[common], help="time backends on named workloads (CUDA)",
        description="Time backends on named workloads: CUDA-graph replay (eager with a note "
                    "when a backend cannot be captured), L2 flushed between runs, median of "
                    "--iters; the HBM bandwidth and bf16 matmul peak measured in the same run "
                    "give each workload's ideal time; --baseline gives each backend's time "
                    "ratio against it (the invariance tax). Needs a CUDA GPU.")
    bn.add_argument("--backend", action="append", metavar="NAME|module:attr",
                    help=f"a backend to time (repeatable; default {DEFAULT_BACKEND})")
    bn.add_argument("--baseline", metavar="NAME|module:attr",
                    help="the backend the others are compared with (timed too)")
    bn.add_argument("--workload", action="append", metavar="NAME",
                    help="a named workload (repeatable; default all unless --lengths): "
                         "decode-b{1,8,64}-ctx{1k,8k,32k}, decode-b256-ctx8k, decode-prod64, "
                         "mixed64, prefill-varlen")
    bn.add_argument("--lengths", action="append", metavar="SPEC",
                    help="your own workload (repeatable), e.g. 'decode:4096x32', "
                         "'prefill:2048x4,512', 'decode:8kx48+chunk:512/2048x2'")
    bn.add_argument("--dtype", default="bfloat16", metavar="DTYPE",
                    help="float16 | bfloat16 (bf16) | float32 (default bfloat16)")
    bn.add_argument("--heads", default="32:8:128", metavar="Hq:Hkv:D",
                    help="head configuration (default 32:8:128)")
    bn.add_argument("--page-size", type=int, default=16, metavar="N",
                    help="tokens per KV page (default 16)")
    bn.add_argument("--iters", type=int, default=50, metavar="N",
                    help="timed runs per backend and workload, median reported (default 50)")
    bn.add_argument("--seed", type=int, default=0, metavar="N", help="tensor content seed")
    bn.add_argument("--no-progress", action="store_true", help="never show a progress bar")
    _add_outputs(bn, ("json", "markdown"))

    sub.add_parser("list", parents=[common], help="list backends and perturbations")
    e = sub.add_parser("env", parents=[common],
                       help="show GPU, driver, CUDA, torch, triton, Python, platform")
    e.add_argument("--device", choices=("cpu", "cuda"),
                   help="default: cuda when available, else cpu")
    return parser


# --------------------------------------------------------------------------------------------
# Outputs
# --------------------------------------------------------------------------------------------

def _outputs(args: argparse.Namespace) -> dict[str, Path | None]:
    return {f"--{name}": getattr(args, name, None) for name, _ in _OUTPUTS}


def _check_outputs(args: argparse.Namespace, inputs: Sequence[Path] = ()) -> None:
    from invariance.outputs import check_outputs

    paths: dict[str, Path | None] = _outputs(args)
    cases = getattr(args, "cases", None)
    if cases is not None and cases.exists() and not cases.is_dir():
        raise UsageError(f"--cases: expected a directory, got the file {cases}")
    check_outputs(paths, inputs)


def _write_outputs(report: Report, args: argparse.Namespace) -> list[str]:
    """Write every requested format; returns the paths written."""
    from invariance.outputs import write_atomic
    from invariance.render import to_html, to_junit, to_markdown

    render: dict[str, Callable[[Report], str]] = {
        "--json": lambda r: r.to_json() + "\n", "--markdown": to_markdown, "--html": to_html,
        "--junit": to_junit}
    written = []
    for flag, path in _outputs(args).items():
        if path is not None:
            write_atomic(path, render[flag](report))
            written.append(str(path))
    return written


def _write_cases(report: Report, directory: Path) -> list[str]:
    import json

    from invariance.outputs import write_atomic

    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for i, v in enumerate(report.violations):
        if v.case_data:
            path = directory / f"case-{i:02d}-{v.perturbation}-{v.dtype}.json"
            write_atomic(path, json.dumps(v.case_data, indent=1) + "\n")
            written.append(str(path))
    return written


# --------------------------------------------------------------------------------------------
# Commands
# --------------------------------------------------------------------------------------------

def _progress(err: Console, enabled: bool) -> tuple[
        AbstractContextManager[Any], Callable[[int, int, str], None] | None]:
    """A transient rich progress bar on stderr, only when stderr is a terminal: cases done of
    all, the running case's cell and number, elapsed time (moving while a case runs)."""
    if not enabled or not err.is_terminal:
        return nullcontext(), None
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    bar = Progress(TextColumn("{task.description}", markup=False), BarColumn(),
                   MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("eta"),
                   TimeRemainingColumn(), console=err, transient=True)
    task = bar.add_task("starting", total=None)

    def update(done: int, total: int, label: str) -> None:
        bar.update(task, completed=done, total=total, description=label)

    return bar, update


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    try:
        kwargs = collect({o.name: getattr(args, o.name) for o in OPTIONS})
    except OptionError as exc:
        raise UsageError(str(exc)) from None
    kwargs.setdefault("backend", DEFAULT_BACKEND)
    return kwargs


def cmd_check(args: argparse.Namespace, argv: Sequence[str], out: Console,
              err: Console) -> int:
    kwargs = _settings(args)
    _check_outputs(args)
    from invariance.render import print_report
    from invariance.runner import CheckInterrupted, run_spec
    from invariance.spec import CheckSpec

    spec = CheckSpec.build(kwargs.pop("backend"), **kwargs)  # ValueError -> one line, exit 2
    if spec.scale.name == "large" and spec.device.type == "cpu":
        err.print(Text(f"{PROG}: warning: --scale large on cpu runs production shapes "
                       f"({spec.total_cases()} cases) on the CPU; expect a long run",
                       style="yellow"))
    command = shlex.join([PROG, *argv])

    def save_partial(partial: Report) -> None:
        if args.json is not None:
            partial.command = command
            partial.incomplete = (f"running: {len(partial.results)} of "
                                  f"{len(spec.dtypes) * len(spec.perturbations)} cells done")
            from invariance.outputs import write_atomic

            write_atomic(args.json, partial.to_json() + "\n")
            partial.incomplete = None

    # Progress goes to stderr, so that stdout holds the report alone: a bar on a terminal, else
    # (a CI log, a redirect) a line per finished cell.
    log_cells = not args.no_progress and not err.is_terminal
    cells = len(spec.dtypes) * len(spec.perturbations)

    def on_cell(partial: Report) -> None:
        save_partial(partial)
        if log_cells and partial.results:
            from invariance.render import cell_line

            err.print(Text(cell_line(partial.results[-1], len(partial.results), cells)),
                      soft_wrap=True)

    bar, progress = _progress(err, not args.no_progress)
    status = 0
    try:
        with bar:
            report = run_spec(spec, progress=progress, on_cell=on_cell)
    except CheckInterrupted as exc:
        report, status = exc.report, 130
    report.command = command
    print_report(report, out)
    for path in _write_outputs(report, args) + (
            _write_cases(report, args.cases) if args.cases is not None else []):
        err.print(Text(f"wrote {path}", style="dim"))
    if status:
        err.print(f"{PROG}: interrupted; the partial report is marked incomplete")
        return status
    return 0 if report.passed else 1


def _load(path: Path) -> Report:
    from invariance.report import Report

    return Report.from_json(path)


def cmd_report(args: argparse.Namespace, out: Console) -> int:
    from invariance.render import print_report

    _check_outputs(args, [args.path])
    report = _load(args.path)
    print_report(report, out)
    _write_outputs(report, args)
    return 0 if report.passed else 1


def cmd_compare(args: argparse.Namespace, out: Console) -> int:
    from invariance.outputs import write_atomic
    from invariance.render import compare_reports, comparison_to_markdown, print_comparison

    _check_outputs(args, [args.a, args.b])
    comparison = compare_reports(_load(args.a), _load(args.b))
    print_comparison(comparison, out, all_cells=args.all)
    if args.markdown is not None:
        write_atomic(args.markdown, comparison_to_markdown(comparison))
    return 1 if comparison.regressed else 0


def cmd_replay(args: argparse.Namespace, out: Console) -> int:
    import json

    import invariance
    from invariance.report import SCHEMA

    try:
        data = json.loads(args.path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(f"{args.path}: cannot read: {exc}") from None
    if isinstance(data, dict) and data.get("schema") == SCHEMA:
        violations = _load(args.path).violations
        if not violations:
            raise UsageError(f"{args.path}: the report holds no violation to replay")
        if not 0 <= args.index < len(violations) or not violations[args.index].case_data:
            raise UsageError(f"--index: expected 0..{len(violations) - 1} (a violation with a "
                             f"saved case), got {args.index}")
        data = violations[args.index].case_data
    case = invariance.case_from_dict(data, source=str(args.path))
    backend = args.backend or data.get("backend") or ""
    if not backend:
        raise UsageError("--backend: the case names no backend; give one")
    device = args.device or data.get("device") or "cpu"
    out.print(Text(f"replaying {case.perturbation or 'case'} on {backend} ({device})"))
    out.print(Text(f"  a: {case.a.describe()}\n  b: {case.b.describe()}"))
    try:
        cmp = invariance.replay(backend, case.workload, case.a, case.b, device=device)
    except AssertionError as exc:
        out.print(Text(f"STILL DIFFERS: {exc}", style="bold red"))
        return 1
    out.print(Text(f"identical: {len(cmp.keys)} shared tokens agree bit for bit",
                   style="bold green"))
    return 0


def cmd_bench(args: argparse.Namespace, argv: Sequence[str], out: Console,
              err: Console) -> int:
    from invariance.outputs import check_outputs, write_atomic

    check_outputs({"--json": args.json, "--markdown": args.markdown})
    from invariance.bench import run_bench, select_workloads
    from invariance.workload import HeadConfig, parse_dtype

    workloads = select_workloads(args.workload, args.lengths)  # ValueError -> one line, exit 2
    dtype, heads = parse_dtype(args.dtype), HeadConfig.parse(args.heads)
    if args.iters < 1 or args.page_size < 1:
        raise UsageError(f"--iters and --page-size: expected ints >= 1, got {args.iters} and "
                         f"{args.page_size}")
    import torch

    if not torch.cuda.is_available():
        raise UsageError("bench: needs a CUDA GPU; torch.cuda.is_available() is False here")
    bar, progress = _progress(err, not args.no_progress)
    with bar:
        report = run_bench(args.backend or [DEFAULT_BACKEND], workloads,
                           baseline=args.baseline, dtype=dtype, heads=heads,
                           page_size=args.page_size, iters=args.iters, seed=args.seed,
                           progress=progress)
    report.command = shlex.join([PROG, *argv])
    from invariance.render import bench_to_markdown, print_bench

    print_bench(report, out)
    for path, text in ((args.json, report.to_json() + "\n"),
                       (args.markdown, bench_to_markdown(report))):
        if path is not None:
            write_atomic(path, text)
            err.print(Text(f"wrote {path}", style="dim"))
    return 1 if report.errors() else 0


def cmd_list(out: Console) -> int:
    import invariance
    from invariance.render import print_listing

    print_listing(invariance.available_backends(), list(invariance.PERTURBATIONS.values()), out)
    return 0


def cmd_env(args: argparse.Namespace, out: Console) -> int:
    import invariance
    from invariance.render import print_environment
    from invariance.report import Environment
    from invariance.spec import CheckSpec

    device = str(CheckSpec.build("reference", device=args.device).device)
    print_environment(Environment.capture(device), [
        ("invariance", invariance.__version__),
        ("TRITON_INTERPRET", os.environ.get("TRITON_INTERPRET", "unset"))], out)
    return 0


# --------------------------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------------------------

def _run(args: argparse.Namespace, argv: Sequence[str], out: Console, err: Console) -> int:
    if args.command == "check":
        return cmd_check(args, argv, out, err)
    if args.command == "report":
        return cmd_report(args, out)
    if args.command == "compare":
        return cmd_compare(args, out)
    if args.command == "replay":
        return cmd_replay(args, out)
    if args.command == "bench":
        return cmd_bench(args, argv, out, err)
    if args.command == "list":
        return cmd_list(out)
    return cmd_env(args, out)


def main(argv: list[str] | None = None) -> int:
    """Run the ``invariance`` command with ``argv`` (default ``sys.argv[1:]``); returns the exit
    status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse: --help (0) or a usage error (2)
        return int(exc.code) if isinstance(exc.code, int) else 2
    out, err = Console(highlight=False), Console(stderr=True, highlight=False)
    if args.version:
        from importlib.metadata import PackageNotFoundError, version

        try:
            out.print(Text(f"{PROG} {version('invariance')}"))
        except PackageNotFoundError:
            out.print(f"{PROG} (not installed)")
        return 0
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return _run(args, argv, out, err)
    except KeyboardInterrupt:
        err.print(f"{PROG}: interrupted")
        return 130
    except Exception as exc:  # one line, no traceback: the user fixes input, not our code
        if args.debug:
            traceback.print_exc()
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if not isinstance(exc, (UsageError, ValueError)):
            message = f"{type(exc).__name__}: {message}"
        print(f"{PROG}: error: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
