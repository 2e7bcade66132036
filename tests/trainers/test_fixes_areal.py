"""AReaL's vocabulary of fixes: every ladder row its correction maps runs the row's rule in our AReaL replay.

On a synthetic batch, each mapped row's fields (token TIS as action=clamp, token IcePop as action=mask) go through
`analyze(--semantics areal)`; AReaL's own keys, the share it clamps or filters (`rs_filtered_fraction`) and the mean
weight of the tokens it keeps, are held to the same numbers computed here in float64 numpy from the dump's columns,
and the ladder's own numbers for that row to the batch-wide share and mean weight.
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

FIXES = fixes_for("areal")
P = "ppo_actor/update/"
MAPPED = [row for row in ROWS if FIXES.correction(row) is not None]


def batch() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The ladder batch (tests/ladder_dumps.py): rows close or far apart, a few outliers."""
    return ladder_batch(seed=11)


@pytest.fixture(scope="module")
def dump(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, np.ndarray]:
    old, rollout, mask = batch()
    path = mismatch_cli.write_dump(tmp_path_factory.mktemp("areal") / "batch.parquet", old_log_probs=old,
                                   rollout_log_probs=rollout, response_mask=mask, dtype="float64")
    return path, (old - rollout)[mask.astype(bool)]


@pytest.mark.parametrize("row", MAPPED, ids=[row["name"] for row in MAPPED])
def test_a_mapped_row_is_areals_rule_on_the_same_tokens(row: dict, dump: tuple) -> None:
    path, delta = dump
    fields = FIXES.correction(row)
    report = mismatch_cli.analyze([str(path)], CorrectionConfig(semantics="areal", family_fields=fields),
                                  device="cpu", dtype="float64", bootstrap=0, hash_inputs=False)
    lower, upper = threshold_bounds(str(row["threshold"]))
    ratio = np.exp(delta)  # every valid token, float64
    if row["family"] == "tis":  # clamp: every token kept, its weight min(ratio, U)
        touched, weights, kept = ratio > upper, np.minimum(ratio, upper), np.ones_like(ratio, dtype=bool)
        column = "truncated_token_fraction"
    else:  # mask: a token outside [L, U] gets weight 0 under the same denominator
        touched = (ratio < lower) | (ratio > upper)
        kept, weights = ~touched, np.where(touched, 0.0, ratio)
        column = "masked_token_fraction"
    assert 0 < touched.sum() < touched.size, "the batch must exercise the rule both ways"
    metrics = report.metrics
    assert metrics[P + "rs_filtered_fraction"] == pytest.approx(touched.mean(), rel=1e-6)  # float32 upstream
    assert metrics[P + "unclipped_behave_tokens"] == kept.sum()
    assert metrics[P + "behave_imp_weight/avg"] == pytest.approx(weights[kept].mean(), rel=1e-6)
    ladder = next(r for r in report.what_if if r["name"] == row["name"])
    assert ladder[column] == pytest.approx(touched.mean(), rel=1e-12)
    # The ladder's mean weight counts the zeroed tokens, as AReaL's loss (divided by every token) does.
    assert ladder["is_weight_mean"] == pytest.approx(weights.sum() / weights.size, rel=1e-9)


def test_the_rows_areal_cannot_run_map_to_none() -> None:
    mapped = {row["name"] for row in MAPPED}
    assert mapped == {f"TIS token {u}" for u in ("1.5", "2.0", "5.0", "10.0")} | \
        {"IcePop token 0.5_2.0", "IcePop token 0.5_5.0"}


def test_native_writes_areals_own_overrides() -> None:
    by_name = {row["name"]: row for row in ROWS}
    rs = "++actor.rejection_sampling."
    assert FIXES.native(FIXES.correction(by_name["TIS token 2.0"])) == \
        f"actor.use_decoupled_loss=true {rs}level=token {rs}metric=ratio {rs}action=clamp {rs}upper=2.0"
    assert FIXES.native(FIXES.correction(by_name["IcePop token 0.5_5.0"])) == \
        f"actor.use_decoupled_loss=true {rs}level=token {rs}metric=ratio {rs}action=mask {rs}lower=0.5 {rs}upper=5.0"
    assert FIXES.native({"rejection_sampling": False}) == "++actor.rejection_sampling=null"
