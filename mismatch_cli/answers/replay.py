"""Why two replayed trainers differ on a concept, said from what they computed on this dump (`mismatch replay`).

Rules (docs/replay.md, "Why they differ"): a value is called non-finite only when the engine reports it so; a
trait is blamed only when the two trainers differ in it under the settings they ran (their resolved settings
and `ReplayFamily.traits`) and it can act on this dump (a clamp the log-ratios reach, a threshold that cuts a
share); a weight formed from a row's product of ratios, exp(Σd), is said to shrink toward 0 (grow) only when
every row's Σd is below (above) 0 and the product's value is the smaller (larger) one. Plain values in, one line
out; no torch, no I/O.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# Where the dump's own numbers come from: analyze's default report (verl 0.9's keys and mismatch's diagnostics).
TOKENS, ROWS, EMPTY, NONFINITE = "diag/valid_tokens", "diag/sequences", "diag/empty_rows", "diag/nonfinite_tokens"
LOG_RATIO_MEAN, ABS_MAX, RATIO_MEAN = "diag/log_ratio_mean", "diag/logprob_abs_diff_max", "diag/ratio_mean"
# verl's per-row log_ppl_diff is mean(rollout) - mean(old) = -mean(d): above 0 on every row <=> every row's Σd < 0.
ROW_MIN, ROW_MAX = "rollout_corr/log_ppl_diff_min", "rollout_corr/log_ppl_diff_max"
EXP_LIMIT = {"float32": math.log(3.4028234663852886e38), "float64": math.log(1.7976931348623157e308)}
FAR = 1.0  # |mean Σd| in nats beyond which a row's product of ratios is far from 1 (e^-1 = 0.37, e^1 = 2.7)
# The traits that can explain a disagreement on each concept, most likely first.
REASONS: dict[str, tuple[str, ...]] = {
    "abs_diff": ("reduction", "threshold"),  # a rejection that drops tokens changes which |d| are averaged
    "kl": ("estimator", "reduction", "clamp"),
    "chi2": ("clamp", "reduction"),
    "weight_mean": ("threshold", "clamp", "reduction"),
    "truncated": ("threshold", "reduction"),
    "masked": ("threshold", "reduction"),
    "dropped": ("threshold", "reduction"),
}
IDENTITY = {"abs_diff": 0.0, "kl": 0.0, "chi2": 0.0, "weight_mean": 1.0}  # each concept's value when d = 0
WEIGHTS = ("weight_mean", "truncated", "masked", "dropped")  # the concepts a weight's form changes
FORMS = {"token": "weights each token, exp(d)", "product": "weights a row by the product of its ratios, exp(Σd)",
         "geometric": "weights a row by its geometric-mean ratio, exp(mean d)"}


@dataclass(frozen=True)
class Side:
    """One trainer on one concept: its value and key, how its weight is formed, its KL estimator, its traits,
    its settings in words and the shares its thresholds cut on this dump."""

    name: str
    value: float | None
    key: str | None
    form: str | None
    estimator: str | None
    traits: Mapping[str, str]
    settings: str
    shares: tuple[float, ...] = ()
    normalized: bool = False  # its settings normalize the IS weights to mean 1 over the batch


@dataclass(frozen=True)
class DumpFacts:
    """What the dump's log-ratios d = old - rollout are like, from analyze's report of it."""

    dtype: str
    max_abs_d: float | None = None
    row_sum_mean: float | None = None  # the mean over non-empty rows of a row's Σd
    tokens_per_row: float | None = None
    rows_negative: bool = False  # every row's Σd < 0
    rows_positive: bool = False  # every row's Σd > 0
    nonfinite_tokens: int = 0  # valid tokens with a NaN or infinite log-prob (kept by some trainers)


def _number(metrics: Mapping[str, Any], key: str) -> float | None:
    value = metrics.get(key)
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def dump_facts(metrics: Mapping[str, Any], dtype: str) -> DumpFacts:
    """The facts the reasons rest on, from analyze's metrics of the dump."""
    tokens, mean = _number(metrics, TOKENS), _number(metrics, LOG_RATIO_MEAN)
    rows = (_number(metrics, ROWS) or 0.0) - (_number(metrics, EMPTY) or 0.0)
    low, high = _number(metrics, ROW_MIN), _number(metrics, ROW_MAX)
    per_row = tokens / rows if tokens is not None and rows > 0 else None
    return DumpFacts(dtype, _number(metrics, ABS_MAX), None if mean is None or per_row is None else mean * per_row,
                     per_row, low is not None and low > 0, high is not None and high < 0,
                     int(_number(metrics, NONFINITE) or 0))


def _fields(settings: Any) -> list[tuple[str, Any]]:
    """A resolved settings object's (name, value) pairs, nested dataclasses flattened in order."""
    if not dataclasses.is_dataclass(settings):
        return []
    out: list[tuple[str, Any]] = []
    for item in dataclasses.fields(settings):
        value = getattr(settings, item.name)
        if isinstance(value, (tuple, list)) and value and all(dataclasses.is_dataclass(v) for v in value):
            out += [pair for v in value for pair in _fields(v)]  # an older family's blocks
        else:
            out += _fields(value) if dataclasses.is_dataclass(value) else [(item.name, value)]
    return out


def weight_form(resolved: Any, traits: Mapping[str, str]) -> str | None:
    """How the trainer forms its IS weight under its resolved settings: token, product (exp Σd), geometric
    (exp mean d), or None when they do not say. The level is the first level / type / mode setting that names
    one; a sequence level is a geometric mean when the trait says so and names no sum."""
    for name, value in _fields(resolved):
        if isinstance(value, str) and any(w in name for w in ("level", "type", "mode")):
            level = value.lower()
            if level.startswith("token"):
                return "token"
            if level.startswith("geo"):
                return "geometric"
            if level.startswith("seq"):
                words = traits.get("sequence", "")
                return "geometric" if "geometric" in words and "sum of d" not in words else "product"
    words = traits.get("sequence", "").lower()
    return "token" if words.startswith("none") or "token level" in words or "token-level" in words else None


def normalizes(resolved: Any) -> bool:
    """Whether the resolved settings normalize the IS weights to mean 1 (a true setting named `*normalize*`)."""
    return any(value is True and "normalize" in name for name, value in _fields(resolved))


def estimator_of(resolved: Any, traits: Mapping[str, str]) -> str | None:
    """The KL estimator the trainer logs (k1, k2, k3): a setting that names one, else its estimator trait."""
    for _, value in _fields(resolved):
        if isinstance(value, str) and re.fullmatch(r"k[123]", value):
            return value
    found = re.search(r"\bk([123])\b", traits.get("estimator", ""))
    return f"k{found[1]}" if found else None


def _bound(text: str) -> float:
    """The smallest clamp bound on the log-ratio a clamp trait names (±20, [-20, 20]); inf when it names none."""
    found = [float(x) for x in re.findall(r"±\s*(\d+(?:\.\d+)?)", text)]
    found += [float(x) for x in re.findall(r"\[\s*-\s*(\d+(?:\.\d+)?)\s*,", text)]
    return min(found, default=math.inf)


def _g(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4g}"


def nonfinite_text(label: str, names: Sequence[str], keys: Sequence[str], facts: DumpFacts) -> str:
    """Trainers whose value is NaN or infinite, and what on this dump makes it so when the engine reports it."""
    who = f"{', '.join(names)}: {', '.join(dict.fromkeys(keys))} non-finite"
    limit = EXP_LIMIT.get(facts.dtype, EXP_LIMIT["float32"])
    if facts.nonfinite_tokens:
        return f"{label}: {who} ({facts.nonfinite_tokens} valid tokens have a NaN or infinite log-prob)"
    if facts.max_abs_d is not None and facts.max_abs_d > limit:
        return f"{label}: {who} (|d| reaches {_g(facts.max_abs_d)}; exp overflows {facts.dtype} above {limit:.4g})"
    return f"{label}: {who} (undefined on this dump, or overflowed in {facts.dtype})"


def _form_reason(a: Side, b: Side, facts: DumpFacts) -> str:
    """Two weights formed differently; for a product of ratios, what the rows' Σd does to it."""
    product, other = (a, b) if a.form == "product" else (b, a) if b.form == "product" else (None, None)
    text = f"{a.name} {FORMS[a.form or '']}; {b.name} {FORMS[b.form or '']}"
    if product is None or other is None or facts.row_sum_mean is None or product.value is None or other.value is None:
        return text
    mean = f"mean {_g(facts.row_sum_mean)} over {facts.tokens_per_row:.0f} tokens a row"
    if facts.rows_negative and facts.row_sum_mean <= -FAR and product.value < other.value:
        return (f"{product.name} {FORMS['product']}, and every row here has Σd < 0 ({mean}), so the product shrinks "
                f"toward 0; {other.name} {FORMS[other.form or 'token']}")
    if facts.rows_positive and facts.row_sum_mean >= FAR:
        cut = (f"; {product.name}'s threshold ({product.settings}) cuts it to {_g(product.value)}"
               if product.value < 1.0 else "")
        return (f"{product.name} {FORMS['product']}, and every row here has Σd > 0 ({mean}), so the product grows "
                f"above 1{cut}; {other.name} {FORMS[other.form or 'token']}")
    return text


def clauses(text: str, concept: str) -> tuple[str, ...]:
    """The clauses of a trait ("; "-separated) that concern a concept: a trait that says how its KL estimate
    differs (a clause naming KL) has those for the KL concept and the others for the rest."""
    parts = tuple(p.strip() for p in text.split("; ") if p.strip())
    about_kl = tuple(p for p in parts if "KL" in p)
    if concept == "kl":
        return about_kl or parts
    return tuple(p for p in parts if "KL" not in p) or parts


def _differing(trait: str, concept: str, a: Side, b: Side) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Each side's clauses of a trait that the other does not share (both empty: a shared trait)."""
    if trait not in a.traits or trait not in b.traits:
        return (), ()
    mine, theirs = clauses(a.traits[trait], concept), clauses(b.traits[trait], concept)
    return tuple(c for c in mine if c not in theirs), tuple(c for c in theirs if c not in mine)


def _acts(trait: str, concept: str, a: Side, b: Side, facts: DumpFacts) -> bool:
    """Whether a trait in which two trainers differ (on this concept) can act on this dump."""
    ours, theirs = _differing(trait, concept, a, b)
    if not ours and not theirs:
        return False  # never blame a trait both share
    if trait == "estimator":
        return concept == "kl" and (a.estimator != b.estimator or a.estimator is None)
    if trait == "clamp":  # a clamp only matters where the log-ratios (or a row's sum) reach it
        reach = max(facts.max_abs_d or 0.0, abs(facts.row_sum_mean or 0.0) if "product" in (a.form, b.form) else 0.0)
        return min(_bound("; ".join(ours)), _bound("; ".join(theirs))) <= reach
    if trait == "threshold":  # a threshold acts when it cuts a share of this dump
        return any(v > 0 for v in (*a.shares, *b.shares))
    return True


def _trait_reason(trait: str, concept: str, a: Side, b: Side) -> str:
    ours, theirs = _differing(trait, concept, a, b)
    if trait == "estimator":
        said = [f"{s.name} {'; '.join(own) or s.estimator}" if estimator_of(None, s.traits) == s.estimator
                else f"{s.name} {s.estimator or 'its own estimate'}" for s, own in ((a, ours), (b, theirs))]
        return f"estimator: {'; '.join(said)}"
    if trait == "clamp":
        said = [f"{s.name} clamps d at ±{_bound('; '.join(own)):g}" if math.isfinite(_bound("; ".join(own)))
                else f"{s.name} has no such clamp" for s, own in ((a, ours), (b, theirs))]
        return f"clamp, which this dump's log-ratios reach: {'; '.join(said)}"
    if trait == "threshold":
        cut = max((s for s in (a, b)), key=lambda s: max(s.shares, default=0.0))
        return (f"threshold ({cut.name} cuts up to {max(cut.shares):.3g} here): {a.name} {a.settings}; "
                f"{b.name} {b.settings}")
    return f"{trait}: {a.name} {'; '.join(ours) or 'as below'}; {b.name} {'; '.join(theirs) or 'as above'}"


def explain(concept: str, label: str, a: Side, b: Side, facts: DumpFacts) -> str:
    """One line: why two trainers' values of a concept differ, from what they computed and the dump's facts."""
    head = f"{label}: {a.name} {_g(a.value)} vs {b.name} {_g(b.value)}"
    same = [s for s in (a, b) if concept in IDENTITY and s.value == IDENTITY[concept]]
    if len(same) == 1 and facts.max_abs_d:  # exactly what d = 0 gives, on a dump whose d is not 0
        return (f"{head}: {same[0].name}'s is exactly what d = 0 gives, so under its settings ({same[0].settings}) "
                "it compares no differing log-probs")
    if concept in WEIGHTS and a.form and b.form and a.form != b.form:
        return f"{head}: {_form_reason(a, b, facts)}"
    normal = [s for s in (a, b) if s.normalized and s.value is not None and abs(s.value - 1.0) < 0.01]
    if concept == "weight_mean" and len(normal) == 1 and a.normalized != b.normalized:
        return f"{head}: {normal[0].name} normalizes its weights to mean 1 over the batch ({normal[0].settings})"
    for trait in REASONS.get(concept, ("reduction",)):
        if _acts(trait, concept, a, b, facts):
            return f"{head}; {_trait_reason(trait, concept, a, b)}"
    if concept in WEIGHTS and a.form == b.form == "product":
        return f"{head}: both {FORMS['product']}; their keys' own formulas differ (docs/trainers.md)"
    return f"{head}: they differ in no trait that acts on this dump; their keys' own formulas differ " \
           "(docs/trainers.md)"


__all__ = ["DumpFacts", "Side", "clauses", "dump_facts", "estimator_of", "explain", "nonfinite_text", "normalizes",
           "weight_form"]
