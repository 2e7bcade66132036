"""Turn a Report into titled sections of rows, shared by the terminal and Markdown renderers."""

from __future__ import annotations

from dataclasses import dataclass, field

from mismatch_cli.correction import replay_families
from mismatch_cli.metrics import METRICS, lookup
from mismatch_cli.metrics.catalog import OFFPOLICY
from mismatch_cli.render.cells import format_percent, format_value, one_line
from mismatch_cli.render.lead import check_mark
from mismatch_cli.report import Report

VERL = "rollout_corr/"
TEXT_COLUMNS = {"meaning", "healthy range", "out of band"}  # free text; every other cell is a number or a name
# Input paths as recorded, and worst sequences' `name:row`: the terminal and Markdown show them by
# render/paths.py (a terminal table may shorten them, never its numbers), HTML whole.
PATH_COLUMNS = {"file", "sequence"}


@dataclass
class Section:
    """A titled table: column headers, rows of cells, and rows to highlight."""

    title: str
    columns: list[str]
    rows: list[list[str]]
    highlight: set[int] = field(default_factory=set)
    note: str | None = None
    repeat: int = 1  # leading label columns repeated in each block when a narrow terminal splits the table
    labels: set[int] = field(default_factory=set)  # free-form labels (group values): shortened like paths

    def text_columns(self) -> set[int]:
        """Indices of the free-text columns (the only cells a terminal may wrap)."""
        return {i for i, column in enumerate(self.columns) if i and column in TEXT_COLUMNS}

    def path_columns(self) -> set[int]:
        """Indices of the columns that hold input paths, or labels that give way like them (a long group value
        must not squeeze a number)."""
        return {i for i, column in enumerate(self.columns) if column in PATH_COLUMNS} | self.labels


def _metric_rows(report: Report, keys: list[str], strip: str) -> list[list[str]]:
    return [[key[len(strip):], format_value(report.metrics.get(key))] for key in keys]


def health_section(report: Report) -> Section:
    """verl's warning bands, one row per check."""
    rows, highlight = [], set()
    for i, check in enumerate(report.summary.get("checks", [])):
        rows.append([check["label"], format_value(check["value"]), check["healthy_range"],
                     check_mark(check).strip()])  # the first screen's ok / few / OUT
        if not check["ok"]:
            highlight.add(i)
    status = report.summary.get("status", "healthy")
    return Section(f"Health: {status}", ["check", "value", "healthy range", "status"], rows, highlight)


LEGACY = "mismatch/"


def _semantics(report: Report) -> str:
    return str(report.config.get("semantics") or "verl")


def offpolicy_section(report: Report) -> Section:
    """The 13 off-policy keys with what each means (verl 0.6.0 / xtuner: their `mismatch_*` keys)."""
    rows = []
    if any(k.startswith(LEGACY + "mismatch_") for k in report.metrics):
        keys = sorted(k for k in report.metrics if k.startswith(LEGACY + "mismatch_"))
        return Section(f"Off-policy ({_semantics(report)}, mismatch/)", ["metric", "value"],
                       _metric_rows(report, keys, LEGACY))
    for metric in (m for m in METRICS if m.family is OFFPOLICY):
        meaning = f"{metric.reduction.split(' over ')[0]}: {metric.meaning}"
        rows.append([metric.key[len(VERL):], format_value(report.metrics.get(metric.key)), meaning])
    return Section("Off-policy (rollout_corr/)", ["metric", "value", "meaning"], rows)


def trainer_section(report: Report) -> Section | None:
    """A replayed trainer's own keys, with what each means (in place of verl's off-policy table)."""
    family = replay_families().get(_semantics(report))
    if family is None:
        return None
    rows = []
    for key, value in report.metrics.items():
        metric = lookup(key)
        if key.startswith(("diag/", "per_round/")) or metric is None:
            continue
        rows.append([key, format_value(value), metric.meaning.split("; source:")[0]])  # `mismatch metrics KEY`: all
    if not rows:
        return Section(f"{family.title} ({family.name})", ["metric", "value"], [],
                       note="the trainer logs none of its keys under this configuration (its correction is off)")
    return Section(f"{family.title} ({family.name})", ["metric", "value", "meaning"], rows)


def importance_section(report: Report) -> Section | None:
    """The rollout_is_* keys, when IS is configured."""
    prefix = LEGACY if any(k.startswith(LEGACY + "rollout_is_") for k in report.metrics) else VERL
    keys = sorted(k for k in report.metrics if k.startswith(prefix + "rollout_is_"))
    if not keys:
        return None
    config = report.config
    if _semantics(report) == "verl":
        title = f"Importance sampling: {config.get('rollout_is')} level, threshold {config.get('rollout_is_threshold')}"
    else:
        settings = ", ".join(f"{k}={v}" for k, v in config.items()
                             if k.startswith(("rollout_is", "rollout_token_veto")) and v is not None)
        title = f"Importance sampling ({_semantics(report)}): {settings}"
    return Section(title, ["metric", "value"], _metric_rows(report, keys, prefix))


def rejection_section(report: Report) -> Section | None:
    """Per-option RS statistics side by side, then the combined rejection."""
    keys = [k for k in report.metrics if k.startswith(VERL + "rollout_rs_")]
    if not keys:
        return None
    if _semantics(report) in ("verl-0.7.0", "verl-0.6.1"):  # one RS mode, no per-option keys
        config = report.config
        band = f"[{config.get('rollout_rs_threshold_lower') or '1/U'}, {config.get('rollout_rs_threshold')}]"
        title = f"Rejection sampling ({_semantics(report)}): {config.get('rollout_rs')} in {band}"
        return Section(title, ["metric", "value"], _metric_rows(report, sorted(keys), VERL))
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
    # Steps where a headline metric leaves its band (the drift analysis names them): flagged and highlighted.
    out_of_band: dict[str, list[str]] = {}
    for key, entry in (getattr(report, "drift", None) or {}).items():
        for step in entry.get("bad_steps") or []:
            out_of_band.setdefault(str(step), []).append(key.split("/")[-1])
    rows, highlight = [], set()
    for i, step in enumerate(report.steps):
        row = [str(step["step"])]
        for _, key in present:
            row.append(format_value(step["valid_tokens"] if key is None else step["metrics"].get(key)))
        if out_of_band:
            row.append(", ".join(out_of_band.get(str(step["step"]), [])) or "-")
            if str(step["step"]) in out_of_band:
                highlight.add(i)
        rows.append(row)
    columns = ["step", *[label for label, _ in present], *(["out of band"] if out_of_band else [])]
    return Section("Per step", columns, rows, highlight)


def group_sections(report: Report) -> list[Section]:
    """One table per `--by COLUMN`, one row per value, like the per-step table."""
    sections = []
    for column, entries in (report.groups or {}).items():
        if column == "step" or not entries:
            continue
        present = [(label, key) for label, key in STEP_COLUMNS
                   if key is None or any(key in e["metrics"] for e in entries)]
        rows = [[one_line("(missing)" if e["group"] is None else str(e["group"])),  # a missing value: null
                 *[format_value(e["valid_tokens"] if key is None else e["metrics"].get(key)) for _, key in present]]
                for e in entries]
        sections.append(Section(f"Per {column}", [column, *[label for label, _ in present]], rows, labels={0}))
    return sections


def lag_section(report: Report) -> Section | None:
    """The mismatch per policy lag, when the dump stamps a policy version (or lag) on its rows."""
    entry = next((f for f in report.findings or [] if f.get("code") in ("policy_lag", "lag_ruled_out")), None)
    if entry is None:
        return None
    rows = [[str(e["lag"]), format_value(e["rows"]), format_value(e["tokens"]), format_value(e["prob_abs_diff_mean"]),
             format_value(e["prob_abs_diff_mean_se"]), format_value(e["token_mult_prob_error"]), format_value(e["kl"])]
            for e in entry["evidence"]["lags"]]
    return Section("Per policy lag (versions behind)", ["lag", "rows", "tokens", "mean |Δp|", "its SE",
                                                         "token_mult_prob_error", "kl (k1)"], rows, labels={0})


SHOWN_ROUNDS = 24  # rounds per table or plot: an agent log can hold thousands (a 0/1-alternating mask)
ROUND_METRICS = (
    ("rows reaching", "rows"),
    ("tokens", "tokens"),
    ("mean |d|", "abs_diff_mean"),
    ("p99 |d|", "abs_diff_p99"),
    ("kl (k1)", "kl"),
    ("k3_kl", "k3_kl"),
    ("chi2_token", "chi2_token"),
    ("ratio mean", "ratio_mean"),
    ("IS weight mean", "is_weight_mean"),
    ("RS masked", "rs_masked_fraction"),
    ("catastrophic", "catastrophic_fraction"),
    ("share of sum |d|", "abs_diff_share"),
)


def shown_rounds(entries: list[dict]) -> list[dict]:
    """The rounds a human-facing rendering shows: the first SHOWN_ROUNDS (report.json keeps every one)."""
    return entries[:SHOWN_ROUNDS]


def _round_table(title: str, label: str, prefix: str, all_entries: list[dict]) -> Section | None:
    # One column per round (metrics as rows) keeps the table readable in 80 columns.
    if len(all_entries) < 2:
        return None  # a single-turn dump: the round table repeats the overall numbers
    means = [e.get("abs_diff_mean") for e in all_entries]
    worst = max((i for i, v in enumerate(means) if v is not None), key=lambda i: means[i], default=None)
    entries = shown_rounds(all_entries)
    if worst is not None and worst >= len(entries):
        entries = [*entries, all_entries[worst]]
    present = [(h, k) for h, k in ROUND_METRICS if any(k in e for e in entries)]
    rows = [[h, *[format_value(e.get(k)) for e in entries]] for h, k in present]
    worst_entry = None if worst is None else all_entries[worst]
    columns = [label, *[f"{prefix}{e[label]}" + (" *" if e is worst_entry else "") for e in entries]]
    notes = [] if worst_entry is None else [f"* worst round by mean |d| ({prefix}{worst_entry[label]})"]
    if len(all_entries) > SHOWN_ROUNDS:
        notes.append(f"{len(all_entries) - SHOWN_ROUNDS} more rounds in report.json (--format json)")
    return Section(title, columns, rows, note="; ".join(notes) or None)


def rounds_section(report: Report) -> Section | None:
    """Per-round divergence (round k = k-th run of 1s in the mask); the worst round highlighted."""
    return _round_table("Rounds (round k = k-th run of 1s in the mask)", "round", "r", report.rounds)


def rounds_from_end_section(report: Report) -> Section | None:
    """The same table indexed from the last round of each trajectory."""
    return _round_table("Rounds from the end (last = the row's last round)", "round_from_end", "last-",
                        report.rounds_from_end)


def rounds_by_step_section(report: Report) -> Section | None:
    """Mean |delta| per step and round."""
    if not report.steps or max((len(s.get("rounds", [])) for s in report.steps), default=0) < 2:
        return None
    count = min(max(len(s["rounds"]) for s in report.steps), SHOWN_ROUNDS)
    rows = []
    for step in report.steps:
        rounds = shown_rounds(step["rounds"])
        means = [r["abs_diff_mean"] for r in rounds] + [None] * (count - len(rounds))
        rows.append([str(step["step"]), *[format_value(v) if v is not None else "" for v in means]])
    return Section("Mean |d| by step and round", ["step", *[f"r{k}" for k in range(count)]], rows)


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


def quantiles_section(report: Report) -> Section | None:
    """Quantiles of delta and |delta| from the sketch."""
    signed = report.quantiles.get("log_ratio") or {}
    absolute = report.quantiles.get("abs_log_ratio") or {}
    levels = sorted({*signed, *absolute}, key=float)
    if not levels:
        return None
    rows = [[f"{float(q) * 100:g} %", format_value(signed[q]) if q in signed else "",
             format_value(absolute[q]) if q in absolute else ""] for q in levels]
    error = report.quantiles.get("relative_error", 0.004)
    return Section("Quantiles of d = old - rollout", ["quantile", "d", "abs(d)"], rows,
                   note=f"from a mergeable sketch: within {error * 100:.1f} % of the exact quantile")


def what_if_section(report: Report) -> Section | None:
    """Every common IS / RS / veto setting at a ladder of thresholds, computed on this dump."""
    if not report.what_if:
        return None
    rows = [[w["name"], format_percent(w.get("truncated_token_fraction")),
             format_percent(w.get("masked_token_fraction")), format_percent(w.get("masked_seq_fraction")),
             "-" if w.get("is_weight_mean") is None else format_value(w["is_weight_mean"]), format_value(w.get("ess"))]
            for w in report.what_if]
    return Section("What if: every common correction on this dump",
                   ["setting", "truncated", "masked tok", "masked seq", "IS w mean", "ESS"], rows,
                   note="truncated / masked tok: share of valid tokens; masked seq: share of rows with any valid "
                        "token dropped; ESS: verl's formula on the IS weights (IS rows) or on the raw token "
                        "ratios kept (RS / veto rows). Flags to apply a row: what_if[].flags in the JSON.")


WORST_SHOWN = 5


def worst_sequences_section(report: Report) -> Section | None:
    """The rows with the largest |mean d|, max |d| and max d."""
    if not report.worst_sequences:
        return None
    labels = {"abs_mean_log_ratio": "|mean d|", "max_abs_log_ratio": "max |d|", "max_log_ratio": "max d"}
    shown = [e for e in report.worst_sequences if e["rank"] <= WORST_SHOWN]
    with_id = any(e.get("id") is not None for e in shown)
    with_step = any(e.get("step") is not None for e in shown)
    rows = []
    for entry in shown:
        row = [f"{labels.get(entry['criterion'], entry['criterion'])} #{entry['rank']}",
               f"{entry['file'].replace(chr(92), '/').rsplit('/', 1)[-1]}:{entry['row']}"]
        row += [str(entry.get("id"))] if with_id else []
        row += [str(entry.get("step"))] if with_step else []
        row += [format_value(entry["tokens"]), format_value(entry["log_ratio_mean"]),
                format_value(entry["max_abs_log_ratio"])]
        rows.append(row)
    columns = ["by", "sequence", *(["id"] if with_id else []), *(["step"] if with_step else []), "tokens",
               "mean d", "max abs(d)"]  # no '|' in headers: Markdown tables split on it
    return Section("Worst sequences", columns, rows, repeat=2,
                   note="file name:row (0-based row within the file); all ranks and full paths in "
                        "worst_sequences in the JSON")


def build_sections(report: Report) -> list[Section]:
    """Every section that applies to this report, in reading order."""
    replayed = _semantics(report) in replay_families()
    candidates = [
        health_section(report),
        trainer_section(report) if replayed else offpolicy_section(report),
        importance_section(report),
        rejection_section(report),
        diagnostics_section(report),
        quantiles_section(report),
        what_if_section(report),
        worst_sequences_section(report),
        rounds_section(report),
        rounds_from_end_section(report),
        steps_section(report),
        *group_sections(report),
        lag_section(report),
        rounds_by_step_section(report),
        quality_section(report),
        inputs_section(report),
    ]
    return [s for s in candidates if s is not None]
