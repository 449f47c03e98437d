"""Registers, spills and shared memory of the attention kernels as compiled for an H100 (sm_90a),
on any machine: no GPU needed.

    PYTHONPATH=[TRITON_DIR:]. python benchmarks/kernel_stats.py [--workload NAME ...]
        [--plan auto|fused|split] [--heads HQ:HKV:D] [--block-m N] [--num-warps N]
        [--num-stages N] [--value-blocks N] [--tiles-per-step N] [--dtype bfloat16]
        [--kv-dtype fp8_e4m3] [--no-dependent-merge] [--fused-loop nested|flat] [--no-gluon]
        [--keys-rows | --no-keys-rows] [--ptx-hash] [--ptx-dir DIR] [--dot-waits]
        [--copy-waits] [--sass-order] [--gluon-switch NAME=VALUE ...]

For each ``invariance bench`` workload (all by default) it plans the call as ``plan_attention``
would on an H100 (132 SMs, compute capability 9.0, the workload's host lengths, ``validate``
off), then compiles every kernel the launch would run through Triton's ``warmup`` with a
stand-in driver that reports an sm_90 target (nothing is launched), and runs the ptxas that
Triton itself uses for sm_90 with ``-v`` on each PTX: registers per thread, spill stores and
loads (bytes), and the shared memory Triton allocates. Put another Triton first on
``PYTHONPATH`` (e.g. the GPU machine's 3.6, ``pip download triton==3.6.0`` unpacked) to see
what that version makes.

``--heads`` compiles at other heads than the bench's (e.g. ``16:8:256``); ``--ptx-dir DIR``
also writes each kernel's PTX there, to read an order off it (the keys-as-rows tile's row sum
was read off the Triton tiles' PTX so).

``--ptx-hash`` prints a hash of each kernel's PTX (debug lines left out) instead of the ptxas
statistics: run at two commits, equal hashes show that a refactor compiles to the same code.

``--no-gluon`` plans with ``Tuning(gluon=False)``: the Triton fused kernel where the Gluon
prefill kernel (kernels/_gluon, Triton 3.6 only) would run.

``--dot-waits`` also prints, per kernel, its ``wgmma`` dots, the waits Triton inserts after them
and its exponentials in loop order: which exponentials
run while a dot is in flight. ``--copy-waits`` adds the software pipeline's asynchronous copies
and their waits: how many steps ahead a loop loads.

``--sass-order`` adds each kernel's ``wgmma`` instructions, their waits, exponentials, row
shuffles, barriers and spills in SASS order (ptxas, then nvdisasm): where ptxas placed a wait,
which the PTX order does not decide.

Each row also counts the kernel's tensor-core instructions by family in its PTX (``wgmma``,
``mma.sync``): the instruction family is bit-defining. ``--kv-dtype fp8_e4m3`` compiles the
FP8-cache path (unit scales).

A compile statistic, not a time: it says which settings spill, not which are faster. The
kernels are compiled with the same constexprs and alignment specialisation as a real launch
(16-byte aligned pointers, strides divisible by 16), so the numbers match the GPU's for the
same Triton version.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import subprocess
import tempfile
from collections.abc import Callable
from typing import Any

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.runtime.driver import driver

import kernels
import kernels._checks as kc
import kernels.launch as kl
import kernels.plan as kp
from invariance.bench import BENCH_HEADS, BENCH_PAGE_SIZE, WORKLOADS
from invariance.workload import HeadConfig

SM90 = GPUTarget("cuda", 90, 32)
NUM_SMS = 132


class _Sm90Driver:
    """The part of Triton's driver interface that ``JITFunction.warmup`` uses, for sm_90."""

    def get_current_target(self) -> GPUTarget:
        return SM90

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def get_active_torch_device(self) -> torch.device:
        return torch.device("cpu")


class _Recorder:
    """Stands in for a jit kernel in the launcher: ``kernel[grid](*args, **kwargs)`` compiles
    it (``warmup``, no launch) and records the result."""

    def __init__(self, name: str, fn: Any, out: list[tuple[str, Any]]) -> None:
        self.name, self.fn, self.out = name, fn, out

    def __getitem__(self, grid: tuple[int, ...]) -> Callable[..., None]:
        def launch(*args: Any, **kwargs: Any) -> None:
            self.out.append((self.name, compile_sm90(self.fn, *args, grid=grid, **kwargs)))
        return launch


def compile_sm90(fn: Any, *args: Any, grid: tuple[int, ...] = (1,), **kwargs: Any) -> Any:
    """``fn`` (a ``triton.jit`` function) compiled for sm_90 with these launch arguments, as a
    launch would specialise them, without launching it or needing a GPU."""
    before = driver._active  # None on a machine without a GPU: no reset_active() there
    driver.set_active(_Sm90Driver())  # type: ignore[arg-type]
    try:
        return fn.warmup(*args, grid=grid, **kwargs)
    finally:
        driver._active = before


def _ptxas_stats(ptx: str) -> dict[str, int]:
    from triton.backends.nvidia.compiler import get_ptxas

    ptxas = get_ptxas(90).path  # the ptxas this Triton itself runs for sm_90
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        done = subprocess.run([ptxas, "-arch=sm_90a", "-v", src, "-o", os.path.join(d, "k.o")],
                              capture_output=True, text=True, check=False)
    log = done.stdout + done.stderr
    if done.returncode != 0:
        raise RuntimeError(f"{ptxas} failed ({done.returncode}): {log[-600:]}")
    stats = {"regs": int(re.search(r"Used (\d+) registers", log).group(1))}  # type: ignore[union-attr]
    spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    stats["spill_stores"], stats["spill_loads"] = (int(spill.group(1)), int(spill.group(2))) \
        if spill else (0, 0)
    return stats


_SASS_KEYS = (
    (re.compile(r"HGMMA\.(\d+x\d+x\d+)"), "mma{}"),
    (re.compile(r"WARPGROUP\.DEPBAR\.LE gsb0, (0x[0-9a-f]+)"), "wait{}"),
    (re.compile(r"MUFU\.EX2"), "exp2"),
    (re.compile(r"SHFL\.BFLY"), "shfl"),
    (re.compile(r"BAR\.SYNC"), "bar"),
    (re.compile(r"SYNCS\.ARRIVE"), "arrive"),
    (re.compile(r"SYNCS\.PHASECHK"), "mbarwait"),
    (re.compile(r"\b(?:STL|LDL)\b"), "spill"),
)


def _sass_order(cubin: bytes) -> str:
    """The kernel's tensor-core instructions, their waits, exponentials, row shuffles, barriers
    and spills in SASS order (the cubin Triton built, disassembled by Triton's nvdisasm), runs
    counted: where ptxas put each ``wgmma`` wait against the exponentials."""
    nvdisasm = triton.knobs.nvidia.nvdisasm.path  # Triton's own (or TRITON_NVDISASM_PATH)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "k.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        try:
            done = subprocess.run([nvdisasm, "-c", path], capture_output=True, text=True,
                                  check=False)
        except OSError as exc:
            raise RuntimeError(f"nvdisasm {nvdisasm!r} could not run: {exc}") from exc
    if done.returncode != 0:
        raise RuntimeError(f"{nvdisasm} failed ({done.returncode}): {done.stderr[-600:]}")
    return _sass_tokens(done.stdout)


def _sass_tokens(sass: str) -> str:
    """``nvdisasm`` output reduced to :data:`_SASS_KEYS`' tokens in order, a run of one token
    counted (``exp2x32``), ``|`` where a basic block starts."""
    tokens: list[str] = []
    for line in sass.splitlines():
        if re.match(r"\s*\.L_x_\d+:", line):
            tokens.append("|")  # a basic block starts (a label: a branch target)
            continue
        for pattern, fmt in _SASS_KEYS:
            m = pattern.search(line)
            if m:
                groups = [str(int(g, 16)) if g.startswith("0x") else g for g in m.groups()]
                tokens.append(fmt.format(*groups))
                break
    runs: list[list[Any]] = []
    for t in tokens:
        if runs and runs[-1][0] == t:
            runs[-1][1] += 1
        else:
            runs.append([t, 1])
    return " ".join(t if n == 1 or t == "|" else f"{t}x{n}" for t, n in runs)


def _ptx_hash(ptx: str) -> str:
    """A hash of the PTX without its debug lines (``.loc``, ``.file``, comments, DWARF sections
    and labels), which move with every edit of the source: two builds with the same hash
    compiled to the same instructions."""
    keep = [line for line in ptx.splitlines()
            if not re.match(r"\s*(\.loc|\.file|//|\$L__|\.section|\.b8|\.b32|\.b64)", line)
            and "debug" not in line]
    return hashlib.sha256("\n".join(keep).encode()).hexdigest()[:12]


_DOT_WAIT_OPS = re.compile(
    r"ttng\.warp_group_dot_wait [^{]*\{pendings = (\d+)"
    r"|ttng\.warp_group_dot .*-> tensor<(\d+x\d+)xf32|math\.exp2 .*: tensor<(\d+x\d+)xf32")
_COPY_OPS = re.compile(r"ttg\.async_copy_global_to_local |ttg\.async_wait .*\{num = (\d+)")


def _dot_waits(ttgir: str, copies: bool = False) -> str:
    """The order of the tensor-core dots (``dot MxN``), their waits (``wait N``: until at most N
    dots are in flight), the 2-D exponentials (``exp2 MxN``) and the loops (``for[`` ... ``]``)
    in a kernel's TTGIR: which exponentials run while a dot is in flight.

    With ``copies`` also the asynchronous copies from global to shared memory (``copy``, the
    software pipeline's loads) and their waits (``cpwait N``: until at most N copy groups are
    in flight): where a loop issues its next tiles' loads and where it waits for them.

    Regions are followed by their braces (an op line ending in ``{`` opens one, a line starting
    with ``}`` closes it), so loops and conditionals without results, which print no
    ``scf.yield``, are closed where they end."""
    out: list[str] = []
    regions: list[bool] = []  # open regions, innermost last: True for an scf.for body
    for line in ttgir.splitlines():
        text = line.strip()
        if text.startswith("}") and regions and regions.pop():
            if out and out[-1] == "for[":
                out.pop()  # a loop with no dot or exponential
            else:
                out.append("]")
        c = _COPY_OPS.search(text) if copies else None
        if c is not None:
            out.append("copy" if c.group(1) is None else f"cpwait{c.group(1)}")
        m = _DOT_WAIT_OPS.search(text)
        if m is not None:
            if m.group(1) is not None:
                out.append(f"wait{m.group(1)}")
            elif m.group(2) is not None:
                out.append(f"dot{m.group(2)}")
            else:
                out.append(f"exp2:{m.group(3)}")
        if text.endswith("{"):  # a region opens (an op's body, or an else / do branch)
            is_for = "scf.for " in text and not text.startswith("}")
            regions.append(is_for)
            if is_for:
                out.append("for[")
    return " ".join(out)


def _mma_family(ptx: str) -> str:
    """The tensor-core instructions of a kernel's PTX, counted by family: ``wgmma`` (Hopper's
    warpgroup MMA) and ``mma.sync`` (the per-warp MMA), e.g. ``wgmma 16, mma.sync 0``: which
    family each kernel compiles to (bit-defining: ARCHITECTURE.md)."""
    wgmma = len(re.findall(r"^\s*wgmma\.mma_async", ptx, re.M))
    sync = len(re.findall(r"^\s*mma\.sync", ptx, re.M))
    return f"wgmma {wgmma}, mma.sync {sync}"


def _inputs(name: str, dtype: torch.dtype, kv_dtype: torch.dtype | None = None,
            heads: HeadConfig = BENCH_HEADS) -> tuple[tuple[torch.Tensor, ...], Any]:
    """The workload's tensors at their real shapes with ``heads``, except the caches (two
    pages: only their strides reach the compiler; ``kv_dtype``: an FP8 cache), and its host
    lengths."""
    w = WORKLOADS[name]
    h = heads
    T, B = sum(w.q_lens), len(w.q_lens)
    pages = -(-max(w.kv_lens) // BENCH_PAGE_SIZE)
    q = torch.zeros(T, h.num_q_heads, h.head_dim, dtype=dtype)
    cache = torch.zeros(2, BENCH_PAGE_SIZE, h.num_kv_heads, h.head_dim,
                        dtype=kv_dtype or dtype)
    cu = torch.tensor([0, *torch.tensor(w.q_lens).cumsum(0).tolist()], dtype=torch.int32)
    kv = torch.tensor(w.kv_lens, dtype=torch.int32)
    table = torch.zeros(B, pages, dtype=torch.int32)
    return (q, cache, cache.clone(), cu, kv, table), (list(w.q_lens), list(w.kv_lens))


def stats(name: str, dtype: torch.dtype, plan: str, tuning: kernels.Tuning,
          ptx_hash: bool = False, copies: bool = False,
          sass_order: bool = False, kv_dtype: torch.dtype | None = None,
          heads: HeadConfig = BENCH_HEADS, ptx_dir: str | None = None) -> list[dict[str, Any]]:
    inputs, lens = _inputs(name, dtype, kv_dtype, heads)
    scales = {} if kv_dtype is None else {"k_scale": 1.0, "v_scale": 1.0}
    # Plan as on an H100 from CPU tensors (the checks think the interpreter is on), then
    # launch with IS_INTERPRET=False: the recorders compile instead of running.
    patches = [(kc, "_interpreting", lambda: True), (kp, "_sm_major", lambda device: 9),
               (kp, "_num_sms", lambda device: NUM_SMS), (kp, "_capturing", lambda device: False),
               (kl, "_interpreting", lambda: False)]
    saved = [(m, k, getattr(m, k)) for m, k, _ in patches]
    try:
        for m, k, v in patches:
            setattr(m, k, v)
        # The plan and the checked features, as unified_attention takes them.
        lp, features = kp._plan_call(
            *inputs, split_size=kernels.DEFAULT_SPLIT_SIZE, lead_split_size=None, plan=plan,
            validate=False, tuning=tuning, host_lens=lens, window_left=-1, sinks=None,
            logits_soft_cap=0.0, k_scale=scales.get("k_scale"), v_scale=scales.get("v_scale"))
        compiled: list[tuple[str, Any]] = []
        names = ("_unified_attention_fused_kernel", "_unified_attention_split_kernel",
                 "_merge_splits_kernel", "_slot_keys_kernel", "_slot_rank_kernel")
        jit = {n: getattr(kl, n) for n in names}
        for n in names:
            setattr(kl, n, _Recorder(n, jit[n], compiled))
        gluon = None
        gluon_jit: dict[str, Any] = {}
        if lp.gluon:  # the Gluon kernels (Triton 3.6 only)
            from kernels._gluon import attention_kernels as gluon
            for n in ("_fused_prefill_kernel", "_split_kernel", "_split_kt_kernel"):
                gluon_jit[n] = getattr(gluon, n)
                setattr(gluon, n, _Recorder(n, gluon_jit[n], compiled))
        try:
            T, Hq, D = inputs[0].shape
            out = torch.empty(T, Hq, D, dtype=dtype)
            lse = torch.empty(T, Hq, dtype=torch.float32)
            launch = kl._launch_fused if lp.plan == "fused" else kl._launch_split
            launch(lp, inputs, out, lse, 0.125, features)
        finally:
            for n in names:
                setattr(kl, n, jit[n])
            for n, fn in gluon_jit.items():
                setattr(gluon, n, fn)
    finally:
        for m, k, v in saved:
            setattr(m, k, v)
    rows = []
    for kname, k in compiled:
        if ptx_dir is not None:  # the PTX as compiled, to read a reduction's order off it
            os.makedirs(ptx_dir, exist_ok=True)
            with open(os.path.join(ptx_dir, f"{name}.{kname.strip('_')}.ptx"), "w") as fh:
                fh.write(k.asm["ptx"])
        rows.append(dict(workload=name, plan=lp.plan, block_m=lp.block_m, block_n=lp.block_n,
                         num_warps=lp.num_warps, num_stages=lp.num_stages,
                         value_blocks=lp.value_blocks,
                         tiles_per_step=getattr(lp, "tiles_per_step", 1),  # older kernels: 1
                         kernel=kname.strip("_"),
                         shared=k.metadata.shared,
                         dot_waits=_dot_waits(k.asm["ttgir"], copies),
                         mma=_mma_family(k.asm["ptx"]),
                         **(dict(ptx=_ptx_hash(k.asm["ptx"])) if ptx_hash
                            else _ptxas_stats(k.asm["ptx"])),
                         **(dict(sass_order=_sass_order(k.asm["cubin"])) if sass_order
                            else {})))
    return rows


def _set_gluon_switches(p: argparse.ArgumentParser, items: list[str]) -> None:
    """``--gluon-switch NAME=VALUE``: set a bool or int module switch of ``kernels._gluon``
    (a bool from ``true``/``false``/``1``/``0``, an int from digits); anything else is a usage
    error naming the switch, the value expected and the value given."""
    import kernels._gluon as kg

    for item in items:
        key, sep, value = item.partition("=")
        current = getattr(kg, key, None)
        if not sep or not key.isupper() or not isinstance(current, (bool, int)):
            p.error(f"--gluon-switch: expected NAME=VALUE with NAME a bool or int switch of "
                    f"kernels._gluon, got {item!r}")
        if isinstance(current, bool):
            parsed: bool | int | None = {"true": True, "1": True, "false": False,
                                         "0": False}.get(value.lower())
        else:
            parsed = int(value) if re.fullmatch(r"-?\d+", value) else None
        if parsed is None:
            p.error(f"--gluon-switch: expected {key} as {type(current).__name__} (it is "
                    f"{current!r}), got {value!r}")
        setattr(kg, key, parsed)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", action="append", choices=sorted(WORKLOADS))
    p.add_argument("--dtype", default="bfloat16", choices=("float16", "bfloat16", "float32"))
    p.add_argument("--kv-dtype", choices=("fp8_e4m3",),
                   help="an FP8 (e4m3) cache with unit scales (the kernels' FP8 path)")
    p.add_argument("--plan", default="auto", choices=kernels.PLANS)
    p.add_argument("--heads", default=None, metavar="HQ:HKV:D",
                   help="query heads, KV heads and head dim (default: the bench's "
                        f"{BENCH_HEADS.num_q_heads}:{BENCH_HEADS.num_kv_heads}:"
                        f"{BENCH_HEADS.head_dim})")
    p.add_argument("--ptx-dir", metavar="DIR",
                   help="also write each kernel's PTX to DIR/<workload>.<kernel>.ptx")
    for f in ("block-m", "num-warps", "num-stages", "value-blocks", "tiles-per-step", "block-n"):
        p.add_argument(f"--{f}", type=int)
    p.add_argument("--no-dependent-merge", action="store_true",
                   help="launch the merge as an ordinary kernel (Tuning(dependent_merge=False)):"
                        " without the griddepcontrol instructions")
    p.add_argument("--fused-loop", choices=("nested", "flat"),
                   help="the fused plan's loop (Tuning(nested_loop=...)); default: the rule's")
    p.add_argument("--no-gluon", action="store_true",
                   help="the Triton fused kernel where the Gluon prefill kernel would run "
                        "(Tuning(gluon=False))")
    p.add_argument("--no-keys-rows", action="store_true",
                   help="the 128-row split tile where the keys-as-rows decode tile would run "
                        "(Tuning(keys_rows=False))")
    p.add_argument("--keys-rows", action="store_true",
                   help="the keys-as-rows decode tile on any split batch (Tuning(keys_rows="
                        "True)), e.g. with --value-blocks 2")
    p.add_argument("--ptx-hash", action="store_true",
                   help="print a hash of each kernel's PTX (debug lines left out) instead of "
                        "registers and spills: equal hashes across two commits mean the same "
                        "compiled code")
    p.add_argument("--dot-waits", action="store_true",
                   help="also print, per kernel, the order of its tensor-core dots, their waits "
                        "and its exponentials in the TTGIR (which exponentials overlap a dot)")
    p.add_argument("--copy-waits", action="store_true",
                   help="like --dot-waits, with the asynchronous global-to-shared copies and "
                        "their waits too (where a loop issues its loads and waits for them; "
                        "Triton's cp.async pipeline only: the Gluon kernel's TMA copies and "
                        "mbarrier waits are not listed)")
    p.add_argument("--sass-order", action="store_true",
                   help="also print, per kernel, its wgmma instructions, their waits, "
                        "exponentials, row shuffles, barriers and spills in SASS order "
                        "('|' starts a basic block): where ptxas placed each wait")
    p.add_argument("--gluon-switch", action="append", default=[], metavar="NAME=VALUE",
                   help="set a module switch of kernels._gluon (an int or True/False) before "
                        "compiling")
    a = p.parse_args()
    if a.gluon_switch:
        _set_gluon_switches(p, a.gluon_switch)
    # Only the fields given, so that the script also runs against older kernels (--ptx-hash).
    fields = dict(block_m=a.block_m, num_warps=a.num_warps, num_stages=a.num_stages,
                  value_blocks=a.value_blocks, tiles_per_step=a.tiles_per_step, block_n=a.block_n)
    if a.no_dependent_merge:
        fields["dependent_merge"] = False
    if a.fused_loop is not None:
        fields["nested_loop"] = a.fused_loop == "nested"
    if a.no_gluon:
        fields["gluon"] = False
    if a.no_keys_rows and a.keys_rows:
        p.error("--keys-rows and --no-keys-rows: give one")
    if a.no_keys_rows or a.keys_rows:
        fields["keys_rows"] = a.keys_rows
    tuning = kernels.Tuning(**{k: v for k, v in fields.items() if v is not None})
    if a.kv_dtype and a.dtype == "float32":
        p.error(f"--kv-dtype {a.kv_dtype}: expected --dtype float16 or bfloat16 (an FP8 cache "
                f"takes half-precision queries), got float32")
    heads = BENCH_HEADS
    if a.heads is not None:
        try:
            heads = HeadConfig.parse(a.heads)
        except ValueError as exc:
            p.error(f"--heads: {exc}")
    kv_dtype = torch.float8_e4m3fn if a.kv_dtype else None
    cache = f", {a.kv_dtype} cache" if a.kv_dtype else ""
    print(f"triton {triton.__version__}, sm_90a, {a.dtype}{cache}, heads {heads}, plan "
          f"{a.plan}, {tuning}")
    compiled_cols = "ptx hash " if a.ptx_hash else "regs | spill st/ld B "
    print(f"| workload | plan | BM/BN/warps/stages/vblocks/tiles | kernel | {compiled_cols}"
          "| smem B | MMA instructions |")
    print("|---" * (7 if a.ptx_hash else 8) + "|")
    for name in a.workload or list(WORKLOADS):
        try:
            rows = stats(name, getattr(torch, a.dtype), a.plan, tuning, a.ptx_hash,
                         a.copy_waits, a.sass_order, kv_dtype, heads, a.ptx_dir)
        except ValueError as exc:  # the planner refused these settings for this workload
            p.error(f"{name}: {str(exc).splitlines()[0]}")
        for r in rows:
            compiled = (f"{r['ptx']} | " if a.ptx_hash else
                        f"{r['regs']} | {r['spill_stores']}/{r['spill_loads']} | ")
            print(f"| {r['workload']} | {r['plan']} | {r['block_m']}/{r['block_n']}/"
                  f"{r['num_warps']}/{r['num_stages']}/{r['value_blocks']}/{r['tiles_per_step']} "
                  f"| {r['kernel']} | {compiled}{r['shared']} | {r['mma']} |", flush=True)
            if a.dot_waits or a.copy_waits:
                print(f"  {r['kernel']}: {r['dot_waits']}", flush=True)
            if a.sass_order:
                print(f"  {r['kernel']} SASS: {r['sass_order']}", flush=True)


if __name__ == "__main__":
    main()
