"""Drive the accumulators over a stream of Batches: overall, per step, per source file."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from mismatch_cli.batch import Batch, JoinSmall, concat_rows, follows
from mismatch_cli.correction import ResolvedCorrection
from mismatch_cli.engine.accumulators.family import FamilyAccumulator
from mismatch_cli.engine.accumulators.packs import merge_xtuner_packs
from mismatch_cli.engine.accumulators.signatures import start_token_sums
from mismatch_cli.engine.analysis import BatchAccumulator, BatchResult
from mismatch_cli.engine.core.bootstrap import DEFAULT_REPLICATES
from mismatch_cli.engine.core.breakdown import check_group_count, combined_parts, group_keys, labels
from mismatch_cli.engine.core.breakdown import pieces as find_pieces
from mismatch_cli.engine.core.chunk import DEVICE_CHUNK_POSITIONS, MAX_CHUNK_POSITIONS, Chunk, bounded, make_chunk
from mismatch_cli.engine.core.protocol import ChunkDecisions
from mismatch_cli.engine.core.quality import QUALITY_CATEGORIES, quality_examples
from mismatch_cli.engine.core.staging import Staging
from mismatch_cli.errors import ConfigError, DataError, UsageError

DTYPES = {"float32": torch.float32, "float64": torch.float64}


EXAMPLES_PER_CATEGORY = 3  # first flagged tokens kept per data-quality category and file
PACK_AFTER = 16  # breakdown states (steps, groups) past which those at rest are packed (a run's history: 1000s)
# Smaller reader batches (short rows, small row groups) are joined on the CPU, up to MAX_CHUNK_POSITIONS: a chunk
# costs about 3 ms of fixed work (some hundred small tensor ops), 3 ns a token at a full chunk, 30 at a tenth.
JOIN_CPU_BATCHES_BELOW = MAX_CHUNK_POSITIONS // 2


def join_small() -> JoinSmall:
    """The CPU's joining of a file's consecutive reader batches under JOIN_CPU_BATCHES_BELOW positions."""
    return JoinSmall(JOIN_CPU_BATCHES_BELOW, MAX_CHUNK_POSITIONS)


@dataclass
class SourceStats:
    """What one input file contributed: rows, positions, data-quality counts and first examples."""

    sequences: int = 0
    quality: dict[str, int] = field(default_factory=dict)
    examples: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def add(self, rows: int, quality: dict[str, int]) -> None:
        """Count one chunk of this file."""
        self.sequences += rows
        for key, value in quality.items():
            self.quality[key] = self.quality.get(key, 0) + value

    def wanted_examples(self, quality: dict[str, int]) -> list[str]:
        """Categories flagged in this chunk that still lack examples."""
        return [c for c in QUALITY_CATEGORIES
                if quality.get(c, 0) and len(self.examples.get(c, ())) < EXAMPLES_PER_CATEGORY]

    def add_examples(self, found: dict[str, list[dict[str, Any]]]) -> None:
        """Keep the first EXAMPLES_PER_CATEGORY examples of each category."""
        for category, examples in found.items():
            kept = self.examples.setdefault(category, [])
            kept.extend(examples[: EXAMPLES_PER_CATEGORY - len(kept)])
        # In category order, whatever order the chunks found them in (the report is the same however chunked).
        self.examples = {c: self.examples[c] for c in QUALITY_CATEGORIES if c in self.examples}


@dataclass
class EngineResult:
    """Finished metrics: the whole input as one batch, each step as its own, and per-file stats."""

    overall: BatchResult
    steps: dict[int, BatchResult]
    sources: dict[str, SourceStats]
    device: str
    dtype: str
    groups: dict[str, dict[Any, BatchResult]] = field(default_factory=dict)  # column -> label -> result


def resolve_device(name: str) -> torch.device:
    """Map `auto|cpu|cuda|cuda:N` to a torch device, refusing CUDA when none is present."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UsageError(f"unknown device '{name}'", hint="use auto, cpu, cuda or cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"device '{name}' requested but CUDA is not available", hint="use --device cpu")
    if device.type not in ("cpu", "cuda"):
        raise UsageError(f"unsupported device '{name}'", hint="use auto, cpu, cuda or cuda:N")
    return device


def describe_inputs(names: tuple[str, ...]) -> str:
    """Name the input in a message: its path for one file, the count and the first for several."""
    if not names:
        return "the input"
    if len(names) == 1:
        return names[0]
    return f"the {len(names)} input files (first: {names[0]})"


class Analysis:
    """The whole engine state of one analysis: update with Batches, merge partial states, then finish.

    A partial state built on one shard (a Ray task, a file) merges into another exactly as if both
    shards had been streamed through one state, so the local and distributed engines agree.
    """

    def __init__(self, correction: ResolvedCorrection, device: torch.device, dtype: str = "float32",
                 by_step: bool = False, rounds: bool = True, group_by: tuple[str, ...] = (),
                 bootstrap: int = DEFAULT_REPLICATES, extras: bool = True, fused: bool = False) -> None:
        if dtype not in DTYPES:
            raise UsageError(f"unknown dtype '{dtype}'", hint="use float32 or float64")
        self.correction = correction
        self.device = device
        self.dtype = dtype
        self.by_step = by_step
        self.rounds = rounds
        self.group_by = group_by
        self.overall = BatchAccumulator(correction, device, rounds, extras=extras, bootstrap=bootstrap)
        # xtuner computes per pack (one input file here) and merges packs; keep one family state per file.
        self.per_pack = correction.family_spec is not None and correction.family_spec.per_pack
        self.packs: dict[str, FamilyAccumulator] = {}
        self.per_step: dict[int, BatchAccumulator] = {}
        self.per_group: dict[str, dict[Any, BatchAccumulator]] = {column: {} for column in group_by}
        self.sources: dict[str, SourceStats] = {}
        self.any_rows = False
        self._awake: dict[int, BatchAccumulator] = {}  # breakdown states updated since they were last packed
        # On a GPU, consecutive reader batches of one file are joined into chunks of up to
        # DEVICE_CHUNK_POSITIONS positions before they go to the device; the CPU joins only small ones (join_small).
        self.join_batches = device.type != "cpu"
        self._small = join_small()
        self.chunk_positions = DEVICE_CHUNK_POSITIONS if self.join_batches else MAX_CHUNK_POSITIONS
        self._held: list[Batch] = []
        self._held_positions = 0
        self._staging: Staging | None = None
        self.fused = fused  # take the per-token sums from the fused CPU sweep where it runs (engine/kernels/sweep.py)

    def _breakdown(self) -> BatchAccumulator:
        # Steps and groups report metrics and rounds only: no what-if, worst sequences, intervals or findings' tables.
        return BatchAccumulator(self.correction, self.device, self.rounds, extras=False, bootstrap=0, findings=False)

    def update(self, whole: Batch) -> None:
        """Fold one reader batch (whole sequences) into every accumulator (a later call, while small or on a GPU)."""
        if not self.join_batches:
            for batch in self._small.add(whole):
                self._fold(batch)
            return
        if self._held and (not follows(self._held[-1], whole) or self._new_step(whole)
                           or self._held_positions + whole.num_positions > self.chunk_positions):
            self.flush()
        self._held.append(whole)
        self._held_positions += whole.num_positions
        if self._held_positions >= self.chunk_positions:
            self.flush()

    def _new_step(self, whole: Batch) -> bool:
        """Under --by step, whether `whole` starts another step than the held batches end with: a chunk of one
        step is folded whole, where one of several steps would be moved to the device again step by step."""
        last = self._held[-1].steps
        return self.by_step and last is not None and whole.steps is not None and bool(last[-1] != whole.steps[0])

    def flush(self) -> None:
        """Fold the reader batches held back for a larger chunk."""
        for batch in self._small.flush():
            self._fold(batch)
        if self._held:
            held, self._held, self._held_positions = self._held, [], 0
            if self._staging is None:
                self._staging = Staging(self.device, self.chunk_positions)
            self._staging.begin()
            try:
                self._fold(concat_rows(held, self._staging.join))
            finally:  # the set is marked however the fold ended, so a later begin() waits for its copies
                self._staging.end()

    def _fold(self, whole: Batch) -> None:
        compute_dtype = DTYPES[self.dtype]
        for batch in bounded(whole, self.chunk_positions):
            if batch.num_rows:
                self.fold(batch, make_chunk(batch, self.device, compute_dtype, self.fused))

    def fold(self, batch: Batch, chunk: Chunk) -> None:
        """Fold one bounded batch whose chunk is already made (several analyses may share one chunk)."""
        self.any_rows = True
        columns = self._breakdown_columns(batch)
        compute_dtype = DTYPES[self.dtype]
        parts = self._parts(batch, [keys for _, keys in columns]) if columns else None
        if not columns:
            start_token_sums(chunk)  # the fused sweep, on its own thread while the first accumulators fold
            self.overall.update(chunk)
        elif parts is not None:
            # Each part is folded once, into a fresh breakdown state (a step's first part: the step's new state)
            # that merges into its steps' and groups' states and the overall one, as a shard's would. The overall
            # what-if ladder and worst rows, which no part has, fold the chunk once, whole (analysis.WHOLE_CHUNK).
            whole = len(parts) > 1
            for labels_of_part, rows in parts:
                part = chunk if rows is batch else make_chunk(rows, self.device, compute_dtype, self.fused)
                start_token_sums(part)
                shared = self._first_state(columns, labels_of_part) or self._breakdown()
                self.overall.update_from(part, shared, shared.update(part), whole)
                touched = [self._state(states, label) for (states, _), label in zip(columns, labels_of_part,
                                                                                    strict=True)]
                for state in touched:
                    if state is not shared:
                        state.merge(shared)
                self._rest(touched, keep=len(touched))  # the states before this part's are at rest
            if whole:
                self.overall.update_whole(chunk)
        else:  # a family reads the rows' order: each group's rows are analyzed again as a batch of their own
            start_token_sums(chunk)
            self.overall.update(chunk)
            touched = []
            for states, keys in columns:
                for (label,), part in combined_parts(batch, [keys], bounded=False) or ():
                    touched.append(self._state(states, label))
                    touched[-1].update(make_chunk(part, self.device, compute_dtype, self.fused))
            self._rest(touched, keep=0)
        if self.per_pack:
            pack = self.packs.setdefault(batch.source, FamilyAccumulator(self.correction.family_spec, self.device))
            pack.update(chunk, ChunkDecisions())
        stats = self.sources.setdefault(batch.source, SourceStats())
        stats.add(batch.num_rows, chunk.quality)
        wanted = stats.wanted_examples(chunk.quality)
        if wanted:  # only chunks with flagged tokens pay for this, until the examples are collected
            stats.add_examples(quality_examples(batch, wanted, EXAMPLES_PER_CATEGORY))

    def _rest(self, touched: list[BatchAccumulator], keep: int) -> None:
        """Pack the breakdown states updated so far but the last `keep` of `touched` (the last part's, which the
        next chunk most likely continues), once there are more than PACK_AFTER: a --by step state at rest holds
        its occupied sketch buckets, not 3 MiB of counts."""
        for state in touched:
            self._awake[id(state)] = state
        if not self._many_breakdowns():
            return
        busy = {id(state) for state in touched[len(touched) - keep:]}
        for key in [key for key in self._awake if key not in busy]:
            self._awake.pop(key).pack()

    def _many_breakdowns(self) -> bool:
        """Whether the steps' and groups' states are more than PACK_AFTER (those at rest are then packed)."""
        return len(self.per_step) + sum(map(len, self.per_group.values())) > PACK_AFTER

    def _parts(self, batch: Batch, keys: list[np.ndarray]) -> list[tuple[tuple[Any, ...], Batch]] | None:
        """The batch's rows as parts of one label in every column, each to be folded once: its runs of
        consecutive rows, or, where they are many and no family reads the rows' order (micro-batches, packs),
        one part per combination of labels (rows keep their file indices); None: neither applies."""
        runs = find_pieces(keys, batch.num_rows)
        if runs is not None:
            return [(tuple(k[start] for k in keys), batch if stop - start == batch.num_rows
                     else batch.slice_rows(start, stop)) for start, stop in runs]
        if self.overall.family is None and self.overall.trainer is None:
            return combined_parts(batch, keys)
        return None

    def _breakdown_columns(self, batch: Batch) -> list[tuple[dict[Any, BatchAccumulator], np.ndarray]]:
        """Per --by step / --by column: its states by label, and the batch's label per row."""
        columns: list[tuple[dict[Any, BatchAccumulator], np.ndarray]] = []
        if self.by_step and batch.steps is not None:
            columns.append((self.per_step, labels(batch.steps)))
        for column in self.group_by:
            keys = group_keys(batch, column)
            check_group_count(column, self.per_group[column], keys)
            columns.append((self.per_group[column], keys))
        return columns

    def _first_state(self, columns: list[tuple[dict[Any, BatchAccumulator], np.ndarray]],
                     labels: tuple[Any, ...]) -> BatchAccumulator | None:
        """The state made now for a part's label, when there is one breakdown column and the label is new (merging
        the part's own state into a fresh one would only copy it), else None."""
        if len(columns) != 1:
            return None
        states = columns[0][0]
        known = len(states)
        state = self._state(states, labels[0])
        return state if len(states) > known else None

    def _state(self, states: dict[Any, BatchAccumulator], label: Any) -> BatchAccumulator:
        label = label.item() if isinstance(label, np.generic) else label
        if label not in states:
            states[label] = self._breakdown()
        return states[label]

    def merge(self, other: Analysis) -> None:
        """Fold a partial state built on another shard of the same input into this one."""
        self.flush()
        other.flush()
        self.any_rows |= other.any_rows
        self.overall.merge(other.overall)
        _merge_by_key(self.packs, other.packs)
        _merge_by_key(self.per_step, other.per_step)
        for column, accumulators in other.per_group.items():
            _merge_by_key(self.per_group.setdefault(column, {}), accumulators)
        self._rest([*(self.per_step[step] for step in other.per_step),
                    *(self.per_group[column][label] for column, states in other.per_group.items() for label in states)],
                   keep=0)
        for source, stats in other.sources.items():
            target = self.sources.setdefault(source, SourceStats())
            target.add(stats.sequences, stats.quality)
            target.add_examples(stats.examples)

    def finish(self, source_names: tuple[str, ...] = ()) -> EngineResult:
        """Compute every metric; raise when the input as a whole has no row or no valid token."""
        self.flush()
        self._staging = None  # its page-locked buffers go back to torch's pinned cache now, not at collection
        correction = self.correction
        names = source_names or tuple(self.sources)
        if not self.any_rows:
            raise DataError(
                f"{describe_inputs(names)} has no rows",
                hint="check that the dump files are not empty",
            )
        result = self.overall.compute()
        spec = correction.family_spec
        if len(self.packs) > 1 and spec is not None:
            merged = merge_xtuner_packs([pack.compute().family for pack in self.packs.values()],
                                        valid_only=spec.merge_valid_packs_only)
            result.metrics = {k: v for k, v in result.metrics.items() if not k.startswith(spec.prefix)}
            result.metrics.update({k: v if math.isfinite(v) else None for k, v in merged.items()})
            result.notes.append(f"xtuner metrics merged over {len(self.packs)} packs (one per input file) as "
                                "merge_rollout_is_metrics does: mean, or max / min for max / min keys, in float32")
        if result.valid_tokens == 0 and not self.per_pack:
            raise DataError(
                f"no valid token in {describe_inputs(names)}: every response_mask value is 0 (or every masked-in "
                "log-prob is NaN/inf/sentinel), so there is nothing to measure (verl raises ValueError here)",
                hint="check the mask column (--column response_mask=NAME) or the dump itself",
            )
        if result.icepop_rejects_all:
            threshold = correction.is_threshold
            what = (f"the IcePop band {threshold.lower:g}_{threshold.upper:g} rejects every valid token's IS weight"
                    if threshold.lower is not None else f"the TIS bound {threshold.upper:g} truncates every valid "
                    "token's IS weight to 0 (it is below float32's range)")
            raise ConfigError(
                f"{what}, so the effective sample size is undefined (verl crashes with ZeroDivisionError here)",
                hint="widen --is-threshold (e.g. 0.5_5.0 or 2.0)",
            )
        many = self._many_breakdowns()
        steps = {step: _computed(acc, many) for step, acc in sorted(self.per_step.items())}
        groups = {
            column: {label: _computed(acc, many) for label, acc in sorted(accumulators.items(), key=_label_order)}
            for column, accumulators in self.per_group.items()
        }
        return EngineResult(overall=result, steps=steps, sources=self.sources, device=str(self.device),
                            dtype=self.dtype, groups=groups)


def run(
    batches: Iterable[Batch],
    correction: ResolvedCorrection,
    device: str = "auto",
    dtype: str = "float32",
    by_step: bool = False,
    threads: int | None = 1,
    source_names: tuple[str, ...] = (),
    rounds: bool = True,
    group_by: tuple[str, ...] = (),
    bootstrap: int = DEFAULT_REPLICATES,
    fused: bool = False,
) -> EngineResult:
    """Stream batches through the accumulators; raise when the input as a whole has no valid token.

    `by_step` also computes every step as its own batch, `group_by` every value of each named column
    (`Batch.groups`); each group is a full batch of its own, so token means of the groups combine to the
    overall token mean with the groups' valid-token counts as weights. `fused`: take the per-token sums
    from the fused CPU sweep where it runs (engine/kernels/sweep.py; worth its start-up on large inputs only).
    """
    if threads:
        torch.set_num_threads(threads)
    analysis = Analysis(correction, resolve_device(device), dtype, by_step, rounds, group_by, bootstrap, fused=fused)
    for batch in batches:
        analysis.update(batch)
    return analysis.finish(source_names)


def _merge_by_key(mine: dict[Any, Any], theirs: dict[Any, Any]) -> None:
    """Merge each of `theirs` into the state under its key in `mine`, or adopt it where `mine` has none."""
    for key, state in theirs.items():
        if key in mine:
            mine[key].merge(state)
        else:
            mine[key] = state


def _computed(state: BatchAccumulator, pack: bool) -> BatchResult:
    """A breakdown state's result; packed again after, when there are many (computing unpacks its counts)."""
    result = state.compute()
    if pack:
        state.pack()
    return result


def _label_order(item: tuple[Any, Any]) -> tuple[bool, Any]:
    # Labels of one column are all int or all str, except when inputs disagree: ints first then.
    label = item[0]
    return (isinstance(label, str), label if isinstance(label, str) else int(label))
