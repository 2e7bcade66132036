"""SkyRL's vocabulary of fixes: every ladder row its correction maps runs the row's rule in our SkyRL replay.

On a synthetic batch, each mapped row's fields go through `analyze(--semantics skyrl)`; SkyRL's own key for the share
it truncates, masks or drops is held to the same share computed here in float64 numpy from the dump's columns,
reduced per micro-batch as SkyRL reduces it, and the ladder's own number for that row to the batch-wide share.
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

FIXES = fixes_for("skyrl")
P = "policy/loss_metrics/"
MICRO = 7  # rows per micro-batch: 60 rows make 8 whole micro-batches and one of 4
MAPPED = [row for row in ROWS if FIXES.correction(row) is not None]


def batch() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The ladder batch (tests/ladder_dumps.py) with rows in both vetoes' gap, and three whose geometric means sit
    between 1.001 and 1/0.999 (two rows) and between 1/1.001 and 0.999 (one): under 0.999_1.001 verl's k1 direction
    keeps the first two and drops the third, the intended direction the reverse."""
    old, rollout, mask = ladder_batch(seed=7, veto_band=True)
    old[[1, 10]], old[4] = rollout[[1, 10]] + np.log(1.0010005), rollout[4] + np.log(0.9990005)
    return old, rollout, mask


@pytest.fixture(scope="module")
def dump(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, np.ndarray, np.ndarray]:
    old, rollout, mask = batch()
    path = mismatch_cli.write_dump(tmp_path_factory.mktemp("skyrl") / "batch.parquet", old_log_probs=old,
                                   rollout_log_probs=rollout, response_mask=mask, dtype="float64")
    return path, old - rollout, mask.astype(bool)


def micro_mean(numerator: np.ndarray, denominator: np.ndarray) -> float:
    """SkyRL's reduction: each micro-batch's count / max(its total, 1), then the mean over micro-batches."""
    shares = [numerator[i:i + MICRO].sum() / max(denominator[i:i + MICRO].sum(), 1)
              for i in range(0, len(numerator), MICRO)]
    return float(np.mean(shares))


def expected(row: dict, delta: np.ndarray, mask: np.ndarray) -> tuple[str, np.ndarray, np.ndarray, str]:
    """SkyRL's key for the row, the per-row counts it is built from (flagged, total), and the ladder's column."""
    lower, upper = threshold_bounds(str(row["threshold"]))
    ratio = np.exp(np.clip(delta, -20.0, 20.0))  # per token, float64
    total = (delta * mask).sum(axis=1)
    tokens = mask.sum(axis=1)
    rows = np.ones(len(delta))
    if row["family"] == "tis" and row["level"] == "token":
        return "tis_token_clip_high_ratio", ((ratio > upper) & mask).sum(axis=1), tokens, "truncated_token_fraction"
    if row["family"] == "tis":
        return "tis_seq_clip_high_ratio", (np.exp(np.clip(total, -20, 20)) > upper) * 1.0, rows, "truncated_tokens"
    if row["family"] == "icepop" and row["level"] == "token":
        outside = ((ratio < lower) | (ratio > upper)) & mask
        return "token_mask_ratio", outside.sum(axis=1), tokens, "masked_token_fraction"
    if row["family"] == "icepop":
        value = np.exp(np.clip(total, -20, 20))
        outside = ((value < lower) | (value > upper)) * 1.0
        return "product_sequence_mask_masked_ratio", outside, rows, "masked_seq_fraction"
    if row["family"] == "rs":
        # verl's k1 direction: the band L_U keeps a row when its ratio is in [1/U, 1/L].
        mean = row["option"] == "seq_mean_k1"
        value = np.exp(np.clip(total / tokens if mean else total, -20, 20))
        key = "geo_sequence_mask_masked_ratio" if mean else "product_sequence_mask_masked_ratio"
        return key, ((value < 1 / upper) | (value > 1 / lower)) * 1.0, rows, "masked_seq_fraction"
    vetoed = ((delta < np.log(upper)) & mask).any(axis=1) * 1.0
    return "outlier_seq_masked_ratio", vetoed, rows, "masked_seq_fraction"


@pytest.mark.parametrize("row", MAPPED, ids=[row["name"] for row in MAPPED])
def test_a_mapped_row_is_skyrls_rule_on_the_same_tokens(row: dict, dump: tuple) -> None:
    path, delta, mask = dump
    fields = FIXES.correction(row)
    config = CorrectionConfig(semantics="skyrl", family_fields={**fields, "micro_train_batch_size_per_gpu": MICRO})
    report = mismatch_cli.analyze([str(path)], config, device="cpu", dtype="float64", bootstrap=0, hash_inputs=False)
    key, flagged, total, column = expected(row, delta, mask)
    assert 0 < flagged.sum() < total.sum(), "the batch must exercise the rule both ways"
    assert report.metrics[P + key] == pytest.approx(micro_mean(flagged, total), rel=1e-6, abs=1e-9), key
    ladder = next(r for r in report.what_if if r["name"] == row["name"])
    if column == "truncated_tokens":  # a capped row's tokens, over every token
        assert ladder["truncated_token_fraction"] == pytest.approx((flagged * mask.sum(axis=1)).sum() / mask.sum())
    else:
        assert ladder[column] == pytest.approx(flagged.sum() / total.sum(), rel=1e-12), column
    if row["family"] == "icepop" and row["level"] == "token":  # the kept tokens' weights are their raw ratios
        assert report.metrics[P + "tis_token_clip_high_ratio"] == 0.0


def test_the_rows_skyrl_cannot_run_map_to_none() -> None:
    unmapped = {row["name"] for row in ROWS if FIXES.correction(row) is None}
    assert unmapped == {"no correction", "k3-RS 0.001", "k3-RS 0.01", "k3-RS 0.1"}


def test_native_writes_skyrls_own_overrides() -> None:
    by_name = {row["name"]: row for row in ROWS}
    c = "trainer.algorithm.off_policy_correction."
    assert FIXES.native(FIXES.correction(by_name["TIS token 2.0"])) == \
        f"{c}tis_ratio_type=token {c}token_tis_ratio_clip_high=2.0"
    geo = FIXES.native(FIXES.correction(by_name["geo-RS 0.999_1.001"]))
    assert geo == f"{c}sequence_mask_metric=geometric {c}geo_mask_low={1 / 1.001!r} {c}geo_mask_high={1 / 0.999!r}"
    assert FIXES.native({"micro_train_batch_size_per_gpu": 4}) == "trainer.micro_train_batch_size_per_gpu=4"
