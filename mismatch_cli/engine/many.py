"""Several corrections over one read of the batches, each also without each row group (`mismatch replay`).

A row's group is its index in its file modulo `groups`, so groups do not depend on chunking; the
leave-one-out states give a delete-a-group jackknife of every key.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np
import torch

from mismatch_cli.batch import Batch
from mismatch_cli.correction import ResolvedCorrection
from mismatch_cli.engine.analysis import BatchResult
from mismatch_cli.engine.core.chunk import MAX_CHUNK_POSITIONS, bounded, make_chunk
from mismatch_cli.engine.runner import DTYPES, Analysis, EngineResult, join_small, resolve_device
from mismatch_cli.errors import ConfigError, DataError, UsageError


@dataclass
class ManyResult:
    """`run_many`'s answer per correction: the whole input, and the input without each non-empty row group."""

    overall: EngineResult
    leave_one_out: list[BatchResult | None]  # None: the rest of the input has no valid token
    groups: int  # row groups that held a row


def run_many(batches: Iterable[Batch], corrections: Mapping[str, ResolvedCorrection], device: str = "auto",
             dtype: str = "float32", groups: int = 10, threads: int | None = 1,
             source_names: tuple[str, ...] = ()) -> dict[str, ManyResult]:
    """Several corrections over ONE read of the batches, each also without each of `groups` row groups.

    A row's group is its index in its file modulo `groups`, so groups do not depend on chunking. Each chunk is
    split into its groups once and every correction folds the same group chunks (rounds, what-if, worst
    sequences and bootstrap off); the full result merges every group, a leave-one-out result all but one.
    """
    if threads:
        torch.set_num_threads(threads)
    if groups < 1:
        raise UsageError(f"row groups must be at least 1, got {groups}", hint="use 10")
    device_ = resolve_device(device)
    parts = {name: [Analysis(correction, device_, dtype, rounds=False, bootstrap=0, extras=False)
                    for _ in range(groups)] for name, correction in corrections.items()}
    compute_dtype = DTYPES[dtype]  # known: Analysis refused any other
    # Each chunk is split into its groups and folded once per correction: its fixed cost weighs the more.
    for whole in join_small().joined(batches):
        for batch in bounded(whole, MAX_CHUNK_POSITIONS):
            group_of = (batch.first_row + np.arange(batch.num_rows)) % groups
            split = [batch] if groups == 1 else batch.group_rows(group_of, groups)
            for g in np.unique(group_of).tolist():
                part = split[g]
                chunk = make_chunk(part, device_, compute_dtype)
                for analyses in parts.values():
                    analyses[g].fold(part, chunk)
    return {name: _leave_one_out(analyses, source_names) for name, analyses in parts.items()}


def _merged(analyses: list[Analysis]) -> Analysis:
    # Copies: Analysis.merge may adopt the other side's per-file state, which a later merge would then change.
    merged = copy.deepcopy(analyses[0])
    for other in analyses[1:]:
        merged.merge(copy.deepcopy(other))
    return merged


def _prefix_merges(analyses: list[Analysis]) -> list[Analysis | None]:
    """Entry i: the merge of analyses[:i] in order (None for i = 0), each a separate copy."""
    out: list[Analysis | None] = [None]
    acc: Analysis | None = None
    for analysis in analyses[:-1]:
        if acc is None:
            acc = copy.deepcopy(analysis)
        else:
            acc.merge(copy.deepcopy(analysis))
        out.append(copy.deepcopy(acc))
    return out


def _suffix_merges(analyses: list[Analysis]) -> list[Analysis | None]:
    """Entry i: the merge of analyses[i + 1:] in order (None for the last), each a separate copy."""
    out: list[Analysis | None] = [None]
    acc: Analysis | None = None
    for analysis in reversed(analyses[1:]):
        left = copy.deepcopy(analysis)
        if acc is not None:
            left.merge(acc)  # the earlier group first: merges keep the rows' order
        acc = left
        out.append(copy.deepcopy(acc))
    return out[::-1]


def _leave_one_out(analyses: list[Analysis], source_names: tuple[str, ...]) -> ManyResult:
    filled = [a for a in analyses if a.any_rows]
    overall = _merged(filled or analyses).finish(source_names)
    rest: list[BatchResult | None] = []
    if len(filled) > 1:
        # Each leave-one-out state is (groups before it) + (groups after it): O(G) merges, not O(G^2).
        for before, after in zip(_prefix_merges(filled), _suffix_merges(filled), strict=True):
            merged = before if after is None else after if before is None else before
            if before is not None and after is not None:
                merged.merge(after)
            try:
                rest.append(merged.finish(source_names).overall)  # type: ignore[union-attr]
            except (DataError, ConfigError):
                rest.append(None)
    return ManyResult(overall, rest, len(filled))


