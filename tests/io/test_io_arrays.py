"""io.arrays.to_numpy against pyarrow's own conversion, and the parquet path without pandas."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from mismatch_cli.io.arrays import to_numpy

REPO = Path(__file__).resolve().parents[2]

ARRAYS = {
    "float32": pa.array([0.5, -1.25, 3e38, -0.0], pa.float32()),
    "float64": pa.array([1e-300, -2.5, np.inf, np.nan]),
    "float16": pa.array(np.array([0.5, -2.0], dtype=np.float16)),
    "int8": pa.array([-128, 0, 127], pa.int8()),
    "int32": pa.array([0, 7, 2**31 - 1], pa.int32()),
    "int64": pa.array([-(2**63), 5, 2**63 - 1], pa.int64()),
    "uint16": pa.array([0, 65535], pa.uint16()),
    "bool": pa.array([True, False, True, True, False, False, True, False, True, True, False]),
    "with nulls": pa.array([1.0, None, 3.0], pa.float32()),
    "bool with nulls": pa.array([True, None, False]),
    "strings": pa.array(["a", None, "c"]),
    "empty float": pa.array([], pa.float32()),
    "empty bool": pa.array([], pa.bool_()),
}


def _same(ours: np.ndarray, theirs: np.ndarray) -> None:
    assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
    assert np.array_equal(ours, theirs, equal_nan=ours.dtype.kind == "f") or list(ours) == list(theirs)


@pytest.mark.parametrize("name", list(ARRAYS))
def test_same_values_as_pyarrow(name: str) -> None:
    array = ARRAYS[name]
    _same(to_numpy(array), array.to_numpy(zero_copy_only=False))


@pytest.mark.parametrize("name", ["float32", "int64", "bool", "with nulls"])
@pytest.mark.parametrize("start, stop", [(1, 3), (0, 0), (2, None)])
def test_slices_read_from_their_offset(name: str, start: int, stop: int | None) -> None:
    array = ARRAYS[name]
    part = array.slice(start, None if stop is None else stop - start)
    _same(to_numpy(part), part.to_numpy(zero_copy_only=False))


def test_bools_at_every_bit_offset() -> None:
    rng = np.random.default_rng(0)
    values = rng.random(203) < 0.5
    array = pa.array(values)
    for start in range(17):
        assert np.array_equal(to_numpy(array.slice(start, 150)), values[start:start + 150])


def test_list_offsets_and_flattened_values() -> None:
    lists = pa.array([[1.0, 2.0], [], [3.5]], pa.list_(pa.float32())).slice(1)
    assert to_numpy(lists.offsets).tolist() == [2, 2, 3]
    assert to_numpy(lists.flatten()).tolist() == [3.5]


def test_analyzing_a_parquet_dump_does_not_import_pandas() -> None:
    # pyarrow's own to_numpy imports pandas (about 0.3 s of start-up); the parquet path must not need it.
    code = ("import sys; import mismatch_cli as m; "
            "m.analyze(['sample_data/multi_turn.parquet'], device='cpu'); "
            "print('pandas' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr
