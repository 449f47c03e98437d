"""Faster device-function calls under Triton's CPU interpreter (``TRITON_INTERPRET=1``).

The interpreter re-patches ``triton.language`` (an ``inspect.getmembers`` walk of ``tl``,
``tl.tensor`` and ``tl.math``) on every call of a ``@triton.jit`` helper from inside a kernel,
although the launch has already patched it and restores it when the launch ends. The kernels
call a few dozen helpers per program: without the shortcut a CPU check of the kernels took
136 s instead of 75 s (CHANGELOG).
:func:`install` makes a nested call skip the walk when the running launch has patched every
language module the helper's globals see; the launch's own patch and its restore are unchanged,
and so are the values computed (the walk only re-installs the same dispatch). A launch is told
from a helper's call by the launcher itself (a wrapper marks the running launch, per thread).

It touches private interpreter names: when they are missing (another Triton), or with
``KERNELS_INTERPRETER_PATCH=0``, nothing is installed and the interpreter runs as shipped.
"""

from __future__ import annotations

import inspect
import os
import threading
from typing import Any

__all__: list[str] = []

_installed = False
_lock = threading.Lock()


_OUTSIDE = object()  # no launch running in this thread


class _NoScope:
    """What a skipped patch returns: nothing to restore (nested calls never restore theirs)."""

    def restore(self) -> None:
        pass


def _langs(fn: Any, tl: Any) -> frozenset[int]:
    return frozenset(id(v) for v in fn.__globals__.values()
                     if inspect.ismodule(v) and (v is tl or v is tl.core))


def install() -> None:
    """Install the shortcut once per process (a no-op when the interpreter lacks the name it
    wraps, or with ``KERNELS_INTERPRETER_PATCH=0``)."""
    global _installed
    if os.environ.get("KERNELS_INTERPRETER_PATCH", "1") == "0":
        return
    with _lock:
        if _installed:
            return
        _installed = True
        try:
            from triton.runtime import interpreter
        except ImportError:
            return
        original = getattr(interpreter, "_patch_lang", None)
        executor = getattr(interpreter, "GridExecutor", None)
        tl = getattr(interpreter, "tl", None)
        if original is None or executor is None or tl is None:
            return
        launch = executor.__call__
        # Per thread: the language modules patched since the running launch began (None
        # before its own patch), absent outside a launch.
        local = threading.local()

        def run_launch(self: Any, *args: Any, **kwargs: Any) -> Any:
            outer = getattr(local, "langs", _OUTSIDE)
            local.langs = None
            try:
                return launch(self, *args, **kwargs)
            finally:
                local.langs = outer

        def patch_lang(fn: Any) -> Any:
            done: Any = getattr(local, "langs", _OUTSIDE)
            langs = _langs(fn, tl)
            if done is _OUTSIDE:  # not inside a launch: as shipped
                return original(fn)
            if done is None:  # the launch's own patch, which it restores when it ends
                local.langs = langs
                return original(fn)
            if langs and langs <= done:  # a helper whose languages this launch patched already
                return _NoScope()
            # As shipped: patched, and never restored by the helper (triton.language's own
            # helpers, such as tl.sum, see tl.core): patched for the rest of the launch.
            scope = original(fn)
            local.langs = done | langs
            return scope

        executor.__call__ = run_launch
        interpreter._patch_lang = patch_lang
