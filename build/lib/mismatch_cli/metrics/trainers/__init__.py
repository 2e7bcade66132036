"""The replayed trainers' keys, one module each (meaning, reduction, source), listed here for the catalog."""

from __future__ import annotations

from mismatch_cli.metrics.model import Family, Metric
from mismatch_cli.metrics.trainers import areal, miles, ms_swift, nemo_rl, openrlhf, prime_rl, skyrl, slime, trl

MODULES = (trl, skyrl, slime, nemo_rl, prime_rl, areal, openrlhf, ms_swift, miles)
TRAINER_FAMILIES: tuple[Family, ...] = tuple(module.FAMILY for module in MODULES)
TRAINER_METRICS: tuple[Metric, ...] = tuple(metric for module in MODULES for metric in module.METRICS)

__all__ = ["TRAINER_FAMILIES", "TRAINER_METRICS"]
