"""slime train-side dumps: loaded with weights_only=True, ordered by rollout_position; the rollout
side and anything needing full unpickling refused without running it."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from framework_dumps import Seq, flat, make_seqs, write_slime_rollout, write_slime_train

from mismatch_cli.errors import InputError
from mismatch_cli.io import InputFile, ReadOptions, discover_inputs, iter_batches, read_slime


def _read(path, **kw):
    return list(read_slime(str(path), ReadOptions(**kw)))


def test_train_dump_in_rollout_order(tmp_path, concat):
    seqs = make_seqs(1)
    path = write_slime_train(str(tmp_path / "train_data" / "7.pt"), seqs, rollout_id=7)  # stored shuffled
    batches = _read(path)
    old, rollout, mask, offsets = concat(batches)
    want_old, want_rollout, want_mask = flat(seqs)
    assert old.dtype == np.float32  # slime's fp32 tensors stay fp32
    np.testing.assert_array_equal(old, want_old)
    np.testing.assert_array_equal(rollout, want_rollout)
    np.testing.assert_array_equal(mask, want_mask)
    np.testing.assert_array_equal(np.diff(offsets), [len(s.old) for s in seqs])
    assert all((b.steps == 7).all() for b in batches)
    assert np.concatenate([b.sequence_ids for b in batches]).tolist() == [100 + i for i in range(len(seqs))]


def test_one_row_chunks_give_the_same_arrays(tmp_path, concat):
    seqs = make_seqs(2)
    path = write_slime_train(str(tmp_path / "0.pt"), seqs, rollout_id=0)
    whole = concat(_read(path))
    rows = _read(path, chunk_rows=1)
    assert len(rows) == len(seqs) and [b.first_row for b in rows] == list(range(len(seqs)))
    for a, b in zip(whole, concat(rows), strict=True):
        np.testing.assert_array_equal(a, b)


def test_bf16_log_probs_are_widened(tmp_path, concat):
    seqs = make_seqs(3)
    path = write_slime_train(str(tmp_path / "0.pt"), seqs, rollout_id=0, torch_dtype=torch.bfloat16)
    old, rollout, _, _ = concat(_read(path))
    assert old.dtype == np.float32
    expected = torch.tensor(flat(seqs)[0], dtype=torch.bfloat16).float().numpy()
    np.testing.assert_array_equal(old, expected)


def test_pre_version_2_layout(tmp_path, concat):
    seqs = make_seqs(4)
    data = {
        "response_lengths": [len(s.old) for s in seqs],
        "log_probs": [torch.tensor(s.old) for s in seqs],
        "rollout_log_probs": [torch.tensor(s.rollout) for s in seqs],
        "loss_masks": [torch.tensor(s.mask) for s in seqs],
    }
    path = str(tmp_path / "old.pt")
    torch.save({"rollout_id": 3, "rank": 0, "rollout_data": data}, path)
    old, _, mask, _ = concat(_read(path))
    np.testing.assert_array_equal(old, flat(seqs)[0].astype(np.float32))
    np.testing.assert_array_equal(mask, flat(seqs)[2])


def test_none_loss_mask_means_every_token(tmp_path):
    seqs = [Seq([-0.5, -0.25], [-0.5, -0.5], [0, 0], extra={"loss_masks": None})]
    path = write_slime_train(str(tmp_path / "0.pt"), seqs, rollout_id=0)
    (batch,) = _read(path)
    assert batch.response_mask.tolist() == [True, True]


def test_group_by_sample_key_and_file_key(tmp_path):
    seqs = make_seqs(5)
    path = write_slime_train(str(tmp_path / "0.pt"), seqs, rollout_id=4)
    (batch,) = _read(path, group_columns=("data_parallel_rank", "rollout_id"))
    assert batch.groups["data_parallel_rank"].tolist() == [i % 2 for i in range(len(seqs))]
    assert batch.groups["rollout_id"].tolist() == [4] * len(seqs)
    with pytest.raises(InputError, match=r"no key 'env_name' \(asked for by --by env_name\).*available keys: .*"
                                         r"rollout_position"):
        _read(path, group_columns=("env_name",))


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ({"loss_masks": torch.tensor([1])}, r"row 2 \(rollout_position 2\), got 3 tokens in key 'log_probs' and 1 "
                                            r"in 'loss_masks'"),
        ({"response_lengths": 9}, r"row 2 \(rollout_position 2\), got 3 tokens in key 'log_probs' and 9 in "
                                  r"'response_lengths'"),
        ({"rollout_log_probs": None}, r"expected rollout_log_probs in key 'rollout_log_probs', got none in .* row 2"),
    ],
)
def test_row_errors_name_the_row(tmp_path, extra, needle):
    seqs = [Seq([-0.5], [-0.5], [1]), Seq([-0.5], [-0.5], [1]), Seq([-1.0, -2.0, -3.0], [-1.0, -2.0, -3.0], [1, 1, 1],
                                                                    extra=extra)]
    path = write_slime_train(str(tmp_path / "0.pt"), seqs, rollout_id=0)
    with pytest.raises(InputError, match=needle) as err:
        _read(path)
    assert err.value.exit_code == 3


def test_rollout_side_dump_is_refused_before_loading(tmp_path, monkeypatch):
    path = write_slime_rollout(str(tmp_path / "rollout_data" / "0.pt"), make_seqs(6), rollout_id=0)
    monkeypatch.setattr(torch, "load", lambda *a, **k: pytest.fail("torch.load must not run"))
    with pytest.raises(InputError, match=r"slime rollout-side dump .* no trainer log-probs.*full unpickling") as err:
        _read(path)
    assert "train_data/{rollout_id}.pt" in str(err.value) and "weights_only=False" not in str(err.value)


class _RunsCode:
    """A pickled object whose unpickling would create a marker file."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_pickled_objects_are_never_unpickled(tmp_path):
    marker = str(tmp_path / "code_ran")
    rollout = write_slime_rollout(str(tmp_path / "r.pt"), make_seqs(7), 0, status=_RunsCode(marker))
    with pytest.raises(InputError, match="rollout-side"):
        _read(rollout)
    train = str(tmp_path / "train.pt")
    torch.save({"format_version": 2, "rollout_id": 0, "samples": [{"log_probs": _RunsCode(marker)}]}, train)
    needle = r"cannot load .*train.pt with torch.load\(weights_only=True\): .*GLOBAL"
    with pytest.raises(InputError, match=needle) as err:
        _read(train)
    assert "weights_only=False" not in str(err.value) and "never unpickles" in str(err.value)
    assert not os.path.exists(marker)


def test_not_a_slime_dump(tmp_path):
    path = str(tmp_path / "weights.pt")
    torch.save({"layer.weight": torch.zeros(2)}, path)
    with pytest.raises(InputError, match=r"is not a slime train dump: expected 'format_version' and 'samples', got "
                                         r"keys layer.weight"):
        _read(path)
    truncated = str(tmp_path / "cut.pt")
    write_slime_train(truncated, make_seqs(8), 0)
    with open(truncated, "r+b") as f:
        f.truncate(200)
    with pytest.raises(InputError, match=r"cannot read .*cut.pt as a torch file"):
        _read(truncated)


def test_folder_walk_skips_rollout_side_next_to_train_side(tmp_path):
    seqs = make_seqs(9)
    for i in (2, 10, 1):
        write_slime_train(str(tmp_path / "train_data" / f"{i}.pt"), seqs, rollout_id=i)
        write_slime_rollout(str(tmp_path / "rollout_data" / f"{i}.pt"), seqs, rollout_id=i)
    torch.save({"w": torch.zeros(1)}, str(tmp_path / "checkpoint.pt"))  # not a dump: skipped
    found = discover_inputs([str(tmp_path)])
    assert [os.path.relpath(f.path, tmp_path) for f in found] == [
        os.path.join("train_data", f"{i}.pt") for i in (1, 2, 10)  # natural order
    ]
    assert {f.format for f in found} == {"slime"}
    steps = [int(b.steps[0]) for b in iter_batches(found, ReadOptions())]
    assert steps == [1, 2, 10]
    alone = discover_inputs([str(tmp_path / "rollout_data")])  # alone, kept so that reading it explains why not
    with pytest.raises(InputError, match="rollout-side"):
        list(iter_batches(alone, ReadOptions()))
    assert alone[0] == InputFile(alone[0].path, "slime", os.path.getsize(alone[0].path))


def _cli(path: str) -> tuple[int, str]:
    from typer.testing import CliRunner

    from mismatch_cli.cli import app

    result = CliRunner(env={"MISMATCH_DEBUG": None}).invoke(app, ["analyze", path, "--device", "cpu", "--bootstrap",
                                                                  "0"])
    return result.exit_code, result.output


@pytest.mark.parametrize("lengths", ["3", ["3"], "three", None, 2.5, [3, 1]], ids=repr)
def test_response_lengths_that_are_not_a_whole_number(tmp_path, lengths):
    seqs = [Seq([-0.5], [-0.5], [1]), Seq([-1.0, -2.0, -3.0], [-1.0, -2.0, -3.0], [1, 1, 1],
                                          extra={"response_lengths": lengths})]
    path = write_slime_train(str(tmp_path / "0.pt"), seqs, rollout_id=0)
    with pytest.raises(InputError, match=r"expected an integer number of response tokens in key 'response_lengths', "
                                         rf"got {type(lengths).__name__} .*0\.pt row 1 \(rollout_position 1\)") as err:
        _read(path)
    assert err.value.exit_code == 3 and "fix: re-save the dump with response_lengths as whole numbers" in str(err.value)
    code, output = _cli(path)  # the CLI: one line, exit 3, not an internal error
    assert code == 3 and output.startswith("error: expected an integer") and len(output.splitlines()) == 1


def test_whole_number_response_lengths_of_any_integer_type(tmp_path, concat):
    lengths = [torch.tensor(1), torch.tensor([3])]  # a 0-d and a one-element tensor: what a converted dump may hold
    seqs = [Seq([-0.5], [-0.5], [1], extra={"response_lengths": lengths[0]}),
            Seq([-1.0, -2.0, -3.0], [-1.0, -2.0, -3.0], [1, 1, 1], extra={"response_lengths": lengths[1]})]
    old, _, _, offsets = concat(_read(write_slime_train(str(tmp_path / "0.pt"), seqs, rollout_id=0, shuffle=False)))
    assert np.diff(offsets).tolist() == [1, 3] and len(old) == 4


@pytest.mark.parametrize("lengths", ["3", 3, ["3"]], ids=repr)
def test_pre_version_2_response_lengths_must_be_integers(tmp_path, lengths):
    data = {"response_lengths": lengths, "log_probs": [torch.tensor([-1.0, -2.0, -3.0])],
            "rollout_log_probs": [torch.tensor([-1.0, -2.0, -3.0])], "loss_masks": [torch.tensor([1, 1, 1])]}
    path = str(tmp_path / "old.pt")
    torch.save({"rollout_id": 3, "rank": 0, "rollout_data": data}, path)
    needle = ("got str '3' in .*old.pt row 0" if isinstance(lengths, list) else
              rf"expected 'response_lengths' in .*old.pt \(rollout_data\) to be a list of integers, one per sample, "
              rf"got {type(lengths).__name__} {lengths!r}")
    with pytest.raises(InputError, match=needle) as err:
        _read(path)
    assert err.value.exit_code == 3 and "fix: " in str(err.value)


def _damaged(tmp_path, name: str) -> str:
    path = str(tmp_path / f"{name}.pt")
    if name == "empty":
        open(path, "wb").close()
    elif name == "garbage":
        with open(path, "wb") as f:
            f.write(b"abc")  # read as a pickle by torch's legacy loader: its stack pops empty (an IndexError)
    elif name == "plain_pickle":
        import pickle

        with open(path, "wb") as f:
            pickle.dump({"samples": []}, f, protocol=2)  # torch's legacy loader reads it, and finds no magic number
    else:
        write_slime_train(path, make_seqs(10), 0)
        size = os.path.getsize(path)
        with open(path, "r+b") as f:
            f.truncate({"zip_cut_end": size - 30, "zip_cut_head": 10}[name])
    return path


@pytest.mark.parametrize(("name", "reason"), [
    ("empty", r"the file is empty \(0 bytes\); fix: re-save the dump .* or leave this file out of the inputs"),
    ("zip_cut_end", r"its zip archive is cut short \(the file is truncated\)"),
    ("zip_cut_head", r"PytorchStreamReader failed reading zip archive: not a ZIP archive; fix"),
    ("garbage", r"its bytes are neither a torch zip archive nor a torch pickle \(IndexError: "),
    ("plain_pickle", r"it was not written by torch.save"),
])
def test_damaged_torch_files_say_what_is_wrong(tmp_path, name, reason):
    path = _damaged(tmp_path, name)
    with pytest.raises(InputError, match=rf"cannot read .*{name}.pt as a torch file: {reason}") as err:
        _read(path)
    assert err.value.exit_code == 3
    code, output = _cli(path)
    assert code == 3 and len(output.splitlines()) == 1, output  # no torch warning, no traceback: one line


@pytest.mark.parametrize("payload", [[1, 2], torch.zeros(2), "text", 7], ids=lambda p: type(p).__name__)
def test_a_torch_file_that_is_not_a_dict(tmp_path, payload):
    path = str(tmp_path / "thing.pt")
    torch.save(payload, path)
    name = type(payload).__name__
    with pytest.raises(InputError, match=rf"expected a dict saved by slime in .*thing.pt, got {name}"):
        _read(path)
