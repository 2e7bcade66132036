"""What every parity-case generator here shares: the case file's encoding of values and its layout on disk.

Imported by the generators beside it (run by hand in scratch venvs; never by CI or the tests).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np


def encode(value):
    """A tensor, array, list or number as JSON: non-finite floats become the strings "nan", "inf", "-inf"."""
    if hasattr(value, "tolist"):  # a torch tensor or a numpy array / scalar
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        return [encode(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


def f32(array) -> list:
    """Inputs exactly representable in float32, so both dtypes see the same numbers."""
    return np.asarray(array, dtype=np.float32).astype(np.float64).tolist()


def mask(lengths, width) -> list:
    """A padded 0/1 mask: row i's first lengths[i] positions are 1."""
    return [[1 if t < n else 0 for t in range(width)] for n in lengths]


def write_cases(document: dict, out: str | Path) -> None:
    """The case file, indented, with every innermost list on one line (diffs stay readable)."""
    text = json.dumps(document, indent=1, allow_nan=False)
    text = re.sub(r"\[\s+([^\[\]{}]*?)\s+\]", lambda m: "[" + re.sub(r",\s+", ", ", m[1]) + "]", text)
    Path(out).write_text(text + "\n")
