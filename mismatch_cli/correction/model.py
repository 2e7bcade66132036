"""The correction model's value types: parsed thresholds, what one family computes, the resolved correction.

Plain data only: the families (`verl`, `older`, the replayed trainers) build these, the engine reads them and never
branches on a family's name.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

SAFETY_BOUND = 20.0  # verl clamps log-ratios to [-20, 20] before exp

RS_OPTIONS: tuple[str, ...] = (
    "token_k1",
    "token_k2",
    "token_k3",
    "seq_sum_k1",
    "seq_sum_k2",
    "seq_sum_k3",
    "seq_mean_k1",
    "seq_mean_k2",
    "seq_mean_k3",
    "seq_max_k2",
    "seq_max_k3",
)
TOKEN_RS_OPTIONS = frozenset({"token_k1", "token_k2", "token_k3"})
IS_LEVELS = ("token", "sequence")

# The families mapped onto this correction model; the replayed trainers (correction/registry.py) follow them.
CORRECTION_FAMILIES = ("verl", "verl-0.8", "verl-0.7.1", "verl-0.7.0", "verl-0.6.1", "verl-0.6.0", "xtuner",
                       "xtuner-2025-12")
# Families that take verl's `algorithm.rollout_correction` fields as CorrectionConfig fields (the others:
# `family_fields`).
VERL_FAMILIES = ("verl", "verl-0.8")


@dataclass(frozen=True)
class IsThreshold:
    """A parsed `rollout_is_threshold`: TIS upper bound, or an IcePop band when `lower` is set."""

    upper: float
    lower: float | None = None

    @property
    def icepop(self) -> bool:
        """True when the threshold is an IcePop `L_U` band."""
        return self.lower is not None

    @property
    def metric_lower(self) -> float:
        """The lower bound verl's IS metrics use: L for IcePop, else 1/U."""
        return self.lower if self.lower is not None else 1.0 / self.upper


@dataclass(frozen=True)
class RsOption:
    """One rejection-sampling criterion with its parsed bounds (`lower` only for k1 options)."""

    name: str
    upper: float
    lower: float | None = None

    @property
    def is_k1(self) -> bool:
        """True for the k1 options, which take a lower and an upper ratio bound."""
        return self.name.endswith("k1")

    @property
    def level(self) -> str:
        """`token` or `sequence`."""
        return "token" if self.name in TOKEN_RS_OPTIONS else "sequence"

    @property
    def statistic(self) -> str:
        """`k1`, `k2` or `k3`."""
        return self.name[-2:]

    @property
    def reduction(self) -> str:
        """`token`, `sum`, `mean` or `max`."""
        return "token" if self.level == "token" else self.name.split("_")[1]


@dataclass(frozen=True)
class RatioBlockSpec:
    """verl 0.6/0.7's shared IS-metric block over raw safety-clamped ratios (docs/legacy-semantics.md §3)."""

    prefix: str  # "rollout_is" or "rollout_rs"
    level: str  # token | sequence | geometric
    upper: float
    lower: float
    geometric_fraction_by_rows: bool = False  # verl-old RS: mean over rows; elsewhere token-weighted
    valid_rows_only: bool = False  # xtuner head: seq_* over valid rows
    keep_band: tuple[float, float] | None = None  # (lower, upper) of a mask/RS band: adds masked fractions
    batch_normalize: str | None = None  # "valid" (0.7.x) or "all" (0.6.1) rows for sequence level
    percentiles: bool = False  # verl 0.6.0's p25..p99 of the raw weights


@dataclass(frozen=True)
class VetoSpec:
    """A catastrophic-token veto: a sequence is vetoed when a valid token's ratio leaves (lower, upper)."""

    lower: float | None
    upper: float | None = None
    valid_rows_only: bool = False  # xtuner head divides by valid rows, the others by all rows


@dataclass(frozen=True)
class FamilySpec:
    """What an older family (verl <= 0.7.1, xtuner) computes in place of verl 0.9's IS keys, as plain data."""

    name: str  # the family, for the record only: the engine reads the fields below
    prefix: str  # "rollout_corr/" or "mismatch/"
    blocks: tuple[RatioBlockSpec, ...] = ()
    veto: VetoSpec | None = None
    veto_keys: bool = False  # emit rollout_is_veto_fraction / _catastrophic_token_fraction with an IS block
    veto_keys_always: bool = False  # verl 0.6.1 / 0.7.0: emit them (0.0 when off) even without a block
    offpolicy: str = "rollout_corr"  # verl's 13 keys, "mismatch" (verl 0.6.0's 11), "pack" (xtuner) or "none"
    per_pack: bool = False  # xtuner: metrics per pack (one input file), merged by merge_rollout_is_metrics
    merge_valid_packs_only: bool = False  # xtuner head: the pack merge skips packs with no valid token
    exact_mask: bool = False  # bool-mask arithmetic: no 1e-8 in means, float32 token fractions
    valid_key: bool = False  # xtuner head: `valid` in the IS metrics too
    enabled: bool = True  # verl 0.6.0 with no threshold computes nothing at all
    actor_recomputes_offpolicy: bool = False  # verl <= 0.7.1: the actor recomputes them on the RS-masked batch


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


@dataclass(frozen=True)
class Needs:
    """A field that means something only with another setting (a TIS cap without its TIS type): given with a
    value other than its default while that setting is off, it is refused, as the matching flag is."""

    field: str
    needs: str  # the other setting, as the trainer writes it ("tis_ratio_type=token")
    met: Callable[[Mapping[str, Any]], bool]  # over the resolved (effective) fields


@dataclass(frozen=True)
class Degenerate:
    """A setting the trainer accepts that makes its correction degenerate (bounds reversed, a cap <= 0, a veto that
    can never fire): replayed exactly as the trainer runs it, and led with a warning that names the fields and what
    they do on the dump (`shown_by`, the key that measures it)."""

    fields: tuple[str, ...]  # as the trainer names them, the first one the one to change
    when: Callable[[Mapping[str, Any]], bool]  # over the resolved (effective) fields
    does: str  # what the trainer then does, e.g. "masks every sequence"
    shown_by: str = ""  # the key whose value on the dump says how much it hits (its share masked, …)
    fix: str = ""  # what to set instead ("set geo_mask_low below geo_mask_high")


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def reversed_band(low: str, high: str, does: str, shown_by: str = "",
                  active: Callable[[Mapping[str, Any]], bool] = lambda v: True) -> Degenerate:
    """A band whose lower bound is above its upper one, while the part it bounds runs."""
    def when(v: Mapping[str, Any]) -> bool:
        lower, upper = _number(v.get(low)), _number(v.get(high))
        return active(v) and lower is not None and upper is not None and lower > upper
    return Degenerate((low, high), when, does, shown_by, f"set {low} below {high}")


def cap_not_positive(field: str, does: str, shown_by: str = "",
                     active: Callable[[Mapping[str, Any]], bool] = lambda v: True) -> Degenerate:
    """A cap (or a veto ratio) at or below 0, while the part it belongs to runs."""
    def when(v: Mapping[str, Any]) -> bool:
        value = _number(v.get(field))
        return active(v) and value is not None and value <= 0
    return Degenerate((field,), when, does, shown_by, f"set {field} above 0")


@dataclass(frozen=True)
class ReplayFamily:
    """A replayed trainer: its fields by its own names, how it resolves them, its engine, keys and report names.

    Each lives in a package of its own under `mismatch_cli/trainers/` (or a third party's, through the entry-point
    group `mismatch_cli.trainers`) and `correction.registry` finds it; docs/architecture.md says how to add one.
    """

    name: str  # the `semantics` value
    title: str  # e.g. "TRL 1.16.0 vLLM importance sampling"
    source: str  # upstream file:function at a version or commit
    defaults: Mapping[str, Any]  # the trainer's own field names and their defaults
    kinds: Mapping[str, str]  # each field's TOML kind (tomlconfig.KINDS)
    resolve: Callable[[dict[str, Any]], tuple[Any, dict[str, Any]]]  # fields -> (settings or None, effective)
    describe: Callable[[Mapping[str, Any]], str]  # effective fields -> the first screen's correction line
    lead_keys: tuple[str, ...] = ()  # the keys Key metrics shows first
    concepts: Mapping[str, str] = field(default_factory=dict)  # replay's row concept -> this trainer's key
    traits: Mapping[str, str] = field(default_factory=dict)  # sequence / clamp / reduction / threshold, in words
    # "module:name" of what builds the accumulator of the resolved settings (a class, or a function choosing one
    # by the settings' type), imported only when a run needs it, so listing the trainers never imports torch;
    # it is called as name(settings, device).
    accumulator: str = ""
    keys: str = ""  # the module whose FAMILY (a metrics.model.Family) and METRICS name the keys it logs
    fixes: str = ""  # the module whose FIXES (a correction.fixes.Fixes) is its vocabulary of fixes
    position: int = 1000  # where it is listed (replay's columns, --semantics, the docs): the built-ins first
    needs: tuple[Needs, ...] = ()  # fields that mean something only with another setting on
    degenerate: tuple[Degenerate, ...] = ()  # accepted settings that make the correction degenerate
    # The trainer's own warnings about the given fields (a deprecated field replacing an explicit one), in its words.
    warns: Callable[[Mapping[str, Any]], list[str]] | None = None


@dataclass(frozen=True)
class ResolvedCorrection:
    """A validated configuration: what the engine needs, nothing more."""

    is_level: str | None
    is_threshold: IsThreshold | None
    is_batch_normalize: bool
    rs_options: tuple[RsOption, ...] = field(default_factory=tuple)
    k1_bounds: str = "verl"
    family_spec: FamilySpec | None = None  # an older family's own metric blocks (None for verl 0.8 / 0.9)
    # verl 0.8 counts rollout_is_seq_fraction_high/low on the applied (truncated) per-sequence mean
    # weight; verl 0.9.0 (PR #6806) switched to the raw one.
    seq_fraction_weights: str = "raw"
    # A replayed trainer's resolved settings, folded by its accumulator ("module:Class", ReplayFamily.accumulator);
    # None when the trainer logs nothing for this configuration.
    trainer: Any = None
    trainer_accumulator: str = ""
    replay: bool = False  # a replayed trainer: its own keys only, none of verl's

    @property
    def asymmetric_k1(self) -> tuple[RsOption, ...]:
        """k1 options whose bounds are not reciprocal (where verl's k1 direction bug shows)."""
        return tuple(
            o for o in self.rs_options if o.is_k1 and o.lower is not None and
            not math.isclose(o.lower * o.upper, 1.0, rel_tol=1e-9)
        )
