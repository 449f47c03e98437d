"""``check(..., isolate=True)``: each cell in a child process, the check sent to it by value.

The parent pickles what the child needs (the validated :class:`~invariance.spec.CheckSpec`: the
backend callable itself, an instance staying an instance, the :class:`~invariance.perturb.Scale`
with its values, the perturbation, the dtype) and writes it to the child's stdin. Nothing is
rebuilt by name in the child, so the child runs exactly the check the parent validated.

What cannot cross a process boundary is refused before anything runs (:func:`check_sendable`,
called by ``CheckSpec.build``): a lambda, a nested function, an object holding one or an open
resource, a function of an interactive ``__main__`` (no file to import it from). Functions and
classes are pickled by reference; the child imports their modules with the parent's
``sys.path``, and loads a module the parent loaded from a file (a script's ``__main__``, a test
file, ``path/file.py:attr``) from that file; a script's top-level code runs there again unless it
is guarded by ``if __name__ == "__main__":`` (a check started by it in the child is an error that
says so).

The child answers on its stdout (its own prints go to its stderr, which the parent forwards to
its own stderr and keeps the end of): the cell and the accuracy rows, or the error that stopped
it (an import error, an exception, ``KeyboardInterrupt``) as text; a child that dies without
answering (a segfault, a CUDA illegal address, ``os._exit``) is told by its exit status and its
last lines of stderr. Each becomes the cell's error text.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import pickle
import signal
import subprocess
import sys
import threading
import traceback
import types
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from invariance.accuracy import AccuracyAccumulator
    from invariance.perturb import Perturbation
    from invariance.spec import CheckSpec

__all__ = ["ChildResult", "check_sendable", "run_in_child"]

#: Name under which the child loads the parent's ``__main__`` script (not ``"__main__"``, so a
#: guarded script's main block does not run again).
MAIN_ALIAS = "__invariance_main__"
_STDERR_LINES = 20


class _Pickler(pickle.Pickler):
    """A pickler that records the module of every function and class it pickles by reference."""

    def __init__(self, file: io.BytesIO) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.modules: set[str] = set()

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, (types.FunctionType, type)):
            module = getattr(obj, "__module__", None)
            if isinstance(module, str):
                self.modules.add(module)
        return NotImplemented


def _dump(obj: object) -> tuple[bytes, set[str]]:
    buffer = io.BytesIO()
    pickler = _Pickler(buffer)
    pickler.dump(obj)
    return buffer.getvalue(), pickler.modules


def _module_files(modules: set[str]) -> dict[str, str]:
    """The file of each module the child may have to load by path (see the module docstring)."""
    files: dict[str, str] = {}
    for name in modules:
        module = sys.modules.get(name)
        path = getattr(module, "__file__", None) if module is not None else None
        if isinstance(path, str) and path.endswith(".py"):
            files[name] = path
    return files


_WHY = ("a lambda, a nested function (a closure) or an object holding one, or an open "
        "resource, cannot be pickled; define it at module level of an importable module or "
        "file, or run without isolate")


def check_sendable(spec: CheckSpec) -> None:
    """``ValueError`` naming the part of ``spec`` that cannot be sent to a child process, and
    why; returns when all of it can (``CheckSpec.build`` calls this for ``isolate=True``)."""
    parts: list[tuple[str, object]] = [
        (f"backend {spec.backend.name}", spec.backend), (f"scale {spec.scale.name}", spec.scale),
        *((f"perturbation {p.name}", p) for p in spec.perturbations)]
    for what, obj in parts:
        try:
            _, modules = _dump(obj)
        except (pickle.PicklingError, AttributeError, TypeError, RecursionError) as exc:
            raise ValueError(f"isolate: the {what} cannot be sent to a child process: "
                             f"{type(exc).__name__}: {exc} ({_WHY})") from None
        if "__main__" in modules and "__main__" not in _module_files({"__main__"}):
            raise ValueError(
                f"isolate: the {what} is defined in __main__ without a file (an interactive "
                f"session, python -c, a notebook): a child process cannot import it; define it "
                f"in a module or a file, or run without isolate")


# --------------------------------------------------------------------------------------------
# The parent's side
# --------------------------------------------------------------------------------------------

class ChildResult:
    """What a child answered: ``cell`` (a cell as a dict) and ``accuracy`` (the accumulator's
    state), or ``error`` (why the cell did not finish, in words)."""

    def __init__(self, cell: dict[str, Any] | None = None,
                 accuracy: dict[str, Any] | None = None, error: str | None = None) -> None:
        self.cell = cell
        self.accuracy = accuracy
        self.error = error


def _forward(stream: Any, tail: deque[str]) -> None:
    """Copy the child's stderr to ours line by line, keeping the last lines."""
    for raw in iter(stream.readline, b""):
        line = raw.decode("utf-8", "replace")
        tail.append(line.rstrip("\n"))
        with contextlib.suppress(Exception):  # our stderr gone: keep reading the child's
            sys.stderr.write(line)
            sys.stderr.flush()


def run_in_child(spec: CheckSpec, perturbation: Perturbation, dtype_name: str) -> ChildResult:
    """Run one cell of ``spec`` in a child process (module docstring). An interrupt of the
    parent (``KeyboardInterrupt``, a signal turned into one) kills the child and propagates."""
    from dataclasses import replace

    child_spec = replace(spec, isolate=False)
    blob, modules = _dump((child_spec, perturbation, dtype_name))
    header = pickle.dumps((list(sys.path), _module_files(modules | {"__main__"})))
    # The child finds this very invariance first, wherever the parent found it (a path the
    # parent added to sys.path at run time included); the rest of sys.path follows on stdin.
    here = str(Path(__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "invariance.isolate"], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    tail: deque[str] = deque(maxlen=_STDERR_LINES)
    reader = threading.Thread(target=_forward, args=(proc.stderr, tail), daemon=True)
    reader.start()
    stdin, stdout = proc.stdin, proc.stdout
    try:
        if stdin is None or stdout is None:  # pragma: no cover - Popen made both pipes
            raise RuntimeError("isolate: no pipe to the child process")
        with contextlib.suppress(BrokenPipeError):  # a child that died at start: told below
            stdin.write(header + blob)
            stdin.close()
        answer = stdout.read()
        code = proc.wait()
    except BaseException:
        with contextlib.suppress(OSError):
            proc.kill()
        proc.wait()
        raise
    finally:
        reader.join(timeout=5)
    if answer:
        try:
            kind, *rest = pickle.loads(answer)
        except Exception as exc:  # a truncated answer: the child died while writing it
            return ChildResult(error=_died(code, tail, f"its answer was unreadable ({exc})"))
        if kind == "ok":
            return ChildResult(cell=rest[0], accuracy=rest[1])
        return ChildResult(error=str(rest[0]))
    return ChildResult(error=_died(code, tail))


def _died(code: int, tail: deque[str], detail: str = "") -> str:
    if code < 0:
        try:
            how = f"signal {signal.Signals(-code).name}"
        except ValueError:
            how = f"signal {-code}"
    else:
        how = f"exit status {code}"
    text = f"the backend's process died ({how}) before the cell finished (--isolate)"
    if detail:
        text += f"; {detail}"
    last = [line for line in tail if line.strip()]
    if last:
        text += "; its last stderr: " + " | ".join(last[-5:])
    return text


# --------------------------------------------------------------------------------------------
# The child's side: python -m invariance.isolate
# --------------------------------------------------------------------------------------------

def _load_file(name: str, path: str) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


@contextlib.contextmanager
def _importing(path: str) -> Iterator[None]:
    """While the child imports the parent's file ``path``, a check started by its top-level
    code is an error that says why (runner.run_spec reads the flag)."""
    from invariance import runner

    runner.IMPORTING_FOR_CHILD = path
    try:
        yield
    finally:
        runner.IMPORTING_FOR_CHILD = None


class _Unpickler(pickle.Unpickler):
    """Finds a module by name first; failing that (or for the parent's ``__main__``), loads it
    from the file the parent had it from."""

    def __init__(self, file: Any, files: dict[str, str]) -> None:
        super().__init__(file)
        self.files = files

    def find_class(self, module: str, name: str) -> Any:
        if module != "__main__":
            try:
                return super().find_class(module, name)
            except (ImportError, AttributeError):
                if module not in self.files:
                    raise
        path = self.files.get(module)
        if path is None:
            raise ImportError(f"module {module!r} of {name!r} cannot be imported here")
        alias = MAIN_ALIAS if module == "__main__" else module
        loaded = sys.modules.get(alias)
        if loaded is None or getattr(loaded, "__file__", None) != path:
            with _importing(path):
                loaded = _load_file(alias, path)
        obj: Any = loaded
        for part in name.split("."):
            obj = getattr(obj, part)
        return obj


def _child(stdin: Any, answer: Any) -> int:
    from invariance.accuracy import AccuracyAccumulator
    from invariance.runner import _Counter, _run_cell
    from invariance.workload import DTYPES

    stage = "loading the check"
    try:
        parent_path, files = pickle.load(stdin)
        sys.path[:] = list(dict.fromkeys([*parent_path, *sys.path]))
        spec, perturbation, dtype_name = _Unpickler(stdin, files).load()
        stage = "running the cell"
        dt = DTYPES[dtype_name]
        acc: AccuracyAccumulator = AccuracyAccumulator(dt)
        cell = _run_cell(spec, perturbation, dt, acc, _Counter(0, None))
        state = {k: v for k, v in vars(acc).items() if k != "dtype"}
        pickle.dump(("ok", cell.to_dict(), state), answer)
        return 0
    except BaseException as exc:
        frames = traceback.extract_tb(exc.__traceback__)[-2:]
        where = " <- ".join(f"{Path(f.filename).name}:{f.lineno} in {f.name}"
                            for f in reversed(frames))
        text = f"the backend's process stopped while {stage}: {type(exc).__name__}: {exc}"
        if where:
            text += f" [{where}]"
        pickle.dump(("error", text + " (--isolate)"), answer)
        return 130 if isinstance(exc, KeyboardInterrupt) else 1


def main() -> int:
    """The child: read the check from stdin, answer on stdout; prints of the backend go to
    stderr (fd 1 is pointed at stderr once the answer channel is saved)."""
    answer = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    try:
        return _child(sys.stdin.buffer, answer)
    finally:
        with contextlib.suppress(OSError):
            answer.close()


if __name__ == "__main__":
    raise SystemExit(main())
