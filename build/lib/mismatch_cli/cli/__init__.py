"""The command line, a thin client of the library: parse flags, call the core, render, map errors to exit codes.

One module per command group (`analyze`, `gate` for compare and check, `info` for presets and
metrics, `data` for synth and convert); `options` holds the flag bundles every command shares,
`flags` turns correction flags into upstream fields, `emit` writes and prints every result, and
`app` owns the typer application and the one mapping from exceptions to exit codes.
"""

from __future__ import annotations

from mismatch_cli.cli import analyze, data, gate, info, replay  # noqa: F401 - importing registers the commands
from mismatch_cli.cli.app import app, main
from mismatch_cli.cli.options import QUIET_HELP

__all__ = ["QUIET_HELP", "app", "main"]
