"""Standard output that goes away (`| head`) or cannot take the output (a full disk) is not a breach or a crash."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from adversarial.conftest import ROOT, Run, assert_clean_failure, mismatch
from adversarial.guard_helpers import subprocess_env

SAMPLE = ROOT / "sample_data" / "single_turn.parquet"


def _with_closed_stdout(*args: object) -> subprocess.CompletedProcess:
    """Run mismatch with its stdout a pipe whose reading end is closed before anything is written."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # as `| head` does once it has its lines; here before the first one
    try:
        return subprocess.run([sys.executable, "-m", "mismatch_cli", *map(str, args)], stdout=write_end,
                              stderr=subprocess.PIPE, text=True, env=subprocess_env(), timeout=120)
    finally:
        os.close(write_end)


@pytest.mark.parametrize("extra", [[], ["--format", "json"], ["--format", "markdown"]])
def test_a_closed_pipe_exits_141_quietly(extra: list[str]) -> None:
    # Exit 1 would read as "threshold breached"; 141 is what a shell reports for a process killed by SIGPIPE.
    proc = _with_closed_stdout("analyze", SAMPLE, *extra)
    assert proc.returncode == 141, (proc.returncode, proc.stderr)
    assert proc.stderr == ""


def test_a_closed_pipe_on_help_exits_141_quietly() -> None:
    proc = _with_closed_stdout("analyze", "--help")
    assert proc.returncode == 141, (proc.returncode, proc.stderr)
    assert proc.stderr == ""


def test_head_in_a_real_shell_pipeline_is_not_a_breach() -> None:
    proc = subprocess.run(f"{sys.executable} -m mismatch_cli analyze {SAMPLE} | head -n 1; "
                          "echo \"status=${PIPESTATUS[0]}\" >&2", shell=True, executable="/bin/bash",
                          capture_output=True, text=True, env=subprocess_env(), timeout=120)
    status = int(proc.stderr.strip().splitlines()[-1].split("=")[1])
    assert status in (0, 141), proc.stderr  # 0 when every line fit in the pipe before head exited
    assert "Traceback" not in proc.stderr and "error" not in proc.stderr


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_stdout_on_a_full_disk_is_one_clear_error() -> None:
    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, "-m", "mismatch_cli", "analyze", str(SAMPLE)], stdout=full,
                              stderr=subprocess.PIPE, text=True, env=subprocess_env(), timeout=120)
    assert_clean_failure(Run(proc.returncode, "", proc.stderr), 2, "standard output", "no space left")


def test_stdout_full_disk_for_json_too(tmp_path: Path) -> None:
    if not Path("/dev/full").exists():
        pytest.skip("needs /dev/full")
    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, "-m", "mismatch_cli", "presets", "--format", "json"], stdout=full,
                              stderr=subprocess.PIPE, text=True, env=subprocess_env(), timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("error: cannot write standard output: no space left")
    assert mismatch("presets").code == 0  # the same command with a working stdout
