"""TRL's correction mapping is exact: the GRPOConfig fields it gives for a what-if ladder row make our replay of TRL
weigh the same tokens and rows as that row, checked against float64 numpy from the dump's own columns.

TRL logs no share truncated / masked; its `sampling/importance_sampling_ratio/{mean,min,max}` are the mean, min and
max of the very weights the mapping claims to match (over valid tokens in token modes, over rows in sequence
modes), so they are compared with numpy, and the ladder row's own numbers (the share it truncates or zeroes, its
token-weighted mean weight) are compared with the same numpy weights.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

import mismatch_cli
from mismatch_cli import CorrectionConfig, analyze
from mismatch_cli.engine.accumulators.whatif import LADDER
from mismatch_cli.trainers.trl.fixes import FIXES

DUMP = Path(__file__).resolve().parents[2] / "sample_data" / "real" / "fp8.parquet"
RATIO = "sampling/importance_sampling_ratio/"
ROWS = {s.name: {"name": s.name, "family": s.family, "level": s.level, "threshold": s.threshold, "option": s.option}
        for s in LADDER}


def _log_ratios(path: Path) -> list[np.ndarray]:
    """Each row's d = old − rollout over its valid tokens, in float64 from the stored columns."""
    table = pq.read_table(path, columns=["old_log_probs", "rollout_log_probs", "response_mask"]).to_pydict()
    return [np.asarray(o, np.float64)[np.asarray(m) == 1] - np.asarray(r, np.float64)[np.asarray(m) == 1]
            for o, r, m in zip(table["old_log_probs"], table["rollout_log_probs"], table["response_mask"],
                               strict=True)]


def _run(path: Path, name: str) -> tuple[dict, dict]:
    fields = FIXES.correction(ROWS[name])
    assert fields is not None, name
    report = analyze([str(path)], CorrectionConfig(semantics="trl", family_fields=fields), bootstrap=0,
                     dtype="float64")
    ladder = {row["name"]: row for row in report.what_if}[name]
    return report.metrics, ladder


def _weights(rows: list[np.ndarray], name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """TRL's weights in numpy for a ladder row's rule: (the weights TRL's keys read, per-token weights, cut flags)."""
    row = ROWS[name]
    lower, upper = (float(x) for x in row["threshold"].split("_")) if "_" in row["threshold"] else (
        None, float(row["threshold"]))
    lengths = np.array([len(d) for d in rows])
    if row["level"] == "token":
        ratio = np.exp(np.concatenate(rows))
    else:
        ratio = np.exp(np.array([d.sum() for d in rows]))
    if row["family"] == "tis":
        weights, cut = np.minimum(ratio, upper), ratio > upper
    else:
        cut = (ratio < lower) | (ratio > upper)
        weights = np.where(cut, 0.0, ratio)
    if row["level"] == "token":
        return weights, weights, cut
    return weights, np.repeat(weights, lengths), np.repeat(cut, lengths)


@pytest.mark.parametrize("name", ["TIS token 1.5", "TIS token 2.0", "TIS sequence 2.0", "TIS sequence 10.0",
                                  "IcePop token 0.5_2.0", "IcePop token 0.5_5.0", "IcePop sequence 0.5_2.0",
                                  "IcePop sequence 0.5_5.0"])
def test_mapped_rows_weigh_as_the_ladder_does(name: str) -> None:
    rows = _log_ratios(DUMP)
    metrics, ladder = _run(DUMP, name)
    keyed, per_token, cut = _weights(rows, name)
    assert cut.any() and not cut.all(), "the dump must exercise the rule"
    # TRL's own keys against numpy.
    assert metrics[RATIO + "mean"] == pytest.approx(keyed.mean(), rel=1e-12)
    assert metrics[RATIO + "min"] == pytest.approx(keyed.min(), rel=1e-12)
    assert metrics[RATIO + "max"] == pytest.approx(keyed.max(), rel=1e-12)
    # The ladder row against the same numpy weights: the same tokens cut, the same weights.
    share = ladder["truncated_token_fraction"] if ladder["family"] == "tis" else ladder["masked_token_fraction"]
    assert share == pytest.approx(cut.mean(), rel=1e-12)
    assert ladder["is_weight_mean"] == pytest.approx(per_token.mean(), rel=1e-9)


def test_beyond_the_ladders_clamp_the_weights_differ_by_less_than_exp_minus_20(tmp_path: Path) -> None:
    # The ladder clamps d (token) and S (row) to [-20, 20] before exp, TRL does not: below -20 the weights part by
    # less than exp(-20) per token; above +20 both are the cap.
    old = np.array([[-1.0, -2.0, -31.0, -0.5], [-0.2, -30.0, -0.1, -0.3], [-0.1, -0.2, -0.3, -0.4]])
    rollout = np.array([[-1.1, -1.8, -1.0, -25.5], [-0.3, -0.5, -0.15, -0.2], [-0.12, -0.18, -0.33, -0.41]])
    mask = np.ones_like(old, dtype=np.int8)
    path = Path(mismatch_cli.write_dump(str(tmp_path / "clamp.parquet"), old_log_probs=old, rollout_log_probs=rollout,
                                        response_mask=mask, dtype="float64"))
    rows = _log_ratios(path)
    for name in ("TIS token 2.0", "TIS sequence 2.0"):
        metrics, ladder = _run(path, name)
        keyed, per_token, cut = _weights(rows, name)
        assert metrics[RATIO + "mean"] == pytest.approx(keyed.mean(), rel=1e-12)
        assert ladder["truncated_token_fraction"] == pytest.approx(cut.mean(), rel=1e-12)
        assert abs(ladder["is_weight_mean"] - per_token.mean()) < math.exp(-20)
        assert ladder["is_weight_mean"] != per_token.mean()  # the clamp did act


def test_rows_trl_cannot_run_exactly_map_to_nothing() -> None:
    for name, row in ROWS.items():
        if row["family"] in ("none", "rs", "veto"):
            assert FIXES.correction(row) is None, name


def test_native_writes_grpo_config_flags() -> None:
    assert FIXES.native(FIXES.correction(ROWS["IcePop token 0.5_2.0"])) == (
        "--vllm_importance_sampling_correction true --vllm_importance_sampling_mode token_mask "
        "--vllm_importance_sampling_clip_min 0.5 --vllm_importance_sampling_clip_max 2.0")
