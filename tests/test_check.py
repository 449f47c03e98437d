"""End to end through ``invariance.check``: the oracle passes, controls are caught."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import invariance
from invariance import PERTURBATIONS, AttentionBatch, Report
from invariance.backends.reference import reference_backend
from invariance.backends.torch_backends import batch_variant_backend

CPU_PERTURBATIONS = sorted(p for p, v in PERTURBATIONS.items() if not v.requires_cuda)


def test_reference_passes_every_perturbation(dtype: torch.dtype) -> None:
    report = invariance.check("reference", dtype=dtype, device="cpu", budget=2)
    assert report.passed, report.summary()
    assert {r.perturbation for r in report.results if r.status == "passed"} == set(
        CPU_PERTURBATIONS)
    assert report.cell("cuda_graph", report.dtypes[0]).status == "skipped"
    assert all(r.cases == 2 * PERTURBATIONS[r.perturbation].cases_per_budget
               for r in report.results if r.status == "passed")
    assert all(r.compared_tokens > 0 for r in report.results if r.status == "passed")
    acc = report.accuracy[0]
    # The oracle's only error is the rounding of its output to the dtype: at most u * max|v|,
    # a quarter of the bound's C_OUT * u * max|v|.
    assert acc.passed and acc.rows > 100 and acc.worst_ratio <= 0.25


def test_batch_variant_control_is_caught(dtype: torch.dtype) -> None:
    report = invariance.check("torch-batch-variant", dtype=dtype, device="cpu")
    assert not report.passed and report.accurate  # wrong only in its invariance
    failed = {r.perturbation for r in report.failed_cells()}
    assert {"batch_size", "neighbors"} <= failed
    assert "repeat" not in failed  # it is deterministic, only batch-variant
    v = report.cell("batch_size", report.dtypes[0]).violations[0]
    # Shrunk: described from the case shown (the target alone vs next to one other request).
    assert v.shrunk and "alone" in v.schedule_a and "one call of 2 requests" in v.schedule_b
    assert v.differing_tokens > 0 and v.max_ulp > 0
    assert any(d.name == "lse" for d in v.diffs)


def test_reproducer_replays_the_violation() -> None:
    report = invariance.check("torch-batch-variant", device="cpu", perturbations=["batch_size"])
    v = report.violations[0]
    assert v.shrunk, "the first violation of a cell is shrunk"
    namespace: dict[str, object] = {}
    try:
        exec(v.reproducer, namespace)
    except AssertionError as exc:
        assert "schedules disagree" in str(exc) and "ULP" in str(exc)
    else:
        raise AssertionError("the reproducer did not reproduce the violation")
    # The shrunk case is small: the target plus at most a couple of neighbours.
    assert v.reproducer.count("Chunk(") <= 4


def test_zeros_backend_is_invariant_but_inaccurate(dtype: torch.dtype) -> None:
    def zeros(batch: AttentionBatch) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.zeros_like(batch.q), torch.zeros(batch.q.shape[:2])

    report = invariance.check(zeros, dtype=dtype, device="cpu",
                              perturbations=["batch_size", "mixed"])
    assert report.invariant and not report.accurate and not report.passed
    assert report.accuracy[0].worst_ratio > 10


def test_plain_function_backend_needs_no_registration() -> None:
    calls = []

    def mine(batch: AttentionBatch) -> object:
        calls.append(batch.batch_size)
        return reference_backend(batch)

    report = invariance.check(mine, device="cpu", perturbations="position,order")
    assert report.passed and calls
    assert report.backend.endswith("mine")


def test_backend_errors_become_error_cells() -> None:
    def broken(batch: AttentionBatch) -> object:
        raise RuntimeError("kernel exploded")

    report = invariance.check(broken, device="cpu", perturbations=["repeat"])
    cell = report.results[0]
    assert cell.status == "error" and "kernel exploded" in (cell.error or "")
    assert not report.passed


def test_nan_output_fails_accuracy() -> None:
    def nans(batch: AttentionBatch) -> object:
        out, lse = batch_variant_backend(batch).out, reference_backend(batch).lse
        return torch.full_like(out, float("nan")), lse

    report = invariance.check(nans, device="cpu", perturbations=["repeat"])
    assert report.accuracy[0].nan_rows > 0 and not report.accurate


def test_same_seed_same_cases_and_json_round_trip(tmp_path: object) -> None:
    a = invariance.check("torch-batch-variant", device="cpu", perturbations=["neighbors"],
                         seed=3, dtype=["float32", "float16"])
    b = invariance.check("torch-batch-variant", device="cpu", perturbations=["neighbors"],
                         seed=3, dtype=["float32", "float16"])
    assert [r.points for r in a.results] == [r.points for r in b.results]
    text = a.to_json()
    back = Report.from_json(text=text)
    assert back.to_dict() == a.to_dict()
    assert back.violations[0].diffs[0].first_index == a.violations[0].diffs[0].first_index


def test_argument_errors() -> None:
    with pytest.raises(ValueError, match="unknown name 'nope'"):
        invariance.check("nope", device="cpu")
    with pytest.raises(ValueError, match="perturbation: unknown name 'sideways'"):
        invariance.check("reference", device="cpu", perturbations=["sideways"])
    with pytest.raises(ValueError, match="budget"):
        invariance.check("reference", device="cpu", budget=0)
    with pytest.raises(ValueError, match="dtype"):
        invariance.check("reference", device="cpu", dtype="float64")
    with pytest.raises(ValueError, match="scale"):
        invariance.check("reference", device="cpu", scale="huge")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA was requested"):
            invariance.check("reference", device="cuda")


def test_asking_for_what_the_device_cannot_do_is_a_usage_error() -> None:
    with pytest.raises(ValueError, match="perturbations: cuda_graph needs a CUDA device"):
        invariance.check("reference", device="cpu", perturbations=["cuda_graph"])


def test_nothing_run_is_neither_passed_nor_inaccurate() -> None:
    # Under "all" on CPU, cuda_graph is a visible skip; a spec of only it runs nothing.
    spec = invariance.CheckSpec.build("reference", device="cpu")
    spec = dataclasses.replace(spec, perturbations=(invariance.PERTURBATIONS["cuda_graph"],))
    report = invariance.run_spec(spec)
    assert report.results[0].status == "skipped"
    assert report.results[0].error == "needs a CUDA device"
    assert report.accuracy == [] and not report.passed
    assert "accurate" not in report.summary() and "INACCURATE" not in report.summary()
