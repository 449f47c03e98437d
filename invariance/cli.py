"""The ``invariance`` command: a thin face over :func:`invariance.check` and the renderers.

``check`` (run a check), ``report`` (re-render a saved report), ``compare`` (two saved reports),
``replay`` (a saved case or a report's violation), ``list`` (backends, perturbations), ``env``,
``model`` (find the first op that breaks batch invariance in a whole model).
The check settings are declared once in ``_invariance_options`` (shared with the pytest plugin)
and validated once by :class:`invariance.CheckSpec`; this module parses and renders.

Exit status: 0 invariant and accurate (``compare``: nothing got worse); 1 a violation, an
accuracy failure, a backend error inside a cell or an incomplete run (``compare``: something got
worse); 2 a usage or runtime error (one line on stderr; ``--debug`` shows the traceback), an
output that could not be written included (the verdict is still printed); 130 interrupted by
Ctrl-C, 128 + N by signal N (SIGTERM: 143, SIGHUP: 129), the partial report still written.

Outputs are written completely before anything is printed. ``-`` (or ``/dev/stdout``) as an
output path writes it to standard output, and the console report then goes to stderr. A reader
that goes away (``invariance compare A B | head``) or a console that cannot encode a character
ends nothing: the command finishes quietly with its own exit status.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import signal
import sys
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from rich.console import Console
from rich.text import Text

from _invariance_options import OPTIONS, OptionError, add_options, collect

if TYPE_CHECKING:
    from invariance.model.report import ModelReport
    from invariance.outputs import Target
    from invariance.report import Report

__all__ = ["main"]

PROG = "invariance"
DEFAULT_BACKEND = "kernels"
_OUTPUTS = (("json", "JSON (progress saved after every cell to PATH.partial, PATH written "
                     "when the run completes)"),
            ("markdown", "Markdown"), ("html", "a self-contained HTML page"),
            ("junit", "JUnit XML"))


class UsageError(Exception):
    """A problem with what the user asked for: one line, exit 2."""


# --------------------------------------------------------------------------------------------
# Argument parsing
# --------------------------------------------------------------------------------------------

def _add_outputs(p: argparse.ArgumentParser, formats: Sequence[str]) -> None:
    g = p.add_argument_group("outputs (checked before the run, written atomically before "
                             "anything is printed; '-' is standard output)")
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
               "incomplete run, 2 usage or runtime errors (an output not written included), "
               "130 interrupted (Ctrl-C), 143 terminated (SIGTERM); an interrupted run keeps "
               "its partial report")
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    _add_check_parser(sub, common)
    _add_saved_report_parsers(sub, common)
    _add_replay_parser(sub, common)
    _add_bench_parser(sub, common)
    _add_tune_parser(sub, common)
    _add_model_parser(sub, common)

    sub.add_parser("list", parents=[common], help="list backends and perturbations")
    e = sub.add_parser("env", parents=[common],
                       help="show GPU, driver, CUDA, torch, triton, Python, platform")
    e.add_argument("--device", choices=("cpu", "cuda"),
                   help="default: cuda when available, else cpu")
    return parser


def _add_check_parser(sub: Any, common: argparse.ArgumentParser) -> None:
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


def _add_saved_report_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    """``report`` (re-render one saved report) and ``compare`` (two of them)."""
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
    cmp.add_argument("--allow-different-settings", action="store_true",
                     help="compare reports whose heads, scale, budget or seed differ (their "
                          "cells ran different cases; by default an error)")
    _add_outputs(cmp, ("markdown",))


def _add_replay_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    rp = sub.add_parser("replay", parents=[common], help="replay a saved case in this process",
                        description="Run the two schedules of a case file (check --cases) or "
                                    "of a report's violation and compare their bits. Exit 1 "
                                    "when they still differ, 2 when the backend or this "
                                    "environment fails (not a difference) or the schedules "
                                    "share no token.")
    rp.add_argument("path", metavar="CASE.json|REPORT.json", type=Path)
    rp.add_argument("--backend", metavar="NAME|module:attr",
                    help="default: the backend the case failed on")
    rp.add_argument("--device", choices=("cpu", "cuda"), help="default: the case's device")
    rp.add_argument("--index", type=int, default=0, metavar="N",
                    help="which violation of a report (default: 0, the first)")
    rp.add_argument("--model", metavar="MODEL",
                    help="model cases: the model to replay on (default: the case's)")


def _add_workload_options(p: argparse.ArgumentParser) -> None:
    """The workloads of ``bench`` and ``tune``, and the shape of those that name none (checked
    by :func:`_workload_args`)."""
    p.add_argument("--grid", action="append", metavar="NAME",
                   help="a named set of workloads (repeatable): default (the named "
                        "workloads), shapes (head dims 64/256, GQA 1/8, fp16, pages 1/64, "
                        "long, short and chunked prompts, speculative verify, ...)")
    p.add_argument("--workload", action="append", metavar="NAME",
                   help="a named workload (repeatable; default all unless --lengths): "
                        "decode-b{1,8,64}-ctx{1k,8k,32k}, decode-b256-ctx8k, decode-prod64, "
                        "mixed64, prefill-varlen")
    p.add_argument("--lengths", action="append", metavar="SPEC",
                   help="your own workload (repeatable), e.g. 'decode:4096x32', "
                        "'prefill:2048x4,512', 'decode:8kx48+chunk:512/2048x2'")
    p.add_argument("--dtype", default="bfloat16", metavar="DTYPE",
                   help="for workloads that name none: float16 | bfloat16 (bf16) | float32 "
                        "(default bfloat16)")
    p.add_argument("--heads", default="32:8:128", metavar="Hq:Hkv:D",
                   help="for workloads that name none (default 32:8:128)")
    p.add_argument("--page-size", type=int, default=16, metavar="N",
                   help="tokens per KV page, for workloads that name none (default 16)")
    p.add_argument("--seed", type=int, default=0, metavar="N", help="tensor content seed")


def _workload_args(args: argparse.Namespace) -> tuple[list[Any], Any, Any]:
    """(workloads, dtype, heads) of :func:`_add_workload_options`; a ``UsageError`` naming the
    flag, the expected and the actual value."""
    from invariance.bench import select_workloads
    from invariance.workload import HeadConfig, parse_dtype

    workloads = select_workloads(args.workload, args.lengths, args.grid)  # ValueError: exit 2
    parsed = []
    for flag, parse, text, prefix in (("--dtype", parse_dtype, args.dtype, "dtype: "),
                                      ("--heads", HeadConfig.parse, args.heads, "heads: ")):
        try:
            parsed.append(parse(text))
        except ValueError as exc:
            raise UsageError(f"{flag}: {str(exc).removeprefix(prefix)}") from None
    if args.page_size < 1:
        raise UsageError(f"--page-size: expected an int >= 1, got {args.page_size}")
    return workloads, parsed[0], parsed[1]


def _add_bench_parser(sub: Any, common: argparse.ArgumentParser) -> None:
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
                    help="the backend the others are compared with (timed too); "
                         "flashinfer-best times every FlashInfer variant and keeps the "
                         "fastest per workload")
    _add_workload_options(bn)
    _add_feature_options(bn, "FlashInfer's variants that lack one are skipped")
    bn.add_argument("--iters", type=int, default=50, metavar="N",
                    help="timed runs per backend and workload, median reported (default 50)")
    bn.add_argument("--no-progress", action="store_true", help="never show a progress bar")
    _add_outputs(bn, ("json", "markdown"))


def _add_feature_options(p: argparse.ArgumentParser, note: str) -> None:
    """``--feature`` and ``--kv-dtype``, as bench and tune take them (``note``: what they do
    there)."""
    p.add_argument("--feature", action="append", metavar="KEY[=VALUE]",
                   help=f"a feature in every workload, as for check: window=N, sinks, "
                        f"softcap=X, kv_scale=tensor|head (repeatable or comma-separated; "
                        f"{note})")
    p.add_argument("--kv-dtype", metavar="DTYPE",
                   help="KV cache dtype: fp8_e4m3 (an FP8 cache with dequantization scales)")


def _add_tune_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    tn = sub.add_parser(
        "tune", parents=[common], help="measure the kernels' bit-neutral launch settings and "
                                       "write the table the planner reads (a GPU)",
        description="For each shape bucket of the workloads, search the bit-neutral launch "
                    "settings of kernels (plan, rows, warps, stages, V blocks, tiles per step, "
                    "loop, keys-as-rows tile), admit a candidate only if its output and LSE "
                    "equal the rules' bit for bit, keep the fastest if it beats the rules, and "
                    "write the table (kernels/tuned/<gpu>.json is the one the package ships). "
                    "The table is written after each bucket. Workloads: --grid, --workload, "
                    "--lengths as for bench (default: the default grid). Exit 0; 1 when a "
                    "bit-defining control candidate was not rejected (the comparison cannot "
                    "see differences) or buckets were left for lack of time (--resume); 2 "
                    "usage errors; 130 interrupted (the table keeps every finished bucket).")
    tn.add_argument("--table", metavar="PATH", type=Path, required=True,
                    help="the table file to write, a new one unless --resume (never "
                         "overwritten otherwise; KERNELS_TUNED_TABLE=PATH uses it without "
                         "installing it)")
    _add_workload_options(tn)
    _add_feature_options(tn, "tuned as buckets of their own, e.g. .../kv16k/w128+sinks, "
                             "which the planner applies only to calls with those features")
    tn.add_argument("--budget-s", type=float, metavar="S",
                    help="start no new bucket after S seconds (those left are listed)")
    tn.add_argument("--margin", type=float, default=0.03, metavar="F",
                    help="the fraction a candidate must beat the rules by (default 0.03)")
    tn.add_argument("--iters", type=int, default=10, metavar="N",
                    help="timed runs per candidate and workload, median (default 10)")
    tn.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                    help="default cuda; cpu runs the search under the Triton interpreter "
                         "(wall-clock times: a test of the method, not a table to ship)")
    tn.add_argument("--block-n", type=int, metavar="N",
                    help="tune under another contract: KV tiles of N keys (bit-defining; the "
                         "reference runs at N too), to compare contracts by measurement; the "
                         "table records N and the planner never applies it")
    tn.add_argument("--resume", action="store_true",
                    help="keep the buckets an existing --table already searched (same GPU "
                         "and Triton release) and search only the others")
    tn.add_argument("--again", action="append", default=[], metavar="PREFIX",
                    help="with --resume: search again the table's buckets whose key is "
                         "PREFIX or starts with its fields (e.g. bf16/d64 after a change to the "
                         "kernels or the space they use) where the workloads reach them; the "
                         "others, and each until its new search finishes, stay as they are; "
                         "every run with --again searches them all again; repeatable")
    tn.add_argument("--no-progress", action="store_true", help="print nothing per candidate")
    _add_outputs(tn, ("json", "markdown"))


def _add_model_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    md = sub.add_parser(
        "model", parents=[common], help="find the first op that breaks batch invariance in a "
                                        "whole model",
        description="Run one request through a model alone and inside batches (batch sizes, "
                    "order, padding, KV-cache decode, decode vs prefill), compare every "
                    "module's output for it bit for bit, and report the origin: the first "
                    "module whose inputs agree and whose output does not, and the torch op "
                    "inside it. Exit 0 invariant, 1 a divergence (or a scenario that errored), "
                    "2 usage errors.")
    md.add_argument("model", metavar="MODEL",
                    help="a shipped config with random weights (llama, qwen2-sliding, mixtral; "
                         "name:key=value,... overrides fields), module:attr or "
                         "path/file.py:attr (a torch.nn.Module, a callable building one, or a "
                         "transformers config), or a local Hugging Face directory; never "
                         "downloads")
    md.add_argument("--dtype", metavar="DTYPE",
                    help="cast the model: float16, bfloat16, float32, float64 (default: its own)")
    md.add_argument("--device", metavar="DEVICE",
                    help="cpu or cuda (default: cuda when available, else cpu)")
    md.add_argument("--attention", metavar="BACKEND",
                    help="run a transformers model's attention through an invariance backend "
                         "(kernels, reference, ... or module:attr); default: the model's own")
    md.add_argument("--scenarios", metavar="LIST",
                    help="comma list of batch, order, pad-left, pad-right, decode, "
                         "decode-vs-prefill (default: all)")
    md.add_argument("--batch-sizes", metavar="N,N,...",
                    help="batch sizes of the batch scenarios (default 2,3,4,8,16)")
    md.add_argument("--length", type=int, default=8, metavar="N",
                    help="tokens of the request (default 8)")
    md.add_argument("--decode-steps", type=int, default=3, metavar="N",
                    help="decode steps of the decode scenarios (default 3)")
    md.add_argument("--seed", type=int, default=0, metavar="N",
                    help="seed of random weights and request content (default 0)")
    md.add_argument("--inputs", metavar="KIND:WIDTH",
                    help="what the model takes when its first layer does not tell: "
                         "tokens:VOCAB, rows:FEATURES or sequence:FEATURES")
    md.add_argument("--no-shrink", action="store_true",
                    help="do not look for the smallest batch that still diverges")
    md.add_argument("--no-progress", action="store_true", help="never show a progress bar")
    md.add_argument("--cases", metavar="DIR", type=Path,
                    help="save each diverged scenario's reproducer as a case file (replay it "
                         "with 'invariance replay')")
    _add_outputs(md, ("json", "markdown", "html"))


# --------------------------------------------------------------------------------------------
# Consoles and signals
# --------------------------------------------------------------------------------------------

class _Stream:
    """A console's text stream that never ends a command: when the reader goes away (a broken
    pipe: ``| head``) further output is dropped and the descriptor pointed at the null device (so
    that Python's own flush at exit is quiet too); text the stream's encoding cannot hold is
    written with replacement characters."""

    def __init__(self, stream: TextIO | None, name: str = "") -> None:
        self._stream = stream
        self.name = name
        self.broken = False

    @property
    def encoding(self) -> str:
        return getattr(self._stream, "encoding", None) or "utf-8"

    def isatty(self) -> bool:
        try:
            return bool(self._stream is not None and self._stream.isatty())
        except (OSError, ValueError):
            return False

    def fileno(self) -> int:
        if self._stream is None:
            raise OSError("no stream")
        return self._stream.fileno()

    def write(self, text: str) -> int:
        if self.broken or self._stream is None:
            return len(text)
        try:
            try:
                self._stream.write(text)
            except UnicodeEncodeError:
                self._stream.write(text.encode(self.encoding, "replace").decode(self.encoding))
        except (OSError, ValueError) as exc:  # a broken pipe, a closed or failing stream
            self._failed(exc)
        return len(text)

    def flush(self) -> None:
        if self.broken or self._stream is None:
            return
        try:
            self._stream.flush()
        except (OSError, ValueError) as exc:
            self._failed(exc)

    def _failed(self, exc: Exception) -> None:
        """A reader that went away is its choice; another failure (a full disk behind a
        redirection) is said once on stderr, and the command goes on to its exit status."""
        self.silence()
        if self.name and not isinstance(exc, BrokenPipeError):
            with contextlib.suppress(Exception):
                reason = getattr(exc, "strerror", None) or exc
                sys.stderr.write(f"{PROG}: warning: cannot write to {self.name}: {reason}; "
                                 f"its further output is dropped\n")

    def silence(self) -> None:
        """Drop further output, and point the descriptor at the null device."""
        self.broken = True
        with contextlib.suppress(OSError, ValueError):
            fd = self.fileno()
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, fd)
            os.close(null)


_TERMINATING = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP")
                     if hasattr(signal, name))


class _Signals:
    """SIGTERM and SIGHUP end a command as Ctrl-C does (``SignalInterrupt``, a
    ``KeyboardInterrupt``: the partial report is written). Once a run has ended, :meth:`defer`
    makes every interrupt, Ctrl-C included, wait until the outputs are written: it is then only
    remembered (:attr:`pending`) and sets the exit status."""

    def __init__(self) -> None:
        self.pending: int | None = None
        self._deferring = False
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: object) -> None:
        from invariance.runner import SignalInterrupt

        if self._deferring:
            self.pending = self.pending or signum
            return
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise SignalInterrupt(signum)

    @contextlib.contextmanager
    def installed(self) -> Iterator[_Signals]:
        try:
            for signum in (signal.SIGINT, *_TERMINATING):
                previous = signal.getsignal(signum)
                default = (signal.default_int_handler if signum == signal.SIGINT
                           else signal.SIG_DFL)
                if previous is not default:
                    continue  # ignored (nohup) or handled by an embedding program: leave it
                self._previous[signum] = previous
                signal.signal(signum, self._handle)
        except ValueError:  # not the main thread: signals stay as they are
            pass
        try:
            yield self
        finally:
            for signum, previous in self._previous.items():
                with contextlib.suppress(ValueError, TypeError):
                    signal.signal(signum, previous)

    def defer(self) -> None:
        self._deferring = True


def _interrupt_status(exc: BaseException) -> int:
    """The exit status of an interrupt: 128 + N for signal N, 130 for Ctrl-C (SIGINT)."""
    signum = getattr(exc, "signum", None)
    return 128 + signum if isinstance(signum, int) else 130


# --------------------------------------------------------------------------------------------
# Outputs
# --------------------------------------------------------------------------------------------

def _outputs(args: argparse.Namespace) -> dict[str, Path | None]:
    return {f"--{name}": getattr(args, name, None) for name, _ in _OUTPUTS}


def _check_outputs(args: argparse.Namespace, inputs: Sequence[Path] = ()) -> dict[str, Target]:
    """Check every requested output (and ``--cases``) before the run; their targets."""
    from invariance.outputs import check_directory, check_outputs

    targets = check_outputs(_outputs(args), inputs)
    cases = getattr(args, "cases", None)
    if cases is not None:
        check_directory("--cases", cases)
        for t in targets.values():
            if t.kind == "file" and Path(os.path.abspath(t.path)) == Path(os.path.abspath(cases)):
                raise UsageError(f"--cases {t.name} and {t.option} {t.name} are the same path")
    return targets


def _to_stdout(targets: dict[str, Target]) -> bool:
    return any(t.kind == "stdout" for t in targets.values())


class _Written:
    """What the final writes did, for the messages after the console report."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.errors: list[str] = []


def _write(target: Target, text: str, written: _Written, out: _Stream, *,
           complete: bool = True) -> None:
    """Write one output: a file of a complete run atomically (its progress file removed), of an
    incomplete run beside it as ``PATH.partial`` (a complete earlier report is kept); a stream
    directly. Failures are collected, never raised: every other output and the console report
    still come."""
    from invariance.outputs import OutputError, write_atomic, write_output

    try:
        if target.kind != "file":
            write_output(target, text)
            if target.kind not in ("stdout", "stderr"):
                written.lines.append(f"wrote {target.name}")
            return
        partial = target.partial
        if complete:
            write_atomic(target.path, text)
            with contextlib.suppress(OSError):
                partial.unlink()
            written.lines.append(f"wrote {target.name}")
            return
        write_atomic(partial, text)
        kept = " and was left as it was" if target.path.exists() else ""
        written.lines.append(f"wrote {partial} (the run is incomplete; {target.name} is written "
                             f"only by a complete run{kept})")
    except BrokenPipeError:  # the reader of a stream stopped reading: its choice
        if target.kind == "stdout":
            out.silence()
    except OutputError as exc:
        written.errors.append(f"{target.option} {target.name}: not written: {exc}")


def _write_reports(report: Report, targets: dict[str, Target], written: _Written,
                   out: _Stream) -> None:
    """Write every requested format of ``report``."""
    from invariance.render import to_html, to_junit, to_markdown

    render: dict[str, Callable[[Report], str]] = {
        "--json": lambda r: r.to_json() + "\n", "--markdown": to_markdown, "--html": to_html,
        "--junit": to_junit}
    for flag, target in targets.items():
        try:
            text = render[flag](report)
        except Exception as exc:  # a renderer's failure costs that output, not the others
            written.errors.append(f"{flag} {target.name}: not written: cannot render it: "
                                  f"{type(exc).__name__}: {exc}")
            continue
        _write(target, text, written, out, complete=report.complete)


def _write_cases(report: Report, directory: Path, written: _Written) -> None:
    import json

    from invariance.outputs import OutputError, write_atomic

    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        written.errors.append(f"--cases {directory}: not written: {exc.strerror or exc}")
        return
    for i, v in enumerate(report.violations):
        if v.case_data:
            path = directory / f"case-{i:02d}-{v.perturbation}-{v.dtype}.json"
            try:
                write_atomic(path, json.dumps(v.case_data, indent=1) + "\n")
            except OutputError as exc:
                written.errors.append(f"--cases: not written: {exc}")
            else:
                written.lines.append(f"wrote {path}")


def _report_written(written: _Written, err: Console) -> None:
    for line in written.lines:
        err.print(Text(line, style="dim"), soft_wrap=True)
    for line in written.errors:
        err.print(Text(f"{PROG}: error: {line}", style="bold red"), soft_wrap=True)


def _finish(written: _Written, err: Console, status: int) -> int:
    """Say what was written and what could not be; exit 2 when an output failed, else
    ``status`` (the verdict's)."""
    _report_written(written, err)
    return 2 if written.errors else status


class _Progress:
    """``on_cell``: the report so far, after every cell, to ``PATH.partial`` beside a ``--json``
    file (never over ``PATH``: a complete earlier report stays until the new one is complete;
    nothing for a stream, written once at the end). A failed write is said once, and the run
    goes on."""

    def __init__(self, target: Target | None, command: str, cells: int, err: Console) -> None:
        self.target = target if target is not None and target.rewritable else None
        self.command = command
        self.cells = cells
        self.err = err
        self.failed = False

    def __call__(self, partial: Report) -> None:
        if self.target is None:
            return
        from invariance.outputs import OutputError, write_atomic

        partial.command = self.command
        partial.incomplete = f"running: {len(partial.results)} of {self.cells} cells done"
        try:
            write_atomic(self.target.partial, partial.to_json() + "\n")
        except (OutputError, TypeError, ValueError) as exc:  # a full disk, unwritable data
            if not self.failed:
                self.err.print(Text(f"{PROG}: warning: cannot save the run's progress: {exc}; "
                                    f"the run goes on, the report is tried again at its end",
                                    style="yellow"), soft_wrap=True)
            self.failed = True
        finally:
            partial.incomplete = None


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


@dataclass
class _IO:
    """A command's consoles: ``out`` the report (moved to stderr when an output is written to
    standard output), ``err`` messages; their streams; the signal handling."""

    out: Console
    err: Console
    stdout: _Stream
    signals: _Signals

    def report_to_stderr(self, targets: dict[str, Target]) -> None:
        """Standard output holds an output (``-``): the console report goes to stderr (which
        then cannot hold an output too: the two would be interleaved)."""
        if _to_stdout(targets):
            taken = [t for t in targets.values() if t.kind == "stderr"]
            if taken:
                raise UsageError(
                    f"{taken[0].option} {taken[0].name}: standard error would hold both it and "
                    f"the console report (standard output holds an output); write one of them "
                    f"to a file")
            self.out = self.err


def cmd_check(args: argparse.Namespace, argv: Sequence[str], io: _IO) -> int:
    kwargs = _settings(args)
    targets = _check_outputs(args)
    io.report_to_stderr(targets)
    from invariance.render import print_report
    from invariance.runner import CheckInterrupted, run_spec
    from invariance.spec import CheckSpec

    spec = CheckSpec.build(kwargs.pop("backend"), **kwargs)  # ValueError -> one line, exit 2
    if spec.scale.name == "large" and spec.device.type == "cpu":
        io.err.print(Text(f"{PROG}: warning: --scale large on cpu runs production shapes "
                          f"({spec.total_cases()} cases) on the CPU; expect a long run",
                          style="yellow"))
    command = shlex.join([PROG, *argv])
    cells = len(spec.dtypes) * len(spec.perturbations)
    save_progress = _Progress(targets.get("--json"), command, cells, io.err)
    # Progress goes to stderr: a bar on a terminal, else (a CI log, a redirect) a line per
    # finished cell.
    log_cells = not args.no_progress and not io.err.is_terminal

    def on_cell(partial: Report) -> None:
        save_progress(partial)
        if log_cells and partial.results:
            from invariance.render import cell_line

            io.err.print(Text(cell_line(partial.results[-1], len(partial.results), cells)),
                         soft_wrap=True)

    bar, progress = _progress(io.err, not args.no_progress)
    status = 0
    try:
        with bar:
            report = run_spec(spec, progress=progress, on_cell=on_cell)
    except CheckInterrupted as exc:
        report, status = exc.report, _interrupt_status(exc.cause)
    io.signals.defer()  # the outputs are written whole, whatever arrives now
    report.command = command
    written = _Written()
    _write_reports(report, targets, written, io.stdout)
    if args.cases is not None:
        _write_cases(report, args.cases, written)
    print_report(report, io.out)
    _report_written(written, io.err)
    if status:
        io.err.print(f"{PROG}: interrupted; the partial report is marked incomplete")
        return status
    if written.errors:
        return 2
    if io.signals.pending is not None:
        return 128 + io.signals.pending
    return 0 if report.passed else 1


def _load(path: Path) -> Report:
    from invariance.report import Report

    return Report.from_json(path)


def _model_report(args: argparse.Namespace, targets: dict[str, Target], io: _IO) -> int | None:
    """``invariance report`` of a saved ``invariance model`` report (``None``: not one)."""
    import json

    try:
        with open(args.path, encoding="utf-8") as f:
            head = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        return None  # Report.from_json says what is wrong with it
    if not isinstance(head, dict) or head.get("schema") != "invariance.model-report":
        return None
    if args.junit is not None:
        raise UsageError("--junit: a model report has no JUnit form; use --markdown or --html")
    from invariance.model.report import ModelReport
    from invariance.render.model import print_model_report

    report = ModelReport.from_json(args.path)
    written = _Written()
    _write_model_outputs(report, targets, written, io.stdout)
    print_model_report(report, io.out)
    return _finish(written, io.err, 0 if report.passed else 1)


def cmd_report(args: argparse.Namespace, io: _IO) -> int:
    from invariance.render import print_report

    targets = _check_outputs(args, [args.path])
    io.report_to_stderr(targets)
    status = _model_report(args, targets, io)
    if status is not None:
        return status
    report = _load(args.path)
    written = _Written()
    _write_reports(report, targets, written, io.stdout)
    print_report(report, io.out)
    return _finish(written, io.err, 0 if report.passed else 1)


def cmd_compare(args: argparse.Namespace, io: _IO) -> int:
    from invariance.render import compare_reports, comparison_to_markdown, print_comparison

    targets = _check_outputs(args, [args.a, args.b])
    io.report_to_stderr(targets)
    comparison = compare_reports(_load(args.a), _load(args.b))
    if comparison.incomparable and not args.allow_different_settings:
        raise UsageError(
            "compare: A and B ran different cases ("
            + "; ".join(s.text() for s in comparison.incomparable)
            + "), so the same cell names are not comparable; pass --allow-different-settings "
              "to compare them anyway")
    written = _Written()
    if "--markdown" in targets:
        _write(targets["--markdown"], comparison_to_markdown(comparison), written, io.stdout)
    print_comparison(comparison, io.out, all_cells=args.all)
    return _finish(written, io.err, 1 if comparison.regressed else 0)


def cmd_replay(args: argparse.Namespace, io: _IO) -> int:
    import json

    import invariance
    from invariance.replay import ReplayError, ScheduleMismatch
    from invariance.report import SCHEMA

    try:
        data = json.loads(args.path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(f"{args.path}: cannot read: {exc}") from None
    if isinstance(data, dict) and data.get("schema") in ("invariance.model-case",
                                                         "invariance.model-report"):
        return _replay_model(data, args, io)
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
    if not args.device and device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise UsageError(f"--device: the case ran on {device}, and torch sees no CUDA GPU "
                             f"here; pass --device cpu to replay it on the CPU")
    from invariance.backends import resolve

    fn = resolve(backend)  # ValueError -> one line, exit 2
    io.out.print(Text(f"replaying {case.perturbation or 'case'} on {backend} ({device})"))
    io.out.print(Text(f"  a: {case.a.describe()}\n  b: {case.b.describe()}"))
    return _replay_verdict(
        io, lambda: invariance.replay(fn, case.workload, case.a, case.b, device=device),
        ScheduleMismatch, ReplayError, f"the backend {backend}", "the schedules",
        lambda cmp: f"{len(cmp.keys)} shared tokens agree bit for bit")


def _replay_verdict(io: _IO, run: Callable[[], Any], mismatch: type[BaseException],
                    usage: type[BaseException], who: str, what: str,
                    agreed: Callable[[Any], str]) -> int:
    """Run a replay: exit 1 when it raises ``mismatch`` (still differs), 0 when it returns
    (identical); ``usage`` errors pass on (exit 2); anything else the code under test or the
    environment raised is an error (exit 2), never a difference."""
    try:
        result = run()
    except mismatch as exc:
        io.out.print(Text(f"STILL DIFFERS: {exc}", style="bold red"), soft_wrap=True)
        return 1
    except usage:
        raise
    except Exception as exc:  # the backend's or the environment's error: not a difference
        raise BackendError(
            f"replay: {who} raised {type(exc).__name__}: {exc} (an error of {who.split()[-1]} "
            f"or this environment, not a difference between {what}; --debug shows the "
            f"traceback)") from exc
    io.out.print(Text(f"identical: {agreed(result)}", style="bold green"))
    return 0


def cmd_bench(args: argparse.Namespace, argv: Sequence[str], io: _IO) -> int:
    from invariance.outputs import check_outputs

    targets = check_outputs({"--json": args.json, "--markdown": args.markdown})
    io.report_to_stderr(targets)
    from invariance.bench import run_bench
    from invariance.features import Features

    workloads, dtype, heads = _workload_args(args)
    features = Features.build(args.feature, args.kv_dtype)  # ValueError -> one line, exit 2
    if args.iters < 1:
        raise UsageError(f"--iters: expected an int >= 1, got {args.iters}")
    import torch

    if not torch.cuda.is_available():
        raise UsageError("bench: needs a CUDA GPU; torch.cuda.is_available() is False here")
    bar, progress = _progress(io.err, not args.no_progress)
    with bar:
        report = run_bench(args.backend or [DEFAULT_BACKEND], workloads,
                           baseline=args.baseline, dtype=dtype, heads=heads,
                           page_size=args.page_size, iters=args.iters, seed=args.seed,
                           progress=progress, features=features or None)
    report.command = shlex.join([PROG, *argv])
    from invariance.render import bench_to_markdown, print_bench

    written = _Written()
    texts = {"--json": lambda: report.to_json() + "\n",
             "--markdown": lambda: bench_to_markdown(report)}
    for flag, target in targets.items():
        _write(target, texts[flag](), written, io.stdout)
    print_bench(report, io.out)
    return _finish(written, io.err, 1 if report.errors() else 0)


def cmd_tune(args: argparse.Namespace, argv: Sequence[str], io: _IO) -> int:
    import math

    from invariance.outputs import check_outputs

    targets = check_outputs({"--json": args.json, "--markdown": args.markdown,
                             "--table": args.table})
    table = targets.pop("--table")
    if table.kind != "file":
        raise UsageError(f"--table: expected a file path, got {args.table}")
    workloads, dtype, heads = _workload_args(args)
    from invariance.features import Features

    features = Features.build(args.feature, args.kv_dtype)  # ValueError -> one line, exit 2
    pow2 = args.page_size & (args.page_size - 1) == 0
    for flag, ok, expected, value in (
            ("--heads", heads.head_dim in (64, 128, 256),
             "a head dim the kernels take (64, 128 or 256)", args.heads),
            ("--page-size", pow2, "a power of two (the kernels' pages)", args.page_size),
            ("--iters", args.iters >= 1, "an int >= 1", args.iters),
            ("--margin", math.isfinite(args.margin) and 0 <= args.margin < 1,
             "a fraction in [0, 1)", args.margin),
            ("--budget-s", args.budget_s is None or (math.isfinite(args.budget_s)
                                                     and args.budget_s >= 0),
             "finite seconds >= 0", args.budget_s),
            ("--block-n", args.block_n is None or (args.block_n >= 16
                                                   and args.block_n & (args.block_n - 1) == 0),
             "a power of two >= 16", args.block_n)):
        if not ok:
            raise UsageError(f"{flag}: expected {expected}, got {value}")
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        raise UsageError("tune: --device cuda needs a CUDA GPU; torch.cuda.is_available() "
                         "is False here (--device cpu runs the interpreter)")
    if args.device == "cpu":
        if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
            raise UsageError("--device cpu: the Triton interpreter must be on before triton is "
                             "imported; set TRITON_INTERPRET=1")
        os.environ["TRITON_INTERPRET"] = "1"
    from invariance.outputs import write_atomic
    from invariance.tune import TuneResult, check_features, default_timer, run_tune

    if features:
        problem = check_features(features, dtype, heads, args.page_size, args.device)
        if problem is not None:
            raise UsageError(f"--feature/--kv-dtype: {problem}")

    timer = default_timer(args.device, args.iters)

    if table.path.exists() and not args.resume:
        raise UsageError(f"--table: {table.name} exists; pass --resume to keep what it holds "
                         f"and search the other buckets, or remove it first")
    if args.again and not args.resume:
        raise UsageError(f"--again: expected --resume with it (it names buckets of an existing "
                         f"table to search again), got --again {args.again[0]} alone")
    bad = [p for p in args.again if not p.strip("/ ")]
    if bad:
        raise UsageError(f"--again: expected a bucket key or its leading fields such as "
                         f"bf16/d64, got {bad[0]!r}")
    if args.again and not table.path.exists():
        raise UsageError(f"--again: expected an existing --table whose buckets it searches "
                         f"again, got {table.name}, which does not exist")
    resume = None
    if args.resume and table.path.exists():
        from kernels.tuned import load_table

        load_table(table.path)  # ValueError naming the field -> exit 2
        import json

        resume = json.loads(table.path.read_text())

    command = shlex.join([PROG, *argv])

    finished: list[TuneResult] = []

    def save(result: TuneResult) -> None:  # after each bucket: nothing measured is lost
        result.command = command
        write_atomic(table.path, result.table_json())
        finished[:] = [result]

    log = (lambda line: None) if args.no_progress else (lambda line: io.err.print(
        Text(line), soft_wrap=True))
    status = 0
    try:
        result = run_tune(workloads, dtype=dtype, heads=heads, page_size=args.page_size,
                          device=args.device, timer=timer, margin=args.margin,
                          budget_s=args.budget_s, seed=args.seed, log=log, on_bucket=save,
                          resume=resume, block_n=args.block_n, features=features or None,
                          again=tuple(args.again))
    except KeyboardInterrupt as exc:
        if not finished:
            raise  # no bucket finished: nothing to write
        result, status = finished[0], _interrupt_status(exc)
    io.signals.defer()  # the outputs are written whole, whatever arrives now
    result.command = command
    written = _Written()
    _write(table, result.table_json(), written, io.stdout)
    texts = {"--json": result.to_json, "--markdown": result.to_markdown}
    for flag, target in targets.items():
        _write(target, texts[flag](), written, io.stdout, complete=not status)
    io.out.print(Text(result.to_markdown()), soft_wrap=True)
    if status:
        _report_written(written, io.err)
        io.err.print(f"{PROG}: interrupted; the table holds every finished bucket (--resume "
                     "searches the others)")
        return status
    if result.skipped:
        again = " with the same --again (which searches all its buckets again)" if args.again \
            else ""
        io.err.print(f"{PROG}: {len(result.skipped)} bucket(s) not searched within --budget-s; "
                     f"--resume{again} searches them")
    return _finish(written, io.err, 0 if result.controls_rejected and not result.skipped else 1)


def _write_model_outputs(report: ModelReport, targets: dict[str, Target], written: _Written,
                         out: _Stream) -> None:
    """Write every requested format of a model report (as :func:`_write_reports`)."""
    from invariance.render.model import model_to_html, model_to_markdown

    render: dict[str, Callable[[ModelReport], str]] = {
        "--json": lambda r: r.to_json() + "\n", "--markdown": model_to_markdown,
        "--html": model_to_html}
    for flag, target in targets.items():
        try:
            text = render[flag](report)
        except Exception as exc:  # a renderer's failure costs that output, not the others
            written.errors.append(f"{flag} {target.name}: not written: cannot render it: "
                                  f"{type(exc).__name__}: {exc}")
            continue
        _write(target, text, written, out, complete=report.incomplete is None)


def cmd_model(args: argparse.Namespace, argv: Sequence[str], io: _IO) -> int:
    import json

    targets = _check_outputs(args)
    io.report_to_stderr(targets)
    from invariance.model import check_model
    from invariance.outputs import write_atomic
    from invariance.render.model import print_model_report

    command = shlex.join([PROG, *argv])
    progress_file = targets.get("--json")
    warned: list[str] = []

    def save_partial(partial: ModelReport) -> None:
        """The report so far beside ``--json`` (as ``PATH.partial``), never over it."""
        if progress_file is None or progress_file.kind != "file":
            return
        partial.command = command
        partial.incomplete = f"running: {len(partial.scenarios)} scenarios done"
        try:
            write_atomic(progress_file.partial, partial.to_json() + "\n")
        except OSError as exc:
            if not warned:
                warned.append(str(exc))
                io.err.print(Text(f"{PROG}: warning: cannot save the run's progress: {exc}; "
                                  f"the run goes on", style="yellow"))
        finally:
            partial.incomplete = None

    bar, progress = _progress(io.err, not args.no_progress)
    with bar:
        report = check_model(
            args.model, dtype=args.dtype, device=args.device, attention=args.attention,
            scenarios=args.scenarios, batch_sizes=args.batch_sizes, length=args.length,
            decode_steps=args.decode_steps, seed=args.seed, inputs=args.inputs,
            shrink=not args.no_shrink, progress=progress, on_scenario=save_partial)
    io.signals.defer()
    report.command = command
    written = _Written()
    _write_model_outputs(report, targets, written, io.stdout)
    if args.cases is not None:
        for i, sc in enumerate(report.scenarios):
            if sc.reproducer is not None:
                case = args.cases / f"model-case-{i:02d}-{sc.name}.json"
                try:
                    args.cases.mkdir(parents=True, exist_ok=True)
                    write_atomic(case, json.dumps(sc.reproducer.case, indent=1) + "\n")
                    written.lines.append(f"wrote {case}")
                except OSError as exc:
                    written.errors.append(f"--cases {case}: not written: {exc}")
    print_model_report(report, io.out)
    _report_written(written, io.err)
    if written.errors:
        return 2
    if io.signals.pending is not None:
        return 128 + io.signals.pending
    return 0 if report.passed else 1


def _replay_model(data: dict[str, Any], args: argparse.Namespace, io: _IO) -> int:
    """``invariance replay`` of a model case (``invariance model --cases``) or of a model
    report's diverged scenario (``--index``)."""
    from invariance.model import CASE_SCHEMA, replay_model
    from invariance.model.check import ModelMismatch
    from invariance.model.report import ModelReport

    if data.get("schema") != CASE_SCHEMA:
        cases = [s.reproducer.case for s in ModelReport.from_dict(data).scenarios
                 if s.reproducer is not None]
        if not 0 <= args.index < len(cases):
            raise UsageError(f"--index: expected 0..{len(cases) - 1} (a diverged scenario), "
                             f"got {args.index}" if cases else
                             f"{args.path}: the report holds no diverged scenario to replay")
        data = cases[args.index]
    io.out.print(Text(f"replaying {data.get('scenario', 'case')} of model "
                      f"{data.get('model')!r}"))
    return _replay_verdict(
        io, lambda: replay_model(data, model=args.model or None, device=args.device),
        ModelMismatch, ValueError, "the model", "the runs",
        lambda cmp: f"{cmp.calls_compared} module calls agree bit for bit")


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

class BackendError(Exception):
    """An error of the backend or the environment outside a check's cells (``replay``): one
    line naming it, exit 2."""


def _run(args: argparse.Namespace, argv: Sequence[str], io: _IO) -> int:
    if args.command == "check":
        return cmd_check(args, argv, io)
    if args.command == "report":
        return cmd_report(args, io)
    if args.command == "compare":
        return cmd_compare(args, io)
    if args.command == "replay":
        return cmd_replay(args, io)
    if args.command == "bench":
        return cmd_bench(args, argv, io)
    if args.command == "tune":
        return cmd_tune(args, argv, io)
    if args.command == "model":
        return cmd_model(args, argv, io)
    if args.command == "list":
        return cmd_list(io.out)
    return cmd_env(args, io.out)


def main(argv: list[str] | None = None) -> int:
    """Run the ``invariance`` command with ``argv`` (default ``sys.argv[1:]``); returns the exit
    status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse: --help (0) or a usage error (2)
        return int(exc.code) if isinstance(exc.code, int) else 2
    stdout, stderr = _Stream(sys.stdout, "standard output"), _Stream(sys.stderr)
    out = Console(file=stdout, highlight=False)  # type: ignore[arg-type]
    err = Console(file=stderr, highlight=False)  # type: ignore[arg-type]
    if args.version:
        from importlib.metadata import PackageNotFoundError, version

        try:
            out.print(Text(f"{PROG} {version('invariance')}"))
        except PackageNotFoundError:
            out.print(f"{PROG} (not installed)")
        return 0
    if args.command is None:
        parser.print_help(stderr)  # type: ignore[arg-type]
        return 2
    signals = _Signals()
    with signals.installed():
        try:
            return _run(args, argv, _IO(out, err, stdout, signals))
        except KeyboardInterrupt as exc:
            err.print(f"{PROG}: interrupted")
            return _interrupt_status(exc)
        except Exception as exc:  # one line, no traceback: the user fixes input, not our code
            if args.debug:
                traceback.print_exc(file=stderr)  # type: ignore[arg-type]
            message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            if not isinstance(exc, (UsageError, ValueError, BackendError)):
                message = f"{type(exc).__name__}: {message}"
            stderr.write(f"{PROG}: error: {message}\n")
            stderr.flush()
            return 2
        finally:
            stdout.flush()
            stderr.flush()


if __name__ == "__main__":
    raise SystemExit(main())
