"""How fast one tile's ``wgmma`` group runs on an H100 (round 19, reports/h100-round19/README.md).

    python benchmarks/wgmma_rate.py [--iters N] [--json PATH]

The Gluon prefill tile's consumers wait on their own ``wgmma`` for about 10% of the kernel's warp
samples, FlashInfer's FA3 for under 1% (Nsight Compute, round 19 call 1). Each cell here is one
kernel of 132 programs (one per SM), each looping ``--iters`` times over one ``wgmma`` group
from a zero accumulator and its wait, the shape of one step of that tile:

- ``s64-ss``: the score group, m64n64k16 x 8 (K = 128) per warpgroup, q and K from shared
  memory, as the Gluon tile issues it;
- ``s128-ss``: the same with 128 keys (m64n128k16 x 8): two 64-key tiles' scores at once;
- ``s64-rs``: the 64-key score group with q in registers;
- ``pv-rs``: the ``p @ v`` group, m64n128k16 x 4 (K = 64), p in registers, V from shared memory;

each with two warpgroups per program (128 rows, as the tile) and, ``-1wg``, with one; and
(round 26) the keys-as-rows decode tile's groups on its one warpgroup, n8 (8 rows per block):

- ``kt-s``: its score group ``s^T = k @ q^T``, m64n8k16 x 16 (128 keys on M, K = 128), K and q
  from shared memory (``kt-s16``: n16, blocks of 16 rows);
- ``kt-pv2``: its ``p @ v`` group with 2 V column blocks, m64n8k16 x 8 (64 V columns on M, K =
  128 keys), both operands in shared memory (V not transposed here; the tile reads V^T).

The loop adds each result into a register sum so no group is dead. Reports tensor throughput
(TFLOP/s) and cycles per group per warpgroup at the SM clock nvidia-smi reads meanwhile.
Needs Triton 3.6's Gluon and a Hopper GPU.
"""

from __future__ import annotations

import argparse
import functools
import json
import subprocess

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import warpgroup_mma, warpgroup_mma_wait

SMEM_L: gl.constexpr = gl.constexpr(gl.NVMMASharedLayout(
    swizzle_byte_width=128, element_bitwidth=16, rank=2))


@gluon.jit
def _rate_kernel(a_ptr, b_ptr, out_ptr, iters, M: gl.constexpr, N: gl.constexpr,
                 K: gl.constexpr, A_REGS: gl.constexpr, WARPS: gl.constexpr):
    """``iters`` x (``[M, K] @ [K, N]`` from zero, wait, add into a sum); a ``[M, K]``, b
    ``[N, K]`` bf16 (b's transpose is the operand, as K in the score ``wgmma``)."""
    ACC_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1],
                                                    instr_shape=[16, N, 16])
    LD_L: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[4, 8],
                                          warps_per_cta=[WARPS, 1], order=[1, 0])
    o_m = gl.arange(0, M, layout=gl.SliceLayout(1, LD_L))
    o_n = gl.arange(0, N, layout=gl.SliceLayout(1, LD_L))
    o_k = gl.arange(0, K, layout=gl.SliceLayout(0, LD_L))
    a = gl.load(a_ptr + o_m[:, None] * K + o_k[None, :])
    b = gl.load(b_ptr + o_n[:, None] * K + o_k[None, :])
    a_s = gl.allocate_shared_memory(a.dtype, [M, K], SMEM_L, a)
    b_s = gl.allocate_shared_memory(b.dtype, [N, K], SMEM_L, b)
    zero = gl.full([M, N], 0.0, gl.float32, layout=ACC_L)
    total = zero
    if A_REGS:
        a_op = a_s.load(gl.DotOperandLayout(operand_index=0, parent=ACC_L, k_width=2))
        for _ in range(iters):
            tok = warpgroup_mma(a_op, b_s.permute((1, 0)), zero, is_async=True)
            total += warpgroup_mma_wait(0, deps=[tok])
    else:
        for _ in range(iters):
            tok = warpgroup_mma(a_s, b_s.permute((1, 0)), zero, is_async=True)
            total += warpgroup_mma_wait(0, deps=[tok])
    o_mo = gl.arange(0, M, layout=gl.SliceLayout(1, ACC_L))
    o_no = gl.arange(0, N, layout=gl.SliceLayout(0, ACC_L))
    gl.store(out_ptr + gl.program_id(0) * M * N + o_mo[:, None] * N + o_no[None, :], total)


#: name -> (M: rows of a per program, N, K, A in registers, warps)
CELLS = {
    "s64-ss": (128, 64, 128, False, 8),
    "s128-ss": (128, 128, 128, False, 8),
    "s64-rs": (128, 64, 128, True, 8),
    "pv-rs": (128, 128, 64, True, 8),
    "s64-ss-1wg": (64, 64, 128, False, 4),
    "s128-ss-1wg": (64, 128, 128, False, 4),
    "s64-rs-1wg": (64, 64, 128, True, 4),
    "pv-rs-1wg": (64, 128, 64, True, 4),
    "kt-s-1wg": (128, 8, 128, False, 4),
    "kt-s16-1wg": (128, 16, 128, False, 4),
    "kt-pv2-1wg": (64, 8, 128, False, 4),
}


def _launch(sms: int, av: torch.Tensor, bv: torch.Tensor, out: torch.Tensor, m: int, n: int,
            k: int, regs: bool, warps: int, iters: int) -> None:
    _rate_kernel[(sms,)](av, bv, out, iters, M=m, N=n, K=k, A_REGS=regs, WARPS=warps,
                         num_warps=warps)


def _sm_clock_mhz() -> float | None:
    """nvidia-smi's SM clock of the GPU torch runs on (``peer_ab._smi_gpu``), None if unread."""
    from benchmarks.peer_ab import _smi_gpu

    try:
        done = subprocess.run(["nvidia-smi", *_smi_gpu(), "--query-gpu=clocks.sm",
                               "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, check=False, timeout=10)
        return float(done.stdout.split()[0])
    except (OSError, ValueError, IndexError, subprocess.SubprocessError):
        return None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--iters", type=int, default=20000)
    p.add_argument("--json", default=None)
    a = p.parse_args()
    if a.iters < 1:
        p.error(f"--iters: expected >= 1, got {a.iters}")
    if not torch.cuda.is_available():
        p.error("needs a CUDA device (Hopper)")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for name, (m, n, k, regs, warps) in CELLS.items():
        av = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        bv = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        out = torch.empty(sms, m, n, device="cuda", dtype=torch.float32)
        launch = functools.partial(_launch, sms, av, bv, out, m, n, k, regs, warps)
        launch(10)
        torch.cuda.synchronize()
        # One clock reading mid-run (the same kernel, 3x longer, in the background).
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        launch(a.iters * 3)
        clock = _sm_clock_mhz()
        torch.cuda.synchronize()
        start.record()  # type: ignore[no-untyped-call]
        launch(a.iters)
        end.record()  # type: ignore[no-untyped-call]
        torch.cuda.synchronize()
        ms = start.elapsed_time(end)  # type: ignore[no-untyped-call]
        flops = 2.0 * m * n * k * a.iters * sms
        row = dict(cell=name, rows=m, n=n, k=k, a_in_registers=regs, warps=warps, iters=a.iters,
                   ms=round(ms, 3), tflops=round(flops / ms / 1e9, 1), sm_clock_mhz=clock)
        if clock:
            # Cycles per group per warpgroup: each warpgroup issues one group per iteration.
            row["cycles_per_group"] = round(ms * 1e-3 * clock * 1e6 / a.iters, 1)
            # Tensor peak: 2048 dense bf16 FMA (4096 flop) per cycle per SM (989 TFLOP/s at
            # 1830 MHz on 132 SMs).
            row["pct_of_peak_at_clock"] = round(100 * flops / (ms * 1e-3) /
                                                (4096 * sms * clock * 1e6), 1)
        rows.append(row)
        print(json.dumps(row), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)


if __name__ == "__main__":
    main()
