"""nox sessions. ``nox`` runs the default ones: ``tests`` (the suite but its slow tests, the
dtype matrix inside it where a test depends on the dtype), ``mutations`` (the planted-defect
sweep at two seeds), ``lint`` and ``typecheck``. ``nox -l`` lists all of them; CI also runs
``slow`` and the sweep at 20 seeds.

Every session runs in the environment nox itself runs in (``venv_backend="none"``): install the
project once with README's first command, and no session builds another multi-GB environment.
Versions CI uses are pinned in ``constraints.txt``; the dtypes come from ``_invariance_options``.
"""

from __future__ import annotations

import nox

from _invariance_options import DTYPE_NAMES

nox.options.sessions = ["tests", "mutations", "lint", "typecheck"]
nox.options.default_venv_backend = "none"

#: Seeds of the mutation sweep: the quick default and what CI runs.
QUICK_SEEDS, CI_SEEDS = 2, 20


@nox.session
def tests(session: nox.Session) -> None:
    """The test suite on CPU (kernels in the Triton interpreter), every dtype, two workers; the
    tests marked slow run in ``nox -s slow`` (CI runs both)."""
    session.run("python", "-m", "pytest", "-n", "2", "-m", "not mutation and not slow",
                *session.posargs)


@nox.session(default=False)
def slow(session: nox.Session) -> None:
    """The slow tests: the tools run as scripts, whole checks of the kernels through the
    interpreter, the kernels' bit-neutral settings compared pairwise (CI runs them)."""
    session.run("python", "-m", "pytest", "-n", "2", "-m", "slow and not mutation",
                *session.posargs)


@nox.session
def mutations(session: nox.Session) -> None:
    """Planted batch-variant defects must all be caught, invariant variants must all pass
    (``nox -s mutations -- 20`` sweeps 20 seeds, as CI does)."""
    seeds = session.posargs[0] if session.posargs else str(QUICK_SEEDS)
    session.run("python", "-m", "pytest", "-n", "2", "-m", "mutation", "--mutation-seeds", seeds,
                "tests/test_mutations.py")


@nox.session
def lint(session: nox.Session) -> None:
    """ruff over the whole tree."""
    session.run("ruff", "check", ".")


@nox.session
def typecheck(session: nox.Session) -> None:
    """mypy, strict for the invariance and kernels packages."""
    session.run("mypy")


@nox.session(default=False)
@nox.parametrize("dtype", DTYPE_NAMES, ids=list(DTYPE_NAMES))
def gpu(session: nox.Session, dtype: str) -> None:
    """GPU tests at one dtype (needs CUDA)."""
    session.run("python", "-m", "pytest", "-m", "gpu", *session.posargs,
                env={"INVARIANCE_DTYPE": dtype})


@nox.session(default=False)
def bench(session: nox.Session) -> None:
    """``invariance bench`` of the kernels against FlashInfer's fastest variant on the default
    and shapes grids (needs a GPU and FlashInfer; extra arguments are passed on)."""
    session.run("invariance", "bench", "--grid", "default", "--grid", "shapes", "--backend",
                "kernels", "--backend", "kernels-heuristic", "--baseline", "flashinfer-best",
                *session.posargs)


@nox.session(default=False)
def evidence(session: nox.Session) -> None:
    """Regenerate this GPU's evidence set, step by step (``nox -s evidence -- check bench``;
    benchmarks/evidence.sh lists the steps)."""
    session.run("sh", "benchmarks/evidence.sh", *(session.posargs or ["check"]),
                external=True)
