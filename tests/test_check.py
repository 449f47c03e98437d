"""End to end through ``invariance.check``: the oracle passes, controls are caught."""

from __future__ import annotations

import dataclasses
import random

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
    # Shrunk: described from the case shown (the target alone vs next to fewer requests than
    # the case's calls of at least dense_batch held). How few depends on the CPU: at half
    # precision the output's rounding can hide a chunk change, and where the control's float32
    # sums round alike for two chunk sizes (its vectorised reductions differ by instruction
    # set) the LSE does too: 8 requests on one machine, 10 on another.
    assert v.shrunk and "alone" in v.schedule_a and "one call of " in v.schedule_b
    steps = v.case_data["b"]["steps"]
    assert len(steps) == 1 and len(steps[0]) < invariance.SCALES["small"].dense_batch
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


def _decode_rows(batch: AttentionBatch) -> torch.Tensor:
    """Per query row of the batch: whether its request is a decode (one query token)."""
    return torch.tensor([n == 1 for n in batch.q_lens() for _ in range(n)], dtype=torch.bool)


def _one_ulp_up(lse: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    up = torch.nextafter(lse, torch.full_like(lse, float("inf")))
    return torch.where(rows[:, None], up, lse)


def test_a_neighbour_that_differs_step_to_step_is_batch_variant_and_shrunk() -> None:
    """Deterministic, batch-variant: decode rows move 1 ULP when the call holds an even number
    of query tokens. chunked_prefill's decode neighbour is repeated in every step of schedule
    b (never computed by a): only its occurrences, compared with each other, show it."""
    def parity(batch: AttentionBatch) -> tuple[torch.Tensor, torch.Tensor]:
        ref = reference_backend(batch)
        rows = _decode_rows(batch) & (batch.num_tokens % 2 == 0)
        return ref.out, _one_ulp_up(ref.lse, rows)

    report = invariance.check(parity, device="cpu", perturbations=["chunked_prefill"])
    cell = report.results[0]
    assert cell.status == "failed" and cell.coverage["repeated_rows"] > 0
    assert {v.classification for v in cell.violations} == {"batch-variant"}
    v = cell.violations[0]
    spec = invariance.CheckSpec.build(parity, device="cpu")
    case = list(PERTURBATIONS["chunked_prefill"].cases(
        scale=spec.scale, heads=spec.heads, dtype=torch.float32, seed=0, budget=1))[v.case]
    # The request shown is the neighbour, which schedule a never computes.
    assert all(c.request_id != v.request_id for st in case.a.steps for c in st.chunks)
    # Shrunk: the two steps that computed its row, each a schedule, then their neighbours cut.
    assert v.shrunk and v.differing_tokens == 1 and v.reproducer.count("Step(") == 2


def test_a_nondeterministic_backend_is_still_told_apart() -> None:
    """Negative control of the per-occurrence re-run: noise that changes from run to run."""
    rng = random.Random(0)

    def noisy(batch: AttentionBatch) -> tuple[torch.Tensor, torch.Tensor]:
        ref = reference_backend(batch)
        rows = torch.tensor([rng.random() < 0.5 for _ in range(batch.num_tokens)])
        return ref.out, _one_ulp_up(ref.lse, rows)

    report = invariance.check(noisy, device="cpu", perturbations=["chunked_prefill"])
    assert {v.classification for v in report.violations} == {"nondeterministic"}
    assert not any(v.shrunk for v in report.violations)


def test_identical_requests_must_get_identical_bits() -> None:
    """A request whose block-table row repeats an earlier one of the call (one prompt sampled
    again, on the prompt's pages) gets its LSE moved 1 ULP: only rows of one origin compared
    with each other within a call catch it (lockstep)."""
    def second_copy(batch: AttentionBatch) -> tuple[torch.Tensor, torch.Tensor]:
        ref = reference_backend(batch)
        seen: set[tuple[int, ...]] = set()
        rows = []
        for b, n in enumerate(batch.q_lens()):
            key = tuple(batch.block_table[b].tolist())
            rows += [key in seen] * n
            seen.add(key)
        return ref.out, _one_ulp_up(ref.lse, torch.tensor(rows, dtype=torch.bool))

    report = invariance.check(second_copy, device="cpu", perturbations=["lockstep"])
    v = report.cell("lockstep", "float32").violations[0]
    assert v.classification == "batch-variant" and v.shrunk
    assert "computed twice in schedule" in v.note
    passing = invariance.check("reference", device="cpu", perturbations=["lockstep"])
    assert passing.passed  # negative control: identical requests, identical bits
