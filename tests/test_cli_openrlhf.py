"""`--semantics openrlhf` on the command line: `--set FIELD=VALUE`, the `[correction]` table, exit 2 on bad fields."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import REFERENCE, close
from helpers import case_dump as _dump
from typer.testing import CliRunner

from mismatch_cli.cli import app

CASES = {c["name"]: c for c in json.loads((REFERENCE / "openrlhf_parity_cases.json").read_text())["cases"]}


def _keys(output: str) -> dict:
    return {k: v for k, v in json.loads(output)["metrics"].items() if k.startswith("train/")}


def _flag(value) -> str:
    return "_".join(map(str, value)) if isinstance(value, list) else str(value)


@pytest.mark.parametrize("name", ["icepop_band_0_8_1_25", "micro_batch_4_seq_mask_tis", "tv_token",
                                  "micro_batch_2_tis"])
def test_set_and_config_table_match_openrlhf(name: str, tmp_path: Path) -> None:
    case = CASES[name]
    dump = _dump(case, tmp_path)
    flags = [arg for k, v in case["settings"].items() for arg in ("--set", f"{k}={_flag(v)}")]
    result = CliRunner().invoke(app, ["analyze", str(dump), "--semantics", "openrlhf", *flags, "--dtype", "float64",
                                      "--format", "json", "--bootstrap", "0", "-q"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    config = tmp_path / "mismatch.toml"
    table = {k: (v[0] if isinstance(v, list) and len(v) == 1 else v) for k, v in case["settings"].items()}
    config.write_text("[correction]\nsemantics = \"openrlhf\"\n" + "".join(
        f"{k} = {json.dumps(v)}\n" for k, v in table.items()))
    from_table = CliRunner().invoke(app, ["analyze", str(dump), "--config", str(config), "--dtype", "float64",
                                          "--format", "json", "--bootstrap", "0", "-q"], catch_exceptions=False)
    assert from_table.exit_code == 0, from_table.output
    for output in (result.stdout, from_table.stdout):
        ours = _keys(output)
        assert set(ours) == set(case["fp64"]["metrics"])
        assert all(close(ours[k], float(v), 1e-9, 1e-12) for k, v in case["fp64"]["metrics"].items())


@pytest.mark.parametrize("setting", ["is_correction_levl=token", "is_correction_threshold=abc",
                                     "is_correction_level=sequence", "micro_train_batch_size=0", "novalue"])
def test_bad_setting_exits_2_naming_the_fields(setting: str, tmp_path: Path) -> None:
    dump = _dump(CASES["icepop_default_band"], tmp_path)
    result = CliRunner().invoke(app, ["analyze", str(dump), "--semantics", "openrlhf", "--set", setting])
    assert result.exit_code == 2
    assert any(name in result.output for name in ("is_correction_level", "is_correction_threshold",
                                                  "micro_train_batch_size", "batch_size"))


def test_the_report_and_the_screen_name_openrlhfs_effective_fields(tmp_path: Path) -> None:
    runner = CliRunner(env={"COLUMNS": "120", "NO_COLOR": "1", "TERM": "dumb"})
    dump = _dump(CASES["icepop_default_band"], tmp_path)
    result = runner.invoke(app, ["analyze", str(dump), "--semantics", "openrlhf", "--format", "json",
                                 "--bootstrap", "0"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    # train_ppo_ray.py's defaults at 0.11.2: the correction is off, so OpenRLHF logs neither key.
    assert report["config"]["is_correction_level"] == "off"
    assert report["config"]["is_correction_threshold"] == [0.5, 5.0]
    assert report["config"]["micro_train_batch_size"] == 1
    assert not _keys(result.stdout)
    screen = runner.invoke(app, ["analyze", str(dump), "--semantics", "openrlhf", "--set",
                                 "is_correction_level=token", "--bootstrap", "0"]).stdout
    assert "correction: is_correction_level=token, is_correction_mode=mask" in screen
    assert "rollout_is_threshold" not in screen


def test_the_python_api_recipe_for_openrlhf_experiences_replays_openrlhfs_numbers(tmp_path: Path) -> None:
    """docs/python-api.md's recipe on batches shaped like OpenRLHF's `Experience` (its names, a bool mask, each
    padded to its own width), then `analyze --semantics openrlhf`: OpenRLHF's own numbers come back."""
    import numpy as np
    import torch

    import mismatch_cli

    case = CASES["icepop_band_0_8_1_25"]
    old = torch.tensor(case["old_log_prob"], dtype=torch.float64)
    rollout = torch.tensor(case["rollout_log_prob"], dtype=torch.float64)
    mask = torch.tensor(case["response_mask"]) != 0
    experiences = []
    for rows in (slice(0, 3), slice(3, 6)):  # two rollout micro-batches, trimmed to their longest row
        width = int(mask[rows].sum(dim=1).max())
        experiences.append(type("Experience", (), {"action_log_probs": old[rows, :width],
                                                   "rollout_log_probs": rollout[rows, :width],
                                                   "action_mask": mask[rows, :width]})())
    global_step = 3
    for i, e in enumerate(experiences):
        if e.rollout_log_probs is not None:
            mismatch_cli.write_dump(tmp_path / f"dumps/step_{global_step:06d}_{i:03d}.parquet",
                                    {k: getattr(e, k) for k in ("action_log_probs", "rollout_log_probs",
                                                                "action_mask")}, step=global_step, dtype="float64")
    flags = [arg for k, v in case["settings"].items() for arg in ("--set", f"{k}={_flag(v)}")]
    result = CliRunner().invoke(app, ["analyze", str(tmp_path / "dumps"), "--semantics", "openrlhf", *flags,
                                      "--dtype", "float64", "--format", "json", "--bootstrap", "0", "-q"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    ours = _keys(result.stdout)
    assert set(ours) == set(case["fp64"]["metrics"])
    assert all(close(ours[k], float(v), 1e-9, 1e-12) for k, v in case["fp64"]["metrics"].items())
    assert np.isclose(float(case["fp64"]["metrics"]["train/is_filter_ratio"]), 14 / 30)
