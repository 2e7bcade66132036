"""Harness for the adversarial suite: run `mismatch` as a user would and check how it fails."""

from __future__ import annotations

import io
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


def mismatch(*args: object, cwd: Path | None = None, timeout: float | None = None, env: dict | None = None) -> Run:
    """Run `mismatch ARGS` as a user's shell would: in this interpreter through the console entry point (its
    guards, exit codes and both streams), or, given a `timeout` (or with MISMATCH_TEST_SUBPROCESS=1), as
    `python -m mismatch_cli` in a fresh process killed after `timeout` s: where the process itself is the point
    (it must exit, not hang, and leave no thread behind)."""
    if timeout is not None or os.environ.get("MISMATCH_TEST_SUBPROCESS") == "1":
        return _subprocess(args, cwd, timeout or 60, env)
    return _in_process(args, cwd, env)


def _subprocess(args: tuple, cwd: Path | None, timeout: float, env: dict | None) -> Run:
    environment = {k: v for k, v in os.environ.items() if k not in ("MISMATCH_DEBUG", "FORCE_COLOR")}
    environment["PYTHONPATH"] = str(ROOT) + os.pathsep + environment.get("PYTHONPATH", "")
    environment.update(env or {})
    proc = subprocess.run(
        [sys.executable, "-m", "mismatch_cli", *map(str, args)],
        capture_output=True, text=True, cwd=cwd, timeout=timeout, env=environment,
    )
    return Run(proc.returncode, proc.stdout, proc.stderr)


def _in_process(args: tuple, cwd: Path | None, env: dict | None) -> Run:
    from mismatch_cli.cli import main

    saved = sys.stdout, sys.stderr, sys.argv, os.getcwd(), dict(os.environ)
    out, err = io.StringIO(), io.StringIO()
    for name in ("MISMATCH_DEBUG", "FORCE_COLOR"):
        os.environ.pop(name, None)
    os.environ.update(env or {})
    code = 0
    try:
        if cwd is not None:
            os.chdir(cwd)
        sys.stdout, sys.stderr, sys.argv = out, err, ["mismatch", *map(str, args)]
        try:
            main()
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
    finally:
        sys.stdout, sys.stderr, sys.argv = saved[0], saved[1], saved[2]
        os.chdir(saved[3])
        os.environ.clear()
        os.environ.update(saved[4])
    return Run(code, out.getvalue(), err.getvalue())


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
