"""The one reader of mismatch's TOML configuration: the tables and their typed fields come from the layers that own
them (`correction.correction_table()` for [correction], `gate.thresholds.CHECK_FIELDS` for [check]).

A config file is `mismatch.toml` (tables at the top level) or a `pyproject.toml` (tables under
`[tool.mismatch]`; the file's other tables belong to other tools and are ignored). An unknown table
or key, or a value of the wrong type, is a usage error (exit 2) naming the file, table, key and the
expected type, with the likely intended name when one is close.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from mismatch_cli.errors import UsageError, close_names, did_you_mean
from mismatch_cli.system.numbers import check_threshold_text, parse_number

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

NONE_WORDS = ("none", "null")  # TOML has no null: these strings switch a field off


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_number_text(value: Any) -> bool:
    if not isinstance(value, str):
        return False
    if value.strip().lower() in NONE_WORDS:
        return True
    try:
        parse_number(value, "value")
    except UsageError:
        return False
    return True


def _is_threshold_text(value: Any) -> bool:
    try:
        check_threshold_text(value, "value")
    except UsageError:
        return False
    return True


# kind -> (what the value must be, in words; the test it must pass)
KINDS: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "bool": ("a boolean (true or false, without quotes)", lambda v: isinstance(v, bool)),
    "string": ("a string (in quotes)", lambda v: isinstance(v, str)),
    "string or bool": ("a string (in quotes) or a boolean", lambda v: isinstance(v, (str, bool))),
    "number": ("a finite number (or \"none\")", lambda v: _is_number(v) or _is_number_text(v)),
    "threshold": (
        "a finite number, a threshold string of plain numbers such as \"2.0\", \"0.5_5.0\" or \"2.0,0.5\", "
        "or a list of two numbers",
        lambda v: isinstance(v, bool) or _is_number(v) or (isinstance(v, str) and _is_threshold_text(v))
        or (isinstance(v, (list, tuple)) and len(v) == 2 and all(_is_number(x) for x in v)),
    ),
    "rules": ("a string or a list of strings", lambda v: isinstance(v, str) or (
        isinstance(v, list) and all(isinstance(x, str) for x in v))),
}
EXAMPLES = {
    "bool": "{key} = true or {key} = false (no quotes)",
    "string": '{key} = "..."',
    "string or bool": '{key} = "..."',
    "number": "{key} = 0.5",
    "threshold": '{key} = 2.0 or {key} = "0.5_5.0"',
    "rules": '{key} = ["rollout_corr/kl<=0.01"]',
}

# A config file's tables: table name -> field name -> kind (a key of KINDS).
Tables = Mapping[str, Mapping[str, str]]


def _close(name: str, known: list[str], spelled: str = "{}") -> str:
    found = did_you_mean(name, known, spelled=spelled)
    return f"{found} " if found else ""


def check_value(kind: str, key: str, value: Any, where: str) -> None:
    """Raise a usage error naming `where` and `key` when `value` is not of the field's kind."""
    words, fits = KINDS[kind]
    if not fits(value):
        shown = repr(value) if not isinstance(value, str) else f'the string "{value}"'
        example = EXAMPLES[kind].format(key=key)
        if kind == "bool" and isinstance(value, str) and value.strip().lower() in ("true", "false"):
            example = f"{key} = {value.strip().lower()} (no quotes)"
        raise UsageError(f"{where} {key} must be {words}, got {shown}", hint=f"write {example}")


def check_fields(fields: Mapping[str, Any], table: Mapping[str, str], where: str) -> None:
    """Check the type of every set (non-None) field a table declares, as a config file's fields are checked."""
    for key, value in fields.items():
        if value is not None and key in table:
            check_value(table[key], key, value, where)


def _root(data: dict[str, Any], path: Path, tables: Tables) -> tuple[dict[str, Any], str]:
    """Our part of the file and how its tables are spelled: `[tool.mismatch.X]` or `[X]`."""
    tool = data.get("tool")
    if isinstance(tool, dict) and "mismatch" in tool:
        ours = [k for k in data if k in tables]
        if ours:
            raise UsageError(f"{path} has both [{ours[0]}] and [tool.mismatch]",
                             hint="keep one of them: [tool.mismatch.*] in pyproject.toml, top-level tables elsewhere")
        if not isinstance(tool["mismatch"], dict):
            raise UsageError(f"{path}: tool.mismatch must be a table", hint="write [tool.mismatch.check] etc.")
        return tool["mismatch"], "tool.mismatch."
    if path.name == "pyproject.toml":
        close = close_names("mismatch", tool) if isinstance(tool, dict) else []
        found = f"[tool.{close[0]}] looks misspelled; " if close else ""
        raise UsageError(f"{path} has no [tool.mismatch] table",
                         hint=f"{found}put the settings under [tool.mismatch.correction] / [tool.mismatch.check]")
    # [tool.*] tables of a standalone file belong to other tools, as in pyproject.toml.
    return {k: v for k, v in data.items() if k != "tool"}, ""


def load_config(path: str | Path, tables: Tables) -> dict[str, dict[str, Any]]:
    """Every table of a config file, checked against `tables` (unknown tables and keys, value types); absent
    tables are empty."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise UsageError(f"cannot read config {path}: {exc.strerror}", hint="check the --config path") from None
    except UnicodeDecodeError:
        raise UsageError(f"{path}: not a text (UTF-8) file", hint="pass a TOML file to --config") from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{path}: invalid TOML: {exc}", hint="fix the TOML syntax") from None
    root, prefix = _root(data, path, tables)
    found: dict[str, dict[str, Any]] = {name: {} for name in tables}
    for name, table in root.items():
        if name not in tables:
            homes = [t for t, fields in tables.items() if name in fields]
            if homes:
                raise UsageError(f"{path}: {name} must be inside a table, found it at the top level",
                                 hint=f"put it under [{prefix}{homes[0]}]")
            what = "table" if isinstance(table, dict) else "key"
            known = ", ".join(f"[{prefix}{t}]" for t in tables)
            raise UsageError(f"{path}: unknown {what} [{prefix}{name}]" if what == "table"
                             else f"{path}: unknown top-level key {prefix}{name}",
                             hint=f"{_close(name, list(tables), f'[{prefix}{{}}]')}a mismatch config has {known}")
        if not isinstance(table, dict):
            raise UsageError(f"{path}: {prefix}{name} must be a table", hint=f"write [{prefix}{name}] on its own line")
        fields = tables[name]
        for key, value in table.items():
            if key not in fields:
                raise UsageError(f"{path}: unknown key {key} in [{prefix}{name}]",
                                 hint=f"{_close(key, list(fields))}[{prefix}{name}] takes {', '.join(fields)}")
            check_value(fields[key], key, value, f"{path}: [{prefix}{name}]")
        found[name] = dict(table)
    return found


__all__ = ["KINDS", "Tables", "check_fields", "check_value", "load_config"]
