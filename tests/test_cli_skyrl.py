"""`--semantics skyrl` through the command line: `--set FIELD=VALUE`, the `[correction]` table, exit 2 on bad fields."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import REFERENCE, close
from helpers import case_dump as _dump
from typer.testing import CliRunner

from mismatch_cli.cli import app

CASES = {c["name"]: c for c in json.loads((REFERENCE / "skyrl_parity_cases.json").read_text())["cases"]}


def _keys(output: str) -> dict:
    return {k: v for k, v in json.loads(output)["metrics"].items() if k.startswith("policy/")}


@pytest.mark.parametrize("name", ["token_tis_cap_1_2", "everything", "micro_batch_4_everything"])
def test_set_and_config_table_match_skyrl(name: str, tmp_path: Path) -> None:
    case = CASES[name]
    dump = _dump(case, tmp_path)
    flags = [arg for k, v in case["settings"].items() for arg in ("--set", f"{k}={v}")]
    result = CliRunner().invoke(app, ["analyze", str(dump), "--semantics", "skyrl", *flags, "--dtype", "float64",
                                      "--format", "json", "--bootstrap", "0", "-q"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    config = tmp_path / "mismatch.toml"
    config.write_text("[correction]\nsemantics = \"skyrl\"\n" + "".join(
        f"{k} = {json.dumps(v)}\n" for k, v in case["settings"].items()))
    from_table = CliRunner().invoke(app, ["analyze", str(dump), "--config", str(config), "--dtype", "float64",
                                          "--format", "json", "--bootstrap", "0", "-q"], catch_exceptions=False)
    assert from_table.exit_code == 0, from_table.output
    for output in (result.stdout, from_table.stdout):
        ours = _keys(output)
        assert set(ours) == set(case["fp64"]["metrics"])
        assert all(close(ours[k], v, 1e-9, 1e-12) for k, v in case["fp64"]["metrics"].items())


@pytest.mark.parametrize("setting", ["token_tis_ratio_clip_hi=2", "token_tis_ratio_clip_high=abc",
                                     "tis_ratio_type=tok", "micro_train_batch_size_per_gpu=0", "novalue"])
def test_bad_setting_exits_2_naming_the_fields(setting: str, tmp_path: Path) -> None:
    dump = _dump(CASES["token_tis_default_cap"], tmp_path)
    result = CliRunner().invoke(app, ["analyze", str(dump), "--semantics", "skyrl", "--set", setting])
    assert result.exit_code == 2
    assert any(name in result.output for name in ("tis_ratio_type", "token_tis_ratio_clip_high",
                                                  "micro_train_batch_size_per_gpu"))


def test_the_report_and_the_screen_name_skyrls_effective_fields(tmp_path: Path) -> None:
    runner = CliRunner(env={"COLUMNS": "120", "NO_COLOR": "1", "TERM": "dumb"})
    dump = _dump(CASES["token_tis_default_cap"], tmp_path)
    result = runner.invoke(app, ["analyze", str(dump), "--semantics", "skyrl", "--format", "json", "--bootstrap", "0"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    # OffPolicyCorrectionConfig's defaults at 0.4.0: nothing switched on, so SkyRL logs no key.
    assert report["config"]["tis_ratio_type"] is None and report["config"]["token_tis_ratio_clip_high"] == 2.0
    assert report["config"]["micro_train_batch_size_per_gpu"] == 1
    assert not _keys(result.stdout)
    screen = runner.invoke(app, ["analyze", str(dump), "--semantics", "skyrl", "--set", "tis_ratio_type=token",
                                 "--bootstrap", "0"]).stdout
    assert "correction: tis_ratio_type=token, token_tis_ratio_clip_high=2.0" in screen
    assert "rollout_is_threshold" not in screen
