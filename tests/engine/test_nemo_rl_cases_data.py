"""The NeMo-RL parity cases (tests/data/nemo_rl_parity_cases.json) mean what docs/nemo-rl-semantics.md says.

The cases were produced by NeMo-RL's own `ClippedPGLossFn` at 7ea279ab (tests/data/generators/nemo_rl_cases.py).
Here every numeric case is recomputed independently in numpy from the description in the doc (sections 3 and 4:
the per-token terms, the weights, their truncation, the reductions) and must agree with what NeMo-RL produced.
This checks the data file and the doc, not the engine.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from helpers import REFERENCE
from helpers import decode as _decode

DATA = json.loads((REFERENCE / "nemo_rl_parity_cases.json").read_text())
CASES = DATA["cases"]
NUMERIC = [c for c in CASES if "error" not in c["fp64"]]
ERRORS = [c for c in CASES if "error" in c["fp64"]]
DEFAULTS = {"reference_policy_kl_type": "k3", "use_importance_sampling_correction": False,
            "truncated_importance_sampling_type": None, "truncated_importance_sampling_ratio": None,
            "truncated_importance_sampling_ratio_min": None, "sequence_level_importance_ratios": False,
            "token_level_loss": True}
KEYS = {"token_mult_prob_error", "gen_kl_error", "policy_kl_error", "js_divergence_error",
        "sampling_importance_ratio"}
NUMPY_DTYPE = {"fp32": np.float32, "fp64": np.float64}
TOLERANCE = {"fp64": (1e-12, 1e-15), "fp32": (1e-5, 1e-7)}


def _agree(ours: float, theirs: float, rel: float, abs_: float) -> bool:
    if not math.isfinite(theirs):
        return (math.isnan(theirs) and math.isnan(ours)) or ours == theirs
    return abs(ours - theirs) <= rel * abs(theirs) + abs_


def _kl(r: np.ndarray, kind: str) -> np.ndarray:
    """Doc section 3: k1 = -r, k2 = r^2 / 2, k3 = exp(r) - 1 - r, no clamp."""
    return {"k1": lambda: -r, "k2": lambda: np.square(r) / 2, "k3": lambda: np.exp(r) - 1 - r}[kind]()


def _clean(values: np.ndarray) -> np.ndarray:
    return np.nan_to_num(values, nan=0.0, posinf=0.0, neginf=0.0)


def _reference(case: dict, label: str) -> dict:
    dtype = NUMPY_DTYPE[label]
    s = {**DEFAULTS, **case["settings"]}
    valid = np.asarray(case["response_mask"]) == 1
    old_all, rollout_all = (np.asarray(_decode(case[k]), dtype=dtype) for k in ("old_log_prob", "rollout_log_prob"))
    lengths = valid.sum(axis=1)
    rows = [(old_all[i][valid[i]], rollout_all[i][valid[i]]) for i in range(len(valid))]
    o = np.concatenate([r[0] for r in rows]) if rows else np.zeros(0, dtype)
    g = np.concatenate([r[1] for r in rows]) if rows else np.zeros(0, dtype)
    tokens, count = int(lengths.sum()), len(valid)
    with np.errstate(all="ignore"):
        d = o - g
        m = np.log(0.5 * np.exp(o) + 0.5 * np.exp(g))
        terms = {
            "token_mult_prob_error": np.exp(np.abs(g - o)),
            "gen_kl_error": _kl(d, s["reference_policy_kl_type"]),
            "policy_kl_error": _kl(g - o, s["reference_policy_kl_type"]),
            "js_divergence_error": 0.5 * (np.exp(o - m) - (o - m) - 1) + 0.5 * (np.exp(g - m) - (g - m) - 1),
        }
        metrics = {k: float(np.sum(v, dtype=np.float64)) / tokens for k, v in terms.items()}
        sequence = s["sequence_level_importance_ratios"]
        if sequence:
            w = _clean(np.exp(np.array([np.sum(r[0] - r[1], dtype=dtype) for r in rows], dtype=dtype)))
        else:
            w = _clean(np.exp(d))
        kind, upper, lower = (s["truncated_importance_sampling_type"], s["truncated_importance_sampling_ratio"],
                              s["truncated_importance_sampling_ratio_min"])
        outside = None
        if kind == "tis":
            low = 0.0 if lower is None else lower
            outside = (w > dtype(upper)) | (w < dtype(low))
            w = np.clip(w, dtype(low), dtype(upper))
        elif kind == "icepop":
            kept = (w >= dtype(lower)) & (w <= dtype(upper))
            outside, w = ~kept, np.where(kept, w, dtype(0))
        elif kind == "seq-mask-tis":
            means = np.array([np.sum(_clean(r[0] - r[1]), dtype=dtype) / dtype(max(len(r[0]), 1)) for r in rows],
                             dtype=dtype)
            geo = np.exp(means)
            kept = (geo >= dtype(lower)) & (geo <= dtype(upper))
            outside, w = ~kept, np.where(np.repeat(kept, lengths), w, dtype(0))
    metrics["sampling_importance_ratio"] = (float(np.sum(w, dtype=np.float64)) if sequence
                                            else float(np.sum(w, dtype=np.float64)) / tokens)
    if kind is not None:
        if kind == "seq-mask-tis":
            share = np.float32(outside.sum()) / np.float32(count)
        elif sequence:
            share = np.float32(np.sum(np.where(outside, lengths, 0))) / np.float32(tokens)
        else:
            share = np.float32(outside.sum()) / np.float32(tokens)
        metrics["is_oob_ratio"] = float(share)
    return metrics


def test_file_records_its_provenance_and_nemo_rl_defaults() -> None:
    assert DATA["nemo_rl_commit"] == "7ea279abfbeb698b092856d0dab61e7cf39bc909"
    assert DATA["torch_version"].startswith("2.13.0")
    names = {(s["file"], s["name"]) for s in DATA["source"]}
    assert ("nemo_rl/algorithms/loss/loss_functions.py", "ClippedPGLossFn") in names
    assert ("nemo_rl/algorithms/utils.py", "masked_mean") in names
    assert all(len(s["sha256"]) == 64 for s in DATA["source"])
    assert DATA["defaults"] == DEFAULTS
    assert len({c["name"] for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_case_structure(case: dict) -> None:
    assert set(case["settings"]) <= set(DEFAULTS)
    old, rollout, mask = (np.asarray(_decode(case[k]), dtype=float)
                          for k in ("old_log_prob", "rollout_log_prob", "response_mask"))
    assert old.ndim == 2 and old.shape == rollout.shape == mask.shape
    assert set(np.unique(mask)) <= {0.0, 1.0}
    assert np.all(np.isfinite(old[mask == 0])) and np.all(np.isfinite(rollout[mask == 0]))  # doc section 1
    for label in ("fp32", "fp64"):
        result = case[label]
        if "error" in result:
            assert set(result) == {"error", "message"}
            continue
        truncated = {**DEFAULTS, **case["settings"]}["truncated_importance_sampling_type"] is not None
        assert set(result["metrics"]) == KEYS | ({"is_oob_ratio"} if truncated else set())


@pytest.mark.parametrize("label", ["fp64", "fp32"])
@pytest.mark.parametrize("case", NUMERIC, ids=[c["name"] for c in NUMERIC])
def test_numpy_reading_of_the_doc_reproduces_nemo_rl(case: dict, label: str) -> None:
    rel, abs_ = TOLERANCE[label]
    ours = _reference(case, label)
    wrong = {k: (ours[k], v) for k, v in case[label]["metrics"].items()
             if not _agree(ours[k], float(v), rel, abs_)}
    assert not wrong


def test_sequence_level_ratio_is_the_sum_of_row_weights() -> None:
    case = next(c for c in CASES if c["name"] == "sequence_level")
    old, rollout = (np.asarray(_decode(case[k])) for k in ("old_log_prob", "rollout_log_prob"))
    mask = np.asarray(case["response_mask"])
    weights = np.exp(((old - rollout) * mask).sum(axis=1))
    assert case["fp64"]["metrics"]["sampling_importance_ratio"] == pytest.approx(weights.sum(), rel=1e-12)
    assert weights.sum() > 2 * weights.mean()  # not the mean


def test_non_finite_weights_become_zero() -> None:
    by_name = {c["name"]: c for c in CASES}
    fp32 = by_name["exp_overflow_token_defaults"]["fp32"]["metrics"]
    assert fp32["token_mult_prob_error"] == "inf"  # the error keys keep the overflow
    assert fp32["sampling_importance_ratio"] < 1.0  # the weight exp(100) = inf became 0
    nan = by_name["nan_rollout_defaults"]["fp64"]["metrics"]
    assert nan["gen_kl_error"] == "nan" and math.isfinite(nan["sampling_importance_ratio"])


@pytest.mark.parametrize("case", ERRORS, ids=[c["name"] for c in ERRORS])
def test_refused_settings(case: dict) -> None:
    assert case["fp32"] == case["fp64"]
    assert case["fp64"]["error"] in ("AssertionError", "ValueError", "ValidationError")
