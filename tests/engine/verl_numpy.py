"""An independent float64 numpy transcription of verl 0.9.1's rollout correction, on padded [B, T].

Written from docs/verl-semantics.md, deliberately in verl's own padded shape (not our
flat streaming form), so that it checks the engine rather than mirroring it.
"""

from __future__ import annotations

import math

import numpy as np

BOUND = 20.0


def mm(values, mask, axis=None):
    """verl's masked_mean: sum(v * m) / (sum(m) + 1e-8)."""
    v = np.where(mask > 0, values, 0.0)
    return (v * mask).sum(axis=axis) / (mask.sum(axis=axis) + 1e-8)


def msum(values, mask, axis=None):
    v = np.where(mask > 0, values, 0.0)
    return (v * mask).sum(axis=axis)


def f32_mean(flags) -> float:
    """`bool_tensor.float().mean()`: a float32 result."""
    flags = np.asarray(flags)
    return float(np.float32(flags.sum()) / np.float32(flags.size))


def offpolicy(old, rollout, mask) -> dict:
    a = mm(old, mask, axis=-1)
    b = mm(rollout, mask, axis=-1)
    d = old - rollout
    diff = b - a
    s = msum(d, mask, axis=-1)
    return {
        "training_ppl": np.exp(-a).mean(),
        "training_log_ppl": (-a).mean(),
        "kl": mm(rollout - old, mask),
        "k3_kl": mm(np.exp(d) - d - 1, mask),
        "rollout_ppl": np.exp(-b).mean(),
        "rollout_log_ppl": (-b).mean(),
        "log_ppl_diff": diff.mean(),
        "log_ppl_abs_diff": np.abs(diff).mean(),
        "log_ppl_diff_max": diff.max(),
        "log_ppl_diff_min": diff.min(),
        "ppl_ratio": np.exp(diff).mean(),
        "chi2_token": mm(np.exp(np.clip(d, -BOUND, BOUND)) ** 2, mask) - 1.0,
        "chi2_seq": np.exp(2.0 * np.clip(s, -BOUND, BOUND)).mean() - 1.0,
    }


def importance(old, rollout, mask, level, upper, lower=None, normalize=False) -> dict:
    d = old - rollout
    m = mask
    valid = m > 0
    if level == "token":
        raw = np.exp(np.clip(d, -BOUND, BOUND)) * m
    else:
        s = msum(d, m, axis=-1)
        raw = np.exp(np.clip(s, -BOUND, BOUND))[:, None] * m
    if lower is None:
        w = np.minimum(raw, upper)
    else:
        w = np.where((raw >= lower) & (raw <= upper), raw, 0.0)
    lo = lower if lower is not None else 1.0 / upper
    out = {"rollout_is_mean": mm(w, m)}
    if level == "token":
        out["rollout_is_ratio_fraction_high"] = mm((raw > upper).astype(float), m)
        out["rollout_is_ratio_fraction_low"] = mm((raw < lo).astype(float), m)
        out["rollout_is_max"] = w[valid].max()
        out["rollout_is_min"] = w[valid].min()
    else:
        s = msum(d, m, axis=-1)
        out["rollout_is_max"] = math.exp(min(s.max(), BOUND))
        out["rollout_is_min"] = math.exp(s.min())
        log_u = float(np.log(np.float32(upper)))
        log_l = float(np.log(np.float32(lo)))
        out["rollout_is_ratio_fraction_high"] = f32_mean(s > log_u)
        out["rollout_is_ratio_fraction_low"] = f32_mean(s < log_l)
    c = np.clip(w, 0.0, upper)
    out["rollout_is_std"] = (
        math.sqrt(max(mm(c**2, m) - mm(c, m) ** 2, 0.0)) if m.sum() > 1 else 0.0
    )
    out["rollout_is_eff_sample_size"] = 1.0 / mm((c / (mm(c, m) + 1e-8)) ** 2, m)
    row = mm(w, m, axis=-1)
    out["rollout_is_seq_mean"] = row.mean()
    out["rollout_is_seq_std"] = row.std(ddof=1) if row.size > 1 else 0.0
    out["rollout_is_seq_max"] = row.max()
    out["rollout_is_seq_min"] = row.min()
    out["rollout_is_seq_max_deviation"] = np.abs(row - 1.0).max()
    raw_row = mm(raw, m, axis=-1)
    out["rollout_is_seq_fraction_high"] = f32_mean(raw_row > upper)
    out["rollout_is_seq_fraction_low"] = f32_mean(raw_row < lo)
    if lower is not None:
        out["rollout_is_oob_ratio"] = mm(((raw < lower) | (raw > upper)).astype(float), m)
    if normalize:
        if level == "token":
            factor = mm(w, m)
        else:
            rows_valid = (m.sum(-1) > 0).astype(float)
            factor = (row * rows_valid).sum() / max(rows_valid.sum(), 1e-8)
        out["rollout_is_batch_norm_factor"] = factor if factor > 1e-8 else 1.0
    return out


def rejection(old, rollout, mask, options: list[tuple[str, float, float | None]], k1_ratio: bool = False) -> dict:
    d = np.clip(old - rollout, -BOUND, BOUND)
    m = mask
    valid_tok = m > 0
    seq_valid = m.sum(-1) > 0
    stats = {"k1": -d, "k2": 0.5 * d**2, "k3": np.exp(d) - 1.0 - d}
    combined = np.ones_like(m)
    out = {}
    for name, upper, lower in options:
        k = name[-2:]
        is_k1 = k == "k1"
        tok = stats[k]
        if is_k1:
            lo, hi = (-math.log(upper), -math.log(lower)) if k1_ratio else (math.log(lower), math.log(upper))
        else:
            lo, hi = 0.0, upper
        if name.startswith("token"):
            seq_values = None
            per_tok = tok
        else:
            if name.startswith("seq_sum"):
                seq_values = msum(tok, m, axis=-1)
            elif name.startswith("seq_mean"):
                seq_values = mm(tok, m, axis=-1)
            else:
                seq_values = np.where(seq_valid, np.where(valid_tok, tok, -np.inf).max(-1), 0.0)
            per_tok = np.broadcast_to(seq_values[:, None], m.shape)
        keep = ((per_tok >= lo) & (per_tok <= hi)) if is_k1 else (per_tok <= hi)
        keep = keep.astype(float)
        combined = combined * keep
        sv = (seq_values if seq_values is not None else mm(tok, m, axis=-1))[seq_valid]
        p = f"rollout_rs_{name}"
        out[f"{p}_mean"] = mm(per_tok, m)
        if seq_values is not None:
            out[f"{p}_max"], out[f"{p}_min"] = sv.max(), sv.min()
            out[f"{p}_fraction_high"] = f32_mean(sv > hi)
            out[f"{p}_fraction_low"] = f32_mean(sv < lo) if is_k1 else 0.0
        else:
            out[f"{p}_max"], out[f"{p}_min"] = tok[valid_tok].max(), tok[valid_tok].min()
            out[f"{p}_fraction_high"] = mm((tok > hi).astype(float), m)
            out[f"{p}_fraction_low"] = mm((tok < lo).astype(float), m) if is_k1 else 0.0
        if m.sum() > 1:
            c = np.clip(per_tok, lo, hi)
            out[f"{p}_std"] = math.sqrt(max(mm(c**2, m) - mm(c, m) ** 2, 0.0))
        else:
            out[f"{p}_std"] = 0.0
        out[f"{p}_seq_mean"] = sv.mean()
        out[f"{p}_seq_std"] = sv.std(ddof=1) if sv.size > 1 else 0.0
        out[f"{p}_seq_max"], out[f"{p}_seq_min"] = sv.max(), sv.min()
        out[f"{p}_seq_max_deviation"] = np.abs(sv).max()
        out[f"{p}_seq_fraction_high"] = f32_mean(sv > hi)
        if is_k1:
            out[f"{p}_seq_fraction_low"] = f32_mean(sv < lo)
        out[f"{p}_masked_fraction"] = mm(1 - keep, m)
        rejected_rows = ((keep == 0) & valid_tok).any(-1)
        out[f"{p}_seq_masked_fraction"] = (rejected_rows & seq_valid).sum() / seq_valid.sum()
    out["rollout_rs_masked_fraction"] = mm(1 - combined, m)
    out["rollout_rs_seq_masked_fraction"] = f32_mean(((combined < 0.5) & valid_tok).any(-1))
    return out
