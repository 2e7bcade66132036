"""`--engine ray`: the same accumulators over Ray Data, one partial state per work item, one merge.

Work items are the read-ahead planner's units (a run of a parquet file's row groups, or a whole file),
so every task reads exactly the batches the local engine reads; `map_batches` turns items into
pickled partial `Analysis` states and the driver merges them in input order. Results equal the local
engine's up to float64 summation order.
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from mismatch_cli.correction import ResolvedCorrection
from mismatch_cli.engine.runner import Analysis, EngineResult
from mismatch_cli.errors import UsageError


def _read_item(item: Any, options: Any) -> Any:
    from mismatch_cli.io import _read_file
    from mismatch_cli.io.parquet import read_parquet

    if item.row_groups is not None:
        return read_parquet(item.path, options, item.row_groups)
    return _read_file(item.path, item.format, options)


def run_on_ray(
    files: Sequence[Any],
    read_options: Any,
    correction: ResolvedCorrection,
    dtype: str = "float32",
    by_step: bool = False,
    rounds: bool = True,
    group_by: tuple[str, ...] = (),
    bootstrap: int = 200,
    address: str | None = None,
    source_names: tuple[str, ...] = (),
) -> EngineResult:
    """Analyze on a Ray cluster (started locally when none is running) and merge the partial states."""
    try:
        import ray
        import ray.data
    except ImportError:
        raise UsageError("--engine ray needs Ray Data, which is not installed",
                         hint="pip install 'mismatch-cli[ray]'") from None
    from mismatch_cli.io.parallel import plan

    items = plan(files)
    if not ray.is_initialized():
        ray.init(address=address, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)

    def partial_states(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        torch.set_num_threads(1)
        states = []
        for index in batch["index"]:
            analysis = Analysis(correction, torch.device("cpu"), dtype, by_step, rounds, group_by, bootstrap)
            for piece in _read_item(items[int(index)], read_options):
                analysis.update(piece)
            states.append(pickle.dumps(analysis))
        return {"index": batch["index"], "state": np.array(states, dtype=object)}

    dataset = ray.data.from_items([{"index": i} for i in range(len(items))])
    rows = dataset.map_batches(partial_states, batch_size=1, batch_format="numpy").take_all()
    merged: Analysis | None = None
    for row in sorted(rows, key=lambda r: int(r["index"])):
        state: Analysis = pickle.loads(row["state"])
        if merged is None:
            merged = state
        else:
            merged.merge(state)
    if merged is None:
        merged = Analysis(correction, torch.device("cpu"), dtype, by_step, rounds, group_by, bootstrap)
    return merged.finish(source_names)
