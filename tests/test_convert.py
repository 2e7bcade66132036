"""`mismatch_cli.convert.convert`: any input to the wide parquet layout, streamed and atomic."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mismatch_cli.api import analyze
from mismatch_cli.convert import convert
from mismatch_cli.errors import DataError, InputError, UsageError
from mismatch_cli.io import ReadOptions

sys.path.append(str(Path(__file__).resolve().parent / "io"))  # the dump writers live next to the reader tests
from framework_dumps import flat, make_seqs, write_nemo, write_parquet, write_prime, write_slime_train  # noqa: E402


def _metrics(path: str) -> dict:
    return analyze([path], device="cpu", dtype="float64", hash_inputs=False).metrics


@pytest.fixture
def dumps(tmp_path):
    seqs = make_seqs(61, count=9, step=2)
    return seqs, {
        "slime": write_slime_train(str(tmp_path / "slime" / "2.pt"), seqs, rollout_id=2),
        "nemo-rl": write_nemo(str(tmp_path / "nemo" / "train_data_step2.jsonl"), seqs),
        "prime-rl": write_prime(str(tmp_path / "token_exports"), 2, 0, seqs),
    }


@pytest.mark.parametrize("fmt", ["slime", "nemo-rl", "prime-rl"])
def test_converted_file_analyzes_like_the_original(tmp_path, dumps, fmt):
    seqs, paths = dumps
    out = str(tmp_path / f"{fmt}.parquet")
    summary = convert([paths[fmt]], out)
    assert summary.sequences == len(seqs) and summary.valid_tokens == flat(seqs)[2].sum()
    assert _metrics(out) == _metrics(paths[fmt])
    table = pq.read_table(out)
    assert table.schema.field("old_log_probs").type == pa.list_(pa.float32())
    assert table.schema.field("response_mask").type == pa.list_(pa.int8())
    assert table.column("step").to_pylist() == [2] * len(seqs)
    assert table.column("uid").null_count == 0
    assert ("env_name" in table.column_names) == (fmt == "prime-rl")
    if fmt == "prime-rl":
        assert table.column("env_name").to_pylist() == [s.env for s in seqs]
    umask = os.umask(0)
    os.umask(umask)
    assert os.stat(out).st_mode & 0o777 == 0o666 & ~umask  # not mkstemp's 0600


def test_keep_copies_a_column_and_float64_keeps_precision(tmp_path):
    seqs = make_seqs(62, count=4)
    seqs[0].old[0] = -0.1  # not exact in float32
    seqs[0].mask[0] = 1
    nemo = write_nemo(str(tmp_path / "train_data_step0.jsonl"), seqs)
    out32, out64 = str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet")
    convert([nemo], out32, ReadOptions(group_columns=("input_lengths",)))
    convert([nemo], out64, dtype="float64")
    t32, t64 = pq.read_table(out32), pq.read_table(out64)
    assert t32.column("input_lengths").to_pylist() == [s.prompt + len(s.old) for s in seqs]
    first32 = t32.column("old_log_probs")[0].as_py()[seqs[0].prompt]
    first64 = t64.column("old_log_probs")[0].as_py()[seqs[0].prompt]
    assert first64 == -0.1 and first32 == float(np.float32(-0.1))


def test_a_missing_keep_column_names_keep_not_by(tmp_path):
    src = write_parquet(str(tmp_path / "in.parquet"), make_seqs(64, count=3), env=False)
    out = tmp_path / "out.parquet"
    with pytest.raises(InputError) as error:
        convert([src], str(out), ReadOptions(group_columns=("env_name",)))
    assert "(asked for by --keep env_name)" in str(error.value) and "--by" not in str(error.value)
    assert not out.exists()


def test_an_output_named_for_another_format_is_refused(tmp_path):
    src = write_parquet(str(tmp_path / "in.parquet"), make_seqs(65, count=2))
    for name in ("out.csv", "out.safetensors"):
        with pytest.raises(UsageError, match="convert writes parquet"):
            convert([src], str(tmp_path / name))
        assert not (tmp_path / name).exists()
    convert([src], str(tmp_path / "no_suffix"))  # a bare name is written as parquet


def test_streams_one_row_group_per_chunk(tmp_path):
    seqs = make_seqs(63, count=7)
    src = write_parquet(str(tmp_path / "in.parquet"), seqs)
    out = str(tmp_path / "out.parquet")
    convert([src, src], out, ReadOptions(chunk_rows=2, group_columns=("env_name",)))  # the same file twice: once
    meta = pq.ParquetFile(out).metadata
    assert meta.num_rows == 7 and meta.num_row_groups == 4
    assert pq.read_table(out).column("env_name").to_pylist() == [s.env for s in seqs]


def test_failure_leaves_nothing_behind(tmp_path):
    seqs = make_seqs(64, count=3)
    good = write_nemo(str(tmp_path / "in" / "train_data_step0.jsonl"), seqs)
    bad = tmp_path / "in" / "train_data_step1.jsonl"
    bad.write_text(Path(good).read_text()[:-30] + "\n")
    out = tmp_path / "out" / "all.parquet"
    out.parent.mkdir()
    out.write_bytes(b"previous")
    with pytest.raises(InputError, match="train_data_step1.jsonl"):
        convert([str(tmp_path / "in")], str(out))
    assert out.read_bytes() == b"previous"  # untouched
    assert os.listdir(out.parent) == ["all.parquet"]  # no temporary file left


def test_steps_on_every_row_or_none(tmp_path):
    seqs = make_seqs(65, count=2)
    with_steps = write_parquet(str(tmp_path / "a.parquet"), seqs)
    without = write_parquet(str(tmp_path / "b.parquet"), seqs, steps=False)
    with pytest.raises(DataError, match=r"b.parquet has no step, but the inputs before it had one"):
        convert([with_steps, without], str(tmp_path / "out.parquet"))
    assert not (tmp_path / "out.parquet").exists()
    empty = tmp_path / "train_data_step0.jsonl"
    empty.write_text("")
    with pytest.raises(InputError):
        convert([str(empty)], str(tmp_path / "out.parquet"), ReadOptions(input_format="nemo-rl"))
