"""The replayed trainers, one registry: each family's module holds its data and formulas, here they are listed.

A replayed trainer (semantics `trl`, ...) reports its own keys under its own names, with its own
fields (given one by one or in the `[correction]` table); docs/trainers.md says what each computes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mismatch_cli.correction.areal import FAMILY as AREAL
from mismatch_cli.correction.miles import FAMILY as MILES
from mismatch_cli.correction.miles import MIS_FAMILY as MILES_MIS
from mismatch_cli.correction.model import CORRECTION_FAMILIES, ReplayFamily
from mismatch_cli.correction.ms_swift import FAMILY as MS_SWIFT
from mismatch_cli.correction.nemo_rl import FAMILY as NEMO_RL
from mismatch_cli.correction.openrlhf import FAMILY as OPENRLHF
from mismatch_cli.correction.parse import unknown_fields
from mismatch_cli.correction.prime_rl import FAMILY as PRIME_RL
from mismatch_cli.correction.skyrl import FAMILY as SKYRL
from mismatch_cli.correction.slime import FAMILY as SLIME
from mismatch_cli.correction.slime import MIS_FAMILY as SLIME_MIS
from mismatch_cli.correction.trl import FAMILY as TRL

REPLAY_FAMILIES: dict[str, ReplayFamily] = {family.name: family for family in (
    TRL,
    SKYRL,
    SLIME,
    SLIME_MIS,
    NEMO_RL,
    PRIME_RL,
    AREAL,
    OPENRLHF,
    MS_SWIFT,
    MILES,
    MILES_MIS,
)}
FAMILIES: tuple[str, ...] = (*CORRECTION_FAMILIES, *REPLAY_FAMILIES)
# The rows of `mismatch replay`: a concept each trainer may log under its own key (ReplayFamily.concepts).
# Labels stay short (d = old - rollout log-prob; shares are fractions) so eight trainers fit beside them.
CONCEPTS: dict[str, str] = {
    "abs_diff": "mean |d|",
    "kl": "KL estimate",
    "chi2": "chi-square",
    "weight_mean": "IS weight mean",
    "truncated": "share truncated",
    "masked": "share masked",
    "dropped": "seqs dropped",
}
# The reasons trainers differ, in the order `replay` names them (ReplayFamily.traits); `estimator` says which
# KL estimate a trainer logs for the `kl` concept.
TRAITS = ("estimator", "sequence", "clamp", "reduction", "threshold")


def check_trainer_fields(family: ReplayFamily, fields: Mapping[str, Any]) -> None:
    """Refuse a field the trainer does not have, naming the closest one and all of the family's (exit 2)."""
    known = tuple(family.defaults)
    unknown = [k for k in fields if k not in known]
    if unknown:
        raise unknown_fields(family.name, unknown, known)


def replay_fields() -> dict[str, str]:
    """Every replayed trainer's field and its TOML kind (the `[correction]` table takes them)."""
    fields: dict[str, str] = {}
    for family in REPLAY_FAMILIES.values():
        for name, value in family.kinds.items():
            assert fields.get(name, value) == value, f"{name} has two kinds"
            fields[name] = value
    return fields
