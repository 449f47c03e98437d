"""Round 19's offline compile statistics of the Gluon prefill tile's experiment builds
(reports/h100-round19/cpu/compile.md): registers, spills and shared memory as ptxas reports them
for sm_90a, without a GPU.

    PYTHONPATH=/path/to/triton-3.6:. python benchmarks/compile_round19.py

Needs Triton 3.6 (its Gluon) and the switches of round 19's experiment commits (all at 37d9540;
``kernels._gluon.PINGPONG`` etc.), which the kept tree does not have. Each cell compiles
``launch_fused_prefill`` at ``block_n`` keys with the switches set, as the probe launches it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch

import kernels._gluon as kg
from benchmarks.kernel_stats import _ptxas_stats, _Recorder

#: (block_n, switches): the cells of reports/h100-round19/cpu/compile.md.
CELLS: list[tuple[int, dict[str, Any]]] = [
    (64, {}), (64, {"FOLDLESS": True}), (64, {"Q_REGS": True}),
    (64, {"FOLDLESS": True, "Q_REGS": True}), (64, {"FOLDLESS": True, "KEEP_P": True}),
    (64, {"FOLD_GLOBAL": True, "KEEP_P": True}),
    (128, {}), (128, {"CONSUMER_REGS": 240}), (128, {"FOLDLESS": True}),
    (128, {"FOLDLESS": True, "CONSUMER_REGS": 240}), (128, {"FOLDLESS": True, "Q_REGS": True}),
    (128, {"FOLDLESS": True, "KEEP_P": True}),
    (128, {"FOLDLESS": True, "KEEP_P": True, "CONSUMER_REGS": 240}),
    (128, {"KEEP_P": True, "CONSUMER_REGS": 240}),
    (128, {"FOLD_GLOBAL": True, "KEEP_P": True}),
    (128, {"FOLD_GLOBAL": True, "KEEP_P": True, "CONSUMER_REGS": 240}),
    (128, {"FOLD_GLOBAL": True, "KEEP_P": True, "FOLD_PREFETCH": True}),
    (128, {"FOLD_GLOBAL": True, "KEEP_P": True, "FOLD_PREFETCH": True, "CONSUMER_REGS": 240}),
    (64, {"SERIAL": True, "KEEP_P": True}),
    (128, {"SERIAL": True, "KEEP_P": True}),
    (128, {"SERIAL": True, "KEEP_P": True, "CONSUMER_REGS": 240}),
]


def _compiled(kernel_name: str, launch: Callable[[], None],
              switches: dict[str, Any] | None = None) -> tuple[dict[str, int], int]:
    """(ptxas statistics, shared memory bytes) of the Gluon kernel ``kernel_name`` as ``launch``
    would launch it, compiled for sm_90 (the kernel stood in by a recorder), with
    ``kernels._gluon``'s ``switches`` set meanwhile."""
    from kernels._gluon import attention_kernels as ak

    switches = switches or {}
    out: list[Any] = []
    saved = {k: getattr(kg, k) for k in switches}
    kernel = getattr(ak, kernel_name)
    setattr(ak, kernel_name, _Recorder(kernel_name, kernel, out))
    try:
        for k, v in switches.items():
            setattr(kg, k, v)
        launch()
    finally:
        setattr(ak, kernel_name, kernel)
        for k, v in saved.items():
            setattr(kg, k, v)
    compiled = out[-1][1]
    return _ptxas_stats(compiled.asm["ptx"]), compiled.metadata.shared


def compile_cell(block_n: int, switches: dict[str, Any]) -> tuple[dict[str, int], int]:
    """One cell: ``launch_fused_prefill`` at ``block_n`` keys with ``switches``."""
    T, Hq, Hkv, D, PS, P = 4096, 32, 8, 128, 16, 512
    q = torch.empty(T, Hq, D, dtype=torch.bfloat16)
    kc = torch.empty(P, PS, Hkv, D, dtype=torch.bfloat16)
    cu = torch.zeros(2, dtype=torch.int32)

    def launch() -> None:
        kg.launch_fused_prefill(q, kc, torch.empty_like(kc), cu, torch.zeros(1, dtype=torch.int32),
                                torch.zeros(1, P, dtype=torch.int32), cu, torch.empty_like(q),
                                torch.empty(T, Hq), 0.1, num_slots=128,
                                split_tiles=1024 // block_n, block_m=128, block_q=32,
                                block_n=block_n, is_slot_order=False)
    return _compiled("_fused_prefill_kernel", launch, switches)


def compile_split(block_n: int) -> tuple[dict[str, int], int]:
    """``launch_split_decode`` at ``block_n`` keys (call 12's split-plan Gluon kernel)."""
    T, Hq, Hkv, D, PS, P = 8, 32, 8, 128, 16, 4096
    q = torch.empty(T, Hq, D, dtype=torch.bfloat16)
    kc = torch.empty(P, PS, Hkv, D, dtype=torch.bfloat16)

    def launch() -> None:
        kg.launch_split_decode(q, kc, torch.empty_like(kc), torch.zeros(9, dtype=torch.int32),
                               torch.zeros(8, dtype=torch.int32),
                               torch.zeros(8, 1024, dtype=torch.int32),
                               torch.empty(T, Hq, 8, D), torch.empty(T, Hq, 8, 2), 0.1,
                               num_slots=8, num_splits=8, split_tiles=1024 // block_n,
                               block_m=128, block_q=32, block_n=block_n)
    return _compiled("_split_decode_kernel", launch)


def main() -> None:
    if not hasattr(kg, "SERIAL"):
        sys.exit("compile_round19.py: kernels._gluon has no round-19 switches; they live at commit "
                 "37d9540 (reports/h100-round19/README.md)")
    print("| block_n | switches | regs at launch | spill stores / loads B | shared B |")
    print("|---|---|---|---|---|")
    for block_n, switches in CELLS:
        stats, shared = compile_cell(block_n, switches)
        names = ", ".join(f"{k}={v}" for k, v in switches.items()) or "(default)"
        print(f"| {block_n} | {names} | {stats['regs']} | {stats['spill_stores']} / "
              f"{stats['spill_loads']} | {shared} |", flush=True)
    if hasattr(kg, "launch_split_decode"):
        for block_n in (64, 128):
            stats, shared = compile_split(block_n)
            print(f"| {block_n} | split-plan kernel (`launch_split_decode`) | {stats['regs']} | "
                  f"{stats['spill_stores']} / {stats['spill_loads']} | {shared} |", flush=True)


if __name__ == "__main__":
    main()
