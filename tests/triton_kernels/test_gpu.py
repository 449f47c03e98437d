"""CUDA-only behaviour, through the harness's schedules: CUDA-graph capture and replay (value
checks are skipped while capturing) and a device allocator full of NaN give the eager bits.
Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch

import invariance
from invariance import Chunk, HeadConfig, PageLayout, Request, Schedule, Step, Workload
from invariance.backends.kernels import KernelsBackend

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

# A decode row, a prefill chunk and a whole prefill, longer than the default split size.
STEP = Step((Chunk(0, 650, 700), Chunk(1, 89, 90), Chunk(2, 0, 1300)))
WORKLOAD = (Request(0, 700), Request(1, 90), Request(2, 1300))
PAGES = PageLayout(16, "shuffled")


@pytest.mark.parametrize("plan", ["fused", "split", "auto"])
def test_cuda_graph_replay_matches_eager(dtype: torch.dtype, plan: str) -> None:
    workload = Workload(WORKLOAD, HeadConfig(8, 2, 128), dtype)
    eager = Schedule((STEP,), PAGES)
    graphed = Schedule((STEP,), PAGES, graph=True)
    invariance.replay(KernelsBackend(kernel_plan=plan), workload, eager, graphed, device="cuda")


def test_split_plan_never_reads_uninitialised_workspace(dtype: torch.dtype) -> None:
    workload = Workload(WORKLOAD, HeadConfig(8, 2, 128), dtype)
    clean = Schedule((STEP,), PAGES)
    poisoned = Schedule((STEP,), PAGES, poison=True)
    invariance.replay(KernelsBackend(kernel_plan="split"), workload, clean, poisoned, device="cuda")
