"""Wide parquet reader: layouts, dtypes, chunking, column selection and every error path."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mismatch_cli.errors import InputError, UsageError
from mismatch_cli.io import InputFile, ReadOptions, iter_batches, read_parquet

LIST_KINDS = ["list", "large_list", "fixed_size_list"]
WIDTH = 6  # fixed_size_list rows are right-padded to this width


def _list_type(kind: str, value_type: pa.DataType) -> pa.DataType:
    if kind == "list":
        return pa.list_(value_type)
    if kind == "large_list":
        return pa.large_list(value_type)
    return pa.list_(value_type, WIDTH)


def _table(rows, kind: str = "list", float_type=pa.float32(), mask_type=pa.bool_(), **names) -> pa.Table:
    old, rollout, mask = rows.old, rows.rollout, rows.mask
    if kind == "fixed_size_list":
        padded = rows.padded(WIDTH)
        old, rollout, mask = (p.tolist() for p in padded)
    if pa.types.is_boolean(mask_type):
        mask = [[bool(v) for v in r] for r in mask]
    columns = {
        names.get("old", "old_log_probs"): pa.array(old, type=_list_type(kind, float_type)),
        names.get("rollout", "rollout_log_probs"): pa.array(rollout, type=_list_type(kind, float_type)),
        names.get("mask", "response_mask"): pa.array(mask, type=_list_type(kind, mask_type)),
    }
    return pa.table(columns)


def _write(tmp_path, table: pa.Table, name: str = "dump.parquet", **kwargs) -> str:
    path = str(tmp_path / name)
    pq.write_table(table, path, **kwargs)
    return path


def _read(path: str, **options) -> list:
    return list(read_parquet(path, ReadOptions(**options)))


@pytest.mark.parametrize("kind", LIST_KINDS)
@pytest.mark.parametrize("float_type", [pa.float32(), pa.float64()])
@pytest.mark.parametrize("mask_type", [pa.bool_(), pa.int8(), pa.int64(), pa.float32()])
def test_layouts_and_dtypes_give_the_hand_built_arrays(tmp_path, rows, concat, kind, float_type, mask_type):
    path = _write(tmp_path, _table(rows, kind, float_type, mask_type))
    (batch,) = _read(path)
    old, rollout, mask, offsets = concat([batch])
    if kind == "fixed_size_list":
        exp_old, exp_rollout, exp_mask = rows.padded(WIDTH)
        exp_old, exp_rollout, exp_mask = exp_old.ravel(), exp_rollout.ravel(), exp_mask.ravel().astype(bool)
        exp_offsets = np.arange(len(rows.old) + 1) * WIDTH
    else:
        exp_old, exp_rollout, exp_mask, exp_offsets = rows.flat()
    expected_dtype = np.float64 if float_type == pa.float64() else np.float32
    assert old.dtype == rollout.dtype == expected_dtype
    assert mask.dtype == np.bool_
    assert batch.offsets.dtype == np.int64
    np.testing.assert_array_equal(old, exp_old)
    np.testing.assert_array_equal(rollout, exp_rollout)
    np.testing.assert_array_equal(mask, exp_mask)
    np.testing.assert_array_equal(offsets, exp_offsets)
    assert batch.source == path and batch.first_row == 0 and batch.steps is None


def test_float16_is_upcast_and_mixed_precision_becomes_float64(tmp_path, rows, concat):
    table = _table(rows, float_type=pa.float16())
    path = _write(tmp_path, table)
    (batch,) = _read(path)
    assert batch.old_log_probs.dtype == batch.rollout_log_probs.dtype == np.float32
    np.testing.assert_array_equal(batch.old_log_probs, rows.flat()[0])

    mixed = table.set_column(1, "rollout_log_probs", pa.array(rows.rollout, type=pa.list_(pa.float64())))
    (batch,) = _read(_write(tmp_path, mixed, "mixed.parquet"))
    assert batch.old_log_probs.dtype == batch.rollout_log_probs.dtype == np.float64


@pytest.mark.parametrize("row_group_size", [1, 3, 1000])
def test_chunking_never_changes_the_concatenated_arrays(tmp_path, rows, concat, row_group_size):
    table = _table(rows).append_column("step", pa.array(rows.steps, type=pa.int32()))
    path = _write(tmp_path, table, row_group_size=row_group_size)
    expected = rows.flat()
    for chunk_rows in (1, 2, 3, 8192):
        batches = _read(path, chunk_rows=chunk_rows)
        assert all(b.num_rows <= chunk_rows for b in batches)
        assert [b.first_row for b in batches] == list(np.cumsum([0] + [b.num_rows for b in batches])[:-1])
        for got, want in zip(concat(batches), expected, strict=True):
            np.testing.assert_array_equal(got, want)
        steps = np.concatenate([b.steps for b in batches])
        assert steps.dtype == np.int64 and steps.tolist() == rows.steps


def test_aliases_and_column_override(tmp_path, rows, concat):
    path = _write(tmp_path, _table(rows, old="old_log_prob", rollout="rollout_logprobs", mask="loss_mask"))
    np.testing.assert_array_equal(concat(_read(path))[0], rows.flat()[0])

    # Both an alias and a custom column: the alias wins unless --column says otherwise.
    table = _table(rows).append_column("my_lp", pa.array(rows.rollout, type=pa.list_(pa.float32())))
    path = _write(tmp_path, table, "two.parquet")
    np.testing.assert_array_equal(concat(_read(path))[0], rows.flat()[0])
    override = concat(_read(path, columns={"old_log_probs": "my_lp"}))[0]
    np.testing.assert_array_equal(override, rows.flat()[1])


def test_missing_mask_needs_no_mask(tmp_path, rows):
    path = _write(tmp_path, _table(rows).drop_columns(["response_mask"]))
    with pytest.raises(InputError) as err:
        _read(path)
    assert "response_mask" in str(err.value) and "--no-mask" in str(err.value) and "dump.parquet" in str(err.value)
    (batch,) = _read(path, no_mask=True)
    assert batch.response_mask.dtype == np.bool_ and batch.response_mask.all()
    assert len(batch.response_mask) == sum(rows.lengths)


def test_missing_role_lists_the_available_columns(tmp_path, rows):
    path = _write(tmp_path, _table(rows, rollout="vllm_lp"))
    with pytest.raises(InputError) as err:
        _read(path)
    message = str(err.value)
    assert "rollout_log_probs" in message and "vllm_lp" in message and "dump.parquet" in message
    assert "--column rollout_log_probs=NAME" in message
    assert err.value.exit_code == 3


def test_column_override_errors(tmp_path, rows):
    path = _write(tmp_path, _table(rows))
    with pytest.raises(InputError, match="nope.*dump.parquet"):
        _read(path, columns={"old_log_probs": "nope"})
    with pytest.raises(UsageError, match="unknown role 'old'"):
        _read(path, columns={"old": "old_log_probs"})


def test_length_mismatch_names_the_row_and_both_columns(tmp_path, rows):
    rollout = [list(r) for r in rows.rollout]
    rollout[2] = rollout[2][:-1]
    table = _table(rows).set_column(1, "rollout_log_probs", pa.array(rollout, type=pa.list_(pa.float32())))
    path = _write(tmp_path, table)
    for chunk_rows in (1, 2, 100):
        with pytest.raises(InputError) as err:
            _read(path, chunk_rows=chunk_rows)
        message = str(err.value)
        assert "dump.parquet row 2" in message
        assert "'old_log_probs'" in message and "'rollout_log_probs'" in message
        assert "got 5 tokens" in message and "and 4 in" in message


def test_mask_length_mismatch(tmp_path, rows):
    mask = [[bool(v) for v in r] for r in rows.mask]
    mask[3] = mask[3] + [True]
    table = _table(rows).set_column(2, "loss_mask", pa.array(mask))
    with pytest.raises(InputError, match=r"row 3.*'loss_mask'"):
        _read(_write(tmp_path, table))


@pytest.mark.parametrize("mask_type", [pa.int32(), pa.float64()])
def test_mask_value_other_than_0_1_names_row_column_and_value(tmp_path, rows, mask_type):
    mask = [list(r) for r in rows.mask]
    mask[1][0] = 2
    table = _table(rows).set_column(2, "response_mask", pa.array(mask, type=pa.list_(mask_type)))
    path = _write(tmp_path, table)
    with pytest.raises(InputError) as err:
        _read(path, chunk_rows=1)
    message = str(err.value)
    assert "dump.parquet row 1" in message and "'response_mask'" in message and "got 2" in message


def test_null_row_and_null_value_name_the_row(tmp_path, rows):
    rollout = [list(r) for r in rows.rollout]
    rollout[3] = None
    table = _table(rows).set_column(1, "rollout_log_probs", pa.array(rollout, type=pa.list_(pa.float32())))
    with pytest.raises(InputError, match=r"null in .*dump.parquet row 3 column 'rollout_log_probs'"):
        _read(_write(tmp_path, table), chunk_rows=2)

    old = [list(r) for r in rows.old]
    old[2][1] = None
    table = _table(rows).set_column(0, "old_log_probs", pa.array(old, type=pa.list_(pa.float32())))
    with pytest.raises(InputError, match=r"null in .*nulls.parquet row 2 column 'old_log_probs' \(token 1\)"):
        _read(_write(tmp_path, table, "nulls.parquet"))


def test_nan_and_inf_are_not_errors(tmp_path, rows):
    old = [list(r) for r in rows.old]
    old[0][0], old[2][4] = float("nan"), float("-inf")
    table = _table(rows).set_column(0, "old_log_probs", pa.array(old, type=pa.list_(pa.float64())))
    (batch,) = _read(_write(tmp_path, table))
    assert np.isnan(batch.old_log_probs[0]) and np.isneginf(batch.old_log_probs[8])


def test_wrong_role_type_and_step_type(tmp_path, rows):
    table = _table(rows).set_column(0, "old_log_probs", pa.array([1.0, 2.0, 3.0, 4.0]))
    with pytest.raises(InputError, match=r"expected a list of float32 or float64.*column 'old_log_probs'"):
        _read(_write(tmp_path, table))
    table = _table(rows).append_column("step", pa.array(["a", "b", "c", "d"]))
    with pytest.raises(InputError, match=r"integer step column.*column 'step'"):
        _read(_write(tmp_path, table, "steps.parquet"))


def test_only_needed_columns_are_read(tmp_path, rows, concat, monkeypatch):
    big = pa.array([b"x" * 200_000] * 4, type=pa.binary())
    weird = pa.array([{"a": [[1, 2]], "b": "s"}] * 4)
    table = _table(rows).append_column("blob", big).append_column("nested", weird)
    table = table.append_column("uid", pa.array(["u0", "u1", "u2", "u3"]))
    path = _write(tmp_path, table)

    seen: list[list[str]] = []
    original = pq.ParquetFile.iter_batches

    def spy(self, *args, **kwargs):
        seen.append(list(kwargs["columns"]))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", spy)
    batches = _read(path, chunk_rows=3)
    assert seen == [["old_log_probs", "rollout_log_probs", "response_mask", "uid"]]
    np.testing.assert_array_equal(concat(batches)[0], rows.flat()[0])
    assert np.concatenate([b.sequence_ids for b in batches]).tolist() == ["u0", "u1", "u2", "u3"]


def test_empty_rows_and_empty_file(tmp_path, rows):
    table = _table(rows)
    (batch,) = _read(_write(tmp_path, table.slice(0, 0), "empty.parquet")) or [None]
    assert batch is None
    old = [[], [-1.0]]
    table = pa.table(
        {
            "old_log_probs": pa.array(old, type=pa.list_(pa.float32())),
            "rollout_log_probs": pa.array(old, type=pa.list_(pa.float32())),
            "response_mask": pa.array([[], [True]]),
        }
    )
    (batch,) = _read(_write(tmp_path, table, "zero.parquet"))
    assert batch.offsets.tolist() == [0, 0, 1]


def test_corrupt_and_truncated_files(tmp_path, rows):
    garbage = tmp_path / "garbage.parquet"
    garbage.write_bytes(b"this is not parquet at all" * 10)
    with pytest.raises(InputError, match=r"cannot read .*garbage.parquet as parquet") as err:
        _read(str(garbage))
    assert "fix:" in str(err.value)

    path = _write(tmp_path, _table(rows))
    data = open(path, "rb").read()
    truncated = tmp_path / "truncated.parquet"
    truncated.write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError, match=r"cannot read .*truncated.parquet as parquet"):
        _read(str(truncated))

    empty = tmp_path / "zero_bytes.parquet"
    empty.write_bytes(b"")
    with pytest.raises(InputError, match="zero_bytes.parquet"):
        _read(str(empty))

    with pytest.raises(InputError, match="missing.parquet"):
        _read(str(tmp_path / "missing.parquet"))


def test_iter_batches_streams_files_in_order(tmp_path, rows):
    first = _write(tmp_path, _table(rows), "b.parquet")
    second = _write(tmp_path, _table(rows).slice(1, 2), "a.parquet")
    files = [InputFile(first, "parquet", 0), InputFile(second, "parquet", 0)]
    batches = list(iter_batches(files, ReadOptions(chunk_rows=3)))
    assert [(b.source, b.first_row, b.num_rows) for b in batches] == [
        (first, 0, 3),
        (first, 3, 1),
        (second, 0, 2),
    ]
    with pytest.raises(UsageError):
        list(iter_batches(files, ReadOptions(chunk_rows=0)))
