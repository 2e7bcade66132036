"""What every partial state of a sharded run is built with (no torch here: a driver builds it before any
engine is loaded, and sends it to the workers)."""

from __future__ import annotations

from dataclasses import dataclass

from mismatch_cli.correction import ResolvedCorrection


@dataclass(frozen=True)
class PartialSpec:
    """What every partial state is built with (the same on every worker, so the states merge)."""

    correction: ResolvedCorrection
    dtype: str = "float32"
    by_step: bool = False
    rounds: bool = True
    group_by: tuple[str, ...] = ()
    bootstrap: int = 200
    fused: bool = False  # the fused CPU sweep (engine/kernels/sweep.py), as the local engine decides it


__all__ = ["PartialSpec"]
