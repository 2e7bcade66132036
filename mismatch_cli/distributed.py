"""`--engine ray`: the API's driver for a Ray cluster. It plans work items, reads them on the workers and
merges the engine's partial states.

Work items are the read-ahead planner's units (a run of a parquet file's row groups, or a whole file),
so every task reads exactly the batches the local engine reads. Object-store inputs are read by the
workers themselves; the driver's object-store environment (AWS_*, GOOGLE_*) travels with the job so
they reach the same endpoint with the same credentials.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Sequence

import numpy as np

from mismatch_cli.correction import ResolvedCorrection
from mismatch_cli.engine.distributed import merge_states, partial_state
from mismatch_cli.engine.partial import PartialSpec
from mismatch_cli.engine.runner import EngineResult
from mismatch_cli.errors import UsageError
from mismatch_cli.io import InputFile, ReadOptions, read_work_item
from mismatch_cli.io.parallel import plan
from mismatch_cli.io.remote import is_remote, remote_env


def run_on_ray(
    files: Sequence[InputFile],
    read_options: ReadOptions,
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

    items = plan(files)
    spec = PartialSpec(correction, dtype, by_step, rounds, tuple(group_by), bootstrap)
    if not ray.is_initialized():
        _refuse_unreachable(address or os.environ.get("RAY_ADDRESS"))
        env = remote_env() if any(is_remote(f.path) for f in files) else {}
        # Ray's own INFO lines and Ray Data's progress bars would flood stderr (and `-q` promises quiet).
        ray.init(address=address, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True,
                 runtime_env={"env_vars": env} if env else None, logging_level=logging.ERROR)
    logging.getLogger("ray.data").setLevel(logging.ERROR)
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False
    context.print_on_execution_start = False

    def partial_states(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        states = [partial_state(read_work_item(items[int(index)], read_options), spec) for index in batch["index"]]
        return {"index": batch["index"], "state": np.array(states, dtype=object)}

    dataset = ray.data.from_items([{"index": i} for i in range(len(items))])
    rows = dataset.map_batches(partial_states, batch_size=1, batch_format="numpy").take_all()
    ordered = sorted(rows, key=lambda r: int(r["index"]))
    return merge_states((row["state"] for row in ordered), spec, source_names)


def _refuse_unreachable(address: str | None, timeout: float = 5.0) -> None:
    """UsageError when nothing answers at a `host:port` cluster address: ray.init would retry for minutes."""
    if not address or address in ("auto", "local"):
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        return  # a form Ray resolves itself
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as exc:
        raise UsageError(f"cannot reach a Ray cluster at {address} ({exc.strerror or exc})",
                         hint="check --ray-address / RAY_ADDRESS, or leave both out to start a local cluster") from None


__all__ = ["run_on_ray"]
