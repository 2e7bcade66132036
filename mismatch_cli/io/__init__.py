"""Input readers: discover dump files and stream them as `Batch`es of whole sequences.

Each format's module only decodes its file into `validate.Decoded` chunks; this package's read path
(`reader`, `iter_batches`, `read_work_item`) passes every chunk through `validate.to_batch`, the one
place where values are checked and a Batch is built. A new format is one decoding module and one
line in `_READER_NAMES`.

The package never imports torch (CLI startup cost): numpy, pyarrow and safetensors' numpy API only;
the slime and SkyRL readers import torch inside their functions, when a dump really needs it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from ..batch import Batch
from ..errors import InputError
from ..system.guard import hold_for_test, raise_pending
from .aliases import ROLE_ALIASES, check_options, resolve_roles
from .detect import FORMAT_NAMES, detect_format
from .discover import FORMATS, InputFile, discover_inputs, discovery_warnings, sha256_file
from .options import ReadOptions
from .parquet import decode_parquet
from .validate import Decoded, to_batch

if TYPE_CHECKING:
    from .parallel import WorkItem

__all__ = [
    "FORMATS",
    "FORMAT_NAMES",
    "READERS",
    "ROLE_ALIASES",
    "InputFile",
    "ReadOptions",
    "detect_format",
    "discover_inputs",
    "discovery_warnings",
    "iter_batches",
    "iter_item_batches",
    "read_nemo_rl",
    "read_parquet",
    "read_prime_rl",
    "read_safetensors",
    "read_skyrl",
    "read_slime",
    "read_work_item",
    "reader",
    "resolve_roles",
    "sha256_file",
]

# Format -> (module, decoder); the public reader of a format is `read_` + the module's name. Only parquet's
# module is imported up front: the JSONL-based ones import pyarrow.compute and pyarrow.json, which a parquet
# run never needs (start-up time).
_READER_NAMES = {
    "parquet": ("parquet", "decode_parquet"),
    "safetensors": ("safetensors", "decode_safetensors"),
    "slime": ("slime", "decode_slime"),
    "nemo-rl": ("nemo_rl", "decode_nemo_rl"),
    "prime-rl": ("prime_rl", "decode_prime_rl"),
    "skyrl": ("skyrl", "decode_skyrl"),
}
READERS = tuple(_READER_NAMES)


def _validated(chunks: Iterator[Decoded]) -> Iterator[Batch]:
    """The checked Batch of every decoded chunk; closing it closes the decoder (and its file) at once."""
    try:
        for chunk in chunks:
            yield to_batch(chunk)
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()


def reader(file_format: str) -> Callable[..., Iterator[Batch]]:
    """The reader function of a format, `(path, options) -> Batches` (its module imported on first use)."""
    module, function = _READER_NAMES[file_format]
    decode = getattr(importlib.import_module(f"{__name__}.{module}"), function)

    def read(path: str, options: ReadOptions, *args: Any) -> Iterator[Batch]:
        return _validated(decode(path, options, *args))

    read.__name__ = read.__qualname__ = f"read_{module}"
    read.__doc__ = decode.__doc__
    return read


def read_parquet(path: str, options: ReadOptions, row_groups: Sequence[int] | None = None) -> Iterator[Batch]:
    """Stream a wide parquet file (or some of its row groups) as Batches, reading only the needed columns."""
    return _validated(decode_parquet(path, options, row_groups))


def __getattr__(name: str) -> Any:
    for file_format, (module, _) in _READER_NAMES.items():
        if name == f"read_{module}":  # `from mismatch_cli.io import read_slime` still works, importing on use
            return reader(file_format)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def iter_batches(files: Sequence[InputFile], options: ReadOptions, workers: int = 0) -> Iterator[Batch]:
    """Stream every file's Batches in input order; `workers` > 0 reads ahead on that many threads from now on
    (iter_item_batches without the work items' indices; `close()` stops the readers)."""
    tagged = iter_item_batches(files, options, workers)
    return _Closing((batch for _, batch in tagged), tagged)


def _check_formats(files: Sequence[InputFile]) -> None:
    for file in files:
        if file.format not in READERS:
            raise InputError(
                f"unknown input format {file.format!r} for {file.path}",
                hint=f"use one of {', '.join(FORMAT_NAMES)} (--input-format)",
            )


def iter_item_batches(files: Sequence[InputFile], options: ReadOptions, workers: int = 0) -> Iterator[
        tuple[int, Batch]]:
    """Every input's Batches in input order, each with the index of its work item (io.parallel.plan: the engine's
    shards); `workers` > 0 reads ahead on that many threads from now on. `close()` stops the readers."""
    check_options(options)
    _check_formats(files)
    from mismatch_cli.io.parallel import ReadAhead, plan, tagged

    items = plan(files)
    if workers > 0:
        reader = ReadAhead(items, options, _read_file, workers, 4)
        return _Guarded(_Closing(tagged(reader), reader))
    return _Guarded((index, batch) for index, item in enumerate(items)
                    for batch in _read_file(item.path, item.format, options, item.row_groups))


class _Closing(Iterator[Any]):
    """An iterator over another one's values whose `close()` closes that other one."""

    def __init__(self, values: Iterator[Any], owner: Any) -> None:
        self._values, self._owner = values, owner

    def __next__(self) -> Any:
        return next(self._values)

    def close(self) -> None:
        """Close the owner (the read-ahead threads)."""
        self._owner.close()


class _Guarded(Iterator[Batch]):
    """Batches checked for a pending signal; `close()` stops the read-ahead threads, read from or not."""

    def __init__(self, batches: Iterator[Batch]) -> None:
        self._batches, self._handed = batches, 0

    def __next__(self) -> Batch:
        try:
            if self._handed == 1:
                hold_for_test()
            batch = next(self._batches)
            raise_pending()  # a signal whose exception a library swallowed stops the read here
        except BaseException:
            self.close()
            raise
        self._handed += 1
        return batch

    def close(self) -> None:
        """Stop reading now (the read-ahead threads too)."""
        close = getattr(self._batches, "close", None)
        if close is not None:
            close()


def _read_file(path: str, file_format: str, options: ReadOptions,
               row_groups: Sequence[int] | None = None) -> Iterator[Batch]:
    """A file's (or a run of a parquet file's row groups') Batches: the one read path, decoder then validator."""
    if row_groups is not None:
        return read_parquet(path, options, row_groups)
    return reader(file_format)(path, options)


def read_work_item(item: WorkItem, options: ReadOptions) -> Iterator[Batch]:
    """The Batches of one planned work item: a run of a parquet file's row groups, or a whole file."""
    check_options(options)
    return _Guarded(_read_file(item.path, item.format, options, item.row_groups))
