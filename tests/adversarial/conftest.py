"""Harness for the adversarial suite: run `mismatch` as a user would and check how it fails."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Run:
    """One finished `mismatch` process."""

    code: int
    stdout: str
    stderr: str


def mismatch(*args: object, cwd: Path | None = None, timeout: float = 60, env: dict | None = None) -> Run:
    """Run `python -m mismatch_cli ARGS` in a subprocess, as a user's shell would, with a hard timeout."""
    environment = {k: v for k, v in os.environ.items() if k not in ("MISMATCH_DEBUG", "FORCE_COLOR")}
    environment["PYTHONPATH"] = str(ROOT) + os.pathsep + environment.get("PYTHONPATH", "")
    environment.update(env or {})
    proc = subprocess.run(
        [sys.executable, "-m", "mismatch_cli", *map(str, args)],
        capture_output=True, text=True, cwd=cwd, timeout=timeout, env=environment,
    )
    return Run(proc.returncode, proc.stdout, proc.stderr)


def assert_clean_failure(run: Run, code: int, *mentions: str) -> str:
    """The run failed with `code`, one `error: …` line on stderr naming every `mention`, no traceback."""
    assert run.code == code, (run.code, run.stderr)
    assert "Traceback" not in run.stderr, run.stderr
    lines = [line for line in run.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, run.stderr
    for mention in mentions:
        assert mention in lines[0], (mention, lines[0])
    return lines[0]


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file below `folder` with its size and mtime, to prove nothing was written or touched."""
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(folder.rglob("*"))
            if p.is_file()}


@pytest.fixture
def run_mismatch():
    """The `mismatch` subprocess runner, as a fixture."""
    return mismatch
