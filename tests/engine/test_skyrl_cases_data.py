"""The SkyRL 0.4.0 parity cases (tests/data/skyrl_parity_cases.json) mean what docs/skyrl-semantics.md says.

The cases were produced by SkyRL's own functions (tests/data/generators/skyrl_cases.py). Here every numeric case
is recomputed independently in numpy from the description in the doc (sections 1-4: safe_exp, the five steps of
one micro-batch, the float32 fractions, reduce_metrics over micro-batches) and must agree with SkyRL's numbers.
This checks the data file and the doc, not `mismatch`.
"""

from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pytest
from helpers import REFERENCE
from helpers import decode as _decode

DATA = json.loads((REFERENCE / "skyrl_parity_cases.json").read_text())
CASES = DATA["cases"]
NUMERIC = [c for c in CASES if "error" not in c["fp64"]]
ERRORS = [c for c in CASES if "error" in c["fp64"]]
DEFAULTS = {"tis_ratio_type": None, "token_tis_ratio_clip_high": 2.0, "sequence_tis_ratio_clip_high": 5.0,
            "sequence_mask_metric": None, "geo_mask_high": 1.01, "geo_mask_low": 0.99, "product_mask_high": 2.0,
            "product_mask_low": 0.5, "outlier_token_is_threshold_low": None, "outlier_token_is_threshold_high": None,
            "token_mask_is_threshold_low": None, "token_mask_is_threshold_high": None,
            "micro_train_batch_size_per_gpu": 1}
NUMPY_DTYPE = {"fp32": np.float32, "fp64": np.float64}
REL, ABS = 1e-6, 1e-7  # numpy's float32 exp may differ from torch's by an ulp


def _safe_exp(x: np.ndarray) -> np.ndarray:
    return np.exp(np.clip(x.astype(np.float32), -20.0, 20.0)).astype(x.dtype)


def _fraction(count, total) -> float:
    return float(np.float32(count) / np.float32(total))


def _micro_batch(o, r, m, s) -> dict:
    """One micro-batch as docs/skyrl-semantics.md section 3 describes it."""
    d = o - r
    w = _safe_exp(d)
    b = o.shape[0]
    wm = w * m
    out = {"is_ratio_mean": float(wm.sum() / max(m.sum(), 1.0)), "is_ratio_std": float(np.std(wm, ddof=1)),
           "is_ratio_max": float(wm.max()), "is_ratio_min": float(wm.min())}
    valid = m > 0
    low, high = s["outlier_token_is_threshold_low"], s["outlier_token_is_threshold_high"]
    if low is not None or high is not None:
        over = (w > high) & valid if high is not None else np.zeros_like(valid)
        under = (w < low) & valid if low is not None else np.zeros_like(valid)
        dropped = (over | under).any(axis=1)
        out["outlier_seq_masked_ratio"] = _fraction(dropped.sum(), b)
        out["outlier_seq_over_high_ratio"] = _fraction(over.any(axis=1).sum(), b)
        out["outlier_seq_under_low_ratio"] = _fraction(under.any(axis=1).sum(), b)
        m = m * (~dropped)[:, None]
    low, high = s["token_mask_is_threshold_low"], s["token_mask_is_threshold_high"]
    if low is not None and high is not None:
        inside = (w >= low) & (w <= high)
        out["token_mask_ratio"] = _fraction((~inside & (m > 0)).sum(), max((m > 0).sum(), 1))
        m = m * (inside | (m == 0))
    total = (d * m).sum(axis=1)
    if s["tis_ratio_type"] == "token":
        capped = (w > s["token_tis_ratio_clip_high"]) & (m > 0)
        out["tis_token_clip_high_ratio"] = _fraction(capped.sum(), max((m > 0).sum(), 1))
    elif s["tis_ratio_type"] == "sequence":
        out["tis_seq_clip_high_ratio"] = _fraction((_safe_exp(total) > s["sequence_tis_ratio_clip_high"]).sum(), b)
    metric = s["sequence_mask_metric"]
    if metric is not None:
        name = "geo" if metric == "geometric" else "product"
        value = _safe_exp(total / np.maximum(m.sum(axis=1), 1.0)) if metric == "geometric" else _safe_exp(total)
        over, under = value > s[f"{name}_mask_high"], value < s[f"{name}_mask_low"]
        out[f"{name}_sequence_mask_masked_ratio"] = _fraction((over | under).sum(), b)
        out[f"{name}_sequence_mask_over_high_ratio"] = _fraction(over.sum(), b)
        out[f"{name}_sequence_mask_under_low_ratio"] = _fraction(under.sum(), b)
    return out


def _reference(case: dict, label: str) -> dict:
    s = {**DEFAULTS, **case["settings"]}
    enabled = (s["tis_ratio_type"] is not None or s["sequence_mask_metric"] is not None
               or s["outlier_token_is_threshold_low"] is not None or s["outlier_token_is_threshold_high"] is not None
               or (s["token_mask_is_threshold_low"] is not None and s["token_mask_is_threshold_high"] is not None))
    if not enabled:
        return {}
    dtype = NUMPY_DTYPE[label]
    o, r = np.asarray(_decode(case["old_log_prob"]), dtype), np.asarray(_decode(case["rollout_log_prob"]), dtype)
    m = np.asarray(case["response_mask"], dtype)
    size = s["micro_train_batch_size_per_gpu"]
    per_mb = []
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        for start in range(0, len(o), size):
            rows = slice(start, start + size)
            per_mb.append(_micro_batch(o[rows], r[rows], m[rows], s))
    out = {}
    for key in per_mb[0]:
        values = [v[key] for v in per_mb]
        reduce = max if key.endswith("_max") else min if key.endswith("_min") else (lambda v: sum(v) / len(v))
        out["policy/loss_metrics/" + key] = reduce(values)
    return out


def _agree(ours: float, theirs: float) -> bool:
    if not math.isfinite(theirs):
        return (math.isnan(theirs) and math.isnan(ours)) or ours == theirs
    return abs(ours - theirs) <= REL * abs(theirs) + ABS


def test_file_records_its_provenance_and_skyrl_defaults() -> None:
    assert DATA["skyrl_version"] == "0.4.0" and DATA["torch_version"].startswith("2.13.0")
    assert DATA["defaults"] == DEFAULTS
    assert {"compute_off_policy_correction", "safe_exp_delta", "reduce_metrics"} <= set(DATA["functions"])
    assert all(len(f["sha256"]) == 64 for f in DATA["functions"].values())
    assert len({c["name"] for c in CASES}) == len(CASES)


@pytest.mark.parametrize("label", ["fp64", "fp32"])
@pytest.mark.parametrize("case", NUMERIC, ids=[c["name"] for c in NUMERIC])
def test_numpy_reading_of_the_doc_reproduces_skyrl(case: dict, label: str) -> None:
    ours, theirs = _reference(case, label), {k: float(v) for k, v in case[label]["metrics"].items()}
    assert set(ours) == set(theirs)
    wrong = {k: (ours[k], v) for k, v in theirs.items() if not _agree(ours[k], v)}
    assert not wrong


def test_defaults_log_nothing_and_micro_batches_change_the_mean() -> None:
    by_name = {c["name"]: c for c in CASES}
    assert by_name["defaults_off"]["fp64"]["metrics"] == {}
    one = by_name["micro_batch_16_token_tis"]["fp64"]["metrics"]["policy/loss_metrics/is_ratio_mean"]
    per_row = by_name["token_tis_default_cap"]["fp64"]["metrics"]["policy/loss_metrics/is_ratio_mean"]
    assert one != pytest.approx(per_row)  # a mean of row means is not the token mean


def test_ratios_are_clamped_float32_exponentials() -> None:
    case = next(c for c in CASES if c["name"] == "catastrophic_token_tis")
    largest = float(case["fp64"]["metrics"]["policy/loss_metrics/is_ratio_max"])
    assert largest == pytest.approx(math.exp(20.0), rel=1e-6)  # |d| = 25 and d = +inf both stop at e^20
    assert largest == float(np.float32(largest))  # a float32 value even in the float64 run


@pytest.mark.parametrize("case", ERRORS, ids=[c["name"] for c in ERRORS])
def test_refused_settings_raise_value_error(case: dict) -> None:
    assert case["fp32"] == case["fp64"] and case["fp64"]["error"] == "ValueError"
    assert case["fp64"]["message"].startswith("Unknown ")
