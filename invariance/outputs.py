"""Output files that are either written whole or not at all, checked before a long run.

- :func:`target` says what an output path names: a regular file (written atomically), the
  process's own standard output or error (``-``, ``/dev/stdout``, or any path naming the same
  open file, a redirected regular file included: written through the descriptor, so the shell's
  redirection holds), or another stream (a character device, a pipe, process substitution's
  ``/dev/fd/N``, a socket: written directly, once).
- :func:`check_outputs` finds, *before* a run that may take an hour, the outputs that could not
  be written at the end: a directory, a missing or read-only parent directory, two outputs
  naming the same file, an output that would overwrite an input, a name that cannot be read
  back (not valid UTF-8). :func:`check_directory` does the same for a directory of outputs.
- :func:`write_atomic` writes to a temporary file beside the target, flushes it to disk and
  renames it into place, so a crash, a full disk or Ctrl-C never leaves a half-written report,
  and a failed write leaves the previous file untouched. :func:`write_output` writes a
  :class:`Target` as its kind needs; :func:`partial_path` is where a run's progress goes until
  its report is complete, so that a complete earlier report is never replaced by a partial one.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

__all__ = [
    "STDOUT",
    "OutputError",
    "Target",
    "check_directory",
    "check_outputs",
    "partial_path",
    "shown",
    "target",
    "write_atomic",
    "write_output",
]

#: The output name meaning standard output.
STDOUT = "-"

#: What an output path names (see :func:`target`).
Kind = Literal["file", "stdout", "stderr", "stream"]


class OutputError(ValueError):
    """An output file cannot be (or could not be) written; the message names the file (or the
    option naming it) and the reason."""


def _reason(exc: OSError) -> str:
    return exc.strerror or str(exc) or type(exc).__name__


def _temp_name(target: Path) -> Path:
    return target.with_name(f".{target.name}.{secrets.token_hex(4)}.tmp")


def _open_temp(target: Path) -> tuple[int, Path]:
    """Create a new temporary file beside ``target`` (the umask applies, as for a plain write)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    for _ in range(100):
        tmp = _temp_name(target)
        try:
            return os.open(tmp, flags, 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name beside {target}")  # pragma: no cover


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path``: all of it, or nothing.

    The text goes to a temporary file in ``path``'s directory, is flushed and fsynced, then
    ``os.replace``-d over ``path``. On any failure (including ``KeyboardInterrupt``) the temporary
    file is removed and an existing ``path`` is left as it was. A symlink is written through (its
    target is replaced); an existing file keeps its permission bits. A path that exists and is not
    a regular file (``/dev/null``, a FIFO) is written directly: it cannot be replaced.

    Raises :class:`OutputError` naming ``path`` and the OS reason.
    """
    path = Path(path)
    data = text.encode("utf-8")
    resolved = path.resolve() if path.is_symlink() else path
    try:
        st: os.stat_result | None = os.stat(path)
    except OSError:
        st = None
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise OutputError(f"cannot write {path}: it is a directory")
    if st is not None and not stat.S_ISREG(st.st_mode):
        _write_stream(path, data)  # the path as given: /dev/fd/N does not resolve to a file
        return
    try:
        fd, tmp = _open_temp(resolved)
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {_reason(exc)}") from exc
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if st is not None:
            with contextlib.suppress(OSError):
                os.chmod(tmp, stat.S_IMODE(st.st_mode))
        os.replace(tmp, resolved)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise OutputError(f"cannot write {path}: {_reason(exc)}") from exc
        raise
    _fsync_dir(resolved.parent)


def _write_stream(path: Path, data: bytes) -> None:
    """Write ``data`` to a device or pipe named by ``path``. A reader that went away
    (``BrokenPipeError``) is the reader's choice and propagates as it is."""
    try:
        with open(path, "wb") as f:
            f.write(data)
    except BrokenPipeError:
        raise
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {_reason(exc)}") from exc


def _fsync_dir(directory: Path) -> None:
    """Make the rename itself durable where the platform allows (POSIX)."""
    if os.name != "posix":  # pragma: no cover
        return
    with contextlib.suppress(OSError):
        fd = os.open(directory if str(directory) else ".", os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


# --------------------------------------------------------------------------------------------
# What an output names
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Target:
    """One requested output: ``option`` names it in messages (``"--json"``), ``path`` is what the
    user gave, ``kind`` how it is written:

    - ``file``: a regular file (or a new one): atomically, progress beside it
      (:func:`partial_path`);
    - ``stdout`` / ``stderr``: this process's own stream (``-``, ``/dev/stdout``, ``/dev/fd/1``,
      or a path naming the very file standard output is redirected to), through its descriptor,
      once, at the end;
    - ``stream``: another character device, pipe or socket, directly, once, at the end.
    """

    option: str
    path: Path
    kind: Kind

    @property
    def name(self) -> str:
        """The path as given, for messages."""
        return shown(self.path)

    @property
    def rewritable(self) -> bool:
        """Whether progress may be written before the end (regular files only)."""
        return self.kind == "file"

    @property
    def partial(self) -> Path:
        """Where a file's progress goes until its report is complete (:func:`partial_path`;
        beside a symlink's target, which is the file written)."""
        return partial_path(self.path.resolve() if self.path.is_symlink() else self.path)


def _fd_stat(fd: int) -> os.stat_result | None:
    try:
        return os.fstat(fd)
    except (OSError, ValueError):
        return None


def _same_inode(a: os.stat_result, b: os.stat_result | None) -> bool:
    return b is not None and (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def target(option: str, path: str | Path) -> Target:
    """What ``path`` names, as :class:`Target` (see its kinds). ``-`` is standard output."""
    if str(path) == STDOUT:
        return Target(option, Path(STDOUT), "stdout")
    p = Path(path)
    try:
        st = os.stat(p)
    except OSError:
        return Target(option, p, "file")
    if _is_null(st):  # a sink, whatever standard output is pointed at
        return Target(option, p, "stream")
    for fd, kind in ((1, "stdout"), (2, "stderr")):
        if _same_inode(st, _fd_stat(fd)):
            return Target(option, p, kind)  # type: ignore[arg-type]
    if stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode):
        return Target(option, p, "file")
    return Target(option, p, "stream")


def _is_null(st: os.stat_result) -> bool:
    try:
        return _same_inode(st, os.stat(os.devnull))
    except OSError:  # pragma: no cover - a system without a null device
        return False


def shown(path: str | Path) -> str:
    """``path`` as text for messages: a name that is not valid UTF-8 shows its bytes escaped
    (``r\\xff.json``)."""
    text = str(path)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    return text


def partial_path(path: Path) -> Path:
    """Where the progress of a run writing ``path`` goes until its report is complete:
    ``PATH.partial`` beside it."""
    return path.with_name(path.name + ".partial")


def write_output(out: Target, text: str) -> None:
    """Write ``text`` (UTF-8) to ``out`` as its kind needs: a file atomically, this process's
    stdout or stderr through its descriptor (after flushing what Python buffered there), another
    stream directly. ``BrokenPipeError`` (the reader went away) propagates as it is; other
    failures raise :class:`OutputError` naming the output."""
    data = text.encode("utf-8")
    if out.kind == "file":
        write_atomic(out.path, text)
    elif out.kind in ("stdout", "stderr"):
        stream, fd = (sys.stdout, 1) if out.kind == "stdout" else (sys.stderr, 2)
        if stream is not None:
            stream.flush()
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(fd, view):]
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise OutputError(f"cannot write {out.option} {out.name}: {_reason(exc)}") from exc
    else:
        _write_stream(out.path, data)


# --------------------------------------------------------------------------------------------
# Checks before a run
# --------------------------------------------------------------------------------------------

def _same(a: Path, b: Path) -> bool:
    if a.resolve() == b.resolve():
        return True
    try:
        return os.path.samefile(a, b)  # hard links, case-insensitive file systems
    except OSError:
        return False


def _bad_name(path: Path) -> str | None:
    """Why ``path``'s name could not be written into a report and read back, or ``None``."""
    if shown(path) != str(path):
        return ("the name is not valid UTF-8 (a report records its outputs' names and must be "
                "readable back); choose a UTF-8 name")
    return None


def _probe(directory: Path) -> str | None:
    """Create and remove a file in ``directory``; why that failed, or ``None``."""
    shown = str(directory) if str(directory) not in ("", ".") else "the current directory"
    try:
        fd, tmp = _open_temp(directory / "probe")
    except OSError as exc:
        return f"cannot create a file in {shown}: {_reason(exc)}"
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(tmp)
    return None


def _file_problem(path: Path) -> str | None:
    """Why the regular file ``path`` cannot be written at the end of a run, or ``None``."""
    try:
        st: os.stat_result | None = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):  # the parent is checked below
        st = None
    except OSError as exc:
        return f"cannot inspect {path}: {_reason(exc)}"
    if st is not None and stat.S_ISDIR(st.st_mode):
        return f"{path} is a directory"
    parent = (path.resolve() if path.is_symlink() else path).parent
    shown = str(parent) if str(parent) not in ("", ".") else "the current directory"
    if not parent.exists():
        return f"directory {shown} does not exist"
    if not parent.is_dir():
        return f"{shown} is not a directory"
    partial = Target("", path, "file").partial
    if partial.is_dir():
        return f"{partial} (where the run's progress goes) is a directory"
    return _probe(parent)


def _problem(out: Target) -> str | None:
    """Why ``out`` cannot be written at the end of a run, or ``None``."""
    bad = _bad_name(out.path)
    if bad is not None:
        return bad
    if out.kind in ("stdout", "stderr"):
        return None
    if out.kind == "stream":
        return None if os.access(out.path, os.W_OK) else f"{out.path} is not writable"
    return _file_problem(out.path)


def check_outputs(outputs: Mapping[str, str | Path | None],
                  inputs: Sequence[Path] = ()) -> dict[str, Target]:
    """Check, before a long run, that every output can be written when it ends; return the
    :class:`Target` of each requested one, by option.

    ``outputs`` maps the option that names each output (e.g. ``"--markdown"``) to its path
    (``None``: not requested; ``-``: standard output). A file must not be a directory, its parent
    directory must exist and accept a new file (one is created and removed there), a stream must
    be writable, every name must be valid UTF-8, and no two outputs (the null device excepted),
    nor an output and any of ``inputs``, may be the same file (compared after resolving, so
    ``a.json`` and ``./a.json`` collide; ``-`` and ``/dev/stdout`` too). Nothing is written to the
    outputs themselves.

    Raises :class:`OutputError` listing every problem, each with its option.
    """
    problems: list[str] = []
    seen: list[Target] = []
    targets: dict[str, Target] = {}
    for key, raw in outputs.items():
        if raw is None:
            continue
        out = target(key, raw)
        problem = _problem(out)
        if problem is not None:
            problems.append(f"{key} {out.name}: {problem}")
        for other in seen:
            if _collide(out, other):
                problems.append(f"{key} {out.name} and {other.option} {other.name} are the "
                                f"same file")
        if out.kind == "file":
            for inp in inputs:
                if _same(out.path, Path(inp)):
                    problems.append(f"{key} {out.name} would overwrite the input {inp}")
        seen.append(out)
        targets[key] = out
    if problems:
        raise OutputError("; ".join(problems))
    return targets


def _collide(a: Target, b: Target) -> bool:
    if a.kind in ("stdout", "stderr") or b.kind in ("stdout", "stderr"):
        return a.kind == b.kind
    if _bad_name(a.path) or _bad_name(b.path):
        return False
    if a.kind == "stream" and _same(a.path, Path(os.devnull)):
        return False  # any number of outputs may be discarded
    if a.kind != b.kind:
        return False
    return _same(a.path, b.path)


def check_directory(option: str, path: str | Path) -> None:
    """Check, before a run, that files can be created in ``path`` at its end (it exists and is a
    writable directory, or its nearest existing ancestor is, so that it can be made); raises
    :class:`OutputError` naming ``option``."""
    p = Path(path)
    problem = _bad_name(p)
    if problem is None and str(p) == STDOUT:
        problem = "expected a directory, got '-' (standard output cannot hold files)"
    if problem is None:
        existing = p
        while not existing.exists() and existing != existing.parent:
            if existing.is_symlink():  # a dangling link
                problem = f"{shown(existing)} is a broken symbolic link"
                break
            existing = existing.parent
        if problem is None:
            if not existing.is_dir():
                problem = (f"expected a directory, got the file {shown(existing)}"
                           if existing == p else f"{shown(existing)} is not a directory")
            else:
                problem = _probe(existing)
    if problem is not None:
        raise OutputError(f"{option} {shown(p)}: {problem}")
