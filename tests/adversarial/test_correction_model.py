"""The correction model: presets and fields, errors in field names for the library, flags on the command line."""

from __future__ import annotations

import pytest
from conftest import ROOT, assert_clean_failure, mismatch

from mismatch_cli import CorrectionConfig
from mismatch_cli.correction import PRESETS, field_home, presets_table, resolve, resolve_family
from mismatch_cli.errors import ConfigError

DUMP = ROOT / "sample_data" / "single_turn.parquet"


def test_fields_given_override_the_preset_and_the_rest_come_from_it():
    config = CorrectionConfig(preset="decoupled_geo_rs_token_tis", rollout_is_threshold=3.0)
    assert (config.rollout_is, config.rollout_is_threshold) == ("token", 3.0)
    assert (config.rollout_rs, config.rollout_rs_threshold) == ("seq_mean_k1", "0.999_1.001")
    resolved = resolve(config)
    assert resolved.is_threshold.upper == 3.0 and resolved.rs_options[0].lower == 0.999
    assert CorrectionConfig(preset="disabled", rollout_is=None).to_dict()["rollout_is"] is None


def test_an_unknown_preset_is_refused_when_the_config_is_built():
    with pytest.raises(ConfigError, match="unknown preset 'nope'"):
        CorrectionConfig(preset="nope")


@pytest.mark.parametrize(
    "config",
    [
        CorrectionConfig(rollout_rs="token_k2"),
        CorrectionConfig(rollout_is="tokn"),
        CorrectionConfig(rollout_rs="seq_mean_k1", rollout_rs_threshold="1,2,3"),
        CorrectionConfig(k1_bounds="both"),
        CorrectionConfig(semantics="xtuner", family_fields={"rollout_is_threshold": [2.0, 0.5],
                                                            "rollout_is_level": "tokn"}),
        CorrectionConfig(semantics="xtuner", family_fields={"mask_dtype": "float"}),
        CorrectionConfig(semantics="verl-0.7.0", family_fields={"preset": "nope"}),
    ],
    ids=["rs-no-threshold", "is-level", "rs-3", "k1", "xtuner-level", "xtuner-mask", "old-preset"],
)
def test_library_errors_name_fields_not_command_line_flags(config):
    with pytest.raises(ConfigError) as info:
        resolve(config)
    assert "--" not in str(info.value), str(info.value)


def test_an_older_preset_error_lists_the_family_presets():
    with pytest.raises(ConfigError) as info:
        resolve(CorrectionConfig(semantics="verl-0.6.1", family_fields={"preset": "decoupled_geo_rs_token_tis"}))
    assert "pg_rs" in info.value.hint and "decoupled_seq_is" in info.value.hint


def test_verl_071_refuses_an_unknown_k1_bounds_as_verl_does():
    with pytest.raises(ConfigError, match="k1 bounds"):
        resolve_family("verl-0.7.1", {"rollout_rs": "seq_mean_k1", "rollout_rs_threshold": 2.0, "k1_bounds": "x"})


def test_field_home_names_every_family_that_takes_a_field():
    assert field_home("rollout_is_mask_threshold") == "xtuner or xtuner-2025-12"
    assert field_home("k1_bounds") == "verl, verl-0.8 or verl-0.7.1"
    assert field_home("nothing") == ""


def test_presets_tables_per_family():
    fields, rows = presets_table("verl")
    assert [r["name"] for r in rows] == list(PRESETS) and "loss_type" in fields
    assert not [r for r in presets_table("verl-0.7.1")[1] if "icepop" in r["name"]]
    assert "pg_rs" in [r["name"] for r in presets_table("verl-0.6.1")[1]]
    assert presets_table("xtuner")[1] == [] and presets_table("verl-0.6.0")[1] == []


@pytest.mark.parametrize(
    ("args", "mentions"),
    [
        (["--rs", "token_k2"], ["rollout_rs_threshold", "--rs-threshold sets rollout_rs_threshold"]),
        (["--is", "token", "--k1-bounds", "verl", "--is-threshold", "0.5_0.4"],
         ["--is-threshold sets rollout_is_threshold"]),
        (["--semantics", "xtuner", "--is-threshold", "2,0.5", "--is-level", "tokn"],
         ["--is-level sets rollout_is_level"]),
        (["--semantics", "verl-0.6.0", "--is-threshold", "2", "--is-mode", "both"],
         ["xtuner", "--is-mode sets rollout_is_mode"]),
    ],
    ids=["rs-threshold", "is-band", "xtuner-level", "060-mode"],
)
def test_the_cli_names_the_flag_that_sets_each_field_in_an_error(args, mentions):
    assert_clean_failure(mismatch("analyze", DUMP, *args, "--device", "cpu"), 2, *mentions)
