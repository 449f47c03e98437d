"""Round-12 profile target (H100): one bench workload's default ``kernels`` call, run three
times, for Nsight Compute to profile the third launch of the attention kernel
(reports/h100-round12/README.md; ``benchmarks/gpu_round12.sh profile``).

    python benchmarks/profile_round12.py WORKLOAD [PLAN [SPLIT_SIZE]]

``SPLIT_SIZE`` ``none``: the batch-dependent control (``kernels-heuristic``'s split count).
"""

from __future__ import annotations

import sys

import torch

from benchmarks.probe_round4 import call
from benchmarks.probe_round11 import _workload
from invariance.bench import build_batch

if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: profile_round12.py WORKLOAD [PLAN [SPLIT_SIZE|none]]")
    plan = sys.argv[2] if len(sys.argv) > 2 else "auto"
    size = sys.argv[3] if len(sys.argv) > 3 else "1024"
    batch = build_batch(_workload(sys.argv[1]), dtype=torch.bfloat16)
    fn = call(batch, plan, split_size=None if size == "none" else int(size))
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
