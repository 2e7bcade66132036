"""The command line, a thin client of the library: parse flags, call the core, render, map errors to exit codes.

One module per command group (`analyze`, `gate` for compare and check, `info` for presets and
metrics, `data` for synth and convert); `options` holds the flag bundles every command shares,
`flags` turns correction flags into upstream fields, `emit` writes and prints every result, and
`app` owns the typer application and the one mapping from exceptions to exit codes.
"""

from __future__ import annotations

import sys
import warnings

from mismatch_cli.correction.registry import TrainerWarning
from mismatch_cli.system.requirements import unmet_requirement

_unmet = unmet_requirement()  # before typer, pyarrow or torch is used: an older one fails with a traceback
if _unmet is not None:
    print(f"error: {_unmet[0]}; fix: {_unmet[1]}", file=sys.stderr)
    sys.exit(2)

_show = warnings.showwarning


def _one_line(message: Warning | str, category: type[Warning], *rest: object, **extra: object) -> None:
    """A skipped trainer is one line on stderr (`warning: ...`), not Python's two-line warning."""
    if issubclass(category, TrainerWarning):
        print(f"warning: {message}", file=sys.stderr)
    else:
        _show(message, category, *rest, **extra)  # type: ignore[arg-type]


warnings.showwarning = _one_line

from mismatch_cli.cli import analyze, data, gate, info, replay  # noqa: E402, F401 - importing registers the commands
from mismatch_cli.cli.app import app, entry, main  # noqa: E402
from mismatch_cli.cli.options import QUIET_HELP  # noqa: E402

__all__ = ["QUIET_HELP", "app", "entry", "main"]
