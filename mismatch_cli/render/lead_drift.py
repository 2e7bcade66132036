"""The drift block of the answers: one line per headline metric that moves over the steps (render/lead.py's
companion, for the terminal, HTML and Markdown alike)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from mismatch_cli.render.cells import format_value
from mismatch_cli.render.lead import Line

NO_DRIFT = "no metric trends, shifts or leaves its band over the steps"


def drift_lines(drift: Mapping[str, Mapping[str, Any]] | None) -> tuple[str, list[Line]] | None:
    """The drift block's title and one line per metric that moves (every one; the terminal shows the first
    few), or None without per-step drift."""
    if not drift:
        return None
    moving = [(key, entry) for key, entry in drift.items()
              if entry.get("bad_steps") or entry.get("change_point_step") is not None
              or _excludes_zero(entry.get("slope_interval"))]
    if not moving:
        return f"Drift over steps ({len(drift)} metrics)", [Line(NO_DRIFT, prose=True)]
    lines = []
    for key, entry in moving:
        low, high = entry.get("slope_interval") or (None, None)
        name = key.split("/")[-1]
        text = f"{name}: {format_value(entry['slope'])} per step [{format_value(low)}, {format_value(high)}]"
        if entry.get("first_out_of_band_step") is not None:
            bad, total = len(entry.get("bad_steps") or []), entry.get("steps")
            of = f" of {total}" if total else ""
            # one bad step is not a run "from" it on (and "1 steps" is not English)
            text += (f"; out of band at step {entry['first_out_of_band_step']} only (1{of} steps)" if bad == 1 else
                     f"; out of band from step {entry['first_out_of_band_step']} ({bad}{of} steps)")
        if entry.get("change_point_step") is not None:
            text += f"; level shift at step {entry['change_point_step']}"
        lines.append(Line(text, lead=name))
    return f"Drift over steps ({len(moving)} of {len(drift)} metrics move)", lines


def _excludes_zero(interval: Iterable[float] | None) -> bool:
    if not interval:
        return False
    low, high = list(interval)[:2]
    return low > 0 or high < 0


__all__ = ["NO_DRIFT", "drift_lines"]
