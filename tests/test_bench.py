"""``invariance bench`` without a GPU: workloads, the ideal-time arithmetic, the ratio table and
the renderers, with an injected timer and injected limits."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from rich.console import Console

from invariance.backends import BUILTIN, ResolvedBackend, capabilities, resolve
from invariance.backends.kernels import KernelsBackend
from invariance.backends.reference import reference_backend
from invariance.batch import AttentionBatch
from invariance.bench import (
    WORKLOADS,
    BenchReport,
    BenchWorkload,
    Limits,
    Timing,
    build_batch,
    causal_flops,
    ideal_ms,
    kv_bytes,
    parse_lengths,
    run_bench,
    select_workloads,
)
from invariance.cli import main
from invariance.render import bench_to_markdown, print_bench
from invariance.workload import HeadConfig

ROOT = Path(__file__).resolve().parent.parent
LIMITS = Limits(hbm_read_GBps=3000.0, copy_GBps=2800.0, matmul_TFLOPs=700.0)
SMALL = HeadConfig(4, 2, 64)


def test_named_workloads() -> None:
    decode = [n for n in WORKLOADS if n.startswith("decode-b")]
    assert decode == [f"decode-b{b}-ctx{c}" for b in (1, 8, 64) for c in ("1k", "8k", "32k")] + [
        "decode-b256-ctx8k"]
    w = WORKLOADS["decode-b64-ctx32k"]
    assert w.q_lens == (1,) * 64 and w.kv_lens == (32768,) * 64 and w.kind == "decode"
    prod = WORKLOADS["decode-prod64"]
    assert len(prod.kv_lens) == 64 and set(prod.kv_lens) <= {4096, 8192, 16384, 32768}
    assert prod.kind == "decode"
    mixed = WORKLOADS["mixed64"]
    assert mixed.kind == "mixed" and mixed.q_lens[::2] == (1,) * 32
    assert all(32 <= q <= 512 and q <= kv <= 8192
               for q, kv in zip(mixed.q_lens[1::2], mixed.kv_lens[1::2], strict=True))
    pre = WORKLOADS["prefill-varlen"]
    assert pre.kind == "prefill" and pre.q_lens == pre.kv_lens == (
        16384, 8192, 4096, 4096, 2048, 1024, 512, 512)


def _script(monkeypatch: pytest.MonkeyPatch) -> Any:
    """benchmarks/attention.py loaded as a module."""
    spec = importlib.util.spec_from_file_location("_bench_script", ROOT / "benchmarks" /
                                                  "attention.py")
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "_bench_script", script)
    spec.loader.exec_module(script)
    return script


def test_benchmark_script_help_runs_without_cuda() -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "attention.py"), "--help"],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "--out" in proc.stdout and "--split-sizes" in proc.stdout and "--baseline" in proc.stdout


@pytest.mark.parametrize("fi", [True, False])
def test_benchmark_script_is_a_thin_caller_of_run_bench(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, fi: bool) -> None:
    script = _script(monkeypatch)
    calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def fake_run_bench(*args: Any, **kwargs: Any) -> BenchReport:
        calls.append((args, kwargs))
        names = [kwargs["baseline"], *[b for b in args[0] if b != kwargs["baseline"]]]
        return BenchReport(backends=names, baseline=kwargs["baseline"], dtype="bfloat16",
                           heads="32:8:128", page_size=16, limits=LIMITS, results=[])

    monkeypatch.setattr(script, "run_bench", fake_run_bench)
    monkeypatch.setattr(script, "has_flashinfer", lambda: fi)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    out = tmp_path / "res"
    argv = ["--out", str(out), "--workloads", "mixed64,decode-b8-ctx8k", "--split-sizes",
            "256,4096", "--backend", "kernels:block_m=128,num_warps=8", "--quick"]
    assert script.main(argv) == 0
    ((args, kwargs),) = calls
    peers = ["flashinfer", "flashinfer-fa3"] if fi else []
    assert args == (["kernels", "kernels-fused", "kernels-split", "kernels-heuristic",
                     "sdpa-flash", *peers, "kernels:split_size=256", "kernels:split_size=4096",
                     "kernels:block_m=128,num_warps=8"],)
    assert kwargs["names"] == ["mixed64", "decode-b8-ctx8k"]
    assert kwargs["baseline"] == ("flashinfer" if fi else "kernels-heuristic")
    assert kwargs["iters"] == script.QUICK_ITERS
    md = (out / "attention.md").read_text()
    assert md.startswith("# invariance bench\n") and "benchmarks/attention.py --out" in md
    data = json.loads((out / "attention.json").read_text())
    assert data["schema"] == "invariance-bench/1" and data["baseline"] == kwargs["baseline"]
    # Defaults: every workload, the full iteration count; an explicit baseline is passed on.
    calls.clear()
    assert script.main(["--out", str(out), "--baseline", "sdpa-flash"]) == 0
    ((args, kwargs),) = calls
    assert kwargs["names"] is None and kwargs["iters"] == script.ITERS
    assert kwargs["baseline"] == "sdpa-flash"


def test_benchmark_script_rejects_bad_arguments_before_cuda(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = _script(monkeypatch)
    monkeypatch.setattr(script, "run_bench", None)  # never reached
    for argv, match in [(["--workloads", "nope"], "unknown nope"),
                        (["--split-sizes", "1k"], "expected comma-separated ints"),
                        (["--backend", "kernels:plan=fast"], "plan: expected one of"),
                        (["--baseline", "nope"], "unknown name 'nope'")]:
        with pytest.raises(SystemExit) as exc:
            script.main(["--out", str(tmp_path), *argv])
        assert exc.value.code == 2
        assert match in capsys.readouterr().err
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit, match="needs a CUDA GPU"):
            script.main(["--out", str(tmp_path / "res")])
        assert not (tmp_path / "res").exists()


def test_kernels_options_from_the_cli_string() -> None:
    b = resolve("kernels:split_size=2048")
    assert b.name == "kernels:split_size=2048" and isinstance(b.fn, KernelsBackend)
    assert b.fn == KernelsBackend(split_size=2048)
    assert capabilities(b).split_tokens == 2048
    b = resolve("kernels:block_m=128, num_warps=8,num_stages=3,plan=split")
    assert b.fn == KernelsBackend(kernel_plan="split", block_m=128, num_warps=8, num_stages=3)
    assert resolve("kernels:block_n=64").fn == KernelsBackend(block_n=64)
    assert resolve("kernels-fused:num_warps=4").fn == KernelsBackend(kernel_plan="fused",
                                                                      num_warps=4)
    assert resolve("kernels-split:plan=auto").fn == KernelsBackend()
    assert resolve("kernels:split_size=none").fn == KernelsBackend(split_size=None)
    assert resolve("kernels-heuristic:split_size=default").fn == KernelsBackend()
    assert resolve("kernels:split_size=NONE").fn == resolve("kernels-heuristic").fn
    assert resolve("kernels:lead_split_size=1024").fn == KernelsBackend(lead_split_size=1024)
    assert resolve("kernels:lead_split_size=default").fn == KernelsBackend()
    assert all(BUILTIN[n].options for n in BUILTIN if n.startswith("kernels"))
    for bad, match in [
            ("kernels:nope=1", "kernels option 'nope': unknown; expected one of split_size, "
                               "lead_split_size, plan, gluon, block_m, num_warps, num_stages, "
                               "block_n, got 'nope'"),
            ("kernels:lead_split_size=0", "lead_split_size: expected an int >= 1 or default, "
                                          "got '0'"),
            ("kernels:split_size=0", "split_size: expected an int >= 1 or none or default, "
                                     "got '0'"),
            ("kernels:split_size=2k", "split_size: expected an int >= 1"),
            ("kernels:plan=fast", "plan: expected one of auto, fused, split, got 'fast'"),
            ("kernels:block_m=96", "block_m: expected a power of two, got '96'"),
            ("kernels:num_warps=3", "num_warps: expected one of 1, 2, 4, 8, 16, got '3'"),
            ("kernels:num_stages=9", r"num_stages: expected an int in \[1, 8\], got '9'"),
            ("kernels:num_stages=x", "num_stages: expected an int in"),
            ("kernels:block_n=48", "block_n: expected a power of two >= 16, got '48'"),
            ("kernels-fused:oops", "key=value"),
            ("kernels:plan=fused,plan=split", "given twice"),
            ("kernels:gluon=yes", "gluon: expected one of auto, true, false, got 'yes'")]:
        with pytest.raises(ValueError, match=match):
            resolve(bad)


def test_kernels_option_rules_agree_with_kernels_tuning() -> None:
    import kernels

    for key in ("block_m", "num_warps", "num_stages", "block_n"):
        for value in range(0, 33):
            try:
                kernels.Tuning(**{key: value})
                tuning_ok = True
            except ValueError:
                tuning_ok = False
            try:
                KernelsBackend().with_options({key: str(value)})
                ours_ok = True
            except ValueError:
                ours_ok = False
            assert ours_ok == tuning_ok, (key, value)


class _Recorder:
    """A timer that keeps the backends it is given and times nothing."""

    def __init__(self) -> None:
        self.backends: list[ResolvedBackend] = []

    def time_fn(self, fn: Any) -> float:  # pragma: no cover - limits are injected
        raise AssertionError("limits are injected")

    def time_backend(self, backend: ResolvedBackend, batch: AttentionBatch) -> Timing:
        self.backends.append(backend)
        return Timing(1.0)


def test_run_bench_takes_kernels_options() -> None:
    timer = _Recorder()
    report = run_bench(["kernels:block_m=128,num_warps=8", "kernels:split_size=2048"],
                       [parse_lengths("decode:9")], baseline="kernels-heuristic:num_stages=2",
                       dtype="float32", heads=SMALL, page_size=4, device="cpu", timer=timer,
                       limits=LIMITS)
    assert report.backends == ["kernels-heuristic:num_stages=2",
                               "kernels:block_m=128,num_warps=8", "kernels:split_size=2048"]
    assert [b.fn for b in timer.backends] == [
        KernelsBackend(split_size=None, num_stages=2), KernelsBackend(block_m=128, num_warps=8),
        KernelsBackend(split_size=2048)]


def test_parse_lengths() -> None:
    w = parse_lengths("decode:4096x32")
    assert w.q_lens == (1,) * 32 and w.kv_lens == (4096,) * 32 and w.name == "decode:4096x32"
    w = parse_lengths("prefill:2kx2,512")
    assert w.q_lens == w.kv_lens == (2048, 2048, 512) and w.kind == "prefill"
    w = parse_lengths("decode:8kx2+chunk:512/2048x2")
    assert w.q_lens == (1, 1, 512, 512) and w.kv_lens == (8192, 8192, 2048, 2048)
    assert w.kind == "mixed"
    for bad, match in [("decode", "expected parts"), ("mixed:4", "expected parts"),
                       ("decode:0", "length"), ("decode:4kx0", "count"),
                       ("chunk:64", "Q/L"), ("chunk:64/8", "exceed"), ("decode:abc", "length")]:
        with pytest.raises(ValueError, match=match):
            parse_lengths(bad)


def test_select_workloads() -> None:
    assert [w.name for w in select_workloads()] == list(WORKLOADS)
    got = select_workloads(["mixed64", "mixed64"], ["decode:1kx2"])
    assert [w.name for w in got] == ["mixed64", "decode:1kx2"]
    assert [w.name for w in select_workloads(None, ["decode:1k"])] == ["decode:1k"]
    with pytest.raises(ValueError, match="unknown nope"):
        select_workloads(["nope"])
    with pytest.raises(ValueError, match="q_len <= kv_len"):
        BenchWorkload("x", (5,), (4,))


def test_build_batch_shapes_and_shuffled_pages() -> None:
    w = parse_lengths("decode:37x2+chunk:5/20")
    batch = build_batch(w, SMALL, torch.float16, page_size=4, device="cpu", seed=1).validate()
    assert batch.q.shape == (7, 4, 64) and batch.q.dtype == torch.float16
    assert batch.kv_lens.tolist() == [37, 37, 20] and batch.q_lens() == [1, 1, 5]
    assert batch.k_cache.shape == (10 + 10 + 5, 4, 2, 64)
    used = sorted(int(p) for b, n in enumerate((10, 10, 5)) for p in batch.block_table[b, :n])
    assert used == list(range(25))
    assert batch.block_table[0, :10].tolist() != list(range(10))  # shuffled
    again = build_batch(w, SMALL, torch.float16, page_size=4, device="cpu", seed=1)
    assert torch.equal(again.k_cache, batch.k_cache)


def test_ideal_time_arithmetic() -> None:
    heads = HeadConfig(32, 8, 128)
    w = WORKLOADS["decode-b8-ctx8k"]
    assert kv_bytes(w, heads, torch.bfloat16) == 8 * 8192 * 8 * 128 * 2 * 2
    ms, bound = ideal_ms(w, LIMITS, heads, torch.bfloat16)
    assert bound == "memory" and ms == pytest.approx(8 * 8192 * 8 * 128 * 4 / 3000e9 * 1e3)
    p = parse_lengths("prefill:4")
    assert causal_flops(p, heads) == 4 * 128 * 32 * (1 + 2 + 3 + 4)
    c = parse_lengths("chunk:2/5")  # rows attend to 4 and 5 keys
    assert causal_flops(c, heads) == 4 * 128 * 32 * 9
    ms, bound = ideal_ms(WORKLOADS["prefill-varlen"], LIMITS, heads, torch.bfloat16)
    assert bound == "compute"
    assert ms == pytest.approx(causal_flops(WORKLOADS["prefill-varlen"], heads) / 700e12 * 1e3)
    mixed = WORKLOADS["mixed64"]
    ms, _ = ideal_ms(mixed, LIMITS, heads, torch.bfloat16)
    assert ms == pytest.approx(max(kv_bytes(mixed, heads) / 3000e6,
                                   causal_flops(mixed, heads) / 700e9))


class FakeTimer:
    """Times from a table: ``{backend name: ms per query token}``; raises for ``boom``."""

    def __init__(self, per_token: dict[str, float]) -> None:
        self.per_token = per_token
        self.calls: list[tuple[str, int]] = []

    def time_fn(self, fn: Any) -> float:  # pragma: no cover - limits are injected
        raise AssertionError("limits are injected")

    def time_backend(self, backend: ResolvedBackend, batch: AttentionBatch) -> Timing:
        self.calls.append((backend.name, batch.num_tokens))
        if backend.name.endswith(":boom"):
            raise RuntimeError("kernel exploded\nsecond line")
        backend(batch)  # the backend really runs on the CPU batch
        mode = "eager" if backend.name == "sdpa-math" else "graph"
        note = "eager: because" if mode == "eager" else ""
        (key,) = [k for k in self.per_token if backend.name.split(":")[-1].endswith(k)]
        return Timing(self.per_token[key] * batch.num_tokens, mode, note)


def boom(batch: AttentionBatch) -> None:
    raise AssertionError("never called: the fake timer raises first")



def _report() -> Any:
    timer = FakeTimer({"reference": 0.02, "sdpa-math": 0.01})
    wls = [parse_lengths("decode:33x3"), parse_lengths("prefill:9,4")]
    report = run_bench(["reference", "sdpa-math"], wls, baseline="sdpa-math", dtype="float32",
                       heads=SMALL, page_size=4, device="cpu", timer=timer, limits=LIMITS)
    return report, timer


def test_run_bench_with_an_injected_timer() -> None:
    report, timer = _report()
    assert report.backends == ["sdpa-math", "reference"]  # the baseline first
    assert timer.calls == [("sdpa-math", 3), ("reference", 3), ("sdpa-math", 13),
                           ("reference", 13)]
    r = report.results[0]
    assert r.kind == "decode" and r.requests == 3 and r.max_kv == 33
    assert report.ms(r, "reference") == pytest.approx(0.06)
    assert report.ratio(r, "reference") == pytest.approx(2.0)
    assert report.ratio(r, "sdpa-math") == pytest.approx(1.0)
    assert report.fraction(r, "reference") == pytest.approx(r.ideal_ms / 0.06)
    assert r.ideal_ms == pytest.approx(ideal_ms(parse_lengths("decode:33x3"), LIMITS, SMALL,
                                                torch.float32)[0])
    data = json.loads(report.to_json())
    assert data["schema"] == "invariance-bench/1" and data["baseline"] == "sdpa-math"
    assert data["results"][1]["times"]["reference"]["ms"] == pytest.approx(0.26)
    assert data["limits"]["matmul_TFLOPs"] == 700.0
    assert report.notes() == [(w.workload, "sdpa-math", "eager: because")
                              for w in report.results]


def test_failures_are_recorded_and_the_run_goes_on() -> None:
    timer = FakeTimer({"reference_backend": 0.02})
    report = run_bench([boom, reference_backend], [parse_lengths("decode:9x2")], heads=SMALL,
                       dtype="float32", page_size=4, device="cpu", timer=timer, limits=LIMITS)
    (r,) = report.results
    name = report.backends[0]
    assert r.times[name].ms is None and r.times[name].error == "RuntimeError: kernel exploded"
    assert report.errors() == [("decode:9x2", name, "RuntimeError: kernel exploded")]
    assert report.ratio(r, name) is None and report.fraction(r, name) is None
    assert r.times[report.backends[1]].ms == pytest.approx(0.04)


def test_capabilities_are_checked_before_timing() -> None:
    timer = FakeTimer({})
    with pytest.raises(ValueError, match="runs on cuda"):
        run_bench(["sdpa-flash"], [parse_lengths("decode:9")], dtype="bfloat16", heads=SMALL,
                  device="cpu", timer=timer, limits=LIMITS)
    with pytest.raises(ValueError, match="supports float16, bfloat16"):
        run_bench(["flashinfer"], [parse_lengths("decode:9")], dtype="float32",
                  heads=HeadConfig(4, 2, 64), device="cpu", timer=timer, limits=LIMITS)
    assert timer.calls == []


def test_renderers() -> None:
    report, _ = _report()
    report.command = "invariance bench --backend reference --baseline sdpa-math"
    md = bench_to_markdown(report)
    assert md.startswith("# invariance bench\n")
    assert "| workload | kind | ideal us | sdpa-math us | sdpa-math % ideal | reference us |" in md
    assert "reference / sdpa-math" in md
    assert "| decode:33x3 | decode |" in md and "2.00x" in md
    assert "60.0" in md and "30.0†" in md  # reference 0.06 ms; the eager baseline marked
    assert "HBM read 3000 GB/s" in md and "700 TFLOP/s" in md
    assert "† decode:33x3 sdpa-math: eager: because" in md
    assert "`invariance bench --backend reference --baseline sdpa-math`" in md
    console = Console(record=True, width=240, color_system=None)
    print_bench(report, console)
    text = console.export_text()
    assert "invariance bench" in text and "2.00x" in text and "prefill:9,4" in text
    failed = run_bench([boom], [parse_lengths("decode:9")], heads=SMALL, dtype="float32",
                       page_size=4, device="cpu", timer=FakeTimer({}), limits=LIMITS)
    assert "Errors:" in bench_to_markdown(failed) and "| error |" in bench_to_markdown(failed)
    assert math.isfinite(report.results[0].ideal_ms)


def test_cli_without_cuda_is_one_line_exit_2(capsys: pytest.CaptureFixture[str],
                                             tmp_path: Path) -> None:
    if torch.cuda.is_available():  # pragma: no cover - GPU machines
        pytest.skip("CUDA is available here")
    assert main(["bench", "--backend", "kernels", "--baseline", "flashinfer",
                 "--json", str(tmp_path / "b.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["invariance: error: bench: needs a CUDA GPU; torch.cuda.is_available() is "
                   "False here"]
    assert main(["bench", "--workload", "nope"]) == 2
    assert "unknown nope" in capsys.readouterr().err
    assert main(["bench", "--markdown", str(tmp_path / "missing" / "b.md")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert not (tmp_path / "b.json").exists()


def test_kernel_stats_compiles_for_sm90_without_a_gpu() -> None:
    """benchmarks/kernel_stats.py: the kernels compiled for an H100 on this machine (Triton's
    own ptxas, no launch), in a fresh process without the interpreter."""
    pytest.importorskip("triton.backends.nvidia.compiler")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "kernel_stats.py"),
                           "--workload", "decode-b1-ctx1k"],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    # One 1k-token decode on 8 KV heads: the split plan, 64-row tiles; its 8 lead splits per
    # row make 64 programs, so 2 V column blocks and one tile per loop step (the rules on 132
    # SMs); the split kernel and the merge.
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| decode-b1-ctx1k")]
    assert len(rows) == 2, proc.stdout
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    assert cells[1:4] == ["split", "64/64/4/5/2/1", "unified_attention_split_kernel"], cells
    assert 32 <= int(cells[4]) <= 255 and int(cells[6]) > 0, cells
    assert rows[1].split("|")[4].strip() == "merge_splits_kernel", rows
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "kernel_stats.py"),
                           "--workload", "decode-b1-ctx1k", "--dot-waits", "--sass-order"],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    # --sass-order (reports/h100-round18/cpu/): the split kernel's SASS has its score wgmma
    # (m64n64k16, 8 along the head dim), a wait for it, and exponentials.
    sass = [line for line in proc.stdout.splitlines()
            if line.startswith("  unified_attention_split_kernel SASS: ")]
    assert len(sass) == 1, proc.stdout
    assert "mma64x64x16x8" in sass[0] and "wait0" in sass[0] and "exp2" in sass[0], sass[0]
    # The split kernel's loops: each with its score dots and its exponentials.
    waits = [line for line in proc.stdout.splitlines()
             if line.startswith("  unified_attention_split_kernel: ")]
    assert len(waits) == 1, proc.stdout
    assert "for[ dot64x64 wait0" in waits[0] and "exp2:64x64" in waits[0], waits[0]
    # Every loop opened in the listing was closed (a missed closing brace would leave one open).
    assert waits[0].count("for[") == waits[0].count("]"), waits[0]


def test_ptx_hash_ignores_debug_lines_only() -> None:
    """benchmarks/kernel_stats.py --ptx-hash: the evidence that a refactor compiles to the same
    code (reports/h100-round9/cpu/), so line numbers and debug sections must not move it, and
    any instruction must."""
    sys.path.insert(0, str(ROOT))
    try:
        from benchmarks.kernel_stats import _ptx_hash
    finally:
        sys.path.remove(str(ROOT))
    ptx = ("\t.loc\t1 10 5\n\tmov.b32 \t%r1, 0;\n$L__tmp0:\n\tfma.rn.f32 \t%f3, %f1, %f2, %f0;\n"
           "\t.section\t.debug_info\n\t.b8 42\n")
    moved = ptx.replace("1 10 5", "1 99 7").replace(".b8 42", ".b8 43").replace("$L__tmp0",
                                                                             "$L__tmp9")
    assert _ptx_hash(moved) == _ptx_hash(ptx)
    assert _ptx_hash(ptx.replace("fma.rn.f32", "mul.rn.f32")) != _ptx_hash(ptx)
    assert _ptx_hash(ptx.replace("%r1, 0", "%r1, 1")) != _ptx_hash(ptx)


def test_sass_tokens_keep_the_order_and_count_runs() -> None:
    """benchmarks/kernel_stats.py --sass-order's reading of nvdisasm output: wgmma shapes,
    wait depths, exponentials, shuffles, barriers and spills in order, runs counted, a label
    as a block start; other instructions dropped."""
    sys.path.insert(0, str(ROOT))
    try:
        from benchmarks.kernel_stats import _sass_tokens
    finally:
        sys.path.remove(str(ROOT))
    sass = "\n".join([
        "        /*0100*/   HGMMA.64x128x16.F32.BF16 R24, R120, gdesc[UR8].tnspB, R24 ;",
        "        /*0110*/   HGMMA.64x128x16.F32.BF16 R24, R124, gdesc[UR8].tnspB, R24 ;",
        "        /*0120*/   WARPGROUP.DEPBAR.LE gsb0, 0x1 ;",
        "        /*0130*/   FSEL R89, R89, -INF , !P5 ;",
        ".L_x_12:",
        "        /*0140*/   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;",
        "        /*0150*/   BAR.SYNC.DEFER_BLOCKING 0x2, 0x80 ;",
        "        /*0160*/   @!P4 SYNCS.ARRIVE.TRANS64.A1T0 RZ, [UR18+0x280d0], RZ ;",
        "        /*0170*/   SHFL.BFLY PT, R123, R120, 0x2, 0x1f ;",
        "        /*0180*/   MUFU.EX2 R4, R24 ;",
        "        /*0190*/   MUFU.EX2 R5, R5 ;",
        "        /*01a0*/   MUFU.EX2 R6, R6 ;",
        "        /*01b0*/   STL [R1], R2 ;",
        "        /*01c0*/   SYNCS.PHASECHK.TRANS64.TRYWAIT P2, [UR14+0x280b0], R88 ;",
    ])
    assert _sass_tokens(sass) == ("mma64x128x16x2 wait1 | wait0 bar arrive shfl exp2x3 spill "
                                  "mbarwait")
    assert _sass_tokens(sass.replace("gsb0, 0x0", "gsb0, 0x1")).startswith(
        "mma64x128x16x2 wait1 | wait1 bar")
    # Wait depths are hexadecimal.
    assert " wait10 " in _sass_tokens(sass.replace("gsb0, 0x0", "gsb0, 0xa"))


def test_kernel_stats_gluon_switch_names_a_bad_switch() -> None:
    """benchmarks/kernel_stats.py --gluon-switch: a name kernels._gluon lacks (round 18's
    switches live only at its experiment commits), one that is not a bool or int switch, a
    missing value or a value of the wrong type is a usage error naming it, before anything
    compiles."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    for bad, said in (("NO_SUCH_SWITCH=1", "'NO_SUCH_SWITCH=1'"), ("RING_SLOTS", "'RING_SLOTS'"),
                      ("GLUON_TRITON=3.7.", "'GLUON_TRITON=3.7.'"),
                      ("RING_SLOTS=abc", "expected RING_SLOTS as int (it is 4), got 'abc'"),
                      ("RING_SLOTS=--5", "got '--5'"), ("RING_SLOTS=2.5", "got '2.5'")):
        proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "kernel_stats.py"),
                               "--workload", "prefill-varlen", "--gluon-switch", bad],
                              capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
        assert proc.returncode == 2, (bad, proc.stdout[-500:], proc.stderr[-1000:])
        assert "--gluon-switch: expected" in proc.stderr and said in proc.stderr, proc.stderr


def test_set_gluon_switches_parses_bools_and_ints(monkeypatch) -> None:
    """benchmarks/kernel_stats.py's --gluon-switch setter: a bool switch from true/false/1/0,
    an int switch from digits (negative too); a float or a word for an int, or a word for a
    bool, is a usage error naming the switch, its type and current value and the value given."""
    import argparse

    import kernels._gluon as kg
    sys.path.insert(0, str(ROOT))
    try:
        from benchmarks.kernel_stats import _set_gluon_switches
    finally:
        sys.path.remove(str(ROOT))
    monkeypatch.setattr(kg, "TEST_FLAG", False, raising=False)
    monkeypatch.setattr(kg, "RING_SLOTS", 4)
    p = argparse.ArgumentParser()
    _set_gluon_switches(p, ["TEST_FLAG=true", "RING_SLOTS=-3"])
    assert kg.TEST_FLAG is True and kg.RING_SLOTS == -3  # type: ignore[attr-defined]
    _set_gluon_switches(p, ["TEST_FLAG=0", "RING_SLOTS=5"])
    assert kg.TEST_FLAG is False and kg.RING_SLOTS == 5  # type: ignore[attr-defined]
    errors: list[str] = []
    monkeypatch.setattr(p, "error", lambda msg: (errors.append(msg), sys.exit(2)))
    for bad, said in (("TEST_FLAG=yes", "expected TEST_FLAG as bool (it is False), got 'yes'"),
                      ("RING_SLOTS=5.0", "expected RING_SLOTS as int (it is 5), got '5.0'")):
        errors.clear()
        with pytest.raises(SystemExit):
            _set_gluon_switches(p, [bad])
        assert errors and said in errors[0], errors


def test_peer_ab_reads_nvidia_smi_and_averages_each_window(tmp_path, monkeypatch) -> None:
    """benchmarks/peer_ab.py --sustain (reports/h100-round18/, section 4): nvidia-smi's lines
    (UTC stamps) read as (time, MHz, W) on the clock time.time() keeps, malformed ones skipped,
    and each window's mean clock and power over its samples from its timed start (after
    SETTLE_S) to its end, both included, with the cycles per call; a window with too few
    samples gets no means and makes the report say so."""
    sys.path.insert(0, str(ROOT))
    try:
        from benchmarks import peer_ab
    finally:
        sys.path.remove(str(ROOT))
    now = float(int(time.time()))

    def line(dt: float, mhz: int, watts: float) -> str:
        stamp = time.strftime("%Y/%m/%d %H:%M:%S", time.gmtime(now + int(dt)))
        return f"{stamp}.{round((dt % 1) * 1000):03d}, {mhz} MHz, {watts:.2f} W, 50\n"

    lines = [line(0.9, 1980, 100.0), line(1.0, 1500, 700.0), "garbage\n"]
    lines += [line(1.0 + 0.1 * i, 1600, 690.0) for i in range(1, 4)]
    lines += [line(1.5, 1700, 680.0), line(1.6, 1980, 120.0)]
    (tmp_path / "smi.csv").write_text("".join(lines))
    # The stamps are UTC whatever this process's time zone (a local-time parse would be 9 h off).
    monkeypatch.setenv("TZ", "Asia/Tokyo")
    time.tzset()
    try:
        samples = peer_ab._smi_samples(str(tmp_path / "smi.csv"))
    finally:
        monkeypatch.undo()
        time.tzset()
    assert len(samples) == 7 and abs(samples[0][0] - (now + 0.9)) < 1e-6, samples
    assert samples[1][1:] == (1500.0, 700.0), samples
    windows = [dict(workload="w", backend="b", us_per_call=1000.0, t0=now + 1.0, t1=now + 1.5),
               dict(workload="w", backend="c", us_per_call=1000.0, t0=now + 1.0, t1=now + 1.2)]
    assert peer_ab._sustain_report(str(tmp_path), windows) is False
    assert peer_ab._sustain_report(str(tmp_path), windows[:1]) is True
    w = windows[0]
    # From t0 to t1: 1500, 1600 x 3, 1700 MHz (the 0.9 s and 1.6 s samples left out).
    assert (w["samples"], w["sm_mhz"], w["watts"]) == (5, 1600, 690.0), w
    assert w["mcycles_per_call"] == 1.6, w
    assert windows[1]["samples"] == 3 and "sm_mhz" not in windows[1], windows[1]
    assert (tmp_path / "sustain.jsonl").read_text().count("\n") == 1


def test_peer_ab_rejects_bad_arguments_before_cuda(tmp_path) -> None:
    """benchmarks/peer_ab.py: --rounds / --iters / --sustain-passes below 1 (or above 1 without
    --sustain), a --sustain that is negative, not finite or too short for its samples, a
    --sustain without nvidia-smi, an unknown or repeated --backend and an unknown --workload
    are usage errors naming the argument, the value expected and the value given, before any
    GPU work and before the output folder is made."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    no_smi = dict(env, PATH=str(tmp_path / "empty"))
    out = tmp_path / "out"
    for args, said, e in (
            (["--rounds", "0"], "--rounds: expected >= 1, got 0", env),
            (["--iters", "0"], "--iters: expected >= 1, got 0", env),
            (["--sustain", "-1"], "--sustain: expected 0 (off) or a finite", env),
            (["--sustain", "nan"], "got nan", env), (["--sustain", "inf"], "got inf", env),
            (["--sustain", "1"], "got 1.0", env),
            (["--sustain-passes", "0"], "--sustain-passes: expected >= 1", env),
            (["--sustain-passes", "3"], "got 3 (--sustain 0.0)", env),
            (["--sustain", "4"], "--sustain: needs nvidia-smi on the PATH", no_smi),
            (["--backend", "kernels", "--backend", "kernels"],
             "--backend: expected distinct backends, got ['kernels', 'kernels']", env),
            (["--backend", "no-such-backend"], "--backend: ", env),
            (["--workload", "no-such-workload"], "--workload: ", env)):
        proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "peer_ab.py"), str(out),
                               *args], capture_output=True, text=True, cwd=ROOT, env=e,
                              timeout=120)
        assert proc.returncode == 2, (args, proc.stderr[-1000:])
        assert said in proc.stderr, (args, proc.stderr)
        assert not out.exists(), args
    # The unknown names are named back.
    for arg, name in (("--backend", "no-such-backend"), ("--workload", "no-such-workload")):
        proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "peer_ab.py"), str(out),
                               arg, name], capture_output=True, text=True, cwd=ROOT, env=env,
                              timeout=120)
        assert proc.returncode == 2 and name in proc.stderr.splitlines()[-1], proc.stderr


def test_dot_waits_orders_dots_waits_and_exponentials() -> None:
    """benchmarks/kernel_stats.py --dot-waits (reports/h100-round12/cpu/): the order of dots,
    waits and exponentials inside loops, from TTGIR lines; loops with neither (a scalar search,
    an ``if`` inside the loop) leave no brackets behind."""
    sys.path.insert(0, str(ROOT))
    try:
        from benchmarks.kernel_stats import _dot_waits
    finally:
        sys.path.remove(str(ROOT))
    ttgir = "\n".join([
        "%a = scf.while (%x = %c0) : (i32) -> i32 {", "scf.condition(%c) %x", "} do {",
        "scf.yield %y : i32", "}",
        "%r:3 = scf.for %j = %lo to %hi step %c1 iter_args(...) -> (...) : i32 {",
        "%s = ttng.warp_group_dot %q, %k, %z {isAsync = true} : !m * !m "
        "-> tensor<128x64xf32, #mma>",
        "%w:2 = ttng.warp_group_dot_wait %s, %q {pendings = 0 : i32} : tensor<128x64xf32, #mma>",
        "%p = math.exp2 %t : tensor<128x64xf32, #mma>",
        "%e = math.exp2 %u : tensor<128xf32, #ttg.slice<{dim = 1, parent = #mma}>>",
        "%f = scf.if %b -> (i32) {", "scf.yield %c1 : i32", "} else {", "scf.yield %c0 : i32",
        "}",
        "%o = ttng.warp_group_dot %p2, %v, %acc {isAsync = true} : tensor<128x64xbf16> * !m "
        "-> tensor<128x128xf32, #mma1>",
        "scf.yield %m, %l, %o : ...", "}",
        "%z2 = ttng.warp_group_dot_wait %r#2 {pendings = 1 : i32} : tensor<128x128xf32, #mma1>",
    ])
    assert _dot_waits(ttgir) == "for[ dot128x64 wait0 exp2:128x64 dot128x128 ] wait1"
    assert _dot_waits("") == ""
    # A loop without results and a conditional without results print no scf.yield: their
    # closing braces end them.
    plain = "\n".join([
        "scf.for %i = %a to %b step %c : i32 {",
        "%p = math.exp2 %t : tensor<64x64xf32, #mma>",
        "scf.if %q {", "tt.store %x, %y : tensor<64x!tt.ptr<f32>>", "} loc(#loc1)",
        "} loc(#loc2)",
        "scf.for %i = %a to %b step %c : i32 {",
        "%s = ttng.warp_group_dot %q, %k, %z : !m * !m -> tensor<64x64xf32, #mma>",
        "} loc(#loc3)",
    ])
    assert _dot_waits(plain) == "for[ exp2:64x64 ] for[ dot64x64 ]"
    # With copies: the pipeline's loads and their waits, in order.
    piped = "\n".join([
        "%c0 = ttg.async_copy_global_to_local %p, %b mask %m : tensor<64x128x!tt.ptr<bf16>>",
        "scf.for %i = %a to %b step %c : i32 {",
        "%w = ttg.async_wait %t0, %t1 {num = 2 : i32} loc(#loc1)",
        "%s = ttng.warp_group_dot %q, %k, %z : !m * !m -> tensor<64x64xf32, #mma>",
        "%c1 = ttg.async_copy_global_to_local %p, %b mask %m : tensor<64x128x!tt.ptr<bf16>>",
        "} loc(#loc3)",
    ])
    assert _dot_waits(piped, copies=True) == "copy for[ cpwait2 dot64x64 copy ]"
    assert _dot_waits(piped) == "for[ dot64x64 ]"
    # A loop with neither (a scalar loop) leaves nothing.
    assert _dot_waits("scf.for %i = %a to %b step %c : i32 {\n%x = arith.addi %i, %i\n}") == ""


def test_slot_order_model_makespan_and_table(capsys: pytest.CaptureFixture[str]) -> None:
    """benchmarks/slot_order_model.py (the model behind the fused plan's slot order,
    reports/h100-round10/): list scheduling in order, and its table runs to the end with the
    published mixed64 row (reports/h100-round10/cpu/slot-order-model.md) and the request order
    shorter than the plain one on both measured mixed batches."""
    sys.path.insert(0, str(ROOT))
    try:
        from benchmarks import slot_order_model as m
    finally:
        sys.path.remove(str(ROOT))
    assert m.makespan([3, 3, 2, 2, 2], 2) == 7  # 3|3, then 2 on each, then 2: 3+2+2
    assert m.makespan([2, 2, 2, 3, 3], 2) == 7
    assert m.makespan([3, 3, 2, 2], 2) == 5
    m.main()
    rows = [line.split("|") for line in capsys.readouterr().out.splitlines()
            if line.startswith("| mixed64") or line.startswith("| decode:8kx32")]
    assert len(rows) == 2
    for r in rows:
        plain, request = int(r[5]), int(r[7])
        assert request < plain, r
    assert [int(x) for x in rows[0][4:8]] == [643, 724, 657, 660], rows[0]


def test_tile_cost_fit_recovers_a_known_cost(tmp_path) -> None:
    """benchmarks/tile_cost_fit.py (reports/h100-round14/, section 5): times made from a known
    cost per program and per tile are fitted back to it, by least squares over three workloads
    (the median of each cell's repeats, not their mean); the tiles are counted as the kernel
    walks them (prefill-varlen: 9216 programs of 128 rows, 736768 64-key tiles on 8 KV heads);
    fp16 rows, other cells and launches without the Gluon kernel are left out; one workload, or
    workloads that walk the same tiles per program, are refused; so is a malformed row."""
    sys.path.insert(0, str(ROOT))
    try:
        from benchmarks.tile_cost_fit import fit, load, main
    finally:
        sys.path.remove(str(ROOT))
    tiles = {"prefill-varlen": (9216, 736768), "prefill:4kx8": (8192, 266240),
             "mixed64": (2728, 169744)}
    lines = []
    for spec, (p, t) in tiles.items():
        us = (2.0 * p + 1.2 * t) / 132
        lines.append(dict(dtype="bfloat16", workload=spec, gluon=True,
                          us_default=[us * 3, us, us / 2]))
        lines.append(dict(dtype="float16", workload=spec, gluon=True, us_default=[1.0] * 3))
    lines.append(dict(dtype="bfloat16", workload="mixed64", gluon=False, us_default=[1.0] * 3))
    path = tmp_path / "s.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in lines) + "\n")
    rows = load(str(path))
    assert [(r[0], r[1], r[2]) for r in rows] == [(s, *pt) for s, pt in tiles.items()]
    a, b = fit(rows)
    assert a == pytest.approx(2.0) and b == pytest.approx(1.2)
    with pytest.raises(ValueError, match="different tiles per program"):
        fit(rows[:1])
    with pytest.raises(ValueError, match="different tiles per program"):
        fit([rows[0], rows[0]])
    assert load(str(path), "other") == []
    with pytest.raises(SystemExit, match="cell 'other': need workloads"):
        main(str(path), "other")
    path.write_text(json.dumps(lines[0]) + "\n{not json\n")
    with pytest.raises(SystemExit, match=r"s.jsonl:2: expected a probe row"):
        load(str(path))
    path.write_text(json.dumps(dict(lines[0], workload="nonsense")) + "\n")
    with pytest.raises(SystemExit, match=r"s.jsonl:1: expected a probe row.*nonsense"):
        load(str(path))
    with pytest.raises(SystemExit, match="cannot read"):
        load(str(tmp_path / "missing.jsonl"))


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                    reason="runs the probe's kernel on CPU tensors, in the Triton interpreter")
def test_probe_round16_tree_sums_follow_the_key_index_in_either_layout() -> None:
    """benchmarks/probe_round16.py's layout-free denominator (reports/h100-round16/, section 3):
    ``_tree_rows`` of a [R, 64] tile and ``_tree_cols`` of its transpose both sum keys ``k`` and
    ``k + 32``, then ``+ 16``, ..., ``+ 1``; checked bit for bit against that tree in numpy
    (under the interpreter here; on the H100 the probe compares the two shapes' bits)."""
    import numpy as np

    sys.path.insert(0, str(ROOT))
    try:
        from benchmarks.probe_round16 import _tree_sums_kernel
    finally:
        sys.path.remove(str(ROOT))

    rng = np.random.default_rng(0)
    # Magnitudes over 2**-20 .. 2**20, so that other summation orders round differently
    # (checked below for a sequential sum and for a tree pairing adjacent keys).
    x_np = (rng.random((16, 64)) * 2.0 ** rng.integers(-20, 21, (16, 64))).astype(np.float32)
    tree = x_np
    while tree.shape[1] > 1:
        half = tree.shape[1] // 2
        tree = (tree[:, :half] + tree[:, half:]).astype(np.float32)
    x = torch.from_numpy(x_np)
    for transposed in (False, True):
        out = torch.empty(16, dtype=torch.float32)
        _tree_sums_kernel[(1,)](x, out, R=16, TRANSPOSED=transposed)
        assert np.array_equal(out.numpy().view(np.int32), tree[:, 0].view(np.int32)), transposed
    sequential = np.zeros(16, dtype=np.float32)
    for k in range(64):
        sequential = (sequential + x_np[:, k]).astype(np.float32)
    assert not np.array_equal(sequential.view(np.int32), tree[:, 0].view(np.int32))
    adjacent = x_np
    while adjacent.shape[1] > 1:
        adjacent = (adjacent[:, 0::2] + adjacent[:, 1::2]).astype(np.float32)
    assert not np.array_equal(adjacent.view(np.int32), tree.view(np.int32))


def _ncu_source_page(rows: list[tuple[str, str, int, int, int, int]], name: str) -> str:
    """A minimal ``ncu --page source --csv --print-source sass`` text: (address, source,
    samples, executed, stall_barrier, stall_wait) per instruction."""
    head = ('"Address","Source","Warp Stall Sampling (All Samples)","Instructions Executed",'
            '"stall_barrier","stall_wait","stall_barrier (Not Issued)"')
    body = [f'"{a}","{s}","{n}","{e}","{b}","{w}","0"' for a, s, n, e, b, w in rows]
    return "\n".join([f'"Kernel Name","{name}",', head, *body]) + "\n"


def test_ncu_stalls_sums_samples_by_reason_and_opcode(tmp_path, capsys) -> None:
    """benchmarks/ncu_stalls.py (reports/h100-round19/call1/stalls.md): shares of all samples
    per stall reason and per SASS opcode (predicates dropped), the last kernel of a file by
    default, runs of exponentials counted in --order; a file that is not a source page and a
    kernel index out of range are usage errors naming the argument."""
    sys.path.insert(0, str(ROOT))
    try:
        from benchmarks import ncu_stalls
    finally:
        sys.path.remove(str(ROOT))
    first = _ncu_source_page([("0x10", "NOP", 5, 1, 5, 0)], "first")
    last = _ncu_source_page([
        ("0x100", "WARPGROUP.DEPBAR.LE gsb0, 0x0", 30, 10, 30, 0),
        ("0x110", "MUFU.EX2 R1, R1", 20, 100, 0, 20),
        ("0x120", "@!P2 MUFU.EX2 R2, R2", 20, 100, 0, 20),
        ("0x130", "FMUL R3, R3, R4", 30, 300, 10, 20),
    ], "_fused_prefill_kernel")
    path = tmp_path / "src.csv"
    path.write_text(first + last)
    ncu_stalls.main([str(path), "--order"])
    out = capsys.readouterr().out
    assert "## `_fused_prefill_kernel`" in out and "100 samples." in out, out
    # barrier 40 of 100 samples, wait 60; the opcode rows in share order.
    assert "| stall_wait | 60.0% |" in out and "| stall_barrier | 40.0% |" in out, out
    assert "| `MUFU.EX2` | 40.0% | 200 | wait 40.0% |" in out, out
    assert out.index("`MUFU.EX2`") < out.index("`WARPGROUP.DEPBAR.LE`"), out
    assert "MUFU.EX2 x2: 40.00% of samples" in out and "DEPBAR" in out, out
    ncu_stalls.main([str(path), "--kernel", "0"])
    assert "## `first`" in capsys.readouterr().out
    (tmp_path / "bad.csv").write_text("a,b\n1,2\n")
    for args, said in (([str(tmp_path / "bad.csv")], "source: no \"Kernel Name\" line"),
                       ([str(path), "--kernel", "2"],
                        "--kernel: expected an index into the 2 kernels, got 2"),
                       ([str(path), "--top", "0"], "--top: expected >= 1, got 0")):
        with pytest.raises(SystemExit) as exc:
            ncu_stalls.main(args)
        assert exc.value.code == 2
        assert said in capsys.readouterr().err, args


def test_profile_peer_rejects_bad_arguments(tmp_path) -> None:
    """benchmarks/profile_peer.py (round 19's ncu target): --replays below 1, an unknown
    workload and an unknown backend are usage errors naming the argument and the value given,
    before any GPU work; without CUDA it says so instead of failing later."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    script = str(ROOT / "benchmarks" / "profile_peer.py")
    cases = [(["kernels", "prefill-varlen", "--replays", "0"], "--replays: expected >= 1, got 0"),
             (["kernels", "no-such-workload"], "workload: expected a bench workload name or "
              "length spec, got 'no-such-workload'"),
             (["no-such-backend", "prefill-varlen"], "backend: ")]
    if not torch.cuda.is_available():
        cases.append((["kernels", "prefill-varlen"], "needs a CUDA device"))
    for args, said in cases:
        proc = subprocess.run([sys.executable, script, *args], capture_output=True, text=True,
                              cwd=ROOT, env=env, timeout=120)
        assert proc.returncode == 2 and said in proc.stderr, (args, proc.stderr[-800:])


def test_probe_round19_summaries() -> None:
    """benchmarks/probe_round19.py's summaries (reports/h100-round19/): the median, minimum
    and maximum of per-repeat time ratios, and the largest out / LSE difference with the
    non-finite values counted (a NaN is not hidden by the max)."""
    sys.path.insert(0, str(ROOT))
    try:
        from benchmarks.probe_round19 import max_abs_diff, ratio_summary
    finally:
        sys.path.remove(str(ROOT))
    row = {"us_a": [2.0, 4.0, 3.0], "us_b": [1.0, 2.0, 2.0]}
    assert ratio_summary(row, "a", "b") == dict(median=2.0, min=1.5, max=2.0)
    with pytest.raises(ValueError):
        ratio_summary({"us_a": [1.0], "us_b": [1.0, 2.0]}, "a", "b")
    ref = (torch.tensor([[1.5, 1.0]]), torch.tensor([0.25]))
    d = max_abs_diff((torch.tensor([[1.0, 1.25]]), torch.tensor([0.5])), ref)
    assert d == dict(out=0.5, lse=0.25, nonfinite=0), d
    d = max_abs_diff((torch.tensor([[1.0, float("nan")]]), torch.tensor([float("inf")])), ref)
    assert d["nonfinite"] == 2, d


def _probe(name: str, steps: str) -> Any:
    """``benchmarks/NAME.py``: an unknown step exits 1 naming ``steps``; returns the module."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, f"benchmarks/{name}.py", "/tmp", "nope"],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert proc.returncode == 1 and steps in proc.stderr, proc.stderr[-800:]
    sys.path.insert(0, str(ROOT))
    try:
        return importlib.import_module(f"benchmarks.{name}")
    finally:
        sys.path.remove(str(ROOT))


def test_probe_round20_usage_and_cells() -> None:
    """benchmarks/probe_round20.py (reports/h100-round20/): an unknown step exits naming the
    steps; its cells compare the 128-key paths with the default and keep the 64-key contract
    as the control and the timing base."""
    import kernels

    probe = _probe("probe_round20", "bits|times|plans")
    assert probe.BIT_CELLS["control-64-keys"][1] == kernels.Tuning(block_n=64)
    assert {plan for plan, _ in probe.BIT_CELLS.values()} == {"fused", "split", "auto"}
    assert probe.TIME_CELLS["keys64"] == ("auto", kernels.Tuning(block_n=64))


def test_probe_round21_usage_and_schedules() -> None:
    """benchmarks/probe_round21.py (reports/h100-round21/): an unknown step exits naming the
    steps; at commits without the walking programs (``Tuning.splits_per_program``, experiment
    commit c53c413 only) its schedules are the V column blocks and the ordinary merge launch."""
    import kernels

    probe = _probe("probe_round21", "bits|times")
    assert not probe.WALKING
    expected = {"vb2": ("split", kernels.Tuning(value_blocks=2)),
                "vb4": ("split", kernels.Tuning(value_blocks=4)),
                "no-pdl": ("split", kernels.Tuning(dependent_merge=False))}
    assert expected == probe.SCHEDULES, probe.SCHEDULES


def test_probe_round22_usage_and_cells(monkeypatch: pytest.MonkeyPatch) -> None:
    """benchmarks/probe_round22.py (reports/h100-round22/): an unknown step exits naming the
    steps; without the loader switch (experiment commit 565ee23 only) no cell asks for it, and
    the experiment switches of 565ee23, 2bbb717 and 8a58915 fail loudly here; every
    cell builds; a cell ``sN`` runs the contract's kernels at a fixed split of N tokens with the
    tuning given and ``heuristic`` the batch-dependent control (with no tuning), the merge's
    chunk patched for ``+chunkN`` only while the call runs; an unknown cell or switch raises
    instead of timing the default."""
    import kernels
    import kernels.attention as ka

    probe = _probe("probe_round22", probe_steps := "bits|times|bits-merge|times-merge|"
                   "times-split|times-grow|err-grow|bits-scores|times-scores")
    assert probe_steps == probe.STEPS
    assert not probe.AHEAD and not probe.GROW and not probe.SCORES
    seen: list[tuple] = []

    def fake_call(batch, plan="auto", tuning=None, split_size=kernels.DEFAULT_SPLIT_SIZE):
        return lambda: seen.append((plan, tuning, split_size, ka._MERGE_CHUNK))

    monkeypatch.setattr(probe, "call", fake_call)
    cells = [probe.BIT_CELLS, probe.TIME_CELLS, probe.MERGE_BIT_CELLS, probe.MERGE_TIME_CELLS,
             probe.SPLIT_TIME_CELLS, probe.GROW_TIME_CELLS, probe.SCORES_BIT_CELLS,
             probe.SCORES_TIME_CELLS]
    assert not any("+ahead" in cell for group in cells for cell, _ in group.values())
    for group in cells:
        for cell, tuning in group.values():
            probe.make(None, cell, tuning)
    chunk, vb2 = ka._MERGE_CHUNK, kernels.Tuning(value_blocks=2)
    probe.make(None, "s2048", vb2)()
    probe.make(None, "heuristic+chunk32", None)()
    probe.make(None, "split", vb2)()
    assert seen == [("auto", vb2, 2048, chunk), ("auto", None, None, 32),
                    ("split", vb2, kernels.DEFAULT_SPLIT_SIZE, chunk)]
    assert chunk == ka._MERGE_CHUNK
    for bad, tuning in (("auto+ahaed", None), ("auto+chunk", None), ("autoo", None),
                        ("heuristic", vb2)):
        with pytest.raises(ValueError, match="cell"):
            probe.make(None, bad, tuning)
    for switch in ("ahead", "grow", "scores"):  # no experiment switch at this commit
        with pytest.raises(AttributeError):
            probe.make(None, f"split+{switch}", None)()


def test_probe_round23_usage_and_cells(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """benchmarks/probe_round23.py (reports/h100-round23/): an unknown step exits naming the
    steps; ``diag`` exits here (its switch lives at experiment commit bdd11ec only) and its
    ``+diagN`` cells would fail loudly; every other cell builds, ``heuristic`` with the
    batch-dependent split (``split_size=None``) and the tuning given; an unknown cell or switch
    raises instead of timing the default; the bit cells force the keys-as-rows tile against
    the 128-row tile and keep the 64-key contract as the control."""
    import kernels

    probe = _probe("probe_round23", probe_steps := "bits|bits2|times|diag")
    assert probe_steps == probe.STEPS and not probe.DIAG
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "benchmarks/probe_round23.py", str(tmp_path), "diag"],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert proc.returncode == 1 and "experiment commit bdd11ec" in proc.stderr
    seen: list[tuple] = []

    def fake_call(batch, plan="auto", tuning=None, split_size=kernels.DEFAULT_SPLIT_SIZE):
        return lambda: seen.append((plan, tuning, split_size))

    monkeypatch.setattr(probe, "call", fake_call)
    for cell, tuning in probe.TIME_CELLS.values():
        probe.make(None, cell, tuning)()
    default = kernels.DEFAULT_SPLIT_SIZE
    assert seen == [("auto", probe.NO_KT, default), ("auto", None, default),
                    ("split", probe.KT, default), ("auto", probe.NO_KT, None),
                    ("auto", None, None)]
    with pytest.raises(AttributeError, match="KT_DIAG"):
        probe.make(None, "split+diag1", probe.KT)()
    for bad in ("splat", "split+diag3", "split+ahead"):
        with pytest.raises(ValueError, match="cell"):
            probe.make(None, bad, None)
    cells = probe.BIT_CELLS
    assert cells["kt-vs-split"] == (("split", probe.KT), ("split", probe.NO_KT))
    assert cells["control-64-keys"][1][1].block_n == 64
    assert probe.KT.keys_rows is True and probe.NO_KT.keys_rows is False
    # bits_cells (round 24's probe too): differing bits of out and LSE per cell, an error
    # recorded by name instead of stopping the probe.
    import torch

    lse = torch.zeros(3)
    outs = {"x": torch.zeros(2, dtype=torch.float16), "y": torch.tensor([1.0, 0.0]).half()}

    def run(spec):
        if spec == "bad":
            raise RuntimeError("boom")
        return outs[spec], lse

    assert probe.bits_cells({"same": ("x", "x"), "one": ("x", "y"), "err": ("x", "bad")},
                            run) == {"same": 0, "one": 1, "err": "RuntimeError: boom"}
    # bits_rows (rounds 23-25's bit probes): one row per (layout, workload, dtype), bf16 first,
    # the batch built with the layout's heads and page size, the row's identity then its fields.
    import json

    from invariance.workload import HeadConfig

    built: list[tuple] = []
    monkeypatch.setattr(probe, "build_batch", lambda w, heads, dtype, page_size: built.append(
        (w.name, heads.num_kv_heads, dtype, page_size)) or len(built))
    layouts = [(HeadConfig(32, 8, 128), 16), (HeadConfig(8, 8, 128), 64)]
    probe.bits_rows(str(tmp_path), "rows.jsonl", ["decode:1kx1"], layouts,
                    lambda batch: dict(batch=batch))
    rows = [json.loads(line) for line in (tmp_path / "rows.jsonl").read_text().splitlines()]
    assert [(r["dtype"], r["heads"], r["page"], r["batch"]) for r in rows] == [
        ("bfloat16", [32, 8], 16, 1), ("float16", [32, 8], 16, 2),
        ("bfloat16", [8, 8], 64, 3), ("float16", [8, 8], 64, 4)]
    assert all(r["workload"] == "decode:1kx1" for r in rows)
    assert [(kv, page) for _, kv, _, page in built] == [(8, 16), (8, 16), (8, 64), (8, 64)]


def test_probe_round24_usage_and_cells(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """benchmarks/probe_round24.py (reports/h100-round24/): an unknown step exits naming the
    steps; the tree steps exit here (their switch lives at the experiment commits only) and
    their cells would fail loudly; the plan cells force the fused plan and the keys-as-rows
    tile in the split plan; the control is the batch-dependent split; an unknown cell raises
    instead of timing the default."""
    import kernels

    probe = _probe("probe_round24", probe_steps := "plans|tree-bits|tree-times|tree-fused|"
                   "tree-scratch|tree-smem|slots")
    assert probe_steps == probe.STEPS and not probe.HAS_TREE
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for step in ("tree-bits", "tree-smem", "slots"):
        proc = subprocess.run([sys.executable, "benchmarks/probe_round24.py", str(tmp_path),
                               step], capture_output=True, text=True, cwd=ROOT, env=env,
                              timeout=120)
        assert proc.returncode == 1 and "c785797" in proc.stderr, proc.stderr
    seen: list[tuple] = []

    def fake_call(batch, plan="auto", tuning=None, split_size=kernels.DEFAULT_SPLIT_SIZE):
        return lambda: seen.append((plan, tuning, split_size))

    monkeypatch.setattr(probe, "call", fake_call)
    assert probe.PLAN_CELLS == {"fused": ("fused", None), "split-kt": ("split", probe.KT),
                                "auto": ("auto", None)}
    assert probe.KT.keys_rows is True
    for cell in ("default", "control", "flat256"):
        probe.make(None, cell, None)()
    default = kernels.DEFAULT_SPLIT_SIZE
    assert seen == [("auto", None, default), ("auto", None, None), ("split", probe.KT, 256)]
    for cell in ("tree-leaf", "tree-group", "tree-fused", "tree-fused-scratch",
                 "tree-fused-smem", "slots2"):
        with pytest.raises(AttributeError, match=r"TREE|FUSED_SLOTS"):
            probe.make(None, cell, None)()
    with pytest.raises(ValueError, match="cell"):
        probe.make(None, "tree-root", None)


def test_probe_round25_usage_and_cells(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """benchmarks/probe_round25.py (reports/h100-round25/): an unknown step exits naming the
    steps; the experiment steps exit here (their switches live at experiment commits 628895b
    and bbba804 only) and their switched cells would fail loudly; ``final`` compares auto with
    round 24's schedule (the tile forced, one V block, serial order) and the batch-dependent
    control; an unknown switch or cell raises instead of timing the default."""
    import kernels

    probe = _probe("probe_round25", probe_steps := "bits|times|final|ahead2|bits32")
    assert probe_steps == probe.STEPS and not probe.HAS_SWITCHES
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for step, names in (("bits", "628895b"), ("times", "628895b"), ("ahead2", "KT_AHEAD_TILES")):
        proc = subprocess.run([sys.executable, "benchmarks/probe_round25.py", str(tmp_path),
                               step], capture_output=True, text=True, cwd=ROOT, env=env,
                              timeout=120)
        assert proc.returncode == 1 and names in proc.stderr, proc.stderr
    seen: list[tuple] = []

    def fake_call(batch, plan="auto", tuning=None, split_size=kernels.DEFAULT_SPLIT_SIZE):
        return lambda: seen.append((plan, tuning, split_size))

    monkeypatch.setattr(probe, "call", fake_call)
    before = probe.FINAL_CELLS["before"]
    assert before[0] == "split" and (before[1].keys_rows, before[1].value_blocks,
                                     before[1].scores_ahead) == (True, 1, False)
    assert probe.FINAL_CELLS["now"] == ("auto", None)
    for plan, tuning in probe.FINAL_CELLS.values():
        probe.make(None, plan, tuning)()
    default = kernels.DEFAULT_SPLIT_SIZE
    assert seen == [("split", before[1], default), ("auto", None, default),
                    ("auto", None, None)]
    for cell in ("auto+ahead", "heuristic+ahead+blocks", "split+ahead2"):
        with pytest.raises(AttributeError, match=r"KT_AHEAD|KT_BLOCKS|KT_AHEAD_TILES"):
            probe.make(None, cell, None)()
    # bits32: blocks of 32 rows, forced in the split plan, never ahead on one V block.
    assert probe.BITS32_LAYOUTS[0][0].num_q_heads // probe.BITS32_LAYOUTS[0][0].num_kv_heads == 32
    for name, (ref, side) in probe.BITS32_CELLS.items():
        if name.startswith("control"):
            continue
        assert ref == ("split", probe.NO_KT) and side[0] == "split" and side[1].keys_rows
        assert not (side[1].scores_ahead and side[1].value_blocks == 1)
    with pytest.raises(ValueError, match="switches"):
        probe.make(None, "auto+faster", None)
    with pytest.raises(ValueError, match="cell"):
        probe.make(None, "fastest", None)


def _assert_switch_cells(cells: dict, switch: str) -> None:
    """A probe's bit cells ``name: (ref, side)`` for an experiment switch: the control
    (``control-*``) compares the 64-key contract with no switch on either side; every other
    cell has ``+switch`` on its side only, against the 128-row split tile (``*vs-split``) or
    the same tile and plan without the switch."""
    import kernels

    for name, (ref, side) in cells.items():
        if name.startswith("control"):
            assert side[1].block_n == 64 and "+" not in ref[0] + side[0], name
            continue
        assert side[0].endswith("+" + switch) and "+" not in ref[0], name
        if name.endswith("vs-split"):
            assert ref == ("split", kernels.Tuning(keys_rows=False)), name
        else:  # the same tile with and without the switch
            assert ref[1] == side[1] and ref[0] == side[0].partition("+")[0], name


def test_probe_round26_usage_and_cells(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """benchmarks/probe_round26.py (reports/h100-round26/): an unknown step exits naming the
    steps; each experiment step exits here naming its switch and commit (the switches live at
    experiment commits only) and a switched cell fails loudly instead of timing the default;
    ``warm`` times ``auto`` and the batch-dependent control; every bit comparison but the
    control has the switch on one side only, on the same tile, or compares against the
    128-row split tile, and the pair and late cells force the tile they claim."""
    import kernels

    probe = _probe("probe_round26", "warm|pf|pfbits|late|latebits|pairs|pairsbits|diag")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    assert probe.SWITCH == {"pf": ("KT_PREFETCH", "94d3f2b"), "late": ("KT_LATE_SUM", "d6eea7c"),
                            "pairs": ("KT_PAIRS", "5f94496"), "diag": ("KT_DIAG", "31d4c92")}
    for step, (name, commit) in (("pfbits", ("KT_PREFETCH", "94d3f2b")),
                                 ("late", ("KT_LATE_SUM", "d6eea7c")),
                                 ("pairs", ("KT_PAIRS", "5f94496")),
                                 ("diag", ("KT_DIAG", "31d4c92"))):
        proc = subprocess.run([sys.executable, "benchmarks/probe_round26.py", str(tmp_path),
                               step], capture_output=True, text=True, cwd=ROOT, env=env,
                              timeout=120)
        assert proc.returncode == 1 and name in proc.stderr and commit in proc.stderr, proc.stderr
    seen: list[tuple] = []

    def fake_call(batch, plan="auto", tuning=None, split_size=kernels.DEFAULT_SPLIT_SIZE):
        return lambda: seen.append((plan, tuning, split_size))

    monkeypatch.setattr(sys.modules["benchmarks.probe_round25"], "call", fake_call)
    assert probe.WARM_CELLS == {"now": ("auto", None), "control": ("heuristic", None)}
    for plan, tuning in probe.WARM_CELLS.values():
        probe.make(None, plan, tuning)()
    assert seen == [("auto", None, kernels.DEFAULT_SPLIT_SIZE), ("auto", None, None)]
    for cell in ("auto+pf", "split+late", "split+pairs", "auto+diag3"):
        with pytest.raises(AttributeError, match=r"KT_PREFETCH|KT_LATE_SUM|KT_PAIRS|KT_DIAG"):
            probe.make(None, cell, None)()
    # diag: auto with each diagnostic value against auto and the control.
    assert {cell for _, cell in (c[0].partition("+")[::2] for c in probe.DIAG_CELLS.values())} \
        == {"", "diag1", "diag2", "diag3"}
    with pytest.raises(ValueError, match="switch"):
        probe.make(None, "auto+faster", None)
    with pytest.raises(ValueError, match="cell"):
        probe.make(None, "fastest", None)
    for switch, cells in (("pf", probe.PF_BIT_CELLS), ("late", probe.LATE_BIT_CELLS),
                          ("pairs", probe.PAIRS_BIT_CELLS)):
        _assert_switch_cells(cells, switch)
    assert probe.AHEAD.scores_ahead and probe.AHEAD.value_blocks == 2
    assert (probe.SERIAL1.value_blocks, probe.SERIAL2.value_blocks) == (1, 2)
    assert not probe.SERIAL1.scores_ahead and not probe.SERIAL2.scores_ahead


def test_probe_round27_usage_and_cells(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """benchmarks/probe_round27.py (reports/h100-round27/): an unknown step exits naming the
    steps; each step exits here naming its switch and its experiment commit (the switches live
    there only), and a switched cell fails loudly instead of timing the default; the timed
    control is the batch-dependent one; every bit comparison but the control has the switch on
    one side only, on the same tile or against the 128-row split tile, and the phased cells
    force 2 V column blocks (where that schedule runs)."""
    import kernels

    probe = _probe("probe_round27", "bits|times|pbits|ptimes|abits|atimes")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    assert probe.SWITCHES == {"two": "KT_TWO_GROUPS", "phased": "KT_PHASED",
                              "a2": "KT_AHEAD2_RINGS"}
    assert probe.COMMITS == {"two": "e492a3c", "phased": "af90826", "a2": "3160395"}
    for step, name, commit in (("bits", "KT_TWO_GROUPS", "e492a3c"),
                               ("times", "KT_TWO_GROUPS", "e492a3c"),
                               ("pbits", "KT_PHASED", "af90826"),
                               ("ptimes", "KT_PHASED", "af90826"),
                               ("abits", "KT_AHEAD2_RINGS", "3160395"),
                               ("atimes", "KT_AHEAD2_RINGS", "3160395")):
        proc = subprocess.run([sys.executable, "benchmarks/probe_round27.py", str(tmp_path), step],
                              capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
        assert proc.returncode == 1 and name in proc.stderr and commit in proc.stderr, \
            proc.stderr
    seen: list[tuple] = []

    def fake_call(batch, plan="auto", tuning=None, split_size=kernels.DEFAULT_SPLIT_SIZE):
        return lambda: seen.append((plan, tuning, split_size))

    monkeypatch.setattr(sys.modules["benchmarks.probe_round25"], "call", fake_call)
    for cells, switch in ((probe.TIME_CELLS, "two"), (probe.P_TIME_CELLS, "phased"),
                          (probe.A_TIME_CELLS, "a2")):
        assert cells["now"] == ("auto", None) and cells["control"] == ("heuristic", None)
        assert cells[switch] == ("auto+" + switch, None)
    assert probe.TIME_CELLS["control-two"] == ("heuristic+two", None)
    # each step runs its own switch's cells (times steps: no layouts)
    assert {step: (sw, cells) for step, (sw, cells, _, _) in probe.STEP_TABLE.items()} == {
        "bits": ("two", probe.BIT_CELLS), "times": ("two", probe.TIME_CELLS),
        "pbits": ("phased", probe.P_BIT_CELLS), "ptimes": ("phased", probe.P_TIME_CELLS),
        "abits": ("a2", probe.A_BIT_CELLS), "atimes": ("a2", probe.A_TIME_CELLS)}
    assert all((layouts is None) == step.endswith("times")
               for step, (_, _, layouts, _) in probe.STEP_TABLE.items())
    probe.make(None, "heuristic", None)()
    assert seen == [("auto", None, None)]
    for switch, name in probe.SWITCHES.items():  # each cell patches its own switch
        with pytest.raises(AttributeError, match=name):
            probe.make(None, "auto+" + switch, None)()
    for switch, cells in (("two", probe.BIT_CELLS), ("phased", probe.P_BIT_CELLS),
                          ("a2", probe.A_BIT_CELLS)):
        _assert_switch_cells(cells, switch)
        for name, (_, side) in cells.items():
            if not name.startswith("control"):
                assert side[0] == "split+" + switch and side[1].keys_rows, name
                assert switch != "phased" or side[1].value_blocks == 2, name
    with pytest.raises(ValueError, match="switch"):
        probe.make(None, "auto+faster", None)


def test_probe_round28_usage_and_cells(monkeypatch: pytest.MonkeyPatch) -> None:
    """benchmarks/probe_round28.py (reports/h100-round28/): an unknown step exits naming the
    steps; a cell's lead split size reaches ``unified_attention``, ``heuristic`` is the
    batch-dependent control, ``+wK`` patches the walking rule for the call only; every bit
    table holds a control that must differ (one split size or the 64-key contract) and compares
    everything else with the 128-row split tile."""
    import kernels
    import kernels.attention

    probe = _probe("probe_round28", "bits|times|plans|times2|walk")
    seen: list[tuple] = []

    def fake_call(batch, plan="auto", tuning=None, split_size=kernels.DEFAULT_SPLIT_SIZE):
        return lambda: seen.append(("call", plan, tuning, split_size))

    def fake_attention(*args, plan, tuning, lead_split_size, **kw):
        seen.append(("lead", plan, tuning, lead_split_size,
                     kernels.attention.kt_walk_splits(300, 132)))

    class Batch:
        q = k_cache = v_cache = cu_seqlens_q = block_table = sm_scale = None
        kv_lens = torch.tensor([5])

        def q_lens(self) -> list[int]:
            return [1]

    monkeypatch.setattr(probe, "call", fake_call)
    monkeypatch.setattr(kernels, "unified_attention", fake_attention)
    probe.make(Batch(), "heuristic", None)()
    probe.make(Batch(), "split@256", probe.NO_KT)()
    probe.make(Batch(), "auto", None)()
    probe.make(Batch(), "auto@1024+w2", None)()
    rule = kernels.attention.kt_walk_splits
    assert rule(300, 132) == 1  # 300 programs: past two waves, one split each
    assert seen == [("call", "auto", None, None), ("lead", "split", probe.NO_KT, 256, 1),
                    ("call", "auto", None, kernels.DEFAULT_SPLIT_SIZE),
                    ("lead", "auto", None, 1024, 2)]
    assert kernels.attention.kt_walk_splits is rule  # restored after the call
    with pytest.raises(ValueError, match="expected a plan"):
        probe.make(Batch(), "fast", None)
    for cells in (probe.BIT_CELLS, probe.WALK_BIT_CELLS):
        controls = [name for name in cells if name.startswith("control")]
        assert controls and all(a[1] == probe.NO_KT for a, _ in cells.values())
    assert probe.BIT_CELLS["control-one-size"][1] == ("split@1024", probe.NO_KT)
    assert probe.TIME_CELLS["control"] == probe.TIME2_CELLS["control"] == ("heuristic", None)


def test_probe_round29_usage_and_cells(monkeypatch: pytest.MonkeyPatch) -> None:
    """benchmarks/probe_round29.py (reports/h100-round29/): an unknown step exits naming the
    steps; ``@SPLIT/LEAD`` reaches ``unified_attention``; ``+cN``, ``+dN`` and ``+r28`` patch the
    merge for the call only (``+r28`` launches round 28's kernel over KV-head groups); the bit
    table holds a control that must differ."""
    import kernels
    import kernels.attention as ka

    probe = _probe("probe_round29", "times|parts|bits|times2")
    seen: list[tuple] = []

    def fake_call(batch, plan="auto", tuning=None, split_size=kernels.DEFAULT_SPLIT_SIZE):
        def run():
            kernel = ka._merge_splits_kernel
            seen.append(("call", plan, split_size, ka._MERGE_CHUNK, ka._MERGE_BLOCK_D,
                         kernel.G if isinstance(kernel, probe._R28) else None))
        return run

    def fake_attention(*args, plan, split_size, lead_split_size, **kw):
        seen.append(("sizes", plan, split_size, lead_split_size))

    class Batch:
        q = torch.zeros(1, 32, 8)
        k_cache = torch.zeros(1, 16, 8, 8)
        v_cache = cu_seqlens_q = block_table = sm_scale = None
        kv_lens = torch.tensor([5])

        def q_lens(self) -> list[int]:
            return [1]

    monkeypatch.setattr(probe, "call", fake_call)
    monkeypatch.setattr(kernels, "unified_attention", fake_attention)
    chunk, block_d, kernel = ka._MERGE_CHUNK, ka._MERGE_BLOCK_D, ka._merge_splits_kernel
    probe.make(Batch(), "heuristic+c16+d64", None)()
    probe.make(Batch(), "auto+r28", None)()
    probe.make(Batch(), "auto@2048/256", None)()
    probe.make(Batch(), "split@2048", None)()
    assert seen == [("call", "auto", None, 16, 64, None),
                    ("call", "auto", kernels.DEFAULT_SPLIT_SIZE, chunk, block_d, 4),
                    ("sizes", "auto", 2048, 256), ("sizes", "split", 2048, None)]
    assert (ka._MERGE_CHUNK, ka._MERGE_BLOCK_D, ka._merge_splits_kernel) == (chunk, block_d,
                                                                           kernel)
    with pytest.raises(ValueError, match="expected a plan"):
        probe.make(Batch(), "fast", None)
    with pytest.raises(ValueError, match="switch"):
        probe.make(Batch(), "auto+faster", None)
    assert probe.BIT_CELLS["control-one-size"] == "auto@1024/1024"
    assert probe.TIME2_CELLS["control-r28"] == ("heuristic+r28", None)
