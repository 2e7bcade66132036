"""xtuner's per-pack metrics: the mismatch block over a whole pack, and the merge over packs."""

from __future__ import annotations

import math

import numpy as np
import torch

from mismatch_cli.engine.core.chunk import Chunk
from mismatch_cli.engine.core.state import Reducer


class PackMismatchBlock:
    """xtuner's mismatch metrics, computed over the whole pack as one row (docs/legacy-semantics.md §8.5)."""

    def __init__(self, device: torch.device) -> None:
        self.state = Reducer(device)

    def update(self, chunk: Chunk) -> None:
        """Fold one chunk in."""
        s = self.state
        s.add("tokens", float(chunk.num_tokens))
        s.add("old", chunk.total(chunk.old))
        s.add("rollout", chunk.total(chunk.rollout))
        s.add("neg_log_ratio", -chunk.total(chunk.log_ratio))
        s.add("k3", chunk.total(chunk.k3))
        s.add("abs", chunk.total(chunk.abs_log_ratio))

    def merge(self, other: PackMismatchBlock) -> None:
        """Fold another shard in."""
        self.state.merge(other.state)

    def compute(self) -> dict[str, float]:
        """The 12 `mismatch_*` keys plus `valid`."""
        s = self.state
        tokens = s.get("tokens")
        if tokens == 0:  # no valid token: xtuner reports PPL 1 and zero differences
            a = b = kl = k3 = absdiff = 0.0
        else:
            a, b = s.get("old") / tokens, s.get("rollout") / tokens
            kl, k3, absdiff = s.get("neg_log_ratio") / tokens, s.get("k3") / tokens, s.get("abs") / tokens
        diff = b - a
        return {
            "valid": 1.0 if tokens > 0 else 0.0,
            "mismatch_training_ppl": math.exp(-a),
            "mismatch_training_log_ppl": -a,
            "mismatch_kl": kl,
            "mismatch_k3_kl": k3,
            "mismatch_rollout_ppl": math.exp(-b),
            "mismatch_rollout_log_ppl": -b,
            "mismatch_log_ppl_diff": diff,
            "mismatch_log_ppl_abs_diff": abs(diff),
            "mismatch_log_ppl_diff_max": diff,
            "mismatch_log_ppl_diff_min": diff,
            "mismatch_ppl_ratio": math.exp(diff),
            "mismatch_logprob_abs_diff": absdiff,
        }


def merge_xtuner_packs(packs: list[dict[str, float]], valid_only: bool) -> dict[str, float]:
    """xtuner's `merge_rollout_is_metrics` over per-pack metric maps (docs/legacy-semantics.md §8.6).

    Keys naming "max" take the max and "min" the min over the counted packs, the rest their mean;
    values go through float32 as upstream's tensors do. The head version (`valid_only`) counts valid packs only; the
    2025-12 version lets an invalid pack add 0.0 everywhere and counts every pack for the IS keys
    (which had no `valid` flag yet), so an all-masked pack's infinite ESS leaks into the mean.
    """
    valid_key = "mismatch/valid"
    out: dict[str, float] = {}
    keys = [k for k in packs[0] if k != valid_key]
    for key in keys:
        is_key = key.startswith("mismatch/rollout_is_")
        valid = [bool(p.get(valid_key, 1.0)) for p in packs]
        if valid_only or not is_key:
            counted = [p for p, ok in zip(packs, valid, strict=True) if ok]
            zero_filled = [] if valid_only else [0.0 for ok in valid if not ok]
        else:
            counted, zero_filled = list(packs), []
        count = len(counted)
        if count == 0:
            out[key] = 0.0
            continue
        values = [np.float32(math.nan if p[key] is None else p[key]) for p in counted]
        values += [np.float32(v) for v in zero_filled]
        if "max" in key:
            merged = max(values)
        elif "min" in key:
            merged = min(values)
        else:
            # Upstream sums one float32 tensor (torch's reduction order, not a running sum) and divides
            # on the host in float64: `sum.item() / count`.
            merged = torch.tensor(np.asarray(values, dtype=np.float32)).sum().item() / count
        out[key] = float(merged)
    return out
