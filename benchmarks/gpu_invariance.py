"""The invariance suite of the Triton kernels on a real GPU, at production shapes.

Runs ``invariance.check`` for ``kernels``, ``kernels-fused``, ``kernels-split`` (must pass) and
``kernels-heuristic`` (the control, must be caught) at float16 and bfloat16 on the ``large`` scale
(Hq=32, Hkv=8, D=128, page size 16, 32k-token neighbours, batches up to 256), then answers with
two experiments whether the tile configuration may vary without changing bits:

1. *Fixed batches, varied tiles*: the same mixed prefill+decode batches computed with every
   BLOCK_M / num_warps override, compared bit for bit with the default tile config.
2. *The trap*: a backend that picks BLOCK_M from the batch (16 rows for decode-only batches, 128
   when prefill joins, like the CUDA library measured in the issue), run through the
   perturbations that change batch composition.

    python benchmarks/gpu_invariance.py --out DIR [--budget N] [--dtypes float16 bfloat16]

Writes ``DIR/gpu-invariance.json`` and ``DIR/gpu-invariance.md`` and one report JSON per
(backend, dtype). Exits 1 if an invariant backend fails or the control is not caught.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

import invariance
from invariance import AttentionBatch, Chunk, PageLayout, Request, Step, Workload, materialize
from invariance.backends.kernels import KernelsBackend
from invariance.compare import compare_bits

BACKENDS = ["kernels", "kernels-fused", "kernels-split", "kernels-heuristic"]
TILE_OVERRIDES = [(m, w) for m in (16, 32, 64, 128) for w in (4, 8)]


def _trap_block_m(batch: AttentionBatch) -> int:
    return 16 if max(batch.q_lens(), default=1) <= 1 else 128


def tile_experiment(dtype: torch.dtype, seed: int) -> list[dict[str, object]]:
    """Compare each BLOCK_M / num_warps override with the default config on mixed batches."""
    heads = invariance.DEFAULT_HEADS["large"]
    rows: list[dict[str, object]] = []
    batches = []
    for i, (n_dec, n_pre) in enumerate([(64, 0), (48, 8), (1, 0), (0, 4)]):
        requests = [Request(j, 512 + 997 * j % 8192) for j in range(n_dec + n_pre)]
        wl = Workload(tuple(requests), heads, dtype, seed + i)
        chunks = [Chunk(r.id, r.length - 1, r.length) for r in requests[:n_dec]]
        chunks += [Chunk(r.id, r.length - 200, r.length) for r in requests[n_dec:]]
        batches.append((f"{n_dec} decode + {n_pre} prefill(200)",
                        materialize(wl, Step(tuple(chunks)), PageLayout(16, "shuffled"), "cuda")))
    for label, batch in batches:
        base = KernelsBackend()(batch)
        for m, w in TILE_OVERRIDES:
            try:
                got = KernelsBackend(block_m=m, num_warps=w)(batch)
            except Exception as exc:
                rows.append({"batch": label, "block_m": m, "num_warps": w,
                             "error": f"{type(exc).__name__}: {exc}"[:200]})
                continue
            d_out = compare_bits(got.out, base.out, name="out")
            d_lse = compare_bits(got.lse, base.lse, name="lse")
            rows.append({"batch": label, "block_m": m, "num_warps": w,
                         "out_differing": d_out.num_different, "out_max_ulp": d_out.max_ulp,
                         "lse_differing": d_lse.num_different, "lse_max_ulp": d_lse.max_ulp,
                         "elements": d_out.num_elements})
    return rows


def to_markdown(result: dict[str, Any]) -> str:
    """The results as a Markdown report: environment, perturbation x (backend, dtype), tiles."""
    env = result["environment"]
    checks = result["checks"]
    lines = [
        "# Triton kernels: batch invariance on a real GPU",
        "",
        f"- GPU: {env['device_name']} (driver {env['driver']}, CUDA {env['cuda']})",
        f"- torch {env['torch']}, triton {env['triton']}, Python {env['python']}",
        f"- command: `{result['command']}`",
        f"- wall time: {result['seconds']:.0f} s",
        "",
        "## Perturbations x (backend, dtype)",
        "",
        "Cell: verdict, cases (schedule pairs), violating cases, worst ULP distance. "
        "`kernels-heuristic` is the control and is expected to FAIL.",
        "",
    ]
    perts = list(checks[0]["cells"]) if checks else []
    cols = [f"{c['backend']} {c['dtype']}" for c in checks]
    lines.append("| perturbation | " + " | ".join(cols) + " |")
    lines.append("| --- |" + " --- |" * len(cols))
    for p in perts:
        row = []
        for c in checks:
            cell = c["cells"][p]
            word = {"passed": "pass", "failed": "FAIL", "error": "ERROR",
                    "skipped": "skipped"}[cell["status"]]
            row.append(f"{word} {cell['cases']}/{cell['violations']}/{cell['max_ulp']}")
        lines.append(f"| {p} | " + " | ".join(row) + " |")
    lines.append("| accuracy (worst err / tolerance) | " + " | ".join(
        f"{'pass' if c['accuracy']['passed'] else 'FAIL'} {c['accuracy']['worst_ratio']:.3f}"
        for c in checks) + " |")
    lines.append("| expected / as expected | " + " | ".join(
        f"{c['expected']} / {'yes' if c['ok'] else 'NO'}" for c in checks) + " |")
    lines += ["", "## Does the tile configuration change bits?", "",
              "The same batches computed with BLOCK_M / num_warps overrides, compared bit for "
              "bit with the default tile config of `kernels.tile_config` (differing elements "
              "of out / lse, max ULP).", ""]
    for dtype, rows in result["tiles"].items():
        lines += [f"### {dtype}", "", "| batch | BLOCK_M | warps | out differing (max ULP) | "
                  "lse differing (max ULP) |", "| --- | --- | --- | --- | --- |"]
        for r in rows:
            if "error" in r:
                lines.append(f"| {r['batch']} | {r['block_m']} | {r['num_warps']} | "
                             f"error: {r['error']} | |")
                continue
            lines.append(
                f"| {r['batch']} | {r['block_m']} | {r['num_warps']} | "
                f"{r['out_differing']} of {r['elements']} ({r['out_max_ulp']}) | "
                f"{r['lse_differing']} ({r['lse_max_ulp']}) |")
        lines.append("")
    lines += ["## The trap: BLOCK_M picked from the batch", "",
              "A backend choosing 16 rows for decode-only batches and 128 when prefill joins.", "",
              "| dtype | " + " | ".join(result["trap"][0]["cells"]) + " |" if result["trap"]
              else "(not run)", ]
    if result["trap"]:
        lines.append("| --- |" + " --- |" * len(result["trap"][0]["cells"]))
        for t in result["trap"]:
            lines.append(f"| {t['dtype']} | " + " | ".join(
                f"{c['status']} ({c['violations']}/{c['cases']} cases, {c['max_ulp']} ULP)"
                for c in t["cells"].values()) + " |")
    if result["not_run"]:
        lines += ["", f"Not run (time limit): {', '.join(result['not_run'])}"]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--budget", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtypes", nargs="+", default=["float16", "bfloat16"])
    ap.add_argument("--backends", nargs="+", default=BACKENDS)
    ap.add_argument("--time-limit", type=float, default=420.0,
                    help="seconds; later checks are skipped (and listed as not run) past it")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("gpu_invariance: needs a CUDA GPU", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    env = invariance.Environment.capture("cuda")
    result: dict[str, object] = {"environment": env.__dict__, "command": " ".join(sys.argv),
                                 "checks": [], "not_run": [], "tiles": {}, "trap": []}
    bad = False
    for dtype in args.dtypes:
        result["tiles"][dtype] = tile_experiment(invariance.workload.parse_dtype(dtype),  # type: ignore[index]
                                                 args.seed)
        print(f"[{time.perf_counter() - t0:6.1f}s] tile experiment {dtype} done", flush=True)
    for dtype in args.dtypes:
        for backend in args.backends:
            if time.perf_counter() - t0 > args.time_limit:
                result["not_run"].append(f"{backend} {dtype}")  # type: ignore[attr-defined]
                continue
            rep = invariance.check(backend, dtype=dtype, device="cuda", scale="large",
                                   budget=args.budget, seed=args.seed)
            rep.to_json(args.out / f"report-{backend}-{dtype}.json")
            control = backend == "kernels-heuristic"
            ok = (not rep.passed and rep.accurate) if control else rep.passed
            bad |= not ok
            result["checks"].append({  # type: ignore[attr-defined]
                "backend": backend, "dtype": dtype, "passed": rep.passed,
                "accurate": rep.accurate, "expected": "caught" if control else "pass", "ok": ok,
                "seconds": rep.seconds, "accuracy": rep.accuracy[0].to_dict(),
                "cells": {r.perturbation: {"status": r.status, "cases": r.cases,
                                           "tokens": r.compared_tokens,
                                           "violations": r.num_violations,
                                           "max_ulp": r.max_ulp, "error": r.error}
                          for r in rep.results},
            })
            print(f"[{time.perf_counter() - t0:6.1f}s] {rep.summary()}", flush=True)
    for dtype in args.dtypes:
        if time.perf_counter() - t0 > args.time_limit:
            result["not_run"].append(f"trap {dtype}")  # type: ignore[attr-defined]
            continue
        trap = KernelsBackend(block_m=_trap_block_m)
        rep = invariance.check(trap, dtype=dtype, device="cuda", scale="large",
                               perturbations=["mixed", "batch_size", "prefill_vs_decode"],
                               budget=args.budget, seed=args.seed)
        result["trap"].append({"dtype": dtype, "cells": {  # type: ignore[attr-defined]
            r.perturbation: {"status": r.status, "violations": r.num_violations,
                             "cases": r.cases, "max_ulp": r.max_ulp, "error": r.error}
            for r in rep.results}})
        print(f"[{time.perf_counter() - t0:6.1f}s] trap {dtype}: {rep.summary()}", flush=True)
    result["seconds"] = time.perf_counter() - t0
    (args.out / "gpu-invariance.json").write_text(json.dumps(result, indent=2, default=str))
    (args.out / "gpu-invariance.md").write_text(to_markdown(result))
    print(json.dumps({"checks": [(c["backend"], c["dtype"], c["ok"]) for c in result["checks"]],  # type: ignore[attr-defined]
                      "not_run": result["not_run"]}))
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
