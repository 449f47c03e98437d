"""Interleaved A/B timing of backends on a few bench workloads (H100; round 18,
reports/h100-round18/README.md).

    python benchmarks/peer_ab.py OUT_DIR [--rounds N] [--iters N] [--backend NAME ...]
        [--workload NAME ...]

One bench run times each backend once per workload (a median of ``--iters`` replays), so a
ratio between two backends carries the GPU's drift between those two medians: prefill-varlen's
ratio to FlashInfer's FA3 moved 1.04-1.12x across three runs of the same code. Here every
backend is captured once (CUDA graph, as ``invariance bench``) and timed ``--rounds`` times, the
backends in a rotated order each round (L2 flushed before every replay, as the bench), so each
round gives one ratio per backend against the first, measured seconds apart. Writes
``ab.jsonl`` (one row per workload: every round's times, in us) and prints the median, minimum
and maximum of the per-round ratios. ``nvidia-smi``'s SM clock and power are sampled every
100 ms into ``smi.csv`` when it is on the PATH.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
from typing import Any

import torch

from invariance.backends import resolve
from invariance.bench import CudaTimer, build_batch, select_workloads


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out_dir")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--backend", action="append", default=None)
    p.add_argument("--workload", action="append", default=None)
    a = p.parse_args()
    if a.rounds < 1 or a.iters < 1:
        p.error(f"--rounds and --iters: expected >= 1, got {a.rounds} and {a.iters}")
    names = a.backend or ["kernels", "flashinfer-fa3", "flashinfer"]
    specs = a.workload or ["prefill-varlen", "mixed64"]
    # Bench names, or lengths specs such as prefill:4kx8 (invariance bench --lengths).
    workloads = select_workloads([s for s in specs if ":" not in s],
                                 [s for s in specs if ":" in s])
    os.makedirs(a.out_dir, exist_ok=True)
    timer = CudaTimer(iters=a.iters, warmup=3)
    backends = [resolve(n) for n in names]
    with open(os.path.join(a.out_dir, "smi.csv"), "w") as smi_out:
        smi = None
        if shutil.which("nvidia-smi"):
            smi = subprocess.Popen(
                ["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu",
                 "--format=csv,noheader", "-lms", "100"], stdout=smi_out)
        try:
            _run(a.out_dir, names, backends, workloads, timer, a.rounds, a.iters)
        finally:
            if smi is not None:
                smi.terminate()
                smi.wait()


def _run(out_dir: str, names: list[str], backends: list[Any], workloads: list[Any],
         timer: CudaTimer, rounds: int, iters: int) -> None:
    rows = []
    for w in workloads:
        batch = build_batch(w, dtype=torch.bfloat16)
        graphs = [timer._capture(b, batch) for b in backends]
        times: dict[str, list[float]] = {n: [] for n in names}
        for r in range(rounds):
            for i in [(i + r) % len(names) for i in range(len(names))]:
                times[names[i]].append(round(timer.time_fn(graphs[i]) * 1000, 1))
        row: dict[str, Any] = dict(workload=w.name, rounds=rounds, iters=iters, us=times)
        for n in names[1:]:
            ratios = [x / y for x, y in zip(times[names[0]], times[n], strict=True)]
            row[f"{names[0]}/{n}"] = dict(median=round(statistics.median(ratios), 4),
                                         min=round(min(ratios), 4), max=round(max(ratios), 4))
        row["median_us"] = {n: statistics.median(t) for n, t in times.items()}
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "us"}), flush=True)
        del batch, graphs
        torch.cuda.empty_cache()
        with open(os.path.join(out_dir, "ab.jsonl"), "w") as f:
            f.writelines(json.dumps(x) + "\n" for x in rows)

if __name__ == "__main__":
    main()
