"""Output files: atomic writes (all or nothing, no temporary left), what an output path names
(a file, standard output, another stream) and the checks made before a long run (directory,
missing or read-only parent, duplicates, an output that is an input, a name that cannot be read
back, a directory for case files)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from invariance import outputs
from invariance.outputs import (
    OutputError,
    Target,
    check_directory,
    check_outputs,
    partial_path,
    target,
    write_atomic,
    write_output,
)


def _listing(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir())


def test_write_atomic_writes_and_replaces(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    write_atomic(path, "one ü\n")
    assert path.read_bytes() == "one ü\n".encode()
    path.chmod(0o640)
    write_atomic(path, "two\n")
    assert path.read_text(encoding="utf-8") == "two\n"
    assert (path.stat().st_mode & 0o777) == 0o640  # keeps the file's permissions
    assert _listing(tmp_path) == ["r.json"]


def test_write_atomic_relative_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    write_atomic(Path("r.json"), "x")
    assert (tmp_path / "r.json").read_text() == "x"
    assert _listing(tmp_path) == ["r.json"]


def test_write_atomic_keeps_old_file_when_replace_fails(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "r.json"
    path.write_text("old")

    def broken_replace(src: Any, dst: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OutputError) as info:
        write_atomic(path, "new")
    assert str(info.value) == f"cannot write {path}: No space left on device"
    assert path.read_text() == "old"
    assert _listing(tmp_path) == ["r.json"]


def test_write_atomic_keeps_old_file_when_write_fails_halfway(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "r.json"
    path.write_text("old")
    real_fsync = os.fsync

    def failing_fsync(fd: int) -> None:
        real_fsync(fd)
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(OutputError, match="Input/output error"):
        write_atomic(path, "new" * 10_000)
    assert path.read_text() == "old"
    assert _listing(tmp_path) == ["r.json"]


def test_write_atomic_interrupt_removes_temporary(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "r.json"

    def interrupted(fd: int) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_atomic(path, "new")
    assert _listing(tmp_path) == []


def test_write_atomic_errors_name_the_path(tmp_path: Path) -> None:
    with pytest.raises(OutputError, match=r"cannot write .*nope/r\.json: No such file"):
        write_atomic(tmp_path / "nope" / "r.json", "x")
    with pytest.raises(OutputError, match="it is a directory"):
        write_atomic(tmp_path, "x")


def test_write_atomic_through_symlink(tmp_path: Path) -> None:
    target = tmp_path / "target.json"
    target.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    write_atomic(link, "new")
    assert link.is_symlink() and target.read_text() == "new"
    assert _listing(tmp_path) == ["link.json", "target.json"]


def test_write_atomic_to_a_device(tmp_path: Path) -> None:
    write_atomic(Path(os.devnull), "discarded")  # not replaced by a regular file
    assert Path(os.devnull).is_char_device()


def test_check_outputs_accepts_good_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                          ) -> None:
    existing = tmp_path / "old.md"
    existing.write_text("keep")
    monkeypatch.chdir(tmp_path)
    check_outputs({"--json": tmp_path / "r.json", "--markdown": existing, "--html": None,
                   "--junit": Path("junit.xml"), "--null": Path(os.devnull)},
                  inputs=[tmp_path / "a.json"])
    assert existing.read_text() == "keep"
    assert _listing(tmp_path) == ["old.md"]  # nothing created, probe removed


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda d: {"--html": d}, "--html {d}: {d} is a directory"),
        (lambda d: {"--json": d / "no" / "r.json"},
         "--json {d}/no/r.json: directory {d}/no does not exist"),
        (lambda d: {"--junit": d / "file.txt" / "r.xml"},
         "--junit {d}/file.txt/r.xml: {d}/file.txt is not a directory"),
        (lambda d: {"--json": d / "r.json", "--markdown": d / "sub" / ".." / "r.json"},
         "--markdown {d}/sub/../r.json and --json {d}/r.json are the same file"),
    ],
    ids=["directory", "missing-parent", "parent-is-file", "duplicate"],
)
def test_check_outputs_rejects(tmp_path: Path, make: Any, message: str) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "file.txt").write_text("")
    with pytest.raises(OutputError) as info:
        check_outputs(make(tmp_path))
    assert str(info.value) == message.format(d=tmp_path)


def test_check_outputs_relative_and_absolute_collide(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(OutputError, match=r"--html .*/a\.json and --json a\.json are the same"):
        check_outputs({"--json": Path("a.json"), "--html": tmp_path / "sub" / ".." / "a.json"})
    (tmp_path / "sub").mkdir()
    with pytest.raises(OutputError, match=r"--html .*/a\.json and --json a\.json are the same"):
        check_outputs({"--json": Path("a.json"), "--html": tmp_path / "sub" / ".." / "a.json"})
    with pytest.raises(OutputError, match="are the same file"):
        check_outputs({"--json": Path("a.json"), "--html": Path("sub/../a.json")})
    with pytest.raises(OutputError, match=r"--json a\.json would overwrite the input .*a\.json"):
        check_outputs({"--json": Path("a.json")}, inputs=[tmp_path / "a.json"])


def test_check_outputs_symlink_to_input(tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    report.write_text("{}")
    (tmp_path / "alias.json").symlink_to(report)
    with pytest.raises(OutputError, match="would overwrite the input"):
        check_outputs({"--markdown": tmp_path / "alias.json"}, inputs=[report])


def test_check_outputs_lists_every_problem(tmp_path: Path) -> None:
    with pytest.raises(OutputError) as info:
        check_outputs({"--html": tmp_path, "--json": tmp_path / "x" / "r.json"})
    assert str(info.value).count("; ") == 1
    assert "--html" in str(info.value) and "--json" in str(info.value)


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0,
                    reason="permissions do not apply to root")
def test_check_outputs_rejects_unwritable_parent(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        with pytest.raises(OutputError, match=r"--json .*locked/r\.json: cannot create a file "
                                              r"in .*locked: Permission denied"):
            check_outputs({"--json": locked / "r.json"})
        with pytest.raises(OutputError, match="Permission denied"):
            write_atomic(locked / "r.json", "x")
    finally:
        locked.chmod(0o700)


def test_unwritable_parent_simulated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same check as root: the probe file cannot be created."""
    def denied(target: Path) -> tuple[int, Path]:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(outputs, "_open_temp", denied)
    with pytest.raises(OutputError) as info:
        check_outputs({"--json": tmp_path / "r.json"})
    assert str(info.value) == (f"--json {tmp_path}/r.json: cannot create a file in {tmp_path}: "
                               "Permission denied")


# --- what an output path names ---------------------------------------------------------------

def test_dash_and_dev_stdout_are_standard_output(tmp_path: Path) -> None:
    assert target("--json", "-").kind == "stdout"
    assert target("--json", tmp_path / "new.json").kind == "file"
    if Path("/dev/stdout").exists():
        # Whatever standard output is here (a pipe, a file, a terminal), /dev/stdout names it.
        assert target("--json", "/dev/stdout").kind == "stdout"
        assert target("--json", "/dev/stderr").kind == "stderr"
    # The null device is a sink whatever standard output is pointed at; any number may use it.
    assert target("--json", os.devnull).kind == "stream"
    targets = check_outputs({"--json": Path(os.devnull), "--markdown": Path(os.devnull)})
    assert {t.kind for t in targets.values()} == {"stream"}


def test_a_file_behind_standard_output_is_written_through_it(tmp_path: Path) -> None:
    """``--json /dev/stdout > out.txt``: the file is standard output's own, so it is written
    through the descriptor (an atomic rename would unlink the file the shell redirected to)."""
    import subprocess
    import sys

    out = tmp_path / "out.txt"
    # outputs.py is the standard library only: loaded by file, the child starts in a blink.
    code = ("import importlib.util as u, sys; s = u.spec_from_file_location('o', sys.argv[1]); "
            "o = sys.modules['o'] = u.module_from_spec(s); s.loader.exec_module(o); "
            "t = o.target('--json', sys.argv[2]); print('console', flush=True); "
            "o.write_output(t, t.kind + '\\n')")
    for name in ("/dev/stdout", str(out)):
        with open(out, "w") as f:
            subprocess.run([sys.executable, "-c", code, outputs.__file__, name], stdout=f,
                           check=True)
        assert out.read_text() == "console\nstdout\n", name  # nothing replaced or lost


def test_standard_output_twice_is_refused() -> None:
    with pytest.raises(OutputError, match="--markdown - and --json - are the same file"):
        check_outputs({"--json": "-", "--markdown": "-"})


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
def test_a_pipe_is_written_directly_once(tmp_path: Path) -> None:
    import threading

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    out = check_outputs({"--json": fifo})["--json"]
    assert out.kind == "stream" and not out.rewritable
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    write_output(out, "{}\n")
    reader.join(timeout=10)
    assert got == [b"{}\n"] and _listing(tmp_path) == ["pipe"]  # no temporary, no rename


def test_write_output_to_a_gone_reader_is_a_broken_pipe(tmp_path: Path) -> None:
    """A reader that went away is the reader's choice: BrokenPipeError, not an OutputError."""
    r, w = os.pipe()
    os.close(r)
    try:
        with pytest.raises(BrokenPipeError):
            write_output(Target("--json", Path(f"/dev/fd/{w}"), "stream"), "x" * 100)
    finally:
        os.close(w)


def test_non_utf8_names_are_refused_before_the_run(tmp_path: Path) -> None:
    bad = Path(os.fsdecode(bytes(tmp_path) + b"/r\xff.json"))
    with pytest.raises(OutputError, match=r"--json .*r\\xff\.json: the name is not valid UTF-8"):
        check_outputs({"--json": bad})
    with pytest.raises(OutputError, match="not valid UTF-8"):
        check_directory("--cases", Path(os.fsdecode(bytes(tmp_path) + b"/c\xfe")))
    assert _listing(tmp_path) == []


def test_partial_path_sits_beside_the_report(tmp_path: Path) -> None:
    assert partial_path(tmp_path / "r.json") == tmp_path / "r.json.partial"
    (tmp_path / "r.json.partial").mkdir()
    with pytest.raises(OutputError, match="where the run's progress goes"):
        check_outputs({"--json": tmp_path / "r.json"})


@pytest.mark.parametrize(("make", "message"), [
    (lambda d: d / "file.txt", "expected a directory, got the file"),
    (lambda d: d / "file.txt" / "sub", "file.txt is not a directory"),
    (lambda d: "-", "standard output cannot hold files"),
], ids=["a-file", "under-a-file", "stdout"])
def test_check_directory_rejects(tmp_path: Path, make: Any, message: str) -> None:
    (tmp_path / "file.txt").write_text("")
    with pytest.raises(OutputError, match=message):
        check_directory("--cases", make(tmp_path))


def test_check_directory_accepts_new_and_existing(tmp_path: Path) -> None:
    check_directory("--cases", tmp_path)
    check_directory("--cases", tmp_path / "new" / "deeper")
    assert _listing(tmp_path) == []  # nothing created: the probe is removed


def test_check_directory_unwritable_simulated(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    def denied(target: Path) -> tuple[int, Path]:
        raise PermissionError(13, "Read-only file system")

    monkeypatch.setattr(outputs, "_open_temp", denied)
    with pytest.raises(OutputError, match=r"--cases .*: cannot create a file in .*Read-only"):
        check_directory("--cases", tmp_path / "cases")
