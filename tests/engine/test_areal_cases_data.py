"""The AReaL 1.0.4 parity cases (tests/data/areal_parity_cases.json) mean what docs/areal-semantics.md says.

The cases were produced by AReaL's own functions (tests/data/generators/areal_cases.py). Here every numeric case
is recomputed independently in numpy from the description in the doc (sections 1-4: float32 log-ratio with
non-finite values as 0, the four metrics, token and sequence filtering by mask or clamp, the kept tokens, the
global token reductions) and must agree with AReaL's numbers. This checks the data file and the doc, not
`mismatch`.
"""

from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pytest
from helpers import REFERENCE
from helpers import decode as _decode

DATA = json.loads((REFERENCE / "areal_parity_cases.json").read_text())
CASES = DATA["cases"]
NUMERIC = [c for c in CASES if "metrics" in c["fp64"]]
DEFAULTS = {"use_decoupled_loss": False, "rejection_sampling": None, "level": "token", "action": "mask",
            "metric": "ratio", "agg": "mean", "upper": 5.0, "lower": None}
NUMPY_DTYPE = {"fp32": np.float32, "fp64": np.float64}
P = "ppo_actor/update/"


def _keys(o, r, m, s) -> dict:
    """One step as docs/areal-semantics.md sections 1-4 describe it."""
    p = o if s["use_decoupled_loss"] else r
    f32 = np.float32
    raw = p.astype(f32) - r.astype(f32)
    ell = np.where(np.isfinite(raw), raw, f32(0))
    metric = {"ratio": np.exp(ell), "kl_k1": raw, "kl_k2": raw**2 / f32(2),
              "kl_k3": np.exp(-raw) - f32(1) + raw}[s["metric"]]
    w = np.exp(ell)
    upper, lower = s["upper"], s["lower"]
    if s["action"] == "clamp" and lower is None:
        lower = 0.0

    def inside(x):
        ok = x <= f32(upper) if x.dtype == f32 else x <= upper
        return ok & (x >= lower) if lower is not None else ok

    def clamp(x):
        return np.clip(x, f32(lower), f32(upper))

    valid = m > 0
    if s["level"] == "token":
        keep = inside(metric) if s["action"] == "mask" else np.ones_like(valid)
        new_w = clamp(w) if s["action"] == "clamp" else w
    else:
        n = np.maximum(valid.sum(axis=1, keepdims=True), 1).astype(f32)
        values = ell if s["metric"] == "ratio" else metric
        masked = np.where(valid, values, f32(0))
        if s["agg"] == "sum":
            agg = masked.sum(axis=1, keepdims=True, dtype=np.float64).astype(f32)
        elif s["agg"] == "mean":
            agg = masked.sum(axis=1, keepdims=True, dtype=np.float64).astype(f32) / n
        else:
            agg = np.where(valid, values, -np.inf).max(axis=1, keepdims=True)
            agg = np.where(valid.any(axis=1, keepdims=True), agg, 0).astype(f32)
        if s["metric"] == "ratio":
            agg = np.exp(agg)
            w = np.broadcast_to(np.exp(masked.sum(axis=1, keepdims=True, dtype=np.float64).astype(f32) / n), w.shape)
        row_in = np.broadcast_to(inside(agg), w.shape)
        keep = row_in if s["action"] == "mask" else np.ones_like(valid)
        new_w = np.where(row_in, w, clamp(w)) if s["action"] == "clamp" else w
    total = valid.sum()
    changed = (valid & ~keep) if s["action"] == "mask" else (valid & (new_w != w))
    kept = valid & keep & (new_w > 0)
    out = {P + "unclipped_behave_tokens": float(kept.sum()),
           P + "rs_filtered_fraction": float(f32(changed.sum() / max(total, 1)))}
    if kept.any():
        d = (p - r)[kept]
        for name, x in (("behave_imp_weight", new_w[kept].astype(np.float64)), ("behave_approx_kl", d)):
            out[f"{P}{name}/avg"] = float(x.sum() / x.size)
            for part, value in (("min", x.min()), ("max", x.max())):
                if not np.isinf(value):
                    out[f"{P}{name}/{part}"] = float(value)
    return out


@pytest.mark.parametrize("label", ["fp64", "fp32"])
@pytest.mark.parametrize("case", NUMERIC, ids=[c["name"] for c in NUMERIC])
def test_case_matches_the_doc(case: dict, label: str) -> None:
    reference = case[label]["metrics"]
    settings = {**DEFAULTS, **case["settings"]}
    if not (settings["rejection_sampling"] or set(case["settings"]) - {"use_decoupled_loss", "rejection_sampling"}):
        assert reference == {}
        return
    dtype = NUMPY_DTYPE[label]
    o = np.asarray(_decode(case["old_log_prob"]), dtype=dtype)
    r = np.asarray(_decode(case["rollout_log_prob"]), dtype=dtype)
    m = np.asarray(case["response_mask"], dtype=np.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        ours = _keys(o, r, m, settings)
    assert set(ours) == set(reference)
    for key, value in reference.items():
        value = float(value)
        if math.isnan(value):
            assert math.isnan(ours[key]), key
        elif math.isinf(value):
            assert ours[key] == value, key
        else:
            assert math.isclose(ours[key], value, rel_tol=1e-5, abs_tol=1e-7), (key, ours[key], value)


def test_the_doc_defaults_are_areals() -> None:
    assert DATA["defaults"] == DEFAULTS
