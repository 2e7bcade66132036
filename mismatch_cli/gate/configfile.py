"""A mismatch config file (`mismatch.toml`, or `[tool.mismatch]` in pyproject.toml): its tables, each declared by
the layer that owns it ([correction] by the correction model, [check] here), read by system.tomlconfig."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mismatch_cli.correction import correction_table
from mismatch_cli.system import tomlconfig

# The [check] table's fields and their TOML kinds.
CHECK_FIELDS: dict[str, str] = {"fail_on": "rules", "fail-on": "rules", "baseline": "string", "missing": "string"}


def config_tables() -> dict[str, dict[str, str]]:
    """Every table a config file may hold, with its fields' kinds."""
    return {"correction": correction_table(), "check": CHECK_FIELDS}


def load_config(path: str | Path) -> dict[str, dict[str, Any]]:
    """Every table of a config file, checked (unknown tables and keys, value types); absent tables are empty."""
    return tomlconfig.load_config(path, config_tables())


def load_table(path: str | Path, name: str) -> dict[str, Any]:
    """The checked `[name]` table (or `[tool.mismatch.name]`) of a config file, empty when absent."""
    return load_config(path)[name]


__all__ = ["CHECK_FIELDS", "config_tables", "load_config", "load_table"]
