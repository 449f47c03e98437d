"""``invariance bench`` without a GPU: workloads, the ideal-time arithmetic, the ratio table and
the renderers, with an injected timer and injected limits."""

from __future__ import annotations

import json
import math
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
    BEST_OF,
    GRIDS,
    WORKLOADS,
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
from invariance.features import Features
from invariance.render import bench_to_markdown, print_bench
from invariance.render.bench import bench_table
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
    assert resolve("kernels:host_lens=false").fn == KernelsBackend(use_host_lens=False)
    assert resolve("kernels:tuned=false").fn == KernelsBackend(use_table=False)
    assert resolve("kernels:plan=split,keys_rows=true").fn == KernelsBackend(
        kernel_plan="split", keys_rows=True)
    assert resolve("kernels:keys_rows=auto").fn == KernelsBackend()
    assert all(BUILTIN[n].options for n in BUILTIN if n.startswith("kernels"))
    for bad, match in [
            ("kernels:nope=1", "kernels option 'nope': unknown; expected one of split_size, "
                               "lead_split_size, plan, gluon, keys_rows, host_lens, tuned, "
                               "block_m, "
                               "num_warps, "
                               "num_stages, block_n, got 'nope'"),
            ("kernels:host_lens=maybe", "host_lens: expected one of true, false, got 'maybe'"),
            ("kernels:tuned=2", "tuned: expected one of true, false, got '2'"),
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
            ("kernels:gluon=yes", "gluon: expected one of auto, true, false, got 'yes'"),
            ("kernels:keys_rows=1", "keys_rows: expected one of auto, true, false, got '1'")]:
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
    assert ("| workload | kind | shape | ideal us | sdpa-math us | sdpa-math % ideal | "
            "reference us |") in md
    assert "reference / sdpa-math" in md
    assert "| decode:33x3 | decode | - |" in md and "2.00x" in md
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



def test_grids_name_their_shapes_and_select_in_order() -> None:
    """The ``shapes`` grid covers the classes a server meets (head dims 64 and 256, GQA 1 and 8,
    fp16, pages of 1 and 64, long single decodes, short and long prompts, chunked prefill, a
    speculative verify step); a grid's workloads come first, each workload once; an unknown grid
    is named."""
    shapes = {w.name: w for w in GRIDS["shapes"]}
    assert shapes["hd64/decode-b8-ctx8k"].heads == HeadConfig(64, 8, 64)
    assert shapes["hd256/prefill-varlen"].heads == HeadConfig(16, 8, 256)
    assert shapes["mha/decode-b8-ctx8k"].heads == HeadConfig(32, 32, 128)
    assert shapes["page1/mixed64"].page_size == 1 and shapes["fp16/prefill-varlen"].dtype == \
        "float16"
    assert shapes["decode-b1-ctx128k"].kv_lens == (131072,)
    assert set(shapes["spec-verify32"].q_lens) == {4}
    assert [w.name for w in GRIDS["default"]] == list(WORKLOADS)
    got = [w.name for w in select_workloads(["mixed64", "decode-b1-ctx1k"], ["decode:1k"],
                                            ["default"])]
    assert got == [*WORKLOADS, "decode:1k"]
    with pytest.raises(ValueError, match="grid: unknown nope; expected one of default, shapes"):
        select_workloads(grids=["nope"])


def test_a_workload_runs_at_its_own_shape() -> None:
    """A workload naming its heads, dtype and page size is built and its ideal time computed
    at them; the report names the shape where it differs from the run's."""
    seen: list[tuple[int, int, torch.dtype, int]] = []

    class Shapes(_Recorder):
        def time_backend(self, backend: ResolvedBackend, batch: AttentionBatch) -> Timing:
            seen.append((batch.num_q_heads, batch.head_dim, batch.dtype, batch.page_size))
            return Timing(1.0)

    w = BenchWorkload("hd128/decode", (1, 1), (40, 9), heads=HeadConfig(4, 4, 128),
                      dtype="float16", page_size=8)
    report = run_bench(["reference"], [w, parse_lengths("decode:9")], dtype="float32",
                       heads=SMALL, page_size=4, device="cpu", timer=Shapes(), limits=LIMITS)
    assert seen == [(4, 128, torch.float16, 8), (4, 64, torch.float32, 4)]
    r = report.results[0]
    assert (r.heads, r.dtype, r.page_size) == ("4:4:128", "float16", 8)
    assert r.kv_bytes == kv_bytes(w, HeadConfig(4, 4, 128), torch.float16)
    _, rows = bench_table(report)
    assert rows[0][2] == "float16, 4:4:128, page 8" and rows[1][2] == "-"


def test_best_of_keeps_the_fastest_variant_and_names_it() -> None:
    """A composite baseline times every variant on each workload and keeps the fastest; a
    variant that fails or cannot run the shape is recorded and skipped; ratios use the best."""
    BEST_OF["cpu-best"] = ("sdpa-math", "reference", "sdpa-flash")
    try:
        timer = FakeTimer({"reference": 0.02, "sdpa-math": 0.01})
        report = run_bench(["reference"], [parse_lengths("decode:33x3")], baseline="cpu-best",
                           dtype="float32", heads=SMALL, page_size=4, device="cpu", timer=timer,
                           limits=LIMITS)
    finally:
        del BEST_OF["cpu-best"]
    (r,) = report.results
    best = r.times["cpu-best"]
    assert best.variant == "sdpa-math" and best.ms == pytest.approx(0.03)
    assert best.candidates["reference"] == pytest.approx(0.06)
    assert best.candidates["sdpa-flash"] is None  # runs on cuda only: recorded, not timed
    assert report.ratio(r, "reference") == pytest.approx(2.0)
    header, rows = bench_table(report)
    assert "cpu-best variant" in header and rows[0][header.index("cpu-best variant")] == \
        "sdpa-math"
    assert "flashinfer-best" in BEST_OF and all(v.startswith("flashinfer")
                                                for v in BEST_OF["flashinfer-best"])


def test_features_reach_every_batch_the_ideal_time_and_the_report() -> None:
    """``features`` put a window, sinks, a soft-cap and an FP8 cache in every workload's batch;
    the ideal time counts the keys the window leaves and one byte per FP8 value; a backend that
    lacks a feature is refused before anything runs, a composite's variant is skipped."""
    feats = Features(window=8, sinks=True, softcap=30.0, kv_dtype="fp8_e4m3", kv_scale="head")
    w = parse_lengths("decode:37x2+chunk:5/20")
    batch = build_batch(w, SMALL, torch.float16, page_size=4, device="cpu", seed=1,
                        features=feats).validate()
    assert batch.window_left == 8 and batch.logits_soft_cap == 30.0
    assert batch.sinks is not None and batch.sinks.shape == (SMALL.num_q_heads,)
    assert batch.k_cache.dtype == torch.float8_e4m3fn and batch.k_scale is not None
    assert batch.features_used() == {"window", "sinks", "softcap", "fp8_kv_head"}
    # decodes read their last 9 keys, the chunk its 5 rows' windows: keys 7..19 (13 keys)
    assert kv_bytes(w, SMALL, torch.float16, feats) == (9 + 9 + 13) * 2 * 64 * 2 * 1
    assert causal_flops(parse_lengths("prefill:12"), SMALL, Features(window=3)) == \
        4 * 64 * 4 * (1 + 2 + 3 + 4 * 9)
    timer = FakeTimer({"reference": 0.02})
    report = run_bench(["reference"], [w], dtype="float16", heads=SMALL, page_size=4,
                       device="cpu", timer=timer, limits=LIMITS, features=feats)
    assert report.features == feats.to_dict() and report.results[0].kv_bytes == \
        kv_bytes(w, SMALL, torch.float16, feats)
    assert "features: window 8, sinks, softcap 30, fp8_e4m3 KV (per-head scales)" in \
        bench_to_markdown(report)
    with pytest.raises(ValueError, match="features: backend sdpa-math takes sinks, window, "
                                         "not fp8_kv_head, softcap"):
        run_bench(["sdpa-math"], [w], dtype="float16", heads=SMALL, page_size=4, device="cpu",
                  timer=timer, limits=LIMITS, features=feats)
    BEST_OF["cpu-best"] = ("sdpa-math", "reference")
    try:
        report = run_bench(["reference"], [w], baseline="cpu-best", dtype="float16",
                           heads=SMALL, page_size=4, device="cpu", timer=timer, limits=LIMITS,
                           features=feats)
    finally:
        del BEST_OF["cpu-best"]
    best = report.results[0].times["cpu-best"]
    assert best.variant == "reference" and best.candidates["sdpa-math"] is None


def test_bench_cli_names_a_bad_feature(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--feature", "window=-3", "--lengths", "decode:9"]) == 2
    assert "window" in capsys.readouterr().err
    assert main(["bench", "--kv-dtype", "int4", "--lengths", "decode:9"]) == 2
    assert "kv" in capsys.readouterr().err.lower()


def test_visible_keys_match_a_row_by_row_count() -> None:
    """Keys read and (row, key) pairs of a request under a window, against counting each row."""
    from invariance.bench import _visible_keys

    for q_len in range(1, 9):
        for kv_len in range(q_len, 13):
            for window in range(-1, 11):
                keys: set[int] = set()
                pairs = 0
                for p in range(kv_len - q_len, kv_len):
                    lo = 0 if window < 0 else max(0, p - window)
                    keys.update(range(lo, p + 1))
                    pairs += p + 1 - lo
                assert _visible_keys(q_len, kv_len, window) == (len(keys), pairs), \
                    (q_len, kv_len, window)
