"""No command hangs on a reader error or an abandoned read: cancellation reaches the read-ahead threads."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from adversarial.conftest import assert_clean_failure, mismatch

from mismatch_cli.errors import InputError
from mismatch_cli.io import InputFile, ReadOptions, iter_batches
from mismatch_cli.io.parallel import iter_batches_parallel

ROWS = 8192


def _wide(path: Path, mask: list[list[int]], extra: dict | None = None, row_group_size: int = 2048) -> Path:
    table = pa.table({
        "old_log_probs": [[-0.5, -0.4]] * ROWS,
        "rollout_log_probs": [[-0.51, -0.41]] * ROWS,
        "response_mask": mask,
        **(extra or {}),
    })
    pq.write_table(table, path, row_group_size=row_group_size)
    return path


def test_a_reader_error_in_a_many_row_group_file_exits(tmp_path: Path) -> None:
    # The case: 4 row groups of 2048 rows, a mask value 2 in row 1500; it never exited.
    mask = [[1, 1]] * ROWS
    mask[1500] = [1, 2]
    path = _wide(tmp_path / "bad_mask.parquet", mask)
    run = mismatch("analyze", path, timeout=90)
    assert_clean_failure(run, 3, "row 1500", "response_mask")


def test_by_a_column_with_too_many_values_exits(tmp_path: Path) -> None:
    path = _wide(tmp_path / "uids.parquet", [[1, 1]] * ROWS, {"uid": [f"u{i}" for i in range(ROWS)]})
    started = time.monotonic()
    run = mismatch("analyze", path, "--by", "uid", timeout=90)
    assert_clean_failure(run, 2, "--by uid", "more than 1000 distinct values")
    assert time.monotonic() - started < 60


def _reader(batches: int, fail_at: int | None = None):
    """A stand-in reader: `batches` items per file (the pool never looks inside them), failing at `fail_at`."""
    def read(path: str, file_format: str, options: ReadOptions) -> Iterator[int]:
        for index in range(batches):
            if fail_at is not None and index == fail_at:
                raise InputError(f"broken {path}")
            yield index
    return read


def _readers_alive() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("mismatch-read") and t.is_alive()]


def _finishes(action, seconds: float = 20.0) -> bool:
    """Run `action` on a helper thread; False when it is still running after `seconds` (a hang)."""
    worker = threading.Thread(target=action, daemon=True)
    worker.start()
    worker.join(seconds)
    return not worker.is_alive()


def test_closing_the_iterator_stops_every_read_ahead_thread() -> None:
    # Each file fills its queue exactly, so its reader then waits to hand over "done": before, that
    # wait had no end once the consumer stopped, and closing the iterator waited for it.
    files = [InputFile(f"f{i}", "slime", 1) for i in range(4)]
    batches = iter_batches_parallel(files, ReadOptions(), _reader(2), workers=2, depth=2)
    next(batches)
    assert _finishes(batches.close)
    deadline = time.monotonic() + 10
    while _readers_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _readers_alive()


def test_an_error_in_a_later_item_surfaces_while_earlier_readers_are_blocked() -> None:
    # File a fails after one batch; b and c fill their one-slot queues and then fail too, so their
    # readers wait to hand over their error, which nobody will take.
    files = [InputFile("a", "slime", 1), InputFile("b", "slime", 1), InputFile("c", "slime", 1)]
    read = _reader(50, fail_at=1)

    def consume() -> None:
        with pytest.raises(InputError, match="broken a"):
            for _ in iter_batches_parallel(files, ReadOptions(), read, workers=3, depth=1):
                pass

    assert _finishes(consume)


def test_an_error_from_the_consumer_does_not_hang(tmp_path: Path) -> None:
    # The engine raising (as --by does) while readers wait on full queues: iter_batches is closed
    # by the caller or collected; either way the process must be able to go on and exit.
    # 128-row groups, two per work item, 64-row batches: every item fills its 4-batch queue exactly.
    mask = [[1, 1]] * ROWS
    path = _wide(tmp_path / "ok.parquet", mask, row_group_size=128)
    files = [InputFile(str(path), "parquet", path.stat().st_size)]

    def consume() -> None:
        batches = iter_batches(files, ReadOptions(chunk_rows=64), workers=2)
        next(batches)
        time.sleep(1.0)  # the readers fill their queues and wait
        del batches  # abandoned without close: collected, which closes it

    assert _finishes(consume)


def test_background_hashes_cancel_without_waiting_for_the_rest(tmp_path: Path) -> None:
    from mismatch_cli.io.parallel import BackgroundHashes

    big = tmp_path / "big.bin"
    big.write_bytes(b"\0" * (64 << 20))
    hashes = BackgroundHashes([str(big)] * 50)  # 3.2 GB to hash in all
    hashes.cancel()
    assert _finishes(hashes.result, 10.0)
