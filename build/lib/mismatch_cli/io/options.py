"""Options shared by every reader."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ReadOptions:
    """How to find the roles in an input and how to chunk it.

    `columns` maps a role to a column (or tensor / key) name and overrides the alias table
    (`--column ROLE=NAME`). A missing mask is read as all ones only with `no_mask`. Each yielded
    batch holds at most `chunk_rows` sequences. `step_column` names the integer step column (parquet),
    the `__metadata__` key / 1-D tensor (safetensors) or the record field (JSONL); `id_columns` are
    tried in order for a per-row sequence id (parquet only). `group_columns` are per-row label columns
    the readers attach to every batch (`--by COLUMN`); each must exist. `input_format` forces a format
    (`--input-format`); None detects it from the content.
    """

    columns: Mapping[str, str] = field(default_factory=dict)
    no_mask: bool = False
    chunk_rows: int = 1024
    step_column: str = "step"
    id_columns: tuple[str, ...] = ("uid", "sample_index", "index")
    group_columns: tuple[str, ...] = ()
    input_format: str | None = None
