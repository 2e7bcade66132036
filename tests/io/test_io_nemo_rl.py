"""NeMo-RL train_data_step{N}.jsonl: full-sequence right-padded arrays, one-element-list wrapping,
sample masks, NaN / Infinity literals, step from the file name."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from framework_dumps import Seq, flat, make_seqs, nemo_record, write_nemo

from mismatch_cli.errors import InputError
from mismatch_cli.io import ReadOptions, read_nemo_rl
from mismatch_cli.io import jsonl as jsonl_module


def _read(path, **kw):
    return list(read_nemo_rl(str(path), ReadOptions(**kw)))


def _response(batches, seqs):
    """The response positions of every row (prompt and padding dropped), by hand from the layout."""
    old = np.concatenate([b.old_log_probs for b in batches])
    rollout = np.concatenate([b.rollout_log_probs for b in batches])
    mask = np.concatenate([b.response_mask for b in batches])
    width = max(s.prompt + len(s.old) for s in seqs)
    picks = np.concatenate([i * width + s.prompt + np.arange(len(s.old)) for i, s in enumerate(seqs)])
    return old[picks], rollout[picks], mask[picks], mask


@pytest.mark.parametrize("nested", [True, False])
def test_reads_full_sequences_as_they_are(tmp_path, nested):
    seqs = make_seqs(11)
    path = write_nemo(str(tmp_path / "train_data_step12.jsonl"), seqs, nested=nested)
    batches = _read(path)
    width = max(s.prompt + len(s.old) for s in seqs)
    assert all((np.diff(b.offsets) == width).all() for b in batches)  # right-padded rows kept whole
    old, rollout, mask, all_mask = _response(batches, seqs)
    want_old, want_rollout, want_mask = flat(seqs)
    np.testing.assert_array_equal(old, want_old)
    np.testing.assert_array_equal(rollout, want_rollout)
    np.testing.assert_array_equal(mask, want_mask)
    assert all_mask.sum() == want_mask.sum()  # prompt and padding are never valid
    assert all((b.steps == 12).all() for b in batches)
    assert np.concatenate([b.sequence_ids for b in batches]).tolist() == list(range(len(seqs)))


def test_chunking_and_long_lines(tmp_path, monkeypatch):
    seqs = make_seqs(12)
    path = write_nemo(str(tmp_path / "train_data_step0.jsonl"), seqs)
    whole = _read(path)
    monkeypatch.setattr(jsonl_module, "_MIN_BLOCK", 64)  # every line is longer than a block
    rows = _read(path, chunk_rows=2)
    assert [b.first_row for b in rows] == list(range(0, len(seqs), 2))
    for name in ("old_log_probs", "rollout_log_probs", "response_mask"):
        np.testing.assert_array_equal(
            np.concatenate([getattr(b, name) for b in whole]), np.concatenate([getattr(b, name) for b in rows])
        )


def test_longest_line(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_bytes(b"ab\n" + b"c" * 10 + b"\n\n" + b"d" * 4)
    assert jsonl_module.longest_line(str(path)) == 10


def test_sample_loss_mask_zero_empties_the_row(tmp_path):
    seqs = make_seqs(13, count=3)
    path = write_nemo(str(tmp_path / "train_data_step1.jsonl"), seqs, sample_masks=[1.0, 0.0, 1.0])
    (batch,) = _read(path)
    rows = np.add.reduceat(batch.response_mask, batch.offsets[:-1])
    assert rows.tolist() == [sum(seqs[0].mask), 0, sum(seqs[2].mask)]


def test_non_finite_literals(tmp_path):
    seq = Seq([-0.5, float("nan"), -1.0], [-0.25, -0.5, float("-inf")], [1, 1, 1], prompt=0)
    path = tmp_path / "train_data_step2.jsonl"
    path.write_text(json.dumps(nemo_record(seq, 3, 0)) + "\n")  # json.dumps writes NaN and -Infinity
    assert "NaN" in path.read_text() and "-Infinity" in path.read_text()
    (batch,) = _read(path)
    assert math.isnan(batch.old_log_probs[1]) and batch.rollout_log_probs[2] == -math.inf


def test_mask_length_mismatch_names_the_row(tmp_path):
    seqs = make_seqs(14, count=3)
    width = max(s.prompt + len(s.old) for s in seqs)
    records = [nemo_record(s, width, i) for i, s in enumerate(seqs)]
    records[2]["token_loss_mask"] = [records[2]["token_loss_mask"][0][:-1]]
    path = write_nemo(str(tmp_path / "train_data_step0.jsonl"), seqs, records=records)
    with pytest.raises(InputError, match=rf"expected equal lengths in .* row 2, got {width} tokens in field "
                                         rf"'prev_logprobs' \(old_log_probs\) and {width - 1} in field "
                                         r"'token_loss_mask' \(response_mask\)") as err:
        _read(path)
    assert err.value.exit_code == 3


def test_missing_mask_and_bad_files(tmp_path):
    seqs = make_seqs(15, count=2)
    width = max(s.prompt + len(s.old) for s in seqs)
    records = [nemo_record(s, width, i) for i, s in enumerate(seqs)]
    for r in records:
        del r["token_loss_mask"]
    path = write_nemo(str(tmp_path / "train_data_step0.jsonl"), seqs, records=records)
    with pytest.raises(InputError, match=r"no response_mask field in .* --no-mask"):
        _read(path)
    broken = tmp_path / "train_data_step1.jsonl"
    good = json.dumps(nemo_record(seqs[0], width, 0))
    broken.write_text(good + "\n" + good[: len(good) // 2] + "\n")
    with pytest.raises(InputError, match=r"cannot read .* as nemo-rl JSONL: .*\(after record 0\); fix: check that the "
                                         r"file is a complete train_data_step"):
        _read(broken)
    wrapped = [nemo_record(seqs[0], width, 0)]
    wrapped[0]["prev_logprobs"] = wrapped[0]["prev_logprobs"] * 2  # two sequences in one record
    bad = write_nemo(str(tmp_path / "train_data_step3.jsonl"), seqs[:1], records=wrapped)
    with pytest.raises(InputError, match=r"expected field 'prev_logprobs' to wrap one value per record, got 2 in .* "
                                         r"row 0"):
        _read(bad)
