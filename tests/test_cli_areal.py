"""`--semantics areal` through the command line: `--set FIELD=VALUE`, the `[correction]` table, exit 2 on bad fields."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import REFERENCE, close
from helpers import case_dump as _dump
from typer.testing import CliRunner

from mismatch_cli.cli import app

CASES = {c["name"]: c for c in json.loads((REFERENCE / "areal_parity_cases.json").read_text())["cases"]}
PREFIX = "ppo_actor/update/"


def _keys(output: str) -> dict:
    return {k: v for k, v in json.loads(output)["metrics"].items() if k.startswith(PREFIX)}


def _toml(value) -> str:
    return json.dumps(value) if value is not None else '"none"'


@pytest.mark.parametrize("name", ["token_mask_ratio_band", "sequence_clamp_ratio_max", "token_mask_kl_k3_0.05_0.001"])
def test_set_and_config_table_match_areal(name: str, tmp_path: Path) -> None:
    case = CASES[name]
    dump = _dump(case, tmp_path)
    flags = [arg for k, v in case["settings"].items() for arg in ("--set", f"{k}={'none' if v is None else v}")]
    result = CliRunner().invoke(app, ["analyze", str(dump), "--semantics", "areal", *flags, "--dtype", "float64",
                                      "--format", "json", "--bootstrap", "0", "-q"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    config = tmp_path / "mismatch.toml"
    config.write_text("[correction]\nsemantics = \"areal\"\n" + "".join(
        f"{k} = {_toml(v)}\n" for k, v in case["settings"].items()))
    from_table = CliRunner().invoke(app, ["analyze", str(dump), "--config", str(config), "--dtype", "float64",
                                          "--format", "json", "--bootstrap", "0", "-q"], catch_exceptions=False)
    assert from_table.exit_code == 0, from_table.output
    for output in (result.stdout, from_table.stdout):
        ours = _keys(output)
        assert set(ours) == set(case["fp64"]["metrics"])
        assert all(close(ours[k], v, 1e-5, 1e-7) for k, v in case["fp64"]["metrics"].items())


@pytest.mark.parametrize("setting", ["uper=2", "upper=abc", "metric=k3", "upper=1.0", "use_decoupled_loss=maybe",
                                     "novalue"])
def test_bad_setting_exits_2_naming_the_fields(setting: str, tmp_path: Path) -> None:
    dump = _dump(CASES["token_mask_ratio_defaults"], tmp_path)
    result = CliRunner().invoke(app, ["analyze", str(dump), "--semantics", "areal", "--set", setting])
    assert result.exit_code == 2
    assert any(name in result.output for name in ("use_decoupled_loss", "upper", "metric"))


def test_the_report_and_the_screen_name_areals_effective_fields(tmp_path: Path) -> None:
    runner = CliRunner(env={"COLUMNS": "120", "NO_COLOR": "1", "TERM": "dumb"})
    dump = _dump(CASES["token_mask_ratio_defaults"], tmp_path)
    result = runner.invoke(app, ["analyze", str(dump), "--semantics", "areal", "--format", "json", "--bootstrap", "0"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    # PPOActorConfig's defaults at 1.0.4: rejection_sampling unset, so AReaL logs no behave_* key.
    assert report["config"]["use_decoupled_loss"] is False and report["config"]["rejection_sampling"] is False
    assert report["config"]["upper"] == 5.0 and report["config"]["level"] == "token"
    assert not _keys(result.stdout)
    screen = runner.invoke(app, ["analyze", str(dump), "--semantics", "areal", "--set", "use_decoupled_loss=true",
                                 "--set", "rejection_sampling=true", "--bootstrap", "0"]).stdout
    assert "correction: level=token, action=mask, metric=ratio, upper=5.0" in screen
    assert "rollout_is_threshold" not in screen


def test_write_dump_recipe_on_an_areal_shaped_batch(tmp_path: Path) -> None:
    """docs/python-api.md's AReaL recipe: the batch `_ppo_update` receives, by AReaL's key names, replays exactly."""
    import numpy as np
    import torch

    import mismatch_cli
    from mismatch_cli.correction import CorrectionConfig

    case = CASES["sequence_mask_kl_k1_max"]
    decode = np.vectorize(float)
    prox = torch.tensor(decode(np.asarray(case["old_log_prob"], dtype=object)), dtype=torch.float32)
    behave = torch.tensor(decode(np.asarray(case["rollout_log_prob"], dtype=object)), dtype=torch.float32)
    mask = torch.tensor(case["response_mask"], dtype=torch.float32)  # AReaL's loss_mask is float after the roll
    data = {"input_ids": torch.zeros_like(mask, dtype=torch.long), "attention_mask": torch.ones_like(mask),
            "loss_mask": mask, "logprobs": behave * mask, "prox_logp": prox, "advantages": torch.ones_like(mask)}
    path = mismatch_cli.write_dump(str(tmp_path / "dumps"), data, old_log_probs=data["prox_logp"],
                                   rollout_log_probs=data["logprobs"], step=3)
    report = mismatch_cli.analyze([str(path)], device="cpu", dtype="float32", bootstrap=0, hash_inputs=False,
                                  correction=CorrectionConfig(semantics="areal", family_fields=dict(case["settings"])))
    for key, value in case["fp32"]["metrics"].items():
        assert close(report.metrics[key], float(value), 1e-5, 1e-7), key
