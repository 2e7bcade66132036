"""The first screen on dumps from a real model (sample_data/real, SmolLM2-135M-Instruct): each arm's answer.

Expected values come from float64 numpy over the parquet columns, never from the tool's own output; the
verdicts follow from the sourced bands applied to those values (docs/report.md, "The health summary").
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mismatch_cli.api import analyze
from mismatch_cli.correction import CorrectionConfig

ROOT = Path(__file__).resolve().parents[1]
REAL = ROOT / "sample_data" / "real"
BUGS = {"processed_logprobs", "temperature_mismatch", "constant_fill", "shifted_streams", "identical_sides"}
PRECISION_ARMS = ("fp32", "bf16", "fp16", "fp8", "fp32_b")


def columns(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Old and rollout log-probs (float64) of the mask-1 tokens, and each row's mask, from the parquet."""
    table = pq.read_table(path, columns=["old_log_probs", "rollout_log_probs", "response_mask"]).to_pydict()
    mask = [np.asarray(m, dtype=bool) for m in table["response_mask"]]
    old = np.concatenate([np.asarray(o, np.float64)[m] for o, m in zip(table["old_log_probs"], mask, strict=True)])
    rollout = np.concatenate([np.asarray(r, np.float64)[m]
                              for r, m in zip(table["rollout_log_probs"], mask, strict=True)])
    return old, rollout, np.array(mask, dtype=object)


def run(path: Path) -> dict:
    """The JSON report of `path` (no bootstrap: the verdicts do not use it)."""
    return analyze([str(path)], CorrectionConfig(), bootstrap=0).to_dict()


def codes(report: dict) -> set[str]:
    return {f["code"] for f in report["findings"]}


@pytest.fixture(scope="module")
def reports() -> dict[str, dict]:
    return {path.stem: run(path) for path in sorted(REAL.glob("*.parquet"))}


@pytest.mark.parametrize("arm", sorted(p.stem for p in REAL.glob("*.parquet")))
def test_the_agreement_metrics_are_numpys(reports: dict[str, dict], arm: str) -> None:
    old, rollout, _ = columns(REAL / f"{arm}.parquet")
    d = old - rollout
    metrics = reports[arm]["metrics"]
    assert metrics["diag/valid_tokens"] == d.size > 2000
    assert metrics["diag/prob_abs_diff_mean"] == pytest.approx(np.abs(np.exp(old) - np.exp(rollout)).mean(),
                                                               rel=1e-5, abs=1e-9)
    assert metrics["diag/token_mult_prob_error"] == pytest.approx(np.exp(np.abs(d)).mean(), rel=1e-6)
    capped = np.exp(np.minimum(d, 1.0))
    assert metrics["diag/ratio_mean"] == pytest.approx(capped.mean(), rel=1e-6)
    assert metrics["diag/ratio_mean_se"] == pytest.approx(capped.std(ddof=1) / np.sqrt(d.size), rel=1e-3)


@pytest.mark.parametrize("arm", PRECISION_ARMS)
def test_a_precision_arm_is_judged_by_the_sourced_bands(reports: dict[str, dict], arm: str) -> None:
    old, rollout, _ = columns(REAL / f"{arm}.parquet")
    d = old - rollout
    report = reports[arm]
    assert not codes(report) & BUGS  # a precision difference is no bug
    capped = np.exp(np.minimum(d, 1.0))
    z = abs(capped.mean() - 1) / (capped.std(ddof=1) / np.sqrt(d.size))
    assert z < 5  # the ratio-mean identity holds at any precision
    in_band = np.abs(np.exp(old) - np.exp(rollout)).mean() <= 0.01 and np.exp(np.abs(d)).mean() <= 1.05
    kind = report["summary"]["diagnosis"]["kind"]
    assert (kind != "precision") == bool(in_band)


@pytest.mark.parametrize("arm", ["fp32", "fp32_b"])
def test_the_fp32_control_is_healthy_and_silent(reports: dict[str, dict], arm: str) -> None:
    report = reports[arm]
    assert report["summary"]["status"] == "healthy" and report["summary"]["diagnosis"]["kind"] == "healthy"
    assert report["findings"] == []
    assert report["recommendation"]["scenario"] is None


def test_the_temperature_bug_is_named_with_its_fix_first(reports: dict[str, dict]) -> None:
    report = reports["temperature_bug"]
    old, rollout, _ = columns(REAL / "temperature_bug.parquet")
    assert report["summary"]["status"] == "bug"
    assert report["summary"]["diagnosis"]["code"] == "temperature_mismatch"
    finding = next(f for f in report["findings"] if f["code"] == "temperature_mismatch")
    # Sampled at 0.7 and scored at 1.0: the rollout log-prob is steeper than the old one.
    slope = np.polyfit(old, rollout, 1)[0]
    assert finding["evidence"]["temperature_slope"] == pytest.approx(slope, rel=1e-4)
    # rollout / old <= 1 / T on every token, reached where one logit dominates: the estimate is its tail.
    tail = old < -1
    assert finding["evidence"]["temperature_estimate"] == pytest.approx(
        1 / np.quantile(rollout[tail] / old[tail], 0.999), rel=0.01)
    assert finding["evidence"]["temperature_estimate"] == pytest.approx(0.7, abs=0.02)
    rec = report["recommendation"]
    assert rec["scenario"] is None and rec["flags"] is None and rec["fix"]["code"] == "temperature_mismatch"
    assert "temperature" in rec["fix"]["text"]


def test_top_p_processed_logprobs_are_named_with_their_fix_first(reports: dict[str, dict]) -> None:
    report = reports["top_p_bug"]
    old, rollout, _ = columns(REAL / "top_p_bug.parquet")
    d = old - rollout
    assert report["summary"]["status"] == "bug"
    assert report["summary"]["diagnosis"]["code"] == "processed_logprobs"
    evidence = next(f for f in report["findings"] if f["code"] == "processed_logprobs")["evidence"]
    assert evidence["ratio_mean"] == pytest.approx(np.exp(np.minimum(d, 1.0)).mean(), rel=1e-6)
    assert evidence["ratio_below_1_fraction"] == pytest.approx((d < 0).mean())
    assert evidence["rollout_exact_zero_tokens"] == int(((rollout == 0) & (old != 0)).sum())
    # The exact 0.0s are nuclei of one token, not a fill: no constant_fill, no temperature, no k3/k1 beside it.
    assert not codes(report) & {"constant_fill", "temperature_mismatch", "k3_k1_ratio"}
    assert report["recommendation"]["scenario"] is None
    assert "top_p" in report["recommendation"]["fix"]["text"]


def test_multi_turn_tool_replies_are_rounds_not_bugs(reports: dict[str, dict]) -> None:
    report = reports["multi_turn"]
    _, _, masks = columns(REAL / "multi_turn.parquet")
    runs = sum(int(np.sum(np.diff(np.concatenate([[0], m.astype(np.int8)])) == 1)) for m in masks)
    assert report["metrics"]["diag/rounds"] == runs > len(masks)
    assert not codes(report) & BUGS


def sampled_dump(path: Path, noise: float = 0.0, temperature: float = 1.0, top_k: int = 0, rows: int = 200,
                 length: int = 100, vocab: int = 64) -> None:
    """Tokens sampled from the rollout's softmax over `vocab` logits (at `temperature`, renormalized over the
    `top_k` largest when set); the trainer scores the same logits plus N(0, noise) at temperature 1."""
    rng = np.random.default_rng(7)
    logits = rng.normal(0, 3, (rows * length, vocab))
    scaled = logits / temperature
    if top_k:
        scaled = np.where(scaled >= np.sort(scaled, axis=1)[:, -top_k:-top_k + 1], scaled, -np.inf)
    rollout = scaled - np.logaddexp.reduce(scaled, axis=1, keepdims=True)
    trainer = logits + rng.normal(0, noise, logits.shape)
    trainer -= np.logaddexp.reduce(trainer, axis=1, keepdims=True)
    pick = (rng.random((rows * length, 1)) < np.cumsum(np.exp(rollout), axis=1)).argmax(axis=1)
    at = np.arange(rows * length)
    pq.write_table(pa.table({
        "old_log_probs": list(trainer[at, pick].astype(np.float32).reshape(rows, length)),
        "rollout_log_probs": list(rollout[at, pick].astype(np.float32).reshape(rows, length)),
        "response_mask": list(np.ones((rows, length), dtype=np.int8)),
    }), path)


def test_an_h100_sized_gap_is_a_precision_problem(tmp_path: Path) -> None:
    # Logit noise that puts mean |p_train - p_rollout| near the H100 bf16 run's 0.0175, above verl's FAQ 0.01;
    # the tokens are sampled from the rollout side, so the ratio-mean identity holds and no bug is named.
    path = tmp_path / "gap.parquet"
    sampled_dump(path, noise=0.15)
    old, rollout, _ = columns(path)
    assert 0.01 < np.abs(np.exp(old) - np.exp(rollout)).mean() < 0.03
    report = run(path)
    assert report["summary"]["status"] == "warning"
    assert report["summary"]["diagnosis"]["kind"] == "precision"
    assert "fp32" in report["recommendation"]["fix"]["text"]


@pytest.mark.parametrize("sample", ["single_turn.parquet", "multi_turn.parquet", "packed.safetensors"])
def test_the_new_signatures_stay_silent_on_the_synthetic_samples(sample: str) -> None:
    report = analyze([str(ROOT / "sample_data" / sample)], CorrectionConfig(), bootstrap=0).to_dict()
    assert not codes(report) & BUGS and report["summary"]["status"] != "bug"


def test_a_sequence_level_correction_is_judged_on_the_rows_ess() -> None:
    path = REAL / "bf16.parquet"
    table = pq.read_table(path, columns=["old_log_probs", "rollout_log_probs", "response_mask"]).to_pydict()
    sums = np.array([np.sum((np.asarray(o, np.float64) - np.asarray(r, np.float64))[np.asarray(m, bool)])
                     for o, r, m in zip(table["old_log_probs"], table["rollout_log_probs"], table["response_mask"],
                                        strict=True)])
    w = np.exp(np.clip(sums, -20, 20))
    kish = w.sum() ** 2 / (w.size * (w**2).sum())
    token_level = run(path)["summary"]["before"]["checks"]
    assert "diag/ess_seq_kish" not in {c["metric"] for c in token_level}
    report = analyze([str(path)], CorrectionConfig(rollout_is="sequence"), bootstrap=0).to_dict()
    check = next(c for c in report["summary"]["before"]["checks"] if c["metric"] == "diag/ess_seq_kish")
    assert check["value"] == pytest.approx(kish, rel=1e-5) and check["ok"] == (kish >= 0.3)


@pytest.mark.parametrize(("temperature", "top_k", "code"), [(1.5, 0, "temperature_mismatch"),
                                                           (0.7, 0, "temperature_mismatch"),
                                                           (1.0, 8, "processed_logprobs")])
def test_a_temperature_and_a_truncation_are_told_apart(tmp_path: Path, temperature: float, top_k: int,
                                                       code: str) -> None:
    path = tmp_path / "sampled.parquet"
    sampled_dump(path, temperature=temperature, top_k=top_k)
    report = run(path)
    assert report["summary"]["diagnosis"]["code"] == code
    assert not codes(report) & (BUGS - {code})
    if code == "temperature_mismatch":
        old, rollout, _ = columns(path)
        tail = old < -1
        share = rollout[tail] / old[tail]
        want = 1 / np.quantile(share, 0.999 if temperature < 1 else 0.001)
        assert report["metrics"]["diag/temperature_estimate"] == pytest.approx(want, rel=0.01)
        assert report["metrics"]["diag/temperature_estimate"] == pytest.approx(temperature, rel=0.05)


# ---------------------------------------------------------------- issue 37: causes the first arms did not show


def column(path: Path, name: str) -> list:
    return pq.read_table(path, columns=[name]).column(name).to_pylist()


@pytest.mark.parametrize(("arm", "code"), [("min_p", "processed_logprobs"), ("top_k", "processed_logprobs"),
                                           ("repetition_penalty", "logit_processor"),
                                           ("temperature_high", "temperature_mismatch"),
                                           ("shifted", "shifted_streams"), ("mask_prompt", "mask_covers_prompt")])
def test_each_new_bug_arm_names_its_cause_first(reports: dict[str, dict], arm: str, code: str) -> None:
    report = reports[arm]
    assert report["summary"]["status"] == "bug" and report["summary"]["diagnosis"]["code"] == code
    assert report["recommendation"]["fix"]["code"] == code and report["recommendation"]["scenario"] is None
    assert not codes(report) & (BUGS | {"logit_processor", "mask_covers_prompt"}) - {code}
    # Every other cause is ruled out with its number, or, after a structural bug, not judged.
    verdicts = [c["verdict"] for c in report["summary"]["causes"]]
    assert verdicts.count("named") == 1
    other = "not judged" if code in ("shifted_streams", "mask_covers_prompt") else "ruled out"
    assert set(verdicts) == {"named", other}


def test_a_repetition_penalty_keeps_the_uncapped_identity_and_sits_on_repeats(reports: dict[str, dict]) -> None:
    path = REAL / "repetition_penalty.parquet"
    old, rollout, masks = columns(path)
    d = old - rollout
    evidence = next(f for f in reports["repetition_penalty"]["findings"] if f["code"] == "logit_processor")["evidence"]
    ratio = np.exp(np.clip(d, -20, 20))
    assert evidence["uncapped_ratio_mean"] == pytest.approx(ratio.mean(), rel=1e-6)
    assert abs(ratio.mean() - 1) < 5 * ratio.std(ddof=1) / np.sqrt(d.size)  # the engine reports what it sampled
    assert np.exp(np.minimum(d, 1)).mean() < 0.99  # only the cap at e pulls it under
    ids = [np.asarray(i)[np.asarray(m, bool)] for i, m in zip(column(path, "response_ids"), masks, strict=True)]
    repeated = np.concatenate([[token in set(row[:t].tolist()) for t, token in enumerate(row.tolist())]
                               for row in ids])
    assert evidence["repetition"]["repeated_fraction"] == pytest.approx(repeated.mean())
    assert evidence["repetition"]["tail_repeated_fraction"] == pytest.approx(repeated[d > 0].mean())
    fix = reports["repetition_penalty"]["recommendation"]["fix"]["text"]
    assert "penalt" in fix and "top_p" not in fix


def test_the_prompt_in_the_mask_is_counted_exactly(reports: dict[str, dict]) -> None:
    _, _, masks = columns(REAL / "mask_prompt.parquet")
    rollouts = column(REAL / "mask_prompt.parquet", "rollout_log_probs")
    lead = sum(int(np.argmax(np.asarray(r)[np.asarray(m, bool)] != 0)) for r, m in zip(rollouts, masks, strict=True))
    evidence = next(f for f in reports["mask_prompt"]["findings"] if f["code"] == "mask_covers_prompt")["evidence"]
    assert evidence["prefix_tokens"] == lead and evidence["rows"] == len(masks)
    assert "response mask" in reports["mask_prompt"]["recommendation"]["fix"]["text"]


def test_stale_weights_without_versions_name_precision_and_lag_with_what_tells_them_apart(
        reports: dict[str, dict]) -> None:
    report = reports["stale_weights"]
    assert report["summary"]["diagnosis"]["kind"] == "precision"
    assert "policy lag" in report["summary"]["diagnosis"]["title"]
    fixes = report["recommendation"]["fixes"]
    assert [f["code"] for f in fixes] == ["precision_gap", "lag_or_precision"] and "weight sync" in fixes[1]["text"]
    assert {c["cause"]: c["verdict"] for c in report["summary"]["causes"]}["policy_lag"] == "possible"


def test_policy_versions_put_the_gap_on_the_lag(reports: dict[str, dict]) -> None:
    path = REAL / "policy_lag.parquet"
    old, rollout, masks = columns(path)
    version, step = np.asarray(column(path, "policy_version")), np.asarray(column(path, "step"))
    newest = {s: version[step == s].max() for s in set(step.tolist())}
    lag = np.array([newest[s] - v for s, v in zip(step.tolist(), version.tolist(), strict=True)])
    per_token = np.repeat(lag, [int(m.sum()) for m in masks])
    gap = np.abs(np.exp(old) - np.exp(rollout))
    report = reports["policy_lag"]
    assert report["summary"]["diagnosis"]["code"] == "policy_lag"
    lags = next(f for f in report["findings"] if f["code"] == "policy_lag")["evidence"]["lags"]
    for entry in lags:
        assert entry["prob_abs_diff_mean"] == pytest.approx(gap[per_token == entry["lag"]].mean(), rel=1e-5, abs=1e-9)
    assert lags[0]["lag"] == 0 and lags[0]["prob_abs_diff_mean"] < 1e-5 < lags[-1]["prob_abs_diff_mean"]
