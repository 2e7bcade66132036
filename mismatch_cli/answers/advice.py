"""What to do about a cause, said in the user's trainer: the action, then its own settings (from the family's
vocabulary of fixes, correction/fixes.py) and the traps the evidence fits.

The first screen shows the settings by name and version; the report's JSON carries each with its upstream file
and line (`recommendation.fix.settings`), and docs/fixes.md lists them all.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mismatch_cli.correction.fixes import Fixes, Setting, fixes_for

# Per cause, the concerns of the vocabulary whose settings close it, the one to try first first.
CAUSE_CONCERNS: dict[str, tuple[str, ...]] = {
    "temperature_mismatch": ("temperature", "logprobs_mode"),
    "processed_logprobs": ("truncation",),
    "ratio_mean": ("logprobs_mode", "truncation"),
    "identical_sides": ("rollout_logprobs",),
    "constant_fill": ("rollout_logprobs",),
    "shifted_streams": (),
    "precision_gap": ("precision",),
    "lag_or_precision": ("policy_version",),
    "policy_lag": ("policy_version",),
    "mask_covers_prompt": ("response_mask",),
    "logit_processor": ("penalties",),
    "low_precision": ("low_precision",),
    "correction_drops": (),  # the replacement follows in the trainer's own syntax (the recommendation's line)
}
SHOWN_PER_CONCERN = 1  # settings of one concern on the first screen (the JSON and `mismatch fixes`: all)
SHOWN_TRAPS = 1


def family_of(config: Mapping[str, Any]) -> str:
    """The report's family (`semantics`), verl when absent."""
    return str(config.get("semantics") or "verl")


def _setting(setting: Setting) -> str:
    return f"{setting.text} ({setting.note})" if setting.note else setting.text


def concerns_of(cause: str, evidence: Mapping[str, Any] | None = None) -> tuple[str, ...]:
    """The concerns that close a cause, given its evidence (a truncation that may be a penalty: both)."""
    if cause == "processed_logprobs" and (evidence or {}).get("or_penalty"):
        return (*CAUSE_CONCERNS[cause], "penalties")
    return CAUSE_CONCERNS.get(cause, ())


def settings_for(cause: str, fixes: Fixes, evidence: Mapping[str, Any] | None = None) -> list[Setting]:
    """The settings of a cause's concerns, the first ones first (a fill of the old side needs none)."""
    if cause == "constant_fill" and (evidence or {}).get("side") == "old":
        return []
    found: list[Setting] = []
    for concern in concerns_of(cause, evidence):
        found += list(fixes.settings.get(concern) or ())
    return found


def in_trainer(cause: str, family: str, evidence: Mapping[str, Any] | None = None) -> str:
    """`in <trainer>: <settings>; known trap: …` for a cause, or '' when the family has nothing to say."""
    fixes = fixes_for(family)
    if fixes is None or not settings_for(cause, fixes, evidence) and cause == "constant_fill":
        return ""
    parts = []
    for concern in concerns_of(cause, evidence):
        shown = (fixes.settings.get(concern) or ())[:SHOWN_PER_CONCERN]
        if shown:
            parts += [_setting(s) for s in shown]
        elif fixes.missing.get(concern):
            missing = fixes.missing[concern]
            parts.append(missing if missing.startswith("no ") else f"no {concern.replace('_', ' ')} setting: {missing}")
    traps = [trap.text for trap in fixes.traps_for(cause)[:SHOWN_TRAPS]]
    text = f"in {fixes.trainer}: {'; '.join(parts)}" if parts else ""
    if traps:
        text += ("; " if text else "") + f"known trap in {fixes.trainer}: {traps[0]}"
    more = sum(len(fixes.settings.get(c) or ()) for c in concerns_of(cause, evidence)) > len(parts)
    if text and more:
        text += f" (more: mismatch fixes --semantics {family})"
    return text


def fix_text(action: str, cause: str, config: Mapping[str, Any], evidence: Mapping[str, Any] | None = None) -> str:
    """The action, then what it takes in the user's trainer."""
    trainer = in_trainer(cause, family_of(config), evidence)
    return f"{action}; {trainer}" if trainer else action


def fix_entry(code: str, text: str, config: Mapping[str, Any],
              evidence: Mapping[str, Any] | None = None, title: str | None = None) -> dict[str, Any]:
    """The recommendation's `fix`: its code, the finding it fixes, its text, trainer and every setting with its
    upstream source."""
    family = family_of(config)
    fixes = fixes_for(family)
    settings = settings_for(code, fixes, evidence) if fixes is not None else []
    return {"code": code, "title": title, "text": text, "trainer": fixes.trainer if fixes else None,
            "settings": [{"text": s.text, "source": s.source, "note": s.note} for s in settings]}


__all__ = ["CAUSE_CONCERNS", "concerns_of", "family_of", "fix_entry", "fix_text", "in_trainer", "settings_for"]
