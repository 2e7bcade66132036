"""The per-step plot (steps.png): small multiples, one panel per metric, scaled so every series is readable."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from mismatch_cli.render.plotting import COLORS, png_bytes, pyplot
from mismatch_cli.report import Report

# One panel per metric (small multiples sharing the step axis): k1 (~1e-4) and k3 (spikes to 45) on one
# axis would make k1 a flat line.
STEP_METRICS = (
    ("diag/logprob_abs_diff_mean", "mean |Δ| (nats)"),
    ("diag/abs_log_ratio_p99", "p99 |Δ| (nats)"),
    ("rollout_corr/kl", "kl, k1 (nats, signed)"),
    ("rollout_corr/k3_kl", "k3_kl (nats)"),
    ("rollout_corr/chi2_token", "chi2_token"),
    ("rollout_corr/rollout_is_eff_sample_size", "IS ESS"),
    ("diag/ess_token", "ESS of raw ratios"),
    ("rollout_corr/rollout_rs_masked_fraction", "RS masked fraction"),
)
DECADES = 2.0  # a positive metric spanning more than this many decades gets a log axis


def axis_scale(values: list[float]) -> tuple[str, float | None]:
    """The y scale for a series: `log` when positive over > 2 decades, `symlog` (and its linthresh) when
    signed over > 2 decades of magnitude, else `linear`."""
    finite = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=np.float64)
    magnitudes = np.abs(finite[finite != 0])
    if magnitudes.size < 2 or math.log10(magnitudes.max() / magnitudes.min()) <= DECADES:
        return "linear", None
    if (finite > 0).all():
        return "log", None
    return "symlog", float(magnitudes.min())


def _band_violations(key: str, values: list[float | None]) -> tuple[Any, list[bool]]:
    from mismatch_cli.metrics import lookup

    metric = lookup(key)
    band = None if metric is None else metric.band
    return band, [band is not None and v is not None and math.isfinite(v) and not band.healthy(v) for v in values]


def steps_figure(report: Report) -> Any | None:
    """The per-step figure: one panel per metric the steps carry, shared x = step, out-of-band steps marked."""
    if len(report.steps) < 2:
        return None
    from matplotlib.ticker import MaxNLocator

    steps = [int(s["step"]) for s in report.steps]
    present = [(key, label) for key, label in STEP_METRICS
               if any(s["metrics"].get(key) is not None for s in report.steps)]
    if not present:
        return None
    columns = 2 if len(present) > 3 else 1
    rows = -(-len(present) // columns)
    plt = pyplot()
    fig, axes = plt.subplots(rows, columns, figsize=(8.6 if columns == 1 else 11.0, 2.3 * rows + 0.8), dpi=100,
                             squeeze=False, sharex=True)
    for ax, (key, label) in zip(axes.flat, present, strict=False):
        values = [s["metrics"].get(key) for s in report.steps]
        series = np.array([np.nan if v is None else v for v in values], dtype=np.float64)
        ax.plot(steps, series, marker="o", markersize=3, color=COLORS["data"], linewidth=1.3)
        scale, linthresh = axis_scale(values)
        if scale == "symlog":
            ax.set_yscale("symlog", linthresh=linthresh)
            ax.axhline(0.0, color=COLORS["muted"], linewidth=0.8)
        elif scale == "log":
            ax.set_yscale("log")
        band, out = _band_violations(key, values)
        low, high = ax.get_ylim()  # the data's range: a band edge far away must not flatten the series
        if band is not None:
            for bound in (band.low, band.high):
                for edge in ((bound, -bound) if band.absolute and bound else (bound,)):
                    if edge is not None and low <= edge <= high:
                        ax.axhline(edge, color=COLORS["band"], linestyle="--", linewidth=0.9, alpha=0.7)
            ax.set_ylim(low, high)
        if any(out):
            ax.plot([x for x, o in zip(steps, out, strict=True) if o], series[np.asarray(out)], "o",
                    markersize=8, markerfacecolor="none", markeredgecolor=COLORS["band"], markeredgewidth=1.6,
                    label="outside the band")
            ax.legend(loc="best", fontsize=7, frameon=False)
        scale_text = {"log": ", log scale", "symlog": ", symmetric log scale"}.get(scale, "")
        band_text = "" if band is None else f"; band {band.describe()}"
        ax.set_title(f"{label}{scale_text}{band_text}", fontsize=9, loc="left")
        ax.tick_params(labelsize=8)
        ax.grid(True, alpha=0.3, linewidth=0.6)
        ax.spines["top"].set_visible(False)
        ax.spines["right"].set_visible(False)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    for ax in list(axes.flat)[len(present):]:
        ax.axis("off")
    for ax in axes[-1]:
        ax.set_xlabel("training step", fontsize=9)
    if len(present) % columns:  # the last row's empty cell: label the step axis of the panel above it
        axes[-2, -1].tick_params(labelbottom=True)
        axes[-2, -1].set_xlabel("training step", fontsize=9)
    fig.suptitle("Per-step trends (one panel per metric; dashed: healthy band; circled: step outside it)",
                 fontsize=11)
    return fig


def steps_plot(report: Report) -> bytes | None:
    """Per-step small multiples of |delta|, the KL estimates, chi-squared, the ESS and RS masking."""
    fig = steps_figure(report)
    return None if fig is None else png_bytes(fig)


__all__ = ["STEP_METRICS", "axis_scale", "steps_figure", "steps_plot"]
