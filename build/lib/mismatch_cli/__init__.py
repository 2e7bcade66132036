"""mismatch: how far an inference engine's token log-probs drift from the trainer's, and what to do."""

from __future__ import annotations

from typing import Any

from mismatch_cli.version import __version__

__all__ = ["__version__", "analyze", "compare", "compare_many", "check", "Report", "CorrectionConfig", "write_dump"]


def __getattr__(name: str) -> Any:
    # Lazy so that `mismatch --help` never imports torch.
    if name == "analyze":
        from mismatch_cli.api import analyze

        return analyze
    if name in ("compare", "compare_many", "check"):
        from mismatch_cli.gate import api

        return getattr(api, name)
    if name == "Report":
        from mismatch_cli.report import Report

        return Report
    if name == "CorrectionConfig":
        from mismatch_cli.correction import CorrectionConfig

        return CorrectionConfig
    if name == "write_dump":
        from mismatch_cli.dump import write_dump

        return write_dump
    raise AttributeError(name)
