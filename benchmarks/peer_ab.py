"""Interleaved A/B timing of backends on a few bench workloads.

    python benchmarks/peer_ab.py OUT_DIR [--rounds N] [--iters N] [--backend NAME ...]
        [--workload NAME ...] [--sustain S [--sustain-passes P]]

One bench run times each backend once per workload (a median of ``--iters`` replays), so a
ratio between two backends carries the GPU's drift between those two medians: prefill-varlen's
ratio to FlashInfer's FA3 moved 1.04-1.12x across three runs of the same code. Here every
backend is captured once (CUDA graph, as ``invariance bench``) and timed ``--rounds`` times, the
backends in a rotated order each round (L2 flushed before every replay, as the bench), so each
round gives one ratio per backend against the first, measured within a fraction of a second.
Writes ``ab.jsonl`` (one row per workload: every round's times, in us) and prints the median,
minimum and maximum of the per-round ratios.

``nvidia-smi``'s SM clock and power of the GPU torch runs on (``power.draw.instant`` where
the driver has it, else ``power.draw``, a one-second average) are sampled every 100 ms into
``smi.csv`` (UTC stamps) when it is on the PATH. With ``--sustain S`` (which needs it) each
backend is also replayed back to back for S seconds (no flush), in ``--sustain-passes`` passes
with the backends in a rotated order; ``sustain.jsonl`` gives each window's time per call and
the mean SM clock and power nvidia-smi saw, both over the window after its first second, and
time x mean clock as a proxy for cycles per call (it charges memory-bound phases, which do not
scale with the SM clock, as cycles too). At the H100's 700 W limit the clock falls under load:
a kernel slower at a higher clock than its peer is not slower for the power limit.
"""

from __future__ import annotations

import argparse
import calendar
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from typing import Any

import torch

from invariance.backends import resolve
from invariance.bench import CudaTimer, build_batch, select_workloads

#: Seconds of each sustained window left out of its clock and power means: the ramp from the
#: previous backend (and ``power.draw``'s one-second averaging window, where it is used).
SETTLE_S = 1.0
#: Fewest nvidia-smi samples a window's means are reported from.
MIN_SAMPLES = 5


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
                        "nvidia-smi saw meanwhile (needs nvidia-smi)")
    p.add_argument("--sustain-passes", type=int, default=1,
                   help="sustained windows per backend, the backends rotated in each pass")
    a = p.parse_args()
    if a.rounds < 1:
        p.error(f"--rounds: expected >= 1, got {a.rounds}")
    if a.iters < 1:
        p.error(f"--iters: expected >= 1, got {a.iters}")
    least = SETTLE_S + MIN_SAMPLES * 0.1
    if not (a.sustain == 0 or (math.isfinite(a.sustain) and a.sustain >= least)):
        p.error(f"--sustain: expected 0 (off) or a finite number of seconds >= {least} "
                f"({SETTLE_S} s settling, then {MIN_SAMPLES} samples of 100 ms), got "
                f"{a.sustain}")
    if a.sustain_passes < 1 or (a.sustain_passes != 1 and not a.sustain):
        p.error(f"--sustain-passes: expected >= 1, and 1 without --sustain, got "
                f"{a.sustain_passes} (--sustain {a.sustain})")
    smi_path = shutil.which("nvidia-smi")
    if a.sustain and smi_path is None:
        p.error(f"--sustain: needs nvidia-smi on the PATH for the clock and power, got "
                f"--sustain {a.sustain} and no nvidia-smi")
    names = a.backend or ["kernels", "flashinfer-fa3", "flashinfer"]
    if len(set(names)) != len(names):
        p.error(f"--backend: expected distinct backends, got {names}")
    specs = a.workload or ["prefill-varlen", "mixed64"]
    try:
        # Bench names, or lengths specs such as prefill:4kx8 (invariance bench --lengths).
        workloads = select_workloads([s for s in specs if ":" not in s],
                                     [s for s in specs if ":" in s])
    except ValueError as exc:
        p.error(f"--workload: {exc}")
    try:
        backends = [resolve(n) for n in names]
    except ValueError as exc:
        p.error(f"--backend: {exc}")
    os.makedirs(a.out_dir, exist_ok=True)
    timer = CudaTimer(iters=a.iters, warmup=3)
    windows: list[dict[str, Any]] = []
    with open(os.path.join(a.out_dir, "smi.csv"), "w") as smi_out:
        smi = None
        gpu = _smi_gpu() if smi_path is not None else []
        power_field = _power_field(smi_path, gpu) if smi_path is not None else ""
        if smi_path is not None:
            smi = subprocess.Popen(
                [smi_path, *gpu, f"--query-gpu=timestamp,clocks.sm,{power_field},"
                 "temperature.gpu", "--format=csv,noheader", "-lms", "100"],
                stdout=smi_out, env=os.environ | {"TZ": "UTC"})
            time.sleep(0.5)
            if smi.poll() is not None and a.sustain:
                sys.exit(f"peer_ab.py: nvidia-smi {' '.join(gpu)} exited at once "
                         f"(rc {smi.returncode}): --sustain needs its samples")
        try:
            windows = _run(a.out_dir, names, backends, workloads, timer, a.rounds, a.iters,
                           a.sustain, a.sustain_passes)
        finally:
            if smi is not None:
                smi.terminate()
                smi.wait()
    if windows:
        for w in windows:
            w["power_field"] = power_field
        if not _sustain_report(a.out_dir, windows):
            sys.exit("peer_ab.py: some --sustain windows got too few nvidia-smi samples for "
                     "their means (sustain.jsonl, and the warnings above)")


def _smi_gpu() -> list[str]:
    """nvidia-smi's ``-i`` for the GPU torch runs on (by UUID: CUDA's device order need not be
    nvidia-smi's), or nothing where torch gives no UUID."""
    uuid = str(getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "uuid",
                       ""))
    if not uuid:
        return []
    return ["-i", uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"]


def _power_field(smi: str, gpu: list[str]) -> str:
    """``power.draw.instant`` if this driver's nvidia-smi knows it, else ``power.draw``."""
    try:
        done = subprocess.run([smi, *gpu, "--query-gpu=power.draw.instant",
                               "--format=csv,noheader"], capture_output=True, text=True,
                              check=False, timeout=30)
    except subprocess.TimeoutExpired:
        return "power.draw"
    ok = done.returncode == 0 and "W" in done.stdout
    return "power.draw.instant" if ok else "power.draw"


def _smi_samples(path: str) -> list[tuple[float, float, float]]:
    """(epoch seconds, SM MHz, watts) of each line nvidia-smi wrote (UTC stamps: it runs with
    ``TZ=UTC``); lines that do not parse are skipped."""
    out = []
    with open(path) as f:
        for line in f:
            parts = [x.strip() for x in line.split(",")]
            try:
                stamp, _, frac = parts[0].partition(".")
                t = calendar.timegm(time.strptime(stamp, "%Y/%m/%d %H:%M:%S"))
                out.append((t + (float("0." + frac) if frac else 0.0),
                            float(parts[1].split()[0]), float(parts[2].split()[0])))
            except (IndexError, ValueError):
                continue
    return out


def _sustain_report(out_dir: str, windows: list[dict[str, Any]]) -> bool:
    """Mean SM clock and power over each sustained window (``t0`` to ``t1``: its timed part,
    after :data:`SETTLE_S`), with time x mean clock as cycles per call, into ``sustain.jsonl``
    and printed. A window with fewer than :data:`MIN_SAMPLES` samples gets no means, and a
    warning; returns whether every window got its means."""
    samples = _smi_samples(os.path.join(out_dir, "smi.csv"))
    complete = True
    with open(os.path.join(out_dir, "sustain.jsonl"), "w") as f:
        for w in windows:
            inside = [(c, pw) for t, c, pw in samples if w["t0"] <= t <= w["t1"]]
            w["samples"] = len(inside)
            if len(inside) >= MIN_SAMPLES:
                w["sm_mhz"] = round(statistics.mean(c for c, _ in inside))
                w["watts"] = round(statistics.mean(pw for _, pw in inside), 1)
                w["mcycles_per_call"] = round(w["us_per_call"] * w["sm_mhz"] * 1e-6, 3)
            else:
                complete = False
                print(f"peer_ab.py: {w['workload']} {w['backend']}: {len(inside)} nvidia-smi "
                      f"samples in the window, expected >= {MIN_SAMPLES}: no means",
                      file=sys.stderr)
            f.write(json.dumps(w) + "\n")
            print(json.dumps(w), flush=True)
    return complete


def _sustained(g: Any, seconds: float) -> tuple[float, float, float]:
    """Replay ``g`` back to back for ``seconds``, timing only the part after the first
    :data:`SETTLE_S`: (us per call there, its wall start, its wall end), the interval the
    clock and power means are taken over."""
    torch.cuda.synchronize()
    start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    t_begin = time.time()
    t0 = None
    n = 0
    while time.time() - t_begin < seconds:
        if t0 is None and time.time() - t_begin >= SETTLE_S:
            t0 = time.time()
            start.record()  # type: ignore[no-untyped-call]
            n = 0
        for _ in range(10):
            g()
        n += 10
        torch.cuda.synchronize()
    end.record()  # type: ignore[no-untyped-call]
    torch.cuda.synchronize()
    if t0 is None:  # --sustain is checked to exceed SETTLE_S; a stall could still get here
        raise RuntimeError(f"--sustain window of {seconds} s ended before {SETTLE_S} s")
    return (start.elapsed_time(end) * 1000 / n,  # type: ignore[no-untyped-call]
            t0, time.time())


def _run(out_dir: str, names: list[str], backends: list[Any], workloads: list[Any],
         timer: CudaTimer, rounds: int, iters: int, sustain: float,
         passes: int) -> list[dict[str, Any]]:
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
        for k in range(passes if sustain > 0 else 0):
            for i in [(i + k) % len(names) for i in range(len(names))]:
                us, t0, t1 = _sustained(graphs[i], sustain)
                windows.append(dict(workload=w.name, backend=names[i], sustain_pass=k,
                                    us_per_call=round(us, 1), t0=t0, t1=t1))
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "us"}), flush=True)
        del batch, graphs
        torch.cuda.empty_cache()
        with open(os.path.join(out_dir, "ab.jsonl"), "w") as f:
            f.writelines(json.dumps(x) + "\n" for x in rows)
    return windows


if __name__ == "__main__":
    main()
