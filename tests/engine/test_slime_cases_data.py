"""The slime parity cases (tests/data/slime_parity_cases.json) mean what docs/slime-semantics.md says.

The cases were produced by slime's own code at 624b824a (tests/data/generators/slime_cases.py). Here every
numeric case is recomputed in numpy from the page alone (the reducer of section 2, the hook of section 3, the MIS
helper of section 4) and must agree with slime. This checks the data file and the doc, not the engine.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from helpers import REFERENCE
from helpers import decode as _decode

DATA = json.loads((REFERENCE / "slime_parity_cases.json").read_text())
CASES = DATA["cases"]
NUMERIC = [c for c in CASES if "error" not in c["fp64"]]
ERRORS = [c for c in CASES if "error" in c["fp64"]]
NUMPY_DTYPE = {"fp32": np.float32, "fp64": np.float64}
TOLERANCE = {"fp64": (1e-9, 1e-12), "fp32": (1e-4, 1e-6)}
MIS_DEFAULTS = {"use_tis": True, "use_rs": True, "tis_level": "token", "rs_level": "token", "tis_mode": "truncate",
                "tis_lower_bound": 0.5, "tis_upper_bound": 2.0, "rs_lower_bound": None, "rs_upper_bound": None,
                "rs_veto_threshold": 1.0e-4, "tis_batch_normalize": True}
SLIME_DEFAULTS = {"use_tis": False, "tis_clip": 2.0, "tis_clip_low": 0, "custom_tis_function_path": None,
                  "get_mismatch_metrics": False, "use_rollout_logprobs": False, "calculate_per_token_loss": False}
ICEPOP = "slime.backends.megatron_utils.loss.icepop_function"


def _rows(case: dict, dtype):
    old = np.asarray(_decode(case["old_log_prob"]), dtype)
    rollout = np.asarray(_decode(case["rollout_log_prob"]), dtype)
    mask = np.asarray(case["response_mask"]) != 0
    return [(old[i][mask[i]], rollout[i][mask[i]]) for i in range(len(mask))]


def _reduce(per_row_sums: list[float], counts: list[int], per_token: bool) -> float:
    """Section 2: per sample Σx / max(n, 1), summed, / B; per token Σx / Σ max(n, 1)."""
    denominators = [max(n, 1) for n in counts]
    if per_token:
        return float(sum(per_row_sums) / sum(denominators))
    return float(sum(s / d for s, d in zip(per_row_sums, denominators, strict=True)) / len(counts))


def _spread(values: list[float], counts: list[int]) -> list[float]:
    """A per-sample value over the sample's tokens: its row sum (0 for an empty sample)."""
    return [v * n if n else 0.0 for v, n in zip(values, counts, strict=True)]


def _slime(rows, settings, per_token) -> dict:
    s = {**SLIME_DEFAULTS, **settings}
    counts = [len(o) for o, _ in rows]
    out = {"train/train_rollout_logprob_abs_diff": [np.sum(np.abs(o - r)) for o, r in rows]}
    if s["use_tis"] or s["get_mismatch_metrics"]:
        low, high = s["tis_clip_low"], s["tis_clip"]
        tis, clipfrac, tis_abs = [], [], []
        for o, r in rows:
            rho = np.exp(o - r)
            if s["custom_tis_function_path"] == ICEPOP:
                w = np.where((rho >= low) & (rho <= high), rho, 0.0)
            else:
                w = np.minimum(np.maximum(rho, low), high) if low <= high else np.full_like(rho, high)
                w = np.where(np.isnan(rho), rho, w)
            tis.append(np.sum(rho))
            clipfrac.append(float(np.sum(w != rho)))
            tis_abs.append(np.sum(np.abs(rho - 1)))
        out.update({"train/tis": tis, "train/tis_clipfrac": clipfrac, "train/tis_abs": tis_abs})
    return {k: _reduce(v, counts, per_token) for k, v in out.items()}


def _mis(rows, settings, per_token) -> dict:
    s = {**MIS_DEFAULTS, **settings}
    counts = [len(o) for o, _ in rows]
    sums: dict[str, list[float]] = {}

    def put(key, value):
        sums.setdefault(key, []).append(value)

    upper = s["tis_upper_bound"]
    lower = s["tis_lower_bound"] if s["tis_lower_bound"] is not None else 1.0 / upper
    rs_lower = s["rs_lower_bound"] if s["rs_lower_bound"] is not None else lower
    rs_upper = s["rs_upper_bound"] if s["rs_upper_bound"] is not None else upper

    def level_ratio(d, name):
        if name == "token":
            return d
        total = np.sum(d)
        return np.full_like(d, total if name == "sequence" else total / max(len(d), 1))

    final = []
    for o, r in rows:
        n, d = len(o), o - r
        count = max(n, 1)
        mo, mr = np.sum(o) / count, np.sum(r) / count
        for key, value in (("training_log_ppl", -mo), ("training_ppl", np.exp(-mo)), ("rollout_log_ppl", -mr),
                           ("rollout_ppl", np.exp(-mr)), ("log_ppl_diff", mr - mo), ("log_ppl_abs_diff", abs(mr - mo)),
                           ("ppl_ratio", np.exp(mr - mo)),
                           ("chi2_token", np.sum(np.exp(np.clip(d, -20, 20)) ** 2) / count - 1),
                           ("chi2_seq", np.exp(2 * np.clip(np.sum(d), -20, 20)) - 1)):
            put(key, value * n if n else 0.0)
        put("kl", np.sum(r - o))
        put("k3_kl", np.sum(np.exp(d) - d - 1))
        keep = np.ones_like(d)
        if s["use_tis"]:
            log_ratio = level_ratio(d, s["tis_level"])
            w = np.exp(np.clip(log_ratio, -20, 20))
            put("tis_weight_before_bound", np.sum(w))
            mode = s["tis_mode"]
            if mode == "truncate":
                put("tis_truncate_fraction", float(np.sum(w > upper)))
                w = np.clip(w, 0, upper)
            else:
                put(f"tis_{mode}_fraction_low", float(np.sum(w < lower)))
                put(f"tis_{mode}_fraction_high", float(np.sum(w > upper)))
                if mode == "clip":
                    w = np.clip(w, lower, upper)
                else:
                    keep = keep * ((w >= lower) & (w <= upper))
            put("tis_weight_after_bound", np.sum(w))
            put("is_ratio_mean_after_tis_rs", np.sum(w))
            if s["use_rs"]:
                rs = np.exp(np.clip(level_ratio(d, s["rs_level"]), -20, 20))
                put("rs_mask_fraction_low", float(np.sum(rs < rs_lower)))
                put("rs_mask_fraction_high", float(np.sum(rs > rs_upper)))
                keep = keep * ((rs >= rs_lower) & (rs <= rs_upper))
                if s["rs_veto_threshold"] is not None:
                    catastrophic = d < np.log(np.float32(s["rs_veto_threshold"]))
                    put("rs_catastrophic_token_fraction", float(np.sum(catastrophic)))
                    put("rs_catastrophic_seq_fraction", float(n) if catastrophic.any() else 0.0)
                    keep = keep * (not catastrophic.any())
            final.append(w)
        put("abs_diff", np.sum(np.abs(d) * keep))
    out = {f"train/mis_{k}": _reduce(v, counts, per_token) for k, v in sums.items() if k != "abs_diff"}
    out["train/train_rollout_logprob_abs_diff"] = _reduce(sums["abs_diff"], counts, per_token)
    if s["use_tis"]:
        factor = 1.0
        if s["tis_batch_normalize"]:
            if s["tis_level"] == "token":
                mean = sum(np.sum(w) for w in final) / max(sum(counts), 1)
            else:
                mean = sum(np.sum(w) / max(len(w), 1) for w in final) / len(final)
            factor = mean if mean > 1e-8 else 1.0
            out["train/mis_batch_norm_factor"] = _reduce(_spread([factor] * len(final), counts), counts, per_token)
        stats = {"mean": lambda w: np.sum(w) / max(len(w), 1), "min": np.min, "max": np.max}
        for name, fn in stats.items():
            values = [fn(w / factor) if len(w) else 0.0 for w in final]
            out[f"train/mis_is_ratio_{name}_final"] = _reduce(_spread(values, counts), counts, per_token)
    return out


def _reference(case: dict, label: str) -> dict:
    dtype = NUMPY_DTYPE[label]
    rows = _rows(case, dtype)
    settings = case["settings"]
    per_token = settings.get("calculate_per_token_loss", False)
    with np.errstate(all="ignore"):
        if case["family"] == "slime":
            return _slime(rows, settings, per_token)
        s = {**MIS_DEFAULTS, **settings}
        if not (s["use_tis"] or settings.get("get_mismatch_metrics")):
            return _slime(rows, {}, per_token)
        return _mis(rows, settings, per_token)


def _agree(ours: float, theirs, rel: float, abs_: float) -> bool:
    theirs = _decode(theirs)
    if not math.isfinite(theirs):
        return (math.isnan(theirs) and math.isnan(ours)) or ours == theirs
    return abs(ours - theirs) <= rel * abs(theirs) + abs_


def test_file_records_its_provenance() -> None:
    assert DATA["slime_commit"] == "624b824a898ab0ec1fcb4d373004c7f3852bf515"
    assert DATA["torch_version"].startswith("2.13.0")
    functions = {(s["file"], s["function"]) for s in DATA["source"]}
    assert ("slime/backends/megatron_utils/loss.py", "policy_loss_function") in functions
    assert ("examples/train_infer_mismatch_helper/mis.py", "compute_mis_weights") in functions
    assert all(len(s["sha256"]) == 64 for s in DATA["source"])
    assert DATA["defaults"]["slime"] == SLIME_DEFAULTS
    assert {k: DATA["defaults"]["slime-mis"][k] for k in MIS_DEFAULTS} == MIS_DEFAULTS
    assert len({c["name"] for c in CASES}) == len(CASES)


@pytest.mark.parametrize("label", ["fp64", "fp32"])
@pytest.mark.parametrize("case", NUMERIC, ids=[c["name"] for c in NUMERIC])
def test_numpy_reading_of_the_doc_reproduces_slime(case: dict, label: str) -> None:
    rel, abs_ = TOLERANCE[label]
    ours = _reference(case, label)
    theirs = {k: v for k, v in case[label]["metrics"].items() if k != "train/ois"}
    assert set(ours) == set(theirs)
    flags = (2e-6, 1e-7) if label == "fp64" else (rel, abs_)  # slime's float32 flags
    wrong = {k: (ours[k], v) for k, v in theirs.items()
             if not _agree(ours[k], v, *(flags if "fraction" in k or "clipfrac" in k else (rel, abs_)))}
    assert not wrong


@pytest.mark.parametrize("case", ERRORS, ids=[c["name"] for c in ERRORS])
def test_refused_settings_are_recorded_with_slimes_message(case: dict) -> None:
    assert case["fp32"] == case["fp64"]
    assert case["fp64"]["error"] in ("ValueError", "AssertionError")
