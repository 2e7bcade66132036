"""A family's vocabulary of fixes: the settings that close each cause of a mismatch, in the trainer's own syntax.

Each trainer keeps its vocabulary with it (`mismatch_cli/trainers/<name>/fixes.py`, named by
`ReplayFamily.fixes`; verl's and xtuner's in `correction/fixes_verl.py` and `correction/fixes_xtuner.py`).
Every setting names the upstream file and line where it is defined at the version the vocabulary is true of;
docs/fixes.md lists them all (generated from these objects). The answers layer picks the concerns a cause
needs and says them in the user's trainer (the report's semantics).
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from mismatch_cli.correction.model import CORRECTION_FAMILIES

# The concerns a vocabulary covers, and what each closes.
CONCERNS: dict[str, str] = {
    "temperature": "score the trainer's log-probs at the temperature the engine sampled at",
    "truncation": "sample training rollouts without top-p / top-k / min-p truncation, or replay it in the trainer",
    "logprobs_mode": "which log-probs the engine reports (before or after temperature and truncation)",
    "rollout_logprobs": "make the engine return its own log-probs for each sampled token",
    "penalties": "repetition / presence / frequency penalties and logit bias at sampling time",
    "precision": "close a precision gap at the source: fp32 lm_head, the same kernels, deterministic inference",
    "low_precision": "where a deliberate low-precision rollout (fp8 weights or KV cache) is set",
    "correction": "the trainer's own correction of the mismatch (its token-level cap first)",
    "response_mask": "which setting builds the response / loss mask",
    "policy_version": "what records a sample's policy version and bounds its staleness",
}


@dataclass(frozen=True)
class Setting:
    """One thing a user sets, written as they write it, with the upstream file and line that defines it."""

    text: str  # e.g. "actor_rollout_ref.rollout.temperature=T"
    source: str  # "verl/trainer/config/rollout/rollout.yaml:17", or "engine: …" for an engine's own setting
    note: str = ""  # when it applies, or what it needs beside it


@dataclass(frozen=True)
class Trap:
    """A known pitfall of the trainer, named when the evidence of a cause fits it."""

    causes: tuple[str, ...]  # finding codes (temperature_mismatch, processed_logprobs, …) or concerns
    text: str
    source: str


@dataclass(frozen=True)
class Fixes:
    """A trainer's settings for each concern, true at the version named, with what it lacks and its traps."""

    trainer: str  # the trainer and version the vocabulary is true at, e.g. "SkyRL 0.4.0"
    syntax: str  # how its settings are written (Hydra overrides, CLI flags, a config dataclass, TOML)
    settings: Mapping[str, tuple[Setting, ...]]  # concern -> its settings, the one to try first first
    missing: Mapping[str, str] = field(default_factory=dict)  # concern -> that it has none, and what instead
    traps: tuple[Trap, ...] = ()
    # A what-if ladder row (its family, level, threshold, option) -> the trainer's own correction fields that
    # compute exactly that rule, or None when it cannot; and those fields as the trainer's native snippet.
    correction: Callable[[Mapping[str, Any]], dict[str, Any] | None] | None = None
    native: Callable[[Mapping[str, Any]], str] | None = None
    # Fields that shape how the trainer reduces its keys, not what it corrects (micro-batch sizes): a run keeps
    # its own when its configuration is matched against a ladder row.
    context_fields: tuple[str, ...] = ()

    def first(self, concern: str) -> Setting | None:
        """The setting to try first for a concern (None when the trainer has none)."""
        found = self.settings.get(concern) or ()
        return found[0] if found else None

    def traps_for(self, cause: str) -> tuple[Trap, ...]:
        """The traps that a cause's evidence fits."""
        return tuple(trap for trap in self.traps if cause in trap.causes)


# The correction model's families and the module holding each one's vocabulary.
CORE_FIXES = {family: "mismatch_cli.correction.fixes_xtuner" if family.startswith("xtuner")
              else "mismatch_cli.correction.fixes_verl" for family in CORRECTION_FAMILIES}


@functools.cache
def fixes_for(family: str) -> Fixes | None:
    """A family's vocabulary of fixes (None for a third-party trainer that ships none)."""
    from mismatch_cli.correction.registry import replay_families

    replayed = replay_families().get(family)
    module = replayed.fixes if replayed is not None else CORE_FIXES.get(family)
    if not module:
        return None
    loaded = importlib.import_module(module)
    by_family = getattr(loaded, "FIXES_BY_FAMILY", None)
    return by_family[family] if by_family and family in by_family else loaded.FIXES


def override_value(value: Any) -> str:
    """A value as a Hydra / OmegaConf override writes it: null, true / false, a float's repr, else its text."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return repr(value) if isinstance(value, float) else str(value)


def flag_value(value: Any) -> str:
    """A value as a command-line flag takes it: true / false, else its text."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def threshold_bounds(threshold: str) -> tuple[float | None, float]:
    """A ladder threshold as (lower, upper): "0.5_2.0" -> (0.5, 2.0), "2.0" -> (None, 2.0)."""
    if "_" in threshold:
        lower, upper = threshold.split("_")
        return float(lower), float(upper)
    return None, float(threshold)


__all__ = ["CONCERNS", "CORE_FIXES", "Fixes", "Setting", "Trap", "fixes_for", "flag_value", "override_value",
           "threshold_bounds"]
