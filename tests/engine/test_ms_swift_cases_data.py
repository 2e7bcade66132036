"""The ms-swift 4.6.0 parity cases (tests/data/ms_swift_parity_cases.json) mean what docs/ms-swift-semantics.md says.

The cases were produced by ms-swift's own methods (tests/data/generators/ms_swift_cases.py). Here every numeric
case is recomputed independently in numpy from the description in the doc (sections 1-4: the thirteen
diagnostics, the four weight modes, ESS and clipped_frac per micro-batch, then the mean over micro-batches) and
must agree with ms-swift's numbers. This checks the data file and the doc, not `mismatch`.
"""

from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pytest
from helpers import REFERENCE
from helpers import decode as _decode

DATA = json.loads((REFERENCE / "ms_swift_parity_cases.json").read_text())
CASES = DATA["cases"]
NUMERIC = [c for c in CASES if "error" not in c["fp64"]]
DEFAULTS = {"rollout_importance_sampling_mode": None, "rollout_importance_sampling_threshold": 2.0,
            "log_rollout_offpolicy_metrics": False, "per_device_train_batch_size": 1}
NUMPY_DTYPE = {"fp32": np.float32, "fp64": np.float64}
REL, ABS = 1e-5, 1e-6  # numpy's float32 exp and summation order may differ from torch's by a few ulps


def _micro_batch(o: np.ndarray, r: np.ndarray, m: np.ndarray, mode, c: float, dtype) -> dict:
    """Section 3 of the doc, one micro-batch, in the case's dtype."""
    one = dtype(1.0)
    d = np.where(m, o - r, 0).astype(dtype)
    n = np.maximum(m.sum(1), 1).astype(dtype)
    total = dtype(max(m.sum(), 1))

    def row_mean(x):
        return np.where(m, x, 0).sum(1, dtype=dtype) / n

    def token_mean(x):
        return np.where(m, x, 0).sum(dtype=dtype) / total

    clamp = np.clip(d, -20, 20)
    m_o, m_r, m_d = row_mean(o), row_mean(r), row_mean(d)
    delta = m_r - m_o
    out = {
        "training_ppl": np.exp(-m_o).mean(), "training_log_ppl": (-m_o).mean(),
        "kl": token_mean(-d), "k3_kl": token_mean(np.clip(np.exp(clamp) - clamp - one, -10, 10)),
        "rollout_ppl": np.exp(-m_r).mean(), "rollout_log_ppl": (-m_r).mean(),
        "log_ppl_diff": delta.mean(), "log_ppl_abs_diff": np.abs(delta).mean(),
        "log_ppl_diff_max": delta.max(), "log_ppl_diff_min": delta.min(), "ppl_ratio": np.exp(delta).mean(),
        "chi2_token": token_mean(np.exp(clamp) ** 2) - one,
        "chi2_seq": (np.exp(np.clip(m_d, -20, 20)) ** 2).mean() - one,
    }
    if mode is None:
        return out
    rho = np.exp(np.clip(np.where(m, o - r, 0).astype(dtype), -20, 20))
    s = np.exp(row_mean(np.log(np.maximum(rho, dtype(1e-10)))))[:, None]
    w = {"token_truncate": np.minimum(rho, c), "token_mask": np.where(rho <= c, rho, 0),
         "sequence_truncate": np.broadcast_to(np.minimum(s, c), rho.shape),
         "sequence_mask": rho * (s <= c)}[mode].astype(dtype)
    v = np.minimum(np.maximum(w, dtype(1 / c)), dtype(c))  # torch.clamp(min, max)
    v = np.where(np.isnan(w), np.nan, v)
    mu = token_mean(v)
    out["is_weight_mean"] = token_mean(w)
    second = token_mean((v / (mu + dtype(1e-8))) ** 2)
    out["ess"] = one / second if np.isnan(second) else one / max(second, dtype(1e-10))
    if mode == "token_truncate":
        share = token_mean((rho > c).astype(np.float32))
    elif mode == "token_mask":
        share = token_mean((w == 0).astype(np.float32))
    else:
        share = (s[:, 0] > c).astype(np.float32).mean()
    out["clipped_frac"] = np.float32(share)
    return out


def _replay(case: dict, label: str) -> dict:
    settings = {**DEFAULTS, **case["settings"]}
    mode, c, size = (settings["rollout_importance_sampling_mode"], settings["rollout_importance_sampling_threshold"],
                     settings["per_device_train_batch_size"])
    if mode is None and not settings["log_rollout_offpolicy_metrics"]:
        return {}
    dtype = NUMPY_DTYPE[label]
    m = np.asarray(case["response_mask"], dtype=bool)
    o = np.where(m, np.asarray(_decode(case["old_log_prob"]), dtype=dtype), -1.0).astype(dtype)
    r = np.where(m, np.asarray(_decode(case["rollout_log_prob"]), dtype=dtype), 0.0).astype(dtype)
    per: dict[str, list] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for start in range(0, len(m), size):
            rows = slice(start, start + size)
            for key, value in _micro_batch(o[rows], r[rows], m[rows], mode, c, dtype).items():
                per.setdefault("rollout_correction/" + key, []).append(float(value))
        return {k: float(np.mean(np.asarray(v, dtype=np.float64))) for k, v in per.items()}


def _same(a: float, b: float) -> bool:
    if math.isnan(b):
        return math.isnan(a)
    if math.isinf(b):
        return a == b
    return math.isclose(a, b, rel_tol=REL, abs_tol=ABS)


@pytest.mark.parametrize("label", ["fp64", "fp32"])
@pytest.mark.parametrize("case", NUMERIC, ids=[c["name"] for c in NUMERIC])
def test_doc_formulas_reproduce_ms_swift(case: dict, label: str) -> None:
    theirs = {k: float(v) for k, v in case[label]["metrics"].items()}
    ours = _replay(case, label)
    assert set(ours) == set(theirs)
    for key, value in theirs.items():
        assert _same(ours[key], value), (key, ours[key], value)


def test_every_case_names_its_provenance() -> None:
    assert DATA["ms_swift_version"] == "4.6.0"
    assert DATA["defaults"] == DEFAULTS
    assert {"_compute_rollout_offpolicy_metrics", "_compute_is_correction_metrics"} <= set(DATA["methods"])
