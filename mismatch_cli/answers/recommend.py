"""The recommendation: the least invasive what-if setting that brings every health check back into its band.

"Least invasive" (docs/report.md, "Recommendation"): a setting is judged by how much of the gradient
it changes, compared in this order:

1. scope: a token-level rule touches only the offending tokens, a sequence-level rule every token of
   an offending row, so token rules come first;
2. kind: capping a weight (TIS) keeps the token's gradient, dropping it (IcePop zeroes the weight,
   RS and the veto mask the row) removes it, so truncation comes before dropping;
3. amount: the smaller share of valid tokens truncated or dropped, then the smaller share of rows
   with a dropped token;
4. among settings that touch exactly the same tokens and rows, one a preset names (verl's default TIS
   cap of 2.0 is `decoupled_token_is`), then the wider threshold (a higher TIS cap, a wider band, a
   smaller veto ratio).

So, with the ladder of engine/accumulators/whatif.py: token TIS at the highest cap that works, then token IcePop,
then sequence TIS, then the sequence-level drops (IcePop, RS, veto) by the share of tokens they drop.
Only settings the run's trainer family can express exactly are considered: verl's and the older families' by
`SUPPORTED`, a replayed trainer's by its vocabulary's mapping (answers/corrections.py), so `--semantics skyrl`
ranks SkyRL's TIS types and masks and prints the winner as `--set` lines and as SkyRL's own overrides.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from mismatch_cli.answers import corrections
from mismatch_cli.answers.health import (
    IS_ESS,
    RAW_ESS,
    REMOVED,
    after_what_if,
    applies_correction,
    matching_row,
    summarize,
)
from mismatch_cli.correction import PRESETS, PRESETS_071, older_presets
from mismatch_cli.correction.fixes import fixes_for

# The what-if families each trainer family can run with exactly the ladder's rule (docs/report.md).
SUPPORTED: dict[str, tuple[str, ...]] = {
    "verl": ("tis", "icepop", "rs"),
    "verl-0.8": ("tis", "icepop", "rs"),
    "verl-0.7.1": ("tis", "rs"),  # no IcePop before 0.8
    "verl-0.7.0": ("tis", "veto"),  # its RS is token / sequence / geometric, not the ladder's k1 / k3 options
    "verl-0.6.1": ("tis", "veto"),
    "verl-0.6.0": ("tis", "icepop"),  # truncate mode; mask mode zeroes weights outside [L, U] as IcePop does
    "xtuner": (),  # two-sided clamp, a mask that keeps raw weights, a two-sided veto: none is a ladder rule
    "xtuner-2025-12": (),
}
DROPS = ("icepop", "rs", "veto")
ESS_KEYS = (IS_ESS, RAW_ESS)  # a setting passes only when its ESS is known (and in band)
# verl 0.6.0's veto is on by default (1e-4): the ladder's rows are without it, so the flags switch it off.
V060_NO_VETO = {"rollout_is_veto_threshold": None}
# What fp8 / low-precision RL recipes turn on: token-level TIS capped at 2 (verl's decoupled_token_is preset).
RECIPE_SCENARIO = "TIS token 2.0"


def expressible(row: Mapping[str, Any], family: str) -> bool:
    """Whether the family can run a what-if row exactly (its own fields give the same rule)."""
    if corrections.is_replayed(family):
        return corrections.row_fields(row, family) is not None
    return row.get("family") in SUPPORTED.get(family, ())


def _bounds(threshold: str) -> tuple[float, float]:
    lower, upper = threshold.split("_")
    return float(lower), float(upper)


def _number(threshold: str) -> float | str:
    return threshold if "_" in threshold else float(threshold)


def invasiveness(row: Mapping[str, Any]) -> tuple[float, ...]:
    """The sort key of a what-if row: smaller is less invasive (scope, kind, amount, then threshold width)."""
    family, threshold = str(row["family"]), str(row.get("threshold"))
    scope = 0 if row.get("level") == "token" and family != "veto" else 1  # the veto drops whole rows
    kind = 1 if family in DROPS else 0
    touched = row.get("truncated_token_fraction") if family == "tis" else row.get("masked_token_fraction")
    if "_" in threshold:
        lower, upper = _bounds(threshold)
        width = -(math.log(upper) - math.log(lower)) if lower > 0 else -math.inf
    else:
        width = float(threshold) if family == "veto" else -float(threshold)
    return (scope, kind, float(touched or 0.0), float(row.get("masked_seq_fraction") or 0.0), width)


def fields_for(row: Mapping[str, Any], family: str) -> dict[str, Any]:
    """The trainer's config fields that run a what-if row in `family` (verl's names, the older family's, or a
    replayed trainer's own)."""
    if corrections.is_replayed(family):
        return corrections.row_fields(row, family) or {}
    level, threshold, kind = row["level"], str(row["threshold"]), row["family"]
    if family == "verl-0.6.0":
        mode = "mask" if kind == "icepop" else "truncate"
        fields: dict[str, Any] = {"rollout_is_level": level, "rollout_is_mode": mode}
        if kind == "icepop":
            lower, upper = _bounds(threshold)
            fields.update(rollout_is_threshold=upper, rollout_is_threshold_lower=lower)
        else:
            fields["rollout_is_threshold"] = float(threshold)
        return {**fields, **V060_NO_VETO}
    if kind in ("tis", "icepop"):
        return {"rollout_is": level, "rollout_is_threshold": _number(threshold)}
    if kind == "rs":
        return {"rollout_rs": row["option"], "rollout_rs_threshold": _number(threshold)}
    return {"rollout_token_veto_threshold": float(threshold)}


def flags_for(row: Mapping[str, Any], family: str) -> str:
    """The `mismatch analyze` flags that run a what-if row under `--semantics family`."""
    fields = fields_for(row, family)
    if corrections.is_replayed(family):
        return corrections.set_flags(fields)
    if family == "verl-0.6.0":
        text = f"--is-level {fields['rollout_is_level']} --is-mode {fields['rollout_is_mode']} " \
               f"--is-threshold {fields['rollout_is_threshold']:g}"
        if "rollout_is_threshold_lower" in fields:
            text += f" --is-threshold-lower {fields['rollout_is_threshold_lower']:g}"
        return text + " --veto-threshold none"
    if row["family"] == "veto":
        return f"--veto-threshold {row['threshold']}"
    return str(row["flags"])


def _same(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is b
    if isinstance(a, str) or isinstance(b, str):
        return str(a) == str(b)
    return float(a) == float(b)


def _correction(values: Mapping[str, Any]) -> dict[str, Any]:
    """IS and RS fields with the thresholds of switched-off parts dropped (verl's defaults keep an IS cap of 2)."""
    out = dict(values)
    if out.get("rollout_is") is None:
        out["rollout_is_threshold"] = None
    if out.get("rollout_rs") is None:
        out["rollout_rs_threshold"] = None
    return out


def preset_for(fields: Mapping[str, Any], family: str, config: Mapping[str, Any]) -> str | None:
    """The first preset of the family whose correction is exactly `fields` (with the run's bypass / loss type)."""
    keys = ("rollout_is", "rollout_is_threshold", "rollout_rs", "rollout_rs_threshold")
    if corrections.is_replayed(family):
        return None  # presets are verl's
    fields = _correction(fields)
    run = {"bypass_mode": bool(config.get("bypass_mode") or False), "loss_type": config.get("loss_type")}
    if family in ("verl", "verl-0.8", "verl-0.7.1"):
        presets = PRESETS_071 if family == "verl-0.7.1" else PRESETS
        for name, preset in presets.items():
            if name != "disabled" and all(_same(_correction(preset.fields)[k], fields.get(k)) for k in keys) and \
                    preset.fields["bypass_mode"] == run["bypass_mode"] and \
                    (run["loss_type"] is None or preset.fields["loss_type"] == run["loss_type"]):
                return name
        return None
    keys += ("rollout_token_veto_threshold",)
    for name, (values, _summary) in older_presets(family).items():
        if name != "disabled" and all(_same(_correction(values).get(k), fields.get(k)) for k in keys) and \
                bool(values.get("bypass_mode", False)) == run["bypass_mode"] and \
                not values.get("rollout_rs_threshold_lower") and not values.get("use_policy_gradient"):
            return name
    return None


def _cost(row: Mapping[str, Any]) -> dict[str, Any]:
    return {"truncated_token_fraction": row.get("truncated_token_fraction"),
            "masked_token_fraction": row.get("masked_token_fraction"),
            "masked_sequence_fraction": row.get("masked_seq_fraction"), "ess": row.get("ess")}


def _native(fields: Mapping[str, Any], family: str) -> str | None:
    fixes = fixes_for(family)
    return fixes.native(fields) if fixes is not None and fixes.native is not None and fields else None


def _option(row: Mapping[str, Any], family: str, config: Mapping[str, Any]) -> dict[str, Any]:
    fields = fields_for(row, family)
    fixes = fixes_for(family)
    return {"scenario": row["name"], "flags": flags_for(row, family), "fields": fields,
            "native": _native(fields, family), "trainer": fixes.trainer if fixes is not None else None,
            "preset": preset_for(fields, family, config), "cost": _cost(row), "health_after": after_what_if(row)}


def recipe_option(what_if: Sequence[Mapping[str, Any]], config: Mapping[str, Any]) -> dict[str, Any] | None:
    """The correction low-precision RL recipes use (token TIS at 2), in the family's terms with its cost on this
    dump, or None when the family cannot express it."""
    family = str(config.get("semantics") or "verl")
    row = next((r for r in what_if if r.get("name") == RECIPE_SCENARIO), None)
    if row is None or not expressible(row, family):
        return None
    return _option(row, family, config)


OPTION_KEYS = ("scenario", "flags", "fields", "native", "trainer", "preset", "cost")


def _few_tokens_option(what_if: Sequence[Mapping[str, Any]], family: str, config: Mapping[str, Any],
                       metrics: Mapping[str, float | None], count: int) -> dict[str, Any] | None:
    """The least invasive token-level setting the family can run that truncates or drops at least `count`
    tokens (the few that carry an agreement check), or None."""
    tokens = metrics.get("diag/valid_tokens") or 0
    rows = sorted((r for r in what_if if r.get("level") == "token" and r.get("family") in ("tis", "icepop")
                   and expressible(r, family)), key=invasiveness)
    for row in rows:
        touched = (row.get("truncated_token_fraction") or 0.0) + (row.get("masked_token_fraction") or 0.0)
        if tokens and round(touched * tokens) >= count:
            option = _option(row, family, config)
            if _passes(option["health_after"]):
                return option
    return None


def _no_rule(family: str) -> str:
    fixes = fixes_for(family)
    missing = fixes.missing.get("correction") if fixes is not None else None
    if missing:
        return f"{fixes.trainer} has no correction the what-if ladder can run exactly: {missing}"
    return (f"the what-if ladder holds verl's rules, and none of them is a rule of --semantics {family}, so no "
            "setting can be recommended in its terms")


def _failing(health: Mapping[str, Any]) -> str:
    bad = [c for c in health.get("checks", []) if not c["ok"]]
    return ", ".join(f"{c['label']} {c['value']:.3g} (healthy: {c['healthy_range']})" for c in bad) or "none"


def _passes(health: Mapping[str, Any]) -> bool:
    checks = health.get("checks", [])
    return bool(checks) and all(c["ok"] for c in checks) and any(c["metric"] in ESS_KEYS for c in checks)


def _share(fraction: float, total: float | None, unit: str) -> str:
    count = f"{round(fraction * total):,} {unit}, " if total else ""
    return f"{count}{fraction:.3g} of all"


def _describe(option: Mapping[str, Any], metrics: Mapping[str, float | None]) -> str:
    cost, tokens = option["cost"], metrics.get("diag/valid_tokens")
    parts = []
    if cost.get("truncated_token_fraction"):
        parts.append(f"truncates the weight of {_share(cost['truncated_token_fraction'], tokens, 'tokens')}")
    if cost.get("masked_token_fraction"):
        parts.append(f"drops {_share(cost['masked_token_fraction'], tokens, 'tokens')} valid tokens, in "
                     f"{cost.get('masked_sequence_fraction') or 0.0:.3g} of the rows")
    else:
        parts.append("drops no token")
    ess = cost.get("ess")
    return ", ".join(parts) + (f"; ESS after: {ess:.4g}" if ess is not None else "")


def recommend(metrics: Mapping[str, float | None], config: Mapping[str, Any],
              what_if: Sequence[Mapping[str, Any]],
              few_tokens: Mapping[str, int] | None = None) -> dict[str, Any] | None:
    """The least invasive supported what-if setting whose after-health is in band, or why there is none."""
    if not what_if:
        return None
    family = str(config.get("semantics") or "verl")
    health = summarize(metrics, config, what_if, few_tokens)
    before = health["before"]
    base = {"scenario": None, "semantics": family, "flags": None, "fields": None, "native": None, "trainer": None,
            "preset": None, "cost": None, "health_before": before, "health_after": None, "alternatives": [],
            "best_partial": None}
    after = health["after"]
    agreement = health.get("agreement") or {}
    gap = agreement.get("status") == "warning"  # the log-probs themselves are out of band: no weight fixes that
    recipe = recipe_option(what_if, config) if gap else None  # for a deliberate low-precision rollout
    base["recipe"] = recipe
    if before["checks"] and before["status"] == "healthy":
        few = [c for c in agreement.get("checks", []) if c.get("few_tokens")]
        reason = "every health check of the raw ratios is in its band: no correction is needed"
        handling = None
        if gap:
            reason = ("the raw ratios' checks are in band, so the weights need no correction; the gap is in the "
                      "log-probs themselves, and only a fix at the source closes it")
        elif few:
            # Out through a few tokens: the correction's job (the verdict says so), never "no correction needed".
            handling = _few_tokens_option(what_if, family, config, metrics, few[0]["few_tokens"])
            reason = (f"the raw ratios' checks are in band; the {few[0]['few_tokens']} tokens that carry "
                      f"{few[0]['label']} are a token-level correction's job")
            if handling is None:
                reason += ", and no token-level setting the family can run touches them"
            elif not applies_correction(config):
                return {**base, **{k: handling[k] for k in OPTION_KEYS}, "health_after": handling["health_after"],
                        "reason": f"{reason}: {handling['scenario']} is the lightest setting that touches them; "
                                  f"it {_describe(handling, metrics)}"}
        # What the correction removes is said by its own line (the drop finding); other failing checks here.
        failing = [c for c in (after or {}).get("checks", []) if not c["ok"] and c.get("basis") != REMOVED]
        if failing:
            reason += f" (the run's own correction is out of band: {_failing({'checks': failing})})"
        if applies_correction(config):
            # The run pays for a correction the raw ratios do not need: say so, and name the lightest that passes.
            reason = reason.replace("the weights need no correction", "the run's correction is not needed")
            reason = reason.replace("no correction is needed", "the run's correction is not needed")
            if handling is not None:
                own = matching_row(config, what_if) or corrections.matching_row(config, what_if)
                mine = own is not None and own["name"] == handling["scenario"]
                named = f"the run's own correction, {handling['flags']}," if mine else f"instead, {handling['flags']}"
                reason += f"; {named} is the lightest setting that touches them: it {_describe(handling, metrics)}"
            else:
                rows = sorted((r for r in what_if if expressible(r, family)), key=invasiveness)
                passing = [(invasiveness(r)[:4], o) for r in rows
                           if _passes((o := _option(r, family, config))["health_after"])]
                if passing:  # among equally light settings, one a preset names (as below)
                    lighter = next((o for key, o in passing if key == passing[0][0] and o["preset"]),
                                   passing[0][1])
                    preset = f" (= --preset {lighter['preset']})" if lighter["preset"] else ""
                    reason += f"; if you keep one, {lighter['flags']}{preset} is the lightest in band: it " \
                              f"{_describe(lighter, metrics)}"
        return {**base, "health_after": after, "reason": reason}
    if after is not None and after["checks"] and after["status"] == "healthy":
        return {**base, "health_after": after,
                "reason": "the run's own correction already brings every health check into its band"}
    rows = sorted((r for r in what_if if expressible(r, family)), key=invasiveness)
    if not rows:
        return {**base, "reason": _no_rule(family)}
    options = [_option(row, family, config) for row in rows]
    keys = {id(o): invasiveness(row)[:4] for o, row in zip(options, rows, strict=True)}
    working = [o for o in options if _passes(o["health_after"])]
    if not working:
        def shortfall(option: Mapping[str, Any]) -> tuple[int, float]:
            checks = option["health_after"]["checks"]
            return sum(not c["ok"] for c in checks) or (0 if checks else 99), -(option["cost"]["ess"] or 0.0)

        best = min(options, key=shortfall)
        return {**base, "best_partial": best,
                "reason": f"no setting of the what-if ladder ({len(options)} for --semantics {family}) brings "
                          f"every check into its band (before: {_failing(before)}); the closest, "
                          f"{best['scenario']}, still fails {_failing(best['health_after'])}"}
    # Settings that touch exactly the same tokens and rows differ only in their threshold: among those, one
    # that a preset names (verl's defaults, e.g. TIS at 2.0) is the well-trodden choice.
    tied = [o for o in working if keys[id(o)] == keys[id(working[0])]]
    chosen = next((o for o in tied if o["preset"]), working[0])
    working = [chosen, *(o for o in working if o is not chosen)]
    alternatives = working[1:4]
    with_preset = next((o for o in working[1:] if o["preset"]), None)
    if with_preset is not None and with_preset not in alternatives:
        alternatives.append(with_preset)
    why = (f"while the log-probs stay out of band ({_failing(agreement)}), {chosen['scenario']} is the least "
           "invasive setting that keeps the weights in band") if gap else \
        f"{chosen['scenario']} is the least invasive setting that brings every check into its band"
    return {**base, **{k: chosen[k] for k in (*OPTION_KEYS, "health_after")},
            "alternatives": [{k: o[k] for k in ("scenario", "flags", "native", "preset", "cost")}
                             for o in alternatives],
            "reason": f"{why} (before: {_failing(before)}): it {_describe(chosen, metrics)}"}
