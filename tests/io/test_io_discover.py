"""Input discovery (files, directories, globs), hashing, and the no-torch import rule."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import pytest

from mismatch_cli.errors import InputError, UsageError
from mismatch_cli.io import InputFile, discover_inputs, sha256_file


def _touch(path, data: bytes = b"x") -> str:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
    return str(path)


def test_directory_is_recursive_sorted_and_skips_other_files(tmp_path):
    root = tmp_path / "dumps"
    for rel in [
        "b/step_2.parquet",
        "a.parquet",
        "b/step_1.safetensors",
        "b/c/z.parquet",
        "notes.txt",
        ".hidden/x.parquet",
        "b/._y.parquet",
    ]:
        _touch(root / rel)
    found = discover_inputs([str(root)])
    assert [os.path.relpath(f.path, root) for f in found] == [
        "a.parquet",
        os.path.join("b", "c", "z.parquet"),
        os.path.join("b", "step_1.safetensors"),
        os.path.join("b", "step_2.parquet"),
    ]
    assert [f.format for f in found] == ["parquet", "parquet", "safetensors", "parquet"]
    assert all(f.bytes == 1 for f in found)


def test_arguments_keep_their_order_and_duplicates_are_dropped(tmp_path):
    a = _touch(tmp_path / "a.parquet", b"abc")
    b = _touch(tmp_path / "b.SAFETENSORS")
    found = discover_inputs([b, a, str(tmp_path / "*.parquet")])
    assert found == [InputFile(b, "safetensors", 1), InputFile(a, "parquet", 3)]


def test_globs(tmp_path):
    for rel in ["run1/x.parquet", "run2/y.parquet", "run2/deep/z.safetensors", "run2/readme.md"]:
        _touch(tmp_path / rel)
    found = discover_inputs([str(tmp_path / "run*" / "*.parquet")])
    assert [os.path.basename(f.path) for f in found] == ["x.parquet", "y.parquet"]
    found = discover_inputs([str(tmp_path / "**" / "*.safetensors")])
    assert [os.path.basename(f.path) for f in found] == ["z.safetensors"]
    found = discover_inputs([str(tmp_path / "run2*")])  # a glob matching a folder expands it
    assert [os.path.basename(f.path) for f in found] == ["z.safetensors", "y.parquet"]
    with pytest.raises(InputError, match=r"pattern .*\*\.nothing matched no"):
        discover_inputs([str(tmp_path / "*.nothing")])


def test_discovery_errors(tmp_path):
    with pytest.raises(InputError, match=r"no such file or directory: .*missing.parquet") as err:
        discover_inputs([str(tmp_path / "missing.parquet")])
    assert err.value.exit_code == 3 and "fix:" in str(err.value)
    csv = _touch(tmp_path / "data.csv")
    with pytest.raises(InputError, match=r"data.csv is a CSV table, not a dump.*fix: write .* as parquet"):
        discover_inputs([csv])
    other = _touch(tmp_path / "data.bin")
    with pytest.raises(InputError, match=r"cannot tell the format of .*data.bin: expected a parquet"):
        discover_inputs([other])
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match=r"under directory .*empty"):
        discover_inputs([str(tmp_path / "empty")])
    with pytest.raises(UsageError):
        discover_inputs([])


def test_sha256_file(tmp_path):
    data = os.urandom(100_000)
    path = _touch(tmp_path / "a.parquet", data)
    assert sha256_file(path) == hashlib.sha256(data).hexdigest()
    with pytest.raises(InputError, match="nope.parquet"):
        sha256_file(str(tmp_path / "nope.parquet"))


def test_io_package_does_not_import_torch():
    code = "import sys, mismatch_cli.io; assert 'torch' not in sys.modules, 'torch imported'"
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=root)
