"""The one number format every renderer uses: compact enough that a table never has to split a number.

Rule: integers (counts, and whole floats below 1e9) in full with thousands separators; any other number
with 4 significant digits in plain notation when 1e-3 <= |x| < 1e4 (`0.9996`, `15.76`, `1234`,
`-0.006849`), else with 3 in scientific notation, where the exponent takes the room (`1.15e-05`,
`2.45e+07`, `1.51e+04`). Trailing zeros are dropped only when the number is exact (`0.5`, `1e-04`), so
`1.000` says 1.00044 and `1` says exactly one. A non-integer is at most 9 characters wide.
"""

from __future__ import annotations

import math

DIGITS = 4  # significant digits of a non-integer in plain notation (one fewer in scientific notation)
PLAIN_LOW, PLAIN_HIGH = 1e-3, 10.0**DIGITS  # plain notation inside [PLAIN_LOW, PLAIN_HIGH)
WHOLE = 1e9  # a whole float below this is a count (tokens summed as floats): shown exactly


def format_value(value: float | int | None) -> str:
    """A number as people read it: `null`, integers in full, otherwise 4 significant digits (see module doc)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}" if abs(value) >= 10**4 else str(value)
    if not math.isfinite(value):
        return str(value)
    if value.is_integer() and abs(value) < WHOLE:
        return format_value(int(value))
    rounded = float(f"{value:.{DIGITS - 1}e}")  # the value as it will print, so 9999.7 goes to 1e+04
    if PLAIN_LOW <= abs(rounded) < PLAIN_HIGH:
        text = f"{value:.{DIGITS}g}"
        return text if float(text) == value else f"{value:#.{DIGITS}g}".rstrip(".")
    mantissa, exponent = f"{value:.{DIGITS - 2}e}".split("e")
    if float(f"{mantissa}e{exponent}") == value and "." in mantissa:
        mantissa = mantissa.rstrip("0").rstrip(".")
    return f"{mantissa}e{int(exponent):+03d}"


def format_signed(value: float | int | None) -> str:
    """A change with its sign always shown (`+0.0014`, `-8.33e-04`, `0`); `-` when absent."""
    if value is None:
        return "-"
    text = format_value(value)
    return text if text.startswith(("-", "+")) or value == 0 or not math.isfinite(value) else "+" + text


def format_percent(fraction: float | None, signed: bool = False) -> str:
    """A fraction as a percentage in the same format (`0.002%`, `+40.6%`); `-` when absent or not finite."""
    if fraction is None or not math.isfinite(fraction):
        return "-"
    return (format_signed(fraction * 100) if signed else format_value(fraction * 100)) + "%"


__all__ = ["DIGITS", "format_percent", "format_signed", "format_value"]



def markdown_cell(text: str) -> str:
    """Text as one Markdown table cell: `|` escaped, line breaks as `<br>` (a newline would end the row)."""
    return text.replace("\r\n", "\n").replace("|", "\\|").replace("\n", "<br>")


def one_line(text: str) -> str:
    """A label as one plain terminal line: line breaks, tabs and control codes (a colour escape) shown as escapes."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)
