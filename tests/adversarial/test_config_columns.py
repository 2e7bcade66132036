"""Column mapping: two roles never read one column, and a file's duplicated column is named, not a crash."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import ROOT, assert_clean_failure, mismatch, snapshot

from mismatch_cli.errors import UsageError
from mismatch_cli.io import ReadOptions
from mismatch_cli.io.aliases import resolve_roles

DUMP = ROOT / "sample_data" / "single_turn.parquet"
COLUMNS = ["old_log_probs", "rollout_log_probs", "response_mask", "uid", "step"]


@pytest.mark.parametrize(
    ("columns", "roles"),
    [
        ({"old_log_probs": "rollout_log_probs"}, ("old_log_probs", "rollout_log_probs")),
        ({"rollout_log_probs": "old_log_probs"}, ("old_log_probs", "rollout_log_probs")),
        ({"old_log_probs": "uid", "rollout_log_probs": "uid"}, ("old_log_probs", "rollout_log_probs")),
        ({"response_mask": "old_log_probs"}, ("old_log_probs", "response_mask")),
    ],
)
def test_two_roles_one_column_is_refused(columns, roles):
    with pytest.raises(UsageError) as info:
        resolve_roles(COLUMNS, ReadOptions(columns=columns), "dump.parquet")
    assert all(role in str(info.value) for role in roles) and info.value.hint


@pytest.mark.parametrize(
    "args",
    [
        ["--column", "old_log_probs=rollout_log_probs"],
        ["--column", "rollout_log_probs=old_log_probs"],
        ["--column", "old_log_probs=uid", "--column", "rollout_log_probs=uid"],
    ],
)
def test_cli_refuses_a_healthy_looking_self_comparison(tmp_path, args):
    before = snapshot(tmp_path)
    assert_clean_failure(mismatch("analyze", DUMP, *args, "--out-dir", tmp_path / "out"), 2,
                         "old_log_probs", "rollout_log_probs")
    assert snapshot(tmp_path) == before


def test_one_role_given_twice_is_refused():
    run = mismatch("analyze", DUMP, "--column", "old_log_probs=a", "--column", "old_log_probs=b")
    assert_clean_failure(run, 2, "--column old_log_probs", "twice")


def _duplicated(tmp_path, name: str):
    table = pq.read_table(DUMP)
    path = tmp_path / "dup.parquet"
    pq.write_table(pa.Table.from_arrays([*table.columns, table.column(name)], names=[*table.column_names, name]),
                   path)
    return path


@pytest.mark.parametrize("name", ["old_log_probs", "response_mask", "step"])
@pytest.mark.parametrize("command", ["analyze", "convert"])
def test_duplicate_parquet_column_is_exit_3_naming_file_and_column(tmp_path, name, command):
    path = _duplicated(tmp_path, name)
    extra = ["-o", tmp_path / "c.parquet"] if command == "convert" else []
    before = snapshot(tmp_path)
    assert_clean_failure(mismatch(command, path, *extra), 3, str(path), repr(name))
    assert snapshot(tmp_path) == before


def test_duplicate_of_an_unused_column_is_harmless(tmp_path):
    table = pq.read_table(DUMP)
    path = tmp_path / "extra.parquet"
    pq.write_table(pa.Table.from_arrays([*table.columns, table.column("uid"), table.column("uid")],
                                        names=[*table.column_names, "note", "note"]), path)
    run = mismatch("analyze", path, "--bootstrap", "0", "--format", "json")
    assert run.code == 0, run.stderr
