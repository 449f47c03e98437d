"""GPU probe (round 5): is a decode tile with swapped MMA operands bit-identical to the prefill
tile, and how much faster is its chain of tiles?

Standalone Triton kernels on contiguous K/V (no paging), one program per head:

- ``std``: the prefill tile, rows = (token, head) pairs on the MMA's M dimension:
  ``S = Q K^T``, ``acc = P V``; the softmax denominator ``l`` accumulated either by ``tl.sum``
  (the kernels' current form) or on the tensor cores as ``P @ ones`` (``lmode=mma``).
- ``swap``: the decode tile with the KV tile on the M dimension: ``S^T = K Q^T``,
  ``acc^T = V^T P^T``, ``l = ones @ P^T``.

Compares raw bits of the first tile's scores, the final accumulator and ``l`` (against std with
``l`` on the tensor cores) and prints which MMA instructions each kernel uses. The times (CUDA
events around one launch from Python, median of 50) are dominated by launch overhead (~40 us);
they are not kernel times.

    python benchmarks/probe_swap.py OUT_DIR
"""

from __future__ import annotations

import json
import os
import sys

import torch
import triton
import triton.language as tl

# TRITON_INTERPRET=1 runs it on the CPU (a smoke run: the interpreter's bits say nothing).
INTERP = os.environ.get("TRITON_INTERPRET") == "1"
DEV = "cpu" if INTERP else "cuda"


def sync() -> None:
    if not INTERP:
        torch.cuda.synchronize()


@triton.jit
def _std_kernel(q_ptr, k_ptr, v_ptr, s_ptr, acc_ptr, l_ptr, qk_scale, NT,
                R: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, D: tl.constexpr,
                NL: tl.constexpr, L_MMA: tl.constexpr):
    h = tl.program_id(0)
    o_m = tl.arange(0, BM)
    o_d = tl.arange(0, D)
    o_n = tl.arange(0, BN)
    q = tl.load(q_ptr + h * R * D + o_m[:, None] * D + o_d[None, :], mask=o_m[:, None] < R,
                other=0.0)
    m_i = tl.full([BM], float("-inf"), tl.float32)
    l_i = tl.zeros([BM], tl.float32)
    l_acc = tl.zeros([BM, NL], tl.float32)
    acc = tl.zeros([BM, D], tl.float32)
    ones = tl.full([BN, NL], 1.0, tl.float16)
    kv = k_ptr + h * NT * BN * D
    vv = v_ptr + h * NT * BN * D
    for j in range(NT):
        o_k = j * BN + o_n
        kt = tl.load(kv + o_k[None, :] * D + o_d[:, None])  # [D, BN]
        v = tl.load(vv + o_k[:, None] * D + o_d[None, :])  # [BN, D]
        s = tl.dot(q, kt)
        if j == 0:
            tl.store(s_ptr + h * BM * BN + o_m[:, None] * BN + o_n[None, :], s)
        m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
        alpha = tl.where(m_new == m_i, 1.0, tl.exp2(m_i - m_new))
        p = tl.exp2(tl.fma(s, qk_scale, -m_new[:, None]))
        if L_MMA:
            l_acc = tl.dot(p.to(tl.float16), ones, l_acc * alpha[:, None])
        else:
            l_i = l_i * alpha + tl.sum(p, 1)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        m_i = m_new
    if L_MMA:
        l_i = tl.max(l_acc, 1)
    tl.store(acc_ptr + h * R * D + o_m[:, None] * D + o_d[None, :], acc, mask=o_m[:, None] < R)
    tl.store(l_ptr + h * R + o_m, l_i, mask=o_m < R)


@triton.jit
def _swap_kernel(q_ptr, k_ptr, v_ptr, s_ptr, acc_ptr, l_ptr, qk_scale, NT,
                 R: tl.constexpr, BR: tl.constexpr, BN: tl.constexpr, D: tl.constexpr,
                 ML: tl.constexpr):
    h = tl.program_id(0)
    o_r = tl.arange(0, BR)
    o_d = tl.arange(0, D)
    o_n = tl.arange(0, BN)
    qt = tl.load(q_ptr + h * R * D + o_r[None, :] * D + o_d[:, None], mask=o_r[None, :] < R,
                 other=0.0)  # [D, BR]
    m_i = tl.full([BR], float("-inf"), tl.float32)
    l_acc = tl.zeros([ML, BR], tl.float32)
    acc = tl.zeros([D, BR], tl.float32)
    ones = tl.full([ML, BN], 1.0, tl.float16)
    kv = k_ptr + h * NT * BN * D
    vv = v_ptr + h * NT * BN * D
    for j in range(NT):
        o_k = j * BN + o_n
        k = tl.load(kv + o_k[:, None] * D + o_d[None, :])  # [BN, D]
        vt = tl.load(vv + o_k[None, :] * D + o_d[:, None])  # [D, BN]
        s = tl.dot(k, qt)  # [BN, BR]
        if j == 0:
            tl.store(s_ptr + h * BR * BN + o_r[None, :] * BN + o_n[:, None], s)
        m_new = tl.maximum(m_i, tl.max(s, 0) * qk_scale)
        alpha = tl.where(m_new == m_i, 1.0, tl.exp2(m_i - m_new))
        p = tl.exp2(tl.fma(s, qk_scale, -m_new[None, :]))
        l_acc = tl.dot(ones, p.to(tl.float16), l_acc * alpha[None, :])
        acc = tl.dot(vt, p.to(vt.dtype), acc * alpha[None, :])
        m_i = m_new
    l_i = tl.max(l_acc, 0)
    tl.store(acc_ptr + h * R * D + o_r[None, :] * D + o_d[:, None], acc, mask=o_r[None, :] < R)
    tl.store(l_ptr + h * R + o_r, l_i, mask=o_r < R)


def mma_kinds(compiled) -> list[str]:
    if INTERP:
        return []
    ptx = compiled.asm["ptx"]
    kinds = set()
    for line in ptx.splitlines():
        line = line.strip()
        if line.startswith("wgmma.mma_async") or line.startswith("mma.sync"):
            kinds.add(line.split()[0])
    return sorted(kinds)


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32)


def main(out_dir: str) -> None:
    rows = []
    D, BN = 128, 64
    for dtype in (torch.bfloat16, torch.float16):
        for seed, scale_q in ((0, 1.0), (1, 4.0), (2, 0.25)):
            for R, NT in ((4, 16), (16, 16), (4, 3)):
                H = 8
                g = torch.Generator(device=DEV).manual_seed(seed)
                q = (torch.randn(H, R, D, device=DEV, generator=g) * scale_q).to(dtype)
                k = torch.randn(H, NT * BN, D, device=DEV, generator=g).to(dtype)
                v = torch.randn(H, NT * BN, D, device=DEV, generator=g).to(dtype)
                qk_scale = 1.4426950408889634 / D**0.5
                res = {}
                for name in ("std_sum", "std_mma", "std128_mma", "swap"):
                    BM = 128 if name == "std128_mma" else 64
                    BR = 16
                    if name == "swap":
                        s = torch.empty(H, BR, BN, device=DEV)
                    else:
                        s = torch.empty(H, BM, BN, device=DEV)
                    acc = torch.empty(H, R, D, device=DEV)
                    l = torch.empty(H, R, device=DEV)
                    args = (q, k, v, s, acc, l, qk_scale, NT)
                    if name == "swap":
                        c = _swap_kernel[(H,)](*args, R=R, BR=BR, BN=BN, D=D, ML=64, num_warps=4,
                                               num_stages=2)
                    else:
                        c = _std_kernel[(H,)](*args, R=R, BM=BM, BN=BN, D=D, NL=16,
                                              L_MMA=name != "std_sum",
                                              num_warps=8 if BM == 128 else 4, num_stages=2)
                    sync()
                    def fn(args=args, name=name, BM=BM, BR=BR, H=H, R=R):
                        if name == "swap":
                            return _swap_kernel[(H,)](*args, R=R, BR=BR, BN=BN, D=D, ML=64,
                                                      num_warps=4, num_stages=2)
                        return _std_kernel[(H,)](*args, R=R, BM=BM, BN=BN, D=D, NL=16,
                                                 L_MMA=name != "std_sum",
                                                 num_warps=8 if BM == 128 else 4, num_stages=2)
                    ts = [0.0] * 20
                    for _ in range(0 if INTERP else 60):
                        e0, e1 = torch.cuda.Event(True), torch.cuda.Event(True)
                        e0.record()
                        fn()
                        e1.record()
                        sync()
                        ts.append(e0.elapsed_time(e1) * 1000)
                    ts = sorted(ts[10:])
                    res[name] = dict(s=s[:, :R, :].clone(), acc=acc.clone(), l=l.clone(),
                                     us=ts[len(ts) // 2], mma=mma_kinds(c))
                base = res["std_mma"]
                for name, r in res.items():
                    row = dict(dtype=str(dtype), seed=seed, scale_q=scale_q, R=R, NT=NT,
                               kernel=name, us=round(r["us"], 2), mma=r["mma"],
                               s_bits_differ=int((bits(r["s"]) != bits(base["s"])).sum()),
                               acc_bits_differ=int((bits(r["acc"]) != bits(base["acc"])).sum()),
                               l_bits_differ=int((bits(r["l"]) != bits(base["l"])).sum()),
                               l_max_rel_vs_sum=float(((r["l"] - res["std_sum"]["l"]).abs()
                                                       / res["std_sum"]["l"]).max()))
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    with open(f"{out_dir}/probe-swap.jsonl", "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
