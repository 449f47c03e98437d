"""Features as check settings in the faces: ``invariance check --feature ... --kv-dtype ...``
and the pytest plugin's options, ini keys and marker (all declared once in
``_invariance_options``)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

# pytester's in-process runs forget the modules a run imported; native extensions (torch, triton)
# abort when imported twice in one process, so everything the runs use is imported here first.
import invariance.backends.reference
import invariance.runner  # noqa: F401
from _invariance_options import add_options, collect
from invariance.cli import main
from invariance.report import Environment, Report

Environment.capture("cpu")


@pytest.fixture(autouse=True)
def _wide_plain_console(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.setenv("NO_COLOR", "1")


# --------------------------------------------------------------------------------------------
# The CLI
# --------------------------------------------------------------------------------------------

def test_cli_check_with_every_feature(tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "r.json"
    rc = main(["check", "--backend", "reference", "--device", "cpu", "--perturb", "mixed",
               "--feature", "window=16", "--feature", "sinks", "--feature", "softcap=20",
               "--feature", "kv_scale=head", "--kv-dtype", "fp8_e4m3", "--json", str(path)])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert ("PASSED: backend reference on cpu (bfloat16; window 16, sinks, softcap 20, "
            "fp8_e4m3 KV (per-head scales))") in out
    assert "features" in out and "window 16, sinks" in out  # the settings table
    data = json.loads(path.read_text())
    assert data["features"] == {"window": 16, "sinks": True, "softcap": 20.0,
                                "kv_dtype": "fp8_e4m3", "kv_scale": "head"}
    assert data["dtypes"] == ["bfloat16"]
    assert main(["report", str(path)]) == 0
    assert "window 16, sinks, softcap 20" in capsys.readouterr().out


def test_cli_features_combine_in_one_flag_too(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    assert main(["check", "--backend", "reference", "--device", "cpu", "--perturb", "repeat",
                 "--feature", "window=4,sinks", "--json", str(path)]) == 0
    assert Report.from_json(path).features == {"window": 4, "sinks": True}


@pytest.mark.parametrize(("args", "message"), [
    (["--feature", "window=-3"], "feature window: expected window=N (an int >= 0), got '-3'"),
    (["--feature", "window=big"], "feature window: expected window=N (an int >= 0), got 'big'"),
    (["--feature", "bogus"], "feature: expected one of window=N (an int >= 0), sinks"),
    (["--feature", "softcap"], "feature softcap: expected softcap=X (a finite float > 0), got "
                               "'softcap'"),
    (["--feature", "softcap=-1"], "feature softcap: expected softcap=X (a finite float > 0)"),
    (["--feature", "window=1", "--feature", "window=2"], "feature window: given twice (1 and 2)"),
    (["--kv-dtype", "fp16"], "kv_dtype: expected one of fp8_e4m3 (or an alias: fp8, e4m3"),
    (["--feature", "kv_scale=head"], "features.kv_scale: expected 'tensor' (the default) "
                                     "without an FP8 KV cache"),
    (["--kv-dtype", "fp8", "--dtype", "float32"], "dtype: expected float16 or bfloat16 with "
                                                  "kv_dtype fp8_e4m3"),
    (["--backend", "sdpa", "--feature", "window=8"], "features: backend sdpa takes no features, "
                                                     "not window"),
    (["--backend", "sdpa-math", "--feature", "sinks", "--feature", "softcap=3"],
     "features: backend sdpa-math takes sinks, window, not softcap"),
])
def test_cli_bad_features_are_one_line_exit_2(args: list[str], message: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["check", "--device", "cpu", "--perturb", "repeat", *args]
    if "--backend" not in args:
        argv += ["--backend", "reference"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("invariance: error: "), err
    assert message in err[0], err[0]


def test_cli_help_lists_the_feature_flags(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--help"]) == 0
    out = capsys.readouterr().out
    assert "--feature KEY[=VALUE]" in out and "--kv-dtype DTYPE" in out


def test_options_declare_features_for_argparse() -> None:
    parser = argparse.ArgumentParser()
    add_options(parser.add_argument)
    ns = parser.parse_args(["--feature", "window=9", "--feature", "sinks=true",
                            "--kv-dtype", "FP8"])
    assert collect(vars(ns)) == {"features": {"window": 9, "sinks": True},
                                 "kv_dtype": "fp8_e4m3"}


# --------------------------------------------------------------------------------------------
# The pytest plugin
# --------------------------------------------------------------------------------------------

def test_plugin_options_set_features(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("""
        def test_it(invariance_check):
            report = invariance_check("reference", perturbations=["mixed"], device="cpu")
            assert report.features == {"window": 16, "sinks": True, "kv_dtype": "fp8_e4m3",
                                       "kv_scale": "tensor"}
            assert report.dtypes == ["bfloat16"]
    """)
    result = pytester.runpytest_inprocess("--invariance-feature=window=16",
                                          "--invariance-feature=sinks",
                                          "--invariance-kv-dtype=fp8")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["invariance: features *window*16*sinks*, kv_dtype fp8_e4m3"])


def test_plugin_ini_keys_and_marker_set_features(pytester: pytest.Pytester) -> None:
    pytester.makeini("""
        [pytest]
        invariance_features =
            window=12
            softcap=30
    """)
    pytester.makepyfile("""
        import pytest

        def test_ini(invariance_check):
            report = invariance_check("reference", perturbations=["repeat"], device="cpu")
            assert report.features == {"window": 12, "softcap": 30.0}

        @pytest.mark.invariance(features={"sinks": True})
        def test_marker(invariance_check):
            report = invariance_check("reference", perturbations=["repeat"], device="cpu")
            assert report.features == {"sinks": True}

        def test_call(invariance_check):
            report = invariance_check("reference", perturbations=["repeat"], device="cpu",
                                      features=["window=3"], kv_dtype="fp8")
            assert report.features == {"window": 3, "kv_dtype": "fp8_e4m3", "kv_scale": "tensor"}
    """)
    pytester.runpytest_inprocess().assert_outcomes(passed=3)


def test_plugin_bad_feature_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("""
        def test_it(invariance_check):
            invariance_check("reference", perturbations=["repeat"], device="cpu")
    """)
    result = pytester.runpytest_inprocess("--invariance-feature=window=x")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*invariance: feature window: expected window=N (an int >= 0), "
                                 "got 'x'"])


def test_plugin_check_refuses_a_backend_lacking_a_feature(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("""
        def test_it(invariance_check):
            invariance_check("sdpa", perturbations=["repeat"], device="cpu",
                             features={"window": 8})
    """)
    result = pytester.runpytest_inprocess()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*invariance_check: features: backend sdpa takes no features, "
                                 "not window*"])
