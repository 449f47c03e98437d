"""Output files: atomic writes (all or nothing, no temporary left) and the checks made before a
long run (directory, missing or read-only parent, duplicates, an output that is an input)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from invariance import outputs
from invariance.outputs import OutputError, check_outputs, write_atomic


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
