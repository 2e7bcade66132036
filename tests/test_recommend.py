"""The recommendation and the health after a correction, checked against float64 numpy over the dumps."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mismatch_cli.answers.recommend import invasiveness, recommend
from mismatch_cli.api import analyze
from mismatch_cli.correction import CorrectionConfig
from mismatch_cli.engine.accumulators.whatif import LADDER
from mismatch_cli.errors import InputError
from mismatch_cli.report import Report
from mismatch_cli.synth import SynthSpec, write_synthetic_dump

SAMPLE = Path(__file__).resolve().parents[1] / "sample_data" / "multi_turn.parquet"


def _run(path, correction: CorrectionConfig | None = None) -> Report:
    return analyze([str(path)], correction, bootstrap=0, hash_inputs=False, device="cpu")


def _delta(path) -> np.ndarray:
    """old − rollout over the valid tokens of a parquet dump, float64."""
    table = pq.read_table(path, columns=["old_log_probs", "rollout_log_probs", "response_mask"])
    flat = {name: np.asarray(table[name].combine_chunks().flatten(), dtype=np.float64) for name in table.column_names}
    valid = flat["response_mask"] != 0
    return flat["old_log_probs"][valid] - flat["rollout_log_probs"][valid]


def _tis_health(delta: np.ndarray, upper: float) -> dict[str, float]:
    """verl's IS mean, ESS and std of token-TIS weights min(exp(clamp(d, ±20)), U), and the k1 kl."""
    weight = np.minimum(np.exp(np.clip(delta, -20, 20)), upper)
    mean, mean_sq = weight.mean(), (weight**2).mean()
    return {"rollout_corr/rollout_is_mean": mean, "rollout_corr/rollout_is_eff_sample_size": mean**2 / mean_sq,
            "rollout_corr/rollout_is_std": np.sqrt(mean_sq - mean**2), "rollout_corr/kl": -delta.mean(),
            "truncated": int((np.exp(np.clip(delta, -20, 20)) > upper).sum())}


def _in_band(health: dict[str, float]) -> bool:
    return (0.5 <= health["rollout_corr/rollout_is_mean"] <= 2.0 and health["rollout_corr/rollout_is_eff_sample_size"]
            >= 0.3 and health["rollout_corr/rollout_is_std"] <= 1.0 and abs(health["rollout_corr/kl"]) <= 0.1)


@pytest.fixture(scope="module")
def sample() -> Report:
    return _run(SAMPLE)


def test_sample_recommends_token_tis_whose_after_health_is_in_band(sample) -> None:
    delta = _delta(SAMPLE)
    ratio = np.exp(np.clip(delta, -20, 20))
    assert ratio.mean() ** 2 / (ratio**2).mean() < 0.3  # raw ESS out of band: a handful of catastrophic tokens
    rec = sample.recommendation
    assert rec["health_before"]["status"] == "warning"
    # The rule, recomputed: token TIS is the least invasive kind; among the caps that work, the fewest truncated
    # tokens, then among caps that truncate the same tokens verl's preset cap (2.0), else the highest cap.
    caps = [float(s.threshold) for s in LADDER if (s.family, s.level) == ("tis", "token")]
    health = {u: _tis_health(delta, u) for u in caps}
    working = [u for u in caps if _in_band(health[u])]
    fewest = min(health[u]["truncated"] for u in working)
    tied = [u for u in working if health[u]["truncated"] == fewest]
    best = 2.0 if 2.0 in tied else max(tied)
    assert best == 2.0 and max(tied) > 2.0  # the sample's case: caps above 2.0 cost the same, the preset wins
    assert rec["scenario"] == f"TIS token {best}"
    assert rec["flags"] == f"--is token --is-threshold {best}"
    assert rec["fields"] == {"rollout_is": "token", "rollout_is_threshold": best}
    assert rec["health_after"]["status"] == "healthy"
    after = {c["metric"]: c["value"] for c in rec["health_after"]["checks"]}
    for key in ("rollout_corr/rollout_is_mean", "rollout_corr/rollout_is_eff_sample_size",
                "rollout_corr/rollout_is_std", "rollout_corr/kl"):
        assert after[key] == pytest.approx(health[best][key], rel=1e-4, abs=1e-7), key
    assert rec["cost"]["truncated_token_fraction"] == pytest.approx(health[best]["truncated"] / delta.size)
    assert rec["cost"]["masked_token_fraction"] == 0 and rec["cost"]["masked_sequence_fraction"] == 0
    assert f"{health[best]['truncated']} tokens" in rec["reason"]
    assert rec["preset"] == "decoupled_token_is"
    # The wider caps that cost the same are offered as alternatives.
    assert f"TIS token {max(tied)}" in {a["scenario"] for a in rec["alternatives"]}


def _only_the_catastrophic_tokens_stay_out(summary: dict) -> None:
    """No correction changes the log-probs: the sample's few catastrophic tokens keep NeMo-RL's metric out.

    Out through at most 1 % of the tokens, that check is the correction's business and does not decide the verdict.
    """
    delta = np.abs(_delta(SAMPLE).astype(np.float64))
    failing = [c for c in summary["checks"] if not c["ok"]]
    assert [c["metric"] for c in failing] == ["diag/token_mult_prob_error"]
    assert failing[0]["value"] == pytest.approx(np.exp(delta).mean(), rel=1e-5)
    excess = np.sort(np.exp(delta) - 1)[::-1]
    carried = int(np.searchsorted(np.cumsum(excess), 0.9 * excess.sum()) + 1)
    assert 0 < carried <= failing[0]["few_tokens"] <= 0.01 * delta.size
    assert summary["status"] == "healthy" and summary["diagnosis"]["kind"] == "healthy"


def test_running_the_recommendation_gives_its_predicted_health(sample) -> None:
    rec = sample.recommendation
    report = _run(SAMPLE, CorrectionConfig(**rec["fields"]))
    assert report.summary["after"]["status"] == "healthy"
    _only_the_catastrophic_tokens_stay_out(report.summary)
    assert report.summary["before"]["status"] == "warning"  # the raw ratios are unchanged
    got = {c["metric"]: c["value"] for c in report.summary["after"]["checks"]}
    for check in rec["health_after"]["checks"]:
        # The ladder predicts from float64 sums; the run computes its weights in float32 (rel. ~3e-6 on the std).
        assert got[check["metric"]] == pytest.approx(check["value"], rel=1e-5), check["metric"]
    assert report.recommendation["scenario"] is None
    assert "already" in report.recommendation["reason"]


def test_preset_run_is_judged_after_its_correction() -> None:
    """The bug of the issue: with IS on, health looked at the raw χ² and said `warning`."""
    report = _run(SAMPLE, CorrectionConfig(preset="decoupled_token_is"))
    summary = report.summary
    assert summary["after"]["status"] == "healthy"
    _only_the_catastrophic_tokens_stay_out(summary)
    assert summary["before"]["status"] == "warning"
    assert "rollout_corr/chi2_token" not in {c["metric"] for c in summary["checks"]}
    assert {c["metric"] for c in summary["before"]["checks"]} == {"diag/ess_token", "rollout_corr/kl",
                                                                  "rollout_corr/chi2_token"}
    health = _tis_health(_delta(SAMPLE), 2.0)
    checks = {c["metric"]: c for c in summary["after"]["checks"]}
    assert checks["rollout_corr/rollout_is_eff_sample_size"]["value"] == pytest.approx(
        health["rollout_corr/rollout_is_eff_sample_size"], rel=1e-5)
    assert checks["rollout_corr/rollout_is_eff_sample_size"]["basis"] == "the applied IS weights"


def test_rs_only_run_is_judged_on_the_tokens_it_keeps(sample) -> None:
    report = _run(SAMPLE, CorrectionConfig(preset="decoupled_k3_rs"))
    after = report.summary["after"]
    row = next(r for r in sample.what_if if r["name"] == "k3-RS 0.01")
    assert after["basis"] == "what-if: k3-RS 0.01"
    checks = {c["metric"]: c["value"] for c in after["checks"]}
    # What RS removes is judged too (the drop band): verl's RS keys, which must agree with the ladder's own count.
    assert checks == {"diag/ess_token": row["ess"], "rollout_corr/kl": row["kl"],
                      "rollout_corr/rollout_rs_masked_fraction": pytest.approx(row["masked_token_fraction"]),
                      "rollout_corr/rollout_rs_seq_masked_fraction": pytest.approx(row["masked_seq_fraction"])}
    assert after["status"] == "healthy"
    _only_the_catastrophic_tokens_stay_out(report.summary)


def test_clean_dump_needs_no_correction(tmp_path) -> None:
    path = tmp_path / "clean.parquet"
    write_synthetic_dump(path, SynthSpec(tokens=40_000, seed=11, catastrophic_rate=0.0))
    delta = _delta(path)
    ratio = np.exp(np.clip(delta, -20, 20))
    assert ratio.mean() ** 2 / (ratio**2).mean() >= 0.3 and (ratio**2).mean() - 1 <= 1 and abs(delta.mean()) <= 0.1
    rec = _run(path).recommendation
    assert rec["scenario"] is None and rec["flags"] is None and rec["best_partial"] is None
    assert "no correction is needed" in rec["reason"]
    assert rec["health_before"]["status"] == "healthy"


def _offset_dump(path, offset: float, seed: int = 0) -> np.ndarray:
    """80 % of the tokens have log-ratio −offset, the rest +a with 0.8 e^−offset + 0.2 e^a = 1 (plus N(0, 0.02)).

    E[ratio] = 1 as for any rollout side that reports the distribution it sampled from, so no bug signature
    explains the mismatch; KL = 0.8 offset − 0.2 a is out of band, and IS weights leave every token in it.
    """
    rng = np.random.default_rng(seed)
    rollout = (-rng.exponential(4.0, (64, 80)) - 1e-3).astype(np.float32)
    low = rng.random(rollout.shape) < 0.8
    high = np.log((1 - 0.8 * np.exp(-offset)) / 0.2)
    old = (rollout + np.where(low, -offset, high) + rng.normal(0, 0.02, rollout.shape)).astype(np.float32)
    pq.write_table(pa.table({
        "old_log_probs": pa.array(list(old), type=pa.list_(pa.float32())),
        "rollout_log_probs": pa.array(list(rollout), type=pa.list_(pa.float32())),
        "response_mask": pa.array(list(np.ones(old.shape, dtype=np.int8)), type=pa.list_(pa.int8())),
    }), path)
    return old.astype(np.float64) - rollout.astype(np.float64)


def test_nothing_in_the_ladder_suffices(tmp_path) -> None:
    path = tmp_path / "offset.parquet"
    delta = _offset_dump(path, 0.5).ravel()
    assert abs(delta.mean()) > 0.1  # |kl| out of band; IS weights do not change the tokens, so no IS row helps
    assert abs(np.exp(delta).mean() - 1) < 0.01
    for upper in (1.5, 2.0, 5.0, 10.0):
        assert not _in_band(_tis_health(delta, upper))
    rec = _run(path).recommendation
    assert rec["scenario"] is None and rec["flags"] is None
    assert rec["reason"].startswith("no setting of the what-if ladder")
    partial = rec["best_partial"]
    assert partial["scenario"] in rec["reason"] and partial["health_after"]["status"] == "warning"
    assert partial["flags"]


def test_older_families_get_their_own_flags(sample) -> None:
    config060 = {**{k: v for k, v in sample.config.items() if k not in ("semantics", "preset")},
                 "semantics": "verl-0.6.0"}
    rec = recommend(sample.metrics, config060, sample.what_if)
    assert rec["flags"].startswith("--is-level token --is-mode truncate --is-threshold ")
    assert rec["flags"].endswith(" --veto-threshold none")
    # The fields are that family's own and run as they are.
    report = _run(SAMPLE, CorrectionConfig(semantics="verl-0.6.0", family_fields=rec["fields"]))
    ess = report.metrics["mismatch/rollout_is_eff_sample_size"]
    assert ess >= 0.3
    rec = recommend(sample.metrics, {"semantics": "verl-0.7.0"}, sample.what_if)
    assert rec["fields"]["rollout_is"] == "token" and rec["flags"].startswith("--is token --is-threshold ")
    rec = recommend(sample.metrics, {"semantics": "xtuner"}, sample.what_if)
    # xtuner's vocabulary says why no ladder row is its rule, in its own terms (correction/fixes_xtuner.py)
    assert rec["scenario"] is None and "xtuner" in rec["reason"] and "no correction the what-if ladder can run " \
        "exactly" in rec["reason"]


def test_invasiveness_order() -> None:
    def row(family, level, threshold, truncated=None, masked=0.0, rows=0.0):
        return {"family": family, "level": level, "threshold": threshold, "truncated_token_fraction": truncated,
                "masked_token_fraction": masked, "masked_seq_fraction": rows}

    rows = [row("rs", "sequence", "0.001", masked=0.01, rows=0.01), row("tis", "sequence", "2.0", truncated=0.7),
            row("icepop", "token", "0.5_5.0", masked=0.3, rows=0.5), row("tis", "token", "2.0", truncated=0.001),
            row("tis", "token", "5.0", truncated=0.001), row("veto", "token", "1e-4", masked=0.001, rows=0.001),
            row("icepop", "sequence", "0.5_5.0", masked=0.2, rows=0.1)]
    ordered = [(r["family"], r["level"], r["threshold"]) for r in sorted(rows, key=invasiveness)]
    assert ordered == [("tis", "token", "5.0"), ("tis", "token", "2.0"), ("icepop", "token", "0.5_5.0"),
                       ("tis", "sequence", "2.0"), ("veto", "token", "1e-4"), ("rs", "sequence", "0.001"),
                       ("icepop", "sequence", "0.5_5.0")]


def test_recommendation_round_trips_and_is_validated(sample) -> None:
    body = json.loads(sample.to_json())
    assert Report.from_dict(body).recommendation == body["recommendation"]
    body["recommendation"]["reason"] = 3
    with pytest.raises(InputError, match=r"\$\.recommendation\.reason"):
        Report.from_dict(body)
    body["recommendation"] = None
    assert Report.from_dict(body).recommendation is None
