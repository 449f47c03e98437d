"""Nothing lost, nothing silently wrong: each bad input names the argument, the expected and the
actual value; outputs are checked before a run; interrupted runs keep what finished.

Kernel-argument and report-file cases live in tests/triton_kernels/test_validation.py,
tests/triton_kernels/test_fuzz.py and tests/test_report.py.
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import invariance
from invariance import AttentionBatch
from invariance.backends.reference import reference_backend
from invariance.cli import main

CHEAP = ["prefill_vs_decode"]


# ------------------------------------------------------------------------------------------
# check() arguments: every one validated by CheckSpec, named in the error
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("kwargs", "message"), [
    ({"accuracy_rows": 0}, "accuracy_rows: expected an int >= 1, got 0"),
    ({"accuracy_rows": -5}, "accuracy_rows: expected an int >= 1, got -5"),
    ({"seed": "abc"}, "seed: expected an int >= 0, got 'abc'"),
    ({"seed": 1.5}, "seed: expected an int >= 0, got 1.5"),
    ({"seed": None}, "seed: expected an int >= 0, got None"),
    ({"budget": True}, "budget: expected an int >= 1, got True"),
    ({"max_violations": -1}, "max_violations: expected an int >= 0, got -1"),
    ({"heads": (4, 2, 64)}, "heads: expected a HeadConfig or 'Hq:Hkv:D', got (4, 2, 64)"),
    ({"heads": "²:2:64"}, "heads: expected 'Hq:Hkv:D' with positive integers"),
    ({"dtype": ""}, "dtype: expected one of float16, bfloat16, float32"),
    ({"dtype": []}, "dtype: expected at least one dtype, got none"),
    ({"perturbations": ""}, "perturbations: expected 'all' or at least one name, got ''"),
    ({"perturbations": 3}, "perturbations: expected 'all', a name or a list of names, got 3"),
    ({"device": "tpu"}, "device: expected 'cpu' or 'cuda', got 'tpu'"),
    ({"shrink": "yes"}, "shrink: expected True or False, got 'yes'"),
    ({"perturbations": ["cuda_graph"]}, "perturbations: cuda_graph needs a CUDA device"),
])
def test_check_arguments_are_named(kwargs: dict[str, Any], message: str) -> None:
    if "device" not in kwargs and torch.cuda.is_available():
        pytest.skip("CPU-specific message")
    with pytest.raises(ValueError) as info:
        invariance.check("reference", device=kwargs.pop("device", "cpu"), **kwargs)
    assert message in str(info.value)


def test_capabilities_turn_the_impossible_into_a_usage_error() -> None:
    def half_only(batch: AttentionBatch) -> object:
        return reference_backend(batch)

    half_only.capabilities = invariance.Capabilities(  # type: ignore[attr-defined]
        dtypes=("float16", "bfloat16"), head_dims=(128,), devices=("cuda",))
    with pytest.raises(ValueError, match=r"dtype: backend .* supports float16, bfloat16, got "
                                         r"float32"):
        invariance.check(half_only, device="cpu", dtype="float32")
    with pytest.raises(ValueError, match=r"heads: backend .* supports head dims 128, got "
                                         r"head_dim 64"):
        invariance.check(half_only, device="cpu", dtype="float16")
    with pytest.raises(ValueError, match=r"device: backend .* runs on cuda, got cpu"):
        invariance.check(half_only, device="cpu", dtype="float16", heads="4:2:128")


def test_kernels_declare_their_split_size() -> None:
    import kernels
    from invariance.backends.kernels import KernelsBackend

    caps = KernelsBackend().capabilities
    assert caps.split_tokens == kernels.DEFAULT_SPLIT_SIZE
    spec = invariance.CheckSpec.build(KernelsBackend(split_size=128), device="cpu")
    assert spec.scale.long == 1100  # already > 2.5 splits of 128
    # On the CPU, 256-token splits (tests/test_kernels_harness.py): 1100 > 2.5 of them too.
    spec = invariance.CheckSpec.build("kernels", device="cpu")
    assert spec.scale.split == caps.split_on("cpu") and spec.scale.long == 1100
    # Elsewhere the longest row spans 2.5 default splits.
    small = invariance.SCALES["small"].for_split(caps.split_on("cuda"))
    assert small.long == 1024 * 5 // 2 + 3


def test_kernels_declare_their_head_dims() -> None:
    with pytest.raises(ValueError, match="heads: backend kernels supports head dims 64, 128, "
                                         "256, got head_dim 96"):
        invariance.check("kernels", device="cpu", heads="4:2:96")


# ------------------------------------------------------------------------------------------
# AttentionBatch
# ------------------------------------------------------------------------------------------

def _batch(**changes: Any) -> AttentionBatch:
    wl = invariance.Workload((invariance.Request(0, 5),), invariance.HeadConfig(4, 2, 64))
    step = invariance.Step((invariance.Chunk(0, 3, 5),))
    batch = invariance.materialize(wl, step, invariance.PageLayout(page_size=4), "cpu")
    for k, v in changes.items():
        setattr(batch, k, v)
    return batch


@pytest.mark.parametrize(("changes", "message"), [
    ({"sm_scale": float("inf")}, "sm_scale: expected a finite positive float, got inf"),
    ({"sm_scale": True}, "sm_scale: expected a finite positive float, got True"),
    ({"sm_scale": 0.0}, "sm_scale: expected a finite positive float, got 0.0"),
    ({"q": torch.zeros(2, 0, 64)}, "q.shape: expected [T, Hq >= 1, D >= 1], got [2, 0, 64]"),
    ({"request_ids": ("a",)}, "request_ids: expected ints, got 'a'"),
])
def test_batch_values_are_named(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError) as info:
        _batch(**changes).validate()
    assert message in str(info.value)


def test_batch_rejects_non_tensors_at_construction() -> None:
    with pytest.raises(ValueError, match=r"q: expected a torch\.Tensor, got str"):
        AttentionBatch("x", *[torch.zeros(1)] * 5, sm_scale=1.0)  # type: ignore[arg-type]


def test_meta_tensors_are_named() -> None:
    b = _batch()
    with pytest.raises(ValueError, match=r"q\.device: expected a device holding data"):
        _batch(q=b.q.to("meta")).validate()


def test_reference_backend_validates_instead_of_indexing_out_of_bounds() -> None:
    b = _batch()
    b.block_table = torch.full_like(b.block_table, 99)
    with pytest.raises(ValueError, match=r"block_table\[0, :2\]: expected page ids in"):
        reference_backend(b)


_TENSOR = st.sampled_from([
    torch.zeros(3, 4, 64), torch.zeros(2, 4, 64, dtype=torch.float16), torch.zeros(3),
    torch.zeros(2, 4, 2, 64), torch.zeros(2, 4, 2, 32), torch.tensor([0, 3], dtype=torch.int32),
    torch.tensor([0, 1, 3], dtype=torch.int32), torch.tensor([5], dtype=torch.int32),
    torch.tensor([[0, 1]], dtype=torch.int32), torch.tensor([[0, 7]], dtype=torch.int32),
    torch.tensor([-1], dtype=torch.int32), torch.zeros(1, 2, dtype=torch.int64),
    torch.zeros(0, 4, 64), torch.empty(0, dtype=torch.int32),
])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tensors=st.lists(_TENSOR, min_size=6, max_size=6),
       scale=st.sampled_from([0.125, 0.0, -1.0, float("nan"), 1, True, "x"]))
def test_fuzz_malformed_batches_end_in_value_error(tensors: list[torch.Tensor],
                                                   scale: object) -> None:
    """Every malformed batch is a ValueError from validate() or a valid batch whose reference
    result has the contract's shapes, never another exception."""
    batch = AttentionBatch(*tensors, sm_scale=scale)  # type: ignore[arg-type]
    try:
        batch.validate()
    except ValueError:
        return
    result = reference_backend(batch)
    assert result.out.shape == batch.q.shape


# ------------------------------------------------------------------------------------------
# CLI: one line, exit 2, before anything runs; outputs safe
# ------------------------------------------------------------------------------------------

def _run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(("args", "message"), [
    (["check", "--dtype", ""], "dtype: expected at least one value, got ''"),
    (["check", "--perturb", ""], "perturbations: expected at least one value, got ''"),
    (["check", "--heads", "²:2:64"], "heads: expected 'Hq:Hkv:D' with positive integers"),
    (["check", "--backend", "kernels", "--heads", "4:2:96", "--device", "cpu"],
     "heads: backend kernels supports head dims 64, 128, 256, got head_dim 96"),
    (["check", "--backend", "reference", "--perturb", "cuda_graph", "--device", "cpu"],
     "perturbations: cuda_graph needs a CUDA device, got device cpu"),
    (["check", "--budget", "0"], "budget: expected an int >= 1, got 0"),
])
def test_cli_usage_errors_are_one_line(args: list[str], message: str,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(args, capsys)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and message in err, err


def test_output_paths_are_checked_before_the_run(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    def never(batch: AttentionBatch) -> object:
        raise AssertionError("the check ran although an output path was bad")

    missing = tmp_path / "no-such-dir" / "r.md"
    for extra in (["--markdown", str(missing)], ["--json", str(tmp_path)],
                  ["--json", str(tmp_path / "x"), "--markdown", str(tmp_path / "x")]):
        code, _, err = _run(["check", "--backend", "reference", "--device", "cpu", *extra],
                            capsys)
        assert code == 2 and ("--markdown" in err or "--json" in err), err


def test_report_and_compare_never_overwrite_their_inputs(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    path = tmp_path / "r.json"
    assert main(["check", "--backend", "reference", "--device", "cpu", "--perturb",
                 CHEAP[0], "--json", str(path)]) == 0
    before = path.read_bytes()
    capsys.readouterr()
    code, _, err = _run(["report", str(path), "--markdown", str(path)], capsys)
    assert code == 2 and "would overwrite the input" in err
    code, _, err = _run(["compare", str(path), str(path), "--markdown", str(path)], capsys)
    assert code == 2 and "would overwrite the input" in err
    assert path.read_bytes() == before


BACKENDS = textwrap.dedent("""
    import sys
    from invariance.backends.reference import reference_backend

    def exits_in_big_batches(batch):
        if batch.batch_size >= 5:
            sys.exit(3)
        return reference_backend(batch)

    def interrupted_in_big_batches(batch):
        if batch.batch_size >= 5:
            raise KeyboardInterrupt
        return reference_backend(batch)
""")


@pytest.mark.parametrize("fn", ["exits_in_big_batches", "interrupted_in_big_batches"])
def test_interrupted_run_keeps_finished_cells(fn: str, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    module = tmp_path / "user_backends.py"
    module.write_text(BACKENDS)
    out = tmp_path / "partial.json"
    code, _, err = _run(["check", "--backend", f"{module}:{fn}", "--device", "cpu",
                         "--perturb", "prefill_vs_decode,order,repeat", "--json", str(out)],
                        capsys)
    assert code == 130 and "partial report is marked incomplete" in err
    assert not out.exists()  # only a complete run writes PATH; its progress goes beside it
    report = invariance.Report.from_json(tmp_path / "partial.json.partial")
    assert [r.perturbation for r in report.results] == ["prefill_vs_decode"]
    assert report.incomplete and "after 1 of 3 cells" in report.incomplete
    assert not report.passed and report.verdict().startswith("INCOMPLETE")


def test_api_interrupt_carries_the_partial_report(tmp_path: Path) -> None:
    calls = {"n": 0}

    def third_call_interrupts(batch: AttentionBatch) -> object:
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return reference_backend(batch)

    with pytest.raises(invariance.CheckInterrupted) as info:
        invariance.check(third_call_interrupts, device="cpu",
                         perturbations=["prefill_vs_decode", "order"])
    assert info.value.report.incomplete is not None


@pytest.mark.skipif(sys.platform != "linux", reason="segfaults a child process on purpose")
def test_isolate_turns_a_crashing_backend_into_an_error_cell(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    module = tmp_path / "crashy.py"
    module.write_text(textwrap.dedent("""
        import ctypes
        from invariance.backends.reference import reference_backend

        def crash_on_other_page_sizes(batch):
            if batch.k_cache.shape[1] != 4:
                ctypes.string_at(0)
            return reference_backend(batch)
    """))
    out = tmp_path / "r.json"
    code, _, _ = _run(["check", "--backend", f"{module}:crash_on_other_page_sizes",
                       "--device", "cpu", "--perturb", "prefill_vs_decode,paging", "--isolate",
                       "--json", str(out)], capsys)
    assert code == 1
    cells = {r["perturbation"]: r for r in json.loads(out.read_text())["results"]}
    assert cells["prefill_vs_decode"]["status"] == "passed"
    assert cells["paging"]["status"] == "error"
    assert "process died (signal SIGSEGV)" in cells["paging"]["error"]


def test_large_scale_on_cpu_warns(capsys: pytest.CaptureFixture[str],
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    import invariance.runner

    monkeypatch.setattr(invariance.runner, "run_spec", lambda spec, **kw: (_ for _ in ()).throw(
        KeyboardInterrupt))
    _, _, err = _run(["check", "--backend", "reference", "--device", "cpu", "--scale",
                      "large"], capsys)
    assert "warning: --scale large on cpu" in err


_FLAGS = ["check", "report", "compare", "list", "env", "replay", "--backend", "--dtype",
          "--perturb", "--budget", "--seed", "--device", "--heads", "--scale", "--no-shrink",
          "--isolate", "--json", "--markdown", "--max-violations", "--accuracy-rows", "x", "",
          "0", "-1", "2", "fp16", "float8", "cpu", "cuda", "4:2:64", "4:3:64", "small",
          "reference", "all", "mixed", "--debug", "--version", "nope.json"]


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(args=st.lists(st.sampled_from(_FLAGS), max_size=7))
def test_fuzz_cli_arguments_end_in_a_documented_exit(args: list[str],
                                                     monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """Random argument lists: exit 0, 1, 2 or 130, never a traceback unless ``--debug`` asked
    for one (checks do not run: the driver is replaced by one that returns an empty report)."""
    import invariance.runner

    def empty(spec: invariance.CheckSpec, **_: Any) -> invariance.Report:
        return invariance.Report(spec.backend.name, str(spec.device), ["float32"], "4:2:64",
                                 "small", 1, 0, [], invariance.Environment.capture("cpu"))

    monkeypatch.setattr(invariance.runner, "run_spec", empty)
    monkeypatch.chdir(Path(__file__).parent)
    code = main(list(args))
    _, err = capsys.readouterr()
    assert code in (0, 1, 2, 130)
    if "--debug" not in args:  # --debug shows the traceback on purpose
        assert "Traceback" not in err
