"""Round-28 probe (H100/H200): lead splits, the first 1024 keys of every row in splits of
``lead_split_size`` tokens (reports/h100-round28/).

    python benchmarks/probe_round28.py OUT_DIR bits|times|times2|walk|plans [WORKLOAD ...]

A cell is ``PLAN@LEAD[+wK]``: a plan (``auto``, ``fused``, ``split``) or ``heuristic`` (the control,
``split_size=None``), and the lead split size in tokens (``128``, ``256``, or ``1024``: one split
size, the contract before this round); ``@`` left out is the default (128).

``bits``: each workload at bf16 and fp16 under three head layouts (GQA 4 and 16 at page 16,
GQA 4 at page 64); out and LSE in differing bits of the fused plan, the 128-row split tile and
the keys-as-rows tile (walking each split and folding its lead splits, and one program per lead
split) against the 128-row split tile, and ``auto``, all with the default lead splits, some at
256 too; then two controls that must differ: one split size (1024) against 128,
and the 64-key contract. Into ``bits.jsonl``.

``times``: at bf16, CUDA-graph replays with L2 flushed (medians of 20), interleaved in
``REPEATS`` repeats, each cell against ``lead128`` (``auto``): lead splits of 256, one split
size, the control. Into ``times.jsonl``.

``times2``: as ``times``, each cell against ``auto``: the keys-as-rows tile forced with each
lead schedule (``walk_lead``), one split size, the control. Into ``times2.jsonl``.

``walk``: the keys-as-rows tile walking 2 splits of 1024 per program (``+w2``) and 1 (``+w1``):
bits against the 128-row split tile at GQA 4 (the 64-key control), into ``walk-bits.jsonl``;
times against ``auto``, into ``walk-times.jsonl``.

``plans``: as ``times`` on the decodes of 8-256 requests of 1k keys, ``auto`` against the
fused plan and the split plan forced. Into ``plans.jsonl``.
"""

from __future__ import annotations

import os
import sys

import kernels
import kernels.attention
from benchmarks.probe_round4 import call, patched
from benchmarks.probe_round20 import times
from benchmarks.probe_round23 import LAYOUTS, bits_cells, bits_rows

T = kernels.Tuning
KT = T(keys_rows=True)
KT_WALK = T(keys_rows=True, walk_lead=True)
KT_LEADS = T(keys_rows=True, walk_lead=False)
NO_KT = T(keys_rows=False)
REPEATS = 3
STEPS = "bits|times|plans|times2|walk"
BITS_LAYOUTS = [LAYOUTS[i] for i in (0, 3, 5)]
BITS_WORKLOADS = ["decode:1kx1", "decode:300x2", "decode:777x3,3001x2", "chunk:5/1000x2",
                  "prefill:1000,17", "prefill:1300"]
BIT_CELLS = {"fused-vs-split": (("split", NO_KT), ("fused", None)),
             "kt-walk-vs-split": (("split", NO_KT), ("split", KT_WALK)),
             "kt-leads-vs-split": (("split", NO_KT), ("split", KT_LEADS)),
             "auto-vs-split": (("split", NO_KT), ("auto", None)),
             "fused-vs-split@256": (("split@256", NO_KT), ("fused@256", None)),
             "kt-walk-vs-split@256": (("split@256", NO_KT), ("split@256", KT_WALK)),
             "control-one-size": (("split", NO_KT), ("split@1024", NO_KT)),
             "control-64-keys": (("split", NO_KT), ("auto", T(block_n=64)))}
TIME_WORKLOADS = [f"decode:{n}x{b}" for b in (1, 2, 4) for n in ("1k", "2k", "4k", "8k", "32k")
                  ] + ["decode-b8-ctx1k", "decode-b64-ctx1k", "decode-b8-ctx8k",
                       "decode-b64-ctx8k", "decode-prod64", "mixed64", "prefill-varlen"]
TIME_CELLS = {"lead128": ("auto", None), "lead256": ("auto@256", None),
              "one-size": ("auto@1024", None), "control": ("heuristic", None)}
#: Round 28's second call: auto against the other kt schedule and one split size.
TIME2_CELLS = {"auto": ("auto", None), "kt-walk": ("split", KT_WALK),
               "kt-leads": ("split", KT_LEADS), "one-size": ("auto@1024", None),
               "control": ("heuristic", None)}
#: The fourth call: walking programs of 1 or 2 splits of 1024 (``+w1``, ``+w2``: the rule
#: ``kt_walk_splits`` patched), bits against the 128-row split tile and times against auto.
WALK_BITS = ["decode:32kx1", "decode:777x3,3001x2", "decode:5000x2"]
WALK_BIT_CELLS = {"walk2-vs-split": (("split", NO_KT), ("split+w2", KT_WALK)),
                  "walk1-vs-split": (("split", NO_KT), ("split+w1", KT_WALK)),
                  "control-64-keys": (("split", NO_KT), ("auto", T(block_n=64)))}
WALK_TIMES = ["decode:32kx1", "decode:16kx2", "decode:8kx4", "decode:16kx1", "decode:24kx1",
              "decode:32kx2", "decode-b8-ctx8k"]
WALK_CELLS = {"auto": ("auto", None), "w1": ("auto+w1", None), "w2": ("auto+w2", None),
              "control": ("heuristic", None)}
PLAN_WORKLOADS = ["decode-b8-ctx1k", "decode:1kx16", "decode:1kx32", "decode-b64-ctx1k",
                  "decode:1kx256", "decode:600x64", "decode:2kx8", "decode:2kx64"]
PLAN_CELLS = {"auto": ("auto", None), "fused": ("fused", None), "split": ("split", None),
              "split-128-rows": ("split", NO_KT), "one-size": ("auto@1024", None)}


def make(batch, cell: str, tuning):
    """The call of ``cell`` (``PLAN@LEAD``, module docstring) on ``batch``."""
    cell, *switches = cell.split("+")
    if switches:  # +wK: kt_walk_splits gives K
        k = int(switches[0].removeprefix("w"))
        return patched(make(batch, cell, tuning), kernels.attention, "kt_walk_splits",
                       lambda programs, sms: k)
    base, _, lead = cell.partition("@")
    lead_size = int(lead) if lead else None
    if base == "heuristic":
        return call(batch, "auto", tuning, split_size=None)
    if base not in kernels.PLANS:
        raise ValueError(f"cell {cell!r}: expected a plan {kernels.PLANS} or 'heuristic'")
    fn = call(batch, base, tuning)
    lens = (batch.q_lens(), batch.kv_lens.tolist())  # on the host, before any capture

    def run():
        # call() passes the default lead; the lead size goes through the public argument.
        return kernels.unified_attention(
            batch.q, batch.k_cache, batch.v_cache, batch.cu_seqlens_q, batch.kv_lens,
            batch.block_table, sm_scale=batch.sm_scale, plan=base, tuning=tuning,
            validate=False, host_lens=lens, lead_split_size=lead_size)
    return fn if lead_size is None else run


def main() -> None:
    args = sys.argv[1:]
    if len(args) < 2 or args[1] not in STEPS.split("|"):
        sys.exit(f"usage: python benchmarks/probe_round28.py OUT_DIR {STEPS} [WORKLOAD ...]")
    out_dir, step, specs = args[0], args[1], args[2:]
    os.makedirs(out_dir, exist_ok=True)
    if step == "bits":
        bits_rows(out_dir, "bits.jsonl", specs or BITS_WORKLOADS, BITS_LAYOUTS,
                  lambda batch: dict(bits_differing=bits_cells(
                      BIT_CELLS, lambda side: make(batch, side[0], side[1])())))
    elif step == "walk":
        bits_rows(out_dir, "walk-bits.jsonl", WALK_BITS, BITS_LAYOUTS[:1],
                  lambda batch: dict(bits_differing=bits_cells(
                      WALK_BIT_CELLS, lambda side: make(batch, side[0], side[1])())))
        times(out_dir, specs, cells=WALK_CELLS, base="auto", defaults=WALK_TIMES,
              repeats=REPEATS, make=make, name="walk-times.jsonl")
    elif step == "times2":
        times(out_dir, specs, cells=TIME2_CELLS, base="auto", defaults=TIME_WORKLOADS,
              repeats=REPEATS, make=make, name="times2.jsonl")
    elif step == "plans":
        times(out_dir, specs, cells=PLAN_CELLS, base="auto", defaults=PLAN_WORKLOADS,
              repeats=REPEATS, make=make, name="plans.jsonl")
    else:
        times(out_dir, specs, cells=TIME_CELLS, base="lead128", defaults=TIME_WORKLOADS,
              repeats=REPEATS, make=make)


if __name__ == "__main__":
    main()
