"""PNG plots of a finished report (matplotlib, Agg): distributions of delta, IS weights, rounds, positions, steps.

Everything is drawn from the report alone (its histograms, quantiles, rounds and steps), so a
`report.json` read back later plots the same. Each function returns None when its data is absent.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from mismatch_cli.render.plot_steps import steps_plot
from mismatch_cli.render.plotting import COLORS, png_bytes, pyplot
from mismatch_cli.render.sections import SHOWN_ROUNDS, shown_rounds
from mismatch_cli.report import Report

CATASTROPHIC = 1e4  # a token ratio outside [1e-4, 1e4]
REFERENCE_TIS = 2.0  # drawn when no IS is configured: verl's default TIS bound
DELTA_FLOOR = 1e-6  # |delta| below this is drawn as "about 0"
DELTA = "Δ = log π_train − log π_rollout (nats)"
# Caption per plot, in the order the HTML report shows them.
CAPTIONS = {
    "delta_hist.png": "Histogram of the token log-ratio Δ (symmetric log x-axis, log counts), with the "
    "correction thresholds as shaded bands.",
    "abs_delta_ccdf.png": "Tail of |Δ|: fraction of tokens with |Δ| above x (log-log).",
    "is_weights.png": "Distribution of the importance weights (or of the raw token ratios when no IS is configured).",
    "rounds.png": "Mean |Δ| per round of the multi-turn trajectories, from the start and from the end.",
    "position.png": "Mean |Δ| by token position within the response.",
    "steps.png": "Per-step trends, one panel per metric (log or symmetric-log y-axis where a metric spans more "
    "than two decades); dashed lines are the healthy bands, circled steps lie outside them.",
}


def _figure(rows: int = 1, height: float = 4.2) -> tuple[Any, Any]:
    plt = pyplot()
    fig, axes = plt.subplots(rows, 1, figsize=(8.6, height), dpi=100, squeeze=False)
    for ax in axes[:, 0]:
        ax.grid(True, alpha=0.3, linewidth=0.6)
        ax.spines["top"].set_visible(False)
        ax.spines["right"].set_visible(False)
    return fig, axes[:, 0]


def _is_band(report: Report) -> tuple[float | None, float]:
    """The configured IS bounds on the ratio (lower is None for TIS), or verl's default TIS 2.0 as a reference."""
    threshold = report.config.get("rollout_is_threshold")
    if report.config.get("rollout_is") and threshold is not None:
        text = str(threshold)
        if "_" in text:
            lower, upper = text.split("_")
            return float(lower), float(upper)
        try:
            return None, float(text)
        except ValueError:
            pass
    return None, REFERENCE_TIS


def _is_label(report: Report) -> str:
    lower, upper = _is_band(report)
    if not report.config.get("rollout_is"):
        return f"ratio > {upper:g} (TIS {upper:g} would truncate)"
    if lower is None:
        return f"ratio > {upper:g} (TIS truncates)"
    return f"ratio outside [{lower:g}, {upper:g}] (IcePop zeroes)"


def signed_bins(histogram: dict[str, Any], floor: float = DELTA_FLOOR) -> tuple[np.ndarray, np.ndarray] | None:
    """Monotone signed bin edges and counts from a report histogram; |value| < floor lumped into one middle bin."""
    edges = np.asarray(histogram.get("edges") or [], dtype=np.float64)
    zero = int(histogram.get("zero", 0))
    if edges.size and ("negative" not in histogram or "positive" not in histogram):
        return None  # not analyze's magnitude form (e.g. {edges, counts} over delta): nothing drawn here
    negative = np.asarray(histogram.get("negative") or [], dtype=np.float64)
    positive = np.asarray(histogram.get("positive") or [], dtype=np.float64)
    total = zero + negative.sum() + positive.sum()
    if not total:
        return None
    if edges.size == 0 or edges[-1] <= 0:
        # Every token sits at |value| = 0 (or bins of zero width there): one middle bin holds them all.
        return np.array([-floor, floor]), np.array([total], dtype=np.float64)
    if edges[-1] <= floor:
        floor = float(edges[0])
    keep = edges[:-1] >= floor * (1 - 1e-9)
    middle = zero + negative[~keep].sum() + positive[~keep].sum()
    start = int(np.argmax(keep)) if keep.any() else edges.size - 1
    magnitude = edges[start:]
    floor = float(magnitude[0])
    signed_edges = np.concatenate([-magnitude[::-1], magnitude])
    counts = np.concatenate([negative[keep][::-1], [middle], positive[keep]])
    return signed_edges, counts


def _bands_delta(ax: Any, report: Report, absolute: bool = False) -> None:
    """Shade where the configured (or reference) IS bounds and the catastrophic bound act, in delta units."""
    lower, upper = _is_band(report)
    low, high = ax.get_xlim()
    band = {"color": COLORS["band"], "alpha": 0.10, "linewidth": 0}
    catastrophic = {"color": COLORS["catastrophic"], "alpha": 0.18, "linewidth": 0}
    up = math.log(upper)
    ax.axvspan(up, max(high, up * 1.01), label=_is_label(report), **band)
    if lower is not None and not absolute:
        ax.axvspan(min(low, math.log(lower) * 1.01), math.log(lower), **band)
    elif lower is not None:
        ax.axvspan(-math.log(lower), max(high, -math.log(lower) * 1.01), **band)
    cat = math.log(CATASTROPHIC)
    if high > cat:
        ax.axvspan(cat, high, label="catastrophic: ratio outside [1e-4, 1e4]", **catastrophic)
    if not absolute and low < -cat:
        ax.axvspan(low, -cat, **catastrophic)
    ax.set_xlim(low, high)


def _pairs(edges: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Merge neighbouring bins on each side of the middle bin (8 -> 4 bins per octave), for a smoother picture."""
    middle = counts.size // 2
    side = middle - middle % 2
    if side < 2:
        return edges, counts
    negative = counts[middle - side : middle].reshape(-1, 2).sum(axis=1)
    positive = counts[middle + 1 : middle + 1 + side].reshape(-1, 2).sum(axis=1)
    new_counts = np.concatenate([counts[: middle - side], negative, [counts[middle]], positive,
                                 counts[middle + 1 + side :]])
    keep = np.ones(edges.size, dtype=bool)
    keep[middle - side + 1 : middle : 2] = False
    keep[middle + 2 : middle + 1 + side : 2] = False
    return edges[keep], new_counts


def _legend_below(ax: Any) -> None:
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3, fontsize=8, frameon=False)


def delta_histogram(report: Report) -> bytes | None:
    """Histogram of delta on a symmetric-log x-axis and a log count axis, thresholds as bands."""
    bins = signed_bins(report.histograms.get("log_ratio") or {})
    if bins is None:
        return None
    edges, counts = _pairs(*bins)
    floor = float(edges[edges > 0][0])
    fig, (ax,) = _figure()
    shown = counts > 0
    colors = np.where(np.isclose(edges[:-1], -floor), COLORS["muted"], COLORS["data"])
    ax.bar(edges[:-1][shown], counts[shown], width=np.diff(edges)[shown], align="edge", color=colors[shown],
           linewidth=0, log=True)
    ax.set_xscale("symlog", linthresh=floor, linscale=0.6)
    reach = max(abs(edges[0]), abs(edges[-1]), 1.0)
    ax.set_xlim(-reach * 1.2, reach * 1.2)
    _bands_delta(ax, report)
    ax.axvline(0.0, color=COLORS["muted"], linewidth=0.8)
    tokens = int(counts.sum())
    ax.set_title(f"Token log-ratio Δ ({tokens:,} valid tokens)", fontsize=12)
    ax.set_xlabel(f"{DELTA}; symmetric log scale, |Δ| < {floor:.2g} in the grey middle bin")
    ax.set_ylabel("tokens per bin (log scale)")
    _legend_below(ax)
    return png_bytes(fig)


def abs_delta_ccdf(report: Report) -> bytes | None:
    """Fraction of tokens with |delta| > x on log-log axes, quantile markers and threshold bands."""
    histogram = report.histograms.get("log_ratio") or {}
    edges = np.asarray(histogram.get("edges") or [], dtype=np.float64)
    if edges.size == 0 or edges[-1] <= 0 or "negative" not in histogram or "positive" not in histogram:
        return None  # nothing above |delta| = 0 to draw on a log axis (or not analyze's magnitude form)
    counts = np.asarray(histogram["negative"], dtype=np.float64) + np.asarray(histogram["positive"], dtype=np.float64)
    total = counts.sum() + int(histogram.get("zero", 0))
    if not counts.sum():
        return None
    above = (counts.sum() - np.cumsum(counts)) / total  # P(|delta| >= upper edge of bin i)
    x = np.concatenate([[edges[0]], edges[1:]])
    y = np.concatenate([[counts.sum() / total], above])
    shown = (y > 0) & (x > 0)
    fig, (ax,) = _figure()
    ax.step(x[shown], y[shown], where="post", color=COLORS["data"], linewidth=1.6, label="P(|Δ| > x)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    marks = (report.quantiles or {}).get("abs_log_ratio") or {}
    for level, value in marks.items():
        if value:
            ax.plot([value], [1.0 - float(level)], "o", color=COLORS["second"], markersize=5)
            ax.annotate(f"p{float(level) * 100:g}", (value, 1.0 - float(level)), textcoords="offset points",
                        xytext=(6, 3), fontsize=8, color=COLORS["second"])
    low, high = ax.get_xlim()
    ax.set_xlim(low, max(high, math.log(_is_band(report)[1]) * 1.5))
    _bands_delta(ax, report, absolute=True)
    ax.set_title("Tail of |Δ| (complementary CDF)", fontsize=12)
    ax.set_xlabel("|Δ| = |log π_train − log π_rollout| (nats, log scale)")
    ax.set_ylabel("fraction of tokens with |Δ| > x (log scale)")
    _legend_below(ax)
    return png_bytes(fig)


def _share_above(report: Report, sequence: bool, upper: float) -> str | None:
    """The share of tokens (or rows) whose raw weight exceeds the upper bound, from the report's numbers."""
    key = "rollout_corr/rollout_is_ratio_fraction_high"
    if report.config.get("rollout_is") and report.metrics.get(key) is not None:
        what = "rows" if sequence else "valid tokens"
        return f"{report.metrics[key] * 100:.3g} % of {what} have a raw weight > {upper:g}"
    for row in report.what_if:
        if row.get("family") == "tis" and row.get("level") == "token" and float(row["threshold"]) == upper:
            share = row.get("truncated_token_fraction")
            return None if share is None else f"{share * 100:.3g} % of valid tokens have a ratio > {upper:g}"
    return None


def is_weights(report: Report) -> bytes | None:
    """Distribution of the IS weights' raw values (sequence ratios for sequence IS, else token ratios)."""
    level = report.config.get("rollout_is")
    sequence = level == "sequence"
    key = "sequence_log_ratio_sum" if sequence else "log_ratio"
    bins = signed_bins(report.histograms.get(key) or {})
    if bins is None:
        return None
    edges, counts = _pairs(*bins)
    ratio_edges = np.exp(np.clip(edges, -20.0, 20.0))  # verl's safety clamp
    fig, (ax,) = _figure()
    shown = counts > 0
    ax.bar(ratio_edges[:-1][shown], counts[shown], width=np.diff(ratio_edges)[shown], align="edge",
           color=COLORS["data"], linewidth=0, log=True)
    ax.set_xscale("log")
    lower, upper = _is_band(report)
    low, high = ax.get_xlim()
    high = max(high, upper * 1.5)
    band = {"color": COLORS["band"], "alpha": 0.10, "linewidth": 0}
    ax.axvspan(upper, high, label=_is_label(report), **band)
    if lower is not None:
        low = min(low, lower / 1.5)
        ax.axvspan(low, lower, **band)
    ax.set_xlim(low, high)
    ax.axvline(1.0, color=COLORS["muted"], linewidth=0.8)
    if level:
        title = f"Raw IS weights, {level} level (threshold {report.config.get('rollout_is_threshold')})"
    else:
        title = "Raw token ratios π_train / π_rollout (no IS configured)"
    ax.set_title(title, fontsize=12)
    unit = "sequence weight exp(Σ Δ) per row" if sequence else "token ratio exp(Δ)"
    ax.set_xlabel(f"{unit} (clamped to e^±20 as verl does; log scale)")
    ax.set_ylabel(("sequences" if sequence else "tokens") + " per bin (log scale)")
    share = _share_above(report, sequence, upper)
    if share is not None:
        ax.text(0.99, 0.96, share, transform=ax.transAxes, ha="right", va="top", fontsize=9,
                bbox={"facecolor": "white", "edgecolor": "#cccccc", "boxstyle": "round,pad=0.3"})
    _legend_below(ax)
    return png_bytes(fig)


def _round_panel(ax: Any, entries: list[dict[str, Any]], label: str, prefix: str) -> None:
    names = [f"{prefix}{int(e[label])}" for e in entries]
    means = [e.get("abs_diff_mean") or 0.0 for e in entries]
    p99 = [e.get("abs_diff_p99") for e in entries]
    positions = np.arange(len(entries))
    bars = ax.bar(positions, means, color=COLORS["data"], width=0.6, label="mean |Δ| (bars, left axis)")
    top = max(means) * 1.25 if max(means) > 0 else 1.0
    ax.set_ylim(0, top)
    for bar, entry in zip(bars, entries, strict=True):
        # Token counts inside the bar's foot (above it when the bar is too short to hold the text).
        inside = bar.get_height() > 0.15 * top
        ax.annotate(f"{int(entry.get('tokens') or 0):,} tok", (bar.get_x() + bar.get_width() / 2,
                    0.0 if inside else bar.get_height()), textcoords="offset points", xytext=(0, 3), ha="center",
                    va="bottom", fontsize=8, color="white" if inside else "#333333")
    ax.set_xticks(positions, names, fontsize=8)
    ax.set_ylabel("mean |Δ| (nats)")
    handles, labels = ax.get_legend_handles_labels()
    if any(v is not None for v in p99):
        tail = ax.twinx()
        tail.plot(positions, [np.nan if v is None else v for v in p99], "D", color=COLORS["second"], markersize=6,
                  label="p99 |Δ| (diamonds, right axis)")
        tail.set_ylim(0, max(v for v in p99 if v is not None) * 1.25 or 1)
        tail.set_ylabel("p99 |Δ| (nats)", color=COLORS["second"])
        tail.spines["top"].set_visible(False)
        more_handles, more_labels = tail.get_legend_handles_labels()
        handles, labels = handles + more_handles, labels + more_labels
    ax.legend(handles, labels, loc="upper left", fontsize=8, frameon=False)


def rounds_plot(report: Report) -> bytes | None:
    """Mean and p99 |delta| per round (bars labelled with token counts), from the start and from the end."""
    if len(report.rounds) < 2:
        return None
    panels = [(report.rounds, "round", "r", "Round k from the start (k-th run of 1s in the mask)")]
    if len(report.rounds_from_end) >= 2:
        panels.append((report.rounds_from_end, "round_from_end", "last-",
                       "Rounds counted from the end (last-0 = last)"))
    fig, axes = _figure(len(panels), height=3.4 * len(panels))
    for ax, (entries, label, prefix, title) in zip(axes, panels, strict=True):
        _round_panel(ax, shown_rounds(entries), label, prefix)
        more = f" (first {SHOWN_ROUNDS} of {len(entries)})" if len(entries) > SHOWN_ROUNDS else ""
        ax.set_title(title + more, fontsize=11)
    axes[-1].set_xlabel("round")
    fig.suptitle("Divergence per multi-turn round", fontsize=12)
    return png_bytes(fig)


def position_plot(report: Report) -> bytes | None:
    """Mean |delta| by token position, with the valid tokens per bin on a second axis."""
    profile = report.histograms.get("position") or {}
    tokens = np.asarray(profile.get("tokens") or [], dtype=np.float64)
    if tokens.size < 2 or not tokens.any():
        return None
    width = int(profile["bin_width"])
    means = np.array([np.nan if v is None else v for v in profile["abs_log_ratio_mean"]], dtype=np.float64)
    starts = np.arange(tokens.size) * width
    fig, (ax,) = _figure()
    counts_ax = ax.twinx()
    counts_ax.bar(starts, tokens, width=width, align="edge", color=COLORS["muted"], alpha=0.25, linewidth=0)
    counts_ax.set_yscale("log")
    counts_ax.set_ylabel("valid tokens per bin (grey bars, log scale)", color=COLORS["muted"])
    ax.set_zorder(counts_ax.get_zorder() + 1)
    ax.patch.set_visible(False)
    ax.plot(starts + width / 2, means, color=COLORS["data"], linewidth=1.5, marker=".", markersize=3,
            label="mean |Δ|")
    ax.set_title(f"Mean |Δ| by token position ({width}-token bins)", fontsize=12)
    ax.set_xlabel("token position within the response (tokens from its first position)")
    ax.set_ylabel("mean |Δ| (nats)")
    ax.set_xlim(0, starts[-1] + width)
    ax.legend(loc="upper left", fontsize=8, frameon=False)
    return png_bytes(fig)


PLOTS: dict[str, Callable[[Report], bytes | None]] = {
    "delta_hist.png": delta_histogram,
    "abs_delta_ccdf.png": abs_delta_ccdf,
    "is_weights.png": is_weights,
    "rounds.png": rounds_plot,
    "position.png": position_plot,
    "steps.png": steps_plot,
}


def render_plots(report: Report) -> dict[str, bytes]:
    """PNG bytes per file name, for every plot whose data the report has."""
    images = {}
    for name, plot in PLOTS.items():
        png = plot(report)
        if png is not None:
            images[name] = png
    return images


__all__ = ["CAPTIONS", "PLOTS", "render_plots", "signed_bins"]
