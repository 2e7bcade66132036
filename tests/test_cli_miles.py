"""`--semantics miles` / `miles-mis` through the command line: `--set FIELD=VALUE`, the `[correction]` table, exit 2."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from helpers import REFERENCE, close
from helpers import case_dump as _dump
from typer.testing import CliRunner

from mismatch_cli.cli import app

CASES = {c["name"]: c for c in json.loads((REFERENCE / "miles_parity_cases.json").read_text())["cases"]}


def _text(value) -> str:
    return "none" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def _check(output: str, case: dict) -> None:
    ours = {k: v for k, v in json.loads(output)["metrics"].items() if k.startswith("train/")}
    assert set(ours) == set(case["fp64"]["metrics"])
    for key, value in case["fp64"]["metrics"].items():
        if key in ("train/ois", "train/ess_ratio") or not math.isfinite(float(value)):
            assert ours[key] is None, key
        else:
            float32 = "fraction" in key or "clipfrac" in key or key == "train/train_rollout_kl"  # float32 in Miles
            tolerance = 2e-6 if float32 else 1e-9
            assert close(ours[key], value, tolerance, 1e-12), (key, ours[key], value)


@pytest.mark.parametrize("name", ["miles:icepop_band", "miles:per_token_loss", "miles:rollout_logprobs_metrics",
                                  "miles:catastrophic_defaults", "miles-mis:defaults", "miles-mis:mask_sequence",
                                  "miles-mis:no_veto_no_norm"])
def test_set_and_config_table_match_miles(name: str, tmp_path: Path) -> None:
    case = CASES[name]
    dump = _dump(case, tmp_path)
    flags = [arg for k, v in case["settings"].items() for arg in ("--set", f"{k}={_text(v)}")]
    result = CliRunner().invoke(app, ["analyze", str(dump), "--semantics", case["family"], *flags, "--dtype",
                                      "float64", "--format", "json", "--bootstrap", "0", "-q"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    config = tmp_path / "mismatch.toml"
    config.write_text(f"[correction]\nsemantics = \"{case['family']}\"\n" + "".join(
        f"{k} = {json.dumps('none' if v is None else v)}\n" for k, v in case["settings"].items()))
    from_table = CliRunner().invoke(app, ["analyze", str(dump), "--config", str(config), "--dtype", "float64",
                                          "--format", "json", "--bootstrap", "0", "-q"], catch_exceptions=False)
    assert from_table.exit_code == 0, from_table.output
    for output in (result.stdout, from_table.stdout):
        _check(output, case)


@pytest.mark.parametrize(("family", "setting", "named"), [
    ("miles", "tis_clp=2", "tis_clip"), ("miles", "tis_clip=abc", "tis_clip"), ("miles", "use_tis=maybe", "use_tis"),
    ("miles-mis", "tis_mode=cap", "tis_mode"), ("miles-mis", "rs_veto=1e-4", "rs_veto_threshold"),
    ("miles", "use_tis=true", "use_rollout_logprobs"),
])
def test_bad_setting_exits_2_naming_the_fields(family: str, setting: str, named: str, tmp_path: Path) -> None:
    dump = _dump(CASES["miles:defaults"], tmp_path)
    extra = ["--set", "use_rollout_logprobs=true"] if named == "use_rollout_logprobs" else []
    result = CliRunner().invoke(app, ["analyze", str(dump), "--semantics", family, "--set", setting, *extra])
    assert result.exit_code == 2
    assert named in result.output


def test_the_report_and_the_screen_name_miless_fields(tmp_path: Path) -> None:
    runner = CliRunner(env={"COLUMNS": "120", "NO_COLOR": "1", "TERM": "dumb"})
    dump = _dump(CASES["miles:defaults"], tmp_path)
    result = runner.invoke(app, ["analyze", str(dump), "--semantics", "miles-mis", "--format", "json",
                                 "--bootstrap", "0"])
    assert result.exit_code == 0, result.output
    body = json.loads(result.stdout)
    # mis.yaml at 31f1ca96 (docs/miles-semantics.md): slime's, token truncate at 2.0, RS on, veto 1e-4.
    assert body["config"]["tis_mode"] == "truncate" and body["config"]["rs_veto_threshold"] == 1e-4
    assert body["metrics"]["train/ess_ratio"] is None and body["metrics"]["train/train_rollout_kl"] > 0
    screen = runner.invoke(app, ["analyze", str(dump), "--semantics", "miles", "--bootstrap", "0"]).stdout
    assert "correction: none (use_tis=false): train_rollout_logprob_abs_diff, train_rollout_kl only" in screen
    assert "train_rollout_kl" in screen.split("Key metrics")[-1]
