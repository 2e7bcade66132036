"""`--semantics ms-swift` on the command line: `--set FIELD=VALUE`, the `[correction]` table, exit 2 on bad fields."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import REFERENCE, close
from helpers import case_dump as _dump
from typer.testing import CliRunner

from mismatch_cli.cli import app

CASES = {c["name"]: c for c in json.loads((REFERENCE / "ms_swift_parity_cases.json").read_text())["cases"]}


def _keys(output: str) -> dict:
    return {k: v for k, v in json.loads(output)["metrics"].items() if k.startswith("rollout_correction/")}


def _toml(value) -> str:
    return json.dumps(value) if not isinstance(value, bool) else str(value).lower()


@pytest.mark.parametrize("name", ["token_mask_threshold_1_2", "micro_batch_4_sequence_mask",
                                  "micro_batch_2_metrics_only"])
def test_set_and_config_table_match_ms_swift(name: str, tmp_path: Path) -> None:
    case = CASES[name]
    dump = _dump(case, tmp_path)
    flags = [arg for k, v in case["settings"].items()
             for arg in ("--set", f"{k}={str(v).lower() if isinstance(v, bool) else v}")]
    result = CliRunner().invoke(app, ["analyze", str(dump), "--semantics", "ms-swift", *flags, "--dtype",
                                      "float64", "--format", "json", "--bootstrap", "0", "-q"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    config = tmp_path / "mismatch.toml"
    config.write_text("[correction]\nsemantics = \"ms-swift\"\n" + "".join(
        f"{k} = {_toml(v)}\n" for k, v in case["settings"].items()))
    from_table = CliRunner().invoke(app, ["analyze", str(dump), "--config", str(config), "--dtype", "float64",
                                          "--format", "json", "--bootstrap", "0", "-q"], catch_exceptions=False)
    assert from_table.exit_code == 0, from_table.output
    for output in (result.stdout, from_table.stdout):
        ours = _keys(output)
        assert set(ours) == set(case["fp64"]["metrics"])
        assert all(close(ours[k], v, 1e-9, 1e-12) for k, v in case["fp64"]["metrics"].items())


BAD = ["rollout_importance_sampling_threshhold=2", "rollout_importance_sampling_threshold=abc",
       "rollout_importance_sampling_mode=token", "per_device_train_batch_size=0", "log_rollout_offpolicy_metrics=maybe",
       "novalue"]


@pytest.mark.parametrize("setting", BAD)
def test_bad_setting_exits_2_naming_the_fields(setting: str, tmp_path: Path) -> None:
    dump = _dump(CASES["token_truncate_default_threshold"], tmp_path)
    result = CliRunner().invoke(app, ["analyze", str(dump), "--semantics", "ms-swift", "--set", setting])
    assert result.exit_code == 2
    assert any(name in result.output for name in ("rollout_importance_sampling_mode",
                                                  "rollout_importance_sampling_threshold",
                                                  "per_device_train_batch_size", "log_rollout_offpolicy_metrics"))


def test_the_report_and_the_screen_name_ms_swifts_effective_fields(tmp_path: Path) -> None:
    runner = CliRunner(env={"COLUMNS": "120", "NO_COLOR": "1", "TERM": "dumb"})
    dump = _dump(CASES["token_truncate_default_threshold"], tmp_path)
    result = runner.invoke(app, ["analyze", str(dump), "--semantics", "ms-swift", "--format", "json",
                                 "--bootstrap", "0"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    # GRPOArgumentsMixin's defaults at 4.6.0: no mode and no metrics switch, so ms-swift logs no key.
    assert report["config"]["rollout_importance_sampling_mode"] is None
    assert report["config"]["rollout_importance_sampling_threshold"] == 2.0
    assert report["config"]["per_device_train_batch_size"] == 1
    assert not _keys(result.stdout)
    screen = runner.invoke(app, ["analyze", str(dump), "--semantics", "ms-swift", "--set",
                                 "rollout_importance_sampling_mode=token_truncate", "--bootstrap", "0"]).stdout
    assert "correction: rollout_importance_sampling_mode=token_truncate, rollout_importance_sampling_threshold=2.0" \
        in screen
    assert "rollout_is_threshold" not in screen
