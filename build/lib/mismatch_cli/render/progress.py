"""A transient rich progress bar on stderr while large inputs are read (only on a terminal).

The bar is told the inputs' size (bytes, and rows when known); it never opens a dump itself.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol

MIN_BYTES = 32 << 20  # smaller inputs are read in well under a second: no bar


class Size(Protocol):
    """The inputs' size: total bytes, and total rows or None when not known up front."""

    bytes: int
    rows: int | None


@contextmanager
def reading_progress(size: Size | None) -> Iterator[Callable[[Any], None] | None]:
    """Yield a per-Batch callback that advances a stderr bar (rows read / `size.rows`), or None for no bar.

    `size` None turns the bar off (quiet, not a terminal, or inputs that could not be listed).
    """
    if size is None or size.bytes < MIN_BYTES:
        yield None
        return

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = [TextColumn("reading"), BarColumn(), MofNCompleteColumn(), TextColumn("rows"), TimeElapsedColumn()]
    with Progress(*columns, console=Console(stderr=True), transient=True) as progress:
        task = progress.add_task("reading", total=size.rows)

        def advance(batch: Any) -> None:
            progress.advance(task, batch.num_rows)

        yield advance


__all__ = ["reading_progress"]
