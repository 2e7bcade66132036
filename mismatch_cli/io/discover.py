"""Turn command-line arguments (files, directories, globs) into an ordered list of inputs."""

from __future__ import annotations

import glob
import hashlib
import os
import re
import threading
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import InputError, UsageError
from ..system.oserrors import explain_os_error
from ._common import check_file
from .detect import (
    FORCED_EXTENSIONS,
    NEMO_NAME,
    PRIME_NAME,
    check_format,
    detect_format,
    first_record,
    json_flavor,
    prime_notes,
    skyrl_kind,
    slime_kind,
    sniff,
)
from .remote import expand_remote, is_remote

FORMATS = {".parquet": "parquet", ".safetensors": "safetensors"}
_HASH_BLOCK = 8 * 1024 * 1024
_GLOB_CHARS = frozenset("*?[")
_DUMP_EXTENSIONS = frozenset({*FORMATS, *(e for exts in FORCED_EXTENSIONS.values() for e in exts)})
_TABLE_EXTENSIONS = frozenset({".csv", ".tsv", ".xlsx"})
_LOOKED_FOR = (
    "*.parquet, *.safetensors, slime train_data/*.pt, NeMo-RL train_data_step*.jsonl, prime-rl "
    "step_*/rank_*.jsonl or SkyRL dumped_data/global_step_*.pkl"
)


@dataclass(frozen=True)
class InputFile:
    """One input file: its path as the user will see it, its format, its size in bytes, and notes.

    `format` is one of `parquet`, `safetensors`, `slime`, `nemo-rl`, `prime-rl`, `skyrl`. `notes` are
    warnings found while discovering it (e.g. a prime-rl step folder without its STABLE marker);
    `skipped` says what the folder it was found in held besides dumps (on the folder's first file).
    """

    path: str
    format: str
    bytes: int
    notes: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()


def discovery_warnings(files: Sequence[InputFile]) -> list[str]:
    """The warnings discovering `files` raised: what folders held besides dumps, then each file's notes."""
    return [*(line for f in files for line in f.skipped), *(f"{f.path}: {note}" for f in files for note in f.notes)]


def _natural(component: str) -> list[str | int]:
    # step_10 after step_9: digit runs compare as numbers (re.split alternates text, digits, text, ...).
    return [int(part) if i % 2 else part for i, part in enumerate(re.split(r"(\d+)", component))]


def _sort_key(path: str, root: str) -> list[list[str | int]]:
    return [_natural(part) for part in os.path.relpath(path, root).split(os.sep)]


def _dump_like(path: str, forced: str | None) -> bool:
    """True when the extension says the file could be a dump (so an unreadable one is an error, not skipped)."""
    ext = os.path.splitext(path)[1].lower()
    return ext in (FORCED_EXTENSIONS[forced] if forced else _DUMP_EXTENSIONS)


def _walk_candidate(path: str, forced: str | None) -> tuple[str, str | None] | None:
    """(format, slime kind) for a file a folder walk should read, or None to skip it."""
    name = os.path.basename(path)
    ext = os.path.splitext(name)[1].lower()
    if _dump_like(path, forced):
        check_file(path)  # sniffing swallows errors: an unreadable dump must not be skipped as "not a dump"
    if forced is not None:
        return (forced, None) if ext in FORCED_EXTENSIONS[forced] else None
    if ext in FORMATS:
        return FORMATS[ext], None
    if ext in (".pt", ".pth"):
        kind = slime_kind(path)  # other torch files (checkpoints) are not dumps: skip them
        return ("slime", kind) if kind else None
    if ext == ".pkl":
        return ("skyrl", None) if skyrl_kind(path) else None  # other pickles are never opened
    if ext == ".jsonl":
        by_name = "nemo-rl" if NEMO_NAME.match(name) else "prime-rl" if PRIME_NAME.match(name) else None
        if by_name is None:
            return None  # val_data_step*.jsonl, metrics logs, ...
        record = first_record(path)
        return (json_flavor(record) if record else None) or by_name, None
    return None


def _walk(directory: str, forced: str | None) -> tuple[list[tuple[str, str]], str | None]:
    """Every dump below `directory` as (path, format), and a note naming the files it skipped, if any.

    Hidden files and folders (e.g. macOS `._x`) are skipped without a word. A slime rollout-side dump
    is left out when the walk also finds train-side dumps (the rollout side has no trainer
    log-probs); alone, it is kept so that reading it says why it is refused.
    """
    found: list[tuple[str, str, str | None]] = []
    skipped: list[str] = []

    def unreadable(exc: OSError) -> None:
        raise explain_os_error(exc, exc.filename or directory)  # a folder skipped silently would be a misread

    for root, dirs, files in os.walk(directory, onerror=unreadable):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for f in files:
            if f.startswith("."):
                continue
            path = os.path.join(root, f)
            candidate = _walk_candidate(path, forced)
            if candidate is not None:
                found.append((path, *candidate))
            else:
                skipped.append(os.path.splitext(f)[1].lower() or "(no extension)")
    if any(kind in ("train", "legacy-train") for _, _, kind in found):
        found = [item for item in found if item[2] != "rollout"]
    found.sort(key=lambda item: _sort_key(item[0], directory))
    return [(path, fmt) for path, fmt, _ in found], skipped_note(directory, skipped)


def skipped_note(directory: str, extensions: list[str]) -> str | None:
    """One line naming what a folder walk skipped, by extension: `skipped 3 files (2 .csv, 1 .md) in DIR`."""
    if not extensions:
        return None
    counts = sorted(Counter(extensions).items(), key=lambda item: (-item[1], item[0]))
    files = "file" if len(extensions) == 1 else "files"
    return (f"skipped {len(extensions)} {files} ({', '.join(f'{n} {ext}' for ext, n in counts)}) in {directory}: "
            "not dumps")


def _file_format(path: str, forced: str | None) -> str:
    if forced is not None:
        return forced
    fmt = detect_format(path)
    if fmt is None and os.path.splitext(path)[1].lower() in _TABLE_EXTENSIONS:
        raise InputError(
            f"{path} is a {os.path.splitext(path)[1][1:].upper()} table, not a dump: a dump holds each sequence's "
            "per-token log-probs and mask, which a flat table cannot",
            hint="write the trainer's tensors as parquet or safetensors (docs/formats.md; `mismatch_cli.write_dump` "
            "from Python), or `mismatch convert` a slime / NeMo-RL / prime-rl dump; a steps.csv / groups.csv "
            "mismatch wrote is a result: analyze the dump it came from",
        )
    if fmt is None:
        raise InputError(
            f"cannot tell the format of {path}: expected a parquet, safetensors, slime train dump (.pt), "
            "NeMo-RL train_data_step*.jsonl, prime-rl rank_*.jsonl or SkyRL global_step_*_training_input.pkl file",
            hint="name the format with --input-format, or convert the dump to parquet (see the README)",
        )
    return fmt


def _glob_format(path: str, forced: str | None) -> str | None:
    """The format of a file a glob matched, or None to skip it (a README next to the dumps)."""
    if _dump_like(path, forced):
        check_file(path)
    if forced is None:
        return detect_format(path)
    if os.path.splitext(path)[1].lower() in FORCED_EXTENSIONS[forced] or sniff(path) == forced:
        return forced
    return None


def _expand(arg: str, forced: str | None) -> tuple[list[tuple[str, str]], list[str]]:
    """The (path, format) pairs one argument names, and notes on the files its folders held but were skipped."""
    try:
        os.stat(arg)
    except FileNotFoundError:
        if os.path.islink(arg):
            check_file(arg)  # names the missing target of a dangling link
    except OSError as exc:
        raise explain_os_error(exc, arg) from None  # a link loop, a name too long, permission denied...
    if os.path.isdir(arg):
        found, skipped = _walk(arg, forced)
        if not found:
            looked_for = ", ".join("*" + e for e in FORCED_EXTENSIONS[forced]) if forced else _LOOKED_FOR
            raise InputError(
                f"no dump file under directory {arg} (looked for {looked_for})",
                hint="point at the folder that holds the dumps, or name the files",
            )
        return found, [skipped] if skipped else []
    if os.path.isfile(arg):
        check_file(arg)
        return [(arg, _file_format(arg, forced))], []
    if os.path.exists(arg):
        raise InputError(f"expected a file or directory, got {arg}", hint="name a regular file or a folder")
    if _GLOB_CHARS & set(arg):
        matches: list[tuple[str, str]] = []
        notes: list[str] = []
        for match in sorted(glob.glob(arg, recursive=True)):
            if os.path.isdir(match):
                walked, skipped = _walk(match, forced)
                matches.extend(walked)
                notes.extend([skipped] if skipped else [])
            elif os.path.isfile(match):
                fmt = _glob_format(match, forced)
                if fmt is not None:
                    matches.append((match, fmt))
        if not matches:
            raise InputError(
                f"pattern {arg} matched no dump file",
                hint="check the pattern (quote it so the shell does not expand it; use ** for subfolders)",
            )
        return matches, notes
    scheme = re.match(r"([A-Za-z][A-Za-z0-9+.-]*)://", arg)
    if scheme is not None:  # http://, file://, a typo such as s4://: not a local path that happens to be missing
        raise UsageError(f"cannot read {arg}: unknown scheme {scheme.group(1)}://",
                         hint="use s3://BUCKET/KEY, gs://BUCKET/KEY or a local path (for file:// drop the scheme)")
    raise InputError(f"no such file or directory: {arg}", hint="check the path")


def discover_inputs(args: Sequence[str], input_format: str | None = None) -> list[InputFile]:
    """Expand files, directories (recursive, naturally sorted) and globs into inputs in argument order, once each.

    `input_format` forces a format (None or `auto`: detect it from the content, then the extension).
    `s3://` and `gs://` URIs are listed through pyarrow.fs (see `io/remote.py`).
    """
    forced = check_format(input_format)
    if isinstance(args, (str, os.PathLike)):  # one path, not a sequence of one-letter paths
        args = [args]
    if not args:
        raise UsageError("no input given", hint="name at least one dump file or folder")
    for arg in args:
        if not isinstance(arg, (str, os.PathLike)):
            raise UsageError(f"expected dump paths as strings, got {type(arg).__name__} {arg!r}",
                             hint="pass paths such as ['dumps/'] or ['run.parquet']")
    args = [os.fspath(arg) for arg in args]
    inputs: list[InputFile] = []
    seen: set[str] = set()
    for arg in args:
        if is_remote(arg):  # an object store: one object, a prefix or a glob, listed through pyarrow.fs
            for uri, fmt, size in expand_remote(arg, forced):
                if uri not in seen:
                    seen.add(uri)
                    inputs.append(InputFile(path=uri, format=fmt, bytes=size))
            continue
        expanded, skipped = _expand(arg, forced)
        for path, fmt in expanded:
            real = os.path.realpath(path)
            try:  # the file itself: a hard link read twice would count its tokens twice
                stat = os.stat(path)
                identity = f"{stat.st_dev}:{stat.st_ino}"
            except OSError:
                identity = real
            if real in seen or identity in seen:
                continue
            seen.update((real, identity))
            try:
                size = os.path.getsize(path)
            except OSError as exc:
                raise explain_os_error(exc, path) from None
            notes = prime_notes(path) if fmt == "prime-rl" else ()
            inputs.append(InputFile(path=path, format=fmt, bytes=size, notes=notes, skipped=tuple(skipped)))
            skipped = []  # said once, on the argument's first file
    return inputs


FINGERPRINT_EDGE = 1 << 20


def fingerprint_file(path: str) -> str:
    """Hex SHA-256 of the file's size (8 bytes, little-endian), its first MiB and its last MiB: a cheap identity
    for a large input, read in two blocks whatever its size (`sha256_file` reads it all)."""
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            digest.update(size.to_bytes(8, "little"))
            digest.update(f.read(FINGERPRINT_EDGE))
            if size > FINGERPRINT_EDGE:
                f.seek(max(FINGERPRINT_EDGE, size - FINGERPRINT_EDGE))
                digest.update(f.read(FINGERPRINT_EDGE))
    except OSError as exc:
        raise explain_os_error(exc, path) from None
    return digest.hexdigest()


def sha256_file(path: str, stop: threading.Event | None = None) -> str | None:
    """Hex SHA-256 of a file, read in 8 MiB blocks; None when `stop` is set before the end."""
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            while block := f.read(_HASH_BLOCK):
                if stop is not None and stop.is_set():
                    return None
                digest.update(block)
    except OSError as exc:
        raise explain_os_error(exc, path) from None
    return digest.hexdigest()
