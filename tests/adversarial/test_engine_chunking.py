"""The same rows, split into 1, 3 or 7 files and written with any row-group size, give the same report.

Every sum that crosses a chunk boundary accumulates in float64 and the sketches merge by adding
counts, so the metrics, the per-step and per-round tables, the quantiles, the histograms and the
what-if ladder agree to float64 summation order (1e-9 relative) in float32 as in float64.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mismatch_cli.api import analyze
from mismatch_cli.correction import CorrectionConfig

REL, ABS = 1e-9, 1e-12
CONFIGS = (
    CorrectionConfig(rollout_is="token", rollout_is_threshold="0.5_2.0", rollout_is_batch_normalize=True,
                     rollout_rs="token_k1,seq_mean_k3,seq_max_k2", rollout_rs_threshold="0.7_1.5,0.01,0.5"),
    CorrectionConfig(rollout_is="sequence", rollout_is_threshold=3.0, rollout_rs="seq_sum_k1,token_k3",
                     rollout_rs_threshold="0.3_2.5,0.02"),
    CorrectionConfig(semantics="verl-0.6.0", family_fields={"rollout_is_threshold": 2.0,
                                                             "rollout_is_level": "geometric",
                                                             "rollout_is_mode": "mask"}),
    CorrectionConfig(semantics="verl-0.7.0", family_fields={"rollout_is": "token", "rollout_is_threshold": 2.0,
                                                             "rollout_rs": "token", "rollout_rs_threshold": 2.0,
                                                             "rollout_token_veto_threshold": 1e-3}),
)
# (files, rows per row group): the baseline first.
LAYOUTS = ((1, 1024), (1, 1), (3, 7), (7, 1024))


def make_table(seed: int, rows: int, width: int) -> pa.Table:
    """Multi-turn rows of ragged length with empty rows, excluded (NaN) tokens and three steps."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, width + 1, size=rows)
    lengths[0] = max(lengths[0], 1)
    old_rows, rollout_rows, mask_rows = [], [], []
    for n in lengths.tolist():  # building the fixture, not the engine
        rollout = -rng.exponential(0.5, size=n)
        old = rollout + rng.normal(0.0, 0.05, size=n) * (1 + np.abs(rollout))
        old[rng.random(n) < 0.02] -= 12.0  # a few catastrophic tokens
        mask = (rng.random(n) < 0.8).astype(np.int8)  # many rounds per row
        old[(rng.random(n) < 0.02) & (mask == 1)] = np.nan  # excluded, counted
        old_rows.append(old.astype(np.float32))
        rollout_rows.append(rollout.astype(np.float32))
        mask_rows.append(mask)
    mask_rows[0][0] = 1
    old_rows[0][0] = -1.0
    return pa.table({
        "old_log_probs": pa.array(old_rows, type=pa.list_(pa.float32())),
        "rollout_log_probs": pa.array(rollout_rows, type=pa.list_(pa.float32())),
        "response_mask": pa.array(mask_rows, type=pa.list_(pa.int8())),
        "step": pa.array(rng.integers(0, 3, size=rows), type=pa.int64()),
    })


def write_layout(table: pa.Table, folder: Path, files: int, row_group: int) -> list[str]:
    """The table's rows, in order, split into `files` contiguous parquet files."""
    folder.mkdir(parents=True, exist_ok=True)
    bounds = np.linspace(0, table.num_rows, files + 1).astype(int)
    paths = []
    for i in range(files):
        path = folder / f"part-{i:02d}.parquet"
        pq.write_table(table.slice(bounds[i], bounds[i + 1] - bounds[i]), path, row_group_size=row_group)
        paths.append(str(path))
    return paths


def comparable(report: Any) -> dict[str, Any]:
    """Everything in a report that must not depend on the file layout."""
    return {
        "metrics": report.metrics,
        "steps": [{k: v for k, v in step.items() if k != "notes"} for step in report.steps],
        "rounds": report.rounds,
        "rounds_from_end": report.rounds_from_end,
        "quantiles": report.quantiles,
        "histograms": report.histograms,
        "what_if": report.what_if,
    }


def assert_close(ours: Any, reference: Any, where: str = "") -> None:
    """Equal structure; numbers within 1e-9 relative (plus 1e-12 absolute near zero)."""
    if isinstance(reference, dict):
        assert set(ours) == set(reference), where
        for key in reference:
            assert_close(ours[key], reference[key], f"{where}/{key}")
    elif isinstance(reference, list):
        assert len(ours) == len(reference), where
        for i, (a, b) in enumerate(zip(ours, reference, strict=True)):
            assert_close(a, b, f"{where}[{i}]")
    elif isinstance(reference, float) and not isinstance(ours, str) and ours is not None:
        if math.isnan(reference) or math.isinf(reference):
            assert ours == reference or (math.isnan(ours) and math.isnan(reference)), where
        else:
            assert abs(ours - reference) <= REL * abs(reference) + ABS, (where, ours, reference)
    else:
        assert ours == reference, (where, ours, reference)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@settings(max_examples=3, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**31), rows=st.integers(8, 40), width=st.integers(1, 90),
       config=st.sampled_from(range(len(CONFIGS))))
def test_file_and_row_group_layout_does_not_change_the_report(tmp_path_factory, dtype: str, seed: int, rows: int,
                                                              width: int, config: int) -> None:
    table = make_table(seed, rows, width)
    root = tmp_path_factory.mktemp("layouts")
    reports = []
    for files, row_group in LAYOUTS:
        paths = write_layout(table, root / f"{files}x{row_group}", files, row_group)
        report = analyze(paths, CONFIGS[config], device="cpu", dtype=dtype, by_step=True, hash_inputs=False,
                         bootstrap=0, read_workers=1)
        reports.append(comparable(report))
    for (files, row_group), report in zip(LAYOUTS[1:], reports[1:], strict=True):
        assert_close(report, reports[0], f"{files} files x {row_group} rows per group")


def test_float32_sums_are_taken_in_float64() -> None:
    import torch

    from mismatch_cli.engine.core.state import Reducer

    reducer = Reducer(torch.device("cpu"))
    # 2^24 + 1 is no float32: a float32 sum of these three values gives 2^24, a float64 one 2^24 + 2.
    reducer.add("sum", torch.tensor([2.0**24, 1.0, 1.0], dtype=torch.float32))
    assert reducer.get("sum") == 2**24 + 2
    with pytest.raises(AssertionError):
        reducer.add("sum", torch.ones(3, dtype=torch.float32).sum())  # a sum already taken in float32
