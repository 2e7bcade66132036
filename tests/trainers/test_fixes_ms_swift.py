"""ms-swift's correction mapping is exact: the flags it gives for a ladder row (token TIS) make our replay of
ms-swift truncate the same tokens with the same weights, checked against float64 numpy from the dump's columns.

ms-swift's `rollout_correction/clipped_frac` (its "truncated" concept) and `is_weight_mean` are per micro-batch of
`per_device_train_batch_size` rows (dump order, the last one short), then averaged over micro-batches; numpy does
the same reduction. With one micro-batch holding the whole dump they are the ladder row's own token shares.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from mismatch_cli import CorrectionConfig, analyze
from mismatch_cli.correction import REPLAY_FAMILIES
from mismatch_cli.engine.accumulators.whatif import LADDER
from mismatch_cli.trainers.ms_swift.fixes import FIXES

DUMP = Path(__file__).resolve().parents[2] / "sample_data" / "real" / "fp8.parquet"
ROWS = {s.name: {"name": s.name, "family": s.family, "level": s.level, "threshold": s.threshold, "option": s.option}
        for s in LADDER}
TRUNCATED = REPLAY_FAMILIES["ms-swift"].concepts["truncated"]
WEIGHT_MEAN = REPLAY_FAMILIES["ms-swift"].concepts["weight_mean"]


def _log_ratios(path: Path) -> list[np.ndarray]:
    """Each row's d = old − rollout over its valid tokens, in float64 from the stored columns."""
    table = pq.read_table(path, columns=["old_log_probs", "rollout_log_probs", "response_mask"]).to_pydict()
    return [np.asarray(o, np.float64)[np.asarray(m) == 1] - np.asarray(r, np.float64)[np.asarray(m) == 1]
            for o, r, m in zip(table["old_log_probs"], table["rollout_log_probs"], table["response_mask"],
                               strict=True)]


def _micro_batch_means(rows: list[np.ndarray], size: int, cap: float) -> tuple[float, float]:
    """ms-swift's token_truncate in numpy: per micro-batch the share of ratios above the cap and the mean weight,
    then the plain mean of each over micro-batches."""
    shares, means = [], []
    for start in range(0, len(rows), size):
        ratio = np.exp(np.clip(np.concatenate(rows[start:start + size]), -20.0, 20.0))
        shares.append((ratio > cap).mean())
        means.append(np.minimum(ratio, cap).mean())
    return float(np.mean(shares)), float(np.mean(means))


@pytest.mark.parametrize("name", ["TIS token 1.5", "TIS token 2.0"])
@pytest.mark.parametrize("size", [80, 7])  # the whole dump in one micro-batch; 11 of 7 rows and one of 3
def test_token_tis_truncates_the_ladders_tokens(name: str, size: int) -> None:
    rows = _log_ratios(DUMP)
    assert len(rows) == 80
    fields = FIXES.correction(ROWS[name])
    assert fields == {"rollout_importance_sampling_mode": "token_truncate",
                      "rollout_importance_sampling_threshold": float(ROWS[name]["threshold"])}
    report = analyze([str(DUMP)], CorrectionConfig(semantics="ms-swift",
                                                   family_fields={**fields, "per_device_train_batch_size": size}),
                     bootstrap=0, dtype="float64")
    share, mean = _micro_batch_means(rows, size, fields["rollout_importance_sampling_threshold"])
    assert 0 < share < 1, "the dump must exercise the rule"
    assert report.metrics[TRUNCATED] == pytest.approx(share, rel=1e-6)  # ms-swift's `.float()` of the flags
    assert report.metrics[WEIGHT_MEAN] == pytest.approx(mean, rel=1e-12)
    if size >= len(rows):  # one micro-batch: ms-swift's shares are the ladder row's own
        ladder = {row["name"]: row for row in report.what_if}[name]
        assert ladder["truncated_token_fraction"] == pytest.approx(share, rel=1e-12)
        assert ladder["is_weight_mean"] == pytest.approx(mean, rel=1e-9)


def test_rows_ms_swift_cannot_run_exactly_map_to_nothing() -> None:
    # token_mask has no lower bound; the sequence modes judge the geometric mean; no RS or veto.
    expressed = {name for name, row in ROWS.items() if FIXES.correction(row) is not None}
    assert expressed == {f"TIS token {u}" for u in ("1.5", "2.0", "5.0", "10.0")}


def test_native_writes_swift_flags() -> None:
    assert FIXES.native({**FIXES.correction(ROWS["TIS token 2.0"]), "per_device_train_batch_size": 4}) == (
        "--rollout_importance_sampling_mode token_truncate --rollout_importance_sampling_threshold 2.0 "
        "--per_device_train_batch_size 4")
    assert FIXES.context_fields == ("per_device_train_batch_size",)
