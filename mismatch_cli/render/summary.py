"""The first screen of `mismatch analyze`: is it healthy, why not, what to do, in about 40 lines.

Every line is laid out here and wrapped only at spaces, so a number or a key is never split across
lines whatever the terminal width; `--full` prints every table instead (render/table.py).
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterable, Mapping
from typing import Any

from rich.console import Console
from rich.markup import escape

from mismatch_cli.findings.model import percent
from mismatch_cli.metrics import lookup
from mismatch_cli.render.cells import format_value
from mismatch_cli.render.paths import display_path, paths_in_text
from mismatch_cli.report import Report

# The metrics shown under "Key metrics", when present, in this order (the health checks come first).
KEY_METRICS = (
    "rollout_corr/kl", "rollout_corr/k3_kl", "rollout_corr/chi2_token", "rollout_corr/chi2_seq",
    "rollout_corr/ppl_ratio", "rollout_corr/rollout_is_eff_sample_size", "rollout_corr/rollout_rs_masked_fraction",
    "diag/ess_token", "diag/prob_pearson_corr", "diag/logprob_abs_diff_max",
)
SHOWN_FINDINGS = 4
SHOWN_WARNINGS = 2
SHOWN_DRIFT = 3
SEVERITY_MARK = {"error": "!! ", "warning": "! ", "info": "i "}
PATH_ROOM = 20  # a path inside a paragraph leaves room for the indent and a `:row:position` after it


class Lines:
    """Text lines for a given width: wrapped at spaces only, with a hanging indent."""

    def __init__(self, width: int) -> None:
        self.width = max(width, 40)
        self.lines: list[tuple[str, str]] = []  # (text, rich style)

    def add(self, text: str, indent: int = 0, hang: int = 2, style: str = "") -> None:
        """One paragraph: wrapped to the width; continuation lines indented by `hang` more."""
        wrapped = textwrap.wrap(text, width=self.width, initial_indent=" " * indent,
                                subsequent_indent=" " * (indent + hang), break_long_words=False,
                                break_on_hyphens=False) or [""]
        self.lines += [(line, style) for line in wrapped]

    def blank(self) -> None:
        """An empty line between blocks."""
        if self.lines and self.lines[-1][0]:
            self.lines.append(("", ""))

    def heading(self, text: str) -> None:
        """A block's title."""
        self.blank()
        self.lines.append((text, "bold"))


def _checks_line(check: Mapping[str, Any]) -> str:
    mark = "ok " if check["ok"] else "OUT"
    return f"{mark} {check['label']}: {format_value(check['value'])} (healthy: {check['healthy_range']})"


def _inputs(report: Report, width: int) -> str:
    sequences = sum(item.sequences for item in report.inputs)
    tokens = sum(item.tokens for item in report.inputs)
    first = display_path(report.inputs[0].path, width - len("mismatch: ") - 1) if report.inputs else "no input"
    more = f" and {len(report.inputs) - 1} more files" if len(report.inputs) > 1 else ""
    return f"{first}{more}: {format_value(sequences)} sequences, {format_value(tokens)} valid tokens"


def _correction(report: Report) -> str:
    config = report.config
    parts = [f"{key}={config[key]}" for key in ("preset", "rollout_is", "rollout_is_threshold", "rollout_rs",
                                                  "rollout_rs_threshold") if config.get(key) is not None]
    if config.get("rollout_is") is None and config.get("rollout_rs") is None and "preset" in config:
        parts = ["none (metrics only)"]
    semantics = config.get("semantics", "verl")
    return f"correction: {', '.join(parts) or semantics + ' fields'} · semantics {semantics} · " \
           f"{config.get('device')} {config.get('dtype')}"


def _health(out: Lines, report: Report) -> None:
    summary = report.summary
    checks = summary.get("checks", [])
    failing = [c for c in checks if not c["ok"]]
    status = str(summary.get("status", "healthy")).upper()
    basis = (summary.get("after") or summary.get("before") or {}).get("basis", "")
    head = f"Health: {status}"
    if checks:
        head += f" - {len(failing)} of {len(checks)} checks out of band" if failing else " - every check in band"
    out.add(head + (f" ({basis})" if basis else ""), style="bold red" if failing else "bold green")
    for check in checks:
        out.add(_checks_line(check), indent=2, hang=4, style="" if check["ok"] else "red")
    before, after = summary.get("before"), summary.get("after")
    if after and before and before.get("status") != after.get("status"):
        out.add(f"before the correction (raw ratios): {str(before['status']).upper()}"
                f"{'; ' + _failing(before) if before['status'] != 'healthy' else ''}", indent=2, hang=4)


def _failing(health: Mapping[str, Any]) -> str:
    return ", ".join(f"{c['label']} {format_value(c['value'])}" for c in health.get("checks", []) if not c["ok"])


def _findings(out: Lines, findings: list[Mapping[str, Any]], causes: bool) -> None:
    chosen = [f for f in findings if (f.get("code") == "concentrated_divergence") == causes]
    if causes:
        if not chosen:
            return
        out.heading("Why")
    else:
        out.heading("Dump checks (bug signatures)")
        if not chosen:
            out.add("none found: no constant fill, shift, temperature or identical-sides signature", indent=2)
            return
    for finding in chosen[:SHOWN_FINDINGS]:
        mark = SEVERITY_MARK.get(str(finding.get("severity")), "- ")
        out.add(f"{mark}{finding.get('title', '')}", indent=2, hang=2,
                style="red" if finding.get("severity") == "error" else "")
        if finding.get("detail"):
            out.add(str(finding["detail"]), indent=4, hang=0)
    if len(chosen) > SHOWN_FINDINGS:
        out.add(f"+{len(chosen) - SHOWN_FINDINGS} more in report.json (`findings`)", indent=2)


def _cost(cost: Mapping[str, Any]) -> str:
    parts = []
    if cost.get("truncated_token_fraction"):
        parts.append(f"truncates {percent(cost['truncated_token_fraction'])} of tokens")
    parts.append(f"drops {percent(cost.get('masked_token_fraction') or 0.0)} of tokens and "
                 f"{percent(cost.get('masked_sequence_fraction') or 0.0)} of sequences")
    if cost.get("ess") is not None:
        parts.append(f"ESS after {format_value(cost['ess'])}")
    return "; ".join(parts)


def _recommendation(out: Lines, recommendation: Mapping[str, Any] | None,
                    broken: list[Mapping[str, Any]]) -> None:
    if not recommendation and not broken:
        return
    out.heading("What to do")
    if broken:
        # A correction reweights real log-probs; it cannot repair a dump whose log-probs are not real.
        out.add(f"fix the dump first: {broken[0].get('title', '')} (see Dump checks); no correction repairs "
                "a broken dump, so the numbers below measure the bug, not the engines", indent=2, hang=4,
                style="red")
    if not recommendation:
        return
    if recommendation.get("scenario"):
        preset = f" (= --preset {recommendation['preset']})" if recommendation.get("preset") else ""
        out.add(f"turn on {recommendation['scenario']}: {recommendation['flags']}{preset}", indent=2, hang=4)
        out.add(f"cost: {_cost(recommendation.get('cost') or {})}", indent=2, hang=4)
        after = recommendation.get("health_after") or {}
        if after:
            values = ", ".join(f"{lookup(c['metric']).title if lookup(c['metric']) else c['metric']} "
                               f"{format_value(c['value'])}" for c in after.get("checks", []))
            out.add(f"health after: {str(after.get('status')).upper()} ({values})", indent=2, hang=4)
        alternatives = [a["flags"] for a in recommendation.get("alternatives", [])[:2] if a.get("flags")]
        if alternatives:
            out.add(f"also in band: {'; '.join(alternatives)}", indent=2, hang=4)
    else:
        out.add(str(recommendation.get("reason", "")), indent=2, hang=2)


def _drift(out: Lines, drift: Mapping[str, Mapping[str, Any]] | None) -> None:
    if not drift:
        return
    moving = [(key, entry) for key, entry in drift.items()
              if entry.get("bad_steps") or entry.get("change_point_step") is not None
              or _excludes_zero(entry.get("slope_interval"))]
    out.heading(f"Drift over steps ({len(moving)} of {len(drift)} metrics move)" if moving else
                f"Drift over steps ({len(drift)} metrics)")
    if not moving:
        out.add("no metric trends, shifts or leaves its band over the steps", indent=2)
        return
    for key, entry in moving[:SHOWN_DRIFT]:
        low, high = entry.get("slope_interval") or (None, None)
        text = f"{key.split('/')[-1]}: {format_value(entry['slope'])} per step " \
               f"[{format_value(low)}, {format_value(high)}]"
        if entry.get("first_out_of_band_step") is not None:
            bad, total = len(entry.get("bad_steps") or []), entry.get("steps")
            of = f" of {total}" if total else ""
            # one bad step is not a run "from" it on (and "1 steps" is not English)
            text += (f"; out of band at step {entry['first_out_of_band_step']} only (1{of} steps)" if bad == 1 else
                     f"; out of band from step {entry['first_out_of_band_step']} ({bad}{of} steps)")
        if entry.get("change_point_step") is not None:
            text += f"; level shift at step {entry['change_point_step']}"
        out.add(text, indent=2, hang=4)
    if len(moving) > SHOWN_DRIFT:
        out.add(f"+{len(moving) - SHOWN_DRIFT} more in report.json (`drift`)", indent=2)


def _excludes_zero(interval: Iterable[float] | None) -> bool:
    if not interval:
        return False
    low, high = list(interval)[:2]
    return low > 0 or high < 0


def _key_metrics(out: Lines, report: Report) -> None:
    shown = [c["metric"] for c in report.summary.get("checks", [])]
    keys = [k for k in KEY_METRICS if report.metrics.get(k) is not None and k not in shown][:6]
    if not keys:
        return
    intervals = any(report.intervals.get(key) for key in keys)  # none with --bootstrap 0: do not promise them
    out.heading("Key metrics (95 % bootstrap interval)" if intervals else "Key metrics")
    name_width = max(len(k.split("/")[-1]) for k in keys)
    for key in keys:
        interval = report.intervals.get(key)
        text = f"{key.split('/')[-1]:<{name_width}}  {format_value(report.metrics[key]):>10}"
        if interval:
            text += f"  [{format_value(interval[0])}, {format_value(interval[1])}]"
        out.add(text, indent=2, hang=4)


def summary_lines(report: Report, width: int = 80, warnings: bool = True) -> list[tuple[str, str]]:
    """The summary's lines (text, rich style) for a terminal `width` columns wide (`warnings` off for `-q`)."""
    out = Lines(width)
    out.add(f"mismatch: {_inputs(report, out.width)}", style="bold")
    out.add(_correction(report))
    out.blank()
    _health(out, report)
    findings = [f if isinstance(f, Mapping) else f.to_dict() for f in (getattr(report, "findings", None) or [])]
    paths = [item.path for item in report.inputs]  # a worst token's `file:row:position`, shown at the width
    findings = [{**f, "detail": paths_in_text(str(f.get("detail") or ""), paths, out.width - PATH_ROOM)}
                for f in findings]
    _findings(out, findings, causes=True)
    broken = [f for f in findings if f.get("severity") == "error" and f.get("code") != "concentrated_divergence"]
    _recommendation(out, getattr(report, "recommendation", None), broken)
    _findings(out, findings, causes=False)
    _drift(out, getattr(report, "drift", None))
    _key_metrics(out, report)
    if report.warnings and warnings:
        out.heading(f"Warnings ({len(report.warnings)})")
        for warning in report.warnings[:SHOWN_WARNINGS]:
            out.add(f"warning: {paths_in_text(warning, paths, out.width - PATH_ROOM)}", indent=2, hang=4)
        if len(report.warnings) > SHOWN_WARNINGS:
            out.add(f"+{len(report.warnings) - SHOWN_WARNINGS} more with --full", indent=2)
    out.heading("Next")
    out.add("--full: every table (per round, what-if ladder, worst sequences, quantiles) · --out-dir DIR: "
            "report.json, report.html, plots and CSV · mismatch metrics KEY: what a number means", indent=2)
    return out.lines


def render_summary(report: Report, console: Console, warnings: bool = True) -> None:
    """Print the one-screen summary on `console`, wrapped to its width."""
    for text, style in summary_lines(report, console.width, warnings):
        console.print(f"[{style}]{escape(text)}[/]" if style else escape(text), highlight=False, soft_wrap=True)


__all__ = ["KEY_METRICS", "render_summary", "summary_lines"]
