"""Miles's train/rollout mismatch keys (31f1ca96): slime's accumulators plus the policy loss's own Miles keys.

Miles computes the TIS hook's keys and the MIS helper's keys exactly as slime does (the same functions, the same
reducer), so both accumulators here are slime's (`trainers/slime/engine.py`), with the loss's own keys replaced by
Miles's (docs/miles-semantics.md):

* `train/train_rollout_logprob_abs_diff`: |old - rollout| with NaN and ±inf zeroed (`torch.nan_to_num`);
* `train/train_rollout_kl`: k3 = exp(d) - 1 - d per token in float32, d = old - rollout with NaN made 0 and
  ±inf ±20, clamped to [-20, 20] before exp and to [-10, 10] after, NaN zeroed;
* `train/ess_ratio`: needs the current policy's log-probs (null with a note, like `train/ois`).

Both loss keys are reduced over the kept tokens (the MIS helper's modified loss mask) with the original
denominators, as slime's abs diff is. With `use_rollout_logprobs` the loss compares the rollout log-probs with
themselves: both are 0.
"""

from __future__ import annotations

import torch

from mismatch_cli.engine.core.protocol import Accumulator, Contribution
from mismatch_cli.trainers.miles.settings import MilesMisSpec, MilesSpec
from mismatch_cli.trainers.slime.engine import ABS_DIFF, SlimeAccumulator, SlimeMisAccumulator, _row_sums

KL = "train/train_rollout_kl"
ESS = "train/ess_ratio"
ESS_NOTE = ("train/ess_ratio needs the policy's log-probs at the loss step (its weights are exp(current - old)); "
            "the dump holds the old ones only")
LOG_RATIO_CLAMP = 20.0  # math_utils.py: _LOG_RATIO_EXP_CLAMP, also what nan_to_num makes of ±inf
KL_CLAMP = 10.0  # compute_approx_kl clamps low_var_kl to [-10, 10]


class _MilesLossKeys:
    """The loss's |old - rollout| and k3 KL as Miles computes them (replacing slime's abs diff)."""

    rollout_logprobs: bool

    def _loss_keys(self, old: torch.Tensor, rollout: torch.Tensor, keep: torch.Tensor | None,
                   lengths: torch.Tensor) -> None:
        trained = rollout if self.rollout_logprobs else old  # the loss's `old_log_probs`
        diff = torch.nan_to_num((trained - rollout).abs(), nan=0.0, posinf=0.0, neginf=0.0)
        # compute_approx_kl(rollout, trained, "low_var_kl"): float32 whatever the inputs' dtype.
        log_ratio = -(rollout.float() - trained.float())
        log_ratio = torch.nan_to_num(log_ratio, nan=0.0, posinf=LOG_RATIO_CLAMP, neginf=-LOG_RATIO_CLAMP)
        log_ratio = log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        kl = (log_ratio.exp() - 1 - log_ratio).clamp(-KL_CLAMP, KL_CLAMP)
        kl = torch.nan_to_num(kl, nan=0.0, posinf=0.0, neginf=0.0)
        if keep is not None:
            diff, kl = diff * keep, kl * keep.to(kl.dtype)
        self.reduce.add(ABS_DIFF, _row_sums(diff, lengths))  # type: ignore[attr-defined]
        self.reduce.add(KL, _row_sums(kl, lengths))  # type: ignore[attr-defined]


def _with_loss_keys(part: Contribution) -> Contribution:
    """slime's keys plus Miles's: the KL is 0 for a dump without a token, ess_ratio null with its note."""
    family: dict[str, float | None] = dict(part.family)
    family.setdefault(KL, 0.0)
    family[ESS] = None
    return Contribution(family=family, notes=[*part.notes, ESS_NOTE])  # type: ignore[arg-type]


class MilesAccumulator(_MilesLossKeys, SlimeAccumulator):
    """The policy loss's keys: slime's TIS / IcePop hook keys and Miles's abs diff, k3 KL and ESS."""

    def __init__(self, spec: MilesSpec, device: torch.device) -> None:
        super().__init__(spec.hook, device)
        self.rollout_logprobs = spec.rollout_logprobs

    def compute(self) -> Contribution:
        return _with_loss_keys(super().compute())


class MilesMisAccumulator(_MilesLossKeys, SlimeMisAccumulator):
    """The MIS helper's `train/mis_*` keys (slime's), with Miles's loss keys over the tokens the helper keeps."""

    def __init__(self, spec: MilesMisSpec, device: torch.device) -> None:
        super().__init__(spec.helper, device)
        self.rollout_logprobs = spec.rollout_logprobs

    def compute(self) -> Contribution:
        return _with_loss_keys(super().compute())


def miles_accumulator(settings: MilesSpec | MilesMisSpec, device: torch.device) -> Accumulator:
    """The accumulator of the settings miles or miles-mis resolved (miles-mis with its helper off is plain Miles)."""
    return (MilesMisAccumulator if isinstance(settings, MilesMisSpec) else MilesAccumulator)(settings, device)


__all__ = ["ESS", "KL", "MilesAccumulator", "MilesMisAccumulator", "miles_accumulator"]
