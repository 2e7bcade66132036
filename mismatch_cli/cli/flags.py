"""The command line's correction flags: which upstream field each flag sets, per family (SPEC §3.3).

Only the CLI imports this module; the correction model knows field names, never flags. It turns the
flags into upstream field values and hands them, with the `--config` table, to the correction model.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mismatch_cli.cli.options import CorrectionFlags, IsLevel
from mismatch_cli.correction import (
    FAMILIES,
    REPLAY_FAMILIES,
    VERL_DEFAULTS,
    VERL_FAMILIES,
    CorrectionConfig,
    config_from_sources,
    family_of,
    resolve,
    settings_from_pairs,
)
from mismatch_cli.correction.config import VERL_NEEDS, refuse_idle
from mismatch_cli.correction.parse import pair, plain_number
from mismatch_cli.errors import MismatchError, UsageError
from mismatch_cli.system.numbers import NONE_WORDS, threshold_value

# flag -> upstream field, per family. A flag missing here is refused for that family.
FLAG_FIELDS: dict[str, dict[str, str]] = {
    "verl-0.7.1": {"--is": "rollout_is", "--is-threshold": "rollout_is_threshold",
                   "--is-batch-normalize": "rollout_is_batch_normalize", "--rs": "rollout_rs",
                   "--rs-threshold": "rollout_rs_threshold", "--k1-bounds": "k1_bounds", "--preset": "preset",
                   "--mask-dtype": "mask_dtype"},
    "verl-0.7.0": {"--is": "rollout_is", "--is-threshold": "rollout_is_threshold",
                   "--is-batch-normalize": "rollout_is_batch_normalize", "--rs": "rollout_rs",
                   "--rs-threshold": "rollout_rs_threshold", "--rs-threshold-lower": "rollout_rs_threshold_lower",
                   "--veto-threshold": "rollout_token_veto_threshold", "--preset": "preset",
                   "--mask-dtype": "mask_dtype"},
    "verl-0.6.0": {"--is-level": "rollout_is_level", "--is-mode": "rollout_is_mode",
                   "--is-threshold": "rollout_is_threshold", "--is-threshold-lower": "rollout_is_threshold_lower",
                   "--veto-threshold": "rollout_is_veto_threshold", "--mask-dtype": "mask_dtype"},
    "xtuner": {"--is-level": "rollout_is_level", "--is-mode": "rollout_is_mode",
               "--is-threshold": "rollout_is_threshold", "--is-mask-threshold": "rollout_is_mask_threshold",
               "--veto-threshold": "rollout_is_veto_threshold", "--mask-dtype": "mask_dtype"},
}
FLAG_FIELDS["verl-0.6.1"] = FLAG_FIELDS["verl-0.7.0"]
FLAG_FIELDS["xtuner-2025-12"] = FLAG_FIELDS["xtuner"]
FLAG_FIELDS.update({name: {} for name in REPLAY_FAMILIES})  # a replayed trainer's fields: --set FIELD=VALUE only
FLAG_FIELDS["verl-0.8"] = {flag: field for flag, field in FLAG_FIELDS["verl-0.7.1"].items() if flag != "--mask-dtype"}
VERL_FLAGS = ("--is", "--is-threshold", "--is-batch-normalize", "--rs", "--rs-threshold", "--k1-bounds", "--preset")
PAIR_FLAGS = ("--is-threshold", "--is-mask-threshold", "--veto-threshold")  # xtuner's (upper, lower) tuples
THRESHOLD_FLAGS = ("--is-threshold", "--rs-threshold", "--veto-threshold", "--is-threshold-lower",
                   "--rs-threshold-lower")
ONE_NUMBER = ("verl-0.7.0", "verl-0.6.1", "verl-0.6.0")  # these versions take one number per threshold field
assert set(FLAG_FIELDS) | {"verl"} == set(FAMILIES)


def _table(family: str) -> dict[str, str]:
    return FLAG_FIELDS.get(family, FLAG_FIELDS["verl-0.8"])


def family_fields_from_flags(family: str, flags: dict[str, Any]) -> dict[str, Any]:
    """Map the CLI flags a user gave to the family's upstream fields, refusing flags of other families."""
    table = FLAG_FIELDS.get(family, {flag: flag for flag in VERL_FLAGS})
    fields: dict[str, Any] = {}
    for flag, value in flags.items():
        if value is None:
            continue
        if flag not in table:
            homes = [f for f, flags_of in FLAG_FIELDS.items() if flag in flags_of and f != "xtuner-2025-12"]
            if flag in VERL_FLAGS:
                homes = ["verl", *homes]
            raise UsageError(f"{flag} is not an option of --semantics {family}",
                             hint=f"{flag} belongs to --semantics {' / '.join(homes)}")
        name = table[flag]
        if family.startswith("xtuner") and flag in PAIR_FLAGS:
            fields[name] = pair(name, value)
        elif flag in THRESHOLD_FLAGS:
            if family in ONE_NUMBER and value.strip().lower() not in NONE_WORDS:
                fields[name] = plain_number(flag, value, family)
            else:
                fields[name] = threshold_value(value, flag)
        else:
            fields[name] = value
    return fields


def name_flags(error: MismatchError, family: str) -> MismatchError:
    """Add to an error's fix which flags set the config fields it names (the core speaks in field names)."""
    text = f"{error.message} {error.hint or ''}"
    named = [f"{flag} sets {field}" for flag, field in _table(family).items()
             if field not in ("preset",) and re.search(rf"(?<![\w-]){re.escape(field)}(?![\w-])", text)]
    if named and error.hint:
        error.hint = f"{error.hint} (on the command line, {'; '.join(named)})"
    return error


def in_file(error: MismatchError, config_file: Path | None, table: dict[str, Any]) -> MismatchError:
    """An error about a field the config file set names the file and its table, as the docs promise."""
    named = [k for k in table if re.search(rf"(?<![\w-]){re.escape(k)}(?![\w-])", error.message)]
    if config_file is not None and named and not error.message.startswith(str(config_file)):
        error.message = f"{config_file}: [correction] {error.message}"
    return error


def flag_values(flags: CorrectionFlags) -> dict[str, Any]:
    """The correction flags a user gave, keyed by flag as typed (`--is none` is kept apart: it is not unset)."""
    is_level = None if flags.is_level in (None, IsLevel.none) else flags.is_level.value  # type: ignore[union-attr]
    return {"--preset": flags.preset, "--is": is_level, "--is-threshold": flags.is_threshold,
            "--is-batch-normalize": flags.is_batch_normalize, "--rs": flags.rs, "--rs-threshold": flags.rs_threshold,
            "--k1-bounds": flags.k1_bounds.value if flags.k1_bounds else None,
            "--is-level": flags.is_level_legacy, "--is-mode": flags.is_mode,
            "--is-threshold-lower": flags.is_threshold_lower, "--is-mask-threshold": flags.is_mask_threshold,
            "--rs-threshold-lower": flags.rs_threshold_lower, "--veto-threshold": flags.veto_threshold,
            "--mask-dtype": flags.mask_dtype.value if flags.mask_dtype else None}


def _verl_fields(flags: CorrectionFlags) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    if flags.is_level is not None:
        fields["rollout_is"] = None if flags.is_level is IsLevel.none else flags.is_level.value
    if flags.is_threshold is not None:
        fields["rollout_is_threshold"] = threshold_value(flags.is_threshold, "--is-threshold", allow_none=False)
    if flags.is_batch_normalize is not None:
        fields["rollout_is_batch_normalize"] = flags.is_batch_normalize
    if flags.rs is not None:
        fields["rollout_rs"] = None if flags.rs.strip().lower() == "none" else flags.rs
    if flags.rs_threshold is not None:
        fields["rollout_rs_threshold"] = threshold_value(flags.rs_threshold, "--rs-threshold", allow_none=False)
    if flags.k1_bounds is not None:
        fields["k1_bounds"] = flags.k1_bounds.value
    return fields


def correction_from_flags(config_file: Path | None, flags: CorrectionFlags) -> CorrectionConfig:
    """The configuration the flags and the `--config` file's [correction] table ask for, validated now."""
    from mismatch_cli.gate.configfile import load_table

    table = {} if config_file is None else load_table(config_file, "correction")
    semantics = flags.semantics.value if flags.semantics is not None else None
    if semantics is not None and table.get("semantics") not in (None, semantics):
        # The table's fields are its own semantics': under another family they would mean something else.
        raise UsageError(f"--semantics {semantics} conflicts with semantics = \"{table['semantics']}\" in "
                         f"{config_file} [correction]", hint="drop one of them: the table's fields belong to its own")
    family = family_of(table, semantics, str(config_file))
    given = flag_values(flags)
    if family in VERL_FAMILIES:
        family_fields_from_flags(family, {k: v for k, v in given.items() if k not in VERL_FLAGS})
        fields = _verl_fields(flags)
    else:
        fields = family_fields_from_flags(family, given)
        if flags.is_level is IsLevel.none:
            fields["rollout_is"] = None
    pairs = settings_from_pairs(flags.settings or [], family)  # --set: the trainer's own field names
    fields.update(pairs)
    try:
        config = config_from_sources(table, fields, semantics, flags.preset, origin=str(config_file))
        resolved = resolve(config)  # errors come before any input is read
    except MismatchError as error:
        raise in_file(name_flags(error, family), config_file, table) from None
    refuse_idle_flags(given, _switched_on(family, config, resolved))
    # The same rule for fields given by --set or the [correction] table (the library replays what the trainer
    # accepts; the command line refuses a field that would do nothing, as it refuses such a flag).
    table_fields = {k: v for k, v in table.items() if k != "semantics"}
    if family in VERL_FAMILIES:
        needs, effective, defaults = VERL_NEEDS, config.verl_fields, VERL_DEFAULTS
    else:
        trainer = REPLAY_FAMILIES.get(family)
        needs, effective = (trainer.needs, config.to_dict()) if trainer else ((), {})
        defaults = trainer.defaults if trainer else {}
    refuse_idle(needs, table_fields, effective, defaults, where=f"{config_file}: ")
    refuse_idle(needs, pairs, effective, defaults, where="--set ")
    return config


# flag -> (what it needs switched on, how to switch it on). A flag whose switch is off would be ignored
# without a word (`--is-threshold 2,0` without `--is` reported "correction: none" and exit 0).
NEEDS: dict[str, tuple[str, str]] = {
    "--is-threshold": ("is", "--is token (or --is sequence)"),
    "--is-batch-normalize": ("is", "--is token (or --is sequence)"),
    "--rs-threshold": ("rs", "--rs OPTION (e.g. --rs seq_mean_k1)"),
    "--rs-threshold-lower": ("rs", "--rs OPTION (e.g. --rs seq_mean_k1)"),
    "--k1-bounds": ("k1", "a k1 RS option (e.g. --rs seq_mean_k1)"),
    # verl 0.6.0 and xtuner: importance sampling is on when rollout_is_threshold is set
    "--is-level": ("threshold", "--is-threshold U (e.g. --is-threshold 2.0)"),
    "--is-mode": ("threshold", "--is-threshold U (e.g. --is-threshold 2.0)"),
    "--is-threshold-lower": ("threshold", "--is-threshold U (e.g. --is-threshold 2.0)"),
    "--is-mask-threshold": ("threshold", "--is-threshold U (e.g. --is-threshold 2.0)"),
}


def _switched_on(family: str, config: CorrectionConfig, resolved: Any) -> dict[str, bool]:
    """Which switches the run has on: IS, RS, a k1 RS option, and (older families) an IS threshold."""
    if family in VERL_FAMILIES:
        return {"is": resolved.is_level is not None, "rs": bool(resolved.rs_options),
                "k1": any(o.is_k1 for o in resolved.rs_options), "threshold": True}
    fields = config.to_dict()
    threshold = fields.get("rollout_is_threshold") is not None
    rs = fields.get("rollout_rs")
    return {"is": fields.get("rollout_is") is not None if "--is" in _table(family) else threshold,
            "rs": rs is not None, "k1": rs is not None and "k1" in str(rs), "threshold": threshold}


def refuse_idle_flags(given: dict[str, Any], switched_on: dict[str, bool]) -> None:
    """Refuse a flag that only matters with another one when that other one is off, naming it."""
    for flag, value in given.items():
        if value is None or flag not in NEEDS:
            continue
        switch, how = NEEDS[flag]
        if not switched_on[switch]:
            shown = f"{flag} {value}" if not isinstance(value, bool) else flag if value else f"--no-{flag[2:]}"
            raise UsageError(f"{shown} does nothing here: it needs {how.split(' (')[0]}, which is not set",
                             hint=f"add {how}, or drop {flag}")
