"""File-system errors name the path, the real cause and the fix (not "no such file" or "re-export it")."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

import pytest
from adversarial.conftest import ROOT, assert_clean_failure, mismatch
from adversarial.guard_helpers import error_line, invoke

from mismatch_cli.errors import InputError, UsageError
from mismatch_cli.io import sha256_file

SAMPLE = ROOT / "sample_data" / "single_turn.parquet"


@pytest.mark.parametrize(("code", "cause"), [
    (errno.EACCES, "permission denied"),
    (errno.EPERM, "operation not permitted"),
    (errno.ELOOP, "symbolic link loop"),
    (errno.ENAMETOOLONG, "name too long"),
    (errno.EISDIR, "directory"),
    (errno.ENOTDIR, "not a folder"),
    (errno.ENOENT, "no such file"),
    (errno.ENOSPC, "no space left"),
])
def test_each_os_error_class_has_its_own_message(code: int, cause: str) -> None:
    from mismatch_cli.system.oserrors import explain_os_error

    exc = OSError(code, os.strerror(code))
    reading = explain_os_error(exc, "/data/x.parquet")
    writing = explain_os_error(exc, "/out/r.json", writing=True, flag="-o")
    assert isinstance(reading, InputError) and reading.exit_code == 3
    assert isinstance(writing, UsageError) and writing.exit_code == 2
    assert str(reading).startswith("cannot read /data/x.parquet: ") and cause in reading.message
    assert str(writing).startswith("cannot write -o /out/r.json: ") and cause in writing.message
    for error in (reading, writing):
        assert error.hint and "truncated" not in str(error)


def test_a_symlink_loop_is_not_reported_as_missing(tmp_path: Path) -> None:
    (tmp_path / "a.parquet").symlink_to(tmp_path / "b.parquet")
    (tmp_path / "b.parquet").symlink_to(tmp_path / "a.parquet")
    run = mismatch("analyze", tmp_path / "a.parquet")
    line = assert_clean_failure(run, 3, "a.parquet", "symbolic link loop")
    assert "no such file" not in line


def test_a_dangling_symlink_names_its_target(tmp_path: Path) -> None:
    (tmp_path / "dump.parquet").symlink_to(tmp_path / "gone" / "dump.parquet")
    run = mismatch("analyze", tmp_path / "dump.parquet")
    assert_clean_failure(run, 3, "dump.parquet", "symbolic link to a missing file", "gone")


def test_a_symlink_loop_inside_a_folder_is_reported(tmp_path: Path) -> None:
    shutil.copy(SAMPLE, tmp_path / "good.parquet")
    (tmp_path / "z.parquet").symlink_to(tmp_path / "z.parquet")
    run = mismatch("analyze", tmp_path)
    assert_clean_failure(run, 3, "z.parquet", "symbolic link loop")


def test_an_input_name_too_long(tmp_path: Path) -> None:
    run = mismatch("analyze", tmp_path / ("x" * 300 + ".parquet"))
    assert_clean_failure(run, 3, "name too long")


def test_an_input_below_a_file(tmp_path: Path) -> None:
    shutil.copy(SAMPLE, tmp_path / "dump.parquet")
    run = mismatch("analyze", tmp_path / "dump.parquet" / "x.parquet")
    assert_clean_failure(run, 3, "not a folder")


# Tests run as root, for whom chmod 000 denies nothing: permission denial is simulated in-process where
# the tool opens the file (os.open) or lists the folder (os.scandir).


@pytest.fixture
def deny(monkeypatch: pytest.MonkeyPatch):
    """deny(path): opening or listing `path` raises PermissionError, as for a user without the right."""
    denied: set[str] = set()
    real_open, real_scandir = os.open, os.scandir

    def fake_open(path, *args, **kwargs):
        if os.fspath(path) in denied:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.fspath(path))
        return real_open(path, *args, **kwargs)

    def fake_scandir(path="."):
        if os.fspath(path) in denied:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.fspath(path))
        return real_scandir(path)

    monkeypatch.setattr(os, "open", fake_open)
    monkeypatch.setattr(os, "scandir", fake_scandir)
    return lambda path: denied.add(str(path))


@pytest.mark.parametrize("suffix", [".parquet", ".safetensors", ".pt", ".jsonl"])
def test_permission_denied_on_an_input_file(tmp_path: Path, deny, suffix: str) -> None:
    path = tmp_path / f"rank_0{suffix}"
    shutil.copy(SAMPLE, path)
    deny(path)
    result = invoke("analyze", path, "--device", "cpu")
    assert result.exit_code == 3, result.output
    line = error_line(result)
    assert str(path) in line and "permission denied" in line
    assert "truncated" not in line and "no such file" not in line and "cannot tell the format" not in line


@pytest.mark.parametrize("name", ["dump.parquet", "train_0.pt", "step_1/rank_0.jsonl"])
def test_an_unreadable_dump_in_a_folder_is_reported_not_skipped(tmp_path: Path, deny, name: str) -> None:
    shutil.copy(SAMPLE, tmp_path / "a.parquet")
    path = tmp_path / name
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(b"\x80 pretend")
    deny(path)
    result = invoke("analyze", tmp_path, "--device", "cpu")
    assert result.exit_code == 3, result.output
    assert "permission denied" in error_line(result) and name in error_line(result)


def test_an_unreadable_subfolder_is_reported_not_skipped(tmp_path: Path, deny) -> None:
    shutil.copy(SAMPLE, tmp_path / "a.parquet")
    (tmp_path / "more").mkdir()
    shutil.copy(SAMPLE, tmp_path / "more" / "b.parquet")
    deny(tmp_path / "more")
    result = invoke("analyze", tmp_path, "--device", "cpu")
    assert result.exit_code == 3, result.output
    assert "permission denied" in error_line(result) and "more" in error_line(result)


def test_hashing_a_folder_says_it_is_one(tmp_path: Path) -> None:
    folder = tmp_path / "folder"
    folder.mkdir()
    with pytest.raises(InputError, match=r"cannot read .*folder: it is a directory"):
        sha256_file(str(folder))
