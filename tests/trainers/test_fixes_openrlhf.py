"""OpenRLHF's correction mapping is exact: the flags it gives for a ladder row (token TIS: clip; token IcePop: mask)
make our replay of OpenRLHF filter the same tokens as that row, checked against float64 numpy from the dump's columns.

OpenRLHF's `train/is_filter_ratio` (its "masked" concept) is computed per micro-batch of `micro_train_batch_size`
rows (dump order; a short last micro-batch is dropped, as its DataLoader's drop_last does), rounded to float32 and
averaged weighted by each micro-batch's tokens; numpy does the same reduction. With micro-batches of one row no row
is dropped, and the share is the ladder row's own token share.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from mismatch_cli import CorrectionConfig, analyze
from mismatch_cli.correction import REPLAY_FAMILIES
from mismatch_cli.engine.accumulators.whatif import LADDER
from mismatch_cli.trainers.openrlhf.fixes import FIXES

DUMP = Path(__file__).resolve().parents[2] / "sample_data" / "real" / "fp8.parquet"
ROWS = {s.name: {"name": s.name, "family": s.family, "level": s.level, "threshold": s.threshold, "option": s.option}
        for s in LADDER}
MASKED = REPLAY_FAMILIES["openrlhf"].concepts["masked"]


def _log_ratios(path: Path) -> list[np.ndarray]:
    """Each row's d = old − rollout over its valid tokens, in float64 from the stored columns."""
    table = pq.read_table(path, columns=["old_log_probs", "rollout_log_probs", "response_mask"]).to_pydict()
    return [np.asarray(o, np.float64)[np.asarray(m) == 1] - np.asarray(r, np.float64)[np.asarray(m) == 1]
            for o, r, m in zip(table["old_log_probs"], table["rollout_log_probs"], table["response_mask"],
                               strict=True)]


def _filtered(d: np.ndarray, row: dict) -> np.ndarray:
    """The ladder row's rule in numpy: TIS cuts a ratio above U, IcePop zeroes one outside [L, U]."""
    ratio = np.exp(np.clip(d, -20.0, 20.0))
    if row["family"] == "tis":
        return ratio > float(row["threshold"])
    lower, upper = (float(x) for x in row["threshold"].split("_"))
    return (ratio < lower) | (ratio > upper)


def _filter_ratio(rows: list[np.ndarray], size: int, row: dict) -> float:
    """OpenRLHF's reduction in numpy: whole micro-batches only, each one's token share, weighted by its tokens."""
    whole = len(rows) - len(rows) % size
    values, tokens = [], []
    for start in range(0, whole, size):
        flags = _filtered(np.concatenate(rows[start:start + size]), row)
        values.append(flags.mean())
        tokens.append(flags.size)
    return float(np.dot(values, tokens) / np.sum(tokens))


@pytest.mark.parametrize("name", ["TIS token 1.5", "TIS token 2.0", "IcePop token 0.5_2.0", "IcePop token 0.5_5.0"])
@pytest.mark.parametrize("size", [1, 3])  # one row each; 26 micro-batches of 3 and the last 2 rows dropped
def test_token_rows_filter_the_ladders_tokens(name: str, size: int) -> None:
    rows, row = _log_ratios(DUMP), ROWS[name]
    assert len(rows) % 3 == 2
    fields = FIXES.correction(row)
    assert fields is not None
    report = analyze([str(DUMP)], CorrectionConfig(semantics="openrlhf",
                                                   family_fields={**fields, "micro_train_batch_size": size}),
                     bootstrap=0, dtype="float64")
    expected = _filter_ratio(rows, size, row)
    assert 0 < expected < 1, "the dump must exercise the rule"
    assert report.metrics[MASKED] == pytest.approx(expected, rel=1e-6)  # float32 per micro-batch
    if size == 1:  # every row kept: OpenRLHF's share is the ladder row's own
        ladder = {r["name"]: r for r in report.what_if}[name]
        share = ladder["truncated_token_fraction"] if row["family"] == "tis" else ladder["masked_token_fraction"]
        assert share == pytest.approx(_filtered(np.concatenate(rows), row).mean(), rel=1e-12)
        assert report.metrics[MASKED] == pytest.approx(share, rel=1e-6)


def test_rows_openrlhf_cannot_run_exactly_map_to_nothing() -> None:
    # No sequence weight (clip is token-only, seq mask gates the geometric mean and keeps raw token weights), no k3
    # gate, no veto.
    expressed = {name for name, row in ROWS.items() if FIXES.correction(row) is not None}
    assert expressed == {f"TIS token {u}" for u in ("1.5", "2.0", "5.0", "10.0")} | {
        "IcePop token 0.5_2.0", "IcePop token 0.5_5.0"}


def test_native_writes_train_ppo_ray_flags() -> None:
    fields = {**FIXES.correction(ROWS["IcePop token 0.5_2.0"]), "micro_train_batch_size": 4}
    assert FIXES.native(fields) == (
        "--algo.advantage.is_correction_level token --algo.advantage.is_correction_mode mask "
        "--algo.advantage.is_correction_gating ratio --algo.advantage.is_correction_threshold 0.5 2.0 "
        "--train.micro_batch_size 4")
    tis = FIXES.native(FIXES.correction(ROWS["TIS token 2.0"]))
    assert tis.endswith("--algo.advantage.is_correction_threshold 2.0")
