"""Each bug signature is found on a dump that has the bug, and every signature stays silent on clean dumps."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mismatch_cli.api import analyze
from mismatch_cli.report import Report, validate_report
from mismatch_cli.synth import SynthSpec, write_synthetic_dump

SAMPLES = Path(__file__).resolve().parents[2] / "sample_data"
SIGNATURES = {"constant_fill", "temperature_mismatch", "shifted_streams", "identical_sides", "k3_k1_ratio",
              "collapsed_correlation", "bitwise_equal"}


def rows_of(path: Path) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]]:
    table = pq.read_table(path).to_pydict()
    return ([np.asarray(r, dtype=np.float32) for r in table["old_log_probs"]],
            [np.asarray(r, dtype=np.float32) for r in table["rollout_log_probs"]],
            [np.asarray(r, dtype=np.int8) for r in table["response_mask"]])


def write(path: Path, old: list[np.ndarray], rollout: list[np.ndarray], mask: list[np.ndarray]) -> str:
    pq.write_table(pa.table({
        "old_log_probs": pa.array([r.tolist() for r in old], type=pa.list_(pa.float32())),
        "rollout_log_probs": pa.array([r.tolist() for r in rollout], type=pa.list_(pa.float32())),
        "response_mask": pa.array([r.tolist() for r in mask], type=pa.list_(pa.int8())),
    }), path)
    return str(path)


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("clean") / "clean.parquet"
    write_synthetic_dump(path, SynthSpec(tokens=40_000, seed=3))
    return path


def findings(path: str | Path) -> dict[str, dict]:
    report = analyze([str(path)], device="cpu", hash_inputs=False, bootstrap=0)
    return {f["code"]: f for f in report.findings}


def codes(path: str | Path) -> set[str]:
    return set(findings(path))


@pytest.mark.parametrize("side", ["rollout", "old"])
def test_zero_padding_is_a_constant_fill(tmp_path: Path, clean: Path, side: str) -> None:
    old, rollout, mask = rows_of(clean)
    target = rollout if side == "rollout" else old
    for row, m in zip(target, mask, strict=True):  # the last third of each response padded with 0.0
        valid = np.flatnonzero(m)
        row[valid[2 * len(valid) // 3:]] = 0.0
    found = findings(write(tmp_path / "padded.parquet", old, rollout, mask))
    fill = found["constant_fill"]
    assert fill["severity"] == "error" and fill["evidence"]["side"] == side
    assert fill["evidence"]["zero_tokens"] > 0.3 * sum(int(m.sum()) for m in mask)
    assert "temperature_mismatch" not in found  # the fill explains the slope
    if side == "old":  # old = 0: every ratio is 1 / q, k3 is huge while k1 stays small and negative
        assert found["k3_k1_ratio"]["evidence"]["k3"] > 1.0
        assert found["k3_k1_ratio"]["evidence"]["k1"] < 0
    assert "collapsed_correlation" in found  # q = 1 (or p = 1) on a third of the tokens


def test_a_constant_other_than_zero_is_a_fill(tmp_path: Path, clean: Path) -> None:
    old, rollout, mask = rows_of(clean)
    for row, m in zip(rollout, mask, strict=True):
        valid = np.flatnonzero(m)
        row[valid[len(valid) // 2:]] = -2.5
    fill = findings(write(tmp_path / "filled.parquet", old, rollout, mask))["constant_fill"]
    assert fill["evidence"]["side"] == "rollout" and fill["evidence"]["repeat_tokens"] > fill["evidence"]["zero_tokens"]


def tempered(path: Path, temperature: float, seed: int = 0) -> str:
    """Tokens sampled at `temperature` from random logits; rollout = log_softmax(z / T), old = log_softmax(z)."""
    rng = np.random.default_rng(seed)
    rows, length, vocab = 40, 100, 2000
    old, rollout, mask = [], [], []
    for _ in range(rows):  # building the fixture
        z = rng.normal(0.0, 2.0, size=(length, vocab))
        z[:, 0] += rng.exponential(5.0, size=length)
        low = z - z.max(axis=1, keepdims=True)
        log_p = low - np.log(np.exp(low).sum(axis=1, keepdims=True))
        log_q = low / temperature - np.log(np.exp(low / temperature).sum(axis=1, keepdims=True))
        token = np.argmax(log_q + rng.gumbel(size=log_q.shape), axis=1)
        old.append(log_p[np.arange(length), token].astype(np.float32))
        rollout.append(log_q[np.arange(length), token].astype(np.float32))
        mask.append(np.ones(length, dtype=np.int8))
    return write(path, old, rollout, mask)


@pytest.mark.parametrize("temperature", [0.7, 1.3])
def test_temperature_mismatch_recovers_the_temperature(tmp_path: Path, temperature: float) -> None:
    found = findings(tempered(tmp_path / "tempered.parquet", temperature))
    estimate = found["temperature_mismatch"]["evidence"]["best_fit_temperature"]
    # Attenuated toward 1 (docs/report.md): between T and 1, within 0.2 of T.
    assert min(temperature, 1.0) <= estimate <= max(temperature, 1.0)
    assert abs(estimate - temperature) <= 0.2
    # The rollout side is the distribution its tokens were sampled from, so k3 = k1 in expectation.
    assert set(found) & SIGNATURES == {"temperature_mismatch"}


def test_shifted_streams(tmp_path: Path, clean: Path) -> None:
    old, rollout, mask = rows_of(clean)
    for row, m in zip(rollout, mask, strict=True):  # rollout one valid token late inside each row
        valid = np.flatnonzero(m)
        row[valid[1:]] = row[valid[:-1]].copy()
    found = findings(write(tmp_path / "shifted.parquet", old, rollout, mask))
    shift = found["shifted_streams"]
    assert shift["evidence"]["direction"] == "rollout_late"
    assert shift["evidence"]["shift_residual_ratio"] < 0.01
    assert "temperature_mismatch" not in found


def test_identical_sides(tmp_path: Path, clean: Path) -> None:
    old, _, mask = rows_of(clean)
    found = findings(write(tmp_path / "same.parquet", old, [r.copy() for r in old], mask))
    assert set(found) == {"identical_sides"}
    assert found["identical_sides"]["evidence"]["bitwise_equal_fraction"] == 1.0


def test_deterministic_run_reports_bitwise_equality(tmp_path: Path, clean: Path) -> None:
    old, _, mask = rows_of(clean)
    rng = np.random.default_rng(1)
    rollout = []
    for row in old:
        other = row.copy()
        moved = rng.random(row.size) < 0.1
        other[moved] = np.nextafter(other[moved], np.float32(0.0))  # one ulp: a near-0-diff run
        rollout.append(other)
    found = findings(write(tmp_path / "near.parquet", old, rollout, mask))
    assert set(found) & SIGNATURES == {"bitwise_equal"}
    evidence = found["bitwise_equal"]["evidence"]
    assert found["bitwise_equal"]["severity"] == "info"
    assert 0.85 < evidence["bitwise_equal_fraction"] < 0.95
    assert 0 < evidence["max_abs_log_ratio"] < 1e-5


def test_top_p_renormalized_rollout_is_named_processed_logprobs(tmp_path: Path, clean: Path) -> None:
    # A rollout side renormalized over a top-p set of mass 0.9: every rollout log-prob is log p - log 0.9.
    old, rollout, mask = rows_of(clean)
    processed = [(r - np.log(np.float32(0.9))).astype(np.float32) for r in rollout]
    found = findings(write(tmp_path / "topp.parquet", old, processed, mask))
    finding = found["processed_logprobs"]
    assert finding["severity"] == "error" and finding["fix"]
    rows = zip(old, processed, mask, strict=True)
    d = np.concatenate([(o - p).astype(np.float64)[m.astype(bool)] for o, p, m in rows])
    capped = np.exp(np.minimum(d, 1.0))
    evidence = finding["evidence"]
    assert evidence["ratio_mean"] == pytest.approx(capped.mean(), rel=1e-6)
    assert evidence["ratio_mean_standard_error"] == pytest.approx(capped.std(ddof=1) / np.sqrt(d.size), rel=1e-4)
    assert evidence["ratio_below_1_fraction"] == pytest.approx((d < 0).mean(), abs=1e-9)
    assert abs(evidence["ratio_mean"] - 0.9) < 0.01
    # Its symptoms are not reported beside it.
    assert "k3_k1_ratio" not in found and "temperature_mismatch" not in found


@pytest.mark.parametrize("turns", [1, 3])
def test_silent_on_clean_synthetic_dumps(tmp_path: Path, turns: int) -> None:
    path = tmp_path / "clean.parquet"
    write_synthetic_dump(path, SynthSpec(tokens=60_000, turns=turns, seed=11))
    assert not codes(path) & SIGNATURES


@pytest.mark.parametrize("name", ["single_turn.parquet", "multi_turn.parquet", "packed.safetensors"])
def test_silent_on_the_bundled_samples(name: str) -> None:
    assert not codes(SAMPLES / name) & SIGNATURES


def test_multi_turn_sample_names_its_catastrophic_token() -> None:
    report = analyze([str(SAMPLES / "multi_turn.parquet")], device="cpu", hash_inputs=False, bootstrap=0)
    [finding] = [f for f in report.findings if f["code"] == "concentrated_divergence"]
    evidence = finding["evidence"]
    # Independently: float64 numpy over the file.
    old, rollout, mask = rows_of(SAMPLES / "multi_turn.parquet")
    d = np.concatenate([(o.astype(np.float64) - r)[m > 0] for o, r, m in zip(old, rollout, mask, strict=True)])
    excess = np.exp(np.clip(d, -20, 20)) ** 2 - 1
    edge = evidence["log_ratio_at_least"]
    top = d >= edge  # only d > 0 adds to the chi2 excess
    assert evidence["tokens"] == int(top.sum()) and evidence["tokens"] <= 0.01 * d.size
    assert evidence["chi2_share"] == pytest.approx(excess[top].sum() / excess.sum(), rel=1e-6)
    assert evidence["chi2_share"] >= 0.9
    assert evidence["chi2_token"] == pytest.approx(report.metrics["rollout_corr/chi2_token"], rel=1e-6)
    worst_row = int(np.argmax([np.abs((o.astype(np.float64) - r)[m > 0]).max() for o, r, m in
                               zip(old, rollout, mask, strict=True)]))
    worst = evidence["token"]  # here the largest |d| is also the largest d
    assert worst == evidence["worst_token"] and worst["log_ratio"] > 0
    assert worst["row"] == worst_row
    assert abs(float(old[worst_row][worst["position"]]) - rollout[worst_row][worst["position"]]) == pytest.approx(
        np.abs(d).max(), rel=1e-6)
    assert f"multi_turn.parquet:{worst_row}:{worst['position']}" in finding["detail"]
    assert set(evidence["failing_checks"]) == {c["metric"] for c in report.summary["checks"] if not c["ok"]}
    assert evidence["explained_by"] is None
    assert math.isclose(d.size, 100082)


def test_findings_round_trip_through_json(tmp_path: Path) -> None:
    report = analyze([str(SAMPLES / "multi_turn.parquet")], device="cpu", hash_inputs=False, bootstrap=0)
    data = json.loads(report.to_json())
    again = Report.from_dict(data)
    assert again.findings == json.loads(json.dumps(report.findings))
    data["findings"][0]["severity"] = "fatal"
    with pytest.raises(Exception, match=r"findings\[0\]\.severity"):
        validate_report(data, "r.json")
