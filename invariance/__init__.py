"""invariance: prove attention kernels deterministic and batch-invariant, bit for bit.

Quick start::

    import torch, invariance
    report = invariance.check("reference", dtype=torch.float32, device="cpu")
    assert report.passed, report.summary()
"""

from __future__ import annotations

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
