"""Read one table of a mismatch TOML file (also under [tool.mismatch] in pyproject.toml)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from mismatch_cli.errors import UsageError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def load_table(path: str | Path, name: str) -> dict[str, Any]:
    """The `[name]` table (or `[tool.mismatch.name]`) of a TOML file, empty when absent."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise UsageError(f"cannot read config {path}: {exc.strerror}", hint="check the --config path") from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{path}: invalid TOML: {exc}", hint="fix the TOML syntax") from None
    table = data.get(name, data.get("tool", {}).get("mismatch", {}).get(name, {}))
    if not isinstance(table, dict):
        raise UsageError(f"{path}: [{name}] must be a table", hint=f"see the README's [{name}] example")
    return dict(table)
