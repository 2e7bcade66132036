"""`--semantics prime-rl` through the command line: `--set FIELD=VALUE`, the `[correction]` table, exit 2 on bad fields.

Without an `advantages` column the default loss's keys are null with a note; with one they match prime-rl.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import REFERENCE, close
from typer.testing import CliRunner

from mismatch_cli.cli import app

CASES = {c["name"]: c for c in json.loads((REFERENCE / "prime_rl_parity_cases.json").read_text())["cases"]}
SHARES = ("is_masked", "is_masked_low", "is_masked_high", "masked_advantage_positive", "masked_advantage_negative")


def _dump(case: dict, folder: Path, advantages: bool = False) -> Path:
    columns = [("old_log_probs", "old_log_prob"), ("rollout_log_probs", "rollout_log_prob"),
               ("response_mask", "response_mask")]
    if advantages:
        columns.append(("advantages", "advantages"))
    table = pa.table({name: pa.array(case[key], type=pa.list_(pa.float64())) for name, key in columns})
    path = folder / "case.parquet"
    pq.write_table(table, path)
    return path


def _keys(output: str, reference: dict) -> dict:
    return {k: v for k, v in json.loads(output)["metrics"].items() if k in reference}


def _analyze(args: list[str]):
    return CliRunner().invoke(app, ["analyze", *args, "--dtype", "float64", "--format", "json", "--bootstrap", "0",
                                    "-q"], catch_exceptions=False)


def _runs(case: dict, dump: Path, folder: Path) -> list[str]:
    """The case's settings given with --set, then as a `[correction]` table; both outputs."""
    flags = [arg for k, v in case["settings"].items() for arg in ("--set", f"{k}={v}")]
    result = _analyze([str(dump), "--semantics", "prime-rl", *flags])
    assert result.exit_code == 0, result.output
    config = folder / "mismatch.toml"
    config.write_text("[correction]\nsemantics = \"prime-rl\"\n" + "".join(
        f"{k} = {json.dumps(v)}\n" for k, v in case["settings"].items()))
    from_table = _analyze([str(dump), "--config", str(config)])
    assert from_table.exit_code == 0, from_table.output
    return [result.stdout, from_table.stdout]


def _matches(ours: dict, reference: dict) -> bool:
    return all(close(ours[k], float(v), 5e-7 if k.split("/")[0] in SHARES else 1e-9, 1e-12)
               for k, v in reference.items())


@pytest.mark.parametrize("name", ["ipo_threshold", "ipo_defaults", "large_moves_ipo"])
def test_ipo_keys_through_set_and_config_table(name: str, tmp_path: Path) -> None:
    case = CASES[name]
    reference = case["fp64"]["metrics"]
    for output in _runs(case, _dump(case, tmp_path), tmp_path):
        ours = _keys(output, reference)
        assert set(ours) == set(reference) and _matches(ours, reference)


@pytest.mark.parametrize("name", ["asymmetric_band", "defaults"])
def test_default_loss_without_advantages(name: str, tmp_path: Path) -> None:
    case = CASES[name]
    reference = case["fp64"]["metrics"]
    for output in _runs(case, _dump(case, tmp_path), tmp_path):
        ours = _keys(output, reference)
        assert set(ours) == set(reference)
        kl = {k: v for k, v in reference.items() if k.startswith("mismatch_kl/all/")}
        assert _matches(ours, kl)
        assert all(ours[k] is None for k in reference if k not in kl)
        warnings = json.loads(output)["warnings"]
        assert any("needs per-token advantages (column `advantages`)" in note for note in warnings)


@pytest.mark.parametrize("name", ["asymmetric_band", "defaults", "token_advantages", "zero_thresholds"])
def test_default_loss_with_an_advantages_column(name: str, tmp_path: Path) -> None:
    case = CASES[name]
    reference = case["fp64"]["metrics"]
    for output in _runs(case, _dump(case, tmp_path, advantages=True), tmp_path):
        ours = _keys(output, reference)
        assert set(ours) == set(reference) and _matches(ours, reference)


@pytest.mark.parametrize("setting", ["dppo_mask_hgh=0.3", "dppo_mask_high=abc", "dppo_mask_low=-0.1", "type=dppo",
                                     "ipo_threshold=0.3", "type=custom", "novalue"])
def test_bad_setting_exits_2_naming_the_fields(setting: str, tmp_path: Path) -> None:
    dump = _dump(CASES["defaults"], tmp_path)
    result = CliRunner().invoke(app, ["analyze", str(dump), "--semantics", "prime-rl", "--set", setting])
    assert result.exit_code == 2, result.output
    assert any(name in result.output for name in ("dppo_mask_high", "dppo_mask_low", "type", "ipo_threshold"))


def test_the_report_and_the_screen_name_prime_rls_effective_fields(tmp_path: Path) -> None:
    runner = CliRunner(env={"COLUMNS": "120", "NO_COLOR": "1", "TERM": "dumb"})
    dump = _dump(CASES["defaults"], tmp_path)
    result = runner.invoke(app, ["analyze", str(dump), "--semantics", "prime-rl", "--format", "json",
                                 "--bootstrap", "0"])
    assert result.exit_code == 0, result.output
    config = json.loads(result.stdout)["config"]
    # DefaultLossConfig's defaults at 559b447 (docs/prime-rl-semantics.md §2).
    assert config["type"] == "default" and config["dppo_mask_low"] == 0.2 and config["dppo_mask_high"] == 0.2
    assert "ipo_threshold" not in config
    screen = runner.invoke(app, ["analyze", str(dump), "--semantics", "prime-rl", "--set", "type=ipo",
                                 "--bootstrap", "0"]).stdout
    assert "correction: type=ipo, ipo_threshold=0.1" in screen
    assert "rollout_is_threshold" not in screen
