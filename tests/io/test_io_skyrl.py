"""SkyRL `trainer.dump_data_batch` pickles, as SkyRL 0.4.0's own `TrainingInputBatch.save` wrote them
(tests/data/skyrl_dump, generator tests/data/generators/skyrl_dump.py): the values fed to SkyRL come back, trimmed
to each response by `response_mask`, masked by `loss_mask`; steps from the file name; anything a SkyRL batch never
holds is refused before it is looked up, so no pickled code runs."""

from __future__ import annotations

import json
import os
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import REFERENCE
from typer.testing import CliRunner

from mismatch_cli.cli import app
from mismatch_cli.errors import InputError
from mismatch_cli.io import ReadOptions, detect_format, discover_inputs, iter_batches, read_skyrl

DUMPS = REFERENCE / "skyrl_dump"
EXPECTED = json.loads((DUMPS / "expected.json").read_text())
STEP3 = "dumped_data/global_step_3_training_input.pkl"
STEP4 = "dumped_data/global_step_4_training_input.pkl"
NO_FORWARD = "no_policy_forward/global_step_1_training_input.pkl"


def _read(path, **kw):
    return list(read_skyrl(str(path), ReadOptions(**kw)))


def _expected(name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[int], np.ndarray]:
    """Flat old, rollout, mask, row lengths and advantages from the values the generator fed to SkyRL."""
    entry = EXPECTED["files"][name]
    rows = entry["rows"] + [{**entry["rows"][0], "loss_mask": [0] * len(entry["rows"][0]["old"])}] * entry["pad_size"]
    old = np.array([v for r in rows for v in r["old"]])
    if entry["policy_dtype"] == "bfloat16":
        old = torch.tensor(old, dtype=torch.bfloat16).double().numpy()
    rollout = np.array([v for r in rows for v in r["rollout"]], dtype=np.float32)
    mask = np.array([v for r in rows for v in r["loss_mask"]], dtype=bool)
    advantages = np.array([r["advantage"] * m for r in rows for m in r["loss_mask"]])
    return old, rollout, mask, [len(r["old"]) for r in rows], advantages


@pytest.mark.parametrize("name", [STEP3, STEP4])
def test_values_masks_and_steps_are_what_skyrl_was_given(name, concat):
    batches = _read(DUMPS / name)
    old, rollout, mask, offsets = concat(batches)
    want_old, want_rollout, want_mask, lengths, advantages = _expected(name)
    assert old.dtype == np.float32  # bfloat16 action_log_probs (SkyRL's torch.save fallback) widened
    np.testing.assert_array_equal(old, want_old)
    np.testing.assert_array_equal(rollout, want_rollout)
    np.testing.assert_array_equal(mask, want_mask)  # loss_mask: tool tokens and the dropped response are 0
    np.testing.assert_array_equal(np.diff(offsets), lengths)  # the left padding of the window is trimmed
    np.testing.assert_array_equal(np.concatenate([b.advantages for b in batches]), advantages)
    step = int(name.split("_")[3])
    assert all((b.steps == step).all() for b in batches)
    assert all(b.sequence_ids is None for b in batches)  # SkyRL pops the uids before dumping


def test_one_row_chunks_give_the_same_arrays(concat):
    whole = concat(_read(DUMPS / STEP3))
    rows = _read(DUMPS / STEP3, chunk_rows=1)
    assert [b.first_row for b in rows] == list(range(6))  # 5 samples + SkyRL's pad_size 1 row
    for a, b in zip(whole, concat(rows), strict=True):
        np.testing.assert_array_equal(a, b)


def test_the_mask_column_can_be_the_response_window(concat):
    _, _, mask, _ = concat(_read(DUMPS / STEP3, columns={"response_mask": "response_mask"}))
    assert mask.all()  # every response token, tool output included


def test_found_in_dumped_data_and_detected_without_the_name(tmp_path):
    found = discover_inputs([str(DUMPS / "dumped_data")])
    assert [(os.path.basename(f.path), f.format) for f in found] == [
        ("global_step_3_training_input.pkl", "skyrl"), ("global_step_4_training_input.pkl", "skyrl")]
    renamed = tmp_path / "batch.bin"
    shutil.copy(DUMPS / STEP3, renamed)
    assert detect_format(str(renamed)) == "skyrl"
    (other,) = discover_inputs([str(renamed)])
    batches = list(iter_batches([other], ReadOptions()))
    assert sum(b.num_rows for b in batches) == 6 and batches[0].steps is None  # no step in the name
    (tmp_path / "walk").mkdir()
    pickle.dump({"a": 1}, open(tmp_path / "walk" / "other.pkl", "wb"))  # noqa: SIM115
    shutil.copy(DUMPS / STEP3, tmp_path / "walk" / "global_step_9_training_input.pkl")
    (walked,) = discover_inputs([str(tmp_path / "walk")])  # another pickle in the folder is never opened
    assert walked.path.endswith("global_step_9_training_input.pkl")
    assert walked.skipped and "1 .pkl" in walked.skipped[0]


def _refused(path: Path, *flags: str) -> str:
    result = CliRunner().invoke(app, ["analyze", str(path), *flags, "--format", "json", "--bootstrap", "0", "-q"])
    assert result.exit_code == 3, result.output
    error = [line for line in result.output.splitlines() if line.strip()]
    assert str(path) in error[0]
    return error[0]


class _RunsCode:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_pickle_that_would_run_code_is_refused_without_running_it(tmp_path):
    marker = tmp_path / "ran"
    path = tmp_path / "global_step_1_training_input.pkl"
    # Named and laid out like a SkyRL dump (detected as one), but its state holds a call to os.system.
    with open(DUMPS / STEP3, "rb") as handle:
        header = handle.read(120)
    assert b"training_batch" in header
    with open(path, "wb") as handle:
        pickle.dump({"skyrl.backends.skyrl_train.training_batch": "TrainingInputBatch", "x": _RunsCode(marker)},
                    handle, protocol=4)
    assert detect_format(str(path)) == "skyrl"
    line = _refused(path)
    assert "refusing to unpickle" in line and ".system" in line
    assert not marker.exists()
    with pytest.raises(InputError, match=r"asks for (posix|nt)\.system") as err:
        _read(path)
    assert err.value.exit_code == 3 and "\n" not in str(err.value)


def test_a_skyrl_class_other_than_the_batch_is_refused(tmp_path):
    path = tmp_path / "global_step_1_training_input.pkl"
    # GLOBAL opcode naming a SkyRL class the dump never pickles (TensorList is serialized as a dict).
    path.write_bytes(b"\x80\x02cskyrl.backends.skyrl_train.training_batch\nTensorList\n)R.")
    line = _refused(path)
    assert "skyrl.backends.skyrl_train.training_batch.TensorList" in line


@pytest.mark.parametrize(("content", "words"), [
    (b"", "empty (0 bytes)"),
    ("cut", "truncated"),
    (b"\x80\x04garbage training_batch Batch", "cannot read"),
])
def test_damaged_files_exit_3_in_one_line(tmp_path, content, words):
    path = tmp_path / "global_step_2_training_input.pkl"
    if content == "cut":
        content = (DUMPS / STEP3).read_bytes()[:1500]
    path.write_bytes(content)
    line = _refused(path, "--input-format", "skyrl")
    assert words in line


def test_other_pickles_are_not_skyrl_batches(tmp_path):
    path = tmp_path / "x.pkl"
    pickle.dump({"action_log_probs": [1.0]}, open(path, "wb"))  # noqa: SIM115
    line = _refused(path, "--input-format", "skyrl")
    assert "expected a pickled SkyRL TrainingInputBatch" in line and "got dict" in line


def test_no_policy_forward_is_refused_saying_why():
    line = _refused(DUMPS / NO_FORWARD)
    assert "action_log_probs = None" in line and "skipped the policy forward" in line


def test_analyze_replays_skyrl_on_its_own_dump():
    args = ["analyze", str(DUMPS / "dumped_data"), "--semantics", "skyrl", "--set", "tis_ratio_type=token",
            "--format", "json", "--bootstrap", "0", "-q", "--by", "step"]
    result = CliRunner().invoke(app, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert [i["format"] for i in report["inputs"]] == ["skyrl", "skyrl"]
    assert report["config"]["tis_ratio_type"] == "token"
    keys = report["metrics"]
    assert np.isfinite(keys["policy/loss_metrics/is_ratio_mean"])
    old, rollout, mask, _, _ = (np.concatenate(parts) for parts in zip(_expected(STEP3), _expected(STEP4),
                                                                        strict=True))
    assert report["inputs"][0]["tokens"] + report["inputs"][1]["tokens"] == int(mask.sum())
