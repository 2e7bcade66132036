"""Wrong arguments to the library, and odd files through it, found by a review: the package's own errors
(UsageError exit 2, InputError exit 3) naming the argument, file or tensor, never a bare TypeError."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from safetensors.numpy import save_file

from mismatch_cli.api import analyze
from mismatch_cli.correction import CorrectionConfig
from mismatch_cli.dump import write_dump
from mismatch_cli.errors import InputError, UsageError
from mismatch_cli.report import Report

SINGLE = Path(__file__).resolve().parents[1] / "sample_data" / "single_turn.parquet"


def test_one_path_as_a_string_is_one_path_and_one_group_column_is_one_column(tmp_path: Path) -> None:
    table = pq.read_table(SINGLE)  # a two-valued label column: the point is the column, not many groups
    path = tmp_path / "labelled.parquet"
    labels = [("a", "b")[row % 2] for row in range(table.num_rows)]
    pq.write_table(table.append_column("env", pa.array(labels)), path)
    by_string = analyze(str(path), bootstrap=0, group_by="env")
    by_list = analyze([str(path)], bootstrap=0, group_by=["env"])
    assert by_string.metrics == by_list.metrics and set(by_string.groups) == {"env"}
    assert {group["group"] for group in by_string.groups["env"]} == {"a", "b"}


@pytest.mark.parametrize(("kwargs", "words"), [
    ({"paths": [None]}, "expected dump paths as strings, got NoneType"),
    ({"correction": {"rollout_is": "token"}}, "correction must be a CorrectionConfig, got dict"),
    ({"read_options": {"chunk_rows": 3}}, "read_options must be a ReadOptions, got dict"),
])
def test_wrong_argument_types_are_usage_errors(kwargs: dict, words: str) -> None:
    with pytest.raises(UsageError, match=words):
        analyze(**{"paths": [SINGLE], "bootstrap": 0, **kwargs})


def test_a_report_nested_past_any_report_is_an_input_error(tmp_path: Path) -> None:
    path = tmp_path / "deep.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(InputError, match="nested deeper than any report"):
        Report.load(path)


def _packed(path: Path, **lengths: np.ndarray) -> str:
    old = np.linspace(-3, -1, 40).astype(np.float32)
    save_file({"old_log_probs": old, "rollout_log_probs": old + 0.01, "response_mask": np.ones(40, np.int8),
               **lengths}, str(path))
    return str(path)


def test_packed_boundaries_that_disagree_or_are_empty_are_refused(tmp_path: Path) -> None:
    both = _packed(tmp_path / "both.safetensors", num_tokens=np.array([10, 15, 15]),
                   cu_seqlens=np.array([0, 20, 25, 40]))
    with pytest.raises(InputError, match="'cu_seqlens' and 'num_tokens' .* disagree from sequence 0"):
        analyze([both], bootstrap=0)
    agree = _packed(tmp_path / "agree.safetensors", num_tokens=np.array([20, 5, 15]),
                    cu_seqlens=np.array([0, 20, 25, 40]))
    assert analyze([agree], bootstrap=0).metrics["diag/sequences"] == 3
    empty = _packed(tmp_path / "empty.safetensors", num_tokens=np.array([], np.int64))
    with pytest.raises(InputError, match="with one value per sequence"):
        analyze([empty], bootstrap=0)


OLD = np.array([[-0.5, -1.0], [-0.2, -0.3]], dtype=np.float32)
MASK = np.ones((2, 2), dtype=np.int8)


@pytest.mark.parametrize(("kwargs", "error", "words"), [
    ({"old_log_probs": torch.empty(2, 2, device="meta")}, InputError, "cannot be read as numbers"),
    ({"step": np.array([1, 2])}, UsageError, "step must be an integer >= 0"),
    ({"step": 10**20}, UsageError, "step must be an integer >= 0"),
    ({"process_index": 2**64}, UsageError, "process_index must be an integer >= 0"),
    ({"groups": {5: ["a", "b"]}}, UsageError, "group column names must be strings"),
    ({"path": b"dump.parquet"}, UsageError, "path must be a folder or .parquet file name"),
])
def test_write_dump_refuses_arguments_it_cannot_write(tmp_path: Path, kwargs: dict, error: type,
                                                       words: str) -> None:
    args = {"path": tmp_path / "d.parquet", "old_log_probs": OLD, "rollout_log_probs": OLD - 0.01,
            "response_mask": MASK, **kwargs}
    with pytest.raises(error, match=words):
        write_dump(**args)
    assert list(tmp_path.iterdir()) == []


def test_write_dump_reads_float8_tensors(tmp_path: Path) -> None:
    old = torch.tensor(OLD).to(torch.float8_e4m3fn)
    path = write_dump(tmp_path / "d.parquet", old_log_probs=old, rollout_log_probs=old, response_mask=MASK)
    report = analyze([path], bootstrap=0, correction=CorrectionConfig())
    assert report.metrics["diag/valid_tokens"] == 4
    assert json.loads(report.to_json())["metrics"]["rollout_corr/kl"] == 0.0


def test_ray_misuse_is_refused_before_any_cluster_starts() -> None:
    from mismatch_cli.distributed import _refuse_unreachable

    with pytest.raises(UsageError, match="runs the engine on the workers' CPUs"):
        analyze([SINGLE], bootstrap=0, engine="ray", device="cuda")
    with pytest.raises(UsageError, match="cannot reach a Ray cluster at 127.0.0.1:1"):
        _refuse_unreachable("127.0.0.1:1")  # ray.init would retry for minutes
    _refuse_unreachable(None)  # no address: a local cluster is started
    _refuse_unreachable("auto")
