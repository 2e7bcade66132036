"""Render the metric registry: `mismatch metrics` (table, JSON, Markdown) and the page docs/metrics.md."""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console
from rich.padding import Padding
from rich.text import Text

from mismatch_cli.metrics import FAMILIES, PLACEHOLDER_HELP, Metric
from mismatch_cli.render.cells import markdown_cell
from mismatch_cli.report import SCHEMA_VERSION

REGENERATE = "python -m mismatch_cli metrics --format markdown > docs/metrics.md"


def band_text(metric: Metric) -> str:
    """The healthy band and its source in words, or '-'."""
    return "-" if metric.band is None else f"{metric.band.describe()} ({metric.band.source})"


def metric_dict(metric: Metric) -> dict[str, Any]:
    """A JSON-ready mapping of one entry."""
    band = metric.band
    return {
        "key": metric.key,
        "pattern": metric.is_pattern,
        "placeholders": {name: None if values is None else list(values)
                         for name, values in metric.placeholders.items()},
        "family": metric.family.name,
        "meaning": metric.meaning,
        "reduction": metric.reduction,
        "unit": metric.unit,
        "direction": metric.direction.value,
        "band": None if band is None else {"low": band.low, "high": band.high, "absolute": band.absolute,
                                           "range": band.describe(), "source": band.source},
        "practical_difference": metric.practical_difference,
        "practical_difference_relative": metric.practical_relative,  # a fraction of |base|, else in the unit
        "alias_of": metric.alias_of,
        "label": metric.title,
    }


def render_metrics_json(metrics: list[Metric]) -> str:
    """The entries as one JSON document (with `schema_version`, like every JSON the tool writes)."""
    document = {
        "schema_version": SCHEMA_VERSION,
        "placeholders": dict(PLACEHOLDER_HELP),
        "families": [{"name": f.name, "reported": f.produced} for f in FAMILIES],
        "metrics": [metric_dict(m) for m in metrics],
    }
    return json.dumps(document, indent=2, ensure_ascii=False) + "\n"




def render_metrics_markdown(metrics: list[Metric]) -> str:
    """The entries as the Markdown page docs/metrics.md, one table per family."""
    lines = [
        "# Metrics",
        "",
        "Every key `mismatch` reports in `metrics` (and per step, group and round), generated from the metric",
        "registry (`mismatch_cli/metrics/`): do not edit by hand; after changing the registry run",
        f"`{REGENERATE}`.",
        "",
        "Notation: d = old − rollout log-prob of a valid token (mask 1, finite), ratio = exp(d), S = a row's",
        "sum of d. \"Better\" is the direction `compare` judges changes by (`none`: a count or an informational",
        "value); the health summary applies the bands of `rollout_corr/rollout_is_mean`, `_eff_sample_size`,",
        "`_std`, `kl`, `chi2_token` (and their older-family keys), of `diag/ess_token` when IS is off, of",
        "`diag/ess_seq_kish` for a sequence-level correction, and, to the log-probs themselves, of",
        "`diag/prob_abs_diff_mean`, `diag/token_mult_prob_error` and `diag/ratio_mean` (docs/report.md).",
        "Formulas in detail: [verl-semantics.md](verl-semantics.md), [legacy-semantics.md](legacy-semantics.md).",
        "",
        "Placeholders in keys: " + "; ".join(f"`{{{name}}}` {text}" for name, text in PLACEHOLDER_HELP.items())
        + ".",
        "",
    ]
    columns = ["key", "meaning", "reduction", "unit", "better", "healthy band (source)"]
    for family in FAMILIES:
        chosen = [m for m in metrics if m.family is family]
        if not chosen:
            continue
        lines += [f"## {family.name}", "", f"Reported {family.produced}.", "",
                  "| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
        for m in chosen:
            meaning = m.meaning + (f" (as `{m.alias_of}`)" if m.alias_of else "")
            cells = [f"`{m.key}`", *(markdown_cell(text) for text in (meaning, m.reduction, m.unit, m.direction.value,
                                                                         band_text(m)))]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def render_metrics_table(metrics: list[Metric], console: Console) -> None:
    """Per family, one entry per key: the key on its own line (never split), then its description wrapped below."""
    for family in FAMILIES:
        chosen = [m for m in metrics if m.family is family]
        if not chosen:
            continue
        console.print(Text(f"{family.name}: reported {family.produced}", style="bold"))
        console.print()
        for m in chosen:
            console.print(Text.assemble((m.key, "bold"), f"  (better: {m.direction.value})"))
            description = f"{m.meaning}\n{m.reduction}; band: {band_text(m)}"
            console.print(Padding(Text(description), (0, 0, 0, 2)))
        console.print()
