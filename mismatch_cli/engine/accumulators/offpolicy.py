"""verl's 13 off-policy diagnostics (`compute_offpolicy_metrics`) as a streaming accumulator."""

from __future__ import annotations

import torch

from mismatch_cli.engine.core.chunk import Chunk
from mismatch_cli.engine.core.formulas import chi2
from mismatch_cli.engine.core.protocol import VERL_PREFIX, Accumulator, ChunkDecisions, Contribution
from mismatch_cli.engine.core.state import Reducer

OFFPOLICY_KEYS = (
    "training_ppl",
    "training_log_ppl",
    "kl",
    "k3_kl",
    "rollout_ppl",
    "rollout_log_ppl",
    "log_ppl_diff",
    "log_ppl_abs_diff",
    "log_ppl_diff_max",
    "log_ppl_diff_min",
    "ppl_ratio",
    "chi2_token",
    "chi2_seq",
)


class OffPolicyAccumulator(Accumulator):
    """Token means over valid tokens and row means over all rows (empty rows included, as verl)."""

    def __init__(self, device: torch.device, exact_mask: bool = False) -> None:
        self.state = Reducer(device)
        self.exact_mask = exact_mask  # a bool / integer mask upstream: no 1e-8 in the means

    def update(self, chunk: Chunk, decisions: ChunkDecisions) -> None:
        """Fold one chunk of whole sequences into the state."""
        s = self.state
        log_ratio = chunk.log_ratio
        s.add("tokens", float(chunk.num_tokens))
        s.add("rows", float(chunk.num_rows))
        # kl is MM(rollout - old): the k1 estimate of KL(pi_rollout || pi_train), unclamped.
        s.add("sum_neg_log_ratio", -chunk.total(log_ratio))  # rollout - old == -(old - rollout) exactly
        # k3 uses the unclamped ratio, so a huge log-ratio overflows to inf exactly as in verl.
        s.add("sum_k3", chunk.total(chunk.k3))
        s.add("sum_rho_sq", chunk.total(chunk.ratio_safe_sq))
        train_mean = chunk.row_mean(chunk.old, exact=self.exact_mask)
        rollout_mean = chunk.row_mean(chunk.rollout, exact=self.exact_mask)
        log_ppl_diff = rollout_mean - train_mean
        s.add("sum_train_ppl", torch.exp(-train_mean).sum())
        s.add("sum_train_log_ppl", (-train_mean).sum())
        s.add("sum_rollout_ppl", torch.exp(-rollout_mean).sum())
        s.add("sum_rollout_log_ppl", (-rollout_mean).sum())
        s.add("sum_log_ppl_diff", log_ppl_diff.sum())
        s.add("sum_log_ppl_abs_diff", log_ppl_diff.abs().sum())
        s.add("sum_ppl_ratio", torch.exp(log_ppl_diff).sum())
        if chunk.num_rows:
            s.max("log_ppl_diff_max", log_ppl_diff.max())
            s.min("log_ppl_diff_min", log_ppl_diff.min())
        s.add("sum_rho_sq_seq", chunk.row_ratio_safe_sq.sum())

    def merge(self, other: OffPolicyAccumulator) -> None:
        """Fold another accumulator (another shard of the same batch) into this one."""
        self.state.merge(other.state)

    def compute(self) -> Contribution:
        """verl's 13 `rollout_corr/` keys; callers guarantee at least one valid token."""
        return Contribution(family={VERL_PREFIX + k: v for k, v in self.values().items()})

    def values(self) -> dict[str, float]:
        """verl's 13 keys (unprefixed), for an older family that reports them under its own names."""
        s = self.state
        tokens = s.get("tokens")
        tokens = tokens if self.exact_mask and tokens > 0 else tokens + 1e-8  # verl's masked_mean denominator
        rows = s.get("rows")
        return {
            "training_ppl": s.get("sum_train_ppl") / rows,
            "training_log_ppl": s.get("sum_train_log_ppl") / rows,
            "kl": s.get("sum_neg_log_ratio") / tokens,
            "k3_kl": s.get("sum_k3") / tokens,
            "rollout_ppl": s.get("sum_rollout_ppl") / rows,
            "rollout_log_ppl": s.get("sum_rollout_log_ppl") / rows,
            "log_ppl_diff": s.get("sum_log_ppl_diff") / rows,
            "log_ppl_abs_diff": s.get("sum_log_ppl_abs_diff") / rows,
            "log_ppl_diff_max": s.get("log_ppl_diff_max"),
            "log_ppl_diff_min": s.get("log_ppl_diff_min"),
            "ppl_ratio": s.get("sum_ppl_ratio") / rows,
            "chi2_token": chi2(s.get("sum_rho_sq"), tokens),
            "chi2_seq": chi2(s.get("sum_rho_sq_seq"), rows),
        }
