"""Faster device-function calls under Triton's CPU interpreter (``TRITON_INTERPRET=1``).

The interpreter re-patches ``triton.language`` (an ``inspect.getmembers`` walk of ``tl``,
``tl.tensor`` and ``tl.math``) on every call of a ``@triton.jit`` helper from inside a kernel,
although the launch has already patched it and restores it when the launch ends. The kernels
call a few dozen helpers per program, so that walk was about a third of a CPU check's time.
:func:`install` makes a nested call skip the walk when the running launch has patched every
language module the helper's globals see; the launch's own patch and its restore are unchanged,
and so are the values computed (the walk only re-installs the same dispatch).

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
        tl = getattr(interpreter, "tl", None)
        if original is None or tl is None:
            return
        # The language modules patched since the running launch began. A launch is the only
        # caller of the patch while none runs; a helper's call is one while a launch runs.
        active: list[frozenset[int]] = []

        class _LaunchScope:
            def __init__(self, inner: Any) -> None:
                self.inner = inner

            def restore(self) -> None:
                active.clear()
                self.inner.restore()

        def patch_lang(fn: Any) -> Any:
            langs = _langs(fn, tl)
            if not active:  # a launch: patch, and remember what until it restores
                scope = original(fn)
                active.append(langs)
                return _LaunchScope(scope)
            if langs <= active[0]:  # a helper whose languages this launch patched already
                return _NoScope()
            # As shipped: patched, and never restored by the helper (triton.language's own
            # helpers, such as tl.sum, see tl.core): patched for the rest of the launch.
            scope = original(fn)
            active[0] = active[0] | langs
            return scope

        interpreter._patch_lang = patch_lang
