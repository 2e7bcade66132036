"""The engine's side of a distributed run: one partial state per work item, and their merge.

A worker turns the Batches of one work item into a pickled partial `Analysis`; the driver merges the
states in input order. Nothing here reads files or knows Ray: `mismatch_cli/distributed.py` (Ray) and
`mismatch_cli/processes.py` (`--jobs N`) plan the work, read it on the workers and call these two functions.
The one-process CPU path folds the same work items the same way (fold_items), so the numbers are the same
bit for bit however many processes ran.
"""

from __future__ import annotations

import io
import itertools
import pickle
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch

from mismatch_cli.batch import Batch
from mismatch_cli.engine.partial import PartialSpec
from mismatch_cli.engine.runner import Analysis, EngineResult


def _empty(spec: PartialSpec) -> Analysis:
    return Analysis(spec.correction, torch.device("cpu"), spec.dtype, spec.by_step, spec.rounds, spec.group_by,
                    spec.bootstrap, fused=spec.fused)


def fold_partial(batches: Iterable[Batch], spec: PartialSpec) -> tuple[Analysis, int]:
    """The accumulator state of some Batches (one work item) and the rows they hold."""
    analysis = _empty(spec)
    rows = 0
    for batch in batches:
        analysis.update(batch)
        rows += batch.num_rows
    analysis.flush()
    return analysis, rows


def partial_state(batches: Iterable[Batch], spec: PartialSpec, threads: int | None = 1) -> bytes:
    """The pickled accumulator state of some Batches (on a worker: one torch thread per task by default)."""
    if threads is not None:
        torch.set_num_threads(threads)
    return dumps_state(fold_partial(batches, spec)[0])


def dumps_state(state: Analysis) -> bytes:
    """A partial state pickled with its CPU tensors as raw bytes, for `pickle.loads`."""
    buffer = io.BytesIO()
    _StatePickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(state)
    return buffer.getvalue()


class _StatePickler(pickle.Pickler):
    # torch pickles each tensor's storage through torch.save's legacy format: about 70 us a tensor both ways, 7 ms
    # for a work item's 56 tensors, all of it on the merging parent's side with many workers. A state holds no two
    # views of one storage, so each tensor travels as its own bytes.
    # The sketches' counts (4 of 3.2 MB) are mostly zeros: an integer tensor of SPARSE_FROM elements or more whose
    # nonzero elements are under a quarter travels as their (int32) indices and values.
    def reducer_override(self, obj: Any) -> Any:
        if type(obj) is not torch.Tensor or obj.device.type != "cpu" or obj.requires_grad \
                or obj.dtype not in _RAW_DTYPES:
            return NotImplemented
        values = obj.detach().contiguous().numpy().reshape(-1)
        if values.size >= SPARSE_FROM and values.dtype.kind in "iu":
            where = np.flatnonzero(values)
            if 4 * where.size < values.size < 1 << 31:
                return _sparse_tensor, (where.astype(np.int32).tobytes(), values[where].tobytes(), obj.dtype,
                                        tuple(obj.shape))
        return _tensor_from_bytes, (values.tobytes(), obj.dtype, tuple(obj.shape))


SPARSE_FROM = 4096
_RAW_DTYPES = (torch.float64, torch.float32, torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8,
               torch.bool)


def _tensor_from_bytes(data: bytes, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    if not data:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(data), dtype=dtype).reshape(shape)  # writable: merges add into it


def _sparse_tensor(where: bytes, values: bytes, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    dense = torch.zeros(shape, dtype=dtype)
    if where:
        dense.view(-1)[torch.frombuffer(bytearray(where), dtype=torch.int32).long()] = \
            torch.frombuffer(bytearray(values), dtype=dtype)
    return dense


def merge_states(states: Iterable[bytes | Analysis], spec: PartialSpec,
                 source_names: tuple[str, ...] = ()) -> EngineResult:
    """Merge partial states (pickled, or folded in this process) in the given (input) order and finish."""
    total: Analysis | None = None
    for state in states:
        part = pickle.loads(state) if isinstance(state, bytes) else state
        if total is None:
            total = part
        else:
            total.merge(part)
    return (total if total is not None else _empty(spec)).finish(source_names)


def fold_items(tagged: Iterable[tuple[int, Batch]], spec: PartialSpec,
               source_names: tuple[str, ...] = ()) -> EngineResult:
    """One process's run over batches tagged with their work item's index: a partial state per item, merged in input
    order, as `--jobs N` workers and the Ray engine fold them (one torch thread)."""
    torch.set_num_threads(1)
    items = itertools.groupby(tagged, key=lambda pair: pair[0])
    return merge_states((fold_partial((batch for _, batch in group), spec)[0] for _, group in items), spec,
                        source_names)
