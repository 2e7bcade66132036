"""The one validator between readers and the engine, on hand-built decoded chunks: each check refuses with a
message naming the file, the row, the column (or field, key, tensor) and the fix, whatever the format."""

from __future__ import annotations

import numpy as np
import pytest

from mismatch_cli.errors import InputError
from mismatch_cli.io.validate import Column, Decoded, PerRow, to_batch

OFFSETS = np.array([0, 2, 5], dtype=np.int64)  # two rows: 2 tokens, 3 tokens


def chunk(old=None, rollout=None, mask=None, **extra) -> Decoded:
    """Rows 10 and 11 of run.parquet, each stream its own column; `extra` overrides any field."""
    old = Column(np.array([-0.5, -1.0, -0.25, -2.0, -0.75], dtype=np.float32) if old is None else old, OFFSETS, "lp")
    rollout = Column(np.array([-0.5, -1.5, -0.25, -2.5, -0.5], dtype=np.float32) if rollout is None else rollout,
                     OFFSETS, "rollout_log_probs")
    mask = Column(np.array([0, 1, 1, 1, 0], dtype=np.int8) if mask is None else mask, OFFSETS, "m")
    fields = {"source": "run.parquet", "first_row": 10, "old_log_probs": old, "rollout_log_probs": rollout,
              "response_mask": mask}
    return Decoded(**{**fields, **extra})


def refused(decoded: Decoded, *mentions: str, fix: str) -> None:
    with pytest.raises(InputError) as info:
        to_batch(decoded)
    for mention in ("run.parquet", *mentions):
        assert mention in info.value.message, (mention, info.value.message)
    assert fix in (info.value.hint or ""), info.value.hint


def test_a_clean_chunk_becomes_its_batch() -> None:
    batch = to_batch(chunk(steps=PerRow(np.array([3, 3], dtype=np.uint8), "run.parquet column 'step'"),
                           sequence_ids=np.array(["a", "b"], dtype=object), labels={"run": "x"}))
    assert batch.old_log_probs.dtype == np.float32 and batch.rollout_log_probs.dtype == np.float32
    assert batch.response_mask.tolist() == [False, True, True, True, False]
    assert batch.offsets.tolist() == [0, 2, 5] and batch.source == "run.parquet" and batch.first_row == 10
    assert batch.steps.dtype == np.int64 and batch.steps.tolist() == [3, 3]
    assert batch.sequence_ids.tolist() == ["a", "b"] and batch.labels == {"run": "x"}
    assert batch.advantages is None and batch.process_index is None and batch.groups == {}


def test_unequal_lengths_name_the_row_and_both_columns() -> None:
    short = Column(np.zeros(4, np.int8), np.array([0, 2, 4]), "m")
    refused(chunk(response_mask=short), "row 11", "3 tokens in column 'lp' (old_log_probs)",
            "2 in column 'm' (response_mask)", fix="--column")


def test_mask_values_other_than_0_or_1_are_refused() -> None:
    refused(chunk(mask=np.array([0, 1, 1, 2, 0], np.int64)), "got 2", "row 11 column 'm' (token 1)",
            fix="write the mask as 0/1")
    refused(chunk(mask=np.array([0, 1, np.nan, 1, 0])), "got nan", "row 11", fix="write the mask as 0/1")


def test_a_null_in_the_mask_is_refused_anywhere() -> None:
    nulls = np.array([True, False, False, False, False])
    mask = Column(np.array([None, 1, 1, 1, 0], dtype=object), OFFSETS, "loss_mask", nulls)
    refused(chunk(response_mask=mask, noun="field"), "values 0 or 1, got null", "row 10 field 'loss_mask' (token 0)",
            fix="write the mask as 0/1 or true/false on every token")


def test_null_log_probs_only_on_masked_out_tokens() -> None:
    values = np.array([np.nan, -1.0, -0.25, -2.0, np.nan], dtype=np.float32)
    padding = Column(values, OFFSETS, "lp", np.isnan(values))
    batch = to_batch(chunk(old_log_probs=padding))  # both nulls sit where the mask is 0
    assert np.isnan(batch.old_log_probs[[0, 4]]).all()
    values = values.copy()
    values[3] = np.nan
    refused(chunk(old_log_probs=Column(values, OFFSETS, "lp", np.isnan(values))),
            "expected old_log_probs values, got null", "row 11 column 'lp' (token 1) where the mask is 1",
            fix="fill missing values on trained-on tokens")
    refused(chunk(old_log_probs=Column(values, OFFSETS, "lp", np.isnan(values)), response_mask=None),
            "row 10 column 'lp' (token 0)", fix="fill missing values")


def test_integer_log_probs_are_refused_as_token_ids() -> None:
    refused(chunk(rollout=np.array([1, 2, 3, 4, 5], np.int64), noun="key"),
            "expected float log-probs for rollout_log_probs, got int64 (token ids?)", "row 10 key 'rollout_log_probs'",
            fix="point --column rollout_log_probs=NAME at the key holding the log-probs")


def test_a_row_of_whole_numbers_from_1_is_refused_as_ids_or_a_mask() -> None:
    refused(chunk(old=np.array([-0.5, -1.0, 1.0, 0.0, 1.0], np.float32)),
            "got only whole numbers up to 1 (token ids or a mask?)", "row 11 column 'lp' (old_log_probs)",
            fix="point --column old_log_probs=NAME")
    assert to_batch(chunk(old=np.array([-0.5, -1.0, -1.0, -2.0, 0.0], np.float32)))  # -1 from JSON is fine


@pytest.mark.parametrize(("old", "rollout", "expected"), [
    (np.float16, np.float32, np.float32), (np.float16, np.float16, np.float32),
    (np.float32, np.float64, np.float64), (np.float64, np.float16, np.float64)])
def test_both_sides_share_one_float_dtype(old, rollout, expected) -> None:
    batch = to_batch(chunk(old=np.full(5, -0.5, old), rollout=np.full(5, -0.5, rollout)))
    assert batch.old_log_probs.dtype == expected and batch.rollout_log_probs.dtype == expected


def test_steps_and_process_ranks_beyond_int64_are_refused() -> None:
    big = np.array([1, 2**63], dtype=np.uint64)
    refused(chunk(steps=PerRow(big, "run.parquet column 'step'")),
            "expected step within int64, got 9223372036854775808", "column 'step' row 11", fix="write steps below 2^63")
    refused(chunk(process_index=PerRow(big, "run.parquet column 'process_index'", "process_index")),
            "expected process_index within int64", "row 11", fix="write process_indexs below 2^63")
    refused(chunk(steps=PerRow(2**70, "run.parquet", "step (rollout_id)")), "expected step (rollout_id) within int64",
            fix="below 2^63")
    assert to_batch(chunk(steps=PerRow(7, "run.parquet"))).steps.tolist() == [7, 7]


def test_advantages_per_token_must_match_the_rows_and_per_row_ones_spread() -> None:
    per_row = to_batch(chunk(advantages=Column(np.array([0.5, None], dtype=object), None, "advantages")))
    assert per_row.advantages.tolist()[:2] == [0.5, 0.5] and np.isnan(per_row.advantages[2:]).all()
    per_token = to_batch(chunk(advantages=Column(np.arange(5, dtype=np.int32), OFFSETS, "adv")))
    assert per_token.advantages.dtype == np.float64 and per_token.advantages.tolist() == [0, 1, 2, 3, 4]
    refused(chunk(advantages=Column(np.zeros(4), np.array([0, 2, 4]), "adv")), "row 11",
            "3 tokens in column 'old_log_probs' and 2 in column 'adv' (advantages)", fix="--column")


def test_group_labels_are_normalized_and_integers_kept_within_int64() -> None:
    groups = {"env": PerRow(np.array([1.5, np.nan])), "ok": PerRow(np.array([True, False])),
              "name": PerRow(np.array(["a", None], dtype=object)), "rank": PerRow(np.array([4, 5], dtype=np.int32))}
    batch = to_batch(chunk(groups=groups))
    assert batch.groups["env"].tolist() == ["1.5", None] and batch.groups["ok"].tolist() == [1, 0]
    assert batch.groups["name"].tolist() == ["a", None] and batch.groups["rank"].dtype == np.int64
    python_ints = np.empty(2, dtype=object)
    python_ints[:] = [3, 2**64]
    refused(chunk(groups={"g": PerRow(python_ints, "run.parquet key 'g'")}), "expected group label within int64",
            "key 'g' row 11", fix="write group labels below 2^63")


def test_a_per_row_keep_empties_its_rows_mask_after_the_mask_is_checked() -> None:
    batch = to_batch(chunk(row_keep=np.array([True, False])))
    assert batch.response_mask.tolist() == [False, True, False, False, False]
    refused(chunk(mask=np.array([0, 1, 1, 3, 0]), row_keep=np.array([True, False])), "got 3", fix="0/1")
