"""The legacy parity cases through the CLI: a parquet dump and a [correction] table per case and family."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from legacy_cases import load_legacy_cases, matches
from typer.testing import CliRunner

from mismatch_cli.cli import app

CASES = load_legacy_cases()
NUMERIC = [c for c in CASES if c.error is None]
ERRORS = [c for c in CASES if c.error is not None]
TOLERANCE = {"float64": (1e-9, 1e-12), "float32": (1e-3, 1e-5)}


def _toml(value: object) -> str:
    if value is None:
        return '"none"'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, str):
        return json.dumps(value)
    return repr(float(value))


def write(case, folder: Path) -> tuple[Path, Path]:
    batch = case.batch
    rows = [slice(a, b) for a, b in zip(batch.offsets[:-1], batch.offsets[1:], strict=True)]
    table = pa.table({
        "old_log_probs": pa.array([batch.old_log_probs[r] for r in rows], type=pa.list_(pa.float64())),
        "rollout_log_probs": pa.array([batch.rollout_log_probs[r] for r in rows], type=pa.list_(pa.float64())),
        "response_mask": pa.array([batch.response_mask[r].astype(np.float64) for r in rows],
                                  type=pa.list_(pa.float64())),
    })
    dump = folder / "case.parquet"
    pq.write_table(table, dump)
    lines = ["[correction]", f'semantics = "{case.family}"']
    lines += [f"{k} = {_toml(v)}" for k, v in case.fields.items()]
    config = folder / "mismatch.toml"
    config.write_text("\n".join(lines) + "\n")
    return dump, config


@pytest.mark.parametrize("case", NUMERIC, ids=[c.id for c in NUMERIC])
def test_cli_matches_upstream(case, tmp_path: Path) -> None:
    dump, config = write(case, tmp_path)
    result = CliRunner().invoke(app, ["analyze", str(dump), "--config", str(config), "--dtype", case.dtype,
                                      "--format", "json", "--device", "cpu"])
    assert result.exit_code == 0, result.output
    metrics = json.loads(result.stdout)["metrics"]
    ours = {k: v for k, v in metrics.items() if k.startswith(("rollout_corr/", "mismatch/"))}
    assert set(ours) == set(case.expected)
    rel, abs_ = TOLERANCE[case.dtype]
    wrong = {k: (ours[k], v) for k, v in case.expected.items()
             if not (matches(ours[k], v, rel, abs_) or (k in case.overflows and ours[k] is None))}
    assert not wrong


@pytest.mark.parametrize("case", [c for c in ERRORS if c.dtype == "float64"],
                         ids=[c.id for c in ERRORS if c.dtype == "float64"])
def test_cli_error_cases(case, tmp_path: Path) -> None:
    dump, config = write(case, tmp_path)
    result = CliRunner().invoke(app, ["analyze", str(dump), "--config", str(config), "--device", "cpu"])
    expected = 3 if "response_mask" in json.dumps(case.fields) or case.case.startswith("all_zero") else 2
    assert result.exit_code == expected, result.output
    assert isinstance(result.exception, SystemExit)
    assert result.stderr.startswith("error: ")


def test_flags_of_another_family_name_the_right_one(tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["analyze", "sample_data/single_turn.parquet", "--veto-threshold", "1e-4"])
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit)
    assert "--semantics" in result.stderr and "verl-0.7.0" in result.stderr
    result = runner.invoke(app, ["analyze", "sample_data/single_turn.parquet", "--semantics", "xtuner",
                                 "--rs", "token_k1"])
    assert result.exit_code == 2 and "--rs belongs to --semantics verl" in result.stderr
    result = runner.invoke(app, ["analyze", "sample_data/single_turn.parquet", "--semantics", "verl-0.6.0",
                                 "--is-level", "geometric", "--is-mode", "both", "--is-threshold", "2"])
    assert result.exit_code == 2 and "xtuner" in result.stderr


def test_flags_map_to_the_same_numbers_as_the_config_table(tmp_path: Path) -> None:
    runner = CliRunner()
    by_flags = runner.invoke(app, ["analyze", "sample_data/single_turn.parquet", "--semantics", "xtuner",
                                   "--is-level", "geometric", "--is-mode", "both", "--is-threshold", "1.01,0.99",
                                   "--veto-threshold", "20,1e-4", "--format", "json", "--dtype", "float64"])
    config = tmp_path / "x.toml"
    config.write_text('[correction]\nsemantics = "xtuner"\nrollout_is_level = "geometric"\nrollout_is_mode = "both"\n'
                      'rollout_is_threshold = [1.01, 0.99]\nrollout_is_veto_threshold = [20, 1e-4]\n')
    by_table = runner.invoke(app, ["analyze", "sample_data/single_turn.parquet", "--config", str(config),
                                   "--format", "json", "--dtype", "float64"])
    assert by_flags.exit_code == by_table.exit_code == 0
    a, b = json.loads(by_flags.stdout)["metrics"], json.loads(by_table.stdout)["metrics"]
    assert a == b and a["mismatch/valid"] == 1.0


def test_presets_per_family() -> None:
    runner = CliRunner()
    counts = {}
    for family in ("verl", "verl-0.8", "verl-0.7.1", "verl-0.7.0", "verl-0.6.1"):
        result = runner.invoke(app, ["presets", "--semantics", family, "--format", "json"])
        assert result.exit_code == 0
        counts[family] = {row["name"] for row in json.loads(result.stdout)["presets"]}
    assert counts["verl-0.8"] == counts["verl"] and len(counts["verl"]) == 19
    assert "decoupled_token_icepop" in counts["verl"] and "decoupled_token_icepop" not in counts["verl-0.7.1"]
    assert {"geo_rs_seq_tis", "bypass_pg_rs", "token_is", "geo_rs", "seq_is_rs"} <= counts["verl-0.7.0"]
    assert {"ppo_is_bypass", "pg_is", "pg_rs", "pure_is"} <= counts["verl-0.6.1"]
