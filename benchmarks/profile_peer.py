"""Profile target for Nsight Compute: one backend on one bench workload, captured in a CUDA
graph as ``invariance bench`` captures it, then replayed.

    python benchmarks/profile_peer.py BACKEND WORKLOAD [--replays N]

``BACKEND`` is any backend name ``invariance bench`` takes (``kernels``, ``flashinfer-fa3``, ...),
``WORKLOAD`` a bench workload name or length spec (``prefill-varlen``, ``prefill:4kx8``). The
backend's planning step and one eager call run before the capture, so under ``ncu`` the first
replay's kernels come after that eager call's (``--launch-skip``).
"""

from __future__ import annotations

import argparse

import torch

from invariance.backends import resolve
from invariance.bench import WORKLOADS, CudaTimer, build_batch, parse_lengths


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("backend")
    p.add_argument("workload")
    p.add_argument("--replays", type=int, default=2)
    a = p.parse_args()
    if a.replays < 1:
        p.error(f"--replays: expected >= 1, got {a.replays}")
    name = a.workload
    try:
        w = WORKLOADS[name] if name in WORKLOADS else parse_lengths(name)
    except ValueError as exc:
        p.error(f"workload: expected a bench workload name or length spec, got {name!r} ({exc})")
    try:
        backend = resolve(a.backend)
    except ValueError as exc:
        p.error(str(exc))
    if not torch.cuda.is_available():
        p.error("this profile target needs a CUDA device")
    batch = build_batch(w, dtype=torch.bfloat16)
    replay = CudaTimer(iters=1, warmup=0)._capture(backend, batch)
    for _ in range(a.replays):
        replay()
    torch.cuda.synchronize()
    print(f"{a.backend} {w.name}: {a.replays} replays done")


if __name__ == "__main__":
    main()
