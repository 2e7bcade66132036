"""JSONL field types (NeMo-RL, prime-rl): a valid file reads whichever record comes first (`null`, `[]`, an
absent stream in record 0), and a value of the wrong type is refused naming the file, the row and the field."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from mismatch_cli.cli import app
from mismatch_cli.errors import InputError
from mismatch_cli.io import ReadOptions, jsonl_types, read_nemo_rl, read_prime_rl
from mismatch_cli.io import jsonl as jsonl_module

runner = CliRunner(env={"NO_COLOR": None, "FORCE_COLOR": None, "MISMATCH_DEBUG": None})


def _write(path: Path, records: list[dict]) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    if path.name.startswith("rank_"):
        (path.parent / "STABLE").touch()
    return str(path)


def _nemo(advantages: object = 0.5, **extra: object) -> dict:
    return {"prev_logprobs": [[-0.1, -0.2]], "generation_logprobs": [[-0.1, -0.25]], "token_loss_mask": [[1, 1]],
            "advantages": advantages, "sample_loss_mask": 1, **extra}


def _prime(mask: list, **extra: object) -> dict:
    lp = [-0.1 * (i + 1) for i in range(len(mask))]
    return {"trainer_logprobs": lp, "inference_logprobs": [v - 0.05 for v in lp], "loss_mask": mask,
            "step": 1, "env_name": "a", **extra}


def _analyze(path: str):
    return runner.invoke(app, ["analyze", path, "--format", "json", "--device", "cpu", "--bootstrap", "0", "-q"])


def _refused(path: str, *needles: str) -> str:
    result = _analyze(path)
    assert result.exit_code == 3, (result.exit_code, result.output)
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, result.stderr
    for needle in (path, *needles):
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def _concat(batches, name: str) -> np.ndarray:
    return np.concatenate([getattr(b, name) for b in batches])


def test_prime_empty_first_mask_then_booleans(tmp_path: Path) -> None:
    path = _write(tmp_path / "step_1" / "rank_0.jsonl",
                  [_prime([], advantages=[]), _prime([True, False], advantages=[1.0, 2.0])])
    batches = list(read_prime_rl(path, ReadOptions()))
    assert _concat(batches, "response_mask").tolist() == [1, 0]
    assert _concat(batches, "offsets").tolist()[-1] == 2
    assert _analyze(path).exit_code == 0


@pytest.mark.parametrize("field", ["advantages", "sample_loss_mask"])
def test_nemo_null_first_then_numbers(tmp_path: Path, field: str) -> None:
    records = [_nemo(), _nemo()]
    records[0][field], records[1][field] = None, (1.0 if field == "advantages" else 0)
    path = _write(tmp_path / "train_data_step3.jsonl", records)
    (batch,) = read_nemo_rl(path, ReadOptions())
    if field == "advantages":
        assert math.isnan(batch.advantages[0]) and batch.advantages[2:].tolist() == [1.0, 1.0]
    else:  # null keeps the row, 0 empties it
        assert batch.response_mask.tolist() == [1, 1, 0, 0]
    assert _analyze(path).exit_code == 0


@pytest.mark.parametrize("null", [None, [None]])
def test_nemo_whole_null_log_probs_first_read_as_nan(tmp_path: Path, null: object) -> None:
    path = _write(tmp_path / "train_data_step3.jsonl", [_nemo(prev_logprobs=null), _nemo()])
    (batch,) = read_nemo_rl(path, ReadOptions())
    assert batch.offsets.tolist() == [0, 2, 4]
    assert np.isnan(batch.old_log_probs[:2]).all() and batch.old_log_probs[2:].tolist() == [-0.1, -0.2]
    assert _analyze(path).exit_code == 0


def test_type_shown_after_the_first_chunks_goes_on_where_it_stopped(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(jsonl_types, "_SNIFF_RECORDS", 1)
    monkeypatch.setattr(jsonl_module, "_MIN_BLOCK", 64)  # several pyarrow blocks
    records = [_prime([], advantages=None, export_sequence_idx=i) for i in range(3)]
    records += [_prime([True, False, True], advantages=[0.5, 0.5, 0.5], export_sequence_idx=i) for i in range(3, 6)]
    path = _write(tmp_path / "step_1" / "rank_0.jsonl", records)
    batches = list(read_prime_rl(path, ReadOptions(chunk_rows=2)))
    assert [b.first_row for b in batches] == [0, 2, 4]
    assert _concat(batches, "sequence_ids").tolist() == list(range(6))
    assert _concat(batches, "response_mask").tolist() == [1, 0, 1] * 3


def test_a_string_log_prob_in_a_later_record_is_refused(tmp_path: Path) -> None:
    records = [_nemo() for _ in range(8)]
    records[5]["prev_logprobs"] = [[-0.1, "-0.2"]]
    path = _write(tmp_path / "train_data_step3.jsonl", records)
    _refused(path, "row 5", "'prev_logprobs'", "got a string", "fix: ")


def test_a_string_log_prob_beyond_the_first_blocks_is_refused(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(jsonl_module, "_MIN_BLOCK", 64)
    records = [_prime([True, True]) for _ in range(8)]
    records[6]["inference_logprobs"] = ["x", -0.1]
    path = _write(tmp_path / "step_1" / "rank_0.jsonl", records)
    with pytest.raises(InputError, match=r"expected numbers in field 'inference_logprobs', got a string \('x'\) in "
                                         r".*rank_0.jsonl row 6; fix: ") as err:
        list(read_prime_rl(path, ReadOptions(chunk_rows=2)))
    assert err.value.exit_code == 3


def test_mask_of_booleans_and_numbers_is_refused(tmp_path: Path) -> None:
    records = [_nemo(), _nemo(token_loss_mask=[[True, False]])]
    path = _write(tmp_path / "train_data_step3.jsonl", records)
    _refused(path, "row 1", "'token_loss_mask'", "numbers in every record, as in row 0, got booleans")


@pytest.mark.parametrize(("field", "value", "needle"), [
    ("sample_loss_mask", "0", "expected a number for a per-record sample mask, got '0'"),
    ("sample_loss_mask", ["0"], "expected a number for a per-record sample mask, got '0'"),
    ("advantages", "0.5", "expected a number for advantages, got '0.5'"),
])
def test_nemo_string_where_a_number_belongs_is_refused(tmp_path: Path, field: str, value: object,
                                                        needle: str) -> None:
    records = [_nemo(), _nemo()]
    records[1][field] = value
    path = _write(tmp_path / "train_data_step3.jsonl", records)
    line = _refused(path, needle, "row 1", f"field '{field}'")
    assert "fix: write " in line and "not a string" in line or "JSON numbers" in line


def test_string_advantage_in_the_first_record_is_refused(tmp_path: Path) -> None:
    path = _write(tmp_path / "train_data_step3.jsonl", [_nemo("0.5")])
    with pytest.raises(InputError, match=r"expected a number for advantages, got '0.5' in .* row 0 field "
                                         r"'advantages'; fix: write advantages as JSON numbers"):
        list(read_nemo_rl(path, ReadOptions()))
    assert os.path.exists(path)


@pytest.mark.parametrize(("text", "needle"), [
    ("", "as nemo-rl JSONL: the file is empty (no record); fix: "),
    ("\n\n", "as nemo-rl JSONL: the file is empty (no record); fix: "),
    ("not json\n", "as nemo-rl JSONL: its first line is not a JSON object; fix: check that the file is a complete "),
    ("[1, 2]\n", "as nemo-rl JSONL: its first line is not a JSON object; fix: "),
])
def test_empty_or_broken_first_line_says_so(tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "train_data_step3.jsonl"
    path.write_text(text)
    line = _refused(str(path), needle)
    assert "cannot tell the format" not in line


def test_a_byte_order_mark_is_read_past(tmp_path: Path) -> None:
    path = tmp_path / "step_1" / "rank_0.jsonl"
    _write(path, [_prime([True, True]), _prime([False, True])])
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    batches = list(read_prime_rl(str(path), ReadOptions()))
    assert _concat(batches, "response_mask").tolist() == [1, 1, 0, 1]
    assert _analyze(str(path)).exit_code == 0
