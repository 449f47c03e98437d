"""invariance: prove attention kernels deterministic and batch-invariant, bit for bit.

Quick start::

    import invariance
    report = invariance.check("reference", device="cpu")
    assert report.passed, report.summary()

The layers (ARCHITECTURE.md): requests and their content (``workload``) -> schedules of steps
(``schedule``) -> batches (``batch``) -> a backend -> per-token bits (``compare``) -> a report
(``report``). ``perturb`` generates pairs of schedules, ``runner`` drives them, ``spec`` validates
the request, ``render`` and ``cli`` are faces.
"""

from __future__ import annotations

from invariance.accuracy import TOLERANCES, measure_accuracy
from invariance.backends import Capabilities
from invariance.backends import available as available_backends
from invariance.backends import resolve as resolve_backend
from invariance.batch import AttentionBatch, AttentionResult
from invariance.compare import (
    CaseComparison,
    TensorDiff,
    compare_bits,
    compare_outputs,
    compare_runs,
)
from invariance.features import Features
from invariance.model import ModelReport, check_model, replay_model
from invariance.outputs import OutputError
from invariance.perturb import PERTURBATIONS, SCALES, Case, Perturbation, Scale
from invariance.replay import (
    ScheduleMismatch,
    case_from_dict,
    case_to_dict,
    load_case,
    replay,
    reproducer,
)
from invariance.report import (
    AccuracyResult,
    Environment,
    PerturbationResult,
    Report,
    ReportError,
    Violation,
)
from invariance.runner import CheckInterrupted, check, run_spec
from invariance.schedule import Chunk, PageLayout, Schedule, Step, materialize, run_schedule
from invariance.spec import DEFAULT_HEADS, CheckSpec
from invariance.testing import assert_bitwise_equal
from invariance.workload import HeadConfig, Request, Workload

__version__ = "0.2.0"

__all__ = [
    "DEFAULT_HEADS",
    "PERTURBATIONS",
    "SCALES",
    "TOLERANCES",
    "AccuracyResult",
    "AttentionBatch",
    "AttentionResult",
    "Capabilities",
    "Case",
    "CaseComparison",
    "CheckInterrupted",
    "CheckSpec",
    "Chunk",
    "Environment",
    "Features",
    "HeadConfig",
    "ModelReport",
    "OutputError",
    "PageLayout",
    "Perturbation",
    "PerturbationResult",
    "Report",
    "ReportError",
    "Request",
    "Scale",
    "Schedule",
    "ScheduleMismatch",
    "Step",
    "TensorDiff",
    "Violation",
    "Workload",
    "__version__",
    "assert_bitwise_equal",
    "available_backends",
    "case_from_dict",
    "case_to_dict",
    "check",
    "check_model",
    "compare_bits",
    "compare_outputs",
    "compare_runs",
    "load_case",
    "materialize",
    "measure_accuracy",
    "replay",
    "replay_model",
    "reproducer",
    "resolve_backend",
    "run_schedule",
    "run_spec",
]
