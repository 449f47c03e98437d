"""Round-22 probe (H100): bit-neutral levers and split sizes at small batch
(reports/h100-round22/).

    python benchmarks/probe_round22.py OUT_DIR bits|times [WORKLOAD ...]
    python benchmarks/probe_round22.py OUT_DIR bits-merge|times-merge [WORKLOAD ...]
    python benchmarks/probe_round22.py OUT_DIR times-split [WORKLOAD ...]
    python benchmarks/probe_round22.py OUT_DIR times-grow|err-grow [WORKLOAD ...]
    python benchmarks/probe_round22.py OUT_DIR bits-scores|times-scores [WORKLOAD ...]
    python benchmarks/probe_round22.py OUT_DIR once CELL WORKLOAD   (under ncu)

A cell is a plan (``auto``, ``fused``, ``split``), ``heuristic`` (the control:
``split_size=None``) or ``sN`` (the plan ``auto`` at a fixed split of N tokens), optionally with
one switch, set while the call is built and run:

- ``+ahead``: ``kernels._gluon.IDS_AHEAD`` (the loader loads a tile's page ids in one load, one
  tile ahead; experiment commit 565ee23 only, see ``AHEAD``);
- ``+chunkN``: ``kernels.attention._MERGE_CHUNK = N`` (the merge loads N splits' partials per
  step);
- ``+grow``: ``kernels._gluon.GROW`` (the Gluon split kernel and the merge cut each row at fixed
  absolute boundaries growing with the position, ``kernels._gluon.grow_splits``; experiment
  commit 2bbb717 only, see ``GROW``);
- ``+scores``: ``kernels._gluon.SCORES`` (the Gluon split kernel's scores computed by separate
  programs, one per KV tile, and read back by the chain; experiment commit only, see
  ``SCORES``).

``bits``: each workload at bf16 and fp16, out and LSE of each cell against the default launch in
differing bits (``+ahead`` under the three plans, where it exists), and the 64-key contract,
which must differ (the control), into ``bits.jsonl``; ``bits-merge``: the same for chunks of 16
and 32 splits, into ``bits-merge.jsonl``.

``times``: at bf16, CUDA-graph replays with L2 flushed (medians of 20), interleaved in
``REPEATS`` repeats, each cell against the default: the default, the control and, where it
exists, both with ``+ahead``, into ``times.jsonl``; ``times-merge``: chunks of 16 and 32 for
both, into ``times-merge.jsonl``; ``times-split``: fixed splits of 128-2048 tokens and the
control, into ``times-split.jsonl`` (what a split size chosen per row, from the row's own
position, would cost or gain on batches of rows of one length); ``times-grow``: ``split+grow``,
fixed splits of 256 and 2048 tokens and the control, on decodes of 1-4 requests of 1k-32k
tokens, into ``times-grow.jsonl``.

``bits-scores``: ``+scores`` under ``split`` (and ``auto``) against the default in differing
bits, with the 64-key control, into ``bits-scores.jsonl``; ``times-scores``: ``split+scores``
against the default and the control on decodes of 1-4 requests, into ``times-scores.jsonl``.

``err-grow``: the largest absolute difference of out and LSE between ``split+grow`` and the
default on the same batches (another contract: not bits; a check that the experiment computes
attention), into ``err-grow.jsonl``.

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
#: Each experiment switch: the ``kernels._gluon`` flag it sets while a call is built and run.
SWITCHES = {"ahead": "IDS_AHEAD", "grow": "GROW", "scores": "SCORES"}
#: Whether this commit has each experiment: the loader switch (565ee23 only; later commits
#: leave the ``+ahead`` cells out of ``bits`` and ``times``), the growing splits (2bbb717 only;
#: elsewhere ``times-grow`` and ``err-grow`` exit), the scores (8a58915 only; elsewhere
#: ``bits-scores`` and ``times-scores`` exit).
AHEAD, GROW, SCORES = (hasattr(kg, flag) for flag in SWITCHES.values())
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
SCORES_WORKLOADS = [f"decode:{n}x{b}" for b in (1, 2, 4)
                    for n in ("1k", "2k", "3k", "4k", "8k", "32k")] + ["decode-b8-ctx1k"]
REPEATS = 5
#: Each step's cells: name -> (cell, tuning).
CONTROL_64 = {"control-64-keys": ("auto", T(block_n=64))}
BIT_CELLS = {**({"ahead": ("auto+ahead", None), "ahead-split": ("split+ahead", None),
                 "ahead-fused": ("fused+ahead", None)} if AHEAD else {}), **CONTROL_64}
TIME_CELLS = {"default": ("auto", None), **({"ahead": ("auto+ahead", None)} if AHEAD else {}),
              "heuristic": ("heuristic", None),
              **({"heuristic+ahead": ("heuristic+ahead", None)} if AHEAD else {})}
MERGE_BIT_CELLS = {"chunk16": ("auto+chunk16", None), "chunk32": ("auto+chunk32", None),
                   "split-chunk32": ("split+chunk32", None), **CONTROL_64}
MERGE_TIME_CELLS = {"default": ("auto", None), "chunk16": ("auto+chunk16", None),
                    "chunk32": ("auto+chunk32", None), "heuristic": ("heuristic", None),
                    "heuristic+chunk16": ("heuristic+chunk16", None),
                    "heuristic+chunk32": ("heuristic+chunk32", None)}
SPLIT_TIME_CELLS = {"default": ("auto", None),
                    **{f"s{n}": (f"s{n}", None) for n in (128, 256, 512, 2048)},
                    "heuristic": ("heuristic", None)}
GROW_TIME_CELLS = {"default": ("auto", None), "grow": ("split+grow", None),
                   "s256": ("s256", None), "s2048": ("s2048", None),
                   "heuristic": ("heuristic", None)}
SCORES_BIT_CELLS = {"scores": ("auto+scores", None), "scores-split": ("split+scores", None),
                    **CONTROL_64}
SCORES_TIME_CELLS = {"default": ("auto", None), "scores": ("split+scores", None),
                     "heuristic": ("heuristic", None)}
STEPS = ("bits|times|bits-merge|times-merge|times-split|times-grow|err-grow|bits-scores|"
         "times-scores")


def make(batch, cell, tuning):
    """The call of ``cell`` (see the module docstring) with ``tuning``; a cell it does not know
    raises ``ValueError`` (a typo must not time the default)."""
    base, _, switch = cell.partition("+")
    if base == "heuristic":
        if tuning is not None:
            raise ValueError(f"cell {cell!r}: the control takes no tuning, got {tuning}")
        fn = call(batch, "auto", None, split_size=None)
    elif base.startswith("s") and base[1:].isdigit():
        fn = call(batch, "auto", tuning, split_size=int(base[1:]))
    elif base in kernels.PLANS:
        fn = call(batch, base, tuning)
    else:
        raise ValueError(f"cell {cell!r}: expected a plan {kernels.PLANS}, 'heuristic' or 'sN'")
    if switch == "":
        return fn
    if switch in SWITCHES:
        return patched(fn, kg, SWITCHES[switch], True)
    if switch.startswith("chunk") and switch[5:].isdigit():
        return patched(fn, ka, "_MERGE_CHUNK", int(switch[5:]))
    raise ValueError(f"cell {cell!r}: expected the switch +ahead, +grow, +scores or +chunkN, got "
                     f"+{switch}")


def err_grow(out_dir: str, specs: list[str]) -> None:
    """``split+grow`` against the default: largest absolute differences, into
    ``out_dir/err-grow.jsonl``."""
    rows = []
    for spec in specs or GROW_WORKLOADS:
        batch = build_batch(_workload(spec), dtype=torch.bfloat16)
        ref = make(batch, "auto", None)()
        got = make(batch, "split+grow", None)()
        rows.append(dict(workload=spec, out=float((got[0].float() - ref[0].float()).abs().max()),
                         lse=float((got[1] - ref[1]).abs().max()),
                         finite=bool(torch.isfinite(got[0]).all())))
        print(rows[-1], flush=True)
    save(out_dir, "err-grow.jsonl", rows)


def main() -> None:
    args = sys.argv[1:]
    if not ((len(args) >= 2 and args[1] in STEPS.split("|"))
            or (len(args) == 4 and args[1] == "once")):
        sys.exit(f"usage: python benchmarks/probe_round22.py OUT_DIR {STEPS} [WORKLOAD ...] | "
                 "once CELL WORKLOAD")
    out_dir, step, specs = args[0], args[1], args[2:]
    if step in ("times-grow", "err-grow") and not GROW:
        sys.exit(f"{step}: needs kernels._gluon.GROW (experiment commit 2bbb717)")
    if step in ("bits-scores", "times-scores") and not SCORES:
        sys.exit(f"{step}: needs kernels._gluon.SCORES (its experiment commit)")
    os.makedirs(out_dir, exist_ok=True)
    timed = dict(base="default", repeats=REPEATS, make=make)
    if step == "bits":
        bits(out_dir, specs, cells=BIT_CELLS, defaults=BITS_WORKLOADS, make=make)
    elif step == "bits-merge":
        bits(out_dir, specs, cells=MERGE_BIT_CELLS, defaults=MERGE_WORKLOADS, make=make,
             name="bits-merge.jsonl")
    elif step == "times":
        times(out_dir, specs, cells=TIME_CELLS, defaults=TIME_WORKLOADS, **timed)
    elif step == "times-merge":
        times(out_dir, specs, cells=MERGE_TIME_CELLS, defaults=MERGE_WORKLOADS,
              name="times-merge.jsonl", **timed)
    elif step == "times-split":
        times(out_dir, specs, cells=SPLIT_TIME_CELLS, defaults=SPLIT_WORKLOADS,
              name="times-split.jsonl", **timed)
    elif step == "times-grow":
        times(out_dir, specs, cells=GROW_TIME_CELLS, defaults=GROW_WORKLOADS,
              name="times-grow.jsonl", **timed)
    elif step == "bits-scores":
        bits(out_dir, specs, cells=SCORES_BIT_CELLS, defaults=BITS_WORKLOADS + SCORES_WORKLOADS,
             make=make, name="bits-scores.jsonl")
    elif step == "times-scores":
        times(out_dir, specs, cells=SCORES_TIME_CELLS, defaults=SCORES_WORKLOADS,
              name="times-scores.jsonl", **timed)
    elif step == "err-grow":
        err_grow(out_dir, specs)
    else:
        cell, spec = specs
        batch = build_batch(_workload(spec), dtype=torch.bfloat16)
        fn = make(batch, cell, None)
        for _ in range(5):
            fn()
            torch.cuda.synchronize()


if __name__ == "__main__":
    main()
