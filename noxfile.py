"""nox sessions: the test suite at each dtype, lint, typecheck; GPU tests and benchmarks on demand.

``nox -l`` lists them. The dtype under test reaches the suite through ``INVARIANCE_DTYPE``.
"""

from __future__ import annotations

import os

import nox

nox.options.sessions = ["tests", "lint", "typecheck"]
nox.options.reuse_existing_virtualenvs = True

DTYPES = ["float16", "bfloat16", "float32"]
# On a CPU-only machine pin the CPU build of torch (a plain `torch` pulls a multi-GB CUDA build).
TORCH = os.environ.get("INVARIANCE_TORCH_SPEC", "torch==2.13.0")


def _install(session: nox.Session) -> None:
    session.install(TORCH)
    session.install("-e", ".[dev]")


@nox.session
@nox.parametrize("dtype", DTYPES, ids=DTYPES)
def tests(session: nox.Session, dtype: str) -> None:
    """Run the test suite (CPU, Triton interpreter) at one dtype."""
    _install(session)
    session.run("pytest", *session.posargs, env={"INVARIANCE_DTYPE": dtype})


@nox.session
def lint(session: nox.Session) -> None:
    """ruff over the whole tree."""
    session.install("ruff>=0.6")
    session.run("ruff", "check", ".")


@nox.session
def typecheck(session: nox.Session) -> None:
    """mypy, strict for the invariance and kernels packages."""
    _install(session)
    session.run("mypy")


@nox.session(default=False, venv_backend="none")
def gpu(session: nox.Session) -> None:
    """GPU tests and the large-scale invariance suite (needs CUDA; uses the current Python)."""
    for dtype in ("float16", "bfloat16"):
        session.run("python", "-m", "pytest", "-m", "gpu", *session.posargs,
                    env={"INVARIANCE_DTYPE": dtype})


@nox.session(default=False, venv_backend="none")
def bench(session: nox.Session) -> None:
    """Attention benchmarks on the GPU (writes Markdown + JSON under reports/)."""
    session.run("python", "benchmarks/attention.py", "--out", "reports", *session.posargs)
