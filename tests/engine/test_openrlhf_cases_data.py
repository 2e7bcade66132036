"""The OpenRLHF 0.11.2 parity cases (tests/data/openrlhf_parity_cases.json) mean what docs/openrlhf-semantics.md says.

The cases were produced by OpenRLHF's own `PolicyLoss` (tests/data/generators/openrlhf_cases.py). Here every
numeric case is recomputed independently in numpy from the description in the doc (sections 2-4: the threshold
forms, the gated statistic, mask / clip, the two keys of one micro-batch, the float32 token-weighted reduction with
drop_last and the ZeroDivisionError) and must agree with OpenRLHF's numbers. This checks the data file and the doc,
not `mismatch`.
"""

from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pytest
from helpers import REFERENCE
from helpers import decode as _decode

DATA = json.loads((REFERENCE / "openrlhf_parity_cases.json").read_text())
CASES = DATA["cases"]
NUMERIC = [c for c in CASES if "error" not in c["fp64"]]
ERRORS = [c for c in CASES if "error" in c["fp64"]]
DEFAULTS = {"is_correction_level": "off", "is_correction_mode": "mask", "is_correction_gating": "ratio",
            "is_correction_threshold": [0.5, 5.0], "policy_loss_type": "ppo", "micro_train_batch_size": 1}
NUMPY_DTYPE = {"fp32": np.float32, "fp64": np.float64}
REL, ABS = 1e-5, 1e-7  # numpy's float32 sums and exp may differ from torch's by a few ulp


def _micro_batch(o, r, m, s, low, high) -> tuple[float, float]:
    """One micro-batch's (vllm_kl, is_filter_ratio) as docs/openrlhf-semantics.md section 3 describes them."""
    dt = o.dtype
    m = m.astype(bool)
    d = o - r
    if s["is_correction_gating"] == "ratio":
        stat = d
    else:
        low_p, high_p = dt.type(1e-6), dt.type(1 - 1e-6)
        p, q = np.clip(np.exp(r), low_p, high_p), np.clip(np.exp(o), low_p, high_p)
        if s["is_correction_gating"] == "binary_kl":
            stat = p * np.log(p / q) + (1 - p) * np.log((1 - p) / (1 - q))
        else:
            stat = np.abs(p - q)
    seq = s["is_correction_level"] == "seq"
    if seq:
        stat = np.where(m, stat, 0).sum(axis=1) / m.sum(axis=1).astype(dt)
    if s["is_correction_gating"] == "ratio":
        stat = np.exp(stat)
    if s["is_correction_mode"] == "clip":
        filtered = (stat < dt.type(low)) | (stat > dt.type(high))
    else:
        filtered = ~((stat >= dt.type(low)) & (stat <= dt.type(high)))
    if seq:
        share = np.float32(filtered.sum()) / np.float32(len(filtered))
    else:
        share = np.float32((filtered & m).sum()) / np.float32(m.sum())
    kl = np.where(m, r - o, 0).astype(dt).sum(dtype=dt) / dt.type(m.sum())
    return float(kl), float(share)


def _reference(case: dict, label: str) -> dict | str:
    s = {**DEFAULTS, **case["settings"]}
    threshold = list(s["is_correction_threshold"])
    low, high = (0.0, threshold[0]) if len(threshold) == 1 else threshold
    if s["is_correction_level"] == "off" or s["policy_loss_type"] != "ppo":
        return {}
    dtype = NUMPY_DTYPE[label]
    o, r = np.asarray(_decode(case["old_log_prob"]), dtype), np.asarray(_decode(case["rollout_log_prob"]), dtype)
    m = np.asarray(case["response_mask"])
    size = s["micro_train_batch_size"]
    weighted, tokens = {"vllm_kl": 0.0, "is_filter_ratio": 0.0}, 0.0
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        for start in range(0, len(o) - size + 1, size):  # drop_last
            rows = slice(start, start + size)
            n = float(m[rows].sum())
            if n == 0:
                return "ZeroDivisionError"
            for key, v in zip(weighted, _micro_batch(o[rows], r[rows], m[rows], s, low, high), strict=True):
                reduced = float(np.float32(float(np.float32(v)) * n))  # float32 value, float32 all-reduce
                weighted[key] += reduced / n * n
            tokens += n
    if not tokens:
        return {}
    return {"train/" + k: v / tokens for k, v in weighted.items()}


def _agree(ours: float, theirs: float) -> bool:
    if not math.isfinite(theirs):
        return (math.isnan(theirs) and math.isnan(ours)) or ours == theirs
    return abs(ours - theirs) <= REL * abs(theirs) + ABS


def test_file_records_its_provenance_and_openrlhf_defaults() -> None:
    assert DATA["openrlhf_version"] == "0.11.2" and DATA["torch_version"].startswith("2.13.0")
    assert DATA["defaults"] == DEFAULTS
    assert {"PolicyLoss", "masked_mean"} <= set(DATA["functions"])
    assert all(len(f["sha256"]) == 64 for f in DATA["functions"].values())
    assert len({c["name"] for c in CASES}) == len(CASES)


@pytest.mark.parametrize("label", ["fp64", "fp32"])
@pytest.mark.parametrize("case", NUMERIC, ids=[c["name"] for c in NUMERIC])
def test_numpy_reading_of_the_doc_reproduces_openrlhf(case: dict, label: str) -> None:
    ours = _reference(case, label)
    if "raised" in case[label]:
        assert ours == "ZeroDivisionError" and case[label]["raised"].startswith("ZeroDivisionError")
        return
    theirs = {k: float(v) for k, v in case[label]["metrics"].items()}
    assert isinstance(ours, dict) and set(ours) == set(theirs)
    wrong = {k: (ours[k], v) for k, v in theirs.items() if not _agree(ours[k], v)}
    assert not wrong


def test_defaults_log_nothing_and_a_seq_share_depends_on_micro_batches() -> None:
    by_name = {c["name"]: c for c in CASES}
    assert by_name["defaults_off"]["fp64"]["metrics"] == {} and by_name["gspo_logs_nothing"]["fp64"]["metrics"] == {}
    share = {size: by_name[f"micro_batch_{size}_seq_mask_tis"]["fp64"]["metrics"]["train/is_filter_ratio"]
             for size in (2, 6)}
    assert share[2] != pytest.approx(share[6])  # rows per micro-batch, weighted by tokens
    token = {size: by_name[f"micro_batch_{size}_icepop"]["fp64"]["metrics"]["train/is_filter_ratio"] for size in (2, 6)}
    assert token[2] == pytest.approx(token[6])  # a token share is the global token mean either way


def test_mask_filters_nan_and_clip_does_not() -> None:
    by_name = {c["name"]: c for c in CASES}
    tis = float(by_name["nan_tokens_tis"]["fp64"]["metrics"]["train/is_filter_ratio"])
    icepop = float(by_name["nan_tokens_icepop"]["fp64"]["metrics"]["train/is_filter_ratio"])
    assert tis == 0.0 and icepop == pytest.approx(2 / 30)


@pytest.mark.parametrize("case", ERRORS, ids=[c["name"] for c in ERRORS])
def test_refused_settings_raise(case: dict) -> None:
    assert case["fp32"] == case["fp64"] and case["fp64"]["error"] in ("ValueError", "AssertionError")
