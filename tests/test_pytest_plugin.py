"""The pytest plugin, driven through ``pytester`` on throwaway projects.

Checks in the throwaway projects stay tiny: CPU, budget 1, one or two cheap perturbations
(``mixed`` is the quickest one on which the batch-variant control fails).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import textwrap
from typing import Any

import pytest
import torch

# pytester's in-process runs forget the modules a run imported; native extensions (torch, triton)
# abort when imported twice in one process, so everything the runs use is imported here first.
import invariance.backends.reference
import invariance.backends.torch_backends
import invariance.runner  # noqa: F401
from _invariance_options import add_options, collect
from _invariance_pytestplugin import CUDA_SKIP_REASON, Settings
from invariance.report import Environment, Report

Environment.capture("cpu")  # imports triton, when installed

# The user's functions under test: the reference backend (invariant by construction) and the
# batch-variant control (its KV chunk size follows the batch size), each wrapped as a user would.
BACKENDS = """
from invariance.backends.reference import reference_backend
from invariance.backends.torch_backends import batch_variant_backend

def my_invariant_attention(batch):
    return reference_backend(batch)

def my_batch_variant_attention(batch):
    return batch_variant_backend(batch)
"""

CHEAP = '["mixed", "order"]'


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makepyfile(my_backends=BACKENDS)
    pytester.syspathinsert()
    return pytester


def test_invariant_function_passes(project: pytest.Pytester) -> None:
    project.makepyfile(f"""
        from my_backends import my_invariant_attention

        def test_it(invariance_check):
            report = invariance_check(my_invariant_attention, perturbations={CHEAP},
                                      device="cpu", budget=1)
            assert report.passed
            assert report.perturbations == ["mixed", "order"]
    """)
    result = project.runpytest_inprocess()
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([
        "*- invariance -*",
        "1 check(s): 1 passed, 0 failed (seed 0)",
        "PASSED test_invariant_function_passes.py::test_it: backend "
        "my_backends:my_invariant_attention on cpu [[]float32[]]",
    ])


def test_batch_variant_function_fails_naming_the_perturbation(project: pytest.Pytester) -> None:
    project.makepyfile(f"""
        from my_backends import my_batch_variant_attention

        def test_it(invariance_check):
            invariance_check(my_batch_variant_attention, perturbations={CHEAP}, device="cpu")
    """)
    result = project.runpytest_inprocess()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "invariance: FAILED: backend my_backends:my_batch_variant_attention on cpu (float32)*",
        "  mixed [[]float32[]]: * of 3 case(s) differ, max * ULP, max |diff| *",
        "    case *, request * (batch-variant): * of * token* differ, shrunk",
        "      a: request * alone *",
        "      b: one call of * requests: *",
        "      *: * of * elements differ (max |diff| *, max * ULP); first at request=*",
        "minimal reproducer (shrunk mixed [[]float32[]]; raises with the diff):",
        "    import invariance",
        "    workload = Workload(requests=(Request(*",
        "    invariance.replay('my_backends:my_batch_variant_attention', workload, a, b, *",
        "*- invariance -*",
        "FAILED test_*::test_it: * not invariant under mixed[[]float32[]]",
    ])
    out = result.stdout.str()
    assert "order [float32]" not in out  # passed cells are not listed
    # pytest.fail(pytrace=False): the message, not a traceback through the plugin.
    assert "_invariance_pytestplugin.py" not in out
    assert "def test_it" not in out


def test_report_option_writes_the_cli_schema(project: pytest.Pytester) -> None:
    project.makepyfile(f"""
        import pytest
        from my_backends import my_batch_variant_attention, my_invariant_attention

        @pytest.mark.parametrize("fn", [my_invariant_attention, my_batch_variant_attention])
        def test_it(invariance_check, fn):
            invariance_check(fn, perturbations={CHEAP}, device="cpu")
    """)
    path = project.path / "out" / "invariance.json"
    path.parent.mkdir()
    result = project.runpytest_inprocess(f"--invariance-report={path}")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([f"report written to {path}"])
    report = Report.from_json(path)
    assert report.backend == ("my_backends:my_invariant_attention, "
                              "my_backends:my_batch_variant_attention")
    assert len(report.results) == 4
    assert not report.passed
    assert [c.perturbation for c in report.failed_cells()] == ["mixed"]
    assert json.loads(path.read_text())["schema"] == "invariance.report"


def test_report_renders_with_the_cli(
        project: pytest.Pytester, capsys: pytest.CaptureFixture[str]) -> None:
    cli = pytest.importorskip("invariance.cli")
    project.makepyfile(f"""
        def test_it(invariance_check):
            invariance_check("reference", perturbations={CHEAP}, device="cpu")
    """)
    path = project.path / "invariance.json"
    project.runpytest_inprocess(f"--invariance-report={path}").assert_outcomes(passed=1)
    capsys.readouterr()
    assert cli.main(["report", str(path)]) == 0
    assert "reference" in capsys.readouterr().out


def test_no_report_file_without_a_check(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_plain(): pass")
    path = pytester.path / "invariance.json"
    result = pytester.runpytest_inprocess(f"--invariance-report={path}")
    result.assert_outcomes(passed=1)
    assert not path.exists()
    result.stdout.fnmatch_lines([f"no invariance check ran; no report written to {path}"])


# ------------------------------------------------------------------------------------------
# Sessions that do not use the plugin
# ------------------------------------------------------------------------------------------

def _normalise(output: str) -> list[str]:
    """pytest's output without what differs between any two runs (timings, plugin list)."""
    return [re.sub(r"in [\d.]+s", "in Xs", line) for line in output.splitlines()
            if not line.startswith(("plugins:", "rootdir:"))]


def test_unused_plugin_adds_no_output(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("""
        import pytest

        @pytest.mark.parametrize("x", [1, 2])
        def test_ok(x): pass

        def test_fails(): assert 1 == 2
    """)
    with_plugin = pytester.runpytest_subprocess("-rA")
    without = pytester.runpytest_subprocess("-rA", "-p", "no:invariance")
    with_plugin.assert_outcomes(passed=2, failed=1)
    assert _normalise(with_plugin.stdout.str()) == _normalise(without.stdout.str())
    assert "invariance" not in "\n".join(_normalise(with_plugin.stdout.str()))


def test_unused_plugin_does_not_import_torch(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("""
        import sys

        def test_light(pytestconfig):
            assert pytestconfig.pluginmanager.has_plugin("invariance")
            heavy = sorted(m for m in sys.modules
                           if m.split(".")[0] == "torch" or m.startswith("invariance."))
            assert heavy == []
    """)
    pytester.runpytest_subprocess().assert_outcomes(passed=1)


def test_plugin_module_imports_nothing_heavy() -> None:
    """``python -X importtime``: loading the plugin imports pytest and nothing of torch or the
    invariance core."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import _invariance_pytestplugin"],
        capture_output=True, text=True, check=True)
    modules = {line.split("|")[-1].strip() for line in proc.stderr.splitlines()
               if line.startswith("import time:")}
    assert {"_invariance_pytestplugin", "_invariance_options"} <= modules
    assert not {m for m in modules if m.split(".")[0] in ("torch", "triton", "numpy", "rich")}
    assert not {m for m in modules if m.startswith("invariance")}


# ------------------------------------------------------------------------------------------
# Options, ini settings, marker, parametrisation
# ------------------------------------------------------------------------------------------

def test_options_are_shared_with_argparse() -> None:
    parser = argparse.ArgumentParser()
    add_options(parser.add_argument, prefix="")
    ns = parser.parse_args(["--dtype", "float16", "--dtype", "bf16", "--budget", "3",
                            "--seed", "9", "--device", "cpu", "--no-shrink"])
    assert (ns.dtype, ns.budget, ns.seed, ns.device, ns.shrink) == (
        ["float16", "bf16"], "3", "9", "cpu", True)
    assert collect(vars(ns)) == {"dtype": ["float16", "bfloat16"], "budget": 3, "seed": 9,
                                 "device": "cpu", "shrink": False}


def test_options_set_the_fixture_defaults(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(f"""
        def test_it(invariance_check):
            report = invariance_check("reference", perturbations={CHEAP})
            assert report.dtypes == ["float16", "bfloat16"]
            assert (report.budget, report.seed, report.device) == (2, 11, "cpu")
    """)
    result = pytester.runpytest_inprocess(
        "--invariance-dtype=fp16", "--invariance-dtype=bfloat16", "--invariance-budget=2",
        "--invariance-seed=11", "--invariance-device=cpu")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([
        "invariance: dtype float16, bfloat16, budget 2, seed 11, device cpu",
        "1 check(s): 1 passed, 0 failed (seed 11)",
    ])


def test_the_command_line_overrides_addopts(pytester: pytest.Pytester) -> None:
    """pytest's convention, kept by the plugin (the CLI refuses a repeat): the last value wins,
    so a command-line option overrides the same option in ``addopts``."""
    pytester.makeini("""
        [pytest]
        addopts = --invariance-seed=5
    """)
    pytester.makepyfile("""
        def test_it(invariance_check):
            assert invariance_check("reference", perturbations=["order"], device="cpu").seed == 6
    """)
    pytester.runpytest_inprocess("--invariance-seed=6").assert_outcomes(passed=1)


def test_ini_settings_and_marker_defaults(pytester: pytest.Pytester) -> None:
    pytester.makeini("""
        [pytest]
        invariance_dtype =
            float32
            bfloat16
        invariance_seed = 5
        invariance_device = cpu
    """)
    pytester.makepyfile(f"""
        import pytest

        pytestmark = pytest.mark.invariance(backend="reference", perturbations=["order"])

        def test_module_marker(invariance_check):
            report = invariance_check()
            assert report.perturbations == ["order"]
            assert report.dtypes == ["float32", "bfloat16"] and report.seed == 5

        @pytest.mark.invariance(perturbations={CHEAP}, seed=1)
        def test_closest_marker_wins_and_call_wins_over_marker(invariance_check):
            assert invariance_check().perturbations == ["mixed", "order"]
            assert invariance_check().seed == 1
            assert invariance_check(seed=2, dtype="float32").seed == 2
    """)
    result = pytester.runpytest_inprocess("--invariance-seed=5")  # option and ini agree
    result.assert_outcomes(passed=2)


def test_marker_parametrises_over_dtypes_and_selects(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("""
        import pytest

        @pytest.mark.invariance(backend="reference", perturbations=["order"], device="cpu")
        def test_per_dtype(invariance_check, invariance_dtype):
            assert invariance_check().dtypes == [invariance_dtype]

        @pytest.mark.invariance(dtype=["float32"])
        def test_marker_dtype(invariance_dtype):
            assert invariance_dtype == "float32"

        def test_uses_fixture_unmarked(invariance_check):
            pass

        @pytest.mark.parametrize("invariance_dtype", ["float32"], ids=["own"])
        def test_own_parametrisation(invariance_dtype):
            assert invariance_dtype == "float32"

        def test_plain():
            pass
    """)
    result = pytester.runpytest_inprocess(
        "-v", "-m", "invariance", "--invariance-dtype=float16", "--invariance-dtype=bfloat16")
    result.assert_outcomes(passed=5, deselected=1)
    result.stdout.fnmatch_lines([
        "*::test_per_dtype[[]float16[]] PASSED*",
        "*::test_per_dtype[[]bfloat16[]] PASSED*",
        "*::test_marker_dtype[[]float32[]] PASSED*",
        "*::test_uses_fixture_unmarked PASSED*",
        "*::test_own_parametrisation[[]own[]] PASSED*",
    ])
    result = pytester.runpytest_inprocess("-m", "not invariance")  # default dtype: float32
    result.assert_outcomes(passed=1, deselected=4)


def test_marker_is_registered(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_inprocess("--markers")
    result.stdout.fnmatch_lines(["@pytest.mark.invariance(**defaults): *"])


@pytest.mark.parametrize(("option", "message"), [
    ("--invariance-budget=0", "invariance: budget: expected an int >= 1, got 0"),
    ("--invariance-seed=x", "invariance: seed: expected an int >= 0, got 'x'"),
    ("--invariance-dtype=float8", "invariance: dtype: expected one of float16, bfloat16, "
                                  "float32 (or an alias: *), got 'float8'"),
    ("--invariance-dtype=", "invariance: dtype: expected at least one value, got ''"),
])
def test_bad_options_are_usage_errors(pytester: pytest.Pytester, option: str,
                                      message: str) -> None:
    result = pytester.runpytest_inprocess(option)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{message}*"])


def test_settings_default_to_check_defaults(pytester: pytest.Pytester) -> None:
    config = pytester.parseconfig()
    assert Settings.from_config(config) == Settings()


def test_missing_backend_fails_readably(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("""
        def test_it(invariance_check):
            invariance_check(device="cpu")
    """)
    result = pytester.runpytest_inprocess()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["invariance_check: no backend given; *"])


def test_inaccurate_backend_fails(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("""
        import torch

        def zeros(batch):  # perfectly invariant and wrong
            return torch.zeros_like(batch.q), torch.zeros(batch.q.shape[:2])

        def test_it(invariance_check):
            invariance_check(zeros, perturbations=["order"], device="cpu")
    """)
    result = pytester.runpytest_inprocess()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "invariance: FAILED: *; INACCURATE; *",
        "  accuracy [[]float32[]] vs float64 reference: max |err| *",
        "FAILED *::test_it: * inaccurate at float32",
    ])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the skip on a machine without CUDA")
def test_cuda_requested_without_cuda_skips(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("""
        import pytest

        def test_option(invariance_check):
            invariance_check("reference")

        @pytest.mark.invariance(device="cuda")
        def test_marker(invariance_check):
            invariance_check("reference")
    """)
    result = pytester.runpytest_inprocess("-rs", "--invariance-device=cuda")
    result.assert_outcomes(skipped=2)
    result.stdout.fnmatch_lines([f"SKIPPED [[]2[]] *{CUDA_SKIP_REASON}"])
    assert "- invariance -" not in result.stdout.str()


def test_assert_bitwise_equal_reads_well_in_pytest(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("""
        import torch
        from invariance import assert_bitwise_equal

        def test_it():
            a = torch.zeros(2, 3, 4)
            b = a.clone()
            b[1, 2, 3] = 1e-7
            assert_bitwise_equal(a, b, msg="decode vs prefill")
    """)
    result = pytester.runpytest_inprocess()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        ">*assert_bitwise_equal(a, b, msg=\"decode vs prefill\")",
        "E * AssertionError: decode vs prefill",
        "E * tensors are not bitwise equal:",
        "E *   tensor: 1 of 24 elements differ (max |diff| 1e-07, max * ULP); first at dim0=1, "
        "dim1=2, dim2=3: 0.0 (0x00000000) vs 1.0000000116860974e-07 (0x33d6bf95)",
    ])
    assert "def assert_bitwise_equal" not in result.stdout.str()  # no library source


# ------------------------------------------------------------------------------------------
# The README's "Use it in your CI" example, verified as written
# ------------------------------------------------------------------------------------------

README_EXAMPLE = textwrap.dedent('''
    """Batch-invariance tests for my attention kernel (run: pytest --invariance-report=inv.json)."""

    import pytest
    import torch
    from hypothesis import given, settings

    from invariance import assert_bitwise_equal, run_schedule
    from invariance.backends.reference import reference_backend
    from invariance.strategies import schedule_pairs

    DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


    def my_attention(batch):
        """Your kernel: AttentionBatch -> AttentionResult or (out, lse)."""
        return reference_backend(batch)  # replace with your kernel


    # Runs once per --invariance-dtype (default float32); fails with the violations, the worst
    # difference, both schedules in words and a minimal reproducer.
    @pytest.mark.invariance(perturbations=["batch_size", "order", "paging"])
    def test_batch_invariant(invariance_check, invariance_dtype):
        invariance_check(my_attention)


    # Any two schedules of the same tokens agree, bit for bit; failures shrink to small batches.
    @settings(max_examples=10, deadline=None)
    @given(pair=schedule_pairs(max_requests=3, max_length=32))
    def test_any_two_schedules_agree(pair):
        pair.replay(my_attention, device=DEVICE)


    # Run-to-run determinism with a readable bitwise diff.
    @settings(max_examples=5, deadline=None)
    @given(pair=schedule_pairs(max_requests=2, max_length=16))
    def test_deterministic(pair):
        first = run_schedule(my_attention, pair.workload, pair.a, DEVICE)
        again = run_schedule(my_attention, pair.workload, pair.a, DEVICE)
        assert_bitwise_equal((first.out, first.lse), (again.out, again.lse))
''')


def test_readme_example(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_attention_invariance=README_EXAMPLE)
    path = pytester.path / "inv.json"
    result = pytester.runpytest_inprocess(
        "-v", "--invariance-dtype=float32", "--invariance-dtype=bfloat16",
        "--invariance-device=cpu", f"--invariance-report={path}")
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines([
        "*::test_batch_invariant[[]float32[]] PASSED*",
        "*::test_batch_invariant[[]bfloat16[]] PASSED*",
        "2 check(s): 2 passed, 0 failed (seed 0)",
    ])
    assert Report.from_json(path).passed


# ------------------------------------------------------------------------------------------
# Edges: xdist, interrupts, ini booleans, repeated dtypes, the report path
# ------------------------------------------------------------------------------------------

TWO_CHECKS = """
    import pytest

    @pytest.mark.parametrize("p", ["order", "uninitialized"])
    def test_it(invariance_check, p):
        invariance_check("reference", perturbations=[p], device="cpu")
"""


def test_xdist_workers_reports_are_merged_on_the_controller(pytester: pytest.Pytester) -> None:
    pytest.importorskip("xdist")
    pytester.makepyfile(TWO_CHECKS)
    path = pytester.path / "rx.json"
    result = pytester.runpytest_subprocess("-n", "2", f"--invariance-report={path}")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["2 check(s): 2 passed, 0 failed (seed 0)",
                                 f"report written to {path}"])
    report = Report.from_json(path)
    assert report.passed and report.complete
    assert sorted(c.check for c in report.results) == [
        "test_xdist_workers_reports_are_merged_on_the_controller.py::test_it[order]",
        "test_xdist_workers_reports_are_merged_on_the_controller.py::test_it[uninitialized]"]


STOPPED = """
    import os, signal
    from invariance.backends.reference import reference_backend

    calls = {"n": 0}

    def stops_in_its_second_cell(batch):
        calls["n"] += 1
        if calls["n"] > 4:  # "uninitialized" takes 4 calls: its cell is finished
            STOP()
        return reference_backend(batch)

    def test_stopped(invariance_check):
        invariance_check(stops_in_its_second_cell, device="cpu",
                         perturbations=["uninitialized", "order"])

    def test_never_reached(invariance_check):
        invariance_check("reference", perturbations=["order"], device="cpu")
"""


@pytest.mark.parametrize("stop", ["raise KeyboardInterrupt", "os.kill(os.getpid(), "
                                                             "signal.SIGTERM)"],
                         ids=["KeyboardInterrupt", "SIGTERM"])
def test_an_interrupt_stops_the_session_with_the_partial_report(
        pytester: pytest.Pytester, stop: str) -> None:
    pytester.makepyfile(STOPPED.replace("STOP()", stop))
    path = pytester.path / "r.json"
    path.write_text("the earlier complete report\n")
    if stop.startswith("raise"):
        result = pytester.runpytest_inprocess(f"--invariance-report={path}",
                                              no_reraise_ctrlc=True)
    else:
        result = pytester.runpytest_subprocess(f"--invariance-report={path}")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    assert "test_never_reached" not in result.stdout.str()  # the session stopped
    assert path.read_text() == "the earlier complete report\n"
    partial = Report.from_json(pytester.path / "r.json.partial")
    assert [c.perturbation for c in partial.results] == ["uninitialized"]
    assert partial.incomplete is not None and "after 1 of 2 cells" in partial.incomplete
    result.stdout.fnmatch_lines(["INCOMPLETE *::test_stopped: *stopped early: interrupted*"])


@pytest.mark.parametrize(("ini", "expected"), [
    ("invariance_isolate = ture", "invariance: ini invariance_isolate: expected true or false"),
    ("invariance_shrink = 2", "invariance: ini invariance_shrink: expected true or false"),
])
def test_ini_booleans_are_validated(pytester: pytest.Pytester, ini: str, expected: str) -> None:
    pytester.makeini(f"[pytest]\n{ini}\n")
    result = pytester.runpytest_inprocess()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{expected}*"])


@pytest.mark.parametrize(("ini", "check"), [
    ("invariance_shrink = false", {"shrink": False}),
    ("invariance_shrink = TRUE", {}),
    ("invariance_isolate = yes", {"isolate": True}),
    ("invariance_isolate = off", {}),
])
def test_ini_booleans_hold_the_settings_value(pytester: pytest.Pytester, ini: str,
                                              check: dict[str, Any]) -> None:
    pytester.makeini(f"[pytest]\n{ini}\n")
    assert Settings.from_config(pytester.parseconfig()).check == check


def test_repeated_dtype_aliases_run_once(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("""
        def test_per_dtype(invariance_dtype):
            pass
    """)
    result = pytester.runpytest_inprocess("-v", "--invariance-dtype=float32",
                                          "--invariance-dtype=fp32,f32", "--invariance-dtype=bf16")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*test_per_dtype[[]float32[]] PASSED*",
                                 "*test_per_dtype[[]bfloat16[]] PASSED*"])


def test_the_report_path_is_checked_when_the_session_starts(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_it(): raise AssertionError('never run')")
    missing = pytester.path / "missing" / "r.json"
    result = pytester.runpytest_inprocess(f"--invariance-report={missing}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "never run" not in result.stdout.str()
    text = result.stderr.str()
    assert text.count(f"directory {missing.parent} does not exist") == 1


def test_sigterm_between_checks_keeps_the_finished_ones(pytester: pytest.Pytester) -> None:
    """With a report to write, SIGTERM outside any check (a CI timeout) stops the session as
    Ctrl-C does: the finished check reaches PATH.partial instead of dying with the process."""
    pytester.makepyfile("""
        import os, signal, time

        def test_one(invariance_check):
            invariance_check("reference", perturbations=["uninitialized"], device="cpu")

        def test_terminated():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(30)
    """)
    path = pytester.path / "r.json"
    result = pytester.runpytest_subprocess(f"--invariance-report={path}")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    assert not path.exists()
    partial = Report.from_json(pytester.path / "r.json.partial")
    assert [c.perturbation for c in partial.results] == ["uninitialized"]
    assert partial.incomplete == "the session was interrupted"
