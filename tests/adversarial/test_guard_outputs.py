"""One output-path guard for every command that writes: no input overwritten, no device replaced, no half output."""

from __future__ import annotations

import errno
import os
import re
import shutil
import stat
import tempfile
import threading
import time
from pathlib import Path

import pytest
from adversarial.conftest import ROOT, assert_clean_failure, mismatch, snapshot
from adversarial.guard_helpers import error_line, invoke

from mismatch_cli.errors import UsageError

SAMPLE = ROOT / "sample_data" / "single_turn.parquet"
RULE = "rollout_corr/kl<=1"


@pytest.fixture
def dump(tmp_path: Path) -> Path:
    path = tmp_path / "in" / "dump.parquet"
    path.parent.mkdir()
    shutil.copy(SAMPLE, path)
    return path


# ------------------------------------------------------------------------------------ inputs are never outputs


@pytest.mark.parametrize("how", ["same path", "hard link", "symbolic link", "relative spelling"])
def test_analyze_refuses_to_write_onto_its_input(dump: Path, how: str) -> None:
    target = {"same path": dump, "hard link": dump.parent / "alias.parquet",
              "symbolic link": dump.parent / "link.parquet",
              "relative spelling": dump.parent / ".." / "in" / "dump.parquet"}[how]
    if how == "hard link":
        os.link(dump, target)
    elif how == "symbolic link":
        target.symlink_to(dump)
    before = snapshot(dump.parent)
    run = mismatch("analyze", dump, "-o", target)
    line = assert_clean_failure(run, 2, "-o", "input")
    assert "fix:" in line
    assert snapshot(dump.parent) == before


def test_an_input_found_in_a_folder_is_protected_too(dump: Path) -> None:
    before = snapshot(dump.parent)
    run = mismatch("analyze", dump.parent, "--format", "json", "-o", dump)
    assert_clean_failure(run, 2, "-o", "input")
    assert snapshot(dump.parent) == before


def test_convert_refuses_to_write_onto_its_input(dump: Path) -> None:
    before = snapshot(dump.parent)
    assert_clean_failure(mismatch("convert", dump, "-o", dump), 2, "-o", "input")
    assert snapshot(dump.parent) == before


def test_check_refuses_junit_onto_its_report(dump: Path, tmp_path: Path) -> None:
    assert mismatch("analyze", dump, "--out-dir", tmp_path / "run", "-q").code == 0
    report = tmp_path / "run" / "report.json"
    before = snapshot(tmp_path / "run")
    run = mismatch("check", report, "--fail-on", RULE, "--junit-xml", report)
    assert_clean_failure(run, 2, "--junit-xml", "input")
    assert snapshot(tmp_path / "run") == before


def test_compare_out_dir_refuses_to_overwrite_a_side(dump: Path, tmp_path: Path) -> None:
    # The candidate is out/base_report.json; compare of a dump base writes out/base_report.json.
    out = tmp_path / "out"
    assert mismatch("analyze", dump, "--out-dir", out, "--no-plots", "-q").code == 0
    (out / "report.json").rename(out / "base_report.json")
    before = snapshot(out)
    run = mismatch("compare", dump, out / "base_report.json", "--out-dir", out, "--no-plots")
    assert_clean_failure(run, 2, "--out-dir", "input")
    assert snapshot(out) == before


def test_two_outputs_onto_one_file_are_refused(dump: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    run = mismatch("analyze", dump, "--out-dir", out, "--no-plots", "-o", out / "report.json")
    assert_clean_failure(run, 2, "report.json")
    assert not out.exists()


# ---------------------------------------------------------------------------- special files are written into


def test_a_fifo_output_is_written_into_not_replaced(dump: Path, tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    received: list[bytes] = []

    def read() -> None:
        # Non-blocking, so that opening does not wait for the writer; a read gives 0 bytes both before the
        # writer opens the FIFO and after it closes it, EAGAIN while it is open with nothing to read.
        fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
        writer_seen, deadline = False, time.monotonic() + 120
        try:
            while time.monotonic() < deadline:
                try:
                    chunk = os.read(fd, 65536)
                except BlockingIOError:
                    writer_seen = True
                    time.sleep(0.01)
                    continue
                if chunk:
                    writer_seen = True
                    received.append(chunk)
                elif writer_seen:
                    return
                else:
                    time.sleep(0.01)
        finally:
            os.close(fd)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    run = mismatch("analyze", dump, "--format", "json", "-o", fifo, timeout=120)
    reader.join(10)
    assert run.code == 0, run.stderr
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode), "the FIFO was replaced by a regular file"
    assert b'"schema_version"' in b"".join(received)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_a_character_device_output_stays_a_device(dump: Path, tmp_path: Path) -> None:
    # A private null device, so that a regression cannot destroy the machine's /dev/null.
    node = tmp_path / "null"
    try:
        os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except (PermissionError, OSError):
        pytest.skip("cannot create a device node here")
    run = mismatch("analyze", dump, "-o", node)
    assert run.code == 0, run.stderr
    assert stat.S_ISCHR(os.lstat(node).st_mode)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


# ------------------------------------------------------------------------------------- --out-dir: all or none


def _old_out_dir(tmp_path: Path) -> Path:
    out = tmp_path / "out"
    out.mkdir()
    (out / "report.json").write_text("old report\n")
    (out / "notes.txt").write_text("mine\n")
    return out


def _fail_nth_temp_file(monkeypatch: pytest.MonkeyPatch, nth: int) -> None:
    """The nth temporary file of the run cannot be created: the disk is full."""
    real, calls = tempfile.mkstemp, []

    def fails(*args, **kwargs):
        calls.append(args)
        if len(calls) == nth:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(*args, **kwargs)

    monkeypatch.setattr(tempfile, "mkstemp", fails)


def test_out_dir_with_an_unwritable_later_file_writes_nothing(dump: Path, tmp_path: Path) -> None:
    out = _old_out_dir(tmp_path)
    (out / "report.html").mkdir()  # report.html cannot be written: before, report.json and the plots were
    before = snapshot(out)
    run = mismatch("analyze", dump, "--out-dir", out)
    assert_clean_failure(run, 2, "report.html", "directory")
    assert snapshot(out) == before
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt", "report.html", "report.json"]


def test_out_dir_failing_midway_rolls_back(dump: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = _old_out_dir(tmp_path)
    before = snapshot(out)
    _fail_nth_temp_file(monkeypatch, 3)
    result = invoke("analyze", dump, "--out-dir", out, "--device", "cpu")
    assert result.exit_code == 2, result.output
    assert "no space left" in error_line(result)
    assert snapshot(out) == before, "the out-dir was changed although the write failed"


def test_a_new_out_dir_is_removed_when_a_write_fails(dump: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "new" / "out"
    _fail_nth_temp_file(monkeypatch, 2)
    result = invoke("analyze", dump, "--out-dir", out, "--device", "cpu")
    assert result.exit_code == 2, result.output
    assert not (tmp_path / "new").exists()


def test_a_failed_rename_restores_the_files_already_replaced(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from mismatch_cli.system.output import Outputs

    (tmp_path / "a.txt").write_text("old a")
    (tmp_path / "b.txt").write_text("old b")
    outputs = Outputs()
    outputs.add(tmp_path / "a.txt", "new a", "--out-dir")
    outputs.add(tmp_path / "b.txt", "new b", "--out-dir")
    outputs.add(tmp_path / "c.txt", "new c", "--out-dir")
    real = os.replace
    moves = []

    def third_rename_fails(src, dst):
        moves.append(dst)
        if len(moves) == 3:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real(src, dst)

    monkeypatch.setattr(os, "replace", third_rename_fails)
    with pytest.raises(UsageError, match="c.txt"):
        outputs.commit()
    assert (tmp_path / "a.txt").read_text() == "old a"
    assert (tmp_path / "b.txt").read_text() == "old b"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "b.txt"]


def test_streamed_output_leaves_nothing_when_the_writer_fails(tmp_path: Path) -> None:
    from mismatch_cli.system.output import streamed_file

    target = tmp_path / "sub" / "dump.parquet"
    with pytest.raises(RuntimeError), streamed_file(target, "-o") as tmp:
        Path(tmp).write_bytes(b"half")
        raise RuntimeError("writer died")
    assert not (tmp_path / "sub").exists()


def test_synth_leaves_no_partial_dump(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import mismatch_cli.synth as synth

    def dies(path: Path, *args) -> None:
        path.write_bytes(b"PAR1 half a dump")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(synth, "_write_parquet", dies)
    result = invoke("synth", tmp_path / "x.parquet", "--tokens", "1000")
    assert result.exit_code == 2, result.output
    assert "no space left" in error_line(result)
    assert list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------------- file-system errors, named


def test_an_output_name_too_long_is_a_usage_error(dump: Path, tmp_path: Path) -> None:
    run = mismatch("analyze", dump, "-o", tmp_path / ("x" * 300 + ".json"))
    assert_clean_failure(run, 2, "-o", "name too long")
    run = mismatch("analyze", dump, "--out-dir", tmp_path / ("d" * 300))
    assert_clean_failure(run, 2, "--out-dir", "name too long")
    assert [p.name for p in tmp_path.iterdir()] == ["in"]


def test_an_output_name_near_the_limit_still_gets_a_temporary_name(dump: Path, tmp_path: Path) -> None:
    target = tmp_path / ("x" * 250 + ".json")
    run = mismatch("analyze", dump, "--format", "json", "-o", target)
    assert run.code == 0, run.stderr
    assert target.read_text().startswith("{")


def test_junit_xml_onto_a_folder_is_a_usage_error(dump: Path, tmp_path: Path) -> None:
    folder = tmp_path / "junit"
    folder.mkdir()
    run = mismatch("check", dump, "--fail-on", RULE, "--junit-xml", folder)
    assert_clean_failure(run, 2, "--junit-xml", "directory")
    assert list(folder.iterdir()) == []


def test_an_output_below_a_file_is_a_usage_error(dump: Path, tmp_path: Path) -> None:
    (tmp_path / "plain").write_text("a file")
    run = mismatch("analyze", dump, "-o", tmp_path / "plain" / "report.txt")
    assert_clean_failure(run, 2, "-o", "not a folder")


def test_permission_denied_on_an_output(dump: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Tests run as root, for whom chmod 000 denies nothing: the denial is simulated where files are created.
    def denied(*args, **kwargs):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))

    monkeypatch.setattr(tempfile, "mkstemp", denied)
    result = invoke("analyze", dump, "-o", tmp_path / "report.txt", "--device", "cpu")
    assert result.exit_code == 2, result.output
    line = error_line(result)
    assert "report.txt" in line and "permission denied" in line and "fix:" in line


def test_every_file_write_goes_through_the_output_module() -> None:
    # Temporary files, renames and files opened for writing belong in mismatch_cli/system/output.py only.
    pattern = re.compile(r"mkstemp|os\.replace\(|os\.rename\(|\.savefig\((?!buffer)|open\([^)]*[\"'][wa]b?[\"']")
    offenders = []
    for path in (ROOT / "mismatch_cli").rglob("*.py"):
        if path.name == "output.py":
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if pattern.search(line) and "os.devnull" not in line and "streamed_file" not in line:
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert offenders == []


def test_an_output_file_named_as_the_out_dir_is_refused_by_name(tmp_path: Path) -> None:
    run = mismatch("analyze", SAMPLE, "--out-dir", tmp_path / "out", "-o", tmp_path / "out", "--no-plots")
    assert_clean_failure(run, 2, "it is the folder --out-dir writes into")
    assert not (tmp_path / "out").exists()
