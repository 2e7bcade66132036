"""One data set, every input layout: `analyze` must give the same metrics whatever the storage."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from safetensors.numpy import save_file

from mismatch_cli.api import analyze
from mismatch_cli.correction import CorrectionConfig
from mismatch_cli.io import ReadOptions

ROWS = 40
MAX_LEN = 30
CORRECTION = CorrectionConfig(
    rollout_is="token", rollout_rs="seq_mean_k1,token_k2", rollout_rs_threshold="0.99_1.01,0.5"
)


class Data:
    """40 ragged rows (lengths 1..30), realistic log-probs, masks with gaps and some all-zero rows."""

    def __init__(self, seed: int = 1234) -> None:
        rng = np.random.default_rng(seed)
        self.lengths = rng.integers(1, MAX_LEN + 1, size=ROWS)
        self.lengths[0] = MAX_LEN  # the padded width is always reached
        self.old: list[np.ndarray] = []
        self.rollout: list[np.ndarray] = []
        self.mask: list[np.ndarray] = []
        for i, n in enumerate(self.lengths):
            # Mostly confident tokens with a long tail; trainer = engine + bf16-like noise.
            nll = np.where(rng.random(n) < 0.8, rng.exponential(0.02, n), rng.exponential(1.5, n)) + 1e-6
            rollout = -nll
            old = np.minimum(rollout + rng.normal(0.002, 0.02 + 0.05 * nll, n), -1e-7)
            mask = (rng.random(n) < 0.8).astype(np.int64)
            if n >= 4:
                mask[: rng.integers(0, 3)] = 0  # a prompt / tool gap at the start
            if i in (5, 17, 33):
                mask[:] = 0  # empty rows
            self.old.append(old)
            self.rollout.append(rollout)
            self.mask.append(mask)
        assert any(m.sum() == 0 for m in self.mask) and all(m.sum() > 0 for m in self.mask[:5])

    def flat(self, dtype=np.float64) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        offsets = np.concatenate([[0], np.cumsum(self.lengths)]).astype(np.int64)
        return (
            np.concatenate(self.old).astype(dtype),
            np.concatenate(self.rollout).astype(dtype),
            np.concatenate(self.mask),
            offsets,
        )

    def padded(self, dtype=np.float64) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        old = np.zeros((ROWS, MAX_LEN), dtype=dtype)
        rollout = np.zeros((ROWS, MAX_LEN), dtype=dtype)
        mask = np.zeros((ROWS, MAX_LEN), dtype=np.int64)
        for i, n in enumerate(self.lengths):
            old[i, :n], rollout[i, :n], mask[i, :n] = self.old[i], self.rollout[i], self.mask[i]
        return old, rollout, mask


DATA = Data()


def _list_array(rows: list[np.ndarray], value_type: pa.DataType, kind: str) -> pa.Array:
    offsets = np.concatenate([[0], np.cumsum([len(r) for r in rows])])
    values = pa.array(np.concatenate(rows), type=value_type)
    if kind == "list":
        return pa.ListArray.from_arrays(pa.array(offsets, type=pa.int32()), values)
    return pa.LargeListArray.from_arrays(pa.array(offsets, type=pa.int64()), values)


def _write_parquet(path: Path, kind: str = "list", float_type=pa.float64(), mask_type=pa.int64()) -> str:
    if kind == "fixed":
        old, rollout, mask = DATA.padded()
        float_np = np.float32 if float_type == pa.float32() else np.float64

        def fixed(values: np.ndarray, value_type: pa.DataType) -> pa.Array:
            flat = pa.array(values.reshape(-1), type=value_type)
            return pa.FixedSizeListArray.from_arrays(flat, MAX_LEN)

        columns = {
            "old_log_probs": fixed(old.astype(float_np), float_type),
            "rollout_log_probs": fixed(rollout.astype(float_np), float_type),
            "response_mask": fixed(_mask_values(mask.reshape(-1), mask_type), mask_type),
        }
    else:
        float_np = np.float32 if float_type == pa.float32() else np.float64
        columns = {
            "old_log_probs": _list_array([r.astype(float_np) for r in DATA.old], float_type, kind),
            "rollout_log_probs": _list_array([r.astype(float_np) for r in DATA.rollout], float_type, kind),
            "response_mask": _list_array([_mask_values(m, mask_type) for m in DATA.mask], mask_type, kind),
        }
    pq.write_table(pa.table(columns), path, row_group_size=16)
    return str(path)


def _mask_values(mask: np.ndarray, mask_type: pa.DataType) -> np.ndarray:
    if mask_type == pa.bool_():
        return mask.astype(bool)
    if mask_type == pa.float64():
        return mask.astype(np.float64)
    return mask.astype(mask_type.to_pandas_dtype())


def _write_padded_safetensors(path: Path, dtype=np.float64) -> str:
    old, rollout, mask = DATA.padded(dtype)
    save_file({"old_log_probs": old, "rollout_log_probs": rollout, "response_mask": mask.astype(np.int8)}, str(path))
    return str(path)


def _write_packed_safetensors(path: Path, lengths: str, dtype=np.float64) -> str:
    old, rollout, mask, offsets = DATA.flat(dtype)
    tensors = {"old_log_probs": old, "rollout_log_probs": rollout, "response_mask": mask.astype(np.int32)}
    if lengths == "num_tokens":
        tensors["num_tokens"] = np.diff(offsets).astype(np.int64)
    else:
        tensors["cu_seqlens"] = offsets.astype(np.int32)
    save_file(tensors, str(path))
    return str(path)


WRITERS64 = {
    "list_double": lambda p: _write_parquet(p / "a.parquet"),
    "large_list_double": lambda p: _write_parquet(p / "a.parquet", kind="large"),
    "fixed_size_list_double": lambda p: _write_parquet(p / "a.parquet", kind="fixed"),
    "list_double_bool_mask": lambda p: _write_parquet(p / "a.parquet", mask_type=pa.bool_()),
    "list_double_int8_mask": lambda p: _write_parquet(p / "a.parquet", mask_type=pa.int8()),
    "list_double_float_mask": lambda p: _write_parquet(p / "a.parquet", mask_type=pa.float64()),
    "fixed_size_list_bool_mask": lambda p: _write_parquet(p / "a.parquet", kind="fixed", mask_type=pa.bool_()),
    "safetensors_padded": lambda p: _write_padded_safetensors(p / "a.safetensors"),
    "safetensors_packed_num_tokens": lambda p: _write_packed_safetensors(p / "a.safetensors", "num_tokens"),
    "safetensors_packed_cu_seqlens": lambda p: _write_packed_safetensors(p / "a.safetensors", "cu_seqlens"),
}
WRITERS32 = {
    "list_float": lambda p: _write_parquet(p / "a.parquet", float_type=pa.float32()),
    "large_list_float": lambda p: _write_parquet(p / "a.parquet", kind="large", float_type=pa.float32()),
    "fixed_size_list_float": lambda p: _write_parquet(p / "a.parquet", kind="fixed", float_type=pa.float32()),
    "safetensors_padded_f32": lambda p: _write_padded_safetensors(p / "a.safetensors", np.float32),
    "safetensors_packed_f32": lambda p: _write_packed_safetensors(p / "a.safetensors", "num_tokens", np.float32),
}


def _run(path: str, read_options: ReadOptions | None = None):
    return analyze(
        [path], correction=CORRECTION, read_options=read_options, device="cpu", dtype="float64", hash_inputs=False
    )


def _assert_same_metrics(ours: dict, reference: dict, rel: float = 1e-12) -> None:
    assert set(ours) == set(reference)
    for key, ref in reference.items():
        value = ours[key]
        if ref is None or value is None:
            assert value is None and ref is None, key
        elif math.isnan(ref):
            assert math.isnan(value), key
        else:
            assert value == pytest.approx(ref, rel=rel, abs=1e-300), key


@pytest.fixture(scope="module")
def reference64(tmp_path_factory):
    return _run(WRITERS64["list_double"](tmp_path_factory.mktemp("ref64")))


@pytest.fixture(scope="module")
def reference32(tmp_path_factory):
    return _run(WRITERS32["list_float"](tmp_path_factory.mktemp("ref32")))


def test_reference_is_what_we_wrote(reference64):
    """The baseline itself: counts match the data, and key metrics match numpy float64."""
    old, rollout, mask, offsets = DATA.flat()
    valid = mask != 0
    assert reference64.inputs[0].sequences == ROWS
    assert reference64.inputs[0].tokens == int(valid.sum())
    expected_kl = float(np.sum((rollout - old)[valid])) / (valid.sum() + 1e-8)
    assert reference64.metrics["rollout_corr/kl"] == pytest.approx(expected_kl, rel=1e-9)
    # The correction keys are there (the config really ran).
    assert "rollout_corr/rollout_is_mean" in reference64.metrics
    assert any(k.startswith("rollout_corr/rollout_rs") for k in reference64.metrics)


@pytest.mark.parametrize("layout", [k for k in WRITERS64 if k != "list_double"])
def test_float64_layouts_agree(layout, tmp_path, reference64):
    report = _run(WRITERS64[layout](tmp_path))
    assert report.inputs[0].sequences == reference64.inputs[0].sequences
    assert report.inputs[0].tokens == reference64.inputs[0].tokens
    _assert_same_metrics(report.metrics, reference64.metrics)


@pytest.mark.parametrize("layout", [k for k in WRITERS32 if k != "list_float"])
def test_float32_layouts_agree(layout, tmp_path, reference32):
    report = _run(WRITERS32[layout](tmp_path))
    assert report.inputs[0].sequences == reference32.inputs[0].sequences
    assert report.inputs[0].tokens == reference32.inputs[0].tokens
    _assert_same_metrics(report.metrics, reference32.metrics)


def test_float32_storage_differs_from_float64(reference32, reference64):
    """Guard: the float32 baseline really holds rounded values (so the two groups are not the same test)."""
    assert reference32.metrics["rollout_corr/kl"] != reference64.metrics["rollout_corr/kl"]
    assert reference32.metrics["rollout_corr/kl"] == pytest.approx(reference64.metrics["rollout_corr/kl"], rel=1e-3)


@pytest.mark.parametrize("layout", ["list_double", "fixed_size_list_double", "safetensors_packed_cu_seqlens"])
def test_chunk_rows_one_equals_default(layout, tmp_path, reference64):
    path = WRITERS64[layout](tmp_path)
    report = _run(path, ReadOptions(chunk_rows=1))
    assert report.inputs[0].sequences == ROWS
    assert report.inputs[0].tokens == reference64.inputs[0].tokens
    _assert_same_metrics(report.metrics, reference64.metrics)


def _write_subset(path: Path, rows: np.ndarray, steps: np.ndarray | None = None) -> str:
    columns = {
        "old_log_probs": _list_array([DATA.old[i] for i in rows], pa.float64(), "list"),
        "rollout_log_probs": _list_array([DATA.rollout[i] for i in rows], pa.float64(), "list"),
        "response_mask": _list_array([DATA.mask[i] for i in rows], pa.int8(), "list"),
    }
    if steps is not None:
        columns["step"] = pa.array(steps[rows], type=pa.int64())
    pq.write_table(pa.table(columns), path, row_group_size=7)
    return str(path)


@pytest.mark.parametrize("chunk_rows", [1, 3, 8192])
def test_interleaved_steps_equal_their_own_batches(tmp_path, chunk_rows):
    """--by step: each step's metrics equal analyzing that step's rows alone, however the file is chunked."""
    steps = np.arange(ROWS) % 3 + 10  # steps interleave row by row
    path = _write_subset(tmp_path / "steps.parquet", np.arange(ROWS), steps)
    report = analyze(
        [path], correction=CORRECTION, read_options=ReadOptions(chunk_rows=chunk_rows), device="cpu",
        dtype="float64", by_step=True, hash_inputs=False,
    )
    assert [s["step"] for s in report.steps] == [10, 11, 12]
    for entry in report.steps:
        rows = np.flatnonzero(steps == entry["step"])
        alone = _run(_write_subset(tmp_path / f"alone{entry['step']}.parquet", rows))
        _assert_same_metrics(entry["metrics"], alone.metrics)
        assert entry["valid_tokens"] == sum(int(DATA.mask[i].sum()) for i in rows)
