"""`--semantics slime` / `slime-mis` through the command line: `--set FIELD=VALUE`, the `[correction]` table, exit 2."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from helpers import REFERENCE, close
from helpers import case_dump as _dump
from typer.testing import CliRunner

from mismatch_cli.cli import app

CASES = {c["name"]: c for c in json.loads((REFERENCE / "slime_parity_cases.json").read_text())["cases"]}


def _text(value) -> str:
    return "none" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def _check(output: str, case: dict) -> None:
    ours = {k: v for k, v in json.loads(output)["metrics"].items() if k.startswith("train/")}
    assert set(ours) == set(case["fp64"]["metrics"])
    for key, value in case["fp64"]["metrics"].items():
        if key == "train/ois" or not math.isfinite(float(value)):
            assert ours[key] is None, key
        else:
            tolerance = 2e-6 if "fraction" in key or "clipfrac" in key else 1e-9  # slime's float32 flags
            assert close(ours[key], value, tolerance, 1e-12), (key, ours[key], value)


@pytest.mark.parametrize("name", ["slime:icepop_band", "slime:per_token_loss", "slime-mis:defaults",
                                  "slime-mis:mask_sequence", "slime-mis:no_veto_no_norm"])
def test_set_and_config_table_match_slime(name: str, tmp_path: Path) -> None:
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
    ("slime", "tis_clp=2", "tis_clip"), ("slime", "tis_clip=abc", "tis_clip"), ("slime", "use_tis=maybe", "use_tis"),
    ("slime-mis", "tis_mode=cap", "tis_mode"), ("slime-mis", "rs_veto=1e-4", "rs_veto_threshold"),
    ("slime", "use_tis=true", "use_rollout_logprobs"),
])
def test_bad_setting_exits_2_naming_the_fields(family: str, setting: str, named: str, tmp_path: Path) -> None:
    dump = _dump(CASES["slime:defaults"], tmp_path)
    extra = ["--set", "use_rollout_logprobs=true"] if named == "use_rollout_logprobs" else []
    result = CliRunner().invoke(app, ["analyze", str(dump), "--semantics", family, "--set", setting, *extra])
    assert result.exit_code == 2
    assert named in result.output


def test_the_report_and_the_screen_name_slimes_fields(tmp_path: Path) -> None:
    runner = CliRunner(env={"COLUMNS": "120", "NO_COLOR": "1", "TERM": "dumb"})
    dump = _dump(CASES["slime:defaults"], tmp_path)
    result = runner.invoke(app, ["analyze", str(dump), "--semantics", "slime-mis", "--format", "json",
                                 "--bootstrap", "0"])
    assert result.exit_code == 0, result.output
    config = json.loads(result.stdout)["config"]
    # mis.yaml at 624b824a (docs/slime-semantics.md): token truncate at 2.0, RS on, veto 1e-4, batch-normalized.
    assert config["tis_mode"] == "truncate" and config["tis_upper_bound"] == 2.0 and config["rs_veto_threshold"] == 1e-4
    screen = runner.invoke(app, ["analyze", str(dump), "--semantics", "slime", "--set", "use_tis=true",
                                 "--bootstrap", "0"]).stdout
    assert "correction: use_tis=true, tis_clip=2.0, tis_clip_low=0.0, function=vanilla_tis_function" in screen
    assert "rollout_is_threshold" not in screen
