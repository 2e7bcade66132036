"""concentrated_divergence names the tokens that carry the failing metric, against float64 numpy on the file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mismatch_cli.api import analyze

ROWS, WIDTH = 40, 500


def write_dump(path: Path, planted: dict[tuple[int, int], float]) -> tuple[np.ndarray, np.ndarray]:
    """Precision noise (sd 0.01) with tokens planted at d = old - rollout (rollout lowered for d > 0, old for d < 0).

    Returns old and rollout as read back (float32), so the reference sees what the tool reads.
    """
    rng = np.random.default_rng(7)
    rollout = -rng.exponential(1.0, size=(ROWS, WIDTH)).astype(np.float32)
    old = (rollout + rng.normal(0.0, 0.01, size=(ROWS, WIDTH))).astype(np.float32)
    for (row, position), d in planted.items():
        if d > 0:
            rollout[row, position] = old[row, position] - d
        else:
            old[row, position] = rollout[row, position] + d
    pq.write_table(pa.table({
        "old_log_probs": pa.array(old.tolist(), type=pa.list_(pa.float32())),
        "rollout_log_probs": pa.array(rollout.tolist(), type=pa.list_(pa.float32())),
        "response_mask": pa.array(np.ones((ROWS, WIDTH), dtype=np.int8).tolist(), type=pa.list_(pa.int8())),
    }), path)
    return old, rollout


def cause(path: Path) -> dict:
    report = analyze([str(path)], device="cpu", hash_inputs=False, bootstrap=0)
    return next(f for f in report.findings if f["code"] == "concentrated_divergence")


def test_chi2_names_the_largest_positive_delta_not_the_largest_abs(tmp_path: Path) -> None:
    path = tmp_path / "two.parquet"
    old, rollout = write_dump(path, {(5, 100): -15.0, (20, 30): 12.0})
    finding = cause(path)
    evidence = finding["evidence"]
    d = old.astype(np.float64) - rollout.astype(np.float64)
    excess = np.expm1(2 * np.clip(d, -20, 20))  # chi2_token's terms, ratio^2 - 1
    assert evidence["basis"] == "χ²_token"
    edge = evidence["log_ratio_at_least"]
    carrying = d >= edge
    assert evidence["tokens"] == int(carrying.sum()) == 1
    assert evidence["share"] == pytest.approx(excess[carrying].sum() / excess.sum(), rel=1e-6)
    token = evidence["token"]
    assert (token["row"], token["position"]) == (20, 30)
    assert token["log_ratio"] == pytest.approx(d[20, 30], rel=1e-6)
    assert evidence["token_share"] == pytest.approx(excess[20, 30] / excess.sum(), rel=1e-6)
    assert [r["row"] for r in evidence["rows"]] == [20]  # not row 5, whose d = -15 adds nothing to chi2
    assert evidence["worst_token"]["row"] == 5  # the largest |d| is still reported, as such
    assert "1 token (" in finding["title"] and "Δ ≥" in finding["title"]
    assert f"{path}:20:30" in finding["detail"] and f"{path}:5:100" not in finding["detail"]


def test_mult_error_names_the_largest_abs_delta(tmp_path: Path) -> None:
    # chi2 stays in band (its largest term is exp(6)); token_mult_prob_error fails through the d = -15 token.
    path = tmp_path / "mult.parquet"
    old, rollout = write_dump(path, {(5, 100): -15.0, (20, 30): 3.0})
    finding = cause(path)
    evidence = finding["evidence"]
    d = old.astype(np.float64) - rollout.astype(np.float64)
    excess = np.expm1(np.abs(d))  # token_mult_prob_error's terms, exp|d| - 1
    assert evidence["basis"] == "token_mult_prob_error − 1"
    assert evidence["failing_checks"] == ["diag/token_mult_prob_error"]
    edge = evidence["abs_log_ratio_at_least"]
    carrying = np.abs(d) >= edge
    assert evidence["tokens"] == int(carrying.sum()) == 1
    assert evidence["share"] == pytest.approx(excess[carrying].sum() / excess.sum(), rel=1e-6)
    token = evidence["token"]
    assert (token["row"], token["position"]) == (5, 100)
    assert evidence["token_share"] == pytest.approx(excess[5, 100] / excess.sum(), rel=1e-6)
    assert [r["row"] for r in evidence["rows"]] == [5]
    assert f"{path}:5:100" in finding["detail"] and "|Δ| 15" in finding["detail"]
