"""Causes as hypotheses: for each cause a mismatch can have, whether this dump names it, leaves it possible or rules
it out, with the one number that says so (pure Python over the findings, the metrics and the signature table).

The findings decide (answers/findings/); this module only says, for every cause they did not name, the
measurement that speaks against it, so a reader sees why the named cause and not another. After a structural
bug (identical sides, a mask over the prompt, a fill, a shift) every number measures that bug, so the other
causes are "not judged". A policy lag without a
policy version in the dump is "possible" beside a precision gap: the two look alike in log-probs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from mismatch_cli.answers.findings.model import percent
from mismatch_cli.answers.findings.processors import uncapped_ratio
from mismatch_cli.answers.findings.signatures import SLOPE_TOLERANCE

NAMED, POSSIBLE, RULED_OUT, NOT_JUDGED = "named", "possible", "ruled out", "not judged"
# A structural bug makes every other number measure it: the causes after it are not judged.
STRUCTURAL = ("identical_sides", "mask_covers_prompt", "constant_fill", "shifted_streams")
# (cause, the finding codes that name it, its short name on the first screen)
CAUSES = (
    ("identical_sides", ("identical_sides",), "identical sides"),
    ("mask_covers_prompt", ("mask_covers_prompt",), "prompt in the mask"),
    ("constant_fill", ("constant_fill",), "fill"),
    ("shifted_streams", ("shifted_streams",), "shift"),
    ("truncation", ("processed_logprobs",), "truncation"),
    ("penalties", ("logit_processor",), "penalty"),
    ("temperature", ("temperature_mismatch",), "temperature"),
    ("policy_lag", ("policy_lag",), "policy lag"),
    ("precision", (), "precision"),
)


def _number(value: Any, digits: str = ".3g") -> str:
    return format(value, digits) if isinstance(value, (int, float)) and math.isfinite(value) else "n/a"


def _against(cause: str, metrics: Mapping[str, Any], table: Mapping[str, Any], codes: set[str]) -> tuple[str, str]:
    """The measurement that speaks against a cause the findings did not name: a sentence, and a few words."""
    tokens = table.get("tokens") or 0
    if cause == "identical_sides":
        share = percent(table.get("bitwise_equal", 0) / tokens if tokens else 0.0)
        return f"{share} of the valid tokens are bitwise equal on both sides", f"{share} equal"
    if cause == "mask_covers_prompt":
        rows, lead = tokens - table.get("pairs", 0), table.get("prefix_zero_rows", 0)
        return f"{lead} of {rows} rows lead with a run of rollout log-probs of 0.0", f"{lead}/{rows} rows"
    if cause == "constant_fill":
        fills = table.get("fill_rollout", 0) + table.get("fill_old", 0)
        return f"{fills} tokens hold a 0.0 or a repeated value on one side only", f"{fills} tokens"
    if cause == "shifted_streams":
        value = metrics.get("diag/shift_residual_ratio")
        ratio = ">1000" if isinstance(value, (int, float)) and value > 1000 else _number(value)
        return f"shifting the rollout by one token leaves {ratio} times the aligned residual", f"{ratio}x"
    if cause == "truncation":
        mean, error = uncapped_ratio(dict(table)) if table.get("buckets") else (math.nan, math.nan)
        return (f"the uncapped token ratio mean is {_number(mean, '.4g')} ± {_number(error, '.2g')}, the kept mass a "
                "truncation would lower", f"uncapped mean {_number(mean, '.4g')}")
    if cause == "penalties":
        if "processed_logprobs" in codes:
            return "the uncapped ratio mean is below 1 too, where a penalty keeps it at 1", "uncapped mean < 1"
        capped = _number(metrics.get("diag/ratio_mean"), ".4g")
        return f"the ratio mean capped at e is {capped}: no tail a penalty pushes through the cap", \
            f"capped mean {capped}"
    slope = _number(metrics.get("diag/temperature_slope"))
    processor = next((name for code, name in (("processed_logprobs", "truncation"), ("logit_processor", "penalty"))
                      if code in codes), None)
    value = metrics.get("diag/temperature_slope")
    bent = isinstance(value, (int, float)) and abs(value - 1) > SLOPE_TOLERANCE
    if processor is not None and bent:  # a truncation or a penalty bends the slope too (findings/signatures.py)
        return f"the slope of rollout on old log-probs is {slope}, as the {processor} bends it", \
            f"slope {slope}, the {processor}'s"
    return f"the slope of rollout on old log-probs is {slope}", f"slope {slope}"


def hypotheses(findings: Sequence[Mapping[str, Any]], metrics: Mapping[str, Any], table: Mapping[str, Any],
               diagnosis: Mapping[str, Any]) -> list[dict[str, str]]:
    """Each cause: named, possible or ruled out, with its evidence as a sentence and in a few words (the named ones:
    the finding's title)."""
    if not table or not table.get("tokens"):
        return []
    by_code = {f.get("code"): f for f in findings}
    codes = set(by_code)
    kind = diagnosis.get("kind")
    structural = next((c for c in STRUCTURAL if c in codes), None)
    out = []
    for cause, named_by, short in CAUSES:
        found = next((by_code[c] for c in named_by if c in by_code), None)
        if found is not None:
            title = str(found.get("title", ""))
            out.append({"cause": cause, "name": short, "verdict": NAMED, "evidence": title, "short": title})
            continue
        if structural is not None:
            said = f"the numbers measure the {structural.replace('_', ' ')} first"
            out.append({"cause": cause, "name": short, "verdict": NOT_JUDGED, "evidence": said, "short": said})
            continue
        if cause == "policy_lag":
            flat = by_code.get("lag_ruled_out")
            if flat is not None:
                low, high = flat["evidence"]["lags"][0], flat["evidence"]["lags"][-1]
                out.append({"cause": cause, "name": short, "verdict": RULED_OUT, "evidence": str(flat["title"]),
                            "short": f"lag {low['lag']} {low['prob_abs_diff_mean']:.3g}, "
                                     f"lag {high['lag']} {high['prob_abs_diff_mean']:.3g}"})
            elif kind == "precision":
                out.append({"cause": cause, "name": short, "verdict": POSSIBLE,
                            "evidence": "no policy version in the dump: a lag looks like precision noise",
                            "short": "no policy version"})
            continue
        if cause == "precision":
            if kind == "precision":
                title = str(diagnosis.get("title"))
                out.append({"cause": cause, "name": short, "verdict": NAMED, "evidence": title, "short": title})
            continue
        evidence, brief = _against(cause, metrics, table, codes)
        out.append({"cause": cause, "name": short, "verdict": RULED_OUT, "evidence": evidence, "short": brief})
    return out


def ruled_out_text(causes: Sequence[Mapping[str, Any]]) -> str:
    """`ruled out: fill (0 fill tokens), shift (…), …` for the first screen ('' when none)."""
    parts = [f"{c['name']} ({c.get('short') or c['evidence']})" for c in causes if c.get("verdict") == RULED_OUT]
    return "ruled out: " + ", ".join(parts) if parts else ""


__all__ = ["CAUSES", "NAMED", "NOT_JUDGED", "POSSIBLE", "RULED_OUT", "hypotheses", "ruled_out_text"]
