"""The prime-rl parity cases (tests/data/prime_rl_parity_cases.json) mean what docs/prime-rl-semantics.md says.

The cases were produced by prime-rl's own functions at commit 559b447 (tests/data/generators/prime_rl_cases.py).
Here every numeric case is recomputed independently in numpy from the doc (mismatch_kl, the trust-region masks,
the per-sample means, the step statistics and the logged subset) and must agree with what prime-rl produced. This
checks the data file and the doc, not `mismatch`.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from helpers import REFERENCE
from helpers import decode as _decode

DATA = json.loads((REFERENCE / "prime_rl_parity_cases.json").read_text())
CASES = DATA["cases"]
NUMERIC = [c for c in CASES if "error" not in c["fp64"]]
ERRORS = [c for c in CASES if "error" in c["fp64"]]
NUMPY_DTYPE = {"fp32": np.float32, "fp64": np.float64}
TOLERANCE = {"fp64": (1e-12, 1e-15), "fp32": (1e-5, 1e-9)}  # numpy sums float32 in its own order
SHARES = ("is_masked", "is_masked_low", "is_masked_high", "masked_advantage_positive", "masked_advantage_negative")


def _array(value, dtype) -> np.ndarray:
    return np.asarray(_decode(value), dtype=dtype)


def _sample_values(t, i, a, m, settings, dtype) -> dict[str, float]:
    """Doc §3 and §4: one sample's values (mean over a selection, 0 when it is empty)."""
    with np.errstate(over="ignore", invalid="ignore"):
        d = t - i
        kl = np.exp(d) - d - 1
        dp = np.exp(t) - np.exp(i)
    kind = settings.get("type", "default")
    if kind == "ipo":
        masked = np.abs(dp) > dtype(settings.get("ipo_threshold", 0.1))
    else:
        high = dp > dtype(settings.get("dppo_mask_high", 0.2))
        low = dp < -dtype(settings.get("dppo_mask_low", 0.2))
        masked = np.where(a > 0, high, low)
    dropped, kept = m & masked, m & ~masked

    def mean(values, selection):
        return float(values[selection].sum(dtype=dtype)) / max(int(selection.sum()), 1)

    def share(selection, among):
        return float(np.float32(np.float32(np.count_nonzero(selection & among)) / np.float32(max(among.sum(), 1))))

    out = {"masked_mismatch_kl": mean(kl, dropped), "unmasked_mismatch_kl": mean(kl, kept),
           "is_masked": share(masked, m)}
    if kind != "ipo":
        out.update(is_masked_low=share((a < 0) & low, m), is_masked_high=share((a > 0) & high, m),
                   masked_advantage_positive=share(a > 0, dropped), masked_advantage_negative=share(a < 0, dropped))
    return out


def _expected(case: dict, label: str) -> dict[str, float]:
    dtype = NUMPY_DTYPE[label]
    t, i = _array(case["old_log_prob"], dtype), _array(case["rollout_log_prob"], dtype)
    a, m = _array(case["advantages"], dtype), np.asarray(case["response_mask"]) != 0
    samples = [_sample_values(t[r], i[r], a[r], m[r], case["settings"], dtype) for r in range(len(m))]
    out: dict[str, float] = {}
    for key in samples[0]:
        values = np.asarray([s[key] for s in samples], dtype=np.float64)
        mean = float(values.mean())
        out[f"{key}/mean"] = float(np.float32(mean)) if key in SHARES else mean
        out[f"{key}/max"] = float(values.max())
    with np.errstate(over="ignore", invalid="ignore"):
        kl = (np.exp(t - i) - (t - i) - 1)[m].astype(np.float64)
        out["mismatch_kl/all/mean"] = float(kl.mean()) if kl.size else math.nan
        out["mismatch_kl/all/max"] = float(kl.max()) if kl.size else math.nan
        out["mismatch_kl/all/std"] = float(kl.std(ddof=1)) if kl.size > 1 else math.nan
    return out


@pytest.mark.parametrize("label", ["fp64", "fp32"])
@pytest.mark.parametrize("case", NUMERIC, ids=[c["name"] for c in NUMERIC])
def test_case_matches_the_doc(case: dict, label: str) -> None:
    theirs = {k: float(v) for k, v in case[label]["metrics"].items()}
    ours = _expected(case, label)
    assert set(ours) == set(theirs)
    rel, abs_ = TOLERANCE[label]
    for key, value in theirs.items():
        if not math.isfinite(value):
            assert ours[key] == value or (math.isnan(value) and math.isnan(ours[key])), (key, ours[key], value)
            continue
        tolerance = TOLERANCE["fp32"] if key.split("/")[0] in SHARES else (rel, abs_)
        assert abs(ours[key] - value) <= tolerance[0] * abs(value) + tolerance[1], (key, ours[key], value)


def test_defaults_are_the_docs() -> None:
    assert DATA["defaults"]["default"] == {"type": "default", "dppo_mask_low": 0.2, "dppo_mask_high": 0.2,
                                           "adv_tau": 1.0, "kl_tau": 0.001}
    assert DATA["defaults"]["ipo"] == {"type": "ipo", "ipo_threshold": 0.1, "adv_tau": 1.0, "kl_tau": 0.001}


@pytest.mark.parametrize("case", ERRORS, ids=[c["name"] for c in ERRORS])
def test_refusals_are_the_docs(case: dict) -> None:
    message = case["fp64"]["message"]
    assert any(words in message for words in ("Input should be greater than or equal to 0",
                                              "Extra inputs are not permitted", "does not match any of the "
                                              "expected tags", "Input should be a valid number"))
