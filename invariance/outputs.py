"""Output files that are either written whole or not at all, checked before a long run.

- :func:`write_atomic` writes to a temporary file beside the target, flushes it to disk and
  renames it into place, so a crash, a full disk or Ctrl-C never leaves a half-written report,
  and a failed write leaves the previous file untouched.
- :func:`check_outputs` finds, *before* a run that may take an hour, the output paths that could
  not be written at the end: a directory, a missing or read-only parent directory, two outputs
  naming the same file, an output that would overwrite an input.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = ["OutputError", "check_outputs", "write_atomic"]


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
    a regular file (``/dev/stdout``, a FIFO) is written directly: it cannot be replaced.

    Raises :class:`OutputError` naming ``path`` and the OS reason.
    """
    path = Path(path)
    data = text.encode("utf-8")
    target = path.resolve() if path.is_symlink() else path
    try:
        st: os.stat_result | None = os.stat(target)
    except OSError:
        st = None
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise OutputError(f"cannot write {path}: it is a directory")
    if st is not None and not stat.S_ISREG(st.st_mode):
        try:
            with open(target, "wb") as f:
                f.write(data)
        except OSError as exc:
            raise OutputError(f"cannot write {path}: {_reason(exc)}") from exc
        return
    try:
        fd, tmp = _open_temp(target)
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
        os.replace(tmp, target)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise OutputError(f"cannot write {path}: {_reason(exc)}") from exc
        raise
    _fsync_dir(target.parent)


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


def _same(a: Path, b: Path) -> bool:
    if a.resolve() == b.resolve():
        return True
    try:
        return os.path.samefile(a, b)  # hard links, case-insensitive file systems
    except OSError:
        return False


def _problem(path: Path) -> str | None:
    """Why ``path`` cannot be written at the end of a run, or ``None``."""
    try:
        st: os.stat_result | None = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):  # the parent is checked below
        st = None
    except OSError as exc:
        return f"cannot inspect {path}: {_reason(exc)}"
    if st is not None and stat.S_ISDIR(st.st_mode):
        return f"{path} is a directory"
    if st is not None and not stat.S_ISREG(st.st_mode):  # /dev/null, a FIFO: written in place
        return None if os.access(path, os.W_OK) else f"{path} is not writable"
    parent = (path.resolve() if path.is_symlink() else path).parent
    shown = str(parent) if str(parent) not in ("", ".") else "the current directory"
    if not parent.exists():
        return f"directory {shown} does not exist"
    if not parent.is_dir():
        return f"{shown} is not a directory"
    try:
        fd, tmp = _open_temp(path.resolve() if path.is_symlink() else path)
    except OSError as exc:
        return f"cannot create a file in {shown}: {_reason(exc)}"
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(tmp)
    return None


def check_outputs(outputs: Mapping[str, Path | None], inputs: Sequence[Path] = ()) -> None:
    """Check, before a long run, that every output can be written when it ends.

    ``outputs`` maps the option that names each output (e.g. ``"--markdown"``) to its path
    (``None``: not requested). Each path must not be a directory, its parent directory must exist
    and accept a new file (one is created and removed there), and no two outputs, nor an output
    and any of ``inputs``, may be the same file (compared after resolving, so ``a.json`` and
    ``./a.json`` collide). Nothing is written to the outputs themselves.

    Raises :class:`OutputError` listing every problem, each with its option.
    """
    problems: list[str] = []
    seen: list[tuple[str, Path]] = []
    for key, raw in outputs.items():
        if raw is None:
            continue
        path = Path(raw)
        problem = _problem(path)
        if problem is not None:
            problems.append(f"{key} {path}: {problem}")
        for other_key, other in seen:
            if _same(path, other):
                problems.append(f"{key} {path} and {other_key} {other} are the same file")
        for inp in inputs:
            if _same(path, Path(inp)):
                problems.append(f"{key} {path} would overwrite the input {inp}")
        seen.append((key, path))
    if problems:
        raise OutputError("; ".join(problems))
