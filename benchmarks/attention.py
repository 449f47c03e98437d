"""Benchmark ``kernels.unified_attention`` on a CUDA GPU against its physical limits.

    python benchmarks/attention.py --out DIR [--workloads decode-b1-ctx32k,...] [--quick]

Workloads (bf16, Hq=32, Hkv=8, D=128, page size 16, random data, physical pages shuffled, fixed
seeds) are defined in code by name. For each one it reports the median time (CUDA events, L2
flushed with a 256 MB write before every run, ``triton.testing.do_bench``) of:

- ``auto``: the invariant kernel, default split size, ``plan="auto"`` (``validate=False``: no sync);
- ``fused`` / ``split``: the same with the plan forced (identical bits);
- ``control``: ``split_size=None``, the batch-dependent FA2 split heuristic (not invariant); the
  ratio auto / control is the cost of invariance;
- ``sdpa``: torch SDPA where comparable (see ``SDPA_NOTE``);
- ``auto-S{n}``: the invariant kernel with split size n (``--split-sizes``).

Achieved bandwidth counts each request's K+V bytes once (kv_len * Hkv * D * 2 tensors * 2 bytes);
it is printed next to the HBM read bandwidth (large sum) and copy bandwidth (read + write bytes)
measured in the same run. Prefill also reports TFLOP/s, with causal FLOPs =
4 * D * Hq * sum over query rows of (number of attended keys), against a measured bf16 matmul peak
(8192^3 ``torch.matmul``). Writes ``attention.md`` and ``attention.json`` into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

HQ, HKV, D, PAGE_SIZE = 32, 8, 128, 16
DTYPE = torch.bfloat16
SDPA_NOTE = (
    "sdpa: torch.nn.functional.scaled_dot_product_attention on dense, contiguous K/V "
    "(decode: KV gathered from the pages beforehand, not timed, enable_gqa=True, one call for the "
    "batch; prefill-varlen: one dense causal call per request with K/V expanded to Hq heads "
    "beforehand, timed together). It measures a dense non-paged kernel on the same data."
)
# Skip the split plan when its fp32 workspace would exceed this (prefill: T * Hq * NS * D * 4).
MAX_WORKSPACE_BYTES = 4 << 30
# Skip SDPA when the gathered dense KV would exceed this.
MAX_SDPA_BYTES = 16 << 30


@dataclass
class Workload:
    name: str
    q_lens: list[int]
    kv_lens: list[int]
    notes: str = ""

    @property
    def kind(self) -> str:
        return "prefill" if self.name.startswith("prefill") else (
            "decode" if all(q == 1 for q in self.q_lens) else "mixed")


def _workloads() -> dict[str, Workload]:
    w: dict[str, Workload] = {}
    for b in (1, 8, 64, 256):
        for ctx_name, ctx in (("1k", 1024), ("8k", 8192), ("32k", 32768)):
            w[f"decode-b{b}-ctx{ctx_name}"] = Workload(f"decode-b{b}-ctx{ctx_name}", [1] * b,
                                                       [ctx] * b)
    g = torch.Generator().manual_seed(64)
    choices = torch.tensor([4096, 8192, 16384, 32768])
    idx = torch.multinomial(torch.tensor([35.0, 20.0, 15.0, 12.0]), 64, replacement=True,
                            generator=g)
    w["decode-prod64"] = Workload("decode-prod64", [1] * 64, choices[idx].tolist(),
                                  "KV lengths from [4k, 8k, 16k, 32k] with weights [35,20,15,12]")
    g = torch.Generator().manual_seed(65)
    q_lens, kv_lens = [], []
    for i in range(64):
        if i % 2 == 0:
            kv = int(torch.randint(1, 8193, (1,), generator=g))
            q_lens.append(1)
            kv_lens.append(kv)
        else:
            q = int(torch.randint(32, 513, (1,), generator=g))
            ctx = int(torch.randint(1, 8193, (1,), generator=g))
            q_lens.append(q)
            kv_lens.append(max(ctx, q))
    w["mixed64"] = Workload("mixed64", q_lens, kv_lens,
                            "32 decode rows on KV 1..8192 + 32 prefill chunks of 32..512 tokens")
    lens = [16384, 8192, 4096, 4096, 2048, 1024, 512, 512]
    w["prefill-varlen"] = Workload("prefill-varlen", lens, list(lens), "causal prefill from 0")
    return w


WORKLOADS = _workloads()


@dataclass
class Tensors:
    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    cu_seqlens_q: torch.Tensor
    kv_lens: torch.Tensor
    block_table: torch.Tensor
    pages: list[torch.Tensor] = field(default_factory=list)  # physical pages of each request

    def args(self) -> tuple[torch.Tensor, ...]:
        return (self.q, self.k_cache, self.v_cache, self.cu_seqlens_q, self.kv_lens,
                self.block_table)


def build(w: Workload, seed: int = 0) -> Tensors:
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(seed)
    n_pages = [math.ceil(k / PAGE_SIZE) for k in w.kv_lens]
    total = sum(n_pages)
    perm = torch.randperm(total, device=dev, generator=g).to(torch.int32)
    max_pages = max(n_pages)
    bt = torch.zeros((len(n_pages), max_pages), dtype=torch.int32, device=dev)
    pages, off = [], 0
    for b, n in enumerate(n_pages):
        bt[b, :n] = perm[off:off + n]
        pages.append(perm[off:off + n].long())
        off += n
    k = torch.randn((total, PAGE_SIZE, HKV, D), device=dev, dtype=DTYPE, generator=g)
    v = torch.randn((total, PAGE_SIZE, HKV, D), device=dev, dtype=DTYPE, generator=g)
    T = sum(w.q_lens)
    q = torch.randn((T, HQ, D), device=dev, dtype=DTYPE, generator=g)
    cu = torch.tensor([0, *torch.tensor(w.q_lens).cumsum(0).tolist()], dtype=torch.int32,
                      device=dev)
    kv = torch.tensor(w.kv_lens, dtype=torch.int32, device=dev)
    return Tensors(q, k, v, cu, kv, bt, pages)


def kv_bytes(w: Workload) -> int:
    return sum(w.kv_lens) * HKV * D * 2 * DTYPE.itemsize


def causal_flops(w: Workload) -> int:
    # Row i of a request with q_len Q and kv_len K attends to K - Q + i + 1 keys.
    rows = sum(q * (k - q) + q * (q + 1) // 2 for q, k in zip(w.q_lens, w.kv_lens, strict=True))
    return 4 * D * HQ * rows


def bench(fn: Callable[[], Any], quick: bool, graph: bool = True) -> float:
    """Median milliseconds, L2 flushed before every run (do_bench's 256 MB cache clear).

    ``graph=True`` captures ``fn`` in a CUDA graph and times its replay: GPU time without the
    Python launch overhead (what a serving engine replaying graphs pays). ``graph=False`` times
    the eager call, launch overhead included.
    """
    import triton.testing

    fn()
    torch.cuda.synchronize()
    run = fn
    if graph:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            fn()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        run = g.replay
    return float(triton.testing.do_bench(run, warmup=10 if quick else 25,
                                         rep=40 if quick else 200, return_mode="median"))


def measure_limits(quick: bool) -> dict[str, float]:
    n = (1 << 30) if quick else (4 << 30)  # bytes
    x = torch.empty(n // 2, dtype=torch.bfloat16, device="cuda").normal_()
    y = torch.empty_like(x)
    t_sum = bench(lambda: x.sum(dtype=torch.float32), quick)
    t_copy = bench(lambda: y.copy_(x), quick)
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    t_mm = bench(lambda: torch.matmul(a, b), quick)
    return {
        "hbm_read_GBps": n / t_sum / 1e6,
        "copy_GBps": 2 * n / t_copy / 1e6,
        "bf16_matmul_TFLOPs": 2 * 8192**3 / t_mm / 1e9,
    }


def sdpa_fn(w: Workload, t: Tensors) -> Callable[[], Any] | None:
    import torch.nn.functional as F

    if w.kind == "decode" and len(set(w.kv_lens)) == 1:
        B, L = len(w.kv_lens), w.kv_lens[0]
        if B * L * HKV * D * 2 * DTYPE.itemsize > MAX_SDPA_BYTES:
            return None
        idx = torch.stack(t.pages)  # [B, n_pages]
        k = t.k_cache[idx].reshape(B, -1, HKV, D)[:, :L].transpose(1, 2).contiguous()
        v = t.v_cache[idx].reshape(B, -1, HKV, D)[:, :L].transpose(1, 2).contiguous()
        q = t.q.view(B, HQ, 1, D)
        return lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    if w.kind == "prefill":
        qs, ks, vs = [], [], []
        off = 0
        for b, L in enumerate(w.q_lens):
            qs.append(t.q[off:off + L].transpose(0, 1).unsqueeze(0))
            kk = t.k_cache[t.pages[b]].reshape(-1, HKV, D)[:L]
            vv = t.v_cache[t.pages[b]].reshape(-1, HKV, D)[:L]
            ks.append(kk.repeat_interleave(HQ // HKV, 1).transpose(0, 1).unsqueeze(0).contiguous())
            vs.append(vv.repeat_interleave(HQ // HKV, 1).transpose(0, 1).unsqueeze(0).contiguous())
            off += L

        def run() -> None:
            for q, k, v in zip(qs, ks, vs, strict=True):
                F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return run
    return None


def run_workload(w: Workload, quick: bool, split_sizes: list[int]) -> dict[str, Any]:
    import kernels
    from kernels import plan_attention, unified_attention

    t = build(w)
    T = t.q.shape[0]
    res: dict[str, Any] = {"workload": w.name, "kind": w.kind, "requests": len(w.q_lens),
                           "query_tokens": T, "max_kv": max(w.kv_lens), "notes": w.notes,
                           "kv_bytes": kv_bytes(w), "flops": causal_flops(w), "ms": {}}
    max_kv = max(w.kv_lens)

    def call(**kw: Any) -> Callable[[], Any]:
        return lambda: unified_attention(*t.args(), validate=False, **kw)

    variants: dict[str, Callable[[], Any] | None] = {
        "auto": call(),
        "auto-eager": call(),
        "fused": call(plan="fused"),
        "control": call(split_size=None),
    }
    ws = T * HQ * math.ceil(max_kv / kernels.DEFAULT_SPLIT_SIZE) * D * 4
    variants["split"] = call(plan="split") if ws <= MAX_WORKSPACE_BYTES else None
    for s in split_sizes:
        if s != kernels.DEFAULT_SPLIT_SIZE:
            variants[f"auto-S{s}"] = call(split_size=s)
            variants[f"fused-S{s}"] = call(split_size=s, plan="fused")
            ws = T * HQ * math.ceil(max_kv / s) * D * 4
            variants[f"split-S{s}"] = (call(split_size=s, plan="split")
                                       if ws <= MAX_WORKSPACE_BYTES else None)
    variants["sdpa"] = sdpa_fn(w, t)
    for name, fn in variants.items():
        if fn is None:
            res["ms"][name] = None
            continue
        try:
            res["ms"][name] = bench(fn, quick, graph=name != "auto-eager")
        except Exception as exc:  # report and go on: one failing variant must not hide the rest
            res["ms"][name] = None
            res.setdefault("errors", {})[name] = f"{type(exc).__name__}: {exc}"[:300]
    # Which plan auto picks without host statistics (validate=False, as timed) and with them
    # (validate=True: one sync per call, not timed here).
    res["auto_plan_no_stats"] = plan_attention(*t.args(), validate=False).plan
    res["auto_plan_host_stats"] = plan_attention(*t.args(), validate=True).plan
    return res


def environment(argv: list[str]) -> dict[str, Any]:
    import triton

    try:
        driver = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        driver = "unknown"
    props = torch.cuda.get_device_properties(0)
    return {
        "gpu": torch.cuda.get_device_name(0),
        "sms": props.multi_processor_count,
        "driver": driver,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "command": " ".join(["python", *argv]),
        "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
    }


def to_markdown(env: dict[str, Any], limits: dict[str, float], rows: list[dict[str, Any]]) -> str:
    lines = [
        "# unified_attention benchmark",
        "",
        f"GPU: {env['gpu']} ({env['sms']} SMs), driver {env['driver']}, torch {env['torch']} "
        f"(CUDA {env['cuda']}), triton {env['triton']}. Command: `{env['command']}` "
        f"({env['date_utc']} UTC).",
        "",
        f"Measured in this run: HBM read {limits['hbm_read_GBps']:.0f} GB/s (bf16 sum), copy "
        f"{limits['copy_GBps']:.0f} GB/s (read + write), bf16 matmul "
        f"{limits['bf16_matmul_TFLOPs']:.0f} TFLOP/s (8192^3).",
        "",
        "bf16, Hq=32, Hkv=8, D=128, page 16, shuffled pages. Times are medians in microseconds, "
        "L2 flushed, CUDA-graph replay (GPU time) except `auto-eager` (eager call, Python launch "
        "overhead included). GB/s = K+V bytes (each request once) / time of `auto`; %HBM against "
        "the measured read bandwidth. TFLOP/s = 4*D*Hq*sum(attended keys per row) / time of "
        "`auto`.",
        "",
    ]
    names: list[str] = []
    for r in rows:
        for n in r["ms"]:
            if n not in names:
                names.append(n)
    header = ["workload", *[f"{n} us" for n in names], "auto/control", "GB/s", "%HBM",
              "TFLOP/s", "%peak"]
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "---|" * len(header))
    for r in rows:
        ms = r["ms"]
        cells = [r["workload"]]
        cells += [f"{ms[n] * 1e3:.1f}" if ms.get(n) is not None else "n/a" for n in names]
        a, c = ms.get("auto"), ms.get("control")
        cells.append(f"{a / c:.2f}" if a and c else "n/a")
        if a:
            gbps = r["kv_bytes"] / a / 1e6
            tflops = r["flops"] / a / 1e9
            cells += [f"{gbps:.0f}", f"{100 * gbps / limits['hbm_read_GBps']:.0f}%",
                      f"{tflops:.0f}", f"{100 * tflops / limits['bf16_matmul_TFLOPs']:.0f}%"]
        else:
            cells += ["n/a"] * 4
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", SDPA_NOTE, "",
              "auto without host statistics (validate=False, as timed) picks: " + ", ".join(
                  f"{r['workload']}={r['auto_plan_no_stats']}" for r in rows),
              "",
              "auto with host statistics (validate=True) picks: " + ", ".join(
                  f"{r['workload']}={r['auto_plan_host_stats']}" for r in rows)]
    errs = [f"- {r['workload']} {k}: {v}" for r in rows for k, v in r.get("errors", {}).items()]
    if errs:
        lines += ["", "Errors:", *errs]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="output directory (attention.md, attention.json)")
    p.add_argument("--workloads", default="all", help="comma-separated names, or 'all'")
    p.add_argument("--split-sizes", default="", help="extra split sizes to time, e.g. 256,1024")
    p.add_argument("--quick", action="store_true", help="fewer repetitions (smoke runs)")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks/attention.py needs a CUDA GPU: torch.cuda.is_available() "
                         "is False")
    names = list(WORKLOADS) if args.workloads == "all" else args.workloads.split(",")
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        raise SystemExit(f"unknown workloads {unknown}; known: {list(WORKLOADS)}")
    split_sizes = [int(s) for s in args.split_sizes.split(",") if s]
    os.makedirs(args.out, exist_ok=True)
    env = environment(["benchmarks/attention.py", *argv])
    limits = measure_limits(args.quick)
    torch.cuda.empty_cache()
    print(json.dumps(limits), flush=True)
    rows = []
    for n in names:
        t0 = time.time()
        r = run_workload(WORKLOADS[n], args.quick, split_sizes)
        torch.cuda.empty_cache()
        rows.append(r)
        ms = {k: (round(v * 1e3, 1) if v is not None else None) for k, v in r["ms"].items()}
        print(f"{n}: {ms} us ({time.time() - t0:.1f}s)", flush=True)
        if r.get("errors"):
            print("  errors:", r["errors"], flush=True)
    md = to_markdown(env, limits, rows)
    with open(os.path.join(args.out, "attention.md"), "w") as f:
        f.write(md)
    with open(os.path.join(args.out, "attention.json"), "w") as f:
        json.dump({"environment": env, "limits": limits, "results": rows}, f, indent=2)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
