"""Config files are parsed with types: a wrong type, an unknown table or key is exit 2 naming all of it."""

from __future__ import annotations

import json

import pytest
from conftest import ROOT, assert_clean_failure, mismatch, snapshot

from mismatch_cli.correction import CORRECTION_FIELDS, FAMILY_FIELDS, CorrectionConfig, resolve
from mismatch_cli.errors import UsageError
from mismatch_cli.gate.configfile import load_config
from mismatch_cli.gate.thresholds import load_check_config

DUMP = ROOT / "sample_data" / "single_turn.parquet"


def _write(tmp_path, text, name="mismatch.toml"):
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("text", "mentions"),
    [
        ('[correction]\nrollout_is = "token"\nrollout_is_batch_normalize = "false"\n',
         ["[correction]", "rollout_is_batch_normalize", "boolean", "= false"]),
        ('[correction]\npreset = ["decoupled_token_is"]\n', ["[correction]", "preset", "string"]),
        ('[correction]\nsemantics = "verl-0.7.0"\nrollout_rs = "sequence"\nrollout_rs_threshold = 2\n'
         'rollout_rs_threshold_lower = "abc"\n', ["rollout_rs_threshold_lower", "number", "abc"]),
        ('[correction]\nsemantics = "verl-0.7.0"\nrollout_token_veto_threshold = [1]\n',
         ["rollout_token_veto_threshold", "number"]),
        ('[correction]\nrollout_is = "token"\nrollout_is_threshold = nan\n', ["rollout_is_threshold", "finite"]),
        ('[correction]\nrollout_is = "token"\nrollout_is_threshold = "0.5_5_6"\n', ["rollout_is_threshold"]),
        ('[correction]\nbypass_mode = 1\n', ["bypass_mode", "boolean"]),
        ("[correction]\nsemantics = 9\n", ["semantics", "string"]),
        ('[corection]\npreset = "decoupled_token_is"\n', ["[corection]", "did you mean [correction]"]),
        ('[correction]\nrollout_is_batch_normalise = true\n',
         ["rollout_is_batch_normalise", "[correction]", "did you mean rollout_is_batch_normalize"]),
        ('[chek]\nfail_on = ["kl<=1"]\n', ["[chek]", "did you mean [check]"]),
        ('[check]\nfail_on = ["kl<=1"]\nbasline = "r.json"\n', ["basline", "[check]", "did you mean baseline"]),
        ("[check]\nfail_on = [1]\n", ["[check]", "fail_on", "list of strings"]),
        ('[check]\nfail_on = ["kl<=1"]\nbaseline = 3\n', ["[check]", "baseline", "string"]),
        ('preset = "decoupled_token_is"\n', ["preset", "top level", "[correction]"]),
        ('correction = "x"\n', ["correction", "must be a table"]),
    ],
)
def test_config_file_errors_name_file_table_key_and_type(tmp_path, text, mentions):
    config = _write(tmp_path, text)
    before = snapshot(tmp_path)
    line = assert_clean_failure(mismatch("analyze", DUMP, "--config", config, "--out-dir", tmp_path / "out"), 2,
                                str(config), *mentions)
    assert "; fix: " in line
    assert snapshot(tmp_path) == before


def test_pyproject_other_tools_are_not_ours(tmp_path):
    config = _write(tmp_path, '[project]\nname = "x"\n[tool.ruff]\nline-length = 3\n[tool.other.check]\nx = 1\n'
                    '[tool.mismatch.correction]\nrollout_is = "token"\nrollout_is_batch_normalize = true\n',
                    "pyproject.toml")
    assert load_config(config)["correction"] == {"rollout_is": "token", "rollout_is_batch_normalize": True}
    out = tmp_path / "out"
    run = mismatch("analyze", DUMP, "--config", config, "--bootstrap", "0", "--out-dir", out, "--no-plots", "-q")
    assert run.code == 0, run.stderr
    assert json.loads((out / "report.json").read_text())["config"]["rollout_is_batch_normalize"] is True


def test_pyproject_misspelled_or_unknown_tool_mismatch_table(tmp_path):
    config = _write(tmp_path, '[tool.mismatc.check]\nfail_on = ["kl<=1"]\n', "pyproject.toml")
    with pytest.raises(UsageError, match=r"no \[tool.mismatch\] table") as info:
        load_config(config)
    assert "tool.mismatc" in info.value.hint
    config = _write(tmp_path, '[tool.mismatch.corection]\nrollout_is = "token"\n', "pyproject.toml")
    with pytest.raises(UsageError, match=r"\[tool.mismatch.corection\]") as info:
        load_config(config)
    assert "[tool.mismatch.correction]" in info.value.hint


def test_standalone_file_tool_tables_are_ignored(tmp_path):
    config = _write(tmp_path, '[tool.black]\nline-length = 1\n[correction]\nrollout_is = "sequence"\n')
    assert load_config(config) == {"correction": {"rollout_is": "sequence"}, "check": {}}


def test_check_table_rules_and_baseline(tmp_path):
    config = _write(tmp_path, '[check]\nfail_on = "rollout_corr/kl<=0.1"\nbaseline = "base.json"\n')
    table = load_check_config(config)
    assert [r.value for r in table.rules] == [0.1]
    assert table.baseline == str(tmp_path / "base.json")
    config = _write(tmp_path, '[check]\nfail_on = ["kl<=1"]\nfail-on = ["kl<=2"]\n')
    with pytest.raises(UsageError, match="fail_on and fail-on"):
        load_check_config(config)


def test_bool_string_in_the_python_api_is_refused():
    # bool("false") is True: the API must not switch normalization on for a string either.
    with pytest.raises(UsageError, match="rollout_is_batch_normalize"):
        resolve(CorrectionConfig(rollout_is="token", rollout_is_batch_normalize="false"))
    with pytest.raises(UsageError, match="preset"):
        resolve(CorrectionConfig(preset=["decoupled_token_is"]))
    assert resolve(CorrectionConfig(rollout_is="token", rollout_is_batch_normalize=True)).is_batch_normalize


def test_every_family_field_has_a_declared_kind():
    fields = {name for family in FAMILY_FIELDS.values() for name in family} | {"semantics", "mask_dtype"}
    assert fields == set(CORRECTION_FIELDS)


def test_older_family_true_threshold_still_reproduces_upstream(tmp_path):
    # verl 0.6.1 / 0.7.x accept rollout_is_threshold = true as 1.0 (parity case EDGE_verl_bool_is_threshold).
    config = _write(tmp_path, '[correction]\nsemantics = "verl-0.7.0"\nrollout_is = "token"\n'
                    "rollout_is_threshold = true\n")
    assert load_config(config)["correction"]["rollout_is_threshold"] is True
