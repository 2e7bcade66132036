"""Issue "stand on its own": a plain clone runs, the API honours presets, every JSON has a version, -q is one thing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from mismatch_cli.api import analyze
from mismatch_cli.cli import app
from mismatch_cli.correction import CorrectionConfig

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "sample_data" / "single_turn.parquet"
MULTI = ROOT / "sample_data" / "multi_turn.parquet"
runner = CliRunner(env={"NO_COLOR": None, "FORCE_COLOR": None, "MISMATCH_DEBUG": None})


def invoke(*args: object):
    return runner.invoke(app, [str(a) for a in args])


def write_dump(path: Path, old, rollout, mask) -> Path:
    table = pa.table({"old_log_probs": pa.array(old, type=pa.list_(pa.float32())),
                      "rollout_log_probs": pa.array(rollout, type=pa.list_(pa.float32())),
                      "response_mask": pa.array(mask, type=pa.list_(pa.int8()))})
    pq.write_table(table, path)
    return path


def test_no_tracked_file_reads_outside_the_repository() -> None:
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    if not tracked:  # not a git checkout (e.g. an sdist): walk the tree instead
        tracked = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.is_file() and ".venv" not in p.parts]
    outside = "../" + "shared"  # spelled in two parts so this file does not match itself
    offenders = [name for name in tracked if (ROOT / name).is_file() and name.endswith((".py", ".md", ".toml", ".sh"))
                 and outside in (ROOT / name).read_text(errors="ignore")]
    assert offenders == []


def test_python_api_applies_a_preset() -> None:
    report = analyze([str(SAMPLE)], CorrectionConfig(preset="decoupled_geo_rs_token_tis"), device="cpu", bootstrap=0)
    assert report.config["preset"] == "decoupled_geo_rs_token_tis" and report.config["rollout_is"] == "token"
    assert "rollout_corr/rollout_is_mean" in report.metrics
    assert "rollout_corr/rollout_rs_seq_mean_k1_masked_fraction" in report.metrics


def test_no_valid_token_names_the_input(tmp_path: Path) -> None:
    one = write_dump(tmp_path / "zero.parquet", [[-1.0, -2.0]], [[-1.0, -2.5]], [[0, 0]])
    result = invoke("analyze", one)
    assert result.exit_code == 3 and str(one) in result.stderr
    two = write_dump(tmp_path / "zero2.parquet", [[-1.0]], [[-1.5]], [[0]])
    result = invoke("analyze", one, two)
    assert result.exit_code == 3 and f"the 2 input files (first: {one})" in result.stderr


def test_every_json_document_has_a_schema_version(tmp_path: Path) -> None:
    base = write_dump(tmp_path / "a.parquet", [[-1.0, -2.0, -0.5]], [[-1.1, -2.0, -0.4]], [[1, 1, 1]])
    candidate = write_dump(tmp_path / "b.parquet", [[-1.0, -2.0, -0.5]], [[-1.3, -2.4, -0.4]], [[1, 1, 1]])
    common = ("--device", "cpu", "--bootstrap", "0")
    documents = {
        "analyze": invoke("analyze", base, "--format", "json", *common).stdout,
        "compare": invoke("compare", base, candidate, "--format", "json", "--out-dir", tmp_path / "cmp",
                          "--no-plots", *common).stdout,
        "check": invoke("check", base, "--fail-on", "diag/valid_tokens>=1", "--format", "json", *common).stdout,
        "presets": invoke("presets", "--format", "json").stdout,
        "compare.json": (tmp_path / "cmp" / "compare.json").read_text(),
    }
    for name, text in documents.items():
        assert json.loads(text)["schema_version"] == 1, name


@pytest.mark.parametrize("argv", [
    # Asymmetric k1 bounds make the report carry a warning.
    ("analyze", str(MULTI), "--rs", "token_k1", "--rs-threshold", "0.5_1.5", "--device", "cpu", "--bootstrap", "0"),
    ("analyze", str(MULTI), "--format", "json", "--device", "cpu", "--bootstrap", "0"),
    ("check", str(MULTI), "--fail-on", "diag/valid_tokens>=1", "--device", "cpu", "--bootstrap", "0"),
    ("presets", "--semantics", "xtuner"),
])
def test_quiet_means_the_requested_output_and_errors_only(argv: tuple[str, ...]) -> None:
    loud, quiet = invoke(*argv), invoke(*argv, "-q")
    assert loud.exit_code == quiet.exit_code == 0
    assert quiet.stderr == ""
    if argv[0] == "analyze" and "json" not in argv:
        assert "warning:" in loud.stdout and "warning:" not in quiet.stdout
    if argv[0] != "presets":
        assert quiet.stdout.strip()  # the requested output is still printed


def test_quiet_writes_files_without_notes(tmp_path: Path) -> None:
    result = invoke("synth", tmp_path / "s.parquet", "--tokens", "2000", "-q")
    assert result.exit_code == 0 and result.stderr == "" and (tmp_path / "s.parquet").exists()
    result = invoke("convert", tmp_path / "s.parquet", "-o", tmp_path / "c.parquet", "-q")
    assert result.exit_code == 0 and result.stderr == "" and (tmp_path / "c.parquet").exists()


def test_every_command_documents_the_same_quiet() -> None:
    from mismatch_cli.cli import QUIET_HELP

    for command in ("analyze", "compare", "check", "presets", "synth", "convert"):
        text = " ".join(invoke(command, "--help").stdout.split())
        assert " ".join(QUIET_HELP.split())[:40] in text, command


def test_verl_08_from_the_command_line(tmp_path: Path) -> None:
    # One row whose raw per-sequence mean weight is e^1 > U = 2: verl 0.9 counts it high, 0.8 cannot.
    dump = write_dump(tmp_path / "d.parquet", [[0.0, 0.0]], [[-1.0, -1.0]], [[1, 1]])
    fractions = {}
    for semantics in ("verl", "verl-0.8"):
        result = invoke("analyze", dump, "--semantics", semantics, "--is", "token", "--is-threshold", "2",
                        "--format", "json", "--device", "cpu", "--dtype", "float64")
        assert result.exit_code == 0, result.output
        document = json.loads(result.stdout)
        assert document["config"]["semantics"] == semantics
        fractions[semantics] = document["metrics"]["rollout_corr/rollout_is_seq_fraction_high"]
    assert fractions == {"verl": 1.0, "verl-0.8": 0.0}
    refused = invoke("analyze", dump, "--semantics", "verl-0.8", "--veto-threshold", "1e-4")
    assert refused.exit_code == 2 and "verl-0.7.0" in refused.stderr


def test_xtuner_refuses_a_float_mask() -> None:
    result = invoke("analyze", SAMPLE, "--semantics", "xtuner", "--is-threshold", "2,0.5", "--mask-dtype", "float")
    assert result.exit_code == 2 and "bool mask" in result.stderr and "fix:" in result.stderr


def test_tomli_is_declared_where_tomllib_is_missing() -> None:
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["requires-python"] == ">=3.10"
    assert any(dep.replace(" ", "").startswith("tomli>=") and "python_version<'3.11'" in dep.replace(" ", "")
               for dep in project["dependencies"])


def test_report_tables_are_dataframes() -> None:
    report = analyze([str(MULTI)], device="cpu", bootstrap=0)
    rounds = report.table("rounds")
    assert list(rounds["round"]) == list(range(len(report.rounds)))
    assert np.allclose(rounds["abs_diff_mean"], [r["abs_diff_mean"] for r in report.rounds])
    metrics = report.table("metrics").set_index("metric")["value"]
    assert metrics["rollout_corr/kl"] == report.metrics["rollout_corr/kl"]
    with pytest.raises(KeyError):
        report.table("nope")


def test_help_runs_without_reading_outside_files() -> None:
    proc = subprocess.run([sys.executable, "-m", "mismatch_cli", "--help"], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0 and "Exit codes" in proc.stdout


def test_compare_and_check_take_the_family_flags(tmp_path: Path) -> None:
    base = write_dump(tmp_path / "a.parquet", [[-1.0, -2.0, -0.5]], [[-1.1, -2.0, -0.4]], [[1, 1, 1]])
    family = ("--semantics", "verl-0.6.0", "--is-level", "geometric", "--is-threshold", "2", "--device", "cpu",
              "--bootstrap", "0")
    result = invoke("check", base, "--fail-on", "mismatch/rollout_is_mean>=0", "--format", "json", *family)
    assert result.exit_code == 0, result.output
    result = invoke("compare", base, base, "--format", "json", *family)
    assert result.exit_code == 0, result.output
    assert any(row["metric"].startswith("mismatch/") for row in json.loads(result.stdout)["metrics"])
    refused = invoke("check", base, "--fail-on", "rollout_corr/kl<=1", "--veto-threshold", "1e-4")
    assert refused.exit_code == 2 and "--semantics" in refused.stderr
