"""Tell a dump's format from its content (magic bytes, a torch archive's pickle header, the first JSON
record), falling back on the extension. Nothing here unpickles or imports torch."""

from __future__ import annotations

import json
import os
import re
import struct
import zipfile

from ..errors import UsageError

FORMAT_NAMES = ("parquet", "safetensors", "slime", "nemo-rl", "prime-rl", "skyrl")
EXTENSIONS = {".parquet": "parquet", ".safetensors": "safetensors", ".pt": "slime", ".pth": "slime"}
# The extensions a folder walk picks up for a format forced with --input-format.
FORCED_EXTENSIONS = {
    "parquet": (".parquet",),
    "safetensors": (".safetensors",),
    "slime": (".pt", ".pth"),
    "nemo-rl": (".jsonl",),
    "prime-rl": (".jsonl",),
    "skyrl": (".pkl",),
}
NEMO_NAME = re.compile(r"^train_data_step(\d+)\.jsonl$")
PRIME_NAME = re.compile(r"^rank_(\d+)\.jsonl$")
PRIME_STEP_DIR = re.compile(r"^step_(\d+)$")
SKYRL_NAME = re.compile(r"^global_step_(\d+)_\w*\.pkl$")

_PEEK_BYTES = 1 << 16
_BOM = b"\xef\xbb\xbf"
_PRIME_KEYS = frozenset({"trainer_logprobs", "inference_logprobs"})
_NEMO_KEYS = frozenset({"prev_logprobs", "generation_logprobs", "token_loss_mask"})


def check_format(name: str | None) -> str | None:
    """The forced format, None for auto-detection; UsageError for an unknown name."""
    if name is None or name == "auto":
        return None
    if name not in FORMAT_NAMES:
        raise UsageError(f"unknown input format {name!r}", hint=f"use auto or one of {', '.join(FORMAT_NAMES)}")
    return name


def slime_kind(path: str) -> str | None:
    """`train`, `legacy-train` or `rollout` for a slime debug dump, from the raw pickle header; else None.

    A torch archive keeps its object tree in `*/data.pkl`; dict keys are plain strings in the
    pickle stream, so finding them needs no unpickling.
    """
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as archive:
                name = next((n for n in archive.namelist() if n.endswith("/data.pkl") or n == "data.pkl"), None)
                if name is None:
                    return None
                with archive.open(name) as handle:
                    head = handle.read(_PEEK_BYTES)
        else:
            with open(path, "rb") as handle:
                head = handle.read(_PEEK_BYTES)
            if not head.startswith(b"\x80"):
                return None
    except (OSError, zipfile.BadZipFile):
        return None
    if b"format_version" in head and b"samples" in head:
        return "train"
    if b"rollout_data" in head and b"rollout_id" in head:
        return "legacy-train"
    if b"rollout_id" in head and b"samples" in head:
        return "rollout"
    return None


def skyrl_kind(path: str) -> bool:
    """True for a plain pickle whose header names SkyRL's `training_batch` module (a `TensorBatch.save` file).

    The module and class names are plain strings at the start of the pickle stream: no unpickling.
    """
    try:
        with open(path, "rb") as handle:
            head = handle.read(4096)
    except OSError:
        return False
    return head.startswith(b"\x80") and b"training_batch" in head and b"Batch" in head


def first_record(path: str) -> dict | None:
    """The first non-blank line of a JSONL file as a dict, or None when it is not one."""
    try:
        with open(path, "rb") as handle:
            for line in handle:
                if line.strip():
                    record = json.loads(line)
                    return record if isinstance(record, dict) else None
    except (OSError, ValueError):
        return None
    return None


def json_flavor(record: dict) -> str | None:
    """`prime-rl` or `nemo-rl` from the keys of one record, else None."""
    keys = set(record)
    if keys & _PRIME_KEYS:
        return "prime-rl"
    if keys & _NEMO_KEYS:
        return "nemo-rl"
    return None


def sniff(path: str) -> str | None:
    """The format the file's content shows, or None when the content does not say."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as handle:
            head = handle.read(64)
    except OSError:
        return None
    if head[:4] == b"PAR1":
        return "parquet"
    if head[:1] == b"\x80" and skyrl_kind(path):
        return "skyrl"
    if head[:4] == b"PK\x03\x04" or head[:1] == b"\x80":
        return "slime" if slime_kind(path) else None
    if len(head) >= 9 and head[8:9] == b"{":
        (length,) = struct.unpack("<Q", head[:8])
        if length <= size - 8:
            return "safetensors"
    if head.removeprefix(_BOM).lstrip()[:1] == b"{":  # json.loads reads past a UTF-8 byte-order mark, as pyarrow does
        record = first_record(path)
        return json_flavor(record) if record is not None else None
    return None


def detect_format(path: str) -> str | None:
    """The content's format, else the extension's (or the name of a SkyRL `global_step_{N}_*.pkl`, NeMo-RL
    `train_data_step{N}.jsonl` or prime-rl `rank_{R}.jsonl`: an empty or broken one is then refused by its
    reader, saying what is wrong with it), else None."""
    name = os.path.basename(path)
    by_name = ("skyrl" if SKYRL_NAME.match(name) else "nemo-rl" if NEMO_NAME.match(name)
               else "prime-rl" if PRIME_NAME.match(name) else None)
    return sniff(path) or EXTENSIONS.get(os.path.splitext(path)[1].lower()) or by_name


def step_from_name(path: str) -> int | None:
    """The step a file's name or folder carries: NeMo-RL `*_step{N}.jsonl`, SkyRL `global_step_{N}_*.pkl`,
    prime-rl `step_{N}/`."""
    match = re.search(r"_step(\d+)\.jsonl$", os.path.basename(path)) or SKYRL_NAME.match(os.path.basename(path))
    if match:
        return int(match.group(1))
    folder = PRIME_STEP_DIR.match(os.path.basename(os.path.dirname(os.path.abspath(path))))
    return int(folder.group(1)) if folder else None


def prime_notes(path: str) -> tuple[str, ...]:
    """A note when a prime-rl rank file sits in a `step_N/` folder without its `STABLE` marker."""
    folder = os.path.dirname(os.path.abspath(path))
    if not PRIME_STEP_DIR.match(os.path.basename(folder)):
        return ()
    if os.path.exists(os.path.join(folder, "STABLE")):
        return ()
    shown = os.path.dirname(path) or "."
    return (
        f"incomplete: step folder {shown} has no STABLE marker, so prime-rl had not finished writing every "
        "rank when this was read (ranks or records may be missing)",
    )
