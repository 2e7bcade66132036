"""The unit that flows from readers to the engine: whole sequences as flat token arrays."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace

import numpy as np

ROLES = ("old_log_probs", "rollout_log_probs", "response_mask")


@dataclass(frozen=True)
class Batch:
    """A chunk of whole sequences: per-token arrays of length N and row offsets of length B+1.

    `old_log_probs` is the trainer side, `rollout_log_probs` the inference side, both float32 or
    float64; `response_mask` is bool (True = trained-on token). Row i spans
    `offsets[i]:offsets[i+1]`. Padding, prompt and tool tokens are simply positions whose mask is
    False. `steps` is the training step per row (int64) or None when unknown. `source` names the
    file and `first_row` the index, within that file, of row 0 (for error messages and ids).
    `groups` maps a column name (e.g. `env_name`) to one label per row (int64, or an object array
    of str / None), for `--by COLUMN`. `advantages` is the per-token advantage (float64, NaN where
    unknown; a per-row advantage repeated over the row's positions) when the dump has one, else None:
    only a replayed trainer that masks on it (prime-rl) reads it. `process_index` is the rank of
    the trainer process that held each row (int64 per row) when the dump says so, else None: only a
    replayed trainer that averages over processes (TRL) reads it. `rows` is each row's index within
    `source` when the rows are not `first_row` onward (a selection of scattered rows), else None.
    `policy_versions` is each row's policy version (float64, NaN where unknown) when the dump stamps one,
    `version_kind` "version" (counts up) or "lag" (versions behind the trainer): the policy-lag evidence.
    `token_ids` is the sampled token id per position (int64) when the dump has them: the repetition evidence.
    """

    old_log_probs: np.ndarray
    rollout_log_probs: np.ndarray
    response_mask: np.ndarray
    offsets: np.ndarray
    source: str
    first_row: int = 0
    steps: np.ndarray | None = None
    sequence_ids: np.ndarray | None = None
    labels: dict[str, str] = field(default_factory=dict)
    groups: dict[str, np.ndarray] = field(default_factory=dict)
    advantages: np.ndarray | None = None
    process_index: np.ndarray | None = None
    rows: np.ndarray | None = None
    policy_versions: np.ndarray | None = None
    version_kind: str = ""
    token_ids: np.ndarray | None = None

    @property
    def num_rows(self) -> int:
        """Number of sequences in the chunk."""
        return len(self.offsets) - 1

    @property
    def num_positions(self) -> int:
        """Number of token positions (masked and unmasked) in the chunk."""
        return int(self.offsets[-1])

    def row_numbers(self) -> np.ndarray:
        """int64 [B]: each row's index within the source file."""
        if self.rows is not None:
            return self.rows
        return np.arange(self.first_row, self.first_row + self.num_rows, dtype=np.int64)

    def row_of_position(self, position: int) -> int:
        """Row index within the source file of the row holding flat position `position`."""
        return int(self.row_numbers()[np.searchsorted(self.offsets, position, side="right") - 1])

    def select_rows(self, rows: np.ndarray) -> Batch:
        """A new batch of the rows where the bool array `rows` is True (positions follow their rows).

        `first_row` is the first selected row's index in the file; scattered rows keep theirs in `rows`.
        """
        lengths = np.diff(self.offsets)
        offsets = np.concatenate([[0], np.cumsum(lengths[rows])]).astype(np.int64)
        picked = np.flatnonzero(rows)
        taken = self._taken(picked, np.repeat(rows, lengths), offsets, self.row_numbers()[picked])
        return taken._unless_contiguous(self)

    def group_rows(self, codes: np.ndarray, count: int) -> list[Batch]:
        """`[select_rows(codes == g) for g in range(count)]` (`codes`: int [B], each in 0..count-1), with the
        positions gathered once for every group rather than scanned once per group."""
        order = np.argsort(codes, kind="stable")  # each group's rows together, in file order
        lengths = np.diff(self.offsets)[order]
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        positions = np.repeat(self.offsets[:-1][order] - offsets[:-1], lengths) + np.arange(offsets[-1])
        grouped = self._taken(order, positions, offsets, self.row_numbers()[order])
        bounds = np.concatenate([[0], np.cumsum(np.bincount(codes, minlength=count))]).tolist()
        return [grouped._part(start, stop, self) for start, stop in zip(bounds[:-1], bounds[1:], strict=True)]

    def _taken(self, rows: np.ndarray, positions: np.ndarray, offsets: np.ndarray, numbers: np.ndarray) -> Batch:
        """The batch of `rows` (indices) whose per-token arrays are at `positions`; every row keeps its file index."""
        return Batch(
            old_log_probs=self.old_log_probs[positions],
            rollout_log_probs=self.rollout_log_probs[positions],
            response_mask=self.response_mask[positions],
            offsets=offsets,
            source=self.source,
            first_row=int(numbers[0]) if len(numbers) else self.first_row,
            steps=None if self.steps is None else self.steps[rows],
            sequence_ids=None if self.sequence_ids is None else self.sequence_ids[rows],
            labels=self.labels,
            groups={name: values[rows] for name, values in self.groups.items()},
            advantages=None if self.advantages is None else self.advantages[positions],
            process_index=None if self.process_index is None else self.process_index[rows],
            rows=numbers,
            policy_versions=None if self.policy_versions is None else self.policy_versions[rows],
            version_kind=self.version_kind,
            token_ids=None if self.token_ids is None else self.token_ids[positions],
        )

    def _part(self, start: int, stop: int, origin: Batch) -> Batch:
        """Rows `start:stop` of a batch `_taken` from `origin`, as select_rows would give them."""
        part = self.slice_rows(start, stop)
        assert part.rows is not None
        first = int(part.rows[0]) if stop > start else origin.first_row
        return replace(part, first_row=first)._unless_contiguous(origin)

    def _unless_contiguous(self, origin: Batch) -> Batch:
        """This selection of `origin`'s rows, its row indices dropped when they run on from `first_row` (as
        `origin`'s did): such a batch is read as rows `first_row` onward."""
        numbers = self.rows
        assert numbers is not None
        if origin.rows is None and (not len(numbers) or int(numbers[-1]) - int(numbers[0]) == len(numbers) - 1):
            return replace(self, rows=None)
        return self

    def slice_rows(self, start: int, stop: int) -> Batch:
        """Rows `start:stop` as views (no copy)."""
        a, b = int(self.offsets[start]), int(self.offsets[stop])
        return Batch(
            old_log_probs=self.old_log_probs[a:b],
            rollout_log_probs=self.rollout_log_probs[a:b],
            response_mask=self.response_mask[a:b],
            offsets=self.offsets[start : stop + 1] - a,
            source=self.source,
            first_row=self.first_row + start,
            steps=None if self.steps is None else self.steps[start:stop],
            sequence_ids=None if self.sequence_ids is None else self.sequence_ids[start:stop],
            labels=self.labels,
            groups={name: values[start:stop] for name, values in self.groups.items()},
            advantages=None if self.advantages is None else self.advantages[a:b],
            process_index=None if self.process_index is None else self.process_index[start:stop],
            rows=None if self.rows is None else self.rows[start:stop],
            policy_versions=None if self.policy_versions is None else self.policy_versions[start:stop],
            version_kind=self.version_kind,
            token_ids=None if self.token_ids is None else self.token_ids[a:b],
        )


def follows(previous: Batch, batch: Batch) -> bool:
    """Whether `batch` holds the rows right after `previous` in the same file, with the same columns."""
    return (batch.source == previous.source and batch.first_row == previous.first_row + previous.num_rows
            and batch.old_log_probs.dtype == previous.old_log_probs.dtype
            and batch.rollout_log_probs.dtype == previous.rollout_log_probs.dtype
            and (batch.steps is None) == (previous.steps is None)
            and (batch.sequence_ids is None) == (previous.sequence_ids is None)
            and batch.groups.keys() == previous.groups.keys() and batch.labels == previous.labels)


class JoinSmall:
    """Consecutive batches of one file under `below` positions, held and joined (concat_rows) into batches of up to
    `limit`; a batch of `below` or more passes as it comes, after what was held."""

    def __init__(self, below: int, limit: int) -> None:
        self.below, self.limit = below, limit
        self.held: list[Batch] = []
        self.positions = 0

    def add(self, batch: Batch) -> list[Batch]:
        """The batches ready now, in order (none while `batch` is held)."""
        small = batch.num_positions < self.below
        ready = []
        if self.held and not (small and follows(self.held[-1], batch)
                              and self.positions + batch.num_positions <= self.limit):
            ready = self.flush()
        if not small:
            return [*ready, batch]
        self.held.append(batch)
        self.positions += batch.num_positions
        return ready

    def flush(self) -> list[Batch]:
        """The held batches, joined (none when nothing is held)."""
        held, self.held, self.positions = self.held, [], 0
        return [concat_rows(held)] if held else []

    def joined(self, batches: Iterable[Batch]) -> Iterator[Batch]:
        """`batches`, the small ones joined."""
        for batch in batches:
            yield from self.add(batch)
        yield from self.flush()


def concat_rows(batches: list[Batch],
                join: Callable[[str, list[np.ndarray], np.dtype], np.ndarray] | None = None) -> Batch:
    """One batch of the rows of consecutive batches of one source, in order (the first one itself when alone).

    With `join(role, arrays, dtype)`, each per-token array is joined by it (into host buffers reused for a
    device), even for one batch; the response mask then comes out as bool.
    """
    if len(batches) == 1 and join is None:
        return batches[0]
    first = batches[0]
    ends = np.cumsum([b.num_positions for b in batches])
    offsets = np.concatenate([first.offsets.astype(np.int64, copy=False)]
                             + [b.offsets[1:] + base for b, base in zip(batches[1:], ends[:-1].tolist(), strict=True)])

    def joined(arrays: list[np.ndarray | None]) -> np.ndarray | None:
        return None if any(a is None for a in arrays) else np.concatenate(arrays)  # type: ignore[arg-type]

    def tokens(role: str, arrays: list[np.ndarray | None], dtype: np.dtype | None = None) -> np.ndarray | None:
        if join is None or any(a is None for a in arrays):
            return joined(arrays)
        return join(role, arrays, dtype or np.result_type(*arrays))  # type: ignore[arg-type]

    return Batch(
        old_log_probs=tokens("old_log_probs", [b.old_log_probs for b in batches]),
        rollout_log_probs=tokens("rollout_log_probs", [b.rollout_log_probs for b in batches]),
        response_mask=tokens("response_mask", [b.response_mask for b in batches], np.dtype(bool)),
        offsets=offsets,
        source=first.source,
        first_row=first.first_row,
        steps=joined([b.steps for b in batches]),
        sequence_ids=joined([b.sequence_ids for b in batches]),
        labels=first.labels,
        groups={name: np.concatenate([b.groups[name] for b in batches]) for name in first.groups},
        advantages=tokens("advantages", [b.advantages for b in batches]),
        process_index=joined([b.process_index for b in batches]),
        rows=None if all(b.rows is None for b in batches) else np.concatenate([b.row_numbers() for b in batches]),
        policy_versions=joined([b.policy_versions for b in batches]),
        version_kind=first.version_kind if all(b.version_kind == first.version_kind for b in batches) else "",
        token_ids=joined([b.token_ids for b in batches]),
    )
