"""Shared test set-up.

- Without CUDA, Triton kernels run in the Triton interpreter: ``TRITON_INTERPRET=1`` must be set
  before triton is first imported (``triton.jit`` reads it when a kernel is decorated), so it is
  set here, at conftest import time.
- The dtype under test comes from ``INVARIANCE_DTYPE`` (float16 | bfloat16 | float32; default
  float32) so that one suite serves the three nox sessions.
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

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def dtype_under_test() -> torch.dtype:
    name = os.environ.get("INVARIANCE_DTYPE", "float32")
    if name not in DTYPES:
        raise pytest.UsageError(f"INVARIANCE_DTYPE: expected one of {sorted(DTYPES)}, got {name}")
    return DTYPES[name]


@pytest.fixture(scope="session")
def dtype() -> torch.dtype:
    """The dtype under test, from ``INVARIANCE_DTYPE``."""
    return dtype_under_test()


@pytest.fixture(scope="session")
def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")
