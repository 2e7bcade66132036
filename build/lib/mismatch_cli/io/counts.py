"""How big the inputs are, from metadata alone (parquet footers, safetensors headers): for progress bars."""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa

from ..errors import MismatchError
from .discover import InputFile, discover_inputs

_MAX_HEADER_BYTES = 100 * 1024 * 1024


@dataclass(frozen=True)
class InputSize:
    """Bytes of every input, and their rows (sequences) when every file tells them cheaply, else None."""

    bytes: int
    rows: int | None


def rows_in(file: InputFile) -> int | None:
    """Rows (sequences) of one dump from its metadata alone, or None when that is not cheap to know."""
    try:
        if file.format == "parquet":
            from .parquet import parquet_metadata

            return int(parquet_metadata(file.path).num_rows)
        if file.format == "safetensors":
            return _safetensors_rows(file.path)
    except (OSError, ValueError, KeyError, IndexError, TypeError, struct.error, pa.ArrowException, MismatchError):
        return None  # the reader says what is wrong with the file
    return None


def _safetensors_rows(path: str) -> int | None:
    from .remote import is_remote, read_range

    if is_remote(path):
        (size,) = struct.unpack("<Q", read_range(path, 0, 8))
        header = json.loads(read_range(path, 8, min(size, _MAX_HEADER_BYTES)))
    else:
        with open(path, "rb") as handle:
            (size,) = struct.unpack("<Q", handle.read(8))
            header = json.loads(handle.read(min(size, _MAX_HEADER_BYTES)))
    if "num_tokens" in header:
        return int(header["num_tokens"]["shape"][0])
    if "cu_seqlens" in header:
        return int(header["cu_seqlens"]["shape"][0]) - 1
    shapes = [v["shape"] for k, v in header.items() if k != "__metadata__" and len(v.get("shape", [])) == 2]
    return int(shapes[0][0]) if shapes else None


def measure_inputs(paths: Sequence[str], input_format: str | None = None) -> InputSize | None:
    """The size of what `paths` name, or None when they cannot be listed (the analysis then says why)."""
    try:
        files = discover_inputs(paths, input_format)
    except MismatchError:
        return None
    counts = [rows_in(f) for f in files]
    rows = None if any(c is None for c in counts) else sum(c for c in counts if c is not None)
    return InputSize(bytes=sum(f.bytes for f in files), rows=rows)


__all__ = ["InputSize", "measure_inputs", "rows_in"]
