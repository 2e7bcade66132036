"""NeMo-RL's vocabulary of fixes: every ladder row its correction maps runs the row's rule in our NeMo-RL replay.

On a synthetic batch, each mapped row's fields (token `tis`, token `icepop`) go through `analyze(--semantics
nemo-rl)`; NeMo-RL's own keys, the out-of-bounds share (`is_oob_ratio`) and the mean applied weight
(`sampling_importance_ratio`), are held to the same numbers computed here in float64 numpy from the dump's columns,
and the ladder's own share and mean weight for that row to them too.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from ladder_dumps import ROWS
from ladder_dumps import batch as ladder_batch

import mismatch_cli
from mismatch_cli.correction import CorrectionConfig
from mismatch_cli.correction.fixes import fixes_for, threshold_bounds

FIXES = fixes_for("nemo-rl")
MAPPED = [row for row in ROWS if FIXES.correction(row) is not None]


def batch() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The ladder batch (tests/ladder_dumps.py): rows close or far apart, a few outliers."""
    return ladder_batch(seed=13)


@pytest.fixture(scope="module")
def dump(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, np.ndarray]:
    old, rollout, mask = batch()
    path = mismatch_cli.write_dump(tmp_path_factory.mktemp("nemo_rl") / "batch.parquet", old_log_probs=old,
                                   rollout_log_probs=rollout, response_mask=mask, dtype="float64")
    return path, (old - rollout)[mask.astype(bool)]


@pytest.mark.parametrize("row", MAPPED, ids=[row["name"] for row in MAPPED])
def test_a_mapped_row_is_nemo_rls_rule_on_the_same_tokens(row: dict, dump: tuple) -> None:
    path, delta = dump
    fields = FIXES.correction(row)
    report = mismatch_cli.analyze([str(path)], CorrectionConfig(semantics="nemo-rl", family_fields=fields),
                                  device="cpu", dtype="float64", bootstrap=0, hash_inputs=False)
    lower, upper = threshold_bounds(str(row["threshold"]))
    ratio = np.exp(delta)  # every valid token, float64
    if row["family"] == "tis":
        touched, weights, column = ratio > upper, np.minimum(ratio, upper), "truncated_token_fraction"
    else:
        touched = (ratio < lower) | (ratio > upper)
        weights, column = np.where(touched, 0.0, ratio), "masked_token_fraction"
    assert 0 < touched.sum() < touched.size, "the batch must exercise the rule both ways"
    assert report.metrics["is_oob_ratio"] == pytest.approx(touched.mean(), rel=1e-6)  # float32 upstream
    assert report.metrics["sampling_importance_ratio"] == pytest.approx(weights.mean(), rel=1e-12)
    ladder = next(r for r in report.what_if if r["name"] == row["name"])
    assert ladder[column] == pytest.approx(touched.mean(), rel=1e-12)
    assert ladder["is_weight_mean"] == pytest.approx(weights.mean(), rel=1e-9)


def test_the_rows_nemo_rl_cannot_run_map_to_none() -> None:
    mapped = {row["name"] for row in MAPPED}
    assert mapped == {f"TIS token {u}" for u in ("1.5", "2.0", "5.0", "10.0")} | \
        {"IcePop token 0.5_2.0", "IcePop token 0.5_5.0"}


def test_native_writes_nemo_rls_own_overrides() -> None:
    by_name = {row["name"]: row for row in ROWS}
    assert FIXES.native(FIXES.correction(by_name["IcePop token 0.5_2.0"])) == (
        "loss_fn.use_importance_sampling_correction=true loss_fn.truncated_importance_sampling_ratio=2.0 "
        "loss_fn.truncated_importance_sampling_type=icepop loss_fn.truncated_importance_sampling_ratio_min=0.5")
