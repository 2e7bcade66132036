"""The correction configuration (`CorrectionConfig`) and `resolve()`, which dispatches to its family.

The public field and report key is `semantics` (as the command line and the `[correction]`
table spell it); inside the package the same idea is called the family.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from mismatch_cli.correction.model import VERL_FAMILIES, Needs, ReplayFamily, ResolvedCorrection
from mismatch_cli.correction.older import OLDER_FIELDS, XTUNER, expand_preset, older_presets, resolve_older
from mismatch_cli.correction.parse import positive_number, unknown_fields
from mismatch_cli.correction.registry import families, replay_families
from mismatch_cli.correction.verl import (
    PRESETS,
    PRESETS_071,
    VERL_DEFAULTS,
    VERL_FIELDS,
    check_071_preset,
    get_preset,
    resolve_071,
    resolve_verl,
)
from mismatch_cli.errors import ConfigError, UsageError
from mismatch_cli.system.numbers import NONE_WORDS
from mismatch_cli.system.tomlconfig import check_fields

CONFIG_FIELDS = VERL_FIELDS  # CorrectionConfig's own fields (verl's names)
# The `[correction]` table's fields of verl and the older families (upstream names, verbatim) and their TOML kinds;
# each replayed trainer adds its own (ReplayFamily.kinds) in correction_table().
MODEL_FIELDS: dict[str, str] = {
    "semantics": "string",
    "preset": "string",
    "rollout_is": "string or bool",  # verl: token | sequence; verl 0.6.0: whether the loss uses the weights
    "rollout_is_threshold": "threshold",
    "rollout_is_batch_normalize": "bool",
    "rollout_rs": "string",
    "rollout_rs_threshold": "threshold",
    "bypass_mode": "bool",
    "loss_type": "string",
    "k1_bounds": "string",
    "mask_dtype": "string",
    "rollout_rs_threshold_lower": "number",
    "rollout_token_veto_threshold": "number",
    "use_policy_gradient": "bool",
    "rollout_is_level": "string",
    "rollout_is_mode": "string",
    "rollout_is_threshold_lower": "number",
    "rollout_is_veto_threshold": "threshold",  # verl 0.6.0: a number; xtuner: (upper, lower)
    "rollout_is_mask_threshold": "threshold",
}


@functools.cache
def family_fields() -> dict[str, tuple[str, ...]]:
    """The upstream fields each family accepts (its `[correction]` table takes them verbatim)."""
    trainers = {name: tuple(f.defaults) for name, f in replay_families().items()}
    return {family: VERL_FIELDS if family in (*VERL_FAMILIES, "verl-0.7.1") else {**OLDER_FIELDS, **trainers}[family]
            for family in families()}


@functools.cache
def correction_table() -> dict[str, str]:
    """Every field of every family's `[correction]` table and its TOML kind (the table tomlconfig checks)."""
    fields = dict(MODEL_FIELDS)
    for family in replay_families().values():
        for name, kind in family.kinds.items():
            if fields.setdefault(name, kind) != kind:
                raise ValueError(f"{name} has two kinds: {fields[name]} and {kind} ({family.name})")
    return fields


def check_trainer_fields(family: ReplayFamily, fields: Mapping[str, Any]) -> None:
    """Refuse a field the trainer does not have, naming the closest one and all of the family's (exit 2)."""
    known = tuple(family.defaults)
    unknown = [k for k in fields if k not in known]
    if unknown:
        raise unknown_fields(family.name, unknown, known)


# verl's fields that mean something only with IS or RS on (the flags --is-threshold, … are refused the same way).
VERL_NEEDS = (
    Needs("rollout_is_threshold", "rollout_is=token (or sequence)", lambda v: v.get("rollout_is") is not None),
    Needs("rollout_is_batch_normalize", "rollout_is=token (or sequence)", lambda v: v.get("rollout_is") is not None),
    Needs("rollout_rs_threshold", "rollout_rs=OPTION", lambda v: v.get("rollout_rs") is not None),
)


def refuse_idle(needs: tuple[Needs, ...], given: Mapping[str, Any], effective: Mapping[str, Any],
                defaults: Mapping[str, Any], where: str = "") -> None:
    """Refuse a field given with a value of its own while the setting it needs is off (exit 2), naming both; a
    field left at its default is a harmless no-op and passes."""
    for need in needs:
        value = given.get(need.field)
        if need.field not in given or value is None or _same_value(value, defaults.get(need.field)):
            continue
        if not need.met(effective):
            raise ConfigError(f"{where}{need.field}={value} does nothing here: it needs {need.needs}, which is not "
                              "set", hint=f"set {need.needs}, or drop {need.field}")


def _same_value(value: Any, default: Any) -> bool:
    try:
        return value == default or (default is not None and float(value) == float(default))
    except (TypeError, ValueError):
        return str(value).strip().lower() == str(default).strip().lower()


def trainer_warnings(config: CorrectionConfig) -> list[str]:
    """What the configuration's trainer itself warns about the fields given (a deprecated field replacing one)."""
    trainer = replay_families().get(config.semantics)
    return list(trainer.warns(config.family_fields)) if trainer is not None and trainer.warns else []


def field_home(name: str) -> str:
    """The families that take a field, in words ("verl-0.6.0, xtuner or xtuner-2025-12"); '' for none."""
    homes = [family for family in families() if name in family_fields()[family]]
    return ", ".join(homes[:-1]) + f" or {homes[-1]}" if len(homes) > 1 else "".join(homes)


class _Unset:
    """A field the caller did not give: a preset's value, else verl's default, fills it."""

    def __repr__(self) -> str:
        return "UNSET"


UNSET: Any = _Unset()


@dataclass(frozen=True)
class CorrectionConfig:
    """The effective correction configuration (verl field names, values as the user gave them).

    With `preset`, every field not given takes the preset's value; fields given override it.
    """

    rollout_is: str | None = UNSET
    rollout_is_threshold: Any = UNSET
    rollout_is_batch_normalize: bool = UNSET
    rollout_rs: str | None = UNSET
    rollout_rs_threshold: Any = UNSET
    bypass_mode: bool = UNSET
    loss_type: str = UNSET
    k1_bounds: str = UNSET
    preset: str | None = None
    # The family (public name `semantics`), and an older family's upstream fields, verbatim.
    semantics: str = "verl"
    family_fields: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        given = {name for name in VERL_DEFAULTS if getattr(self, name) is not UNSET}
        if self.semantics not in VERL_FAMILIES and (given or self.preset is not None):
            named = ", ".join(sorted(given)) or "preset"
            raise ConfigError(
                f"semantics {self.semantics} takes its own upstream fields, not {named}",
                hint="pass them as CorrectionConfig(semantics=..., family_fields={...})",
            )
        base = get_preset(self.preset).fields if self.preset is not None else VERL_DEFAULTS
        for name in VERL_DEFAULTS:
            if getattr(self, name) is UNSET:
                object.__setattr__(self, name, base[name])

    @property
    def verl_fields(self) -> dict[str, Any]:
        """verl's fields with their effective values (preset and defaults filled in)."""
        return {name: getattr(self, name) for name in VERL_DEFAULTS}

    def to_dict(self) -> dict[str, Any]:
        """The configuration as a JSON-ready mapping."""
        if self.semantics in replay_families():  # the fields as the trainer resolves them, defaults included
            return resolve_family(self.semantics, dict(self.family_fields))[1]
        if self.semantics not in VERL_FAMILIES:
            return {"semantics": self.semantics, **expand_preset(self.semantics, self.family_fields)}
        return {"semantics": self.semantics, "preset": self.preset, **self.verl_fields}


def build_config(overrides: dict[str, Any], preset: str | None = None, semantics: str = "verl") -> CorrectionConfig:
    """Start from a preset (or verl's YAML defaults) and apply explicitly given fields."""
    unknown = sorted(set(overrides) - set(CONFIG_FIELDS))
    if unknown:
        raise ConfigError(
            f"unknown correction field(s) {', '.join(unknown)}",
            hint=f"the [correction] table takes {', '.join(CONFIG_FIELDS)}",
        )
    fields = {k: v for k, v in overrides.items() if k != "preset"}
    return CorrectionConfig(preset=preset or overrides.get("preset") or None, semantics=semantics, **fields)


def settings_from_pairs(pairs: list[str], family: str) -> dict[str, Any]:
    """`FIELD=VALUE` settings as a family's upstream fields, typed as its `[correction]` table's.

    Values stay text except booleans: the `[correction]` table's checks read numbers and "none" from text.
    """
    allowed = family_fields()[family]
    table = correction_table()
    fields: dict[str, Any] = {}
    for pair_text in pairs:
        name, sep, value = pair_text.partition("=")
        name, value = name.strip(), value.strip()
        if sep and name and not value:
            refuse_empty({name: value}, family)
        if not sep or not name:
            raise ConfigError(f"expected FIELD=VALUE, got {pair_text!r}",
                              hint=f"e.g. {allowed[0]}=...; semantics {family} takes {', '.join(allowed)}")
        if name not in allowed:
            home = field_home(name)  # a field of another family: say whose (`use_tis` is slime's and Miles')
            error = unknown_fields(family, [name], allowed, f"{name} is a field of semantics {home}" if home else "")
            if home:
                error.hint = f"choose semantics {home.split(',')[0].split(' ')[0]} to set {name}; {error.hint}"
            raise error
        typed: Any = value.lower() == "true" if table.get(name) == "bool" and value.lower() in (
            "true", "false") else value
        try:
            check_fields({name: typed}, table, f"semantics {family}:")
        except UsageError as error:
            error.hint = f"{error.hint}; semantics {family} takes {', '.join(allowed)}"
            raise
        fields[name] = typed
    return fields


def family_of(table: dict[str, Any], semantics: str | None, origin: str) -> str:
    """The family a `[correction]` table and an explicit `semantics` name (the explicit one wins)."""
    family = semantics if semantics is not None else str(table.get("semantics", "verl"))
    if family not in families():
        raise ConfigError(f"{origin}: unknown semantics '{family}'", hint=f"use one of {', '.join(families())}")
    return family


def config_from_sources(table: dict[str, Any], fields: dict[str, Any], semantics: str | None = None,
                        preset: str | None = None, origin: str = "[correction]") -> CorrectionConfig:
    """Merge a `[correction]` table with explicitly given upstream fields (which win) into one configuration."""
    family = family_of(table, semantics, origin)
    table = {k: v for k, v in table.items() if k != "semantics"}
    if family not in VERL_FAMILIES:
        return CorrectionConfig(semantics=family, family_fields={**table, **fields})
    for key in table:
        if key not in family_fields()["verl"] and field_home(key):
            home = field_home(key)
            raise ConfigError(f"{origin}: {key} is not a field of verl 0.9's [correction]",
                              hint=f"add semantics = \"{home.split(',')[0].split(' ')[0]}\" ({key} belongs to {home})")
    preset = preset or table.pop("preset", None)
    return build_config({**table, **fields}, preset=preset, semantics=family)


def resolve(config: CorrectionConfig) -> ResolvedCorrection:
    """Validate a configuration the way its family's upstream code does and return what the engine needs."""
    family = config.semantics
    own = {name: getattr(config, name) for name in CONFIG_FIELDS}
    check_fields(own if family in VERL_FAMILIES else config.family_fields, correction_table(), "CorrectionConfig:")
    if family not in VERL_FAMILIES:
        return resolve_family(family, config.family_fields)[0]
    return resolve_verl(config.verl_fields, family)


def _mask_dtype(family: str, value: Any) -> str:
    if value not in (None, "float", "bool"):
        raise ConfigError(f"mask_dtype must be 'float' or 'bool', got {value!r}", hint="use float or bool")
    if family in XTUNER:
        # xtuner's trainer always hands over a bool mask (shifted_labels != -100): there is no float variant.
        if value == "float":
            raise ConfigError(f"{family} always uses a bool mask, as xtuner's trainer does",
                              hint="drop mask_dtype = \"float\" (\"bool\" is implied)")
        return "bool"
    if value == "bool" and family in VERL_FAMILIES:
        raise ConfigError("mask_dtype bool is supported for the older families only",
                          hint="verl 0.8 / 0.9's numbers differ from a bool mask's by < 1e-8 relative")
    return value or "float"


def _check_family(family: str, fields: dict[str, Any]) -> None:
    if family not in families():
        raise ConfigError(f"unknown semantics '{family}'", hint=f"use one of {', '.join(families())}")
    allowed = family_fields()[family]
    wrong = [k for k in fields if k not in allowed]
    if wrong:
        homes = "; ".join(f"{k} belongs to {field_home(k) or 'no family'}" for k in wrong)
        raise unknown_fields(family, wrong, allowed, homes)


def refuse_empty(fields: Mapping[str, Any], family: str) -> None:
    """Refuse a field whose value is empty text (`tis_ratio_type=`, often an unset shell variable): it would read
    as unset and switch a correction off without a word."""
    empty = [name for name, value in fields.items() if isinstance(value, str) and not value.strip()]
    if empty:
        raise ConfigError(f"{empty[0]} has an empty value (semantics {family})",
                          hint=f"give {empty[0]} a value, or write {empty[0]}=none to switch it off")


def resolve_family(family: str, fields: dict[str, Any]) -> tuple[ResolvedCorrection, dict[str, Any]]:
    """Validate a family's upstream fields as its code does; return what the engine needs and the config."""
    refuse_empty(fields, family)
    # TOML has no null: "none" / "null" switch a field off (verl 0.6.0's veto is on by default).
    fields = {k: None if isinstance(v, str) and v.strip().lower() in NONE_WORDS else v for k, v in fields.items()}
    trainer = replay_families().get(family)
    if trainer is not None:  # a replayed trainer: its own keys only (docs/trainers.md)
        check_trainer_fields(trainer, fields)
        settings, effective = trainer.resolve(fields)
        resolved = ResolvedCorrection(None, None, False, trainer=settings, trainer_accumulator=trainer.accumulator,
                                      replay=True)
        return resolved, {"semantics": family, **effective}
    mask_dtype = _mask_dtype(family, fields.pop("mask_dtype", None))
    _check_family(family, fields)
    if family in VERL_FAMILIES:
        config = build_config({k: v for k, v in fields.items() if k != "preset"}, preset=fields.get("preset"),
                              semantics=family)
        return resolve(config), config.to_dict()
    exact = {"mask_dtype": mask_dtype}
    if family == "verl-0.7.1":
        check_071_preset(fields.get("preset"))
        config = build_config({k: v for k, v in fields.items() if k != "preset"}, preset=fields.get("preset"))
        if config.rollout_is is not None and config.rollout_is_threshold is not None:
            positive_number("rollout_is_threshold", config.rollout_is_threshold, family)
        result = resolve_071(config.verl_fields)
        effective = {**config.to_dict(), "semantics": family, **exact}
    else:
        result = ResolvedCorrection(None, None, False, family_spec=resolve_older(family, fields))
        effective = {"semantics": family, **fields, **exact}
    if mask_dtype == "bool" and result.family_spec is not None:
        result = replace(result, family_spec=replace(result.family_spec, exact_mask=True))
    return result, effective


def presets_table(family: str) -> tuple[tuple[str, ...], list[dict[str, Any]]]:
    """A family's presets as rows (name, its fields, summary) and the fields shown; no rows when it has none."""
    if older_presets(family):
        fields: tuple[str, ...] = ("rollout_is", "rollout_is_threshold", "rollout_rs", "rollout_rs_threshold",
                                   "rollout_rs_threshold_lower", "rollout_token_veto_threshold", "bypass_mode")
        return fields, [{"name": name, **{f: values.get(f) for f in fields}, "summary": summary}
                        for name, (values, summary) in older_presets(family).items()]
    fields = ("rollout_is", "rollout_is_threshold", "rollout_rs", "rollout_rs_threshold", "bypass_mode", "loss_type")
    if family not in (*VERL_FAMILIES, "verl-0.7.1"):
        return fields, []  # verl 0.6.0's mismatch_helper and xtuner configure fields directly: no presets
    chosen = PRESETS_071 if family == "verl-0.7.1" else PRESETS
    return fields, [{"name": p.name, **{f: p.fields[f] for f in fields}, "summary": p.summary} for p in chosen.values()]

