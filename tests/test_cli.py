"""The ``invariance`` command: end to end through ``python -m invariance.cli`` and in process
through ``main``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch
from rich.console import Console

import invariance
from invariance.backends import BUILTIN
from invariance.cli import _progress, main

# A fast failing perturbation of the batch-variant control, and one it passes.
PERTURB = "prefill_vs_decode,repeat"
FAST = ["--device", "cpu", "--budget", "1", "--dtype", "float32"]


@pytest.fixture(autouse=True)
def _wide_plain_console(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.setenv("NO_COLOR", "1")


def run_cli(*args: str, cwd: Path, env: dict[str, str] | None = None
            ) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1", **(env or {})}
    return subprocess.run([sys.executable, "-m", "invariance.cli", *args], cwd=cwd,
                          env=full_env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def outputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Reports of the reference (passes) and the batch-variant control (fails), written by the
    CLI in a subprocess (the control, with every output format) and in process (the
    reference)."""
    d = tmp_path_factory.mktemp("reports")
    paths = {k: d / f"variant.{k}" for k in ("json", "md", "html", "xml")}
    proc = run_cli("check", "--backend", "torch-batch-variant", *FAST, "--perturb", PERTURB,
                   "--json", str(paths["json"]), "--markdown", str(paths["md"]),
                   "--html", str(paths["html"]), "--junit", str(paths["xml"]), cwd=d)
    (d / "variant.stdout").write_text(proc.stdout)
    (d / "variant.rc").write_text(str(proc.returncode))
    paths["stdout"] = d / "variant.stdout"
    paths["rc"] = d / "variant.rc"
    paths["reference"] = d / "reference.json"
    assert main(["check", "--backend", "reference", *FAST, "--perturb", PERTURB,
                 "--json", str(paths["reference"])]) == 0
    return paths


def test_check_reference_passes_and_prints_a_table(tmp_path: Path) -> None:
    proc = run_cli("check", "--backend", "reference", *FAST, "--perturb", "repeat",
                   cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "PASSED: backend reference on cpu (float32)" in proc.stdout
    assert "perturbation × dtype" in proc.stdout
    assert "│ repeat" in proc.stdout and "PASS · 3 cases" in proc.stdout
    assert "accuracy against the float64 reference" in proc.stdout
    assert "coverage: 48 rows compared in 1 cell" in proc.stdout
    # Not a terminal: no bar, a line per finished cell on stderr (stdout holds the report).
    assert proc.stderr.startswith("[1/1] repeat · float32: PASS · 3 cases · 0 ULP (")
    assert len(proc.stderr.splitlines()) == 1
    quiet = run_cli("check", "--backend", "reference", *FAST, "--perturb", "repeat",
                    "--no-progress", cwd=tmp_path)
    assert quiet.returncode == 0 and quiet.stderr == ""


def test_batch_variant_fails_in_every_format(outputs: dict[str, Path]) -> None:
    assert outputs["rc"].read_text() == "1"
    stdout = outputs["stdout"].read_text()
    assert stdout.startswith("FAILED: backend torch-batch-variant on cpu")
    assert "prefill_vs_decode [float32]:" in stdout and "not bitwise identical" in stdout
    assert "invariance.replay('torch-batch-variant'" in stdout

    md = outputs["md"].read_text()
    assert "| `prefill_vs_decode` | ❌ FAIL" in md and "| `repeat` | ✅ PASS" in md
    assert "### ❌ prefill_vs_decode [float32]" in md

    html = outputs["html"].read_text()
    assert "<svg" in html and 'class="heatmap"' in html
    assert "prefill_vs_decode [float32]: " in html

    suite = ET.parse(outputs["xml"]).getroot().find("testsuite")
    assert suite is not None
    cases = {c.get("name"): c for c in suite.iter("testcase")}
    assert cases["prefill_vs_decode[float32]"].find("failure") is not None
    assert cases["repeat[float32]"].find("failure") is None
    assert "accuracy[float32]" in cases

    data = json.loads(outputs["json"].read_text())
    assert data["command"].startswith("invariance check --backend torch-batch-variant")
    report = invariance.Report.from_json(outputs["json"])
    assert report.cell("prefill_vs_decode", "float32").status == "failed"


def test_user_module_backend(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                             capsys: pytest.CaptureFixture[str]) -> None:
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "mymod.py").write_text(textwrap.dedent("""
        from invariance.backends.reference import reference_backend

        def attn(batch):
            # a user's kernel: here, the float64 reference under another name
            return reference_backend(batch)
        """))
    monkeypatch.syspath_prepend(str(tmp_path))
    rc = main(["check", "--backend", "mypkg.mymod:attn", *FAST, "--perturb", "repeat"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "PASSED: backend mypkg.mymod:attn on cpu" in out


def test_report_rerenders_saved_json(outputs: dict[str, Path], tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    md, html, xml = tmp_path / "r.md", tmp_path / "r.html", tmp_path / "r.xml"
    rc = main(["report", str(outputs["json"]), "--markdown", str(md), "--html", str(html),
               "--junit", str(xml)])
    out = capsys.readouterr().out
    assert rc == 1
    assert "FAILED: backend torch-batch-variant" in out and "prefill_vs_decode" in out
    assert "invariance check --backend torch-batch-variant" in out  # the stored command line
    assert md.read_text() == outputs["md"].read_text()
    assert "<svg" in html.read_text()
    ET.parse(xml)
    assert main(["report", str(outputs["reference"])]) == 0


def test_compare_detects_a_changed_cell(outputs: dict[str, Path],
                                        capsys: pytest.CaptureFixture[str]) -> None:
    ref, variant = str(outputs["reference"]), str(outputs["json"])
    assert main(["compare", ref, variant]) == 1
    out = capsys.readouterr().out
    assert "prefill_vs_decode[float32]" in out and "worse" in out
    assert "repeat[float32]" not in out
    assert main(["compare", variant, ref]) == 0
    assert "better" in capsys.readouterr().out
    assert main(["compare", ref, ref]) == 0
    assert "no cell changed verdict" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["check", "--backend", "nope"], "backend: unknown name 'nope'"),
        (["check", "--backend", "no_such_module_xyz:attn"], "cannot import module"),
        (["check", "--backend", "reference", "--perturb", "batch_size,wobble"],
         "perturbation: unknown name 'wobble'"),
        (["check", "--backend", "reference", "--dtype", "float8"],
         "dtype: expected one of float16, bfloat16, float32"),
        (["check", "--backend", "reference", "--heads", "4:x:64"], "heads: expected"),
        (["report", "/no/such/report.json"], "cannot read"),
        (["compare", "/no/such/a.json", "/no/such/b.json"], "cannot read"),
    ],
)
def test_wrong_input_exits_2_with_one_line(args: list[str], message: str,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    if args[0] == "check":
        args = [*args, "--device", "cpu"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("invariance: error: ") and message in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_not_a_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": "something else"}')
    assert main(["report", str(bad)]) == 2
    assert "schema: expected 'invariance.report'" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--backend", "reference", "--device", "cuda"]) == 2
    assert "invariance: error: device: CUDA was requested" in capsys.readouterr().err


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--budget", "many"]) == 2
    assert "budget: expected an int >= 1, got 'many'" in capsys.readouterr().err
    assert main(["check", "--device", "tpu"]) == 2
    assert main([]) == 2
    # A single-valued option given twice: argparse alone would keep the last one silently.
    assert main(["check", "--backend", "reference", "--backend", "kernels-heuristic"]) == 2
    assert ("argument --backend: expected one value, got 'reference' and 'kernels-heuristic'; "
            "'invariance bench' times several backends" in capsys.readouterr().err)
    assert main(["check", "--seed", "1", "--seed", "1"]) == 2
    err = capsys.readouterr().err
    assert "argument --seed: expected one value, got '1' and '1'" in err and "bench" not in err
    assert main(["replay", "case.json", "--device", "cpu", "--device", "cuda"]) == 2
    assert "argument --device: expected one value, got 'cpu' and 'cuda'" in capsys.readouterr().err
    # Every subcommand, options with defaults and typed values included; repeatable ones stay so.
    assert main(["bench", "--iters", "3", "--iters", "4"]) == 2
    assert "argument --iters: expected one value, got 3 and 4" in capsys.readouterr().err
    assert main(["replay", "case.json", "--index", "0", "--index", "1"]) == 2
    assert "argument --index: expected one value, got 0 and 1" in capsys.readouterr().err
    assert main(["--help"]) == 0


def test_debug_shows_the_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--backend", "nope", "--device", "cpu", "--debug"]) == 2
    assert "Traceback" in capsys.readouterr().err


@pytest.mark.slow
def test_cpu_kernels_run_without_triton_interpret_set() -> None:
    # A fresh process: triton fixes its interpreter mode when first imported.
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, "-m", "invariance.cli", "check", "--backend", "kernels", "--device",
         "cpu", "--perturb", "repeat"], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert done.stdout.startswith("PASSED")


def test_list_shows_backends_and_perturbations(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for name in BUILTIN:
        assert name in out
    for name, p in invariance.PERTURBATIONS.items():
        assert name in out
        assert p.description.split(",")[0][:30] in out
    assert "importable" in out and "yes" in out


def test_env_shows_versions(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["env"]) == 0
    out = capsys.readouterr().out
    assert torch.__version__ in out
    assert sys.version.split()[0] in out and "platform" in out


def test_progress_only_on_a_terminal() -> None:
    import io

    _, update = _progress(Console(file=io.StringIO()), True)
    assert update is None
    bar, update = _progress(Console(file=io.StringIO(), force_terminal=True), True)
    assert update is not None
    with bar:
        update(1, 4, "batch_size [float32]")
    _, update = _progress(Console(file=io.StringIO(), force_terminal=True), False)
    assert update is None


def test_progress_moves_per_case_with_the_running_case_named() -> None:
    calls: list[tuple[int, int, str]] = []
    invariance.check("reference", device="cpu", perturbations="repeat,spec_verify",
                     progress=lambda done, total, label: calls.append((done, total, label)))
    # Each case is announced when it starts (cases done so far, its cell and number) and
    # counted when it ends: the display moves inside a cell, not only between cells.
    assert calls[:3] == [(0, 5, "repeat · float32 · case 1/3"), (1, 5, "repeat · float32"),
                         (1, 5, "repeat · float32 · case 2/3")]
    assert (3, 5, "spec_verify · float32 · case 1/2") in calls and calls[-1][:2] == (5, 5)
