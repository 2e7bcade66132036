"""The Miles parity cases (tests/data/miles_parity_cases.json) mean what docs/miles-semantics.md says.

The cases were produced by Miles's own code at 31f1ca96 (tests/data/generators/miles_cases.py). The page says
Miles computes slime's hook and MIS-helper keys as docs/slime-semantics.md describes them, so those are recomputed
by the numpy reading of that page (tests/engine/test_slime_cases_data.py); Miles's own loss keys (section 3 of
the page: the abs diff with non-finite values zeroed, the clamped k3 KL, both over the kept tokens) are recomputed
here. This checks the data file and the docs, not the engine.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from helpers import REFERENCE
from test_slime_cases_data import MIS_DEFAULTS, _decode, _mis, _reduce, _rows, _slime

DATA = json.loads((REFERENCE / "miles_parity_cases.json").read_text())
CASES = DATA["cases"]
NUMERIC = [c for c in CASES if "error" not in c["fp64"]]
ERRORS = [c for c in CASES if "error" in c["fp64"]]
NUMPY_DTYPE = {"fp32": np.float32, "fp64": np.float64}
TOLERANCE = {"fp64": (1e-9, 1e-12), "fp32": (1e-4, 1e-6)}
FLOAT32 = (2e-6, 1e-7)  # Miles's float32 flags and k3 KL, in a float64 run
NEEDS_POLICY = ("train/ois", "train/ess_ratio")
MILES_HOOKS = {"miles.backends.training_utils.loss_hub.corrections.icepop_function":
               "slime.backends.megatron_utils.loss.icepop_function",
               "miles.backends.training_utils.loss_hub.corrections.vanilla_tis_function": None}
MILES_DEFAULTS = {"use_tis": False, "tis_clip": 2.0, "tis_clip_low": 0, "custom_tis_function_path": None,
                  "get_mismatch_metrics": False, "use_rollout_logprobs": False, "calculate_per_token_loss": False}


def _keep(o: np.ndarray, r: np.ndarray, s: dict) -> np.ndarray:
    """Section 4 of docs/slime-semantics.md: the tokens the MIS helper leaves in the loss mask."""
    d = o - r
    upper = s["tis_upper_bound"]
    lower = s["tis_lower_bound"] if s["tis_lower_bound"] is not None else 1.0 / upper

    def weight(level):
        total = d if level == "token" else np.full_like(d, np.sum(d) / (1 if level == "sequence" else max(len(d), 1)))
        return np.exp(np.clip(total, -20, 20))

    keep = np.ones(len(d), dtype=bool)
    if s["tis_mode"] == "mask":
        w = weight(s["tis_level"])
        keep &= (w >= lower) & (w <= upper)
    if s["use_rs"]:
        rs = weight(s["rs_level"])
        rs_lower = s["rs_lower_bound"] if s["rs_lower_bound"] is not None else lower
        rs_upper = s["rs_upper_bound"] if s["rs_upper_bound"] is not None else upper
        keep &= (rs >= rs_lower) & (rs <= rs_upper)
        if s["rs_veto_threshold"] is not None and np.any(d < np.log(np.float32(s["rs_veto_threshold"]))):
            keep &= False
    return keep


def _loss_keys(rows, keeps, rollout_logprobs: bool, per_token: bool) -> dict:
    """Section 3 of docs/miles-semantics.md: |old − rollout| and the clamped k3 KL, over the kept tokens."""
    counts = [len(o) for o, _ in rows]
    abs_sums, kl_sums = [], []
    for (o, r), keep in zip(rows, keeps, strict=True):
        trained = r if rollout_logprobs else o
        diff = np.nan_to_num(np.abs(trained - r), nan=0.0, posinf=0.0, neginf=0.0)
        d = trained.astype(np.float32) - r.astype(np.float32)
        d = np.clip(np.nan_to_num(d, nan=0.0, posinf=20.0, neginf=-20.0), -20, 20).astype(np.float32)
        kl = np.nan_to_num(np.clip(np.exp(d) - np.float32(1) - d, -10, 10), nan=0.0, posinf=0.0, neginf=0.0)
        abs_sums.append(np.sum(diff * keep))
        kl_sums.append(np.sum(kl.astype(np.float64) * keep))
    return {"train/train_rollout_logprob_abs_diff": _reduce(abs_sums, counts, per_token),
            "train/train_rollout_kl": _reduce(kl_sums, counts, per_token)}


def _reference(case: dict, label: str) -> dict:
    rows = _rows(case, NUMPY_DTYPE[label])
    settings = case["settings"]
    per_token = settings.get("calculate_per_token_loss", False)
    logprobs = settings.get("use_rollout_logprobs", False)
    everything = [np.ones(len(o), dtype=bool) for o, _ in rows]
    with np.errstate(all="ignore"):
        if case["family"] == "miles":
            hook = {**settings}
            if "custom_tis_function_path" in hook:
                hook["custom_tis_function_path"] = MILES_HOOKS[hook["custom_tis_function_path"]]
            out = _slime(rows, hook, per_token)
            keeps = everything
        else:
            s = {**MIS_DEFAULTS, **settings}
            if not (s["use_tis"] or settings.get("get_mismatch_metrics")):
                out, keeps = {}, everything
            else:
                out = _mis(rows, settings, per_token)
                keeps = [_keep(o, r, s) for o, r in rows] if s["use_tis"] else everything
        out.update(_loss_keys(rows, keeps, logprobs, per_token))
    return out


def _agree(ours: float, theirs, rel: float, abs_: float) -> bool:
    theirs = _decode(theirs)
    if not math.isfinite(theirs):
        return (math.isnan(theirs) and math.isnan(ours)) or ours == theirs
    return abs(ours - theirs) <= rel * abs(theirs) + abs_


def test_file_records_its_provenance() -> None:
    assert DATA["miles_commit"] == "31f1ca961a94cb860cec3b2dea34ec332bfa8f76"
    assert DATA["torch_version"].startswith("2.13.0")
    functions = {(s["file"], s["function"]) for s in DATA["source"]}
    assert ("miles/backends/training_utils/loss_hub/losses.py", "policy_loss_function") in functions
    assert ("miles/backends/training_utils/loss_hub/math_utils.py", "compute_approx_kl") in functions
    assert ("examples/infra_features/train_infer_mismatch_helper/mis.py", "compute_mis_weights") in functions
    assert all(len(s["sha256"]) == 64 for s in DATA["source"])
    assert DATA["defaults"]["miles"] == MILES_DEFAULTS
    assert {k: DATA["defaults"]["miles-mis"][k] for k in MIS_DEFAULTS} == MIS_DEFAULTS
    assert len({c["name"] for c in CASES}) == len(CASES)


@pytest.mark.parametrize("label", ["fp64", "fp32"])
@pytest.mark.parametrize("case", NUMERIC, ids=[c["name"] for c in NUMERIC])
def test_numpy_reading_of_the_doc_reproduces_miles(case: dict, label: str) -> None:
    rel, abs_ = TOLERANCE[label]
    ours = _reference(case, label)
    theirs = {k: v for k, v in case[label]["metrics"].items() if k not in NEEDS_POLICY}
    assert set(ours) == set(theirs)
    float32 = FLOAT32 if label == "fp64" else (rel, abs_)
    wrong = {k: (ours[k], v) for k, v in theirs.items() if not _agree(
        ours[k], v, *(float32 if "fraction" in k or "clipfrac" in k or k == "train/train_rollout_kl" else (rel, abs_)))}
    assert not wrong


@pytest.mark.parametrize("case", ERRORS, ids=[c["name"] for c in ERRORS])
def test_refused_settings_are_recorded_with_miles_message(case: dict) -> None:
    assert case["fp32"] == case["fp64"]
    assert case["fp64"]["error"] in ("ValueError", "AssertionError")
