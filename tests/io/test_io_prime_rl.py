"""prime-rl token exports: trainer vs inference log-probs, boolean loss_mask, nulls, env_name groups,
the STABLE marker."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
from framework_dumps import Seq, flat, make_seqs, prime_record, write_prime

from mismatch_cli.errors import InputError
from mismatch_cli.io import ReadOptions, discover_inputs, read_prime_rl


def _read(path, **kw):
    return list(read_prime_rl(str(path), ReadOptions(**kw)))


def test_reads_full_sequences_with_env_groups(tmp_path):
    seqs = make_seqs(21)
    path = write_prime(str(tmp_path / "token_exports"), 5, 1, seqs)
    (batch,) = _read(path)
    assert np.diff(batch.offsets).tolist() == [s.prompt + len(s.old) for s in seqs]  # no padding
    picks = np.concatenate([batch.offsets[i] + s.prompt + np.arange(len(s.old)) for i, s in enumerate(seqs)])
    want_old, want_rollout, want_mask = flat(seqs)
    np.testing.assert_array_equal(batch.old_log_probs[picks], want_old)
    np.testing.assert_array_equal(batch.rollout_log_probs[picks], want_rollout)
    np.testing.assert_array_equal(batch.response_mask[picks], want_mask)
    assert batch.response_mask.sum() == want_mask.sum()
    assert np.isnan(batch.rollout_log_probs[: seqs[0].prompt]).all()  # prompt positions are null
    assert batch.groups["env_name"].tolist() == [s.env for s in seqs]  # attached without being asked
    assert (batch.steps == 5).all()
    assert batch.sequence_ids.tolist() == list(range(len(seqs)))


def test_nulls_on_valid_tokens_and_absent_streams(tmp_path):
    seqs = [Seq([-0.5, -0.25], [-0.5, float("nan")], [1, 1], prompt=1), Seq([-1.0], [-1.0], [1], prompt=0)]
    records = [prime_record(s, 0, 0, i) for i, s in enumerate(seqs)]
    records[1]["inference_logprobs"] = None  # a stream absent for the whole record
    records[1]["env_name"] = None
    path = write_prime(str(tmp_path), 0, 0, seqs, records=records)
    (batch,) = _read(path)
    assert np.diff(batch.offsets).tolist() == [3, 1]
    assert math.isnan(batch.rollout_log_probs[2]) and batch.response_mask[2]
    assert math.isnan(batch.rollout_log_probs[3]) and batch.old_log_probs[3] == -1.0
    assert batch.groups["env_name"].tolist() == ["math", None]


def test_step_from_the_folder_without_a_step_field(tmp_path):
    seqs = make_seqs(22, count=2)
    records = [prime_record(s, 0, 0, i) for i, s in enumerate(seqs)]
    for record in records:
        del record["step"]
    path = write_prime(str(tmp_path), 17, 0, seqs, records=records)
    (batch,) = _read(path)
    assert (batch.steps == 17).all()


def test_mask_null_and_length_mismatch_name_the_row(tmp_path):
    seqs = make_seqs(23, count=3)
    records = [prime_record(s, 0, 0, i) for i, s in enumerate(seqs)]
    records[1]["loss_mask"] = records[1]["loss_mask"][:-1]
    path = write_prime(str(tmp_path / "a"), 0, 0, seqs, records=records)
    with pytest.raises(InputError, match=r"expected equal lengths in .* row 1, got \d+ tokens in field "
                                         r"'trainer_logprobs' \(old_log_probs\) and \d+ in field 'loss_mask'"):
        _read(path)
    records = [prime_record(s, 0, 0, i) for i, s in enumerate(seqs)]
    records[2]["loss_mask"][0] = None
    path = write_prime(str(tmp_path / "b"), 0, 0, seqs, records=records)
    with pytest.raises(InputError, match=r"expected response_mask values 0 or 1, got null in .* row 2 field "
                                         r"'loss_mask' \(token 0\)"):
        _read(path)


def test_missing_stable_marker_is_noted(tmp_path):
    seqs = make_seqs(24, count=2)
    root = str(tmp_path / "token_exports")
    write_prime(root, 0, 0, seqs)
    write_prime(root, 1, 0, seqs, stable=False)
    write_prime(root, 1, 1, seqs, stable=False)
    found = discover_inputs([root])
    assert [os.path.relpath(f.path, root) for f in found] == [
        os.path.join("step_0", "rank_0.jsonl"), os.path.join("step_1", "rank_0.jsonl"),
        os.path.join("step_1", "rank_1.jsonl"),
    ]
    assert found[0].notes == ()
    assert all(f.format == "prime-rl" for f in found)
    assert all("incomplete: step folder" in f.notes[0] and "STABLE" in f.notes[0] for f in found[1:])


def test_half_written_last_line_says_why(tmp_path):
    seqs = make_seqs(25, count=2)
    path = write_prime(str(tmp_path), 3, 0, seqs, stable=False)
    text = open(path).read()
    with open(path, "w") as f:
        f.write(text[: len(text) - 40])
    with pytest.raises(InputError, match=r"cannot read .* as prime-rl JSONL: .*fix: its step folder has no STABLE "
                                         r"marker, so prime-rl may still be writing it"):
        _read(path)


def test_group_column_requested_but_missing(tmp_path):
    path = write_prime(str(tmp_path), 0, 0, make_seqs(26, count=1))
    with pytest.raises(InputError, match=r"no field 'data_source' \(asked for by --by data_source\) in .*; available "
                                         r"fields: schema_version, step"):
        _read(path, group_columns=("data_source",))
    (batch,) = _read(path, group_columns=("rank",))
    assert batch.groups["rank"].tolist() == [0] and "env_name" in batch.groups
