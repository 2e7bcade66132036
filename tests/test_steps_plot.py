"""steps.png: one panel per metric sharing the step axis, log / symlog where a series spans > 2 decades, bands."""

from __future__ import annotations

import math

import numpy as np
import pytest

from mismatch_cli.render.plot_steps import axis_scale, steps_figure, steps_plot
from mismatch_cli.report import Report

# A run like the issue's: k1 ~ -1e-4 with a signed excursion, k3 ~ 1e-4 spiking to 45 at step 7,
# chi-squared spiking far above its band (<= 1), the raw ESS falling below its band (>= 0.3) there.
STEPS = 12
SPIKE = 7


def _series() -> dict[str, list[float]]:
    k1 = [-1e-4 * (1 + 0.1 * s) for s in range(STEPS)]
    k1[3] = 2e-7  # a positive step: k1 is signed, magnitudes from 2e-7 to 3e-3
    k1[SPIKE] = -3e-3
    k3 = [1e-4 + 1e-5 * s for s in range(STEPS)]
    k3[SPIKE] = 45.0
    chi2 = [2e-3] * STEPS
    chi2[SPIKE] = 2.4e7
    ess = [0.999] * STEPS
    ess[SPIKE] = 1e-5
    mean = [0.003 + 1e-4 * s for s in range(STEPS)]  # within a decade: linear
    return {"rollout_corr/kl": k1, "rollout_corr/k3_kl": k3, "rollout_corr/chi2_token": chi2,
            "diag/ess_token": ess, "diag/logprob_abs_diff_mean": mean}


def _report(series: dict[str, list[float]]) -> Report:
    steps = [{"step": s, "valid_tokens": 1000, "metrics": {k: v[s] for k, v in series.items()}} for s in range(STEPS)]
    return Report(tool={}, created_at="", inputs=[], config={}, metrics={}, steps=steps)


@pytest.fixture()
def figure():  # noqa: ANN201
    fig = steps_figure(_report(_series()))
    yield fig
    import matplotlib.pyplot as plt

    plt.close(fig)


def _panel(fig, word: str):  # noqa: ANN001, ANN202
    found = [ax for ax in fig.axes if ax.get_title(loc="left").startswith(word)]
    assert len(found) == 1, [ax.get_title(loc="left") for ax in fig.axes]
    return found[0]


def test_one_panel_per_metric_sharing_the_step_axis(figure) -> None:  # noqa: ANN001
    drawn = [ax for ax in figure.axes if ax.axison]
    assert len(drawn) == 5  # one per metric the steps carry, no more
    first = drawn[0]
    for ax in drawn:
        assert ax.get_shared_x_axes().joined(first, ax)
        (line, *_) = ax.get_lines()
        assert list(line.get_xdata()) == list(range(STEPS))


def test_scales_follow_the_spread_and_sign(figure) -> None:  # noqa: ANN001
    assert _panel(figure, "kl").get_yscale() == "symlog"  # signed, 4 decades of magnitude
    assert _panel(figure, "k3_kl").get_yscale() == "log"  # 1e-4 .. 45
    assert _panel(figure, "chi2_token").get_yscale() == "log"
    assert _panel(figure, "ESS of raw").get_yscale() == "log"  # 1e-5 .. 0.999
    assert _panel(figure, "mean |Δ|").get_yscale() == "linear"
    # The symlog's linear region is the smallest non-zero magnitude, so k1's small steps are not flattened.
    transform = _panel(figure, "kl").yaxis.get_transform()
    assert math.isclose(transform.linthresh, 2e-7)


def test_out_of_band_steps_are_circled(figure) -> None:  # noqa: ANN001
    for word, band_edge in (("chi2_token", 1.0), ("ESS of raw", 0.3)):
        ax = _panel(figure, word)
        circled = [line for line in ax.get_lines() if line.get_label() == "outside the band"]
        assert len(circled) == 1 and list(circled[0].get_xdata()) == [SPIKE]
        edges = [line.get_ydata()[0] for line in ax.get_lines() if line.get_linestyle() == "--"]
        assert edges == [band_edge]
    # k1's band |value| <= 0.1 holds at every step: nothing circled, and the band edge (far outside the data)
    # is not drawn, so it cannot squash the series into a flat line.
    ax = _panel(figure, "kl")
    assert not [line for line in ax.get_lines() if line.get_label() == "outside the band"]
    low, high = ax.get_ylim()
    assert high < 0.1 and low > -0.1


@pytest.mark.parametrize(("values", "expected"), [
    ([1e-4, 2e-4, 3e-4], ("linear", None)),
    ([1e-4, 1e-3, 45.0], ("log", None)),
    ([-1e-4, 1e-6, 0.0, -3e-3], ("symlog", 1e-6)),
    ([0.0, 0.0], ("linear", None)),
    ([1e-4, None, float("nan"), 10.0], ("log", None)),
])
def test_axis_scale(values: list[float], expected: tuple[str, float | None]) -> None:
    assert axis_scale(values) == expected


def test_png_and_absent_data() -> None:
    png = steps_plot(_report(_series()))
    assert png is not None and png[:8] == b"\x89PNG\r\n\x1a\n"
    single = _report(_series())
    single.steps = single.steps[:1]
    assert steps_figure(single) is None  # one step: no trend to draw
    unknown = _report({"diag/not_a_step_metric": list(np.ones(STEPS))})
    assert steps_figure(unknown) is None
