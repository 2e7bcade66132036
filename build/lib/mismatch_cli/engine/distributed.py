"""The engine's side of a distributed run: one partial state per work item, and their merge.

A worker turns the Batches of one work item into a pickled partial `Analysis`; the driver merges the
states in input order. Nothing here reads files or knows Ray: `mismatch_cli/distributed.py` plans the
work, reads it on the workers and calls these two functions. Results equal the local engine's up to
float64 summation order.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from mismatch_cli.batch import Batch
from mismatch_cli.correction import ResolvedCorrection
from mismatch_cli.engine.runner import Analysis, EngineResult


@dataclass(frozen=True)
class PartialSpec:
    """What every partial state is built with (the same on every worker, so the states merge)."""

    correction: ResolvedCorrection
    dtype: str = "float32"
    by_step: bool = False
    rounds: bool = True
    group_by: tuple[str, ...] = ()
    bootstrap: int = 200


def _empty(spec: PartialSpec) -> Analysis:
    return Analysis(spec.correction, torch.device("cpu"), spec.dtype, spec.by_step, spec.rounds, spec.group_by,
                    spec.bootstrap)


def partial_state(batches: Iterable[Batch], spec: PartialSpec, threads: int | None = 1) -> bytes:
    """The pickled accumulator state of some Batches (on a worker: one torch thread per task by default)."""
    if threads is not None:
        torch.set_num_threads(threads)
    analysis = _empty(spec)
    for batch in batches:
        analysis.update(batch)
    analysis.flush()
    return pickle.dumps(analysis)


def merge_states(states: Iterable[bytes], spec: PartialSpec, source_names: tuple[str, ...] = ()) -> EngineResult:
    """Merge pickled partial states in the given (input) order and finish the analysis."""
    merged: Analysis | None = None
    for blob in states:
        state: Analysis = pickle.loads(blob)
        if merged is None:
            merged = state
        else:
            merged.merge(state)
    return (merged if merged is not None else _empty(spec)).finish(source_names)
