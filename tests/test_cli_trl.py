"""`--semantics trl` through the command line: `--set FIELD=VALUE`, the `[correction]` table, exit 2 on bad fields."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import REFERENCE, close
from helpers import case_dump as _dump
from typer.testing import CliRunner

from mismatch_cli.cli import app

CASES = {c["name"]: c for c in json.loads((REFERENCE / "trl_parity_cases.json").read_text())["cases"]}


def _keys(output: str) -> dict:
    return {k: v for k, v in json.loads(output)["metrics"].items() if k.startswith("sampling/")}


@pytest.mark.parametrize("name", ["token_truncate_band", "sequence_mask_min_only", "deprecated_cap"])
def test_set_and_config_table_match_trl(name: str, tmp_path: Path) -> None:
    case = CASES[name]
    dump = _dump(case, tmp_path)
    settings = [f"{k}={'none' if v is None else v}" for k, v in case["settings"].items()]
    flags = [arg for s in settings for arg in ("--set", s)]
    result = CliRunner().invoke(app, ["analyze", str(dump), "--semantics", "trl", *flags, "--dtype", "float64",
                                      "--format", "json", "--bootstrap", "0", "-q"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    config = tmp_path / "mismatch.toml"
    config.write_text("[correction]\nsemantics = \"trl\"\n" + "".join(
        f"{k} = {json.dumps('none' if v is None else v)}\n" for k, v in case["settings"].items()))
    from_table = CliRunner().invoke(app, ["analyze", str(dump), "--config", str(config), "--dtype", "float64",
                                          "--format", "json", "--bootstrap", "0", "-q"], catch_exceptions=False)
    assert from_table.exit_code == 0, from_table.output
    for output in (result.stdout, from_table.stdout):
        ours = _keys(output)
        assert all(close(ours[k], v, 1e-9, 1e-12) for k, v in case["fp64"]["metrics"].items())


@pytest.mark.parametrize("setting", ["vllm_importance_sampling_clip_mx=2", "vllm_importance_sampling_clip_max=abc",
                                     "vllm_importance_sampling_correction=maybe", "novalue"])
def test_bad_setting_exits_2_naming_the_fields(setting: str, tmp_path: Path) -> None:
    dump = _dump(CASES["defaults"], tmp_path)
    result = CliRunner().invoke(app, ["analyze", str(dump), "--semantics", "trl", "--set", setting])
    assert result.exit_code == 2
    assert "vllm_importance_sampling_mode" in result.output


def test_the_report_and_the_screen_name_trls_effective_fields(tmp_path: Path) -> None:
    runner = CliRunner(env={"COLUMNS": "120", "NO_COLOR": "1", "TERM": "dumb"})
    dump = _dump(next(iter(CASES.values())), tmp_path)
    result = runner.invoke(app, ["analyze", str(dump), "--semantics", "trl", "--format", "json", "--bootstrap", "0"])
    assert result.exit_code == 0, result.output
    config = json.loads(result.stdout)["config"]
    # GRPOConfig's defaults at 1.16.0 (docs/trl-semantics.md): sequence_mask, clip_max 3.0, no clip_min.
    assert config["vllm_importance_sampling_mode"] == "sequence_mask"
    assert config["vllm_importance_sampling_clip_max"] == 3.0 and config["vllm_importance_sampling_clip_min"] is None
    screen = runner.invoke(app, ["analyze", str(dump), "--semantics", "trl", "--set",
                                 "vllm_importance_sampling_mode=token_truncate", "--bootstrap", "0"]).stdout
    assert "correction: vllm_importance_sampling_mode=token_truncate, vllm_importance_sampling_clip_max=3.0" in screen
    assert "rollout_is_threshold" not in screen


@pytest.mark.parametrize("name", ["uneven_processes_token_mask", "process_without_tokens_sequence_mask",
                                  "two_processes_token_truncate"])
def test_a_process_index_column_reproduces_trls_mean_over_processes(name: str, tmp_path: Path) -> None:
    case = CASES[name]
    ranks = [next(rank for rank, rows in enumerate(case["processes"]) if row in rows)
             for row in range(len(case["response_mask"]))]
    dump = _dump(case, tmp_path)
    pq.write_table(pq.read_table(dump).append_column("process_index", pa.array(ranks, type=pa.int64())), dump)
    settings = [arg for k, v in case["settings"].items() for arg in ("--set", f"{k}={v}")]
    result = CliRunner().invoke(app, ["analyze", str(dump), "--semantics", "trl", *settings, "--dtype", "float64",
                                      "--format", "json", "--bootstrap", "0", "-q"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    ours = _keys(result.stdout)
    assert all(close(ours[k], float(v), 1e-9, 1e-12) for k, v in case["fp64"]["metrics"].items()), ours


def test_a_null_process_index_names_its_row(tmp_path: Path) -> None:
    dump = _dump(CASES["defaults"], tmp_path)
    rows = len(CASES["defaults"]["response_mask"])
    pq.write_table(pq.read_table(dump).append_column(
        "process_index", pa.array([0] * (rows - 1) + [None], type=pa.int64())), dump)
    result = CliRunner().invoke(app, ["analyze", str(dump), "--semantics", "trl"])
    assert result.exit_code == 3
    assert f"row {rows - 1}" in result.output and "process_index" in result.output


def test_a_clip_max_not_above_zero_is_replayed_with_a_warning(tmp_path: Path) -> None:
    """GRPOConfig only checks clip_min < clip_max, so a cap of -1 is TRL's to run: we replay it and say what it does."""
    dump = _dump(CASES["defaults"], tmp_path)
    result = CliRunner().invoke(app, ["analyze", str(dump), "--semantics", "trl", "--set",
                                      "vllm_importance_sampling_mode=token_truncate", "--set",
                                      "vllm_importance_sampling_clip_max=-1", "--format", "json", "--bootstrap", "0",
                                      "-q"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["metrics"]["sampling/importance_sampling_ratio/max"] == -1.0  # min(ratio, -1), as TRL clamps
    assert any("clip_max = -1 is not above 0" in warning for warning in report["warnings"])
