"""report.json: round trip, schema version, strict JSON; the health summary's warning bands."""

from __future__ import annotations

import json
import math

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mismatch_cli.answers.health import summarize
from mismatch_cli.errors import InputError
from mismatch_cli.report import InputSummary, Report


def _report(**overrides) -> Report:
    fields = dict(
        tool={"name": "mismatch", "version": "0.1.0"},
        created_at="2025-01-02T03:04:05+00:00",
        inputs=[
            InputSummary(path="a.parquet", format="parquet", bytes=123, sha256="ab" * 32, sequences=4, tokens=17),
            InputSummary(path="b.safetensors", format="safetensors", bytes=9, sha256=None, sequences=1, tokens=2),
        ],
        config={"rollout_is": "token", "rollout_is_threshold": "0.5_5.0", "device": "cpu", "dtype": "float64"},
        metrics={"rollout_corr/kl": 0.0125, "rollout_corr/chi2_token": 0.5, "diag/sequences": 5.0, "x/null": None},
        summary={"status": "healthy", "checks": [{"metric": "rollout_corr/kl", "ok": True, "value": 0.0125}]},
        steps=[{"step": 3, "valid_tokens": 11, "metrics": {"rollout_corr/kl": -0.5}, "notes": []}],
        rounds=[{"round": 0, "tokens": 11}],
        quantiles={"log_ratio": [-0.1, 0.0, 0.1]},
        histograms={"log_ratio": {"edges": [-1.0, 0.0, 1.0], "counts": [3, 4]}},
        worst_sequences=[{"source": "a.parquet", "row": 2, "mean_abs_log_ratio": 0.75}],
        data_quality={"totals": {"nonfinite_tokens": 1}, "files": {"a.parquet": {"nonfinite_tokens": 1}}},
        warnings=["1 valid tokens with a NaN or infinite log-prob were excluded from every metric"],
    )
    fields.update(overrides)
    return Report(**fields)


def _strict_loads(text: str):
    def refuse(constant: str):
        raise ValueError(f"non-standard JSON constant {constant}")

    return json.loads(text, parse_constant=refuse)


def test_round_trip(tmp_path):
    report = _report()
    path = tmp_path / "report.json"
    path.write_text(report.to_json())
    loaded = Report.load(path)
    assert loaded == report
    assert loaded.inputs[0] == InputSummary("a.parquet", "parquet", 123, "ab" * 32, 4, 17)
    assert loaded.steps[0]["step"] == 3


def test_round_trip_of_a_real_analysis(tmp_path):
    from mismatch_cli.api import analyze

    dump = tmp_path / "d.parquet"
    pq.write_table(
        pa.table(
            {
                "old_log_probs": pa.array([[-0.5, -1.0], [-0.25]], type=pa.list_(pa.float64())),
                "rollout_log_probs": pa.array([[-0.75, -1.0], [-0.5]], type=pa.list_(pa.float64())),
                "response_mask": pa.array([[1, 1], [1]], type=pa.list_(pa.int8())),
                "step": pa.array([0, 1], type=pa.int64()),
            }
        ),
        dump,
    )
    report = analyze([str(dump)], device="cpu", dtype="float64", by_step=True)
    path = tmp_path / "report.json"
    path.write_text(report.to_json())
    assert Report.load(path) == report
    # kl = mean(rollout - old) over 3 tokens = (-0.25 + 0 - 0.25) / 3.
    assert report.metrics["rollout_corr/kl"] == pytest.approx(-0.5 / (3 + 1e-8), rel=1e-12)


def test_to_json_starts_with_schema_version():
    body = _strict_loads(_report().to_json())
    assert next(iter(body)) == "schema_version"
    assert body["schema_version"] == 1


@pytest.mark.parametrize("version", [999, 0, None, "1"])
def test_other_schema_versions_are_refused(tmp_path, version):
    body = _strict_loads(_report().to_json())
    body["schema_version"] = version
    path = tmp_path / "future.json"
    path.write_text(json.dumps(body))
    with pytest.raises(InputError) as excinfo:
        Report.load(path)
    assert "schema_version" in str(excinfo.value)
    assert str(path) in str(excinfo.value)
    assert excinfo.value.exit_code == 3


def test_not_json_is_an_input_error(tmp_path):
    path = tmp_path / "report.json"
    path.write_text("{not json")
    with pytest.raises(InputError):
        Report.load(path)


def test_missing_fields_are_an_input_error(tmp_path):
    path = tmp_path / "report.json"
    path.write_text(json.dumps({"schema_version": 1, "tool": {}}))
    with pytest.raises(InputError):
        Report.load(path)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_numbers_become_null(bad):
    report = _report(
        metrics={"rollout_corr/kl": bad, "rollout_corr/chi2_token": 0.5},
        steps=[{"step": 0, "metrics": {"rollout_corr/k3_kl": bad}, "notes": []}],
        histograms={"log_ratio": {"counts": [1.0, bad]}},
    )
    body = _strict_loads(report.to_json())
    assert body["metrics"]["rollout_corr/kl"] is None
    assert body["metrics"]["rollout_corr/chi2_token"] == 0.5
    assert body["steps"][0]["metrics"]["rollout_corr/k3_kl"] is None
    assert body["histograms"]["log_ratio"]["counts"] == [1.0, None]


# ------------------------------------------------------------------------------------------- health


def _check(summary: dict, metric: str) -> dict:
    [check] = [c for c in summary["checks"] if c["metric"] == metric]
    return check


def test_healthy_metrics():
    summary = summarize({"rollout_corr/kl": 0.05, "rollout_corr/chi2_token": 0.5})
    assert summary["status"] == "healthy"
    assert _check(summary, "rollout_corr/kl")["ok"] is True
    assert _check(summary, "rollout_corr/chi2_token")["ok"] is True


@pytest.mark.parametrize("kl", [0.2, -0.2])
def test_kl_band_is_absolute(kl):
    summary = summarize({"rollout_corr/kl": kl, "rollout_corr/chi2_token": 0.5})
    assert summary["status"] == "warning"
    check = _check(summary, "rollout_corr/kl")
    assert check["ok"] is False
    assert check["value"] == kl
    assert _check(summary, "rollout_corr/chi2_token")["ok"] is True


@pytest.mark.parametrize(
    ("metric", "healthy", "unhealthy"),
    [
        ("rollout_corr/kl", [-0.1, 0.0, 0.1], [-0.11, 0.11]),
        ("rollout_corr/chi2_token", [0.0, 0.5, 1.0], [1.01, 5.0]),
        ("rollout_corr/rollout_is_mean", [0.5, 1.0, 2.0], [0.49, 2.01]),
        ("rollout_corr/rollout_is_eff_sample_size", [0.3, 1.0], [0.29, 0.0]),
        ("rollout_corr/rollout_is_std", [0.0, 1.0], [1.01]),
    ],
)
def test_documented_bands(metric, healthy, unhealthy):
    """SPEC §5: IS mean outside [0.5, 2], ESS < 0.3, IS std > 1, |kl| > 0.1, chi2_token > 1 warn."""
    for value in healthy:
        summary = summarize({metric: value})
        assert _check(summary, metric)["ok"] is True, value
        assert summary["status"] == "healthy"
    for value in unhealthy:
        summary = summarize({metric: value})
        assert _check(summary, metric)["ok"] is False, value
        assert summary["status"] == "warning"


def test_null_metrics_are_not_checked():
    summary = summarize({"rollout_corr/kl": None, "rollout_corr/chi2_token": 0.5})
    assert [c["metric"] for c in summary["checks"]] == ["rollout_corr/chi2_token"]
    assert summary["status"] == "healthy"
