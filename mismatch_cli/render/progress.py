"""A transient rich progress bar on stderr while large inputs are read (only on a terminal)."""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

MIN_BYTES = 32 << 20  # smaller inputs are read in well under a second: no bar


def rows_in(path: str, file_format: str) -> int | None:
    """Rows (sequences) of a dump from its metadata alone, or None when that is not cheap to know."""
    try:
        if file_format == "parquet":
            import pyarrow.parquet as pq

            return int(pq.read_metadata(path).num_rows)
        if file_format == "safetensors":
            with open(path, "rb") as handle:
                (size,) = struct.unpack("<Q", handle.read(8))
                header = json.loads(handle.read(size))
            if "num_tokens" in header:
                return int(header["num_tokens"]["shape"][0])
            if "cu_seqlens" in header:
                return int(header["cu_seqlens"]["shape"][0]) - 1
            shapes = [v["shape"] for k, v in header.items() if k != "__metadata__" and len(v.get("shape", [])) == 2]
            return int(shapes[0][0]) if shapes else None
    except (OSError, ValueError, KeyError, struct.error, ImportError):
        return None
    return None


@contextmanager
def reading_progress(paths: Sequence[str], enabled: bool) -> Iterator[Callable[[Any], None] | None]:
    """Yield a per-Batch callback that advances a stderr bar (rows read / rows in all inputs), or None."""
    if not enabled:
        yield None
        return
    from mismatch_cli.errors import MismatchError
    from mismatch_cli.io import discover_inputs

    try:
        files = discover_inputs(paths)
    except MismatchError:
        yield None  # the analysis itself reports the problem
        return
    if sum(f.bytes for f in files) < MIN_BYTES:
        yield None
        return
    counts = [rows_in(f.path, f.format) for f in files]
    total = None if any(c is None for c in counts) else sum(c for c in counts if c is not None)

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = [TextColumn("reading"), BarColumn(), MofNCompleteColumn(), TextColumn("rows"), TimeElapsedColumn()]
    with Progress(*columns, console=Console(stderr=True), transient=True) as progress:
        task = progress.add_task("reading", total=total)

        def advance(batch: Any) -> None:
            progress.advance(task, batch.num_rows)

        yield advance


__all__ = ["reading_progress", "rows_in"]
