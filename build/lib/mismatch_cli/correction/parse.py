"""Parsing of the correction fields' values: verl's threshold grammar, other families' numbers and switches.

Messages name config fields (`rollout_is_threshold`), never command-line flags: the CLI maps them.
"""

from __future__ import annotations

import math
from typing import Any

from mismatch_cli.correction.model import RS_OPTIONS, IsThreshold, RsOption
from mismatch_cli.errors import ConfigError, did_you_mean
from mismatch_cli.system.numbers import THRESHOLD_HINT, parse_band, parse_number, split_specs

IS_THRESHOLD_HINT = "give a number such as 2.0 (TIS) or a band L_U such as 0.5_5.0 (IcePop)"
RS_THRESHOLD_HINT = ('e.g. rollout_rs_threshold = "0.999_1.001" for a k1 option, 0.01 for k2 / k3, one per option '
                     "with commas")


def unknown_fields(family: str, unknown: list[str], known: tuple[str, ...] | list[str],
                   homes: str = "") -> ConfigError:
    """The one refusal of fields a family does not have (command line, TOML and library alike), exit 2."""
    close = did_you_mean(unknown[0], known)
    noun = "field" if len(unknown) == 1 else "fields"
    where = f" ({homes})" if homes else ""
    return ConfigError(f"unknown {noun} {', '.join(unknown)} for semantics {family}{where}",
                       hint=f"{close + ' ' if close else ''}semantics {family} takes {', '.join(known)}")


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
                          hint='e.g. rollout_rs = "seq_mean_k1" or "seq_mean_k1,token_k2"')
    options = [part.strip() for part in rollout_rs.split(",") if part.strip()]
    if not options:
        raise ConfigError("rollout_rs must contain at least one valid option.", hint='e.g. rollout_rs = "seq_mean_k1"')
    unique: list[str] = []
    for option in options:
        if option not in RS_OPTIONS:
            raise ConfigError(
                f"Invalid rollout_rs option: {option}. Must be one of {', '.join(sorted(RS_OPTIONS))}.",
                hint=_old_rs_hint(option),
            )
        if option not in unique:
            unique.append(option)
    return unique


def _old_rs_hint(option: str) -> str:
    if option in ("token", "sequence", "geometric"):
        return (
            f"'{option}' is the verl <= 0.7.0 RS API, removed in verl 0.7.1; use seq_mean_k1 (geometric), "
            "seq_sum_k1 (sequence) or token_k1 (token)"
        )
    return did_you_mean(option, sorted(RS_OPTIONS), "see `mismatch presets` for valid configurations")


def require_rs_threshold(spec: Any) -> None:
    """Refuse RS without `rollout_rs_threshold`, with verl's message."""
    if spec is None:
        raise ConfigError(
            "rollout_rs_threshold must be explicitly provided when rollout_rs is enabled. "
            "Set rollout_rs_threshold to the desired threshold value.",
            hint='set rollout_rs_threshold, e.g. "0.999_1.001" for seq_mean_k1',
        )


def parse_rs_thresholds(options: list[str], spec: Any, check_order: bool = True) -> tuple[RsOption, ...]:
    """Parse `rollout_rs_threshold` (one spec shared by all options, or one per option)."""
    require_rs_threshold(spec)
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
            f"rollout_rs = \"{','.join(options)}\"",
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


def plain_number(name: str, value: Any, family: str) -> float:
    """A plain number for one of an older family's numeric fields (strict: no '_', nan or inf)."""
    hint = f"{family} takes one plain number for {name} (e.g. 2.0); IcePop bands L_U need semantics verl"
    return parse_number(value, name, hint)


def positive_number(name: str, value: Any, family: str) -> float:
    """A positive threshold of verl <= 0.7.1, which compare it with 0 first (a string is a TypeError there)."""
    if isinstance(value, str):
        raise ConfigError(
            f"{name} must be a number in {family} (got the string {value!r}; '<=' not supported between "
            "instances of 'str' and 'int')",
            hint="IcePop bands like 0.5_5.0 need semantics verl (0.9)",
        )
    number = 1.0 if value is True else plain_number(name, value, family)  # True is 1.0 in these versions
    if not number > 0:
        raise ConfigError(f"{name} must be positive, got {number}.", hint=f"give {name} a positive number, e.g. 2.0")
    return number


def nonzero_upper(name: str, upper: float, family: str) -> float:
    """An upper bound whose reciprocal is the implied lower bound (U = 0 is a ZeroDivisionError upstream)."""
    if upper == 0:
        raise ConfigError(f"{name} 0 leaves no lower bound 1/U ({family} divides by it)",
                          hint=f"give {name} a positive number, or set the lower bound explicitly")
    return upper


def pair(name: str, value: Any) -> tuple[float, float] | None:
    """An xtuner (upper, lower) tuple, from a list or from text such as "2.0,0.5"."""
    if value is None:
        return None
    if isinstance(value, str):
        value = [part for part in value.split(",") if part.strip()]
    hint = f"give {name} as two numbers in xtuner's (upper, lower) order, e.g. 2.0,0.5"
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        raise ConfigError(
            f"1 validation error for RolloutImportanceSamplingConfig: {name} must be a pair (upper, lower), "
            f"got {value!r}",
            hint=hint,
        )
    return parse_number(value[0], f"{name} upper", hint), parse_number(value[1], f"{name} lower", hint)


def threshold_log(value: float) -> float:
    """log of a threshold as upstream computes it (a float32 tensor); -inf for 0."""
    if not value > 0:
        return -math.inf
    import numpy as np  # here, not at import: `mismatch --help` must not load numpy (tests/test_cli.py)

    return float(np.log(np.float32(value)))


def is_unset(value: Any) -> bool:
    """A replayed trainer's field left unset: None, or the strings none, null or '' (TOML has no null)."""
    return value is None or (isinstance(value, str) and value.strip().lower() in ("none", "null", ""))


def field_bool(name: str, value: Any, optional: bool = False) -> bool | None:
    """A true / false field (the strings "true" / "false" too), None when unset and `optional`."""
    if optional and is_unset(value):
        return None
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    if not isinstance(value, bool):
        raise ConfigError(f"{name} must be true or false, got {value!r}", hint=f"write {name}=true")
    return value


def field_number(name: str, value: Any, example: float, optional: bool = False) -> float | None:
    """A plain finite number (never a bool), None when unset and `optional`; the hint writes `example`."""
    hint = f"write {name}={example}" + (f" or {name}=none" if optional else "")
    if is_unset(value):
        if optional:
            return None
        raise ConfigError(f"{name} must be a number, got {value!r}", hint=hint)
    if isinstance(value, bool):
        raise ConfigError(f"{name} must be a number{' or none' if optional else ''}, got {value!r}", hint=hint)
    return parse_number(value, name, hint)
