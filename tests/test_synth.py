"""Synthetic dumps: read back with pyarrow / safetensors directly and checked independently."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from safetensors.numpy import load_file

from mismatch_cli.errors import UsageError
from mismatch_cli.synth import SynthSpec, SynthSummary, write_synthetic_dump

Flat = dict[str, np.ndarray]


def _read_parquet(path: Path) -> Flat:
    """Flat per-position arrays and row offsets of a wide parquet dump."""
    table = pq.read_table(path)
    mask_lists = table["response_mask"].combine_chunks()
    flat: Flat = {
        name: table[name].combine_chunks().flatten().to_numpy()
        for name in ("old_log_probs", "rollout_log_probs", "response_mask")
    }
    flat["offsets"] = mask_lists.offsets.to_numpy().astype(np.int64)
    for name in ("uid", "step"):
        if name in table.column_names:
            flat[name] = table[name].to_numpy()
    return flat


def _read_packed(path: Path) -> Flat:
    """Flat arrays of a packed safetensors dump, offsets from `num_tokens`."""
    tensors = load_file(str(path))
    flat = {name: tensors[name] for name in ("old_log_probs", "rollout_log_probs", "response_mask")}
    flat["offsets"] = np.concatenate([[0], np.cumsum(tensors["num_tokens"])])
    return flat


def _write(tmp_path: Path, spec: SynthSpec, name: str = "dump") -> tuple[SynthSummary, Flat]:
    """Write a dump and read it back as flat arrays."""
    suffix = ".parquet" if spec.format == "parquet" else ".safetensors"
    path = tmp_path / f"{name}{suffix}"
    summary = write_synthetic_dump(path, spec)
    assert Path(summary.path) == path
    flat = _read_parquet(path) if spec.format == "parquet" else _read_packed(path)
    return summary, flat


def _runs(mask: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row the number of runs of 1s, and per position the 0-based run index (-1 off the mask)."""
    valid = mask.astype(np.int64)
    step_up = np.diff(np.concatenate([[0], valid])) == 1
    row_start_one = np.zeros(len(valid), dtype=bool)
    row_start_one[offsets[:-1]] = valid[offsets[:-1]] == 1  # a row starting with 1 opens a run
    starts = step_up.copy()
    starts[offsets[:-1]] = row_start_one[offsets[:-1]]
    runs_per_row = np.add.reduceat(starts.astype(np.int64), offsets[:-1])
    cumulative = np.cumsum(starts)
    before_row = np.repeat(cumulative[offsets[:-1]] - starts[offsets[:-1]], np.diff(offsets))
    run_index = np.where(valid == 1, cumulative - before_row - 1, -1)
    return runs_per_row, run_index


def test_deterministic_for_a_seed(tmp_path: Path) -> None:
    spec = SynthSpec(tokens=20_000, turns=3, seed=7, empty_rows=0.1, steps=2, catastrophic_rate=1e-3)
    _, first = _write(tmp_path, spec, "a")
    _, second = _write(tmp_path, spec, "b")
    _, other = _write(tmp_path, replace(spec, seed=8), "c")
    for name in first:
        np.testing.assert_array_equal(first[name], second[name])
    assert len(other["old_log_probs"]) != len(first["old_log_probs"]) or not np.array_equal(
        other["old_log_probs"], first["old_log_probs"]
    )


@pytest.mark.parametrize(
    "spec",
    [
        SynthSpec(tokens=100_000),
        SynthSpec(tokens=100_000, turns=4, empty_rows=0.2, seed=3),
        SynthSpec(tokens=20_000, mean_length=64, format="safetensors", layout="packed"),
        SynthSpec(tokens=5, mean_length=1),
    ],
)
def test_token_count_near_request(tmp_path: Path, spec: SynthSpec) -> None:
    summary, flat = _write(tmp_path, spec)
    valid = int(flat["response_mask"].sum())
    assert valid == summary.tokens
    assert abs(valid - spec.tokens) <= 0.1 * spec.tokens
    assert summary.positions == len(flat["response_mask"])
    assert summary.sequences == len(flat["offsets"]) - 1


def test_mask_and_log_probs_are_well_formed(tmp_path: Path) -> None:
    _, flat = _write(tmp_path, SynthSpec(tokens=100_000, turns=2, empty_rows=0.05))
    mask = flat["response_mask"]
    assert mask.dtype == np.int8
    assert set(np.unique(mask).tolist()) == {0, 1}
    lengths = np.diff(flat["offsets"])
    assert lengths.min() >= 1
    for name in ("old_log_probs", "rollout_log_probs"):
        values = flat[name]
        assert values.dtype == np.float32
        assert np.isfinite(values).all()  # gaps too
        assert (values[mask == 1] <= 0).all()
        assert (values[mask == 1] != 0).all()  # an exact 0.0 on a valid token reads as a sentinel


def test_rollout_distribution_is_peaked_with_a_long_tail(tmp_path: Path) -> None:
    _, flat = _write(tmp_path, SynthSpec(tokens=200_000, catastrophic_rate=0.0))
    valid = flat["response_mask"] == 1
    rollout = flat["rollout_log_probs"][valid].astype(np.float64)
    log_ratio = flat["old_log_probs"][valid].astype(np.float64) - rollout
    assert np.mean(rollout > -0.1) > 0.7
    assert 0.005 < np.mean(rollout < -2) < 0.1
    assert rollout.min() > -40
    # bf16-sized disagreement that grows with |log-prob|, signed, slightly positive.
    assert 1e-4 < np.abs(log_ratio).mean() < 2e-2
    assert 0 < np.mean(log_ratio) < np.abs(log_ratio).mean()
    assert 0.3 < np.mean(log_ratio < 0) < 0.5
    confident, unlikely = rollout > -0.01, rollout < -2
    assert np.abs(log_ratio[unlikely]).mean() > 10 * np.abs(log_ratio[confident]).mean()
    assert np.abs(log_ratio).max() < 3  # no catastrophic token when the rate is 0


def test_catastrophic_tokens_and_noise_scale(tmp_path: Path) -> None:
    spec = SynthSpec(tokens=200_000, catastrophic_rate=1e-3, seed=5)
    _, base = _write(tmp_path, spec, "base")
    valid = base["response_mask"] == 1
    log_ratio = base["old_log_probs"][valid].astype(np.float64) - base["rollout_log_probs"][valid]
    large = np.abs(log_ratio) > 3
    assert 0.5 * 1e-3 < large.mean() < 1.5 * 1e-3
    assert np.abs(log_ratio).max() <= 15 + 1e-3

    _, loud = _write(tmp_path, replace(spec, noise=2.0), "loud")
    loud_ratio = loud["old_log_probs"][valid].astype(np.float64) - loud["rollout_log_probs"][valid]
    np.testing.assert_array_equal(
        loud["rollout_log_probs"][valid][~large], base["rollout_log_probs"][valid][~large]
    )
    ratio = np.abs(loud_ratio[~large]).mean() / np.abs(log_ratio[~large]).mean()
    assert 1.9 < ratio < 2.1


def test_multi_turn_runs_and_rounds(tmp_path: Path) -> None:
    turns = 4
    _, flat = _write(tmp_path, SynthSpec(tokens=150_000, turns=turns, mean_length=128, seed=2))
    mask, offsets = flat["response_mask"], flat["offsets"]
    runs_per_row, run_index = _runs(mask, offsets)
    assert runs_per_row.min() >= 1 and runs_per_row.max() == turns
    assert np.mean(runs_per_row == turns) > 0.35  # most rows near K
    assert np.mean(runs_per_row >= turns - 1) > 0.6
    assert np.mean(runs_per_row < turns) > 0.2  # but not all

    # Gaps between runs are tool / environment tokens, 5-200 long; their rollout side is 0.0.
    zero = (mask == 0).astype(np.int64)
    edges = np.diff(np.concatenate([[0], zero, [0]]))
    gap_starts, gap_stops = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    row_of = np.searchsorted(offsets, gap_starts, side="right") - 1
    inner = (gap_starts > offsets[row_of]) & (gap_stops < offsets[row_of + 1])
    inner_lengths = (gap_stops - gap_starts)[inner]
    assert len(inner_lengths) > 0
    assert inner_lengths.min() >= 5 and inner_lengths.max() <= 200
    assert (flat["rollout_log_probs"][mask == 0] == 0).all()

    abs_log_ratio = np.abs(flat["old_log_probs"].astype(np.float64) - flat["rollout_log_probs"])
    per_round = [abs_log_ratio[run_index == k].mean() for k in range(turns)]
    assert all(later > earlier for earlier, later in zip(per_round, per_round[1:], strict=False))
    assert per_round[-1] > 1.5 * per_round[0]


def test_single_turn_rows_are_one_run(tmp_path: Path) -> None:
    _, flat = _write(tmp_path, SynthSpec(tokens=50_000, mean_length=64))
    runs_per_row, _ = _runs(flat["response_mask"], flat["offsets"])
    assert (runs_per_row == 1).all()
    assert (flat["response_mask"] == 1).all()


def test_empty_row_fraction(tmp_path: Path) -> None:
    _, flat = _write(tmp_path, SynthSpec(tokens=40_000, mean_length=32, empty_rows=0.25, seed=4))
    offsets = flat["offsets"]
    valid_per_row = np.add.reduceat(flat["response_mask"].astype(np.int64), offsets[:-1])
    assert len(valid_per_row) > 1000
    assert abs(np.mean(valid_per_row == 0) - 0.25) < 0.04
    assert np.diff(offsets).min() >= 1


def test_parquet_row_groups_are_bounded_and_do_not_change_data(tmp_path: Path) -> None:
    spec = SynthSpec(tokens=60_000, mean_length=100, turns=2, row_group_tokens=5_000, seed=6)
    summary, small_groups = _write(tmp_path, spec, "small")
    metadata = pq.ParquetFile(tmp_path / "small.parquet").metadata
    assert metadata.num_row_groups >= 10
    file = pq.ParquetFile(tmp_path / "small.parquet")
    group_positions = [
        len(file.read_row_group(i, columns=["response_mask"])["response_mask"].combine_chunks().flatten())
        for i in range(metadata.num_row_groups)
    ]
    assert sum(group_positions) == summary.positions
    assert max(group_positions) <= 5_000
    assert np.mean(group_positions[:-1]) > 0.8 * 5_000  # groups are filled, not one per block
    _, one_group = _write(tmp_path, replace(spec, row_group_tokens=10**9), "one")
    assert pq.ParquetFile(tmp_path / "one.parquet").metadata.num_row_groups == 1
    for name in small_groups:
        np.testing.assert_array_equal(small_groups[name], one_group[name])


def test_padded_and_packed_safetensors_hold_the_same_tokens(tmp_path: Path) -> None:
    spec = SynthSpec(tokens=30_000, turns=3, mean_length=80, empty_rows=0.1, seed=9, format="safetensors")
    write_synthetic_dump(tmp_path / "padded.safetensors", replace(spec, layout="padded"))
    write_synthetic_dump(tmp_path / "packed.safetensors", replace(spec, layout="packed"))
    write_synthetic_dump(tmp_path / "same.parquet", replace(spec, format="parquet"))
    padded = load_file(str(tmp_path / "padded.safetensors"))
    packed = _read_packed(tmp_path / "packed.safetensors")
    wide = _read_parquet(tmp_path / "same.parquet")
    lengths = np.diff(packed["offsets"])
    rows, width = padded["response_mask"].shape
    assert rows == len(lengths) and width == lengths.max()
    inside = np.arange(width)[None, :] < lengths[:, None]
    for name in ("old_log_probs", "rollout_log_probs", "response_mask"):
        assert padded[name].shape == (rows, width)
        np.testing.assert_array_equal(padded[name][inside], packed[name])
        np.testing.assert_array_equal(packed[name], wide[name])
        assert (padded[name][~inside] == 0).all()  # right padding: mask 0, log-prob 0.0
    valid = padded["response_mask"] == 1
    np.testing.assert_array_equal(
        padded["old_log_probs"][valid], packed["old_log_probs"][packed["response_mask"] == 1]
    )


def test_steps_column(tmp_path: Path) -> None:
    _, with_steps = _write(tmp_path, SynthSpec(tokens=30_000, steps=3, mean_length=64), "steps")
    steps = with_steps["step"]
    assert steps.dtype == np.int64
    assert set(np.unique(steps).tolist()) == {0, 1, 2}
    assert (np.diff(steps) >= 0).all()
    np.testing.assert_array_equal(with_steps["uid"], np.arange(len(steps)))
    _, without = _write(tmp_path, SynthSpec(tokens=30_000, mean_length=64), "single")
    assert "step" not in without


@pytest.mark.parametrize(
    "spec",
    [
        SynthSpec(tokens=0),
        SynthSpec(turns=0),
        SynthSpec(format="csv"),
        SynthSpec(format="safetensors", layout="ragged"),
        SynthSpec(empty_rows=1.0),
        SynthSpec(format="safetensors", steps=2),
        SynthSpec(noise=-1.0),
        SynthSpec(noise=1e300),  # would overflow the float32 log-probs
        SynthSpec(mean_length=0),
        SynthSpec(row_group_tokens=0),
    ],
)
def test_invalid_spec_is_a_usage_error(tmp_path: Path, spec: SynthSpec) -> None:
    with pytest.raises(UsageError, match="synthetic dump"):
        write_synthetic_dump(tmp_path / "bad", spec)
