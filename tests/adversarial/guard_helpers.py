"""Helpers shared by the test_guard_* files: the CLI in-process, its error line, a subprocess environment."""

from __future__ import annotations

import os
from typing import Any

from adversarial.conftest import ROOT
from typer.testing import CliRunner

from mismatch_cli.cli import app

_runner = CliRunner()


def invoke(*args: object) -> Any:
    """Run the CLI in this process (where a test can monkeypatch the file system)."""
    return _runner.invoke(app, [str(a) for a in args], env={"MISMATCH_DEBUG": None, "NO_COLOR": "1"})


def error_line(result: Any) -> str:
    """The one `error:` line of an in-process run."""
    lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, result.output
    return lines[0]


def subprocess_env() -> dict[str, str]:
    """The environment the conftest harness gives `mismatch`, for tests that need Popen themselves."""
    env = {k: v for k, v in os.environ.items() if k not in ("MISMATCH_DEBUG", "FORCE_COLOR")}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env
