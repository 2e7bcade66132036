"""What every plot shares: the Agg backend, the palette, and PNG bytes without a timestamp."""

from __future__ import annotations

import io
from typing import Any

COLORS = {"data": "#3465a4", "second": "#e07b00", "band": "#cc0000", "catastrophic": "#5c0000", "muted": "#888888"}


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend (no display needed), its font lookups quiet."""
    import logging

    import matplotlib

    # A font cache another matplotlib wrote (without the bundled STIX fonts) makes every mathtext label log
    # "findfont: ... not found" at WARNING: a dozen stderr lines per run that the fallback font makes harmless.
    logging.getLogger("matplotlib.font_manager").setLevel(logging.ERROR)
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def png_bytes(fig: Any) -> bytes:
    """The figure as PNG bytes (tight layout, no software stamp), then closed."""
    buffer = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buffer, format="png", metadata={"Software": None}, bbox_inches="tight", pad_inches=0.15)
    pyplot().close(fig)
    return buffer.getvalue()


__all__ = ["COLORS", "png_bytes", "pyplot"]
