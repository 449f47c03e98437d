"""The ``invariance`` command: check a backend, re-render or compare saved reports, list
backends and perturbations, show the environment.

Exit status: 0 invariant and accurate (``compare``: no cell got worse), 1 a violation, an
accuracy failure or a backend error inside a cell (``compare``: a cell went from passed to
failed), 2 a usage or runtime error (one line on stderr; ``--debug`` shows the traceback).
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
from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:
    from invariance.report import Report

__all__ = ["main"]

PROG = "invariance"
DTYPE_CHOICES = ("float16", "bfloat16", "float32")


class UsageError(Exception):
    """A problem with what the user asked for: one line, exit 2."""


# --------------------------------------------------------------------------------------------
# Argument parsing
# --------------------------------------------------------------------------------------------

def _split(values: Sequence[str] | None) -> list[str]:
    """Flatten repeated options that may also hold comma lists."""
    return [v.strip() for item in values or () for v in item.split(",") if v.strip()]


def _outputs(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("outputs")
    g.add_argument("--json", metavar="PATH", type=Path, help="write the report as JSON")
    g.add_argument("--markdown", metavar="PATH", type=Path, help="write the report as Markdown")
    g.add_argument("--html", metavar="PATH", type=Path,
                   help="write the report as a self-contained HTML page")
    g.add_argument("--junit", metavar="PATH", type=Path, help="write the report as JUnit XML")


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true",
                        help="show the full traceback of runtime errors")

    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Prove attention kernels deterministic and batch-invariant, bit for bit.",
        epilog="exit status: 0 invariant and accurate, 1 violations or accuracy failures, "
               "2 usage or runtime errors",
    )
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    c = sub.add_parser(
        "check", parents=[common], help="check a backend over every (dtype, perturbation)",
        description="Run every perturbation's schedule pairs through a backend at each dtype, "
                    "compare the bits, check accuracy against the float64 reference, and "
                    "print the report.")
    c.add_argument("--backend", default="kernels", metavar="NAME|module:attr",
                   help="a backend name (see 'invariance list') or 'module:attr' "
                        "(default: kernels)")
    c.add_argument("--dtype", action="append", metavar="DTYPE",
                   help=f"{'|'.join(DTYPE_CHOICES)}; repeatable or comma-separated "
                        "(default: float32)")
    c.add_argument("--perturb", action="append", metavar="NAME",
                   help="a perturbation name or 'all'; repeatable or comma-separated "
                        "(default: all)")
    c.add_argument("--budget", type=int, default=1, metavar="N",
                   help="multiplies the number of cases per perturbation (default: 1)")
    c.add_argument("--seed", type=int, default=0, metavar="N", help="seed (default: 0)")
    c.add_argument("--device", choices=("cpu", "cuda"),
                   help="default: cuda when available, else cpu")
    c.add_argument("--heads", metavar="Hq:Hkv:D",
                   help="query heads, KV heads, head dim (default: 4:2:64 small, "
                        "32:8:128 large)")
    c.add_argument("--scale", choices=("small", "large"),
                   help="case sizes (default: small on cpu, large on cuda)")
    c.add_argument("--no-progress", action="store_true", help="never show a progress bar")
    _outputs(c)

    r = sub.add_parser("report", parents=[common], help="re-render a saved JSON report",
                       description="Print a saved report and write it in other formats.")
    r.add_argument("path", metavar="PATH.json", type=Path)
    for flag, what in (("--markdown", "Markdown"), ("--html", "a self-contained HTML page"),
                       ("--junit", "JUnit XML")):
        r.add_argument(flag, metavar="PATH", type=Path, help=f"write the report as {what}")

    sub.add_parser("list", parents=[common], help="list backends and perturbations")
    e = sub.add_parser("env", parents=[common],
                       help="show GPU, driver, CUDA, torch, triton, Python, platform")
    e.add_argument("--device", choices=("cpu", "cuda"),
                   help="default: cuda when available, else cpu")

    cmp = sub.add_parser("compare", parents=[common],
                         help="which cells changed verdict between two saved reports",
                         description="Compare two saved reports (before/after a change, two "
                                     "GPUs). Exit 1 when a cell went from passed to failed.")
    cmp.add_argument("a", metavar="A.json", type=Path)
    cmp.add_argument("b", metavar="B.json", type=Path)
    cmp.add_argument("--all", action="store_true", help="show unchanged cells too")
    cmp.add_argument("--markdown", metavar="PATH", type=Path,
                     help="write the comparison as Markdown")
    return parser


# --------------------------------------------------------------------------------------------
# Commands
# --------------------------------------------------------------------------------------------

def _consoles() -> tuple[Console, Console]:
    return Console(highlight=False), Console(stderr=True, highlight=False)


def _command_line(argv: Sequence[str]) -> str:
    return shlex.join([PROG, *argv])


def _load(path: Path) -> Report:
    from invariance.report import Report

    return Report.from_json(path)


def _write(path: Path, text: str) -> None:
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror or exc}") from exc


def _write_outputs(report: Report, args: argparse.Namespace) -> None:
    from invariance.render import to_html, to_junit, to_markdown

    if getattr(args, "json", None) is not None:
        _write(args.json, report.to_json() + "\n")
    if args.markdown is not None:
        _write(args.markdown, to_markdown(report))
    if args.html is not None:
        _write(args.html, to_html(report))
    if args.junit is not None:
        _write(args.junit, to_junit(report))


def _default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _progress(err: Console, enabled: bool) -> tuple[
        AbstractContextManager[Any], Callable[[int, int, str], None] | None]:
    """A transient rich progress bar on stderr, only when stderr is a terminal."""
    if not enabled or not err.is_terminal:
        return nullcontext(), None
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn(), console=err, transient=True)
    task = bar.add_task("starting", total=None)

    def update(done: int, total: int, label: str) -> None:
        bar.update(task, completed=done, total=total, description=label)

    return bar, update


def cmd_check(args: argparse.Namespace, argv: Sequence[str], out: Console,
              err: Console) -> int:
    dtypes = _split(args.dtype) or ["float32"]
    perturbs = _split(args.perturb) or ["all"]
    aliases = {"fp16": "float16", "half": "float16", "bf16": "bfloat16", "fp32": "float32"}
    for d in dtypes:
        if aliases.get(d, d) not in DTYPE_CHOICES:
            raise UsageError(f"unknown dtype {d!r}; expected one of {', '.join(DTYPE_CHOICES)}")
    if args.budget < 1:
        raise UsageError(f"--budget must be >= 1, got {args.budget}")

    # NOTE: on CPU the kernels need the Triton interpreter; the kernels adapter switches it on
    # before triton is first imported (nothing here imports triton).
    import invariance

    device = args.device or _default_device()
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise UsageError("--device cuda was requested but torch sees no CUDA GPU here")
    unknown = [p for p in perturbs if p != "all" and p not in invariance.PERTURBATIONS]
    if unknown:
        raise UsageError(f"unknown perturbation {unknown[0]!r}; expected 'all' or one of "
                         f"{', '.join(invariance.PERTURBATIONS)}")
    if args.heads is not None:
        invariance.HeadConfig.parse(args.heads)  # ValueError -> one line, exit 2
    backend = invariance.resolve_backend(args.backend)  # fail fast on an unknown backend

    command = _command_line(argv)
    bar, progress = _progress(err, not args.no_progress)
    with bar:
        report = invariance.check(
            backend, dtype=dtypes, heads=args.heads, perturbations=perturbs,
            budget=args.budget, seed=args.seed, device=device, scale=args.scale,
            progress=progress)
    from invariance.render import print_report

    report.command = command
    print_report(report, out)
    _write_outputs(report, args)
    return 0 if report.passed else 1


def cmd_report(args: argparse.Namespace, out: Console) -> int:
    from invariance.render import print_report

    report = _load(args.path)
    print_report(report, out)
    _write_outputs(report, args)
    return 0 if report.passed else 1


def cmd_compare(args: argparse.Namespace, out: Console) -> int:
    from invariance.render import compare_reports, comparison_to_markdown, print_comparison

    a = _load(args.a)
    b = _load(args.b)
    comparison = compare_reports(a, b)
    print_comparison(comparison, out, all_cells=args.all)
    if args.markdown is not None:
        _write(args.markdown, comparison_to_markdown(comparison))
    return 1 if comparison.regressed else 0


def cmd_list(out: Console) -> int:
    import invariance

    backends = Table(title="backends", title_justify="left")
    for col in ("name", "importable", "source", "description"):
        backends.add_column(col, no_wrap=col == "name", overflow="fold")
    for b in invariance.available_backends():
        ok = Text("yes", style="green") if b.importable else Text(f"no: {b.reason}",
                                                                     style="red")
        backends.add_row(Text(b.name), ok, Text(b.source), Text(b.description))
    out.print(backends)
    out.print(Text("any callable 'module:attr' (AttentionBatch -> AttentionResult | (out, lse)) "
                   "works too", style="dim"))
    out.print()
    perts = Table(title="perturbations", title_justify="left")
    perts.add_column("name", no_wrap=True)
    perts.add_column("what changes between the two schedules", overflow="fold")
    perts.add_column("cases/budget", justify="right")
    perts.add_column("needs")
    for p in invariance.PERTURBATIONS.values():
        perts.add_row(Text(p.name), Text(p.description), Text(str(p.cases_per_budget)),
                      Text("CUDA" if p.requires_cuda else ""))
    out.print(perts)
    return 0


def cmd_env(args: argparse.Namespace, out: Console) -> int:
    import invariance
    from invariance.report import Environment

    device = args.device or _default_device()
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise UsageError("--device cuda was requested but torch sees no CUDA GPU here")
    e = Environment.capture(device)
    table = Table(title="environment", title_justify="left", show_header=False)
    table.add_column("key", style="dim")
    table.add_column("value", overflow="fold")
    for key, value in (
        ("device", f"{e.device} ({e.device_name})"), ("GPUs", str(e.gpu_count)),
        ("driver", e.driver or "-"), ("CUDA", e.cuda or "-"), ("torch", e.torch),
        ("triton", e.triton or "not installed"), ("python", e.python),
        ("platform", e.platform), ("invariance", invariance.__version__),
        ("TRITON_INTERPRET", os.environ.get("TRITON_INTERPRET", "unset")),
    ):
        table.add_row(Text(key), Text(value))
    out.print(table)
    return 0


# --------------------------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    """Run the ``invariance`` command with ``argv`` (default ``sys.argv[1:]``); returns the exit
    status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse: --help (0) or a usage error (2)
        return int(exc.code) if isinstance(exc.code, int) else 2
    out, err = _consoles()
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
        if args.command == "check":
            return cmd_check(args, argv, out, err)
        if args.command == "report":
            return cmd_report(args, out)
        if args.command == "compare":
            return cmd_compare(args, out)
        if args.command == "list":
            return cmd_list(out)
        if args.command == "env":
            return cmd_env(args, out)
        raise UsageError(f"unknown command {args.command!r}")  # pragma: no cover
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
