"""prime-rl's vocabulary: no ladder row maps (it caps no importance weight), and says why; the trust-region masks it
names as its own correction are what semantics prime-rl computes: `is_masked/mean` with those settings equals the
share float64 numpy finds from the dump's columns (per sample the share of its tokens masked, then the mean)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mismatch_cli import CorrectionConfig, analyze
from mismatch_cli.correction.fixes import fixes_for
from mismatch_cli.engine.accumulators.whatif import LADDER

FIXES = fixes_for("prime-rl")


@pytest.fixture(scope="module")
def dump(tmp_path_factory) -> Path:
    """48 samples of 4-40 tokens (then padding), probabilities across (0, 1), one advantage per sample."""
    rng = np.random.default_rng(11)
    columns: dict[str, list] = {"old_log_probs": [], "rollout_log_probs": [], "response_mask": [], "advantages": []}
    for i in range(48):
        n = int(rng.integers(4, 41))
        old = np.log(rng.uniform(0.02, 1.0, n))
        rollout = np.minimum(old - rng.normal(0.0, 0.5, n), 0.0)
        columns["old_log_probs"].append([*old.astype(np.float32), 0.0])
        columns["rollout_log_probs"].append([*rollout.astype(np.float32), 0.0])
        columns["response_mask"].append([1] * n + [0])
        columns["advantages"].append(float((-1.0, 0.0, 0.5)[i % 3]))
    path = tmp_path_factory.mktemp("prime_rl") / "dump.parquet"
    pq.write_table(pa.table(columns), path)
    return path


def _samples(dump: Path) -> list[tuple[np.ndarray, float]]:
    """Each sample's Δp = exp(old) - exp(rollout) over its mask tokens (float64), and its advantage."""
    table = pq.read_table(dump).to_pydict()
    out = []
    for old, rollout, mask, advantage in zip(table["old_log_probs"], table["rollout_log_probs"],
                                             table["response_mask"], table["advantages"], strict=True):
        keep = np.asarray(mask, dtype=bool)
        out.append((np.exp(np.asarray(old, np.float64)[keep]) - np.exp(np.asarray(rollout, np.float64)[keep]),
                    advantage))
    return out


def test_no_ladder_row_maps_and_the_vocabulary_says_why() -> None:
    assert FIXES.correction is None and FIXES.native is None
    assert "dppo-mask" in FIXES.missing["correction"] and "unclamped" in FIXES.missing["correction"]
    assert "#3431" in FIXES.missing["truncation"] and "not in 559b4477" in FIXES.missing["truncation"]
    assert FIXES.trainer == "prime-rl 559b4477" and LADDER  # no mapping, so no ladder row is offered


@pytest.mark.parametrize(("setting", "fields"), [
    (0, {"type": "default", "dppo_mask_low": 0.2, "dppo_mask_high": 0.2}),
    (1, {"type": "ipo", "ipo_threshold": 0.1}),
])
def test_its_own_masks_drop_the_tokens_numpy_finds(setting: int, fields: dict, dump: Path) -> None:
    text = FIXES.settings["correction"][setting].text
    for name, value in fields.items():  # the setting written is the one run here
        assert f"--trainer.loss.{name.replace('_', '-')} {value}" in text or (name == "type" and value == "default")
    report = analyze([str(dump)], CorrectionConfig(semantics="prime-rl", family_fields=fields), bootstrap=0)
    shares = []
    for dp, advantage in _samples(dump):
        if fields["type"] == "ipo":
            masked = np.abs(dp) > fields["ipo_threshold"]
        else:  # where A > 0 the rise, everywhere else (A = 0 included) the fall
            masked = dp > fields["dppo_mask_high"] if advantage > 0 else dp < -fields["dppo_mask_low"]
        shares.append(masked.mean())
    expected = float(np.mean(shares))
    assert 0 < expected < 1
    assert report.metrics["is_masked/mean"] == pytest.approx(expected, abs=1e-6)
