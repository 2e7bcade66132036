"""verl's `algorithm.rollout_correction` configuration: validation, threshold grammar and presets."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from mismatch_cli.errors import ConfigError
from mismatch_cli.numbers import THRESHOLD_HINT, parse_band, parse_number, split_specs

SAFETY_BOUND = 20.0

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


class _Unset:
    """A field the caller did not give: a preset's value, else verl's default, fills it."""

    def __repr__(self) -> str:
        return "UNSET"


UNSET: Any = _Unset()
# Semantics that take verl's `algorithm.rollout_correction` fields directly (the others: `family_fields`).
VERL_FAMILIES = ("verl", "verl-0.8")
VERL_DEFAULTS: dict[str, Any] = {
    "rollout_is": None,
    "rollout_is_threshold": 2.0,
    "rollout_is_batch_normalize": False,
    "rollout_rs": None,
    "rollout_rs_threshold": None,
    "bypass_mode": False,
    "loss_type": "ppo_clip",
    "k1_bounds": "verl",  # "verl" reproduces verl's inverted k1 bounds; "ratio" keeps L <= rho <= U
}


@dataclass(frozen=True)
class CorrectionConfig:
    """The effective correction configuration (verl field names, values as the user gave them).

    With `preset`, every field not given takes the preset's value; fields given override it.
    """

    rollout_is: str | None = UNSET
    rollout_is_threshold: Any = UNSET
    rollout_is_batch_normalize: bool = UNSET
    rollout_rs: str | None = UNSET
    rollout_rs_threshold: Any = UNSET
    bypass_mode: bool = UNSET
    loss_type: str = UNSET
    k1_bounds: str = UNSET
    preset: str | None = None
    # An older family (mismatch_cli.legacy.FAMILIES) and its upstream fields, verbatim.
    semantics: str = "verl"
    family_fields: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        given = {name for name in VERL_DEFAULTS if getattr(self, name) is not UNSET}
        if self.semantics not in VERL_FAMILIES and (given or self.preset is not None):
            named = ", ".join(sorted(given)) or "preset"
            raise ConfigError(
                f"--semantics {self.semantics} takes its own upstream fields, not {named}",
                hint="pass them as CorrectionConfig(semantics=..., family_fields={...})",
            )
        base = get_preset(self.preset).config if self.preset is not None else None
        for name, default in VERL_DEFAULTS.items():
            if getattr(self, name) is UNSET:
                object.__setattr__(self, name, getattr(base, name) if base is not None else default)

    def to_dict(self) -> dict[str, Any]:
        """The configuration as a JSON-ready mapping."""
        if self.semantics not in VERL_FAMILIES:
            from mismatch_cli.legacy import effective_fields

            return {"semantics": self.semantics, **effective_fields(self.semantics, self.family_fields)}
        return {"semantics": self.semantics, "preset": self.preset,
                **{name: getattr(self, name) for name in VERL_DEFAULTS}}


@dataclass(frozen=True)
class ResolvedCorrection:
    """A validated configuration: what the engine needs, nothing more."""

    is_level: str | None
    is_threshold: IsThreshold | None
    is_batch_normalize: bool
    rs_options: tuple[RsOption, ...] = field(default_factory=tuple)
    k1_bounds: str = "verl"
    legacy: Any = None  # a LegacySpec for the older families (mismatch_cli.legacy)
    # verl 0.8 counts rollout_is_seq_fraction_high/low on the applied (truncated) per-sequence mean
    # weight; verl 0.9.0 (PR #6806) switched to the raw one.
    seq_fraction_weights: str = "raw"

    @property
    def asymmetric_k1(self) -> tuple[RsOption, ...]:
        """k1 options whose bounds are not reciprocal (where verl's k1 direction bug shows)."""
        return tuple(
            o for o in self.rs_options if o.is_k1 and o.lower is not None and
            not math.isclose(o.lower * o.upper, 1.0, rel_tol=1e-9)
        )


IS_THRESHOLD_HINT = "give a number such as 2.0 (TIS) or a band L_U such as 0.5_5.0 (IcePop)"


def parse_is_threshold(spec: Any) -> IsThreshold:
    """Parse `rollout_is_threshold` as verl does (a number = TIS, `L_U` = IcePop), with strict numbers."""
    if isinstance(spec, bool):
        raise ConfigError(
            "rollout_is_threshold must be specified as a float or a string threshold specification, "
            "not a boolean.",
            hint=IS_THRESHOLD_HINT,
        )
    lower: float | None
    if isinstance(spec, (int, float)):
        upper, lower = parse_number(spec, "rollout_is_threshold", IS_THRESHOLD_HINT), None
    elif isinstance(spec, str):
        if not spec.strip():
            raise ConfigError("rollout_is_threshold must not be an empty string.", hint=IS_THRESHOLD_HINT)
        lower, upper = parse_band(spec, "rollout_is_threshold")
    else:
        raise ConfigError("rollout_is_threshold must be a float or a string threshold specification, "
                          f"got {type(spec).__name__} {spec!r}.", hint=IS_THRESHOLD_HINT)
    if not upper > 0:
        raise ConfigError(f"rollout_is_threshold upper bound must be positive, got {upper}.", hint=IS_THRESHOLD_HINT)
    if lower is not None:
        if not lower > 0:
            raise ConfigError(f"rollout_is_threshold lower bound must be positive, got {lower}.",
                              hint=IS_THRESHOLD_HINT)
        if lower > upper:
            raise ConfigError(f"rollout_is_threshold lower bound must be <= upper bound, got {spec!r}.",
                              hint="write the band as L_U, lower first, e.g. 0.5_5.0")
    return IsThreshold(upper=upper, lower=lower)


def parse_rs_options(rollout_rs: Any) -> list[str]:
    """Split, strip, de-duplicate and validate the comma-chained `rollout_rs` options."""
    if not isinstance(rollout_rs, str):
        raise ConfigError("rollout_rs must be a non-empty string (comma separated for multiple options).",
                          hint="e.g. --rs seq_mean_k1 or rollout_rs = \"seq_mean_k1,token_k2\"")
    options = [part.strip() for part in rollout_rs.split(",") if part.strip()]
    if not options:
        raise ConfigError("rollout_rs must contain at least one valid option.", hint="e.g. --rs seq_mean_k1")
    unique: list[str] = []
    for option in options:
        if option not in RS_OPTIONS:
            raise ConfigError(
                f"Invalid rollout_rs option: {option}. Must be one of {sorted(RS_OPTIONS)}.",
                hint=_legacy_hint(option),
            )
        if option not in unique:
            unique.append(option)
    return unique


def _legacy_hint(option: str) -> str:
    if option in ("token", "sequence", "geometric"):
        return (
            f"'{option}' is the verl <= 0.7.0 RS API, removed in verl 0.7.1; use seq_mean_k1 (geometric), "
            "seq_sum_k1 (sequence) or token_k1 (token)"
        )
    return "see `mismatch presets` for valid configurations"


RS_THRESHOLD_HINT = "e.g. --rs-threshold 0.999_1.001 for a k1 option, 0.01 for k2 / k3, one per option with commas"


def parse_rs_thresholds(options: list[str], spec: Any, check_order: bool = True) -> tuple[RsOption, ...]:
    """Parse `rollout_rs_threshold` (one spec shared by all options, or one per option)."""
    if spec is None:
        raise ConfigError(
            "rollout_rs_threshold must be explicitly provided when rollout_rs is enabled. "
            "Set rollout_rs_threshold to the desired threshold value.",
            hint="add --rs-threshold, e.g. 0.999_1.001 for seq_mean_k1",
        )
    if isinstance(spec, bool):
        raise ConfigError("rollout_rs_threshold must be a string or numeric value, not a boolean.",
                          hint=RS_THRESHOLD_HINT)
    if isinstance(spec, (int, float)):
        specs = [repr(parse_number(spec, "rollout_rs_threshold", THRESHOLD_HINT))]
    elif isinstance(spec, str):
        specs = split_specs(spec)
    else:
        raise ConfigError(
            "rollout_rs_threshold must be a string or numeric value specifying per-option thresholds.",
            hint=RS_THRESHOLD_HINT,
        )
    if not specs:
        raise ConfigError("rollout_rs_threshold must contain at least one threshold value.", hint=RS_THRESHOLD_HINT)
    if len(specs) not in (1, len(options)):
        raise ConfigError(
            "rollout_rs_threshold expects either one threshold shared by all options or exactly "
            f"{len(options)} thresholds to match the provided rollout_rs options.",
            hint=f"give one threshold, or one per option ({len(options)}) separated by commas, for "
            f"--rs {','.join(options)}",
        )
    if len(specs) == 1:
        specs = specs * len(options)
    parsed: list[RsOption] = []
    for option, text in zip(options, specs, strict=True):
        lower, upper = parse_band(text, f"rollout_rs_threshold of {option}")
        if option.endswith("k1"):
            if lower is None:
                if upper == 0:
                    raise ConfigError(f"Thresholds for option '{option}' must be positive, got {text}.",
                                      hint=RS_THRESHOLD_HINT)
                lower = 1.0 / upper
            if not (lower > 0 and upper > 0):
                raise ConfigError(f"Thresholds for option '{option}' must be positive, got {text}.",
                                  hint=RS_THRESHOLD_HINT)
            if check_order and lower > upper:  # verl 0.7.1 does not check (and rejects everything)
                raise ConfigError(
                    f"Thresholds for option '{option}' must be lower <= upper, got {text}.",
                    hint="a single k1 value U means the band 1/U..U, so it must be >= 1",
                )
            parsed.append(RsOption(option, upper=upper, lower=lower))
        else:
            if lower is not None:
                raise ConfigError(
                    f"rollout_rs_threshold for option '{option}' must provide a single upper bound "
                    f"without '_'. Received '{text}'.",
                    hint=f"{option} takes one positive number, e.g. 0.01",
                )
            if not upper > 0:
                raise ConfigError(f"Threshold for option '{option}' must be positive, got {text}.",
                                  hint=f"{option} takes one positive number, e.g. 0.01")
            parsed.append(RsOption(option, upper=upper))
    return tuple(parsed)


def resolve(config: CorrectionConfig) -> ResolvedCorrection:
    """Validate a configuration the way verl does at compute time and return what the engine needs."""
    from mismatch_cli.tomlconfig import check_fields

    own = {name: getattr(config, name) for name in CONFIG_FIELDS}
    check_fields(own if config.semantics in VERL_FAMILIES else config.family_fields, "CorrectionConfig:")
    if config.semantics not in VERL_FAMILIES:
        from mismatch_cli.legacy import resolve_family

        return resolve_family(config.semantics, config.family_fields)[0]
    if config.k1_bounds not in ("verl", "ratio"):
        raise ConfigError(f"k1 bounds must be 'verl' or 'ratio', got {config.k1_bounds!r}.",
                          hint="use --k1-bounds verl (as verl) or ratio (L <= ratio <= U)")
    if config.loss_type not in ("ppo_clip", "reinforce"):
        raise ConfigError(f"loss_type must be 'ppo_clip' or 'reinforce', got {config.loss_type!r}.",
                          hint='write loss_type = "ppo_clip" or "reinforce"')
    is_level: str | None = None
    is_threshold: IsThreshold | None = None
    # verl skips IS silently when the threshold is None even if rollout_is is set.
    if config.rollout_is is not None and config.rollout_is_threshold is not None:
        if config.rollout_is not in IS_LEVELS:
            raise ConfigError(
                f"Invalid rollout_is: {config.rollout_is}. Must be one of {set(IS_LEVELS)}.",
                hint="use --is token, --is sequence or --is none",
            )
        is_level = config.rollout_is
        is_threshold = parse_is_threshold(config.rollout_is_threshold)
    rs_options: tuple[RsOption, ...] = ()
    if config.rollout_rs is not None:
        if config.rollout_rs_threshold is None:
            parse_rs_thresholds([], None)
        # verl 0.9.0 added the lower <= upper check on k1 bands (PR #7188); 0.8 rejects everything instead.
        rs_options = parse_rs_thresholds(parse_rs_options(config.rollout_rs), config.rollout_rs_threshold,
                                         check_order=config.semantics != "verl-0.8")
    return ResolvedCorrection(
        is_level=is_level,
        is_threshold=is_threshold,
        is_batch_normalize=bool(config.rollout_is_batch_normalize),
        rs_options=rs_options,
        k1_bounds=config.k1_bounds,
        seq_fraction_weights="applied" if config.semantics == "verl-0.8" else "raw",
    )


@dataclass(frozen=True)
class Preset:
    """A named verl preset (`RolloutCorrectionConfig.<name>()` with its default arguments)."""

    name: str
    config: CorrectionConfig
    summary: str


def _preset(name: str, summary: str, **fields: Any) -> Preset:
    return Preset(name, CorrectionConfig(**{**VERL_DEFAULTS, **fields}), summary)


GEO = "0.999_1.001"
PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        _preset("decoupled_token_is", "token-level TIS, U=2", rollout_is="token"),
        _preset("decoupled_seq_is", "sequence-level TIS, U=2", rollout_is="sequence"),
        _preset("decoupled_token_icepop", "token-level IcePop band [0.5, 5]",
                rollout_is="token", rollout_is_threshold="0.5_5.0"),
        _preset("decoupled_seq_is_rs", "sequence TIS U=2 + seq_sum_k1 RS 0.5_2.0",
                rollout_is="sequence", rollout_rs="seq_sum_k1", rollout_rs_threshold="0.5_2.0"),
        _preset("decoupled_geo_rs", "Geo-RS: seq_mean_k1 0.999_1.001, no IS",
                rollout_rs="seq_mean_k1", rollout_rs_threshold=GEO),
        _preset("decoupled_geo_rs_seq_tis", "Geo-RS + sequence TIS U=2",
                rollout_is="sequence", rollout_rs="seq_mean_k1", rollout_rs_threshold=GEO),
        _preset("decoupled_geo_rs_token_tis", "Geo-RS + token TIS U=2",
                rollout_is="token", rollout_rs="seq_mean_k1", rollout_rs_threshold=GEO),
        _preset("decoupled_k3_rs", "seq_mean_k3 RS 0.01, no IS", rollout_rs="seq_mean_k3", rollout_rs_threshold=0.01),
        _preset("decoupled_k3_rs_seq_tis", "seq_mean_k3 RS 0.01 + sequence TIS U=2",
                rollout_is="sequence", rollout_rs="seq_mean_k3", rollout_rs_threshold=0.01),
        _preset("decoupled_k3_rs_token_tis", "seq_mean_k3 RS 0.01 + token TIS U=2",
                rollout_is="token", rollout_rs="seq_mean_k3", rollout_rs_threshold=0.01),
        _preset("bypass_ppo_clip", "bypass mode, PPO clip, metrics only", bypass_mode=True),
        _preset("bypass_ppo_clip_geo_rs", "bypass mode + Geo-RS 0.999_1.001",
                bypass_mode=True, rollout_rs="seq_mean_k1", rollout_rs_threshold=GEO),
        _preset("bypass_ppo_clip_k3_rs", "bypass mode + seq_mean_k3 RS 0.01",
                bypass_mode=True, rollout_rs="seq_mean_k3", rollout_rs_threshold=0.01),
        _preset("bypass_pg_is", "bypass REINFORCE + sequence TIS U=2",
                bypass_mode=True, loss_type="reinforce", rollout_is="sequence"),
        _preset("bypass_pg_token_icepop", "bypass REINFORCE + token IcePop [0.5, 5]",
                bypass_mode=True, loss_type="reinforce", rollout_is="token", rollout_is_threshold="0.5_5.0"),
        _preset("bypass_pg_geo_rs", "bypass REINFORCE + Geo-RS 0.999_1.001",
                bypass_mode=True, loss_type="reinforce", rollout_rs="seq_mean_k1", rollout_rs_threshold=GEO),
        _preset("bypass_pg_geo_rs_seq_tis", "bypass REINFORCE + Geo-RS + sequence TIS U=2",
                bypass_mode=True, loss_type="reinforce", rollout_is="sequence",
                rollout_rs="seq_mean_k1", rollout_rs_threshold=GEO),
        _preset("bypass_pg_geo_rs_token_tis", "bypass REINFORCE + Geo-RS + token TIS U=2",
                bypass_mode=True, loss_type="reinforce", rollout_is="token",
                rollout_rs="seq_mean_k1", rollout_rs_threshold=GEO),
        _preset("disabled", "metrics only (verl's default)"),
    )
}

CONFIG_FIELDS = (
    "rollout_is",
    "rollout_is_threshold",
    "rollout_is_batch_normalize",
    "rollout_rs",
    "rollout_rs_threshold",
    "bypass_mode",
    "loss_type",
    "k1_bounds",
    "preset",
)


def get_preset(name: str) -> Preset:
    """Look up a preset by name, with a helpful error for unknown or outdated names."""
    if not isinstance(name, str) or name not in PRESETS:
        raise ConfigError(
            f"unknown preset '{name}'",
            hint="run `mismatch presets` for the 19 verl presets",
        )
    return PRESETS[name]


def build_config(overrides: dict[str, Any], preset: str | None = None, semantics: str = "verl") -> CorrectionConfig:
    """Start from a preset (or verl's YAML defaults) and apply explicitly given fields."""
    unknown = sorted(set(overrides) - set(CONFIG_FIELDS))
    if unknown:
        raise ConfigError(
            f"unknown correction field(s) {', '.join(unknown)}",
            hint=f"the [correction] table takes {', '.join(CONFIG_FIELDS)}",
        )
    fields = {k: v for k, v in overrides.items() if k != "preset"}
    return CorrectionConfig(preset=preset or overrides.get("preset") or None, semantics=semantics, **fields)
