"""Issue 25: a newcomer's usage errors are one line with a fix (and the name most likely meant), flags that do
nothing alone are refused, `-q` everywhere, readable help, outputs checked before the work, inputs explained."""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

import pytest
import typer
from test_cli import PLAIN_MASK, PLAIN_OLD, PLAIN_ROLLOUT, assert_error, assert_ok, invoke, write_dump

from mismatch_cli.cli import app

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def small_dump(tmp_path) -> Path:
    return write_dump(tmp_path / "small.parquet", PLAIN_OLD, PLAIN_ROLLOUT, PLAIN_MASK)


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["analyze", "x.parquet", "--is", "tokn"], ["--is", "'tokn'", "did you mean --is token?"]),
        (["analyze", "x.parquet", "--input-format", "csv"], ["--input-format", "use one of auto, parquet"]),
        (["analyze", "x.parquet", "--is-treshold", "2"], ["no option --is-treshold", "did you mean --is-threshold?"]),
        (["analyze"], ["missing argument DUMP...", "mismatch analyze --help"]),
        (["analyz", "x"], ["no command 'analyz'", "did you mean `mismatch analyze`?"]),
        (["analyze", "x.parquet", "--is"], ["--is needs a value", "(see `mismatch analyze --help`)"]),
        (["synth", "x.parquet", "--tokens"], ["--tokens needs a value", "(see `mismatch synth --help`)"]),
        (["convert", "x.parquet"], ["missing option --output"]),
    ],
    ids=["bad-choice", "input-format", "unknown-option", "missing-argument", "unknown-command", "no-value",
         "no-value-synth",
         "missing-option"],
)
def test_typer_usage_errors_are_one_line_of_ours(args, needles):
    message = assert_error(invoke(*args), 2, *needles)
    assert "fix: " in message and "Value error" not in message and "Usage:" not in message


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--preset", "decoupled_geo_rs_tokn_tis"], ["did you mean decoupled_geo_rs_token_tis"]),
        (["--rs", "seq_maen_k1", "--rs-threshold", "2"], ["did you mean seq_mean_k1?"]),
        (["--semantics", "xtuner", "--is-threshold", "2.0,0.5", "--is-mode", "mask_"], ["did you mean mask?"]),
    ],
    ids=["preset", "rs-option", "is-mode"],
)
def test_mistyped_names_get_the_closest_one(small_dump, args, needles):
    message = assert_error(invoke("analyze", small_dump, *args, "--device", "cpu"), 2, *needles)
    assert "['" not in message  # no Python list in a message


def test_mistyped_metric_and_column_get_the_closest_one(tmp_path):
    assert_error(invoke("metrics", "rollout_corr/kll"), 2, "did you mean rollout_corr/kl")
    dump = write_dump(tmp_path / "d.parquet", [[-1.0]], [[-1.1]], [[1]])
    assert_error(invoke("analyze", dump, "--column", "response_mask=respons_mask", "--device", "cpu"), 3,
                 "did you mean --column response_mask=response_mask?")


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--is-threshold", "2,0"], ["--is-threshold 2,0", "fix: add --is token"]),
        (["--no-is-batch-normalize"], ["--no-is-batch-normalize", "add --is token"]),
        (["--rs-threshold", "2"], ["--rs-threshold", "add --rs OPTION"]),
        (["--rs", "token_k2", "--rs-threshold", "2", "--k1-bounds", "ratio"], ["--k1-bounds", "k1 RS option"]),
        (["--semantics", "xtuner", "--is-mode", "mask"], ["--is-mode", "add --is-threshold"]),
        (["--semantics", "verl-0.7.0", "--rs-threshold-lower", "0.5"], ["--rs-threshold-lower", "add --rs"]),
        (["--ray-address", "auto"], ["--ray-address", "add --engine ray"]),
    ],
    ids=["is-threshold", "is-batch-normalize", "rs-threshold", "k1-bounds", "xtuner-is-mode", "rs-lower",
         "ray-address"],
)
def test_a_flag_that_needs_another_is_refused_without_it(small_dump, args, needles):
    assert_error(invoke("analyze", small_dump, *args, "--device", "cpu"), 2, *needles)


@pytest.mark.parametrize(("args", "needs"), [(["--no-plots"], "--out-dir DIR"),
                                              (["--full", "--format", "json"], "--format table")])
def test_a_flag_that_only_has_no_effect_is_accepted_with_a_note(small_dump, args, needs):
    # Scripts that always pass --no-plots keep working (issue 34): a harmless no-op is a note, not exit 2.
    result = invoke("analyze", small_dump, *args, "--device", "cpu", "--bootstrap", "0")
    assert result.exit_code == 0, result.output
    assert f"note: {args[0]} has no effect without {needs}" in result.stderr
    quiet = invoke("analyze", small_dump, *args, "--device", "cpu", "--bootstrap", "0", "-q")
    assert quiet.exit_code == 0 and "has no effect" not in quiet.stderr


def test_a_flag_whose_switch_comes_from_a_preset_is_accepted(small_dump):
    assert_ok(invoke("analyze", small_dump, "--preset", "decoupled_token_is", "--is-threshold", "3", "--device", "cpu",
                     "--format", "json", "--bootstrap", "0"))


def _commands() -> dict:
    return typer.main.get_command(app).commands


def test_every_command_takes_q():
    lacking = [name for name, command in _commands().items()
               if "-q" not in [o for p in command.params for o in p.opts]]
    assert lacking == []
    result = invoke("metrics", "rollout_corr/kl", "-q")
    assert_ok(result)
    assert result.stderr == ""


def test_help_shows_readable_placeholders():
    for name in _commands():
        text = invoke(name, "--help").stdout
        assert not re.search(r"<[a-z]|\{|list\[|\[str\]", text), (name, text)
    analyze = invoke("analyze", "--help").stdout
    assert "[OPTIONS] DUMP..." in analyze and "--column ROLE=NAME" in analyze and "--by KEY" in analyze
    assert "--rs LIST" in analyze


def test_an_unwritable_out_dir_is_refused_before_the_analysis(small_dump, tmp_path, monkeypatch):
    locked = tmp_path / "locked"
    locked.mkdir()
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: False if Path(p) == locked else real_access(p, mode, **kw))
    import mismatch_cli.api as api

    def no_analysis(*args, **kwargs):
        raise AssertionError("the analysis ran before the outputs were checked")

    monkeypatch.setattr(api, "analyze", no_analysis)
    assert_error(invoke("analyze", small_dump, "--out-dir", locked / "out"), 2, "--out-dir", "permission denied")
    assert_error(invoke("analyze", small_dump, "-o", locked / "report.md"), 2, "-o", "permission denied")
    assert list(locked.iterdir()) == []


def test_a_csv_input_is_told_what_to_do(tmp_path):
    table = tmp_path / "logprobs.csv"
    table.write_text("old_log_probs,rollout_log_probs\n-1,-1.1\n")
    message = assert_error(invoke("analyze", table), 3, "is a CSV table, not a dump", "parquet")
    assert "--input-format" not in message


def test_a_folder_says_what_it_skipped(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    write_dump(folder / "d.parquet", [[-1.0, -2.0]], [[-1.1, -2.0]], [[1, 1]])
    for name in ("a.csv", "b.csv", "README.md"):
        (folder / name).write_text("x\n")
    result = invoke("analyze", folder, "--format", "json", "--device", "cpu", "--bootstrap", "0")
    assert_ok(result)
    lines = [line for line in result.stderr.splitlines() if "skipped" in line]
    assert len(lines) == 1 and "skipped 3 files (2 .csv, 1 .md)" in lines[0], result.stderr


def test_every_missing_column_is_reported_at_once(tmp_path):
    dump = write_dump(tmp_path / "d.parquet", [[-1.0]], [[-1.1]], [[1]], names=("trainer_lp", "engine_lp", "m"))
    message = assert_error(invoke("analyze", dump), 3, "no old_log_probs column", "no rollout_log_probs column",
                           "no response_mask column")
    assert message.count("available columns") == 1


def _readme_test_command() -> str:
    readme = (ROOT / "README.md").read_text()
    return next(line for line in readme.splitlines() if "python -m pytest" in line and "tests" in line)


def test_the_readme_test_command_prints_the_summary_line():
    # pyproject's addopts already has -q; a second -q (-qq) drops pytest's "N passed" line.
    import tomllib

    addopts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["addopts"]
    quiet = [a for a in shlex.split(_readme_test_command()) + shlex.split(addopts) if re.fullmatch(r"-q+", a)]
    assert sum(len(a) - 1 for a in quiet) <= 1, _readme_test_command()


def test_the_readme_installs_cpu_torch_before_the_package():
    readme = (ROOT / "README.md").read_text()
    install = readme.split("## Install", 1)[1].split("\n## ", 1)[0]
    block = install.split("```bash", 1)[1].split("```", 1)[0]
    assert "pip install torch" in block and "pip install -e ." in block
    assert block.index("pip install torch") < block.index("pip install -e .")


def test_a_mistyped_by_column_gets_the_closest_one(tmp_path):
    dump = write_dump(tmp_path / "d.parquet", [[-1.0]], [[-1.1]], [[1]])
    message = assert_error(invoke("analyze", dump, "--by", "respons_mask", "--device", "cpu"), 3,
                           "no column 'respons_mask'", "available columns:", "did you mean --by response_mask?")
    assert "['" not in message
    # far from every name: the plain fix, no guess
    message = assert_error(invoke("analyze", dump, "--by", "zzz", "--device", "cpu"), 3, "fix: use one of")
    assert "did you mean" not in message


def test_a_mistyped_rule_column_names_the_rule_and_the_closest_one():
    from mismatch_cli.errors import MissingGroupError

    error = MissingGroupError("env_nme", "d.parquet", ["uid", "env_name"]).asked_by("the rule kl[env_nme]<1")
    assert "asked for by the rule kl[env_nme]<1" in str(error) and "did you mean env_name?" in str(error)
    assert "drop the rule kl[env_nme]<1" in str(error)


@pytest.mark.parametrize(
    ("name", "args", "needles"),
    [
        ("d.parquet", ["--layout", "packed"], ["--layout packed does nothing for a parquet dump",
                                               "fix: drop --layout"]),
        ("d.parquet", ["--format", "parquet", "--layout", "padded"], ["--layout padded", "drop --layout"]),
        ("d.safetensors", ["--steps", "3"], ["--steps 3 does nothing for a safetensors dump", "fix: drop --steps"]),
        ("d.bin", ["--format", "safetensors", "--steps", "1"], ["--steps 1", "drop --steps"]),
    ],
    ids=["layout-parquet", "layout-format-parquet", "steps-safetensors", "steps-format-safetensors"],
)
def test_synth_refuses_a_flag_that_does_nothing_for_the_format(tmp_path, name, args, needles):
    assert_error(invoke("synth", tmp_path / name, "--tokens", "500", *args), 2, *needles)
    assert list(tmp_path.iterdir()) == []


def test_synth_takes_the_flags_of_its_format(tmp_path):
    assert_ok(invoke("synth", tmp_path / "p.safetensors", "--tokens", "500", "--layout", "packed", "-q"))
    assert_ok(invoke("synth", tmp_path / "s.parquet", "--tokens", "500", "--steps", "2", "-q"))
