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
100 ms into ``smi.csv`` when it is on the PATH; with ``--sustain S`` each backend is then also
replayed back to back for S seconds (no flush), and ``sustain.jsonl`` gives its time per call
with the mean SM clock and power over that window: at the H100's 700 W cap the clock falls
under load, so a kernel's energy per call sets part of its speed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import time
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
    p.add_argument("--sustain", type=float, default=0.0,
                   help="also replay each backend back to back for this many seconds (no L2 "
                        "flush) and report its time per call with the SM clock and power "
                        "nvidia-smi saw meanwhile")
    a = p.parse_args()
    if a.rounds < 1 or a.iters < 1 or a.sustain < 0:
        p.error(f"--rounds and --iters: expected >= 1, --sustain >= 0, got {a.rounds}, "
                f"{a.iters} and {a.sustain}")
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
            windows = _run(a.out_dir, names, backends, workloads, timer, a.rounds, a.iters,
                           a.sustain)
        finally:
            if smi is not None:
                smi.terminate()
                smi.wait()
    if windows and smi is not None:
        _sustain_report(a.out_dir, windows)


def _smi_samples(path: str) -> list[tuple[float, float, float]]:
    """(epoch seconds, SM MHz, watts) of each line nvidia-smi wrote (its local-time stamps)."""
    out = []
    with open(path) as f:
        for line in f:
            parts = [x.strip() for x in line.split(",")]
            try:
                t = time.mktime(time.strptime(parts[0].split(".")[0], "%Y/%m/%d %H:%M:%S"))
                t += float("0." + parts[0].split(".")[1]) if "." in parts[0] else 0.0
                out.append((t, float(parts[1].split()[0]), float(parts[2].split()[0])))
            except (IndexError, ValueError):
                continue
    return out


def _sustain_report(out_dir: str, windows: list[dict[str, Any]]) -> None:
    """Mean SM clock and power over each sustained window (its first half second left out),
    into ``sustain.jsonl`` and printed."""
    samples = _smi_samples(os.path.join(out_dir, "smi.csv"))
    with open(os.path.join(out_dir, "sustain.jsonl"), "w") as f:
        for w in windows:
            inside = [(c, pw) for t, c, pw in samples if w["t0"] + 0.5 <= t <= w["t1"]]
            if inside:
                w["sm_mhz"] = round(statistics.mean(c for c, _ in inside))
                w["watts"] = round(statistics.mean(pw for _, pw in inside), 1)
                w["joules_per_call"] = round(w["watts"] * w["us_per_call"] * 1e-6, 4)
            w["samples"] = len(inside)
            f.write(json.dumps(w) + "\n")
            print(json.dumps(w), flush=True)


def _sustained(g: Any, seconds: float) -> tuple[float, float, float]:
    """Replay ``g`` back to back for ``seconds``: (us per call, wall start, wall end)."""
    torch.cuda.synchronize()
    start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    t0 = time.time()
    start.record()  # type: ignore[no-untyped-call]
    n = 0
    while time.time() - t0 < seconds:
        for _ in range(10):
            g()
        n += 10
        torch.cuda.synchronize()
    end.record()  # type: ignore[no-untyped-call]
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / n, t0, time.time()  # type: ignore[no-untyped-call]


def _run(out_dir: str, names: list[str], backends: list[Any], workloads: list[Any],
         timer: CudaTimer, rounds: int, iters: int, sustain: float) -> list[dict[str, Any]]:
    rows = []
    windows: list[dict[str, Any]] = []
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
        for name, g in zip(names, graphs, strict=True) if sustain > 0 else ():
            us, t0, t1 = _sustained(g, sustain)
            windows.append(dict(workload=w.name, backend=name, us_per_call=round(us, 1),
                                t0=t0, t1=t1))
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "us"}), flush=True)
        del batch, graphs
        torch.cuda.empty_cache()
        with open(os.path.join(out_dir, "ab.jsonl"), "w") as f:
            f.writelines(json.dumps(x) + "\n" for x in rows)
    return windows

if __name__ == "__main__":
    main()
