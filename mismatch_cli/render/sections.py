"""Turn a Report into titled sections of rows, shared by the terminal and Markdown renderers."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from mismatch_cli.engine_keys import OFFPOLICY_DESCRIPTIONS
from mismatch_cli.report import Report

VERL = "rollout_corr/"


@dataclass
class Section:
    """A titled table: column headers, rows of cells, and rows to highlight."""

    title: str
    columns: list[str]
    rows: list[list[str]]
    highlight: set[int] = field(default_factory=set)
    note: str | None = None


def format_value(value: float | int | None, digits: int = 6) -> str:
    """A number as people read it: null, integers plain, otherwise `digits` significant digits."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer() and abs(value) < 1e15):
        return f"{int(value):,}" if abs(value) >= 1e4 else str(int(value))
    if not math.isfinite(value):
        return str(value)
    if value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e6):
        return f"{value:.{max(digits - 2, 1)}e}"
    return f"{value:.{digits}g}"


def _metric_rows(report: Report, keys: list[str], strip: str) -> list[list[str]]:
    return [[key[len(strip):], format_value(report.metrics.get(key))] for key in keys]


def health_section(report: Report) -> Section:
    """verl's warning bands, one row per check."""
    rows, highlight = [], set()
    for i, check in enumerate(report.summary.get("checks", [])):
        rows.append([check["label"], format_value(check["value"]), check["healthy_range"],
                     "ok" if check["ok"] else "WARN"])
        if not check["ok"]:
            highlight.add(i)
    status = report.summary.get("status", "healthy")
    return Section(f"Health: {status}", ["check", "value", "healthy range", "status"], rows, highlight)


def offpolicy_section(report: Report) -> Section:
    """The 13 off-policy keys with what each means."""
    rows = []
    for key, meaning in OFFPOLICY_DESCRIPTIONS.items():
        rows.append([key, format_value(report.metrics.get(VERL + key)), meaning])
    return Section("Off-policy (rollout_corr/)", ["metric", "value", "meaning"], rows)


def importance_section(report: Report) -> Section | None:
    """The rollout_is_* keys, when IS is configured."""
    keys = sorted(k for k in report.metrics if k.startswith(VERL + "rollout_is_"))
    if not keys:
        return None
    config = report.config
    title = f"Importance sampling: {config.get('rollout_is')} level, threshold {config.get('rollout_is_threshold')}"
    return Section(title, ["metric", "value"], _metric_rows(report, keys, VERL))


def rejection_section(report: Report) -> Section | None:
    """Per-option RS statistics side by side, then the combined rejection."""
    keys = [k for k in report.metrics if k.startswith(VERL + "rollout_rs_")]
    if not keys:
        return None
    options = [o.strip() for o in str(report.config.get("rollout_rs") or "").split(",") if o.strip()]
    options = list(dict.fromkeys(options))
    suffixes: list[str] = []
    for option in options:
        prefix = f"{VERL}rollout_rs_{option}_"
        for key in keys:
            if key.startswith(prefix) and key[len(prefix):] not in suffixes:
                suffixes.append(key[len(prefix):])
    rows = []
    for suffix in suffixes:
        rows.append([suffix] + [format_value(report.metrics.get(f"{VERL}rollout_rs_{o}_{suffix}"))
                                if f"{VERL}rollout_rs_{o}_{suffix}" in report.metrics else "" for o in options])
    for total in ("masked_fraction", "seq_masked_fraction"):
        rows.append([f"ALL {total}"] + [format_value(report.metrics.get(f"{VERL}rollout_rs_{total}"))] +
                    [""] * (len(options) - 1))
    title = f"Rejection sampling: {report.config.get('rollout_rs')} @ {report.config.get('rollout_rs_threshold')}"
    return Section(title, ["statistic", *options], rows, highlight={len(rows) - 2, len(rows) - 1})


def diagnostics_section(report: Report) -> Section:
    """The diag/ keys."""
    keys = [k for k in report.metrics if k.startswith("diag/")]
    return Section("Diagnostics (diag/)", ["metric", "value"], _metric_rows(report, keys, "diag/"))


STEP_COLUMNS = (
    ("tokens", None),
    ("kl", "rollout_corr/kl"),
    ("k3_kl", "rollout_corr/k3_kl"),
    ("chi2_token", "rollout_corr/chi2_token"),
    ("chi2_seq", "rollout_corr/chi2_seq"),
    ("IS ESS", "rollout_corr/rollout_is_eff_sample_size"),
    ("RS masked", "rollout_corr/rollout_rs_masked_fraction"),
)


def steps_section(report: Report) -> Section | None:
    """One row per training step."""
    if not report.steps:
        return None
    present = [(label, key) for label, key in STEP_COLUMNS
               if key is None or any(key in step["metrics"] for step in report.steps)]
    rows = []
    for step in report.steps:
        row = [str(step["step"])]
        for _, key in present:
            row.append(format_value(step["valid_tokens"] if key is None else step["metrics"].get(key), digits=4))
        rows.append(row)
    return Section("Per step", ["step", *[label for label, _ in present]], rows)


def inputs_section(report: Report) -> Section:
    """What was read."""
    rows = [[item.path, item.format, format_value(item.sequences), format_value(item.tokens)]
            for item in report.inputs]
    return Section("Inputs", ["file", "format", "sequences", "valid tokens"], rows)


def quality_section(report: Report) -> Section | None:
    """Per-file data-quality counts, shown only when something is off."""
    names = ("nonfinite_tokens", "sentinel_tokens", "positive_logprob_tokens", "one_side_zero_tokens")
    files = report.data_quality.get("files", {})
    rows, highlight = [], set()
    for path, counts in files.items():
        if any(counts.get(n, 0) for n in names):
            highlight.add(len(rows))
            rows.append([path, *[format_value(counts.get(n, 0)) for n in names]])
    if not rows:
        return None
    return Section("Data quality", ["file", "NaN/inf", "sentinel", "logp > 0", "0.0 one side"], rows, highlight)


def build_sections(report: Report) -> list[Section]:
    """Every section that applies to this report, in reading order."""
    candidates = [
        health_section(report),
        offpolicy_section(report),
        importance_section(report),
        rejection_section(report),
        diagnostics_section(report),
        steps_section(report),
        quality_section(report),
        inputs_section(report),
    ]
    return [s for s in candidates if s is not None]
