"""Input readers: discover dump files and stream them as `Batch`es of whole sequences.

The package never imports torch (CLI startup cost): numpy, pyarrow and safetensors' numpy API only.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from ..batch import Batch
from ..errors import InputError
from .aliases import ROLE_ALIASES, check_options, resolve_roles
from .discover import FORMATS, InputFile, discover_inputs, sha256_file
from .options import ReadOptions
from .parquet import read_parquet
from .safetensors import read_safetensors

__all__ = [
    "FORMATS",
    "ROLE_ALIASES",
    "InputFile",
    "ReadOptions",
    "discover_inputs",
    "iter_batches",
    "read_parquet",
    "read_safetensors",
    "resolve_roles",
    "sha256_file",
]


def iter_batches(files: Sequence[InputFile], options: ReadOptions) -> Iterator[Batch]:
    """Stream every file's Batches, file after file, in input order."""
    check_options(options)
    for file in files:
        if file.format == "parquet":
            yield from read_parquet(file.path, options)
        elif file.format == "safetensors":
            yield from read_safetensors(file.path, options)
        else:
            raise InputError(
                f"unknown input format {file.format!r} for {file.path}",
                hint="use a .parquet or .safetensors file",
            )
