"""`--jobs N`: the API's driver for worker processes on this machine (the standard library's process pool).

The work items are the read-ahead planner's (io.parallel.plan); each worker reads, decodes, validates and folds
one item into a partial state (engine/distributed.py's partial_state, one torch thread each) and the parent
merges the states in input order, as the in-process engine does item by item (engine/distributed.fold_items), so the
numbers are the same bit for bit however many processes ran. At most 2 x N items are in flight, so the parent
holds a bounded number of pickled states. On Linux the workers are forked once the engine and its kernels are loaded
(a fork server or spawn elsewhere); they leave Ctrl-C to the parent, which stops them. The Ray engine stays the way
past one machine.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from mismatch_cli.batch import Batch
from mismatch_cli.errors import MismatchError, UsageError
from mismatch_cli.io import InputFile, ReadOptions, read_work_item
from mismatch_cli.io.handoff import load_batches
from mismatch_cli.io.parallel import WorkItem, plan
from mismatch_cli.system.runtime import worker_process

if TYPE_CHECKING:  # the engine (torch) is imported when a run starts, not when the API is
    from mismatch_cli.engine.partial import PartialSpec
    from mismatch_cli.engine.runner import EngineResult
    from mismatch_cli.io.early import EarlyReads

MIN_JOBS_BYTES = 256 << 20  # auto: below this much input, one process (a worker's start costs ~1 s of imports)
MAX_JOBS = 256


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the OS says, else the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def read_threads() -> int:
    """Read-ahead threads of a one-process run: half the usable cores, from 2 to 8 (pyarrow's decoding releases the
    GIL; on a GPU these threads are what feeds it)."""
    return min(8, max(2, usable_cores() // 2))


def parse_jobs(text: str | None) -> int | None:
    """`--jobs`: `auto` (None) or a whole number of worker processes from 1 to MAX_JOBS (else a usage error)."""
    if text is None or str(text).strip().lower() == "auto":
        return None
    from mismatch_cli.system.numbers import parse_integer

    return parse_integer(text, "--jobs", 1, MAX_JOBS, f"use --jobs {usable_cores()} (this machine's usable cores), "
                         "1 for one process, or auto")


def resolve_jobs(jobs: int | None, files: Sequence[InputFile], device: str) -> int:
    """The worker processes a local CPU run uses: `jobs` as given (1 = in this process), or, when None, the usable
    cores on an input of MIN_JOBS_BYTES or more, and 1 below it or on a GPU (`auto` takes one when torch sees it);
    run_on_processes starts no more workers than there are work items."""
    if jobs is not None:
        if isinstance(jobs, bool) or not isinstance(jobs, int) or not 1 <= jobs <= MAX_JOBS:
            raise UsageError(f"--jobs must be a whole number from 1 to {MAX_JOBS}, got {jobs!r}",
                             hint=f"use --jobs {usable_cores()} (this machine's usable cores), or 1 for one process")
        if jobs > 1 and device not in ("auto", "cpu"):
            raise UsageError(f"--jobs {jobs} runs worker processes on the CPU, so it does not combine with --device "
                             f"{device}", hint=f"drop --jobs (this process feeds the GPU), or use --device cpu --jobs "
                             f"{jobs}")
        return jobs
    if device not in ("auto", "cpu") or not _large(files):
        return 1
    if device == "auto" and gpu_visible():  # `auto` takes the GPU, which one process feeds
        return 1
    return max(1, usable_cores())  # not capped by plan(files) here: that would read every parquet footer twice


def early_readers(jobs: int | None, files: Sequence[InputFile], device: str) -> int:
    """The processes that read work items while the engine loads (io/early.py): `jobs` - 1 for `--jobs N` (checked
    by resolve_jobs, which needs no torch for it); on an input of MIN_JOBS_BYTES or more with `auto`, the usable
    cores but one (workers or a GPU will take them); none for one process on the CPU."""
    if jobs is not None:
        return resolve_jobs(jobs, files, device) - 1
    if not _large(files) or not (device in ("auto", "cpu") or device.startswith("cuda")):
        return 0
    return usable_cores() - 1


GPU_DRIVER_NODES = ("/dev/nvidiactl", "/dev/kfd", "/dev/dxg")  # NVIDIA's driver, AMD's (ROCm), WSL2's


def gpu_driver_present() -> bool:
    """Whether this machine has a GPU driver torch could use, without importing torch: its device node on Linux,
    never on macOS (torch has no CUDA there), assumed elsewhere."""
    if sys.platform == "darwin":
        return False
    if sys.platform.startswith("linux"):
        return any(os.path.exists(node) for node in GPU_DRIVER_NODES)
    return True


def gpu_visible() -> bool:
    """Whether torch sees a GPU (what `--device auto` takes); torch is imported only where a GPU driver is."""
    if not gpu_driver_present():
        return False
    import torch

    return torch.cuda.is_available()


def gpu_may_decide(jobs: int | None, files: Sequence[InputFile], device: str) -> bool:
    """Whether the processes of a run wait on torch's answer to "is there a GPU?" (`auto` on an input of
    MIN_JOBS_BYTES or more, on a machine with a GPU driver), so that the caller reads ahead meanwhile."""
    return jobs is None and device == "auto" and _large(files) and gpu_driver_present()


def _large(files: Sequence[InputFile]) -> bool:
    """Whether the inputs hold MIN_JOBS_BYTES or more together (where `auto` starts workers)."""
    return sum(f.bytes for f in files) >= MIN_JOBS_BYTES


def _context() -> multiprocessing.context.BaseContext:
    """Fork on Linux, from a parent that has imported the engine and whose read-ahead threads have stopped (the
    workers start at once, with torch loaded; only the SHA-256 thread of an input under 256 MiB may still run, and
    it holds no lock a worker takes); elsewhere a fork server that imported the engine once, else spawn."""
    methods = multiprocessing.get_all_start_methods()
    if sys.platform.startswith("linux") and "fork" in methods:
        return multiprocessing.get_context("fork")
    if "forkserver" in methods:
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(["mismatch_cli.engine.distributed", "mismatch_cli.io"])
        return context
    return multiprocessing.get_context("spawn")


@contextmanager
def _main_hidden() -> Iterator[None]:
    """Hide the caller's `__main__` while workers start: they need nothing from it, and multiprocessing would run a
    script again in each worker (one without the `if __name__ == "__main__":` guard would start a pool there)."""
    main = sys.modules.get("__main__")
    saved = {name: getattr(main, name) for name in ("__file__", "__spec__") if hasattr(main, name)}
    try:
        for name in saved:
            setattr(main, name, None) if name == "__spec__" else delattr(main, name)
        yield
    finally:
        for name, value in saved.items():
            setattr(main, name, value)


def _stop(pool: ProcessPoolExecutor) -> None:
    """Stop the workers now (an error or a signal in the parent): queued items are dropped and running ones killed,
    since a worker blocked writing a state nobody will read would otherwise outlive the run."""
    for process in list((getattr(pool, "_processes", None) or {}).values()):
        if process.is_alive():
            process.terminate()
    pool.shutdown(wait=False, cancel_futures=True)


def _batches(work: WorkItem | str, options: ReadOptions) -> Iterable[Batch]:
    """A work item's Batches: read, or mapped from the shared-memory file an early reader handed over."""
    return load_batches(work) if isinstance(work, str) else read_work_item(work, options)


def _fold_item(work: WorkItem | str, options: ReadOptions, spec: PartialSpec) -> tuple[bytes, int]:
    """One work item's pickled partial state and the rows it read, in a worker (one torch thread)."""
    import torch

    from mismatch_cli.engine.distributed import dumps_state, fold_partial

    torch.set_num_threads(1)
    state, rows = fold_partial(_batches(work, options), spec)
    return dumps_state(state), rows


class _Schedule:
    """Hands out the items in input order: the workers' next ones are submitted ahead (at most `window` in flight),
    and the parent folds the next one itself whenever the state to merge next is not ready yet. An item read early
    is submitted once its reader has handed it over."""

    def __init__(self, pool: ProcessPoolExecutor, items: list[WorkItem], options: ReadOptions, spec: PartialSpec,
                 window: int, early: EarlyReads | None) -> None:
        self.pool, self.items, self.options, self.spec, self.window = pool, items, options, spec, window
        self.early = early
        self.next_item = 0
        self.inflight: dict[int, Future[tuple[bytes, int]]] = {}
        self.local: dict[int, tuple[Any, int]] = {}

    def _work(self, index: int) -> WorkItem | str:
        handoff = self.early.handoff(index) if self.early is not None else None
        return self.items[index] if handoff is None else handoff

    def _feed(self) -> None:
        while len(self.inflight) < self.window and self.next_item < len(self.items):
            index = self.next_item
            if self.early is not None and not self.early.ready(index):
                return  # its reader is still on it
            self.inflight[index] = self.pool.submit(_fold_item, self._work(index), self.options, self.spec)
            self.next_item += 1

    def states(self) -> Iterator[tuple[Any, int]]:
        """(state, rows read) per item in input order: an Analysis the parent folded, or a worker's pickled one."""
        from mismatch_cli.engine.distributed import fold_partial

        for index in range(len(self.items)):
            self._feed()
            while index not in self.local and not (index in self.inflight and self.inflight[index].done()) \
                    and self.next_item < len(self.items):
                mine = self.next_item  # the parent works instead of waiting
                self.next_item += 1
                self.local[mine] = fold_partial(_batches(self._work(mine), self.options), self.spec)
            yield self.local.pop(index) if index in self.local else self.inflight.pop(index).result()


def run_on_processes(files: Sequence[InputFile], read_options: ReadOptions, spec: PartialSpec, jobs: int,
                     source_names: tuple[str, ...] = (),
                     on_batch: Callable[[Any], None] | None = None, early: EarlyReads | None = None) -> EngineResult:
    """Analyze on this process and `jobs` - 1 worker processes, merging the partial states in input order (`early`:
    the first items' readers, started before the engine loaded; stopped here, closed by the caller)."""
    import torch

    from mismatch_cli.engine.distributed import merge_states

    torch.set_num_threads(1)  # as every worker and the one-process run: the same arithmetic
    items = early.items if early is not None else plan(files)
    if len(items) < 2:  # nothing to share: no worker is started
        from mismatch_cli.engine.distributed import fold_partial

        def here() -> Iterator[Any]:
            for item in items:
                state, rows = fold_partial(_batches(item, read_options), spec)
                if on_batch is not None:
                    on_batch(SimpleNamespace(num_rows=rows))
                yield state

        return merge_states(here(), spec, source_names)
    workers = min(jobs - 1, len(items) - 1)
    if spec.fused and _context().get_start_method() == "fork":
        from mismatch_cli.engine.kernels.sweep import kernels_for, preload

        correction = spec.correction  # the forked workers inherit the loaded kernels this configuration calls
        preload(kernels_for(bool(correction.rs_options), correction.is_level == "token"))
    if early is not None:
        early.stop()  # the engine has loaded: from here on the workers read
    from mismatch_cli.engine.kernels.sweep import inline

    # Processes on every core: each one's token sweep runs on its main thread (the forked workers inherit it).
    with _main_hidden(), inline(workers + 1 >= usable_cores()), \
            ProcessPoolExecutor(max_workers=workers, mp_context=_context(), initializer=worker_process) as pool:
        try:
            def counted() -> Iterator[Any]:
                for state, rows in _Schedule(pool, items, read_options, spec, 2 * workers, early).states():
                    if on_batch is not None:
                        on_batch(SimpleNamespace(num_rows=rows))  # the progress bar counts rows
                    yield state

            return merge_states(counted(), spec, source_names)
        except BrokenProcessPool:
            _stop(pool)
            raise MismatchError(f"a worker process of --jobs {jobs} stopped before it finished (killed, or out of "
                                "memory)", hint="run again with fewer processes (--jobs 1 reads in this process)") \
                from None
        except BaseException:
            _stop(pool)
            raise


__all__ = ["MIN_JOBS_BYTES", "early_readers", "gpu_may_decide", "gpu_visible", "parse_jobs", "read_threads",
           "resolve_jobs", "run_on_processes", "usable_cores"]
