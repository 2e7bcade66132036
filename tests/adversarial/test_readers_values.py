"""Values a reader must not misread silently: integers as log-probs, steps beyond int64, nulls in padding.

Most cases run in-process (an InputError is exit 3, mapped in one place); one per class also runs
the CLI to see the exit code and the one-line error.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from conftest import assert_clean_failure, mismatch
from safetensors.numpy import save_file

from mismatch_cli.api import analyze
from mismatch_cli.errors import InputError
from mismatch_cli.io import ReadOptions

ABOVE_INT64 = 2**63 + 5


def refused(path: Path, *mentions: str, by: tuple[str, ...] = (), **read: object) -> None:
    """analyze(path) raises an InputError (exit 3) whose message names every mention."""
    with pytest.raises(InputError) as info:
        analyze([str(path)], read_options=ReadOptions(**read), device="cpu", group_by=by, hash_inputs=False,
                bootstrap=0)
    assert info.value.exit_code == 3
    for mention in mentions:
        assert mention in str(info.value), (mention, str(info.value))


def metrics(path: Path) -> dict:
    """The metrics of a float64 analysis of `path`."""
    return analyze([str(path)], device="cpu", dtype="float64", hash_inputs=False, bootstrap=0).metrics


def slime_dump(path: Path, old: list, rollout_id: int = 3) -> Path:
    """A slime train-side dump (format_version 2) whose samples hold the given `log_probs` tensors."""
    samples = [
        {"rollout_position": i, "sample_index": 100 + i, "response_lengths": len(values),
         "loss_masks": torch.ones(len(values), dtype=torch.int32), "log_probs": values,
         "rollout_log_probs": torch.full((len(values),), -0.5)}
        for i, values in enumerate(old)
    ]
    torch.save({"format_version": 2, "rollout_id": rollout_id, "rank": 0, "samples": samples}, path)
    return path


def floats(n: int) -> torch.Tensor:
    return -torch.arange(1, n + 1, dtype=torch.float32) / 7


def test_slime_token_ids_as_log_probs_are_refused(tmp_path: Path) -> None:
    ids = torch.tensor([151644, 872, 198, 3], dtype=torch.int64)
    dump = slime_dump(tmp_path / "7.pt", [floats(4), floats(3), ids, floats(2)])
    run = mismatch("analyze", dump, "--input-format", "slime")
    assert_clean_failure(run, 3, str(dump), "row 2", "rollout_position 2", "'log_probs'", "int64")
    every = slime_dump(tmp_path / "8.pt", [torch.arange(4), torch.arange(3)])
    refused(every, "row 0", "'log_probs'", input_format="slime")


def test_slime_rollout_id_beyond_int64_is_refused(tmp_path: Path) -> None:
    dump = slime_dump(tmp_path / "9.pt", [floats(4)], rollout_id=ABOVE_INT64)
    refused(dump, str(dump), str(ABOVE_INT64), input_format="slime")


def nemo_dump(path: Path, prev: list[list], gen: list[list]) -> Path:
    with path.open("w") as handle:
        for i, (p, g) in enumerate(zip(prev, gen, strict=True)):
            record = {"idx": i, "token_loss_mask": [[1] * len(p)], "sample_loss_mask": [1.0],
                      "prev_logprobs": [p], "generation_logprobs": [g], "token_ids": [list(range(len(p)))]}
            handle.write(json.dumps(record) + "\n")
    return path


def test_jsonl_token_ids_in_a_log_prob_field_are_refused(tmp_path: Path) -> None:
    # JSON has no int/float distinction: a row of whole numbers, some >= 1, can only be ids or a mask.
    dump = nemo_dump(tmp_path / "train_data_step1.jsonl", [[-0.25, -1.5], [151644, 872, 198]],
                     [[-0.5, -1.0], [-0.5, -0.25, -1.0]])
    refused(dump, str(dump), "row 1", "'prev_logprobs'", "151644")


def test_jsonl_log_probs_written_as_integers_are_read(tmp_path: Path) -> None:
    # Some writers (Go's encoding/json) write -1.0 as -1 and 0.0 as 0: those are log-probs.
    (tmp_path / "ints").mkdir()
    (tmp_path / "floats").mkdir()
    as_ints = nemo_dump(tmp_path / "ints" / "train_data_step1.jsonl", [[-1, 0, -2], [-0.5]], [[-2, -1, -2], [-0.25]])
    as_floats = nemo_dump(tmp_path / "floats" / "train_data_step1.jsonl", [[-1.0, 0.0, -2.0], [-0.5]],
                          [[-2.0, -1.0, -2.0], [-0.25]])
    assert metrics(as_ints) == metrics(as_floats)


def test_nemo_step_from_a_file_name_beyond_int64_is_refused(tmp_path: Path) -> None:
    dump = nemo_dump(tmp_path / f"train_data_step{ABOVE_INT64}.jsonl", [[-0.25]], [[-0.5]])
    refused(dump, str(ABOVE_INT64), "step")


def wide(path: Path, **columns: pa.Array) -> Path:
    table = {
        "old_log_probs": pa.array([[-0.5, -1.25], [-0.75, -0.125, -2.0]], pa.list_(pa.float32())),
        "rollout_log_probs": pa.array([[-0.625, -1.0], [-0.5, -0.25, -2.5]], pa.list_(pa.float32())),
        "response_mask": pa.array([[1, 1], [1, 0, 1]], pa.list_(pa.int8())),
    }
    table.update(columns)
    pq.write_table(pa.table(table), path)
    return path


def test_a_float_mask_named_as_log_probs_is_refused(tmp_path: Path) -> None:
    dump = wide(tmp_path / "d.parquet", mask_f=pa.array([[1.0, 1.0], [1.0, 0.0, 1.0]], pa.list_(pa.float32())))
    refused(dump, str(dump), "row 0", "'mask_f'", columns={"old_log_probs": "mask_f"})


def test_parquet_uint64_step_above_int64_is_refused(tmp_path: Path) -> None:
    dump = wide(tmp_path / "s.parquet", step=pa.array([1, ABOVE_INT64], pa.uint64()))
    run = mismatch("analyze", dump, "--by", "step")
    assert_clean_failure(run, 3, str(dump), "row 1", "'step'", str(ABOVE_INT64))  # was: step -9223372036854775803
    refused(dump, "row 1", "'step'")  # without --by step too: the worst sequences carry the step
    fine = wide(tmp_path / "t.parquet", step=pa.array([1, 2**63 - 1], pa.uint64()))
    steps = analyze([str(fine)], device="cpu", by_step=True, hash_inputs=False, bootstrap=0).steps
    assert [s["step"] for s in steps] == [1, 2**63 - 1]


def test_parquet_uint64_group_label_above_int64_is_refused(tmp_path: Path) -> None:
    dump = wide(tmp_path / "g.parquet", bucket=pa.array([ABOVE_INT64, 1], pa.uint64()))
    refused(dump, str(dump), "row 0", "'bucket'", by=("bucket",))


def test_safetensors_steps_beyond_int64_are_refused(tmp_path: Path) -> None:
    tensors = {"old_log_probs": np.full((2, 3), -0.5, np.float32),
               "rollout_log_probs": np.full((2, 3), -0.75, np.float32)}
    tensor_step = tmp_path / "t.safetensors"
    save_file({**tensors, "step": np.array([0, ABOVE_INT64], np.uint64)}, str(tensor_step))
    refused(tensor_step, str(tensor_step), "row 1", "'step'", no_mask=True)
    metadata_step = tmp_path / "m.safetensors"
    save_file(tensors, str(metadata_step), metadata={"step": str(ABOVE_INT64)})
    refused(metadata_step, str(metadata_step), str(ABOVE_INT64), no_mask=True)


def test_nulls_in_padding_are_read_and_nulls_on_valid_tokens_refused(tmp_path: Path) -> None:
    mask = pa.array([[1, 1, 0, 0], [0, 1, 0, 1]], pa.list_(pa.int8()))
    rollout = pa.array([[-0.5, -1.0, -3.0, -3.0], [-3.0, -0.25, -3.0, -2.0]], pa.list_(pa.float32()))

    def dump(name: str, old: list) -> Path:
        path = tmp_path / name
        pq.write_table(pa.table({"old_log_probs": pa.array(old, pa.list_(pa.float32())), "rollout_log_probs": rollout,
                                 "response_mask": mask}), path)
        return path

    nulls = dump("nulls.parquet", [[-0.75, -1.0, None, None], [None, -0.5, None, -2.5]])
    filled = dump("filled.parquet", [[-0.75, -1.0, 0.0, 0.0], [0.0, -0.5, 0.0, -2.5]])
    assert metrics(nulls) == metrics(filled)  # was: refused, though padding may hold anything
    valid = dump("valid.parquet", [[-0.75, None, None, None], [None, -0.5, None, -2.5]])
    assert_clean_failure(mismatch("analyze", valid), 3, str(valid), "row 0", "'old_log_probs'", "token 1")
