"""`--semantics nemo-rl` through the command line: `--set FIELD=VALUE`, the `[correction]` table, exit 2 on bad
fields."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import REFERENCE, close
from helpers import case_dump as _dump
from typer.testing import CliRunner

from mismatch_cli.cli import app

CASES = {c["name"]: c for c in json.loads((REFERENCE / "nemo_rl_parity_cases.json").read_text())["cases"]}
KEYS = ("token_mult_prob_error", "gen_kl_error", "policy_kl_error", "js_divergence_error",
        "sampling_importance_ratio", "is_oob_ratio")


def _keys(output: str) -> dict:
    return {k: v for k, v in json.loads(output)["metrics"].items() if k in KEYS}


def _text(value) -> str:
    return "none" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


@pytest.mark.parametrize("name", ["kl_k2", "seq_mask_tis", "sequence_level_tis", "empty_and_one_token_rows_tis_band"])
def test_set_and_config_table_match_nemo_rl(name: str, tmp_path: Path) -> None:
    case = CASES[name]
    dump = _dump(case, tmp_path)
    flags = [arg for k, v in case["settings"].items() for arg in ("--set", f"{k}={_text(v)}")]
    result = CliRunner().invoke(app, ["analyze", str(dump), "--semantics", "nemo-rl", *flags, "--dtype", "float64",
                                      "--format", "json", "--bootstrap", "0", "-q"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    config = tmp_path / "mismatch.toml"
    config.write_text("[correction]\nsemantics = \"nemo-rl\"\n" + "".join(
        f"{k} = {json.dumps('none' if v is None else v)}\n" for k, v in case["settings"].items()))
    from_table = CliRunner().invoke(app, ["analyze", str(dump), "--config", str(config), "--dtype", "float64",
                                          "--format", "json", "--bootstrap", "0", "-q"], catch_exceptions=False)
    assert from_table.exit_code == 0, from_table.output
    for output in (result.stdout, from_table.stdout):
        ours = _keys(output)
        assert set(ours) == set(case["fp64"]["metrics"])
        assert all(close(ours[k], v, 1e-9, 1e-12) for k, v in case["fp64"]["metrics"].items())


@pytest.mark.parametrize("setting", ["truncated_importance_sampling_ration=2",
                                     "truncated_importance_sampling_ratio=abc",
                                     "use_importance_sampling_correction=maybe", "novalue"])
def test_bad_setting_exits_2_naming_the_fields(setting: str, tmp_path: Path) -> None:
    dump = _dump(CASES["defaults"], tmp_path)
    result = CliRunner().invoke(app, ["analyze", str(dump), "--semantics", "nemo-rl", "--set", setting])
    assert result.exit_code == 2
    assert "reference_policy_kl_type" in result.output


def test_refused_combination_exits_2_with_nemo_rls_message(tmp_path: Path) -> None:
    dump = _dump(CASES["defaults"], tmp_path)
    result = CliRunner(env={"COLUMNS": "200"}).invoke(app, [
        "analyze", str(dump), "--semantics", "nemo-rl", "--set", "truncated_importance_sampling_type=tis",
        "--set", "truncated_importance_sampling_ratio=2"])
    assert result.exit_code == 2
    assert "use_importance_sampling_correction" in result.output


def test_the_report_and_the_screen_name_nemo_rls_effective_fields(tmp_path: Path) -> None:
    runner = CliRunner(env={"COLUMNS": "160", "NO_COLOR": "1", "TERM": "dumb"})
    dump = _dump(CASES["defaults"], tmp_path)
    result = runner.invoke(app, ["analyze", str(dump), "--semantics", "nemo-rl", "--format", "json", "--bootstrap",
                                 "0"])
    assert result.exit_code == 0, result.output
    config = json.loads(result.stdout)["config"]
    # ClippedPGLossConfig's defaults at 7ea279ab (docs/nemo-rl-semantics.md): k3, no correction, no truncation.
    assert config["reference_policy_kl_type"] == "k3" and config["use_importance_sampling_correction"] is False
    assert config["truncated_importance_sampling_type"] is None
    screen = runner.invoke(app, ["analyze", str(dump), "--semantics", "nemo-rl", "--set",
                                 "use_importance_sampling_correction=true", "--set",
                                 "truncated_importance_sampling_type=icepop", "--set",
                                 "truncated_importance_sampling_ratio=1.5", "--set",
                                 "truncated_importance_sampling_ratio_min=0.7", "--bootstrap", "0"]).stdout
    assert "truncated_importance_sampling_type=icepop" in screen
    assert "rollout_is_threshold" not in screen
