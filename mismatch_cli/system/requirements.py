"""The oldest versions of the libraries the CLI is built on, checked before any of them is used.

An older typer fails deep inside its own code (an AttributeError on every command), an older pyarrow or torch
in ours; one line naming the requirement and the install command says it instead. The minimums are
pyproject.toml's (a test keeps the two equal). The check reads installed metadata only (importlib.metadata, which
typer and torch import anyway): no library is imported for it.
"""

from __future__ import annotations

import re
from importlib import metadata, util

# (distribution, oldest version), as pyproject.toml's dependencies declare them.
MINIMUM_VERSIONS: tuple[tuple[str, str], ...] = (("typer", "0.29"), ("pyarrow", "14"), ("torch", "2.2"))


def release(version: str) -> tuple[int, ...]:
    """The leading numeric release of a version string ('2.13.0+cpu' -> (2, 13, 0); '0.29.0rc1' -> (0, 29, 0))."""
    parts = []
    for piece in version.split("."):
        digits = re.match(r"\d+", piece)
        if digits is None:
            break
        parts.append(int(digits.group()))
        if digits.end() < len(piece):
            break
    return tuple(parts)


def unmet_requirement(installed: dict[str, str | None] | None = None) -> tuple[str, str] | None:
    """The first unmet minimum as (what is wrong, the install command), or None when every one is met (a module
    importable without metadata, as some vendored builds are, passes: its version cannot be told)."""
    for name, oldest in MINIMUM_VERSIONS:
        version = installed.get(name) if installed is not None else _installed(name)
        spec = f"{name}>={oldest}"
        if version is None and (installed is not None or util.find_spec(name) is None):
            return f"mismatch needs {spec}, which is not installed", f'pip install "{spec}"'
        if version is not None and release(version) < release(oldest):
            return f"mismatch needs {spec}, but {name} {version} is installed", f'pip install --upgrade "{spec}"'
    return None


def _installed(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


__all__ = ["MINIMUM_VERSIONS", "release", "unmet_requirement"]
