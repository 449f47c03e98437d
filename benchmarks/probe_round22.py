"""Round-22 probe (H100): the Gluon loader's page ids one tile ahead (reports/h100-round22/).

    python benchmarks/probe_round22.py OUT_DIR bits [WORKLOAD ...]
    python benchmarks/probe_round22.py OUT_DIR times [WORKLOAD ...]
    python benchmarks/probe_round22.py OUT_DIR once CELL WORKLOAD   (under ncu)

A cell is a plan, ``heuristic`` (the control: ``split_size=None``), or either with ``+ahead``:
the same launch with ``kernels._gluon.IDS_AHEAD`` set while it is built and run (the loader
loads a tile's page ids in one load, one tile ahead; at the experiment commit only).

``bits``: each workload at bf16 and fp16, out and LSE of ``+ahead`` (both plans) against the
default launch, and the 64-key contract, which must differ (the control), into ``bits.jsonl``.

``times``: at bf16, CUDA-graph replays with L2 flushed (medians of 20), interleaved in
``REPEATS`` repeats: the default, ``+ahead``, the control and the control ``+ahead``, each
against the default, into ``times.jsonl``.

``once``: CELL's call on WORKLOAD, run 5 times with a sync after each (for ``ncu``).
"""

from __future__ import annotations

import os
import sys

import torch

import kernels
import kernels._gluon as kg
from benchmarks.probe_round4 import call, patched
from benchmarks.probe_round11 import _workload
from benchmarks.probe_round20 import bits, times
from invariance.bench import build_batch

T = kernels.Tuning
BITS_WORKLOADS = ["decode-b1-ctx1k", "decode-b1-ctx8k", "decode-b8-ctx8k", "decode-prod64",
                  "mixed64", "prefill:1000,3001,17,130", "decode:777x3,3001x2", "decode:100x3"]
TIME_WORKLOADS = ["decode-b1-ctx1k", "decode:2kx1", "decode:4kx1", "decode-b1-ctx8k",
                  "decode-b1-ctx32k", "decode-b8-ctx1k", "decode-b8-ctx8k", "decode-b64-ctx1k",
                  "decode-prod64", "mixed64", "prefill-varlen"]
REPEATS = 5


def make(batch, plan, tuning):
    """The call of cell ``plan`` (see the module docstring) with ``tuning``."""
    base, ahead = plan.removesuffix("+ahead"), plan.endswith("+ahead")
    fn = (call(batch, "auto", None, split_size=None) if base == "heuristic"
          else call(batch, base, tuning))
    return patched(fn, kg, "IDS_AHEAD", True) if ahead else fn


def main() -> None:
    if len(sys.argv) < 3 or sys.argv[2] not in ("bits", "times", "once"):
        sys.exit("usage: python benchmarks/probe_round22.py OUT_DIR bits|times [WORKLOAD ...]"
                 " | once CELL WORKLOAD")
    out_dir, step, specs = sys.argv[1], sys.argv[2], sys.argv[3:]
    os.makedirs(out_dir, exist_ok=True)
    if step == "bits":
        bits(out_dir, specs, cells={"ahead": ("auto+ahead", None),
                                    "ahead-split": ("split+ahead", None),
                                    "ahead-fused": ("fused+ahead", None),
                                    "control-64-keys": ("auto", T(block_n=64))},
             defaults=BITS_WORKLOADS, make=make)
    elif step == "times":
        times(out_dir, specs, cells={"default": ("auto", None), "ahead": ("auto+ahead", None),
                                     "heuristic": ("heuristic", None),
                                     "heuristic+ahead": ("heuristic+ahead", None)},
              base="default", defaults=TIME_WORKLOADS, repeats=REPEATS, make=make)
    else:
        cell, spec = specs
        batch = build_batch(_workload(spec), dtype=torch.bfloat16)
        fn = make(batch, cell, None)
        for _ in range(5):
            fn()
            torch.cuda.synchronize()


if __name__ == "__main__":
    main()
