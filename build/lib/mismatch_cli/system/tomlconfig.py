"""The one reader of mismatch's TOML configuration: every table and field declared once, with its type.

A config file is `mismatch.toml` (tables at the top level) or a `pyproject.toml` (tables under
`[tool.mismatch]`; the file's other tables belong to other tools and are ignored). An unknown table
or key, or a value of the wrong type, is a usage error (exit 2) naming the file, table, key and the
expected type, with the likely intended name when one is close.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mismatch_cli.correction.replay import replay_fields
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

# Every field of every family's [correction] (upstream names, verbatim), and of [check].
CORRECTION_FIELDS: dict[str, str] = {
    "semantics": "string",
    "preset": "string",
    "rollout_is": "string or bool",  # verl: token | sequence; verl 0.6.0: whether the loss uses the weights
    "rollout_is_threshold": "threshold",
    "rollout_is_batch_normalize": "bool",
    "rollout_rs": "string",
    "rollout_rs_threshold": "threshold",
    "bypass_mode": "bool",
    "loss_type": "string",
    "k1_bounds": "string",
    "mask_dtype": "string",
    "rollout_rs_threshold_lower": "number",
    "rollout_token_veto_threshold": "number",
    "use_policy_gradient": "bool",
    "rollout_is_level": "string",
    "rollout_is_mode": "string",
    "rollout_is_threshold_lower": "number",
    "rollout_is_veto_threshold": "threshold",  # verl 0.6.0: a number; xtuner: (upper, lower)
    "rollout_is_mask_threshold": "threshold",
}
CORRECTION_FIELDS.update(replay_fields())  # each replayed trainer's own fields (correction/replay.py)
CHECK_FIELDS: dict[str, str] = {"fail_on": "rules", "fail-on": "rules", "baseline": "string", "missing": "string"}
TABLES: dict[str, dict[str, str]] = {"correction": CORRECTION_FIELDS, "check": CHECK_FIELDS}


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


def check_fields(fields: dict[str, Any], where: str) -> None:
    """Check the type of every set (non-None) correction field, as a config file's fields are checked."""
    for key, value in fields.items():
        if value is not None and key in CORRECTION_FIELDS:
            check_value(CORRECTION_FIELDS[key], key, value, where)


def _root(data: dict[str, Any], path: Path) -> tuple[dict[str, Any], str]:
    """Our part of the file and how its tables are spelled: `[tool.mismatch.X]` or `[X]`."""
    tool = data.get("tool")
    if isinstance(tool, dict) and "mismatch" in tool:
        ours = [k for k in data if k in TABLES]
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


def load_config(path: str | Path) -> dict[str, dict[str, Any]]:
    """Every table of a config file, checked (unknown tables and keys, value types); absent tables are empty."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise UsageError(f"cannot read config {path}: {exc.strerror}", hint="check the --config path") from None
    except UnicodeDecodeError:
        raise UsageError(f"{path}: not a text (UTF-8) file", hint="pass a TOML file to --config") from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{path}: invalid TOML: {exc}", hint="fix the TOML syntax") from None
    root, prefix = _root(data, path)
    tables: dict[str, dict[str, Any]] = {name: {} for name in TABLES}
    for name, table in root.items():
        if name not in TABLES:
            homes = [t for t, fields in TABLES.items() if name in fields]
            if homes:
                raise UsageError(f"{path}: {name} must be inside a table, found it at the top level",
                                 hint=f"put it under [{prefix}{homes[0]}]")
            what = "table" if isinstance(table, dict) else "key"
            known = ", ".join(f"[{prefix}{t}]" for t in TABLES)
            raise UsageError(f"{path}: unknown {what} [{prefix}{name}]" if what == "table"
                             else f"{path}: unknown top-level key {prefix}{name}",
                             hint=f"{_close(name, list(TABLES), f'[{prefix}{{}}]')}a mismatch config has {known}")
        if not isinstance(table, dict):
            raise UsageError(f"{path}: {prefix}{name} must be a table", hint=f"write [{prefix}{name}] on its own line")
        fields = TABLES[name]
        for key, value in table.items():
            if key not in fields:
                raise UsageError(f"{path}: unknown key {key} in [{prefix}{name}]",
                                 hint=f"{_close(key, list(fields))}[{prefix}{name}] takes {', '.join(fields)}")
            check_value(fields[key], key, value, f"{path}: [{prefix}{name}]")
        tables[name] = dict(table)
    return tables


def load_table(path: str | Path, name: str) -> dict[str, Any]:
    """The checked `[name]` table (or `[tool.mismatch.name]`) of a config file, empty when absent."""
    return load_config(path)[name]


__all__ = ["CHECK_FIELDS", "CORRECTION_FIELDS", "KINDS", "TABLES", "check_fields", "check_value", "load_config",
           "load_table"]
