"""Input readers: discover dump files and stream them as `Batch`es of whole sequences.

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
from .parquet import read_parquet

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

# Format -> (module, reader). Only parquet's is imported up front: the JSONL-based readers import
# pyarrow.compute and pyarrow.json, which a parquet run never needs (start-up time).
_READER_NAMES = {
    "parquet": ("parquet", "read_parquet"),
    "safetensors": ("safetensors", "read_safetensors"),
    "slime": ("slime", "read_slime"),
    "nemo-rl": ("nemo_rl", "read_nemo_rl"),
    "prime-rl": ("prime_rl", "read_prime_rl"),
    "skyrl": ("skyrl", "read_skyrl"),
}
READERS = tuple(_READER_NAMES)


def reader(file_format: str) -> Callable[..., Iterator[Batch]]:
    """The reader function of a format (its module imported on first use)."""
    module, function = _READER_NAMES[file_format]
    return getattr(importlib.import_module(f"{__name__}.{module}"), function)


def __getattr__(name: str) -> Any:
    for file_format, (_, function) in _READER_NAMES.items():
        if name == function:  # `from mismatch_cli.io import read_slime` still works, importing on use
            return reader(file_format)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def iter_batches(files: Sequence[InputFile], options: ReadOptions, workers: int = 0) -> Iterator[Batch]:
    """Stream every file's Batches in input order; `workers` > 0 reads ahead on that many threads."""
    check_options(options)
    for file in files:
        if file.format not in READERS:
            raise InputError(
                f"unknown input format {file.format!r} for {file.path}",
                hint=f"use one of {', '.join(FORMAT_NAMES)} (--input-format)",
            )
    if workers > 0:
        from mismatch_cli.io.parallel import iter_batches_parallel

        batches = iter_batches_parallel(files, options, _read_file, workers=workers)
    else:
        batches = (batch for file in files for batch in _read_file(file.path, file.format, options))
    try:
        for index, batch in enumerate(batches):
            raise_pending()  # a signal whose exception a library swallowed stops the read here
            yield batch
            if index == 0:
                hold_for_test()
    finally:
        batches.close()  # stops the read-ahead threads now


def _read_file(path: str, file_format: str, options: ReadOptions) -> Iterator[Batch]:
    return reader(file_format)(path, options)


def read_work_item(item: WorkItem, options: ReadOptions) -> Iterator[Batch]:
    """The Batches of one planned work item: a run of a parquet file's row groups, or a whole file."""
    check_options(options)
    if item.row_groups is not None:
        return read_parquet(item.path, options, item.row_groups)
    return _read_file(item.path, item.format, options)
