"""CUDA-only behaviour: graph capture (value checks skipped while capturing). Skipped on CPU."""

from __future__ import annotations

import pytest
import torch

from kernels import unified_attention
from kernels.testing import build_batch, describe_bit_mismatch, make_request

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.parametrize("plan", ["fused", "split", "auto"])
def test_cuda_graph_replay_matches_eager(dtype: torch.dtype, plan: str) -> None:
    reqs = [make_request(i, n, 8, 2, 128, dtype, "cuda") for i, n in enumerate([700, 90, 1300])]
    batch = build_batch([(reqs[0], 650, 700), (reqs[1], 89, 90), (reqs[2], 0, 1300)], 16)
    eager = unified_attention(*batch.args(), plan=plan)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        unified_attention(*batch.args(), plan=plan)  # compile outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = unified_attention(*batch.args(), plan=plan)  # validate=True: skipped here
    graph.replay()
    torch.cuda.synchronize()
    for name, a, b in (("out", eager[0], captured[0]), ("lse", eager[1], captured[1])):
        msg = describe_bit_mismatch(a, b)
        assert msg is None, f"graph replay vs eager, {name}: {msg}"
