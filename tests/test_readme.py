"""Every code block of README.md runs, so an example cannot rot.

- ```python blocks run in a fresh interpreter; a block whose first line is ``# needs a GPU``
  runs only where CUDA is (the gpu nox session).
- ```bash blocks: every ``invariance ...`` line runs (through ``python -m invariance.cli``) and
  must exit as the block's comment says (``# exit 1`` after the command; 0 otherwise); a
  ``pytest ...`` line runs in a project holding the README's test file. The set-up block (under
  "Set up") is what ``.ci/run`` executes on a clean machine.
- ```text blocks are sample output. One preceded by ``<!-- sample: COMMAND -->`` is checked:
  the command runs (at the console width the sample was taken at) and every line of the sample
  but a ``...`` placeholder appears in its output, times and paths aside. So a sample cannot
  drift from what the command prints.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
FENCE = re.compile(r"^```(\w+)[^\n]*\n(.*?)^```", re.M | re.S)
GPU = "# needs a GPU"


def _blocks(lang: str) -> list[tuple[int, str]]:
    text = README.read_text(encoding="utf-8")
    return [(text[:m.start()].count("\n") + 1, m.group(2)) for m in FENCE.finditer(text)
            if m.group(1) == lang]


def _setup_block() -> str:
    text = README.read_text(encoding="utf-8")
    section = text.split("## Set up", 1)[1]
    m = FENCE.search(section)
    assert m is not None and m.group(1) == "bash"
    return m.group(2)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("TRITON_INTERPRET", "1" if not torch.cuda.is_available() else "0")
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return env


def test_setup_is_exactly_two_commands_and_ci_runs_them() -> None:
    lines = [ln.split("#")[0].strip() for ln in _setup_block().splitlines()]
    commands = [ln for ln in lines if ln]
    assert len(commands) == 2 and commands[1] == "nox", commands
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "## Set up" in ci, ".ci/run must execute README's set-up block"


def _python_ids() -> list[str]:
    return [f"README.md:{line}" for line, _ in _blocks("python")]


@pytest.mark.parametrize(("line", "code"), _blocks("python"), ids=_python_ids())
def test_python_block_runs(line: int, code: str, tmp_path: Path) -> None:
    if code.startswith(GPU) and not torch.cuda.is_available():
        pytest.skip("README block needs a GPU")
    if re.search(r"^def test_", code, re.M):  # a test file for pytest: collected, not run
        compile(code, f"README.md:{line}", "exec")
        return
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=_env(),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"README.md:{line}\n{proc.stdout}\n{proc.stderr}"


def _command_blocks() -> list[tuple[int, list[str]]]:
    setup = _setup_block()
    out = []
    for line, code in _blocks("bash"):
        lines = [ln for ln in code.splitlines() if ln.startswith(("invariance ", "pytest"))]
        if code != setup and lines:
            out.append((line, lines))
    return out


@pytest.mark.parametrize(("line", "commands"), _command_blocks(),
                         ids=[f"README.md:{line}" for line, _ in _command_blocks()])
def test_bash_block_runs(line: int, commands: list[str], tmp_path: Path) -> None:
    """The block's commands, in order, in one fresh directory."""
    tests = [code for _, code in _blocks("python") if re.search(r"^def test_", code, re.M)]
    for command in commands:
        text, _, comment = command.partition("#")
        if "needs a GPU" in comment and not torch.cuda.is_available():
            continue
        expected = int(m.group(1)) if (m := re.search(r"exit (\d)", comment)) else 0
        argv = shlex.split(text)
        if argv[0] == "pytest":
            assert tests, "a pytest command needs the README's test file"
            (tmp_path / "test_attention.py").write_text(tests[0], encoding="utf-8")
            argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *argv[1:]]
        else:
            argv = [sys.executable, "-m", "invariance.cli", *argv[1:]]
        proc = subprocess.run(argv, cwd=tmp_path, env=_env(), capture_output=True, text=True,
                              timeout=900)
        assert proc.returncode == expected, (
            f"README.md:{line}: {command}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")


SAMPLE = re.compile(r"^<!-- sample: (.*?) -->\n```text\n(.*?)^```", re.M | re.S)
#: The console width the samples were taken at.
SAMPLE_COLUMNS = "100"


def _normalize(line: str) -> str:
    """A line with its run-dependent parts (times, temporary paths) and spacing made uniform."""
    line = re.sub(r"\d+(\.\d+)?s\b", "<t>", line)
    line = re.sub(r"/tmp/\S+", "<path>", line)
    return " ".join(line.split())


def _samples() -> list[tuple[str, str]]:
    return SAMPLE.findall(README.read_text(encoding="utf-8"))


@pytest.mark.parametrize(("command", "sample"), _samples(),
                         ids=[c.split(" --")[0] for c, _ in _samples()])
def test_sample_output_is_what_the_command_prints(command: str, sample: str) -> None:
    """The command runs in the repository's root (it may name files of it) and writes
    nothing there: a sample command has no output option."""
    assert not re.search(r"--(json|markdown|html|junit|cases)\b", command), command
    argv = [sys.executable, "-m", "invariance.cli", *shlex.split(command)[1:]]
    env = {**_env(), "COLUMNS": SAMPLE_COLUMNS}
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    printed = [_normalize(x) for x in (proc.stdout + proc.stderr).splitlines()]
    text = "\n".join(printed)
    lines = [_normalize(x) for x in sample.splitlines() if x.strip() and x.strip() != "..."]
    assert lines, f"README sample of {command!r} is empty"
    missing = [x for x in lines if x not in text]
    assert not missing, (f"README sample of {command!r}: lines the command no longer prints: "
                         f"{missing}\n--- it printed:\n{proc.stdout[-4000:]}")
