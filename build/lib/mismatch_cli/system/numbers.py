"""One strict reading of numbers for every flag and config value, and verl's threshold grammar on top of it.

Python's float() reads "0.5_5" as 0.55, "5_0.5" as 50.5 and also takes "nan", "inf" and "1e999";
int() reads "1_0" as 10. Here a number is a plain decimal or scientific literal that is finite and
does not underflow to 0; anything else is a usage error (exit 2) that names the flag or field.
"""

from __future__ import annotations

import math
import re
from typing import Any

from mismatch_cli.errors import UsageError

# A plain decimal or scientific literal: 2, -0.5, .5, 5., 1e-4, 2.5E+3 (no '_', no nan / inf, no hex).
NUMBER_LITERAL = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
INTEGER_LITERAL = re.compile(r"[+-]?[0-9]+")
NUMBER_HINT = "write a plain number such as 2, 0.5 or 1e-4 (no '_' digit separators, nan or inf)"
THRESHOLD_HINT = (
    "write a number (2.0), a band L_U with one '_' between two numbers (0.5_5.0), or several of them "
    "separated by commas (0.5_2.0,0.05)"
)
NONE_WORDS = ("none", "null")


def _describe(value: Any) -> str:
    return f"the {type(value).__name__} {value!r}" if not isinstance(value, str) else repr(value)


def parse_number(value: Any, name: str, hint: str = NUMBER_HINT) -> float:
    """A finite float from an int / float or a plain decimal or scientific literal; else an error naming `name`."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise UsageError(f"{name} must be a number, got {_describe(value)}", hint=hint)
    if isinstance(value, str):
        text = value.strip()
        if not NUMBER_LITERAL.fullmatch(text):
            raise UsageError(f"{name} must be a number, got {value!r}", hint=hint)
        number = float(text)
        mantissa = re.split(r"[eE]", text)[0]
        if number == 0.0 and any(digit in mantissa for digit in "123456789"):
            raise UsageError(f"{name} {value!r} is too small for a float64 (it would be read as 0)", hint=hint)
    else:
        try:
            number = float(value)
        except OverflowError:  # an int beyond float64
            number = math.inf
    if not math.isfinite(number):
        raise UsageError(f"{name} must be a finite number, got {_describe(value)}", hint=hint)
    return number


def parse_integer(value: Any, name: str, low: int, high: int, hint: str) -> int:
    """An integer in [low, high] from an int or a plain integer literal; else an error naming `name`."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise UsageError(f"{name} must be a whole number, got {_describe(value)}", hint=hint)
    if isinstance(value, str):
        if not INTEGER_LITERAL.fullmatch(value.strip()):
            raise UsageError(f"{name} must be a whole number, got {value!r}", hint=hint)
        value = int(value.strip())
    if not low <= value <= high:
        raise UsageError(f"{name} must be between {low} and {high}, got {value}", hint=hint)
    return value


def parse_band(text: str, name: str) -> tuple[float | None, float]:
    """verl's threshold grammar for one spec: `U` (lower None) or `L_U` (exactly one '_' between two numbers)."""
    parts = text.strip().split("_")
    if len(parts) > 2:
        raise UsageError(f"{name} {text!r} has more than one '_' (a band is L_U, e.g. 0.5_5.0)", hint=THRESHOLD_HINT)
    if len(parts) == 1:
        return None, parse_number(parts[0], name, THRESHOLD_HINT)
    bounds = []
    for side, part in zip(("lower", "upper"), parts, strict=True):
        try:
            bounds.append(parse_number(part, name, THRESHOLD_HINT))
        except UsageError as exc:
            raise UsageError(f"{name} {text!r}: the {side} bound {part!r} is not a plain finite number",
                             hint=THRESHOLD_HINT) from exc
    return bounds[0], bounds[1]


def split_specs(text: str) -> list[str]:
    """Comma-separated specs, stripped, empty ones dropped (as verl splits `rollout_rs_threshold`)."""
    return [part.strip() for part in text.split(",") if part.strip()]


def check_threshold_text(text: str, name: str, allow_none: bool = True) -> str:
    """Refuse a threshold string that is not comma-separated `U` / `L_U` specs (or `none`); return it stripped."""
    stripped = text.strip()
    if allow_none and stripped.lower() in NONE_WORDS:
        return stripped
    specs = split_specs(stripped)
    if not specs:
        raise UsageError(f"{name} is empty", hint=THRESHOLD_HINT)
    for spec in specs:
        parse_band(spec, name)
    return stripped


def threshold_value(text: str | None, name: str, allow_none: bool = True) -> float | str | None:
    """A threshold flag as the configuration takes it: a plain number as a float, `none` as None, else the spec."""
    if text is None:
        return None
    stripped = check_threshold_text(text, name, allow_none)
    if allow_none and stripped.lower() in NONE_WORDS:
        return None
    if NUMBER_LITERAL.fullmatch(stripped):
        return parse_number(stripped, name)
    return stripped


__all__ = [
    "NUMBER_HINT",
    "NUMBER_LITERAL",
    "THRESHOLD_HINT",
    "check_threshold_text",
    "parse_band",
    "parse_integer",
    "parse_number",
    "split_specs",
    "threshold_value",
]
