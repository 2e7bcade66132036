"""A flipped bit inside a parquet data page: refused when the page carries a CRC (ours always do)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from conftest import assert_clean_failure, mismatch

from mismatch_cli.api import analyze
from mismatch_cli.convert import convert
from mismatch_cli.errors import InputError
from mismatch_cli.synth import SynthSpec, write_synthetic_dump


def table(rows: int = 40, width: int = 50) -> pa.Table:
    rng = np.random.default_rng(0)
    rollout = -rng.exponential(0.5, size=(rows, width)).astype(np.float32)
    old = (rollout + rng.normal(0, 0.05, size=(rows, width))).astype(np.float32)
    return pa.table({
        "old_log_probs": pa.array(list(old), pa.list_(pa.float32())),
        "rollout_log_probs": pa.array(list(rollout), pa.list_(pa.float32())),
        "response_mask": pa.array([np.ones(width, np.int8)] * rows, pa.list_(pa.int8())),
    })


def flip_inside_data_page(source: Path, target: Path, column: str = "old_log_probs") -> None:
    """Copy `source` with one bit flipped in the middle of `column`'s first data page (found from the footer)."""
    metadata = pq.ParquetFile(source).metadata
    names = [metadata.schema.column(i).path for i in range(metadata.num_columns)]
    chunk = metadata.row_group(0).column(names.index(f"{column}.list.element"))
    # A chunk is [dictionary page] data page(s); the middle of the data pages lies inside page bytes.
    end = (chunk.dictionary_page_offset if chunk.has_dictionary_page else chunk.data_page_offset) \
        + chunk.total_compressed_size
    position = (chunk.data_page_offset + end) // 2
    data = bytearray(source.read_bytes())
    data[position] ^= 0x10
    target.write_bytes(bytes(data))


def metrics(path: Path) -> dict:
    return analyze([str(path)], device="cpu", dtype="float64", hash_inputs=False, bootstrap=0).metrics


def test_a_corrupted_page_with_a_checksum_is_refused(tmp_path: Path) -> None:
    good, bad = tmp_path / "good.parquet", tmp_path / "bad.parquet"
    pq.write_table(table(), good, write_page_checksum=True, use_dictionary=False, compression="none")
    flip_inside_data_page(good, bad)
    run = mismatch("analyze", bad)
    line = assert_clean_failure(run, 3, str(bad), "checksum")
    assert "copy it again" in line
    assert metrics(good)["rollout_corr/kl"] is not None  # the intact file reads


def test_without_checksums_files_still_read(tmp_path: Path) -> None:
    plain, checked = tmp_path / "plain.parquet", tmp_path / "checked.parquet"
    pq.write_table(table(), plain, use_dictionary=False, compression="none")
    pq.write_table(table(), checked, write_page_checksum=True)
    assert metrics(plain) == metrics(checked)
    # No CRC, no way to tell: the flipped bit is read as data (this is what the checksums prevent).
    flipped = tmp_path / "flipped.parquet"
    flip_inside_data_page(plain, flipped)
    assert metrics(flipped) != metrics(plain)


def test_synth_and_convert_write_checksums(tmp_path: Path) -> None:
    dump = tmp_path / "synth.parquet"
    write_synthetic_dump(dump, SynthSpec(tokens=3000))  # = mismatch synth
    converted = tmp_path / "converted.parquet"
    convert([str(dump)], converted)  # = mismatch convert
    for path in (dump, converted):
        bad = path.with_name(f"bad-{path.name}")
        flip_inside_data_page(path, bad)
        try:
            metrics(bad)
        except InputError as error:
            assert "checksum" in str(error), str(error)
        else:
            raise AssertionError(f"{path.name}: a corrupted page was read")
    assert metrics(converted) == metrics(dump)
