"""Benchmark ``kernels.unified_attention`` against its peers and the GPU's measured limits.

    python benchmarks/attention.py --out DIR [--workloads NAME,...|all] [--split-sizes N,...]
        [--baseline NAME] [--backend SPEC ...] [--quick]

A thin caller of :func:`invariance.bench.run_bench` (what ``invariance bench`` runs): the named
workloads, the timing (CUDA-graph replay, L2 flushed, medians), the limits measured in the same
run, the ideal times and the ratios against the baseline all come from ``invariance/bench.py``.
It times ``kernels`` (invariant, plan chosen per batch), ``kernels-fused``, ``kernels-split``,
``kernels-heuristic`` (the batch-variant control), ``sdpa-flash`` (a dense peer), ``flashinfer``
and ``flashinfer-fa3`` when FlashInfer is importable, ``kernels:split_size=N`` for each of
``--split-sizes`` and any ``--backend``. The baseline defaults to ``flashinfer`` when importable,
else ``kernels-heuristic`` (then the ratio of ``kernels`` is the cost of invariance). Writes
``attention.md`` and ``attention.json`` into ``--out``.
"""

from __future__ import annotations

import argparse
import importlib.util
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

import torch
from rich.console import Console

from invariance.backends import resolve
from invariance.bench import WORKLOADS, run_bench
from invariance.outputs import check_outputs, write_atomic
from invariance.render import bench_to_markdown, print_bench

BACKENDS = ["kernels", "kernels-fused", "kernels-split", "kernels-heuristic", "sdpa-flash"]
FLASHINFER_BACKENDS = ["flashinfer", "flashinfer-fa3"]
ITERS, QUICK_ITERS = 50, 10


def has_flashinfer() -> bool:
    return importlib.util.find_spec("flashinfer") is not None


def backends(split_sizes: Sequence[int], extra: Sequence[str] = ()) -> list[str]:
    names = BACKENDS + (FLASHINFER_BACKENDS if has_flashinfer() else [])
    names += [f"kernels:split_size={s}" for s in split_sizes]
    return list(dict.fromkeys([*names, *extra]))


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--out", required=True, type=Path,
                   help="output directory (attention.md, attention.json)")
    p.add_argument("--workloads", default="all",
                   help=f"comma-separated names, or 'all' (default): {', '.join(WORKLOADS)}")
    p.add_argument("--split-sizes", default="",
                   help="also time kernels:split_size=N for each, e.g. 256,4096")
    p.add_argument("--baseline", help="the backend the others are compared with (default "
                                      "flashinfer when importable, else kernels-heuristic)")
    p.add_argument("--backend", action="append", default=[], metavar="SPEC",
                   help="another backend to time (repeatable), e.g. "
                        "kernels:block_m=128,num_warps=8")
    p.add_argument("--quick", action="store_true",
                   help=f"{QUICK_ITERS} timed runs per backend instead of {ITERS} (smoke runs)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = parser()
    args = p.parse_args(argv)
    names = None if args.workloads == "all" else [n for n in args.workloads.split(",") if n]
    unknown = [n for n in names or [] if n not in WORKLOADS]
    if unknown:
        p.error(f"--workloads: unknown {', '.join(unknown)}; known: {', '.join(WORKLOADS)}")
    try:
        split_sizes = [int(s) for s in args.split_sizes.split(",") if s]
    except ValueError:
        p.error(f"--split-sizes: expected comma-separated ints, got {args.split_sizes!r}")
    baseline = args.baseline or ("flashinfer" if has_flashinfer() else "kernels-heuristic")
    specs = backends(split_sizes, args.backend)
    try:  # a bad name or option fails here, on any machine, before the GPU is asked for
        for spec in [baseline, *specs]:
            resolve(spec)
    except ValueError as exc:
        p.error(str(exc))
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks/attention.py needs a CUDA GPU: torch.cuda.is_available() "
                         "is False")
    args.out.mkdir(parents=True, exist_ok=True)
    md, js = args.out / "attention.md", args.out / "attention.json"
    check_outputs({"attention.md": md, "attention.json": js})
    report = run_bench(
        specs, names=names, baseline=baseline,
        iters=QUICK_ITERS if args.quick else ITERS,
        progress=lambda done, total, what: print(f"[{done}/{total}] {what}", file=sys.stderr,
                                                 flush=True))
    report.command = shlex.join(["python", "benchmarks/attention.py", *argv])
    print_bench(report, Console())
    write_atomic(md, bench_to_markdown(report))
    write_atomic(js, report.to_json() + "\n")
    print(f"wrote {md} and {js}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
