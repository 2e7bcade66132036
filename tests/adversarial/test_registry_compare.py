"""`compare` judges direction by the registry, and only correction fields make "different corrections"."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from mismatch_cli.cli import app
from mismatch_cli.correction import CorrectionConfig
from mismatch_cli.gate.comparison import BETTER, NOISE, SAME, WORSE, compare_reports
from mismatch_cli.gate.thresholds import parse_rule
from mismatch_cli.report import RUN_SETTINGS, Report

CORRECTION = {"semantics": "verl", "preset": None, "rollout_is": None, "rollout_is_threshold": 2.0}


def report(metrics: dict, intervals: dict | None = None, **config: object) -> Report:
    return Report(tool={}, created_at="", inputs=[], config={**CORRECTION, "device": "cpu", "dtype": "float32",
                                                               "by_step": False, "group_by": [], **config},
                  metrics=metrics, intervals=intervals or {})


def marks(base: Report, candidate: Report, **kwargs: object) -> dict[str, str]:
    return {row.metric: row.mark for row in compare_reports(base, candidate, **kwargs).rows}


ESS_KEYS = ("diag/ess_token", "diag/ess_seq_kish", "rollout_corr/rollout_is_eff_sample_size")


def test_ess_is_higher_is_better() -> None:
    low, high = {k: 0.99963 for k in ESS_KEYS}, {k: 0.99982 for k in ESS_KEYS}
    # The case: 0.99982 -> 0.99963 is far inside the ESS's minimal practical difference (0.01),
    # so it is no practical change, neither worse nor better.
    assert set(marks(report(high), report(low)).values()) == {SAME}
    # Judged by direction alone (no intervals, every change counting): a rise is better, a fall worse.
    every_change = {k: None for k in ESS_KEYS}
    assert set(marks(report(low), report(high), min_difference=every_change).values()) == {BETTER}
    assert set(marks(report(high), report(low), min_difference=every_change).values()) == {WORSE}
    far_low = {k: 0.5 for k in ESS_KEYS}
    assert set(marks(report(far_low), report(high)).values()) == {BETTER}
    # With bootstrap intervals that overlap, a change this small is noise, whichever way it goes.
    around = {k: [0.99950, 0.99990] for k in ESS_KEYS}
    assert set(marks(report(high, around), report(low, around)).values()) == {NOISE}
    rows = compare_reports(report(low), report(high)).to_dict()["metrics"]
    assert {row["direction"] for row in rows} == {"higher is better"}


def test_closer_to_one_is_better() -> None:
    base = report({"rollout_corr/rollout_is_mean": 1.05, "rollout_corr/ppl_ratio": 0.98})
    candidate = report({"rollout_corr/rollout_is_mean": 0.97, "rollout_corr/ppl_ratio": 1.03})
    # |0.97 - 1| = 0.03 < 0.05: better; |1.03 - 1| = 0.03 > 0.02: worse (a smaller value would not decide it).
    assert marks(base, candidate) == {"rollout_corr/rollout_is_mean": BETTER, "rollout_corr/ppl_ratio": WORSE}


def test_signed_kl_is_judged_by_its_size() -> None:
    assert marks(report({"rollout_corr/kl": -0.004}), report({"rollout_corr/kl": 0.002})) == {
        "rollout_corr/kl": BETTER}
    assert marks(report({"rollout_corr/kl": 0.002}), report({"rollout_corr/kl": -0.004})) == {
        "rollout_corr/kl": WORSE}


def test_signed_bias_is_not_a_ratio() -> None:
    # diag/log_ratio_mean is a mean of d whose ideal is 0; a suffix rule ("ratio_mean") took it for "closer to 1"
    # and called 0.001 -> -0.0005 worse.
    rules = [parse_rule("diag/log_ratio_mean<=1")]
    rows = compare_reports(report({"diag/log_ratio_mean": 0.001}), report({"diag/log_ratio_mean": -0.0005}),
                           rules).rows
    assert [(r.metric, r.mark, r.direction.value) for r in rows] == [("diag/log_ratio_mean", BETTER, "lower |x|")]


def test_run_settings_make_no_correction_note() -> None:
    base = report({"rollout_corr/kl": 0.001})
    grouped = report({"rollout_corr/kl": 0.001}, by_step=True, group_by=["env"], device="cuda", dtype="float64")
    assert not [n for n in compare_reports(base, grouped).notes if "different corrections" in n]
    other = report({"rollout_corr/kl": 0.001}, rollout_is="token")
    notes = [n for n in compare_reports(base, other).notes if "different corrections" in n]
    assert len(notes) == 1 and "rollout_is: None vs 'token'" in notes[0] and "group_by" not in notes[0]


def _dump(path: Path, rows: int = 60, width: int = 12) -> None:
    rng = np.random.default_rng(5)
    rollout = -rng.exponential(0.5, size=(rows, width))
    old = rollout + rng.normal(0.0, 0.01, size=(rows, width))
    pq.write_table(pa.table({
        "old_log_probs": pa.array(old.tolist(), type=pa.list_(pa.float64())),
        "rollout_log_probs": pa.array(rollout.tolist(), type=pa.list_(pa.float64())),
        "response_mask": pa.array(np.ones((rows, width), dtype=np.int8).tolist(), type=pa.list_(pa.int8())),
        "env": pa.array([f"env{i % 3}" for i in range(rows)]),
        "step": pa.array([i % 2 for i in range(rows)]),
    }), path)


@pytest.fixture(scope="module")
def by_reports(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("by")
    _dump(root / "d.parquet")
    out = {}
    for name, extra in (("plain", []), ("by", ["--by", "env", "--by", "step"])):
        result = CliRunner().invoke(app, ["analyze", str(root / "d.parquet"), "--out-dir", str(root / name),
                                          "--no-plots", "--device", "cpu", *extra])
        assert result.exit_code == 0, result.output
        out[name] = root / name / "report.json"
    return out


def test_by_against_plain_has_no_correction_note(by_reports) -> None:
    result = CliRunner().invoke(app, ["compare", str(by_reports["plain"]), str(by_reports["by"]), "--format", "json"])
    assert result.exit_code == 0, result.output
    body = json.loads(result.stdout)
    assert not [n for n in body["notes"] if "different corrections" in n], body["notes"]
    assert {row["mark"] for row in body["metrics"]} == {NOISE}  # the same dump on both sides


def test_run_settings_are_all_the_config_holds_besides_the_correction(by_reports) -> None:
    config = json.loads(by_reports["by"].read_text())["config"]
    assert set(config) - set(CorrectionConfig().to_dict()) == set(RUN_SETTINGS)
    assert config["group_by"] == ["env"] and config["by_step"] is True
