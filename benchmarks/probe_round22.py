"""Round-22 probe (H100): the Gluon loader's page ids one tile ahead, the merge's chunk
(reports/h100-round22/).

    python benchmarks/probe_round22.py OUT_DIR bits|times [WORKLOAD ...]
    python benchmarks/probe_round22.py OUT_DIR bits-merge|times-merge [WORKLOAD ...]
    python benchmarks/probe_round22.py OUT_DIR times-split [WORKLOAD ...]
    python benchmarks/probe_round22.py OUT_DIR times-grow|err-grow [WORKLOAD ...]
    python benchmarks/probe_round22.py OUT_DIR once CELL WORKLOAD   (under ncu)

A cell is a plan or ``heuristic`` (the control: ``split_size=None``), optionally followed by
``+ahead`` (the launch built and run with ``kernels._gluon.IDS_AHEAD`` set: the loader loads a
tile's page ids in one load, one tile ahead; experiment commit 565ee23 only, see ``AHEAD``)
or ``+chunkN`` (with ``kernels.attention._MERGE_CHUNK = N``: the merge loads N splits'
partials per step), or ``+grow`` (with ``kernels._gluon.GROW`` set: the Gluon split kernel and
the merge cut each row at fixed absolute boundaries growing with the position,
``kernels._gluon.grow_splits``; experiment commit only, see ``GROW``).

``bits``: each workload at bf16 and fp16, out and LSE of ``+ahead`` (both plans) against the
default launch, and the 64-key contract, which must differ (the control), into ``bits.jsonl``;
``bits-merge``: the same for chunks of 16 and 32 splits, into ``bits-merge.jsonl``.

``times``: at bf16, CUDA-graph replays with L2 flushed (medians of 20), interleaved in
``REPEATS`` repeats: the default, ``+ahead``, the control and the control ``+ahead``, each
against the default, into ``times.jsonl``; ``times-merge``: the same with chunks of 16 and 32,
into ``times-merge.jsonl``.

``times-split``: the same timing of fixed split sizes other than the contract's 1024 tokens
(``sN``: ``split_size=N``, a cell ``sN`` is the plan ``auto`` at that split), against the
default, into ``times-split.jsonl``: what a split size chosen per row, from the row's own
position (still batch-invariant), would cost or gain on batches of rows of one length.

``times-grow``: the same timing of ``split+grow`` against the default, fixed splits of 256 and
2048 tokens and the control, on decodes of 1-4 requests of 1k-32k tokens, into
``times-grow.jsonl``; ``err-grow``: the largest absolute difference of out and LSE between
``split+grow`` and the default on the same batches (a different contract: not bits, a sanity
check that the experiment computes attention), into ``err-grow.jsonl``.

``once``: CELL's call on WORKLOAD, run 5 times with a sync after each (for ``ncu``).
"""

from __future__ import annotations

import os
import sys

import torch

import kernels
import kernels._gluon as kg
import kernels.attention as ka
from benchmarks.probe_round4 import call, patched, save
from benchmarks.probe_round11 import _workload
from benchmarks.probe_round20 import bits, times
from invariance.bench import build_batch

T = kernels.Tuning
#: Whether this commit's Gluon launcher has the loader switch (experiment commit 565ee23 only;
#: later commits leave the ``+ahead`` cells out of ``bits`` and ``times``).
AHEAD = hasattr(kg, "IDS_AHEAD")
#: Whether this commit has the growing-split experiment (``kernels._gluon.GROW``).
GROW = hasattr(kg, "GROW")
BITS_WORKLOADS = ["decode-b1-ctx1k", "decode-b1-ctx8k", "decode-b8-ctx8k", "decode-prod64",
                  "mixed64", "prefill:1000,3001,17,130", "decode:777x3,3001x2", "decode:100x3"]
TIME_WORKLOADS = ["decode-b1-ctx1k", "decode:2kx1", "decode:4kx1", "decode-b1-ctx8k",
                  "decode-b1-ctx32k", "decode-b8-ctx1k", "decode-b8-ctx8k", "decode-b64-ctx1k",
                  "decode-prod64", "mixed64", "prefill-varlen"]
MERGE_WORKLOADS = ["decode-b1-ctx32k", "decode:16kx1", "decode-b1-ctx8k", "decode:32kx2",
                   "decode:2kx4", "decode-prod64", "decode:100x3"]
SPLIT_WORKLOADS = ["decode-b1-ctx1k", "decode:2kx1", "decode:4kx1", "decode-b1-ctx8k",
                   "decode-b1-ctx32k", "decode-b8-ctx1k", "decode-b8-ctx8k", "decode-b8-ctx32k",
                   "decode-b64-ctx1k", "decode-b64-ctx8k", "decode-prod64", "mixed64",
                   "prefill-varlen"]
GROW_WORKLOADS = [f"decode:{n}x{b}" for b in (1, 2, 4)
                  for n in ("1k", "2k", "4k", "8k", "16k", "32k")]
REPEATS = 5


def make(batch, plan, tuning):
    """The call of cell ``plan`` (see the module docstring) with ``tuning``."""
    base, _, switch = plan.partition("+")
    if base == "heuristic":
        fn = call(batch, "auto", None, split_size=None)
    elif base.startswith("s") and base[1:].isdigit():
        fn = call(batch, "auto", tuning, split_size=int(base[1:]))
    else:
        fn = call(batch, base, tuning)
    if switch == "ahead":
        return patched(fn, kg, "IDS_AHEAD", True)
    if switch == "grow":
        return patched(fn, kg, "GROW", True)
    if switch.startswith("chunk"):
        return patched(fn, ka, "_MERGE_CHUNK", int(switch.removeprefix("chunk")))
    return fn


def main() -> None:
    if len(sys.argv) < 3 or sys.argv[2] not in ("bits", "times", "bits-merge", "times-merge",
                                                "times-split", "times-grow", "err-grow", "once"):
        sys.exit("usage: python benchmarks/probe_round22.py OUT_DIR bits|times|bits-merge|"
                 "times-merge|times-split|times-grow|err-grow [WORKLOAD ...] | once CELL WORKLOAD")
    out_dir, step, specs = sys.argv[1], sys.argv[2], sys.argv[3:]
    os.makedirs(out_dir, exist_ok=True)
    if step == "bits":
        bits(out_dir, specs, cells={**({"ahead": ("auto+ahead", None),
                                        "ahead-split": ("split+ahead", None),
                                        "ahead-fused": ("fused+ahead", None)} if AHEAD else {}),
                                    "control-64-keys": ("auto", T(block_n=64))},
             defaults=BITS_WORKLOADS, make=make)
    elif step == "times":
        times(out_dir, specs, cells={"default": ("auto", None),
                                     **({"ahead": ("auto+ahead", None)} if AHEAD else {}),
                                     "heuristic": ("heuristic", None),
                                     **({"heuristic+ahead": ("heuristic+ahead", None)}
                                        if AHEAD else {})},
              base="default", defaults=TIME_WORKLOADS, repeats=REPEATS, make=make)
    elif step == "bits-merge":
        bits(out_dir, specs, cells={"chunk16": ("auto+chunk16", None),
                                    "chunk32": ("auto+chunk32", None),
                                    "split-chunk32": ("split+chunk32", None),
                                    "control-64-keys": ("auto", T(block_n=64))},
             defaults=MERGE_WORKLOADS, make=make, name="bits-merge.jsonl")
    elif step == "times-merge":
        times(out_dir, specs, cells={"default": ("auto", None), "chunk16": ("auto+chunk16", None),
                                     "chunk32": ("auto+chunk32", None),
                                     "heuristic": ("heuristic", None),
                                     "heuristic+chunk16": ("heuristic+chunk16", None),
                                     "heuristic+chunk32": ("heuristic+chunk32", None)},
              base="default", defaults=MERGE_WORKLOADS, repeats=REPEATS, make=make,
              name="times-merge.jsonl")
    elif step == "times-split":
        times(out_dir, specs, cells={"default": ("auto", None),
                                     **{f"s{n}": (f"s{n}", None) for n in (128, 256, 512, 2048)},
                                     "heuristic": ("heuristic", None)},
              base="default", defaults=SPLIT_WORKLOADS, repeats=REPEATS, make=make,
              name="times-split.jsonl")
    elif step == "times-grow":
        times(out_dir, specs, cells={"default": ("auto", None), "grow": ("split+grow", None),
                                     "s256": ("s256", None), "s2048": ("s2048", None),
                                     "heuristic": ("heuristic", None)},
              base="default", defaults=GROW_WORKLOADS, repeats=REPEATS, make=make,
              name="times-grow.jsonl")
    elif step == "err-grow":
        rows = []
        for spec in specs or GROW_WORKLOADS:
            batch = build_batch(_workload(spec), dtype=torch.bfloat16)
            ref = make(batch, "auto", None)()
            got = make(batch, "split+grow", None)()
            rows.append(dict(workload=spec,
                             out=float((got[0].float() - ref[0].float()).abs().max()),
                             lse=float((got[1] - ref[1]).abs().max()),
                             finite=bool(torch.isfinite(got[0]).all())))
            print(rows[-1], flush=True)
        save(out_dir, "err-grow.jsonl", rows)
    else:
        cell, spec = specs
        batch = build_batch(_workload(spec), dtype=torch.bfloat16)
        fn = make(batch, cell, None)
        for _ in range(5):
            fn()
            torch.cuda.synchronize()


if __name__ == "__main__":
    main()
