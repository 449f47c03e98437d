"""Shared test set-up.

- Without CUDA, Triton kernels run in the Triton interpreter: ``TRITON_INTERPRET=1`` must be set
  before triton is first imported (``triton.jit`` reads it when a kernel is decorated), so it is
  set here, at conftest import time.
- Tests whose result depends on the dtype take the ``dtype`` fixture: it runs them once per
  dtype (float16, bfloat16, float32) in one pytest run; ``INVARIANCE_DTYPE=float16`` (or a
  comma list) narrows it. Tests that do not depend on the dtype do not take it and run once.
"""

from __future__ import annotations

import os
import sys

if "TRITON_INTERPRET" not in os.environ:
    import torch

    if not torch.cuda.is_available():
        if "triton" in sys.modules:  # pragma: no cover - depends on plugin import order
            raise RuntimeError(
                "triton was imported before tests/conftest.py could set TRITON_INTERPRET=1; "
                "set it in the environment"
            )
        os.environ["TRITON_INTERPRET"] = "1"

import pytest
import torch

from _invariance_options import DTYPE_NAMES, dtype_names

# NOTE: one intra-op thread per test process. The suite runs in two xdist workers on two cores;
# torch's default (a thread per core in each worker) oversubscribes the cores and its spinning
# threads made the CPU checks 20-30x slower.
torch.set_num_threads(1)

def dtypes_under_test() -> list[str]:
    """The dtypes of this run: ``INVARIANCE_DTYPE`` (a name or comma list), else all."""
    value = os.environ.get("INVARIANCE_DTYPE", "").strip()
    if not value:
        return list(DTYPE_NAMES)
    try:
        return dtype_names(value.split(","), what="INVARIANCE_DTYPE")
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None


@pytest.fixture(scope="session", params=dtypes_under_test())
def dtype(request: pytest.FixtureRequest) -> torch.dtype:
    """The dtype under test (a parameter: one run per dtype)."""
    return getattr(torch, request.param)  # type: ignore[no-any-return]


@pytest.fixture(scope="session")
def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--mutation-seeds", type=int, default=2, metavar="N",
                     help="seeds 0..N-1 of the mutation sweep (tests/test_mutations.py)")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "mutation_seed" in metafunc.fixturenames:
        n = metafunc.config.getoption("--mutation-seeds")
        metafunc.parametrize("mutation_seed", range(n), ids=[f"seed{i}" for i in range(n)])
