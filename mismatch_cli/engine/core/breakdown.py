"""How a chunk's rows split for `--by step` and `--by COLUMN`: per-row labels, runs of one label, and parts.

A chunk in runs of one step / `--by` value is folded run by run; rows of many labels interleaved are folded
as one part per combination of labels (`combined_parts`), each part's tokens once.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mismatch_cli.batch import Batch
from mismatch_cli.errors import InputError, UsageError

MAX_GROUPS = 1000  # distinct values of one --by column; each group holds a full set of accumulators
# A chunk in at most this many runs of one step / --by value is folded run by run (each run's tokens once);
# beyond, the groups' rows are interleaved and each group's rows are analyzed again on their own.
MAX_PIECES = 16


# A missing value's label: its own group, never merged with a row whose label is the text "null" (a NUL byte first,
# which no label read from a file starts with). The report shows it as null.
MISSING_LABEL = "\x00missing"


def labels(values: np.ndarray) -> np.ndarray:
    """Sortable per-row labels: integers stay int64; anything else becomes str, a missing value MISSING_LABEL."""
    if values.dtype.kind in "iu":
        return values.astype(np.int64, copy=False)
    labels = values.astype(str).astype(object)
    if values.dtype == object:
        labels[np.equal(values, None)] = MISSING_LABEL
    return labels.astype(str)


def pieces(keys: list[np.ndarray], rows: int) -> list[tuple[int, int]] | None:
    """The runs of consecutive rows with the same label in every column, as (start, stop); None past MAX_PIECES."""
    change = np.zeros(rows, dtype=bool)
    for labels in keys:
        change[1:] |= labels[1:] != labels[:-1]
    starts = np.flatnonzero(change[1:]) + 1
    if len(starts) >= MAX_PIECES:
        return None
    bounds = [0, *starts.tolist(), rows]
    return list(zip(bounds[:-1], bounds[1:], strict=True))


def check_group_count(column: str, known: dict[Any, Any], keys: np.ndarray) -> None:
    """UsageError when this batch would take `--by column` past MAX_GROUPS, before any row is split off."""
    unique = np.unique(keys)
    if len(known) + len(unique) <= MAX_GROUPS:
        return
    new = len(unique) if len(unique) > MAX_GROUPS else sum(
        (u.item() if isinstance(u, np.generic) else u) not in known for u in unique)
    if len(known) + new > MAX_GROUPS:
        raise UsageError(
            f"--by {column}: more than {MAX_GROUPS} distinct values, each of which would be analyzed as its own "
            "batch",
            hint="group by a column with fewer distinct values (e.g. env_name, data_source, step)",
        )


def group_keys(batch: Batch, column: str) -> np.ndarray:
    values = batch.groups.get(column)
    if values is None:
        raise InputError(
            f"no column {column!r} (asked for by --by {column}) in {batch.source}",
            hint=f"group by a column every input has, or drop --by {column}",
        )
    return labels(values)


def combined_parts(batch: Batch, keys: list[np.ndarray], bounded: bool = True,
                   ) -> list[tuple[tuple[Any, ...], Batch]] | None:
    """The batch's rows grouped by their labels in every column (one label per row each), in sorted label order,
    each group a batch that keeps its rows' file indices; when `bounded`, None where the combinations outnumber
    both MAX_PIECES and the columns' labels together (each column's groups analyzed on their own then cost
    fewer folds)."""
    uniques, inverses = zip(*(np.unique(k, return_inverse=True) for k in keys), strict=True)
    code = np.zeros(batch.num_rows, dtype=np.int64)
    for unique, inverse in zip(uniques, inverses, strict=True):
        code = code * len(unique) + inverse.reshape(-1)
    combos, first, combo_of = np.unique(code, return_index=True, return_inverse=True)
    if bounded and len(combos) > max(MAX_PIECES, sum(len(unique) for unique in uniques)):
        return None
    rows = [batch] if len(combos) == 1 else batch.group_rows(combo_of.reshape(-1), len(combos))
    return [(tuple(_item(unique[inverse[row]]) for unique, inverse in zip(uniques, inverses, strict=True)), part)
            for row, part in zip(first.tolist(), rows, strict=True)]


def _item(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value


__all__ = ["MAX_GROUPS", "MAX_PIECES", "check_group_count", "combined_parts", "group_keys", "labels", "pieces"]
