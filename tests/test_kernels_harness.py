"""The Triton kernels through the harness (``invariance.check``), on CPU in the interpreter.

The small CPU scale has requests of 4-96 tokens and a 1100-token neighbour, so the tests use a
64-token split (several splits per row, exercising the partial/merge path) next to the default
split size. GPU evidence at production shapes lives in ``reports/``.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import invariance
from invariance.backends.kernels import KernelsBackend

# A split of 64 tokens is a multiple of float32's BLOCK_N at every head dim (these checks run
# float32) and gives rows of the small scale up to 18 splits.
SPLIT = 64

PLANS = [
    pytest.param(KernelsBackend(split_size=SPLIT, kernel_plan="fused"), id="fused-split64"),
    pytest.param(KernelsBackend(split_size=SPLIT, kernel_plan="split"), id="split-split64"),
]


# The interpreter is slow: a subset of perturbations that exercises mixed batches, prefill vs
# decode, page placement, padding and shared prefix pages, at one dtype. The full default check
# of every perturbation at three dtypes runs on the GPU (reports/<gpu>/).
CPU_PERTURBATIONS = ["mixed", "prefill_vs_decode", "paging", "padding", "prefix_sharing"]


@pytest.mark.parametrize("backend", PLANS)
@pytest.mark.slow
def test_invariant_plans_pass(backend: KernelsBackend) -> None:
    report = invariance.check(backend, dtype="float32", device="cpu",
                              perturbations=CPU_PERTURBATIONS)
    assert report.passed, _why(report)
    assert report.accuracy[0].rows > 50


def test_registered_backend_passes_with_the_default_split() -> None:
    report = invariance.check("kernels", dtype="bfloat16", device="cpu",
                              perturbations=["mixed", "prefill_vs_decode"])
    assert report.passed, _why(report)


@pytest.mark.slow
def test_heuristic_control_is_caught() -> None:
    report = invariance.check("kernels-heuristic", dtype="float32", device="cpu",
                              perturbations=["neighbors"], shrink=False)
    assert report.accurate, _why(report)
    failed = {r.perturbation for r in report.failed_cells()}
    assert failed == {"neighbors"}, _why(report)


@pytest.mark.slow
def test_cpu_interpreter_switches_on_by_itself() -> None:
    """Without TRITON_INTERPRET, listing backends and checking the kernels on CPU still works
    (nothing imports triton before the adapter switches the interpreter on); a fresh process,
    since the interpreter mode is fixed when triton is first imported."""
    code = (
        "import sys, invariance\n"
        "invariance.available_backends()\n"
        "r = invariance.check('kernels', device='cpu', perturbations=['repeat'])\n"
        "assert 'triton' in sys.modules\n"
        "print(r.summary())\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("PASSED"), done.stdout


def _why(report: invariance.Report) -> str:
    lines = [report.summary()]
    for r in report.failed_cells():
        lines.append(f"{r.perturbation}: {r.error or ''}")
        lines += [f"  {d.summary()}" for v in r.violations[:1] for d in v.diffs]
    lines += [str(a) for a in report.accuracy if not a.passed]
    return "\n".join(lines)


def test_cpu_checks_split_finer_as_the_capabilities_declare(monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    """On CPU tensors the default split is CPU_SPLIT_TOKENS, the capabilities say so, and the
    check sizes its rows from it; an explicit split size is kept on every device."""
    import kernels
    from invariance.backends.kernels import CPU_SPLIT_TOKENS

    seen: list[object] = []

    def record(*args: object, split_size: object, **kwargs: object) -> object:
        seen.append(split_size)
        raise RuntimeError("recorded")

    monkeypatch.setattr(kernels, "unified_attention", record)
    wl = invariance.Workload((invariance.Request(0, 5),))
    batch = invariance.materialize(wl, invariance.Step((invariance.Chunk(0, 4, 5),)),
                                   invariance.PageLayout(), "cpu")
    for backend in (KernelsBackend(), KernelsBackend(split_size=1024),
                    KernelsBackend(lead_split_size=512)):
        with pytest.raises(RuntimeError, match="recorded"):
            backend(batch)
    assert seen == [CPU_SPLIT_TOKENS, 1024, 512]
    caps = KernelsBackend().capabilities
    assert caps.split_on("cpu") == CPU_SPLIT_TOKENS
    assert caps.split_on("cuda") == caps.split_tokens == kernels.DEFAULT_SPLIT_SIZE
    cpu = invariance.CheckSpec.build("kernels", device="cpu").scale
    assert cpu.split == CPU_SPLIT_TOKENS and cpu.long >= 2.5 * CPU_SPLIT_TOKENS
    gpu_split = invariance.CheckSpec.build("kernels:split_size=1024", device="cpu").scale
    assert gpu_split.split == 1024 and gpu_split.long == 1024 * 5 // 2 + 3
