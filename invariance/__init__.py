"""invariance: prove attention kernels deterministic and batch-invariant, bit for bit.

Quick start::

    import torch, invariance
    report = invariance.check("reference", dtype=torch.float32, device="cpu")
    assert report.passed, report.summary()
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from invariance.backends import available as available_backends
    from invariance.backends import resolve as resolve_backend
    from invariance.batch import AttentionBatch, AttentionResult
    from invariance.check import DEFAULT_HEADS, TOLERANCES, check, replay, reproducer
    from invariance.compare import TensorDiff, compare_bits
    from invariance.perturb import PERTURBATIONS, SCALES, Case, Perturbation, Scale
    from invariance.report import (
        AccuracyResult,
        Environment,
        PerturbationResult,
        Report,
        Violation,
    )
    from invariance.schedule import Chunk, PageLayout, Schedule, Step, materialize, run_schedule
    from invariance.testing import assert_bitwise_equal
    from invariance.workload import HeadConfig, Request, Workload

# NOTE: the public names load lazily (PEP 562) so that importing a light submodule, above all the
# ``pytest11`` entry point ``invariance.pytest_plugin`` that pytest loads in every session, does
# not import torch. ``import invariance; invariance.check(...)`` and ``from invariance import
# check`` work as before.
_LAZY: dict[str, tuple[str, str]] = {
    "available_backends": ("invariance.backends", "available"),
    "resolve_backend": ("invariance.backends", "resolve"),
    "AttentionBatch": ("invariance.batch", "AttentionBatch"),
    "AttentionResult": ("invariance.batch", "AttentionResult"),
    "DEFAULT_HEADS": ("invariance.check", "DEFAULT_HEADS"),
    "TOLERANCES": ("invariance.check", "TOLERANCES"),
    "check": ("invariance.check", "check"),
    "replay": ("invariance.check", "replay"),
    "reproducer": ("invariance.check", "reproducer"),
    "TensorDiff": ("invariance.compare", "TensorDiff"),
    "compare_bits": ("invariance.compare", "compare_bits"),
    "PERTURBATIONS": ("invariance.perturb", "PERTURBATIONS"),
    "SCALES": ("invariance.perturb", "SCALES"),
    "Case": ("invariance.perturb", "Case"),
    "Perturbation": ("invariance.perturb", "Perturbation"),
    "Scale": ("invariance.perturb", "Scale"),
    "AccuracyResult": ("invariance.report", "AccuracyResult"),
    "Environment": ("invariance.report", "Environment"),
    "PerturbationResult": ("invariance.report", "PerturbationResult"),
    "Report": ("invariance.report", "Report"),
    "Violation": ("invariance.report", "Violation"),
    "Chunk": ("invariance.schedule", "Chunk"),
    "PageLayout": ("invariance.schedule", "PageLayout"),
    "Schedule": ("invariance.schedule", "Schedule"),
    "Step": ("invariance.schedule", "Step"),
    "materialize": ("invariance.schedule", "materialize"),
    "run_schedule": ("invariance.schedule", "run_schedule"),
    "assert_bitwise_equal": ("invariance.testing", "assert_bitwise_equal"),
    "HeadConfig": ("invariance.workload", "HeadConfig"),
    "Request": ("invariance.workload", "Request"),
    "Workload": ("invariance.workload", "Workload"),
}


def __getattr__(name: str) -> Any:
    try:
        module, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'invariance' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


class _Package(types.ModuleType):
    """NOTE: importing the submodule ``invariance.check`` makes Python set the package attribute
    ``check`` to that module, which would shadow the lazily loaded function ``check``. This
    module class refuses to let a submodule overwrite a public name of :data:`_LAZY`."""

    def __setattr__(self, name: str, value: Any) -> None:
        if (name in _LAZY and isinstance(value, types.ModuleType)
                and value.__name__ == f"{__name__}.{name}"):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


__version__ = "0.1.0"

__all__ = [
    "DEFAULT_HEADS",
    "PERTURBATIONS",
    "SCALES",
    "TOLERANCES",
    "AccuracyResult",
    "AttentionBatch",
    "AttentionResult",
    "Case",
    "Chunk",
    "Environment",
    "HeadConfig",
    "PageLayout",
    "Perturbation",
    "PerturbationResult",
    "Report",
    "Request",
    "Scale",
    "Schedule",
    "Step",
    "TensorDiff",
    "Violation",
    "Workload",
    "__version__",
    "assert_bitwise_equal",
    "available_backends",
    "check",
    "compare_bits",
    "materialize",
    "replay",
    "reproducer",
    "resolve_backend",
    "run_schedule",
]
