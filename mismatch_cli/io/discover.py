"""Turn command-line arguments (files, directories, globs) into an ordered list of inputs."""

from __future__ import annotations

import glob
import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import InputError, UsageError

FORMATS = {".parquet": "parquet", ".safetensors": "safetensors"}
_HASH_BLOCK = 8 * 1024 * 1024
_GLOB_CHARS = frozenset("*?[")


@dataclass(frozen=True)
class InputFile:
    """One input file: its path as the user will see it, its format and its size in bytes."""

    path: str
    format: str  # "parquet" | "safetensors"
    bytes: int


def _format_of(path: str) -> str | None:
    return FORMATS.get(os.path.splitext(path)[1].lower())


def _walk(directory: str) -> list[str]:
    """Every supported file below `directory`, skipping hidden files and folders (e.g. macOS `._x`)."""
    found: list[str] = []
    for root, dirs, files in os.walk(directory):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        found.extend(os.path.join(root, f) for f in files if not f.startswith(".") and _format_of(f))
    return sorted(found, key=lambda p: os.path.relpath(p, directory).split(os.sep))


def _expand(arg: str) -> list[str]:
    if os.path.isdir(arg):
        found = _walk(arg)
        if not found:
            raise InputError(
                f"no *.parquet or *.safetensors file under directory {arg}",
                hint="point at the folder that holds the dumps, or name the files",
            )
        return found
    if os.path.isfile(arg):
        if _format_of(arg) is None:
            raise InputError(
                f"expected a .parquet or .safetensors file, got {arg}",
                hint="convert the dump to parquet or safetensors (see SPEC §2), or rename it if the extension is wrong",
            )
        return [arg]
    if os.path.exists(arg):
        raise InputError(f"expected a file or directory, got {arg}", hint="name a regular file or a folder")
    if _GLOB_CHARS & set(arg):
        matches: list[str] = []
        for match in sorted(glob.glob(arg, recursive=True)):
            if os.path.isdir(match):
                matches.extend(_walk(match))
            elif os.path.isfile(match) and _format_of(match):
                matches.append(match)
        if not matches:
            raise InputError(
                f"pattern {arg} matched no .parquet or .safetensors file",
                hint="check the pattern (quote it so the shell does not expand it; use ** for subfolders)",
            )
        return matches
    raise InputError(f"no such file or directory: {arg}", hint="check the path")


def discover_inputs(args: Sequence[str]) -> list[InputFile]:
    """Expand files, directories (recursive, sorted) and globs into inputs in argument order, once each."""
    if not args:
        raise UsageError("no input given", hint="name at least one .parquet / .safetensors file or folder")
    inputs: list[InputFile] = []
    seen: set[str] = set()
    for arg in args:
        for path in _expand(arg):
            real = os.path.realpath(path)
            if real in seen:
                continue
            seen.add(real)
            try:
                size = os.path.getsize(path)
            except OSError as exc:
                raise InputError(f"cannot read {path}: {exc.strerror}", hint="check the path and permissions") from exc
            inputs.append(InputFile(path=path, format=FORMATS[os.path.splitext(path)[1].lower()], bytes=size))
    return inputs


def sha256_file(path: str) -> str:
    """Hex SHA-256 of a file, read in 8 MiB blocks."""
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            while block := f.read(_HASH_BLOCK):
                digest.update(block)
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror}", hint="check the path and permissions") from exc
    return digest.hexdigest()
