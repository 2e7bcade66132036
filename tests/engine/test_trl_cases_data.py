"""The TRL 1.16.0 parity cases (tests/data/trl_parity_cases.json) mean what docs/trl-semantics.md says.

The cases were produced by TRL's own code (tests/data/generators/trl_cases.py). Here every numeric case is
recomputed independently in numpy from the description in the doc (log-ratio, weights by mode, the five
`sampling/*` metrics and their cross-process reductions) and must agree with what TRL produced. This checks the
data file and the doc, not `mismatch`: the `trl` family itself comes in a later step of issue 21.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from helpers import REFERENCE
from helpers import decode as _decode

DATA = json.loads((REFERENCE / "trl_parity_cases.json").read_text())
CASES = DATA["cases"]
NUMERIC = [c for c in CASES if "error" not in c["fp64"]]
ERRORS = [c for c in CASES if "error" in c["fp64"]]
FIELDS = {"vllm_importance_sampling_mode", "vllm_importance_sampling_clip_max", "vllm_importance_sampling_clip_min",
          "vllm_importance_sampling_cap"}
MODES = {"token_truncate", "token_mask", "sequence_truncate", "sequence_mask"}
KEYS = {
    "sampling/sampling_logp_difference/mean",
    "sampling/sampling_logp_difference/max",
    "sampling/importance_sampling_ratio/min",
    "sampling/importance_sampling_ratio/mean",
    "sampling/importance_sampling_ratio/max",
}
NUMPY_DTYPE = {"fp32": np.float32, "fp64": np.float64}
TOLERANCE = {"fp64": (1e-12, 1e-14), "fp32": (1e-5, 1e-6)}


def _array(value, dtype=np.float64) -> np.ndarray:
    return np.asarray(_decode(value), dtype=dtype)


def _agree(ours: np.ndarray, theirs: np.ndarray, rel: float, abs_: float) -> bool:
    ours, theirs = np.asarray(ours, dtype=np.float64), np.asarray(theirs, dtype=np.float64)
    finite = np.isfinite(theirs)
    if not np.array_equal(ours[~finite], theirs[~finite], equal_nan=True):
        return False
    return bool(np.all(np.abs(ours[finite] - theirs[finite]) <= rel * np.abs(theirs[finite]) + abs_))


def _weights(old, rollout, mask, resolved, dtype):
    """The log-ratio and the weights as the doc describes TRL's ratio block."""
    mode = resolved["vllm_importance_sampling_mode"]
    low, high = resolved["vllm_importance_sampling_clip_min"], resolved["vllm_importance_sampling_clip_max"]
    with np.errstate(invalid="ignore", over="ignore"):
        log_ratio = np.nan_to_num((old - rollout) * mask.astype(dtype), nan=0.0)  # ±inf become the dtype's extremes
        if mode.startswith("sequence"):
            log_ratio = log_ratio.sum(axis=-1, keepdims=True, dtype=dtype)
        weights = np.exp(log_ratio)
    if mode.endswith("truncate"):
        weights = np.clip(weights, low, high)
    else:
        out = (weights < (-math.inf if low is None else low)) | (weights > (math.inf if high is None else high))
        weights = np.where(out, 0.0, weights).astype(dtype)
    return log_ratio, weights


def _process_scalars(old, rollout, mask, weights, sequence_level):
    """One process's five scalars, before the gather; an empty selection gives 0.0."""
    valid = mask != 0
    with np.errstate(invalid="ignore"):
        delta = np.abs(old - rollout)[valid]
    delta = delta[~np.isnan(delta)]
    ratio = weights.reshape(-1) if sequence_level else weights[valid]

    def stat(values, fn):
        return float(fn(values.astype(np.float64))) if values.size else 0.0

    return {
        "logp_mean": stat(delta, np.mean), "logp_max": stat(delta, np.max),
        "ratio_min": stat(ratio, np.min), "ratio_mean": stat(ratio, np.mean), "ratio_max": stat(ratio, np.max),
    }


def _reference(case: dict, label: str) -> dict:
    dtype = NUMPY_DTYPE[label]
    old, rollout = _array(case["old_log_prob"], dtype), _array(case["rollout_log_prob"], dtype)
    mask = np.asarray(case["response_mask"])
    log_ratio, weights = _weights(old, rollout, mask, case["resolved"], dtype)
    sequence_level = case["resolved"]["vllm_importance_sampling_mode"].startswith("sequence")
    shards = case.get("processes") or [list(range(len(mask)))]
    per_process = [_process_scalars(old[rows], rollout[rows], mask[rows], weights[rows], sequence_level)
                   for rows in shards]

    def gathered(name):
        return np.array([p[name] for p in per_process])

    metrics = {
        "sampling/sampling_logp_difference/mean": gathered("logp_mean").mean(),
        "sampling/sampling_logp_difference/max": gathered("logp_max").max(),
        "sampling/importance_sampling_ratio/min": np.nanmin(gathered("ratio_min")),
        "sampling/importance_sampling_ratio/mean": np.nanmean(gathered("ratio_mean")),
        "sampling/importance_sampling_ratio/max": np.nanmax(gathered("ratio_max")),
    }
    return {"log_ratio": log_ratio, "weights": weights, "metrics": metrics}


def test_file_records_its_provenance_and_trl_defaults() -> None:
    assert DATA["trl_version"] == "1.16.0" and DATA["torch_version"].startswith("2.13.0")
    assert DATA["source"]["method"] == "GRPOTrainer._generate_and_score_completions"
    assert [b["role"] for b in DATA["source"]["blocks"]] == ["ratio", "metrics"]
    assert DATA["defaults"] == {"vllm_importance_sampling_correction": True,
                                "vllm_importance_sampling_mode": "sequence_mask",
                                "vllm_importance_sampling_clip_max": 3.0,
                                "vllm_importance_sampling_clip_min": None}
    assert len({c["name"] for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_case_structure(case: dict) -> None:
    assert set(case["settings"]) <= FIELDS
    old, rollout, mask = (np.asarray(_decode(case[k]), dtype=float)
                          for k in ("old_log_prob", "rollout_log_prob", "response_mask"))
    assert old.ndim == 2 and old.shape == rollout.shape == mask.shape
    assert set(np.unique(mask)) <= {0.0, 1.0}
    if "processes" in case:
        assert sorted(row for rows in case["processes"] for row in rows) == list(range(len(old)))
    for label in ("fp32", "fp64"):
        result = case[label]
        if "error" in result:
            assert set(result) == {"error", "message"}
            continue
        assert case["resolved"]["vllm_importance_sampling_mode"] in MODES
        assert set(result["metrics"]) == KEYS
        sequence_level = case["resolved"]["vllm_importance_sampling_mode"].startswith("sequence")
        expected_shape = (len(old), 1) if sequence_level else old.shape
        assert _array(result["weights"]).shape == _array(result["log_ratio"]).shape == expected_shape


@pytest.mark.parametrize("label", ["fp64", "fp32"])
@pytest.mark.parametrize("case", NUMERIC, ids=[c["name"] for c in NUMERIC])
def test_numpy_reading_of_the_doc_reproduces_trl(case: dict, label: str) -> None:
    rel, abs_ = TOLERANCE[label]
    ours, theirs = _reference(case, label), case[label]
    assert _agree(ours["log_ratio"], _array(theirs["log_ratio"]), rel, abs_)
    assert _agree(ours["weights"], _array(theirs["weights"]), rel, abs_)
    wrong = {k: (ours["metrics"][k], v) for k, v in theirs["metrics"].items()
             if not _agree(ours["metrics"][k], _decode(v), rel, abs_)}
    assert not wrong


def test_token_truncate_weights_are_capped_exponentials_on_valid_tokens() -> None:
    case = next(c for c in CASES if c["name"] == "token_truncate_default_bounds")
    old, rollout = _array(case["old_log_prob"]), _array(case["rollout_log_prob"])
    valid = np.asarray(case["response_mask"]) == 1
    weights = _array(case["fp64"]["weights"])
    assert np.allclose(weights[valid], np.minimum(np.exp(old - rollout), 3.0)[valid], rtol=1e-12)
    assert np.all(weights[~valid] == 1.0)  # padding: exp(0)


def test_sequence_ratio_is_exp_of_a_sum_without_clamp() -> None:
    case = next(c for c in CASES if c["name"] == "overflow_sequence_truncate_min_only")
    fp32, fp64 = _array(case["fp32"]["weights"])[:, 0], _array(case["fp64"]["weights"])[:, 0]
    assert fp32[0] == math.inf and fp64[0] == pytest.approx(math.exp(100.0), rel=1e-12)  # ΣΔ = 40 × 2.5
    assert fp32[1] == fp64[1] == math.inf  # ΣΔ = 800 overflows float64 too
    assert fp32[2] == fp64[2] == 1.0  # +inf and -inf tokens: max + min of the dtype = 0
    assert case["fp32"]["metrics"]["sampling/importance_sampling_ratio/mean"] == "inf"


def test_empty_rows_count_as_ratio_one_in_sequence_modes_only() -> None:
    by_name = {c["name"]: c for c in CASES}
    assert _array(by_name["empty_row_sequence_mask"]["fp64"]["weights"])[2, 0] == 1.0
    for mode in ("token_truncate", "token_mask"):
        assert set(by_name[f"all_empty_{mode}"]["fp64"]["metrics"].values()) == {0.0}
    for mode in ("sequence_truncate", "sequence_mask"):
        ratio = {k: v for k, v in by_name[f"all_empty_{mode}"]["fp64"]["metrics"].items() if "ratio" in k}
        assert set(ratio.values()) == {1.0}


def test_deprecated_cap_becomes_clip_max() -> None:
    case = next(c for c in CASES if c["name"] == "deprecated_cap")
    assert case["resolved"]["vllm_importance_sampling_clip_max"] == case["settings"]["vllm_importance_sampling_cap"]


def test_processes_reduce_by_mean_of_means() -> None:
    single = next(c for c in CASES if c["name"] == "token_truncate_default_bounds")["fp64"]["metrics"]
    split = next(c for c in CASES if c["name"] == "two_processes_token_truncate")["fp64"]["metrics"]
    key = "sampling/sampling_logp_difference/mean"
    assert split[key] != pytest.approx(single[key])
    assert split["sampling/importance_sampling_ratio/max"] == single["sampling/importance_sampling_ratio/max"]


@pytest.mark.parametrize("case", ERRORS, ids=[c["name"] for c in ERRORS])
def test_refused_settings_raise_value_error(case: dict) -> None:
    assert case["fp32"] == case["fp64"]
    assert case["fp64"]["error"] == "ValueError"
    assert "vllm_importance_sampling" in case["fp64"]["message"] or "Unknown" in case["fp64"]["message"]
