"""Nothing lost at the edges: the final outputs are complete before anything is printed; pipes,
special paths, a narrow console encoding, a full disk and SIGTERM end a run with its verdict and
its report; replay tells a difference from an error; isolation sends the check by value.

Every check here is the reference backend on the CPU with one or two small perturbations; pipe,
encoding and signal cases run the CLI in a subprocess (they concern the process itself).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import invariance
from invariance import outputs
from invariance.cli import main
from invariance.perturb import PERTURBATIONS, SCALES
from invariance.replay import ScheduleMismatch, case_from_dict, case_to_dict
from invariance.workload import HeadConfig

# The quickest passing check: 2 cells of the reference backend.
CHECK = ["check", "--backend", "reference", "--device", "cpu", "--perturb",
         "uninitialized,padding", "--dtype", "float32"]
POSIX = pytest.mark.skipif(os.name != "posix", reason="POSIX pipes and signals")


def _default_sigint() -> None:
    """In the child before exec: SIGINT at its default, as in a command typed at a terminal. A
    test run as a background job (``cmd &`` in a script) inherits SIGINT ignored, and the CLI
    leaves an ignored signal ignored, by design (nohup)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def cli(*args: str, cwd: Path, env: dict[str, str] | None = None,
        stdout: Any = subprocess.PIPE) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "invariance.cli", *args], cwd=cwd,
                            env={**os.environ, "COLUMNS": "120", "NO_COLOR": "1", **(env or {})},
                            stdout=stdout, stderr=subprocess.PIPE,
                            preexec_fn=_default_sigint if os.name == "posix" else None)


def _complete(path: Path) -> invariance.Report:
    report = invariance.Report.from_json(path)
    assert report.complete, report.incomplete
    return report


# --------------------------------------------------------------------------------------------
# The console after the outputs; a reader that goes away; a narrow encoding
# --------------------------------------------------------------------------------------------

@POSIX
def test_a_reader_that_goes_away_ends_quietly_with_the_verdict(tmp_path: Path) -> None:
    """``check --json r.json | head -c 0``: the JSON is complete, the exit status the
    verdict's, and nothing complains about the pipe."""
    proc = cli(*CHECK, "--json", "r.json", cwd=tmp_path)
    assert proc.stdout is not None
    proc.stdout.close()  # the reader is gone before the first line
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert b"Broken pipe" not in err and b"Traceback" not in err
    assert _complete(tmp_path / "r.json").passed
    assert not (tmp_path / "r.json.partial").exists()


@POSIX
def test_compare_keeps_its_exit_status_through_a_closed_pipe(tmp_path: Path) -> None:
    good = invariance.check("reference", device="cpu", perturbations=["uninitialized"])
    bad = invariance.Report.from_dict(good.to_dict())
    bad.results[0].status = "error"
    good.to_json(tmp_path / "a.json")
    bad.to_json(tmp_path / "b.json")
    assert main(["compare", str(tmp_path / "a.json"), str(tmp_path / "a.json")]) == 0
    proc = cli("compare", "a.json", "b.json", cwd=tmp_path)
    assert proc.stdout is not None
    proc.stdout.close()  # `| head -0`: 1 (regressed) must not read as anything else
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err
    assert b"Traceback" not in err


def test_a_console_that_cannot_encode_still_gets_the_verdict(tmp_path: Path) -> None:
    proc = cli(*CHECK, "--json", "a.json", cwd=tmp_path, env={"PYTHONIOENCODING": "ascii"})
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert out.decode("ascii").startswith("PASSED: backend reference")
    assert _complete(tmp_path / "a.json").passed


@POSIX
def test_json_to_standard_output_and_the_console_to_stderr(tmp_path: Path) -> None:
    """``--json -`` and ``--json /dev/stdout > out.txt``: standard output holds the JSON alone,
    the console report goes to stderr; nothing replaces the file the shell opened."""
    proc = cli(*CHECK, "--json", "-", "--markdown", "r.md", cwd=tmp_path)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0
    assert invariance.Report.from_json(text=out).passed
    assert b"PASSED: backend reference" in err and (tmp_path / "r.md").read_text()
    with open(tmp_path / "out.txt", "wb") as f:
        proc = cli(*CHECK, "--json", "/dev/stdout", cwd=tmp_path, stdout=f)
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert _complete(tmp_path / "out.txt").passed
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


# --------------------------------------------------------------------------------------------
# A full disk, a killed re-run: nothing complete is replaced by less
# --------------------------------------------------------------------------------------------

def _no_space(monkeypatch: pytest.MonkeyPatch, when: Any) -> list[str]:
    """Make ``write_atomic`` fail with ENOSPC for the paths ``when(path)`` selects; returns the
    paths it refused."""
    refused: list[str] = []
    real = outputs.write_atomic

    def write(path: Path, text: str) -> None:
        if when(Path(path)):
            refused.append(str(path))
            raise outputs.OutputError(f"cannot write {path}: No space left on device")
        real(path, text)

    monkeypatch.setattr(outputs, "write_atomic", write)
    return refused


def test_a_full_disk_keeps_the_run_the_verdict_and_the_old_report(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
        ) -> None:
    old = tmp_path / "r.json"
    old.write_text("the earlier report\n")
    refused = _no_space(monkeypatch, lambda p: True)
    code = main([*CHECK, "--json", str(old), "--markdown", str(tmp_path / "r.md")])
    out, err = capsys.readouterr()
    assert code == 2  # an output not written is an error, after the verdict
    assert out.startswith("PASSED: backend reference")  # the console still gets the verdict
    assert err.count("cannot save the run's progress") == 1  # said once, the run went on
    assert len([p for p in refused if p.endswith(".partial")]) == 2  # tried after each cell
    assert "--json" in err and "--markdown" in err and "not written" in err
    assert old.read_text() == "the earlier report\n"


def test_progress_that_cannot_be_saved_does_not_stop_the_final_report(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
        ) -> None:
    _no_space(monkeypatch, lambda p: p.name.endswith(".partial"))
    assert main([*CHECK, "--json", str(tmp_path / "r.json")]) == 0
    assert "cannot save the run's progress" in capsys.readouterr().err
    assert _complete(tmp_path / "r.json").passed


SLOW = textwrap.dedent("""
    import time
    from invariance.backends.reference import reference_backend

    def slow(batch):
        time.sleep(0.2)
        return reference_backend(batch)
""")


@POSIX
@pytest.mark.parametrize(("signum", "status"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)],
                         ids=["SIGTERM", "SIGINT"])
def test_a_signal_keeps_the_partial_report_beside_the_complete_one(
        tmp_path: Path, signum: int, status: int) -> None:
    """Killed after its first cell, a re-run leaves the earlier complete report as it was and
    its own finished cell in ``PATH.partial``, and exits 128 + the signal."""
    (tmp_path / "slow.py").write_text(SLOW)
    report = tmp_path / "r.json"
    report.write_text("the earlier complete report\n")
    proc = cli("check", "--backend", "slow.py:slow", "--device", "cpu", "--perturb",
               "uninitialized,mixed", "--json", "r.json", cwd=tmp_path)
    partial = tmp_path / "r.json.partial"
    deadline = time.monotonic() + 120
    while not partial.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == status, err
    assert report.read_text() == "the earlier complete report\n"
    saved = invariance.Report.from_json(partial)
    assert [c.perturbation for c in saved.results] == ["uninitialized"]
    name = signal.Signals(signum).name if signum != signal.SIGINT else "KeyboardInterrupt"
    assert saved.incomplete == f"interrupted ({name}) after 1 of 2 cells"
    assert b"INCOMPLETE: backend slow.py:slow" in out and b"r.json.partial" in err


# --------------------------------------------------------------------------------------------
# Checked before the run
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("extra", "message"), [
    (["--json", "-", "--markdown", "-"], "are the same file"),
    (["--cases", "{d}/file.txt"], "--cases {d}/file.txt: expected a directory"),
    (["--json", "{d}/missing/r.json"], "directory {d}/missing does not exist"),
], ids=["stdout-twice", "cases-file", "missing-dir"])
def test_outputs_are_checked_before_the_run(
        extra: list[str], message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    import invariance.runner

    (tmp_path / "file.txt").write_text("")
    monkeypatch.setattr(invariance.runner, "run_spec", lambda *a, **k: pytest.fail("ran"))
    assert main([*CHECK, *(e.format(d=tmp_path) for e in extra)]) == 2
    assert message.format(d=tmp_path) in capsys.readouterr().err


def test_unwritable_cases_directory_is_found_before_the_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
        ) -> None:
    import invariance.runner

    def read_only(target: Path) -> tuple[int, Path]:
        raise PermissionError(30, "Read-only file system")

    monkeypatch.setattr(outputs, "_open_temp", read_only)
    monkeypatch.setattr(invariance.runner, "run_spec", lambda *a, **k: pytest.fail("ran"))
    assert main([*CHECK, "--cases", str(tmp_path)]) == 2
    assert "--cases" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------
# compare: settings; report: every check's cell
# --------------------------------------------------------------------------------------------

def test_compare_refuses_reports_of_different_cases_unless_asked(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = invariance.check("reference", device="cpu", perturbations=["uninitialized"])
    b = invariance.Report.from_dict(a.to_dict())
    b.budget, b.backend = 4, "other"
    a.to_json(tmp_path / "a.json")
    b.to_json(tmp_path / "b.json")
    assert main(["compare", str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == 2
    err = capsys.readouterr().err
    assert "A and B ran different cases (budget: 1 -> 4)" in err
    assert main(["compare", str(tmp_path / "a.json"), str(tmp_path / "b.json"),
                 "--allow-different-settings"]) == 0
    out = capsys.readouterr().out
    assert "differs: backend: reference -> other" in out
    assert "differs: budget: 1 -> 4 (different cases: not comparable)" in out


# --------------------------------------------------------------------------------------------
# replay: a difference, an error, nothing compared
# --------------------------------------------------------------------------------------------

def _case(perturbation: str = "order", **changes: Any) -> dict[str, Any]:
    case = next(iter(PERTURBATIONS[perturbation].cases(
        scale=SCALES["small"], heads=HeadConfig(4, 2, 64), dtype="float32", seed=0, budget=1)))
    data = case_to_dict(case, backend="reference", device="cpu")
    data.update(changes)
    return data


RAISING = textwrap.dedent("""
    from invariance.backends.reference import reference_backend

    def asserts(batch):
        assert batch.k_cache.shape[1] == 1024, "my kernel needs pages of 1024 tokens"

    def refuses(batch):
        raise ValueError("my kernel takes no float32")
""")


@pytest.mark.parametrize(("change", "backend", "code", "message"), [
    ({}, None, 0, "identical:"),
    ({}, "torch-batch-variant", None, ""),
    ({"device": "cuda"}, None, 2, "--device: the case ran on cuda"),
    ({}, "raising.py:asserts", 2, "raised AssertionError: my kernel needs pages of 1024"),
    ({}, "raising.py:refuses", 2, "raised ValueError: my kernel takes no float32"),
    ({"a": {"steps": [], "layout": {"page_size": 16, "placement": "contiguous"}}}, None, 2,
     "expected schedules a and b to share at least one (request, token)"),
], ids=["identical", "differs", "cuda-on-cpu", "backend-assert", "backend-valueerror",
        "nothing-shared"])
def test_replay_tells_a_difference_from_an_error(
        change: dict[str, Any], backend: str | None, code: int | None, message: str,
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    if change.get("device") == "cuda" and torch.cuda.is_available():
        pytest.skip("needs a host without CUDA")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "raising.py").write_text(RAISING)
    path = tmp_path / "case.json"
    data = _case("mixed" if backend == "torch-batch-variant" else "order", **change)
    path.write_text(json.dumps(data))
    got = main(["replay", str(path), *(["--backend", backend] if backend else [])])
    out, err = capsys.readouterr()
    if code is None:  # the batch-variant control on a mixed case: a real difference
        assert got == 1 and "STILL DIFFERS: schedules disagree" in out
        return
    assert got == code, err
    assert message in (out if code == 0 else err)
    assert "STILL DIFFERS" not in out


@pytest.mark.parametrize(("path", "value", "field"), [
    (["workload", "requests", 0, 1], 10**12, "workload.requests[0].length: expected an int in "
                                             "0..1048576, got 1000000000000"),
    (["workload", "requests", 0, 1], 3.5, "workload.requests[0].length"),
    (["workload", "requests", 0, 2], "no", "workload.requests[0].padding: expected true or"),
    (["workload", "heads"], "4096:4096:64", "workload.heads: expected at most 1024 heads"),
    (["workload", "seed"], -1, "workload.seed: expected an int in 0.."),
    (["a", "layout", "page_size"], 0, "a.layout.page_size: expected an int in 1..65536"),
    (["a", "layout", "extra_pages"], 10**9, "a.layout.extra_pages"),
    (["b", "steps", 0, 0, 0], 99, "b.steps[0][0][0]: expected the id of a request of this"),
    (["b", "steps", 0, 0, 2], 10**6, "b.steps[0][0][2]: expected an int in 0.."),
    (["version"], 2, "version: expected 1"),
], ids=["huge-length", "float-length", "padding", "heads", "seed", "page-size", "extra-pages",
        "unknown-request", "stop-past-length", "version"])
def test_case_file_fields_are_range_checked(path: list[Any], value: Any, field: str) -> None:
    data = _case()
    case_from_dict(json.loads(json.dumps(data)))  # negative control: the case as written reads
    target = data
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(ValueError) as info:
        case_from_dict(data, source="c.json")
    assert str(info.value).startswith(f"c.json: {field}")


_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-3, 2**40), st.floats(),
                    st.text(max_size=5), st.lists(st.integers(-2, 40), max_size=4))


def _paths(d: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    if isinstance(d, dict):
        return [p for k, v in d.items() for p in [(*prefix, k), *_paths(v, (*prefix, k))]]
    if isinstance(d, list):
        return [p for i, v in enumerate(d) for p in [(*prefix, i), *_paths(v, (*prefix, i))]]
    return []


_TEMPLATE = _case()
_FIELDS = _paths(_TEMPLATE)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(where=st.sampled_from(_FIELDS), value=_VALUES)
def test_fuzz_case_files_load_or_name_the_field(where: tuple[Any, ...], value: Any) -> None:
    """Any one field replaced by any value: the case loads, or a ValueError names the source
    (never an allocator error, a TypeError or an IndexError later)."""
    data = json.loads(json.dumps(_TEMPLATE))
    target = data
    for key in where[:-1]:
        target = target[key]
    target[where[-1]] = value
    try:
        case = case_from_dict(data, source="c.json")
    except ValueError as exc:
        assert str(exc).startswith("c.json: ")
        return
    lengths = {r.id: r.length for r in case.workload.requests}
    for s in (case.a, case.b):
        for step in s.steps:
            for c in step.chunks:
                assert c.request_id in lengths and c.stop <= lengths[c.request_id]


def test_replay_api_raises_a_mismatch_only_for_a_difference() -> None:
    case = case_from_dict(_case("mixed"))
    with pytest.raises(ScheduleMismatch):
        invariance.replay("torch-batch-variant", case.workload, case.a, case.b)
    invariance.replay("reference", case.workload, case.a, case.b)  # negative control

    def own_assert(batch: invariance.AttentionBatch) -> object:
        raise AssertionError("the backend's own check")

    with pytest.raises(AssertionError) as info:
        invariance.replay(own_assert, case.workload, case.a, case.b)
    assert not isinstance(info.value, ScheduleMismatch)


# --------------------------------------------------------------------------------------------
# Backends that fail to load; isolation by value
# --------------------------------------------------------------------------------------------

def test_a_backend_file_that_raises_on_import_is_named(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    bad = tmp_path / "broken_backend.py"
    bad.write_text("raise RuntimeError('no GPU driver found')\ndef fn(batch): pass\n")
    assert main([*CHECK[:2], f"{bad}:fn", *CHECK[3:]]) == 2
    err = capsys.readouterr().err
    assert f"importing file {bad} raised RuntimeError: no GPU driver found" in err
    with pytest.raises(ValueError, match=r"importing file .* raised SystemExit"):
        bad.write_text("import sys\nsys.exit(4)\n")
        invariance.check(f"{bad}:fn", device="cpu")


def test_isolate_refuses_what_cannot_cross_a_process_boundary() -> None:
    from invariance.backends.reference import reference_backend

    def closure(batch: invariance.AttentionBatch) -> object:
        return reference_backend(batch)

    for fn in (closure, lambda batch: reference_backend(batch)):
        with pytest.raises(ValueError, match=r"isolate: the backend .* cannot be sent to a "
                                             r"child process: .*define it at module level"):
            invariance.check(fn, device="cpu", perturbations=["order"], isolate=True)
    invariance.check(closure, device="cpu", perturbations=["uninitialized"])  # without: runs


ISOLATED = textwrap.dedent("""
    import dataclasses

    from invariance.backends.reference import reference_backend
    from invariance.perturb import SCALES


    class Instance:
        def __init__(self, name):
            self.name = name
            self.calls = 0

        def __call__(self, batch):
            if self.name != "configured":  # the instance, not the class, reached the child
                raise RuntimeError(f"got {self.name!r}")
            return reference_backend(batch)


    configured = Instance("configured")
    SHORT = dataclasses.replace(SCALES["small"], short=(4, 12))


    def interrupts(batch):
        raise KeyboardInterrupt
""")


def test_isolate_sends_instances_and_scales_by_value(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The child runs the parent's very instance and scale (not the class, not the stock scale
    of the same name), and a child's interrupt is that cell's error text."""
    (tmp_path / "isolated_backends.py").write_text(ISOLATED)
    monkeypatch.syspath_prepend(str(tmp_path))
    import isolated_backends as mod  # type: ignore[import-not-found]

    kwargs: dict[str, Any] = {"device": "cpu", "perturbations": ["uninitialized"],
                              "scale": mod.SHORT}
    direct = invariance.check(mod.configured, **kwargs)
    isolated = invariance.check(mod.configured, isolate=True, **kwargs)
    assert isolated.backend == direct.backend == "isolated_backends:configured"
    assert isolated.passed, isolated.results[0].error
    assert isolated.scale == direct.scale == "small (custom)"
    assert isolated.results[0].coverage == direct.results[0].coverage
    stock = invariance.check(mod.configured, device="cpu", perturbations=["uninitialized"])
    assert direct.results[0].coverage["max_compared_kv_len"] < stock.results[0].coverage[
        "max_compared_kv_len"]  # the custom scale's shorter requests, not the stock ones
    stopped = invariance.check(mod.interrupts, isolate=True, device="cpu",
                               perturbations=["uninitialized"])
    assert "KeyboardInterrupt" in (stopped.results[0].error or "")
    assert "process died" not in (stopped.results[0].error or "")


def test_isolate_names_a_script_without_a_main_guard(tmp_path: Path) -> None:
    script = tmp_path / "unguarded.py"
    script.write_text(textwrap.dedent("""
        import invariance
        from invariance.backends.reference import reference_backend

        def mine(batch):
            return reference_backend(batch)

        report = invariance.check(mine, device="cpu", perturbations=["uninitialized"],
                                  isolate=True)
        print(report.results[0].error)
    """))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "guard its top-level code with 'if __name__ == \"__main__\":'" in proc.stdout
