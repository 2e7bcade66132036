"""Bad and odd inputs a review found mishandled after readers began only decoding (one validator checks):
each now gives one line naming the file, the row or key and the fix (exit 3), or is read as the docs say."""

from __future__ import annotations

import json
import pickle
import sys
import types

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from typer.testing import CliRunner

from mismatch_cli.cli import app
from mismatch_cli.errors import InputError
from mismatch_cli.io.validate import Column, Decoded, to_batch

runner = CliRunner(env={"NO_COLOR": None, "FORCE_COLOR": None, "MISMATCH_DEBUG": None})


def _run(*args: object):
    return runner.invoke(app, ["analyze", *map(str, args), "-q", "--format", "json", "--bootstrap", "0"])


def _refused(*args: object) -> str:
    result = _run(*args)
    assert result.exit_code == 3, (result.exit_code, result.output)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "; fix: " in lines[0], lines
    return lines[0]


def _sample(position: int, **extra) -> dict:
    return {"log_probs": torch.tensor([-0.1, -0.2]), "rollout_log_probs": torch.tensor([-0.1, -0.25]),
            "loss_masks": torch.tensor([1, 1]), "response_lengths": 2, "rollout_position": position, **extra}


def _slime(path, samples, rollout_id=3) -> str:
    torch.save({"format_version": 2, "rollout_id": rollout_id, "rank": 0, "samples": samples}, path)
    return str(path)


def test_advantages_that_are_not_numbers_name_the_row_and_field() -> None:
    old = Column(np.array([-0.1, -0.2, -0.3]), np.array([0, 1, 3]), "prev_logprobs")
    decoded = Decoded("run.jsonl", 4, old, Column(old.values - 0.01, old.offsets, "generation_logprobs"),
                      noun="field", advantages=Column(np.array([0.5, "abc"], dtype=object), None, "advantages"))
    with pytest.raises(InputError) as error:
        to_batch(decoded)
    assert "got 'abc' in run.jsonl row 5 field 'advantages'" in str(error.value)
    numbers = Decoded("run.jsonl", 0, old, decoded.rollout_log_probs, noun="field",
                      advantages=Column(np.array([0.5, None], dtype=object), None, "advantages"))
    np.testing.assert_array_equal(to_batch(numbers).advantages, [0.5, np.nan, np.nan])


def test_a_ragged_slime_sample_is_refused_naming_its_key(tmp_path) -> None:
    sample = _sample(0, log_probs=[[-0.1], [-0.2, -0.3]])
    line = _refused(_slime(tmp_path / "r.pt", [sample]))
    assert "one list of numbers per sample in key 'log_probs'" in line and "row 0" in line


@pytest.mark.parametrize("label", [["a"], torch.tensor([1, 2])], ids=["list", "tensor"])
def test_grouping_by_a_value_that_is_not_one_label_is_refused(tmp_path, label) -> None:
    path = _slime(tmp_path / "r.pt", [_sample(0, env=label), _sample(1, env=label)])
    line = _refused(path, "--by", "env")
    assert "expected one label per row to group by" in line and "key 'env' row 0" in line
    ok = _slime(tmp_path / "ok.pt", [_sample(0, env=torch.tensor(7)), _sample(1, env="b")])
    result = _run(ok, "--by", "env")
    assert result.exit_code == 0, result.output
    assert {str(g["group"]) for g in json.loads(result.output)["groups"]["env"]} == {"7", "b"}


def test_a_string_rollout_id_is_refused_not_dropped(tmp_path) -> None:
    line = _refused(_slime(tmp_path / "r.pt", [_sample(0)], rollout_id="3"))
    assert "expected an integer rollout_id" in line


def test_a_short_legacy_slime_list_names_the_key_not_a_missing_one(tmp_path) -> None:
    t = torch.tensor
    data = {"log_probs": [t([-0.1, -0.2]), t([-0.1])], "rollout_log_probs": [t([-0.1, -0.2])],
            "loss_masks": [t([1, 1]), t([1])], "response_lengths": [2, 1]}
    torch.save({"rollout_id": 1, "rank": 0, "rollout_data": data}, tmp_path / "r.pt")
    line = _refused(tmp_path / "r.pt")
    assert "key 'rollout_log_probs'" in line and "got 1 for 2 samples" in line


@pytest.fixture
def skyrl_pickle(tmp_path, monkeypatch):
    """Write a pickle as SkyRL's TrainingInputBatch.save does (a stand-in class under SkyRL's module name)."""
    module = types.ModuleType("skyrl_train.training_batch")

    def _rebuild_tensor_batch(cls, state):
        batch = cls.__new__(cls)
        batch.__dict__.update(state)
        return batch

    class TrainingInputBatch:
        def __init__(self, state):
            self.state = state

        def __reduce__(self):
            return (_rebuild_tensor_batch, (TrainingInputBatch, self.state))

    for thing in (TrainingInputBatch, _rebuild_tensor_batch):
        thing.__module__, thing.__qualname__ = module.__name__, thing.__name__
        setattr(module, thing.__name__, thing)
    monkeypatch.setitem(sys.modules, "skyrl_train", types.ModuleType("skyrl_train"))
    monkeypatch.setitem(sys.modules, module.__name__, module)

    def write(**batch) -> str:
        path = tmp_path / "global_step_5_training_input.pkl"
        state = {"batch_dict": {k: {"format": "numpy_view", "data": v} for k, v in batch.items()}, "metadata": None}
        with open(path, "wb") as handle:
            pickle.dump(TrainingInputBatch(state), handle)
        return str(path)

    return write


OLD = np.array([[0.0, -0.1, -0.2], [0.0, -0.3, -0.4]], np.float32)
WINDOW = np.array([[0, 1, 1], [0, 1, 1]])


@pytest.mark.parametrize("width", [0, 2])
def test_skyrl_advantages_of_another_width_are_refused(skyrl_pickle, width) -> None:
    path = skyrl_pickle(action_log_probs=OLD, rollout_logprobs=OLD - 0.01, loss_mask=WINDOW.astype(np.float32),
                        response_mask=WINDOW, advantages=np.ones((2, width)))
    assert f"(2, {width}) in key 'advantages'" in _refused(path)


@pytest.mark.parametrize("shape", [(2,), (2, 1)])
def test_skyrl_advantages_per_sample_are_read(skyrl_pickle, shape) -> None:
    path = skyrl_pickle(action_log_probs=OLD, rollout_logprobs=OLD - 0.01, loss_mask=WINDOW.astype(np.float32),
                        response_mask=WINDOW, advantages=np.array([1.0, -2.0]).reshape(shape))
    assert _run(path).exit_code == 0


def test_skyrl_without_a_mask_reads_with_no_mask(skyrl_pickle) -> None:
    result = _run(skyrl_pickle(action_log_probs=OLD, rollout_logprobs=OLD - 0.01), "--no-mask")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["inputs"][0]["tokens"] == 6


def test_a_skyrl_response_window_that_is_not_0_or_1_is_refused(skyrl_pickle) -> None:
    path = skyrl_pickle(action_log_probs=OLD, rollout_logprobs=OLD - 0.01, loss_mask=WINDOW.astype(np.float32),
                        response_mask=WINDOW * 2)
    assert "expected response_mask values 0 or 1 (SkyRL's response window), got 2" in _refused(path)


@pytest.mark.parametrize(("old", "mask"), [
    ([[-1.0, float("inf")], [-0.5, -0.7]], [[1, 1], [1, 1]]),  # +inf on a valid token: excluded, counted
    ([[float("inf")], [-0.5, -0.7]], [[1], [1, 1]]),
    ([[0.0, 1.0], [-0.5, -0.7]], [[1, 0], [1, 1]]),  # padding (mask 0) may hold anything
])
def test_rows_of_whole_numbers_are_ids_only_on_valid_finite_tokens(tmp_path, old, mask) -> None:
    path = tmp_path / "d.parquet"
    rollout = [[v - 0.01 if np.isfinite(v) else -1.0 for v in row] for row in old]
    pq.write_table(pa.table({"old_log_probs": old, "rollout_log_probs": rollout, "response_mask": mask}), path)
    result = _run(path)
    assert result.exit_code == 0, result.output
    ids = [[1.0, 2.0], [-0.5, -0.7]]
    pq.write_table(pa.table({"old_log_probs": ids, "rollout_log_probs": ids, "response_mask": [[1, 1], [1, 1]]}),
                   path)
    assert "only whole numbers up to 2" in _refused(path)
