"""The `mismatch` command line: exit codes, messages, output formats, values against numpy float64."""

from __future__ import annotations

import ast
import hashlib
import importlib.metadata
import json
import math
import re
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import typer
from safetensors.numpy import load_file
from typer.testing import CliRunner

from mismatch_cli.cli import app

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "sample_data" / "single_turn.parquet"
PACKED = ROOT / "sample_data" / "packed.safetensors"

OFFPOLICY_KEYS = {
    "rollout_corr/" + k
    for k in (
        "training_ppl",
        "training_log_ppl",
        "kl",
        "k3_kl",
        "rollout_ppl",
        "rollout_log_ppl",
        "log_ppl_diff",
        "log_ppl_abs_diff",
        "log_ppl_diff_max",
        "log_ppl_diff_min",
        "ppl_ratio",
        "chi2_token",
        "chi2_seq",
    )
}
# Environment variables that change how rich renders; each test sets what it needs.
CLEAN_ENV = {"NO_COLOR": None, "FORCE_COLOR": None, "TTY_COMPATIBLE": None, "MISMATCH_DEBUG": None}

runner = CliRunner(env=CLEAN_ENV)


def invoke(*args: str, env: dict | None = None):
    return runner.invoke(app, [str(a) for a in args], env=env)


# --------------------------------------------------------------------------------------------- data


def write_dump(path: Path, old, rollout, mask, steps=None, mask_type=pa.int8(), names=None) -> Path:
    """A wide parquet dump with list<double> log-probs (and list<mask_type> mask)."""
    names = names or ("old_log_probs", "rollout_log_probs", "response_mask")
    columns = {}
    if old is not None:
        columns[names[0]] = pa.array(old, type=pa.list_(pa.float64()))
    if rollout is not None:
        columns[names[1]] = pa.array(rollout, type=pa.list_(pa.float64()))
    if mask is not None:
        columns[names[2]] = pa.array(mask, type=pa.list_(mask_type))
    if steps is not None:
        columns["step"] = pa.array(steps, type=pa.int64())
    pq.write_table(pa.table(columns), path)
    return path


# Row 2 is empty (mask all zero); masks have gaps; values are exact binary fractions where possible.
PLAIN_OLD = [[-0.5, -1.25, -2.0, -0.01], [-0.125], [-3.5, -0.25, -1.0], [-0.1, -0.3], [-0.0625, -1.5, -0.7]]
PLAIN_ROLLOUT = [[-0.625, -1.0, -2.5, -0.02], [-0.25], [-3.0, -0.375, -1.0], [-0.2, -0.35], [-0.125, -1.75, -0.9]]
PLAIN_MASK = [[0, 1, 1, 1], [1], [0, 0, 0], [1, 1], [1, 0, 1]]
# Same, with one token whose log-ratio old - rollout = 21.9 exceeds verl's safety bound of 20.
CLIPPED_ROLLOUT = [r[:] for r in PLAIN_ROLLOUT]
CLIPPED_ROLLOUT[3][0] = -22.0


def reference_offpolicy(old_rows, rollout_rows, mask_rows) -> dict[str, float]:
    """verl's off-policy formulas (docs/verl-semantics.md §2) in numpy float64, row by row."""
    deltas, row_mean_old = [], []
    for old, rollout, mask in zip(old_rows, rollout_rows, mask_rows, strict=True):
        old, rollout, m = np.asarray(old, float), np.asarray(rollout, float), np.asarray(mask) != 0
        deltas.append(old[m] - rollout[m])
        row_mean_old.append(old[m].sum() / (m.sum() + 1e-8))  # 0 for an empty row
    d = np.concatenate(deltas)
    n = d.size
    return {
        "rollout_corr/kl": float(np.sum(-d) / (n + 1e-8)),
        "rollout_corr/k3_kl": float(np.sum(np.exp(d) - d - 1.0) / (n + 1e-8)),
        "rollout_corr/chi2_token": float(np.sum(np.exp(2.0 * np.clip(d, -20.0, 20.0))) / (n + 1e-8) - 1.0),
        "rollout_corr/training_ppl": float(np.mean(np.exp(-np.asarray(row_mean_old)))),
    }


@pytest.fixture
def small_dump(tmp_path) -> Path:
    return write_dump(tmp_path / "small.parquet", PLAIN_OLD, PLAIN_ROLLOUT, PLAIN_MASK)


def sample_arrays(path: Path = SAMPLE):
    """The sample's rows as numpy float64, read directly with pyarrow."""
    table = pq.read_table(path)
    old = [np.asarray(r, dtype=np.float64) for r in table["old_log_probs"].to_pylist()]
    rollout = [np.asarray(r, dtype=np.float64) for r in table["rollout_log_probs"].to_pylist()]
    mask = [np.asarray(r) != 0 for r in table["response_mask"].to_pylist()]
    steps = table["step"].to_numpy() if "step" in table.column_names else None
    return old, rollout, mask, steps


def token_mean_kl(old, rollout, mask) -> float:
    d = np.concatenate([r[m] - o[m] for o, r, m in zip(old, rollout, mask, strict=True)])
    return float(d.sum() / (d.size + 1e-8))


# ------------------------------------------------------------------------------------------ helpers


def assert_ok(result) -> None:
    assert result.exit_code == 0, (result.exit_code, result.output, result.exception)
    assert result.exception is None


def assert_error(result, code: int, *needles: str) -> str:
    """Exit `code` through SystemExit (never a crash), with one `error:` line naming `needles`."""
    assert result.exit_code == code, (result.exit_code, result.output, result.exception)
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    message = lines[0]
    assert message.startswith(("error:", "internal error:")), message
    for needle in needles:
        assert needle in message, (needle, message)
    assert "Traceback" not in result.output
    return message


def analyze_json(*args: str) -> dict:
    result = invoke("analyze", *args, "--format", "json", "--device", "cpu")
    assert_ok(result)
    return json.loads(result.stdout)


# -------------------------------------------------------------------------------------------- exit 0


def test_analyze_table():
    result = invoke("analyze", SAMPLE, "--device", "cpu", "--full")
    assert_ok(result)
    assert "Health" in result.stdout
    assert "kl" in result.stdout and "chi2_token" in result.stdout
    expected = token_mean_kl(*sample_arrays()[:3])
    # The table shows kl (about -6e-05) with 3 significant digits in scientific notation.
    assert abs(expected) < 1e-3
    assert f"{expected:.2e}" in result.stdout


def test_analyze_json_report():
    report = analyze_json(str(SAMPLE))
    assert isinstance(report["schema_version"], int)
    assert report["tool"]["name"] == "mismatch"
    assert report["tool"]["version"] == importlib.metadata.version("mismatch-cli")
    assert datetime.fromisoformat(report["created_at"]).tzinfo is not None

    old, rollout, mask, _ = sample_arrays()
    [entry] = report["inputs"]
    assert entry["path"].endswith("single_turn.parquet")
    assert entry["format"] == "parquet"
    assert entry["bytes"] == SAMPLE.stat().st_size
    assert entry["sha256"] == hashlib.sha256(SAMPLE.read_bytes()).hexdigest()
    assert entry["sequences"] == len(old)
    assert entry["tokens"] == int(sum(m.sum() for m in mask))

    config = report["config"]
    assert config["rollout_is"] is None and config["rollout_rs"] is None
    assert config["dtype"] == "float32" and config["device"] == "cpu"

    metrics = report["metrics"]
    assert OFFPOLICY_KEYS <= set(metrics)
    assert not any(k.startswith(("rollout_corr/rollout_is", "rollout_corr/rollout_rs")) for k in metrics)
    assert all(metrics[k] is None or isinstance(metrics[k], (int, float)) for k in metrics)
    # float32 compute: the spec's float32 tolerance against numpy float64.
    expected = token_mean_kl(old, rollout, mask)
    assert abs(metrics["rollout_corr/kl"] - expected) <= 1e-3 * abs(expected) + 1e-5

    assert report["summary"]["status"] in ("healthy", "warning")
    kl_check = next(c for c in report["summary"]["checks"] if c["metric"] == "rollout_corr/kl")
    assert kl_check["ok"] is (abs(metrics["rollout_corr/kl"]) <= 0.1)
    assert report["data_quality"]["totals"]["empty_rows"] == sum(int(m.sum() == 0) for m in mask)
    assert report["data_quality"]["totals"]["masked_tokens"] == entry["tokens"]
    assert isinstance(report["warnings"], list)


def test_analyze_markdown():
    result = invoke("analyze", SAMPLE, "--format", "markdown", "--device", "cpu")
    assert_ok(result)
    assert result.stdout.lstrip().startswith("#")
    assert "|---|" in result.stdout
    assert "| kl |" in result.stdout
    assert "\x1b" not in result.stdout


def test_output_file(tmp_path):
    out = tmp_path / "nested" / "report.json"
    result = invoke("analyze", SAMPLE, "--format", "json", "-o", out, "--device", "cpu")
    assert_ok(result)
    assert result.stdout.strip() == ""
    assert str(out) in result.stderr
    report = json.loads(out.read_text())
    assert report["inputs"][0]["sha256"] == hashlib.sha256(SAMPLE.read_bytes()).hexdigest()


def test_output_file_markdown(tmp_path):
    out = tmp_path / "report.md"
    result = invoke("analyze", SAMPLE, "--format", "markdown", "--output", out, "--device", "cpu")
    assert_ok(result)
    assert result.stdout.strip() == ""
    assert "| kl |" in out.read_text()


def test_out_dir(tmp_path):
    out_dir = tmp_path / "run"
    result = invoke("analyze", SAMPLE, "--out-dir", out_dir, "--device", "cpu", "--format", "markdown")
    assert_ok(result)
    report = json.loads((out_dir / "report.json").read_text())
    assert OFFPOLICY_KEYS <= set(report["metrics"])
    assert report["inputs"][0]["sequences"] == pq.ParquetFile(SAMPLE).metadata.num_rows
    assert not [p for p in out_dir.iterdir() if p.name.endswith(".tmp")]


def test_json_stdout_is_only_json(small_dump):
    """Warnings go to stderr so that `--format json` can be piped (asymmetric k1 bounds warn)."""
    result = invoke(
        "analyze", small_dump, "--rs", "seq_mean_k1", "--rs-threshold", "0.5_1.5", "--format", "json", "-o", "-",
        "--device", "cpu",
    )
    assert_ok(result)
    report = json.loads(result.stdout)
    assert report["warnings"]
    assert "warning:" in result.stderr
    assert "warning:" not in result.stdout.replace('"warnings"', "")


def test_help_documents_exit_codes():
    result = invoke("--help")
    assert_ok(result)
    for command in ("analyze", "presets", "synth"):
        assert command in result.stdout
    text = " ".join(result.stdout.split())
    for code, word in enumerate(("ran", "a threshold", "usage", "input", "internal")):
        assert re.search(rf"\b{code} {word}", text), (code, word)
    assert "MISMATCH_DEBUG=1" in text


def test_preset(small_dump):
    report = analyze_json(str(small_dump), "--preset", "decoupled_geo_rs_token_tis")
    config = report["config"]
    # verl's RolloutCorrectionConfig.decoupled_geo_rs_token_tis() defaults.
    assert config["preset"] == "decoupled_geo_rs_token_tis"
    assert config["rollout_is"] == "token"
    assert config["rollout_is_threshold"] == 2.0
    assert config["rollout_rs"] == "seq_mean_k1"
    assert config["rollout_rs_threshold"] == "0.999_1.001"
    assert "rollout_corr/rollout_is_mean" in report["metrics"]
    assert "rollout_corr/rollout_rs_seq_mean_k1_masked_fraction" in report["metrics"]
    assert OFFPOLICY_KEYS <= set(report["metrics"])


def test_by_step_float64():
    report = analyze_json(str(SAMPLE), "--by", "step", "--dtype", "float64")
    old, rollout, mask, steps = sample_arrays()
    distinct = sorted(set(steps.tolist()))
    assert len(distinct) > 1
    assert [s["step"] for s in report["steps"]] == distinct
    for entry in report["steps"]:
        rows = np.flatnonzero(steps == entry["step"])
        expected = token_mean_kl([old[i] for i in rows], [rollout[i] for i in rows], [mask[i] for i in rows])
        assert entry["metrics"]["rollout_corr/kl"] == pytest.approx(expected, rel=1e-9, abs=1e-12)
        assert entry["valid_tokens"] == sum(int(mask[i].sum()) for i in rows)
    # The overall batch is still reported.
    assert report["metrics"]["rollout_corr/kl"] == pytest.approx(token_mean_kl(old, rollout, mask), rel=1e-9)


def test_by_step_float32():
    report = analyze_json(str(SAMPLE), "--by", "step")
    old, rollout, mask, steps = sample_arrays()
    assert len(report["steps"]) == len(set(steps.tolist()))
    for entry in report["steps"]:
        rows = np.flatnonzero(steps == entry["step"])
        expected = token_mean_kl([old[i] for i in rows], [rollout[i] for i in rows], [mask[i] for i in rows])
        assert entry["metrics"]["rollout_corr/kl"] == pytest.approx(expected, rel=1e-6)


def test_safetensors_input():
    report = analyze_json(str(PACKED), "--dtype", "float64")
    tensors = load_file(str(PACKED))
    lengths = tensors["num_tokens"].astype(np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    old = tensors["old_log_probs"].astype(np.float64)
    rollout = tensors["rollout_log_probs"].astype(np.float64)
    mask = tensors["response_mask"] != 0
    [entry] = report["inputs"]
    assert entry["format"] == "safetensors"
    assert entry["sequences"] == len(lengths)
    assert entry["tokens"] == int(mask.sum())
    rows = [slice(a, b) for a, b in zip(offsets[:-1], offsets[1:], strict=True)]
    expected = token_mean_kl([old[s] for s in rows], [rollout[s] for s in rows], [mask[s] for s in rows])
    assert report["metrics"]["rollout_corr/kl"] == pytest.approx(expected, rel=1e-9, abs=1e-12)


def _two_dumps(folder: Path) -> tuple[Path, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    a = write_dump(folder / "a.parquet", PLAIN_OLD, PLAIN_ROLLOUT, PLAIN_MASK)
    b = write_dump(folder / "b.parquet", PLAIN_OLD[:2], CLIPPED_ROLLOUT[:2], [[1, 1, 1, 1], [1]])
    (folder / "notes.txt").write_text("not a dump")
    return a, b


def _check_two_dumps(report: dict, a: Path, b: Path) -> None:
    assert [Path(i["path"]).name for i in report["inputs"]] == [a.name, b.name]
    assert [i["sequences"] for i in report["inputs"]] == [5, 2]
    assert [i["tokens"] for i in report["inputs"]] == [sum(map(sum, PLAIN_MASK)), 5]
    # Concatenated as one batch: numpy over both files' rows.
    expected = reference_offpolicy(
        PLAIN_OLD + PLAIN_OLD[:2], PLAIN_ROLLOUT + CLIPPED_ROLLOUT[:2], PLAIN_MASK + [[1, 1, 1, 1], [1]]
    )
    assert report["metrics"]["rollout_corr/kl"] == pytest.approx(expected["rollout_corr/kl"], rel=1e-9)


def test_folder_input(tmp_path):
    a, b = _two_dumps(tmp_path / "dumps")
    report = analyze_json(str(tmp_path / "dumps"), "--dtype", "float64")
    _check_two_dumps(report, a, b)


def test_glob_input(tmp_path):
    a, b = _two_dumps(tmp_path / "dumps")
    report = analyze_json(str(tmp_path / "dumps" / "*.parquet"), "--dtype", "float64")
    _check_two_dumps(report, a, b)


def test_presets_json():
    result = invoke("presets", "--format", "json")
    assert_ok(result)
    document = json.loads(result.stdout)
    assert document["schema_version"] == 1 and document["semantics"] == "verl"
    rows = document["presets"]
    assert len(rows) == 19
    names = {r["name"] for r in rows}
    assert len(names) == 19
    assert {"decoupled_token_is", "bypass_pg_geo_rs_token_tis", "decoupled_geo_rs"} <= names
    by_name = {r["name"]: r for r in rows}
    assert by_name["decoupled_token_is"]["rollout_is"] == "token"
    assert by_name["decoupled_token_is"]["rollout_is_threshold"] == 2.0
    assert by_name["bypass_pg_geo_rs_token_tis"]["bypass_mode"] is True
    assert by_name["bypass_pg_geo_rs_token_tis"]["loss_type"] == "reinforce"


def test_presets_markdown():
    result = invoke("presets", "--format", "markdown")
    assert_ok(result)
    lines = [line for line in result.stdout.splitlines() if line.startswith("|")]
    assert lines[1].startswith("|---")
    assert len(lines) == 2 + 19
    assert any(line.startswith("| decoupled_token_is |") for line in lines)


def test_synth_then_analyze(tmp_path):
    out = tmp_path / "synth.parquet"
    result = invoke("synth", out, "--tokens", "2000")
    assert_ok(result)
    assert "wrote" in result.stderr
    table = pq.read_table(out)
    mask = table["response_mask"].combine_chunks().flatten().to_numpy()
    report = analyze_json(str(out))
    assert report["inputs"][0]["sequences"] == table.num_rows
    assert report["inputs"][0]["tokens"] == int(np.count_nonzero(mask))
    assert 1000 <= report["inputs"][0]["tokens"] <= 4000


def test_version():
    result = invoke("--version")
    assert_ok(result)
    assert result.stdout.strip() == f"mismatch {importlib.metadata.version('mismatch-cli')}"


def test_python_m_version():
    proc = subprocess.run(
        [sys.executable, "-m", "mismatch_cli", "--version"], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"mismatch {importlib.metadata.version('mismatch-cli')}"


def test_no_plots_accepted(small_dump, tmp_path):
    report = analyze_json(str(small_dump), "--no-plots", "--out-dir", str(tmp_path / "out"))
    assert report["inputs"][0]["sequences"] == 5
    assert not list((tmp_path / "out").glob("*.png"))


# ------------------------------------------------------------------------------- values, hand-built


@pytest.mark.parametrize("rollout_rows", [PLAIN_ROLLOUT, CLIPPED_ROLLOUT], ids=["plain", "clipped"])
def test_offpolicy_values_float64(tmp_path, rollout_rows):
    path = write_dump(tmp_path / "hand.parquet", PLAIN_OLD, rollout_rows, PLAIN_MASK)
    metrics = analyze_json(str(path), "--dtype", "float64")["metrics"]
    for key, expected in reference_offpolicy(PLAIN_OLD, rollout_rows, PLAIN_MASK).items():
        assert metrics[key] == pytest.approx(expected, rel=1e-9, abs=1e-12), key


def test_chi2_token_uses_the_safety_clamp(tmp_path):
    """Guard on the reference: the clipped case really differs from the unclamped formula."""
    ref = reference_offpolicy(PLAIN_OLD, CLIPPED_ROLLOUT, PLAIN_MASK)
    path = write_dump(tmp_path / "hand.parquet", PLAIN_OLD, CLIPPED_ROLLOUT, PLAIN_MASK)
    chi2 = analyze_json(str(path), "--dtype", "float64")["metrics"]["rollout_corr/chi2_token"]
    d = np.concatenate(
        [np.asarray(o)[np.asarray(m) != 0] - np.asarray(r)[np.asarray(m) != 0]
         for o, r, m in zip(PLAIN_OLD, CLIPPED_ROLLOUT, PLAIN_MASK, strict=True)]
    )
    unclamped = float(np.mean(np.exp(2 * d)) - 1)
    assert chi2 == pytest.approx(ref["rollout_corr/chi2_token"], rel=1e-9)
    assert not math.isclose(chi2, unclamped, rel_tol=1e-3)


def test_offpolicy_values_float32(small_dump):
    metrics = analyze_json(str(small_dump))["metrics"]
    for key, expected in reference_offpolicy(PLAIN_OLD, PLAIN_ROLLOUT, PLAIN_MASK).items():
        assert abs(metrics[key] - expected) <= 1e-3 * abs(expected) + 1e-5, key


def test_empty_rows_count_in_training_ppl(small_dump):
    """The empty row 2 contributes exp(0) = 1 to the row mean (5 rows, not 4)."""
    metrics = analyze_json(str(small_dump), "--dtype", "float64")["metrics"]
    valid_rows = [i for i, m in enumerate(PLAIN_MASK) if any(m)]
    per_row = [
        math.exp(-sum(o for o, k in zip(PLAIN_OLD[i], PLAIN_MASK[i], strict=True) if k) / (sum(PLAIN_MASK[i]) + 1e-8))
        for i in valid_rows
    ]
    assert metrics["rollout_corr/training_ppl"] == pytest.approx((sum(per_row) + 1.0) / 5, rel=1e-9)
    assert metrics["rollout_corr/training_ppl"] != pytest.approx(sum(per_row) / 4, rel=1e-6)


# -------------------------------------------------------------------------------------------- exit 2


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--is", "token", "--is-threshold", "abc"], ["--is-threshold", "abc"]),
        (["--is", "token", "--is-threshold", "0.5_abc"], ["--is-threshold", "0.5_abc"]),
        (["--is", "token", "--is-threshold", "5.0_0.5"], ["lower bound"]),
        (["--rs", "geometric", "--rs-threshold", "1.001"], ["geometric", "0.7.0"]),
        (["--rs", "token_k2"], ["rollout_rs_threshold"]),
        (["--rs", "seq_mean_k1,token_k2", "--rs-threshold", "1,2,3"], ["rollout_rs_threshold"]),
        (["--preset", "nope"], ["nope", "mismatch presets"]),
        (["--column", "badrole=x"], ["badrole", "--column"]),
        (["--column", "response_mask"], ["ROLE=NAME"]),
    ],
    ids=["is-abc", "is-band-abc", "is-band-inverted", "rs-legacy", "rs-no-threshold", "rs-3-thresholds",
         "preset", "column-role", "column-syntax"],
)
def test_config_errors_exit_2(small_dump, args, needles):
    assert_error(invoke("analyze", small_dump, *args, "--device", "cpu"), 2, *needles)


def test_format_xml_is_usage_error(small_dump):
    result = invoke("analyze", small_dump, "--format", "xml")
    assert result.exit_code == 2
    assert isinstance(result.exception, SystemExit)
    assert "--format" in result.stderr and "xml" in result.stderr
    assert result.stdout == ""


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="CUDA is present here")
def test_device_cuda_without_cuda(small_dump):
    assert_error(invoke("analyze", small_dump, "--device", "cuda"), 2, "cuda", "--device cpu")


def test_config_bool_threshold(tmp_path, small_dump):
    config = tmp_path / "mismatch.toml"
    config.write_text('[correction]\nrollout_is = "token"\nrollout_is_threshold = true\n')
    assert_error(invoke("analyze", small_dump, "--config", config, "--device", "cpu"), 2, "boolean")


def test_config_invalid_toml(tmp_path, small_dump):
    config = tmp_path / "broken.toml"
    config.write_text("[correction\nrollout_is = \n")
    assert_error(invoke("analyze", small_dump, "--config", config, "--device", "cpu"), 2, str(config), "TOML")


def test_config_toml_is_applied(tmp_path, small_dump):
    """Control for the two tests above: a valid [correction] table configures the run."""
    config = tmp_path / "mismatch.toml"
    config.write_text('[correction]\nrollout_is = "token"\nrollout_is_threshold = "0.5_5.0"\n')
    report = analyze_json(str(small_dump), "--config", str(config))
    assert report["config"]["rollout_is"] == "token"
    assert report["config"]["rollout_is_threshold"] == "0.5_5.0"
    assert "rollout_corr/rollout_is_mean" in report["metrics"]


def test_legacy_rs_hint_names_real_options(small_dump):
    message = assert_error(
        invoke("analyze", small_dump, "--rs", "geometric", "--rs-threshold", "1.001", "--device", "cpu"), 2
    )
    assert "seq_mean_k1" in message
    params = typer.main.get_command(app).commands["analyze"].params
    flags = {opt for p in params for opt in p.opts}
    assert all(word in flags for word in re.findall(r"--[a-z][a-z0-9-]+", message))


def test_config_semantics_is_not_silently_dropped(tmp_path, small_dump):
    config = tmp_path / "mismatch.toml"
    config.write_text('[correction]\nsemantics = "verl-0.7.0"\nrollout_is = "token"\n')
    result = invoke("analyze", small_dump, "--config", config, "--format", "json", "--device", "cpu")
    if result.exit_code == 0:
        assert json.loads(result.stdout)["config"]["semantics"] == "verl-0.7.0"
    else:
        assert_error(result, 2, "semantics")


# -------------------------------------------------------------------------------------------- exit 3


def test_missing_file(tmp_path):
    missing = tmp_path / "nope.parquet"
    assert_error(invoke("analyze", missing), 3, str(missing))


def test_glob_matching_nothing(tmp_path):
    pattern = str(tmp_path / "zz*" / "*.parquet")
    assert_error(invoke("analyze", pattern), 3, pattern)


def test_corrupt_parquet(tmp_path):
    path = tmp_path / "corrupt.parquet"
    path.write_bytes(np.random.default_rng(0).bytes(600))
    assert_error(invoke("analyze", path, "--device", "cpu"), 3, str(path))


def test_all_zero_mask(tmp_path):
    path = write_dump(tmp_path / "zero.parquet", PLAIN_OLD, PLAIN_ROLLOUT, [[0] * len(r) for r in PLAIN_OLD])
    assert_error(invoke("analyze", path, "--device", "cpu"), 3, "no valid token")


def test_missing_rollout_column(tmp_path):
    path = write_dump(tmp_path / "no_rollout.parquet", PLAIN_OLD, None, PLAIN_MASK)
    message = assert_error(invoke("analyze", path, "--device", "cpu"), 3, str(path), "rollout_log_probs", "--column")
    assert "old_log_probs, response_mask" in message  # the available columns


def test_mismatched_lengths_row_3(tmp_path):
    rollout = [r[:] for r in PLAIN_ROLLOUT]
    rollout[3] = rollout[3][:1]
    path = write_dump(tmp_path / "ragged.parquet", PLAIN_OLD, rollout, PLAIN_MASK)
    assert_error(invoke("analyze", path, "--device", "cpu"), 3, str(path), "row 3")


def test_mask_value_two(tmp_path):
    mask = [r[:] for r in PLAIN_MASK]
    mask[4][1] = 2
    path = write_dump(tmp_path / "mask2.parquet", PLAIN_OLD, PLAIN_ROLLOUT, mask)
    assert_error(invoke("analyze", path, "--device", "cpu"), 3, str(path), "row 4", "response_mask")


def test_no_rows(tmp_path):
    path = write_dump(tmp_path / "empty.parquet", [], [], [])
    assert_error(invoke("analyze", path, "--device", "cpu"), 3, "no rows")


def test_no_rows_names_the_file(tmp_path):
    path = write_dump(tmp_path / "empty.parquet", [], [], [])
    assert_error(invoke("analyze", path, "--device", "cpu"), 3, str(path))


def test_synth_unknown_suffix(tmp_path):
    out = tmp_path / "dump.txt"
    assert_error(invoke("synth", out, "--tokens", "100"), 2, str(out), "--format")
    assert not out.exists()


def test_failed_run_writes_nothing(tmp_path):
    path = write_dump(tmp_path / "zero.parquet", PLAIN_OLD, PLAIN_ROLLOUT, [[0] * len(r) for r in PLAIN_OLD])
    out_dir = tmp_path / "out"
    out_file = tmp_path / "report.md"
    result = invoke("analyze", path, "--out-dir", out_dir, "-o", out_file, "--device", "cpu")
    assert_error(result, 3, "no valid token")
    assert not (out_dir / "report.json").exists()
    assert not out_file.exists()
    assert not out_dir.exists() or not any(out_dir.iterdir())


def test_out_dir_is_a_file(tmp_path, small_dump):
    blocker = tmp_path / "taken"
    blocker.write_text("x")
    result = invoke("analyze", small_dump, "--out-dir", blocker, "--device", "cpu", "--format", "json")
    assert result.exit_code in (2, 3)
    assert str(blocker) in result.stderr


def test_sentinel_minus_9999_is_reported(tmp_path):
    old = [r[:] for r in PLAIN_OLD]
    old[0][1] = -9999.0  # a valid token (mask 1)
    path = write_dump(tmp_path / "sentinel.parquet", old, PLAIN_ROLLOUT, PLAIN_MASK)
    report = analyze_json(str(path), "--dtype", "float64")
    assert report["data_quality"]["totals"]["sentinel_tokens"] == 1
    assert abs(report["metrics"]["rollout_corr/kl"]) < 1.0


# -------------------------------------------------------------------------------------------- exit 4


def test_internal_error_exit_4(monkeypatch, small_dump):
    import mismatch_cli.api

    def boom(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(mismatch_cli.api, "analyze", boom)
    assert_error(invoke("analyze", small_dump, "--device", "cpu"), 4, "boom", "MISMATCH_DEBUG")


# --------------------------------------------------------------------------------------------- color


SGR = re.compile(r"\x1b\[([0-9;]*)m")


def _color_codes(text: str) -> set[int]:
    """SGR parameters that set a colour (foreground, background, 256 / truecolor)."""
    codes = set()
    for params in SGR.findall(text):
        for p in filter(None, params.split(";")):
            n = int(p)
            if 30 <= n <= 38 or 40 <= n <= 48 or 90 <= n <= 97 or 100 <= n <= 107:
                codes.add(n)
    return codes


@pytest.fixture
def warning_dump(tmp_path) -> Path:
    """|kl| > 0.1, so the health table highlights a row and a coloured status would show."""
    return write_dump(tmp_path / "bad.parquet", PLAIN_OLD, CLIPPED_ROLLOUT, PLAIN_MASK)


def test_no_color_plain_output(warning_dump):
    result = invoke("analyze", warning_dump, "--device", "cpu", env={**CLEAN_ENV, "NO_COLOR": "1"})
    assert_ok(result)
    assert "Health: WARNING" in result.stdout
    assert "\x1b" not in result.stdout


def test_no_color_on_a_forced_terminal(warning_dump):
    forced = invoke("analyze", warning_dump, "--device", "cpu", env={**CLEAN_ENV, "FORCE_COLOR": "1"})
    assert_ok(forced)
    assert _color_codes(forced.stdout), "control: a forced terminal shows colour"
    result = invoke(
        "analyze", warning_dump, "--device", "cpu", env={**CLEAN_ENV, "FORCE_COLOR": "1", "NO_COLOR": "1"}
    )
    assert_ok(result)
    assert "Health: WARNING" in result.stdout
    assert not _color_codes(result.stdout)


# ------------------------------------------------------------------------------------ import


def _imported_after(*argvs: list[str]) -> tuple[str, list[str]]:
    """Run the CLI in a fresh interpreter on each argv; its stdout and which heavy modules it imported."""
    code = (
        "import sys\n"
        "from mismatch_cli.cli import app\n"
        f"for argv in {list(argvs)!r}:\n"
        "    sys.argv = ['mismatch', *argv]\n"
        "    try:\n"
        "        app()\n"
        "    except SystemExit:\n"
        "        pass\n"
        "print(sorted(m for m in ('numpy', 'pandas', 'pyarrow', 'torch') if m in sys.modules))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout, ast.literal_eval(proc.stdout.strip().splitlines()[-1])


def test_help_does_not_import_torch():
    stdout, modules = _imported_after(["--help"], ["analyze", "--help"], ["presets", "--format", "json"])
    assert "Exit codes" in stdout  # the help really ran
    assert "torch" not in modules


def test_help_stays_light():
    """`mismatch --help` and a command's --help import no numpy, pandas, pyarrow or torch (a fast start)."""
    assert _imported_after(["--help"], ["analyze", "--help"], ["check", "--help"])[1] == []


def test_multi_turn_sample_shows_rounds():
    result = invoke("analyze", "sample_data/multi_turn.parquet", "--device", "cpu", "--full")
    assert result.exit_code == 0 and isinstance(result.exception, (SystemExit, type(None)))
    assert "Rounds (round k" in result.stdout and "Rounds from the end" in result.stdout
    assert "worst round" in result.stdout
    report = analyze_json("sample_data/multi_turn.parquet", "--dtype", "float64")
    metrics = report["metrics"]
    rounds = report["rounds"]
    assert metrics["per_round/total_rounds"] == len(rounds) == len(report["rounds_from_end"]) >= 2
    assert sum(r["tokens"] for r in rounds) == metrics["diag/valid_tokens"]
    assert abs(sum(r["abs_diff_share"] for r in rounds) - 1.0) < 1e-9
    best = max(range(len(rounds)), key=lambda k: rounds[k]["abs_diff_mean"])
    assert metrics["per_round/max_round_diff"] == best
    assert rounds[0]["rows"] >= rounds[-1]["rows"]
