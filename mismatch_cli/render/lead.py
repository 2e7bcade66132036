"""What a report leads with, as text: the verdict, Why, What to do, the dump checks, drift and key metrics.

The terminal's first screen (render/summary.py) and the top of report.html (render/html_lead.py) lay out
the same lines, so both say the same thing in the same words; only the layout differs (wrapping, marks,
bold, colour). Nothing here knows a width, a colour or a tag.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from mismatch_cli.answers.findings.model import percent
from mismatch_cli.answers.hypotheses import ruled_out_text
from mismatch_cli.correction import REPLAY_FAMILIES
from mismatch_cli.metrics import lookup
from mismatch_cli.metrics.notes import explain
from mismatch_cli.render.cells import format_value
from mismatch_cli.render.paths import display_path
from mismatch_cli.report import Report

# The metrics shown under "Key metrics", when present, in this order (the health checks come first).
KEY_METRICS = (
    *(key for family in REPLAY_FAMILIES.values() for key in family.lead_keys),  # a replayed trainer's own keys
    "rollout_corr/kl", "rollout_corr/k3_kl", "rollout_corr/chi2_token", "rollout_corr/chi2_seq",
    "rollout_corr/ppl_ratio", "rollout_corr/rollout_is_eff_sample_size", "rollout_corr/rollout_rs_masked_fraction",
    "diag/ess_token", "diag/prob_pearson_corr", "diag/logprob_abs_diff_max",
)
SHOWN_KEY_METRICS = 6
CAUSE = "concentrated_divergence"
DROPS = "correction_drops"  # the run's correction removes too much: said in What to do, not among the dump checks
DEGENERATE = "degenerate_setting"  # a setting that makes the correction degenerate: leads the screen and What to do
OWN_CORRECTION = (DROPS, DEGENERATE)
NO_BUG = "none found"
BAD, GOOD = "bad", "good"
SEQ_ESS = "diag/ess_seq_kish"  # health checks it before a correction only when the correction is sequence-level
RS_MASKED, RS_SEQ_MASKED = "rollout_corr/rollout_rs_masked_fraction", "rollout_corr/rollout_rs_seq_masked_fraction"
TIS_HIGH, SEQ_TIS_HIGH = "rollout_corr/rollout_is_ratio_fraction_high", "rollout_corr/rollout_is_seq_fraction_high"
TIS_LOW, SEQ_TIS_LOW = "rollout_corr/rollout_is_ratio_fraction_low", "rollout_corr/rollout_is_seq_fraction_low"
# The abbreviations of the first screen, spelled out once below it (only those it shows), and in report.html
# and Markdown: (term, its spellings as a word, meaning); `ESS` is found in `IS ESS`, `IS` not in `TIS`.
GLOSSARY = (
    ("TIS", ("TIS",), "truncated importance sampling"),
    ("IS", ("IS",), "importance sampling"),
    ("RS", ("RS",), "rejection sampling"),
    ("ESS", ("ESS", "ess"), "effective sample size"),
    ("k1, k3", ("k1", "k3"), "KL estimators"),
    ("χ²", ("χ²", "chi2", "chi-squared"), "chi-squared divergence"),
)


@dataclass(frozen=True)
class Line:
    """One answer: its text, whether it is bad news, the words that name it, and one line explaining it."""

    text: str
    tone: str = ""  # BAD: out of band, an error, a fix to make first; GOOD: every check in band
    lead: str = ""  # the opening words of `text` that name the line ("cost", "fix first"), bold in HTML
    note: str | None = None  # what the line means, shown under it
    prose: bool = False  # a sentence rather than an item of a list


@dataclass(frozen=True)
class Verdict:
    """The health verdict: its headline (after "Health: "), one line per check, and the raw verdict before the
    correction when the correction changes it."""

    status: str  # summary["status"]: healthy, warning or bug
    headline: str
    tone: str
    checks: list[Line]
    before: str | None


@dataclass(frozen=True)
class KeyMetric:
    """A key metric: its short name, value, 95 % bootstrap interval (when drawn) and what a strange value means."""

    key: str
    name: str
    value: str
    interval: tuple[str, str] | None
    note: str | None


def inputs_text(report: Report, width: int | None = None) -> str:
    """The first input (and how many more), with the sequences and valid tokens of all of them.

    With a terminal `width` the path is shown as render/paths.py's display rule says; without, whole.
    """
    sequences = sum(item.sequences for item in report.inputs)
    tokens = sum(item.tokens for item in report.inputs)
    first = "no input"
    if report.inputs:
        path = report.inputs[0].path
        first = display_path(path, width - len("mismatch: ") - 1) if width else path
    more = f" and {len(report.inputs) - 1} more files" if len(report.inputs) > 1 else ""
    return f"{first}{more}: {format_value(sequences)} sequences, {format_value(tokens)} valid tokens"


def correction_text(config: Mapping[str, Any]) -> str:
    """The correction the run applies, in its config fields: a threshold only beside the IS or RS it bounds
    (verl's config always holds rollout_is_threshold=2.0, used only when rollout_is is set)."""
    replayed = REPLAY_FAMILIES.get(str(config.get("semantics")))
    if replayed is not None:  # the trainer's own fields (docs/trainers.md)
        return replayed.describe(config)
    shown = [key for key in ("preset", "rollout_is", "rollout_is_threshold", "rollout_rs", "rollout_rs_threshold")
             if config.get(key) is not None]
    if "preset" in config:  # the verl families: rollout_is / rollout_rs turn IS / RS on
        shown = [key for key in shown if not (key == "rollout_is_threshold" and config.get("rollout_is") is None)
                 and not (key == "rollout_rs_threshold" and config.get("rollout_rs") is None)]
    parts = [f"{key}={config[key]}" for key in shown]
    if config.get("rollout_is") is None and config.get("rollout_rs") is None and "preset" in config:
        parts = ["none (metrics only)"]
    return ", ".join(parts) or str(config.get("semantics", "verl")) + " fields"


REDUCTION_WORDS = ("mean", "max", "min", "std", "all")  # too generic to name a key on their own


def _short(key: str, keys: Iterable[str] = ()) -> str:
    """A key as Key metrics names it: its shortest tail of `/` parts that no other shown key shares and that is
    more than a reduction word (`rollout_corr/kl` -> `kl`, `sampling/importance_sampling_ratio/mean` ->
    `importance_sampling_ratio/mean`)."""
    parts = key.split("/")
    others = [k.split("/") for k in keys if k != key]
    for size in range(1, len(parts) + 1):
        tail = parts[-size:]
        if tail[0] in REDUCTION_WORDS and size < len(parts):
            continue
        if not any(other[-size:] == tail for other in others):
            return "/".join(tail)
    return key


def check_mark(check: Mapping[str, Any]) -> str:
    """`ok`, `few` (out of band through a few tokens only) or `OUT`, three characters wide."""
    return "ok " if check["ok"] else "few" if check.get("few_tokens") else "OUT"


def verdict(report: Report) -> Verdict:
    """The verdict: a bug that explains the mismatch first, else how many checks are out of band."""
    summary = report.summary
    checks = summary.get("checks", [])
    failing = [c for c in checks if not c["ok"] and not c.get("few_tokens")]
    few = [c for c in checks if c.get("few_tokens")]
    status = str(summary.get("status", "healthy"))
    after = summary.get("after") or {}
    basis = (after if after.get("checks") else summary.get("before") or {}).get("basis", "")
    diagnosis = summary.get("diagnosis") or {}
    if diagnosis.get("kind") == "bug":
        headline, tone = f"BUG IN THE DUMP OR CONFIG - {diagnosis['title']}", BAD
    elif diagnosis.get("kind") == "correction":
        headline, tone = f"WARNING - {diagnosis['title']}", BAD
    else:
        headline = status.upper()
        if checks:
            headline += f" - {len(failing)} of {len(checks)} checks out of band" if failing else \
                " - every check in band"
            headline += f" but {len(few)}, out through a few tokens" if few and not failing else ""
        headline += f" ({basis})" if basis and not (few and not failing) else ""
        tone = BAD if failing else GOOD
    lines = []
    for check in checks:
        note = explain(check["metric"], check["value"], report.metrics, sequence_level=sequence_level(report))
        if check.get("few_tokens"):
            note = f"out through {check['few_tokens']} tokens only (see Why): a correction's job, not precision"
        text = f"{check_mark(check)} {check['label']}: {format_value(check['value'])} " \
               f"(healthy: {check['healthy_range']})"
        lines.append(Line(text, "" if check["ok"] else BAD, check_mark(check).strip(), note))
    before, after = summary.get("before"), summary.get("after")
    raw = None
    if after and before and before.get("status") != after.get("status"):
        raw = f"before the correction (raw ratios): {str(before['status']).upper()}" \
              f"{'; ' + _failing(before) if before['status'] != 'healthy' else ''}"
    return Verdict(status, headline, tone, lines, raw)


def _failing(health: Mapping[str, Any]) -> str:
    return ", ".join(f"{c['label']} {format_value(c['value'])}" for c in health.get("checks", []) if not c["ok"])


def findings_of(report: Report) -> list[Mapping[str, Any]]:
    """The report's findings as mappings, most severe first."""
    return [f if isinstance(f, Mapping) else f.to_dict() for f in (getattr(report, "findings", None) or [])]


def causes(findings: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The findings that say why a check fails (Why)."""
    return [f for f in findings if f.get("code") == CAUSE]


def bug_signatures(findings: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The findings that are signatures of the dump (Dump checks), not of the run's correction (What to do)."""
    return [f for f in findings if f.get("code") not in (CAUSE, *OWN_CORRECTION)]


def ruled_out(report: Report) -> str:
    """The causes the dump's measurements rule out, each with the number that does (answers/hypotheses.py)."""
    return ruled_out_text(report.summary.get("causes") or [])


def setting_warnings(findings: Iterable[Mapping[str, Any]], summary: Mapping[str, Any] | None = None) -> list[str]:
    """The lines that lead the screen: what the trainer itself warns about the settings given (a deprecated field
    replacing one), then each setting that makes the run's correction degenerate."""
    said = [f"warning: {text}" for text in (summary or {}).get("setting_warnings", [])]
    return said + [f"warning: {f['title']}" for f in findings if f.get("code") == DEGENERATE]


def cost_text(cost: Mapping[str, Any]) -> str:
    """What a correction costs: truncated, dropped tokens and sequences, the ESS after it."""
    parts = []
    if cost.get("truncated_token_fraction"):
        parts.append(f"truncates {percent(cost['truncated_token_fraction'])} of tokens")
    if cost.get("truncated_sequence_fraction"):
        parts.append(f"truncates {percent(cost['truncated_sequence_fraction'])} of sequences")
    for unit in ("token", "sequence"):
        if cost.get(f"zeroed_{unit}_fraction"):
            parts.append(f"zeroes the weight of {percent(cost[f'zeroed_{unit}_fraction'])} of {unit}s")
    tokens, rows = cost.get("masked_token_fraction") or 0.0, cost.get("masked_sequence_fraction") or 0.0
    parts.append(f"drops {percent(tokens)} of tokens and {percent(rows)} of sequences" if tokens or rows
                 else "drops nothing")
    if cost.get("ess") is not None:
        parts.append(f"ESS after {format_value(cost['ess'])}")
    return "; ".join(parts)


def _named(lead: str, text: str, tone: str = "") -> Line:
    return Line(f"{lead}: {text}", tone, lead)


def sequence_level(report: Report) -> bool:
    """Whether the verdict is judged for a sequence-level correction (the run's or the recommended one): then
    health checks the raw rows' ESS (docs/report.md, "The health summary")."""
    before = report.summary.get("before") or {}
    return any(c.get("metric") == SEQ_ESS for c in before.get("checks", []))


def applied_cost(report: Report) -> dict[str, Any] | None:
    """What the run's own correction truncates and drops, from its RS / IS keys (cost_text's fields), or None
    when it applies none."""
    metrics, config = report.metrics, report.config
    if config.get("rollout_is") is None and config.get("rollout_rs") is None:
        return None
    cost: dict[str, Any] = {"masked_token_fraction": metrics.get(RS_MASKED),
                            "masked_sequence_fraction": metrics.get(RS_SEQ_MASKED)}
    level = config.get("rollout_is")
    if level is not None and "_" in str(config.get("rollout_is_threshold")):  # IcePop: zeroed outside [low, high]
        high, low = (TIS_HIGH, TIS_LOW) if level == "token" else (SEQ_TIS_HIGH, SEQ_TIS_LOW)
        if metrics.get(high) is not None and metrics.get(low) is not None:
            cost[f"zeroed_{'token' if level == 'token' else 'sequence'}_fraction"] = metrics[high] + metrics[low]
    elif level == "token":  # TIS caps a token's weight at the threshold: its gradient stays
        cost["truncated_token_fraction"] = metrics.get(TIS_HIGH)
    elif level is not None:
        cost["truncated_sequence_fraction"] = metrics.get(SEQ_TIS_HIGH)
    return cost if any(v is not None for v in cost.values()) else None


def what_to_do(recommendation: Mapping[str, Any] | None, diagnosis: Mapping[str, Any],
               applied: Mapping[str, Any] | None = None) -> list[Line]:
    """A bug's fix first (and no correction), or a correction that drops too much and a precision fix at the
    source, then the correction: its flags, its own syntax, cost, health after and alternatives (docs/report.md,
    "The summary"), each fix in the report's trainer. When nothing new is recommended and the run applies a
    correction, `applied` (`applied_cost`) says what that one costs."""
    lines = _what_to_do(recommendation, diagnosis)
    if applied and recommendation and not recommendation.get("scenario") and diagnosis.get("kind") not in (
            "bug", "correction"):  # a correction that drops too much says its cost in its own line
        lines.insert(0, _named("your correction costs", cost_text(applied)))
    return lines


FIX_LEADS = {"correction_drops": "your correction", "degenerate_setting": "your setting",
             "precision_gap": "at the source", "lag_or_precision": "or a policy lag", "policy_lag": "the policy lag"}


def what_to_do_of(report: Report) -> list[Line]:
    """What to do for a report: `what_to_do`, then, when several files were pooled into an unhealthy verdict,
    a hint that they may be runs to compare rather than one run."""
    lines = what_to_do(getattr(report, "recommendation", None), report.summary.get("diagnosis") or {},
                       applied_cost(report))
    if len(report.inputs) > 1 and report.summary.get("status") != "healthy":
        names = " ".join(item.path for item in report.inputs[:3]) + (" …" if len(report.inputs) > 3 else "")
        lines.append(_named(f"{len(report.inputs)} files analyzed as one run",
                            f"if they are separate runs or arms (other precisions, settings or code), compare "
                            f"them instead: mismatch compare {names}"))
    return lines


def _fixes(recommendation: Mapping[str, Any] | None, diagnosis: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    fixes = list((recommendation or {}).get("fixes") or [])
    if not fixes:
        fix = (recommendation or {}).get("fix") or ({"text": diagnosis["fix"], "code": diagnosis.get("code")}
                                                    if diagnosis.get("fix") else None)
        fixes = [fix] if fix else []
    return fixes


def _what_to_do(recommendation: Mapping[str, Any] | None, diagnosis: Mapping[str, Any]) -> list[Line]:
    fixes = _fixes(recommendation, diagnosis)
    if not recommendation and not fixes:
        return []
    if fixes and diagnosis.get("kind") == "bug":
        # A correction reweights real log-probs; it cannot repair log-probs that are not the engine's.
        return [_named("fix first", fixes[0]["text"], BAD),
                _named("no correction is recommended until then", "the numbers above measure the bug, not the "
                       "engines; run mismatch analyze again on a dump made after the fix")]
    lines = []
    for fix in fixes:
        if fix.get("code") == DROPS and fix.get("title"):
            # The finding's title already says "your correction drops …": the line leads with it.
            lines.append(Line(f"{fix['title']}: {fix['text']}", BAD, "your correction"))
            continue
        if fix.get("code") == DEGENERATE:
            lines.append(_named("fix your setting first", fix["text"], BAD))
            continue
        lines.append(_named(FIX_LEADS.get(str(fix.get("code")), "at the source"), fix["text"]))
    recipe = (recommendation or {}).get("recipe")
    if recipe:
        lines.append(_named("if the low precision is deliberate (fp8 / int8 / fp16 rollouts)",
                            f"correct it as low-precision RL recipes do, with {recipe['scenario']}: "
                            f"{_own_words(recipe)}; it {cost_text(recipe.get('cost') or {})}"))
    if not recommendation:
        return lines
    if not recommendation.get("scenario"):
        return [*lines, Line(str(recommendation.get("reason", "")), prose=True)]
    preset = f" (= --preset {recommendation['preset']})" if recommendation.get("preset") else ""
    replacing = any(f.get("code") == "correction_drops" for f in fixes)
    lead = "instead, turn on" if replacing else "meanwhile, turn on" if fixes else "turn on"
    own = f"; in {recommendation['trainer']}: {recommendation['native']}" if recommendation.get("native") and \
        recommendation.get("trainer") else ""
    lines.append(Line(f"{lead} {recommendation['scenario']}: {recommendation['flags']}{preset}{own}", lead=lead))
    lines.append(_named("cost", cost_text(recommendation.get("cost") or {})))
    after = recommendation.get("health_after") or {}
    if after:
        values = ", ".join(f"{lookup(c['metric']).title if lookup(c['metric']) else c['metric']} "
                           f"{format_value(c['value'])}" for c in after.get("checks", []))
        kept = "; the log-prob checks stay as they are" if any(f.get("code") == "precision_gap" for f in fixes) \
            else ""
        lines.append(_named("health after", f"{str(after.get('status')).upper()} ({values}){kept}"))
    alternatives = [a["flags"] for a in recommendation.get("alternatives", [])[:2] if a.get("flags")]
    if alternatives:
        lines.append(_named("also in band", "; ".join(alternatives)))
    return lines


def _own_words(option: Mapping[str, Any]) -> str:
    """An option as the trainer's own configuration when it has one, else as mismatch's flags."""
    if option.get("native") and option.get("trainer"):
        return f"in {option['trainer']}, {option['native']}"
    return str(option.get("flags"))


def key_metrics(report: Report) -> tuple[str, list[KeyMetric]]:
    """The block's title and the key metrics not already among the health checks."""
    shown = [c["metric"] for c in report.summary.get("checks", [])]
    keys = [k for k in KEY_METRICS if report.metrics.get(k) is not None and k not in shown][:SHOWN_KEY_METRICS]
    intervals = any(report.intervals.get(key) for key in keys)  # none with --bootstrap 0: do not promise them
    rows = []
    for key in keys:
        interval = report.intervals.get(key)
        rows.append(KeyMetric(key, _short(key, keys), format_value(report.metrics[key]),
                              (format_value(interval[0]), format_value(interval[1])) if interval else None,
                              explain(key, report.metrics[key], report.metrics, interval, sequence_level(report))))
    return ("Key metrics (95 % bootstrap interval)" if intervals else "Key metrics"), rows


def glossary(text: str) -> str | None:
    """`TERM = meaning` for each abbreviation of GLOSSARY that `text` uses (as a word), or None."""
    used = [f"{term} = {meaning}" for term, spellings, meaning in GLOSSARY
            if any(re.search(rf"(?<![A-Za-z0-9-]){re.escape(word)}(?![A-Za-z0-9-])", text) for word in spellings)]
    return "; ".join(used) or None


__all__ = ["GLOSSARY", "KEY_METRICS", "NO_BUG", "KeyMetric", "Line", "Verdict", "applied_cost", "bug_signatures",
           "causes", "check_mark", "correction_text", "cost_text", "findings_of", "glossary",
           "inputs_text", "key_metrics", "ruled_out", "sequence_level", "setting_warnings", "verdict", "what_to_do",
           "what_to_do_of"]
