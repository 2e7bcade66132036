"""The optional advantages column: per token or per row, in parquet and JSONL, carried to the chunk's tokens."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from mismatch_cli.engine.core.chunk import make_chunk
from mismatch_cli.errors import InputError
from mismatch_cli.io import reader
from mismatch_cli.io.options import ReadOptions

NAN = float("nan")
BASE = {"old_log_probs": [[-1.0, -2.0, -3.0], [-0.5, -0.1]],
        "rollout_log_probs": [[-1.1, -2.0, NAN], [-0.4, -0.2]],
        "response_mask": [[1, 0, 1], [1, 1]]}


def _read(path: Path, file_format: str = "parquet"):
    batches = list(reader(file_format)(str(path), ReadOptions()))
    assert len(batches) == 1
    return batches[0]


def _write(tmp_path: Path, **extra) -> Path:
    path = tmp_path / "dump.parquet"
    pq.write_table(pa.table({**BASE, **extra}), path)
    return path


def test_per_token_advantages_reach_the_valid_and_masked_tokens(tmp_path: Path) -> None:
    batch = _read(_write(tmp_path, advantages=[[0.5, 0.6, 0.7], [-1.0, -2.0]]))
    np.testing.assert_array_equal(batch.advantages, [0.5, 0.6, 0.7, -1.0, -2.0])
    chunk = make_chunk(batch, torch.device("cpu"), torch.float64)
    # valid: mask 1 and finite (row 0 token 2 has a NaN rollout); masked-in: mask 1 whatever the value
    assert chunk.advantages.tolist() == [0.5, -1.0, -2.0]
    assert chunk.masked_advantages.tolist() == [0.5, 0.7, -1.0, -2.0]


def test_a_per_row_advantage_covers_its_row(tmp_path: Path) -> None:
    batch = _read(_write(tmp_path, advantage=[1.5, -0.5]))
    np.testing.assert_array_equal(batch.advantages, [1.5, 1.5, 1.5, -0.5, -0.5])


def test_without_the_column_there_are_no_advantages(tmp_path: Path) -> None:
    batch = _read(_write(tmp_path))
    assert batch.advantages is None
    assert make_chunk(batch, torch.device("cpu"), torch.float64).masked_advantages is None


def test_a_per_token_list_of_another_length_names_file_row_and_column(tmp_path: Path) -> None:
    path = _write(tmp_path, advantages=[[1.0], [2.0, 3.0]])
    with pytest.raises(InputError) as info:
        _read(path)
    assert str(path) in str(info.value) and "row 0" in str(info.value) and "'advantages'" in str(info.value)


def test_text_advantages_are_refused(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="advantages"):
        _read(_write(tmp_path, advantages=["a", "b"]))


def test_rows_selected_or_sliced_keep_their_advantages(tmp_path: Path) -> None:
    batch = _read(_write(tmp_path, advantages=[[0.5, 0.6, 0.7], [-1.0, -2.0]]))
    assert batch.slice_rows(1, 2).advantages.tolist() == [-1.0, -2.0]
    assert batch.select_rows(np.array([True, False])).advantages.tolist() == [0.5, 0.6, 0.7]


def test_jsonl_exports_carry_advantages(tmp_path: Path) -> None:
    path = tmp_path / "rank_0.jsonl"
    records = [{"trainer_logprobs": [-1.0, -2.0], "inference_logprobs": [-1.1, -2.1], "loss_mask": [True, True],
                "advantages": [0.1, 0.2]},
               {"trainer_logprobs": [-1.0], "inference_logprobs": [-1.1], "loss_mask": [True], "advantages": [0.3]}]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert _read(path, "prime-rl").advantages.tolist() == [0.1, 0.2, 0.3]
