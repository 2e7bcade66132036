"""What every common correction would do to the same dump: a ladder of IS / RS / veto settings, one pass.

Exact counts, cheaply. Every token-level rule of the ladder (TIS, IcePop, token veto) only touches
tokens with |delta| beyond the smallest of its bounds, so each chunk picks those few candidate
tokens once (one comparison on the cached |delta|) and decides every rule on them exactly as verl
would, vectorized over the thresholds; everything else follows from chunk totals. Sequence-level
rules work on per-row sums (S_i, sum of r, r^2, k3). The state is a fixed [scenarios x 7] table.

Semantics (docs/verl-semantics.md §3, §4; docs/legacy-semantics.md §6.4): IS weights are never masks, so an IS row's
ESS is verl's `rollout_is_eff_sample_size` of the applied weights over all valid tokens; IcePop's
zeroed weights count as masked tokens. RS and veto rows report the ESS of the raw token ratios over
the tokens they keep. The token veto is verl 0.6/0.7's: a sequence is dropped when any valid token
has log-ratio < log(threshold).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from mismatch_cli.correction import SAFETY_BOUND, RsOption
from mismatch_cli.engine.chunk import Chunk
from mismatch_cli.engine.diagnostics import scratch
from mismatch_cli.engine.ops import total
from mismatch_cli.engine.protocol import Accumulator, ChunkDecisions, Contribution
from mismatch_cli.engine.rejection import OptionBounds, token_statistic
from mismatch_cli.engine.state import F64


@dataclass(frozen=True)
class Scenario:
    """One what-if setting: its family, level, threshold (verl's syntax) and the flags that apply it."""

    name: str
    family: str  # none | tis | icepop | rs | veto
    level: str  # token | sequence
    threshold: str | None = None
    option: str | None = None  # RS option name

    @property
    def flags(self) -> str:
        """The `mismatch analyze` flags (verl config fields) that run this setting for real."""
        if self.family in ("tis", "icepop"):
            return f"--is {self.level} --is-threshold {self.threshold}"
        if self.family == "rs":
            return f"--rs {self.option} --rs-threshold {self.threshold}"
        if self.family == "veto":
            return f"rollout_token_veto_threshold={self.threshold} (verl 0.6/0.7)"
        return ""


def _ladder() -> tuple[Scenario, ...]:
    out = [Scenario("no correction", "none", "token")]
    for level in ("token", "sequence"):
        out += [Scenario(f"TIS {level} {u}", "tis", level, u) for u in ("1.5", "2.0", "5.0", "10.0")]
    for level in ("token", "sequence"):
        out += [Scenario(f"IcePop {level} {b}", "icepop", level, b) for b in ("0.5_2.0", "0.5_5.0")]
    out += [Scenario(f"geo-RS {b}", "rs", "sequence", b, "seq_mean_k1") for b in ("0.999_1.001", "0.99_1.01")]
    out += [Scenario("seq-sum-k1 RS 0.5_2.0", "rs", "sequence", "0.5_2.0", "seq_sum_k1")]
    out += [Scenario(f"k3-RS {u}", "rs", "sequence", u, "seq_mean_k3") for u in ("0.001", "0.01", "0.1")]
    out += [Scenario(f"token veto {v}", "veto", "token", v) for v in ("1e-4", "1e-3")]
    return tuple(out)


LADDER = _ladder()
COLUMNS = ("truncated_tokens", "masked_tokens", "masked_rows", "sum_w", "sum_w_sq", "weight_tokens",
           "sum_log_ratio")  # the last: Σ log-ratio over the tokens the setting keeps in the mask (its kl)
_T, _M, _R, _W, _W2, _N, _S = range(len(COLUMNS))
CANDIDATE_MARGIN = 1e-3  # candidates start 0.1 % inside the smallest bound, far beyond float rounding


def _bounds(threshold: str) -> tuple[float, float]:
    lower, upper = threshold.split("_")
    return float(lower), float(upper)


def row_sums(values: torch.Tensor, lengths: torch.Tensor) -> np.ndarray:
    """Per-row float64 sums of a token quantity (0 for an empty row), without a float64 copy on the CPU."""
    if values.device.type != "cpu":
        return torch.segment_reduce(values.to(F64), "sum", lengths=lengths, unsafe=True).cpu().numpy()
    counts = lengths.numpy()
    out = np.zeros(counts.size, dtype=np.float64)
    nonempty = counts > 0
    if nonempty.any():
        starts = np.concatenate(([0], np.cumsum(counts[:-1])))[nonempty]
        out[nonempty] = np.add.reduceat(values.numpy(), starts, dtype=np.float64)
    return out


def _float32_log(value: float) -> float:
    # verl-0.6/0.7 compute log(veto) as a float32 scalar tensor (docs/legacy-semantics.md §2).
    return float(torch.log(torch.tensor(value, dtype=torch.float32)).item())


class WhatIfAccumulator(Accumulator):
    """Truncated / masked token and sequence counts and weight sums for every ladder setting."""

    def __init__(self, k1_bounds: str, device: torch.device, scenarios: tuple[Scenario, ...] = LADDER) -> None:
        self.scenarios = scenarios
        self.device = device
        self.table = np.zeros((len(scenarios), len(COLUMNS)))
        self.tokens = 0
        self.valid_rows = 0
        self.index = {family: [i for i, s in enumerate(scenarios) if s.family == family]
                      for family in ("none", "tis", "icepop", "rs", "veto")}
        self.tis_token = [i for i in self.index["tis"] if scenarios[i].level == "token"]
        self.tis_seq = [i for i in self.index["tis"] if scenarios[i].level == "sequence"]
        self.icepop_token = [i for i in self.index["icepop"] if scenarios[i].level == "token"]
        self.icepop_seq = [i for i in self.index["icepop"] if scenarios[i].level == "sequence"]
        self.rs_bounds = {}
        for i in self.index["rs"]:
            s = scenarios[i]
            lower, upper = _bounds(s.threshold) if "_" in str(s.threshold) else (None, float(s.threshold))
            self.rs_bounds[i] = OptionBounds(RsOption(str(s.option), upper, lower), k1_bounds)
        self.icepop_token_bands = [_bounds(str(scenarios[i].threshold)) for i in self.icepop_token]
        self.veto_logs = [_float32_log(float(scenarios[i].threshold)) for i in self.index["veto"]]
        boundaries = [math.log(float(scenarios[i].threshold)) for i in self.tis_token]
        boundaries += [math.log(b) for i in self.icepop_token for b in _bounds(str(scenarios[i].threshold))]
        boundaries += self.veto_logs
        self.candidate_bound = min((abs(b) for b in boundaries), default=SAFETY_BOUND) * (1 - CANDIDATE_MARGIN)

    def update(self, chunk: Chunk, decisions: ChunkDecisions) -> None:
        """Fold one chunk of whole sequences into every setting's counts and sums."""
        valid = chunk.row_valid.cpu().numpy()
        self.tokens += chunk.num_tokens
        self.valid_rows += int(valid.sum())
        if chunk.num_tokens == 0:
            return
        table = np.zeros_like(self.table)
        tokens = float(chunk.num_tokens)
        lengths = chunk.lengths.cpu().numpy()
        row_tokens = lengths.astype(np.float64)
        row_r, row_r_sq = row_sums(chunk.ratio_safe, chunk.lengths), row_sums(chunk.ratio_safe_sq, chunk.lengths)

        # Candidate tokens: the only ones any token-level rule can act on.
        n, device = chunk.num_tokens, chunk.old.device
        is_candidate = torch.gt(chunk.abs_log_ratio, self.candidate_bound, out=scratch("flag", n, torch.bool, device))
        if device.type == "cpu":
            candidates = torch.from_numpy(np.flatnonzero(is_candidate.numpy()))  # faster than torch.nonzero
        else:
            candidates = torch.nonzero(is_candidate).flatten()
        log_ratio_c = chunk.log_ratio[candidates].cpu().numpy()
        ratio_c = chunk.ratio_safe[candidates].cpu().numpy()
        ratio_c64 = ratio_c.astype(np.float64)[:, None]
        ratio_sq_c = chunk.ratio_safe_sq[candidates].cpu().numpy().astype(np.float64)  # the squares row_r_sq holds
        row_c = np.searchsorted(np.cumsum(lengths), candidates.cpu().numpy(), side="right")
        # Weight sums of the other tokens: total - candidates (the same float values on both sides), unless a
        # huge candidate weight (up to e^20) would swamp the small ones' squares; then they are summed directly.
        rest_r, rest_r_sq = float(row_r.sum() - ratio_c64.sum()), float(row_r_sq.sum() - ratio_sq_c.sum())
        if ratio_sq_c.sum() > 1e4 * tokens:
            rest = scratch("x", n, chunk.old.dtype, device).copy_(chunk.ratio_safe).masked_fill_(is_candidate, 0.0)
            rest_r = float(total(rest))
            rest_r_sq = float(total(rest.square_()))  # in float64: a float32 sum would depend on the chunking

        def rows_hit(flags: np.ndarray) -> np.ndarray:
            """[B, J] bool: the row holds at least one flagged candidate, per setting."""
            return np.stack([np.bincount(row_c[f], minlength=lengths.size) > 0 for f in flags.T], axis=1)

        for i in self.index["none"]:
            table[i, [_W, _W2, _N]] = row_r.sum(), row_r_sq.sum(), tokens
        if self.tis_token:
            upper = np.array([float(self.scenarios[i].threshold) for i in self.tis_token])
            # verl truncates with raw.clamp(max=U): a float32 weight above a float32 U.
            over = ratio_c[:, None] > upper.astype(ratio_c.dtype)[None, :]
            weight = np.minimum(ratio_c64, upper[None, :])
            rows = self.tis_token
            table[rows, _T] = over.sum(axis=0)
            table[rows, _W] = rest_r + weight.sum(axis=0)
            table[rows, _W2] = rest_r_sq + (weight**2).sum(axis=0)
            table[rows, _N] = tokens
        if self.icepop_token:
            lower, upper = (np.array(b, dtype=ratio_c.dtype) for b in zip(*self.icepop_token_bands, strict=True))
            zeroed = ~((ratio_c[:, None] >= lower) & (ratio_c[:, None] <= upper))
            weight = np.where(zeroed, 0.0, ratio_c64)
            rows = self.icepop_token
            table[rows, _M] = zeroed.sum(axis=0)
            table[rows, _R] = rows_hit(zeroed).sum(axis=0)
            table[rows, _W] = rest_r + weight.sum(axis=0)
            table[rows, _W2] = rest_r_sq + (weight**2).sum(axis=0)
            table[rows, _N] = tokens

        log_sum = chunk.log_ratio_row_sum.cpu().numpy()
        raw_row = np.exp(np.clip(log_sum, -SAFETY_BOUND, SAFETY_BOUND))
        table[:, _S] = log_sum.sum()  # IS never changes the mask; RS and veto rows override it below
        for i in self.tis_seq:
            upper = float(self.scenarios[i].threshold)
            weight = np.minimum(raw_row, upper)
            table[i, [_T, _W, _W2, _N]] = (row_tokens[raw_row > upper].sum(), row_tokens @ weight,
                                            row_tokens @ weight**2, tokens)
        for i in self.icepop_seq:
            lower, upper = _bounds(str(self.scenarios[i].threshold))
            kept = (raw_row >= lower) & (raw_row <= upper)
            weight = np.where(kept, raw_row, 0.0)
            table[i, [_M, _R, _W, _W2, _N]] = (row_tokens[~kept].sum(), (~kept & valid).sum(), row_tokens @ weight,
                                                row_tokens @ weight**2, tokens)

        def drop_rows(i: int, rejected: np.ndarray) -> None:
            # Sums over the kept rows themselves: "total - dropped" would cancel when nearly all are dropped.
            kept = ~rejected
            masked = row_tokens[rejected].sum()
            table[i, [_M, _R, _W, _W2, _N, _S]] = (masked, rejected.sum(), row_r[kept].sum(), row_r_sq[kept].sum(),
                                                    tokens - masked, log_sum[kept].sum())

        if self.index["rs"]:
            if bool((np.abs(log_ratio_c) > SAFETY_BOUND).any()):
                # Some token is clamped at +-20: recompute the clamped statistics as verl does.
                safe_sum = row_sums(chunk.log_ratio_safe, chunk.lengths)
                k3_sum = row_sums(token_statistic(chunk, "k3"), chunk.lengths)
            else:
                # Nothing clamped: sum_t (r - 1 - l) = sum_t r - n - S_i, summed in float64 (no token pass).
                safe_sum, k3_sum = log_sum, row_r - row_tokens - log_sum
            denominator = row_tokens + 1e-8  # verl's masked_mean
            statistics = {"seq_mean_k1": -safe_sum / denominator, "seq_sum_k1": -safe_sum,
                          "seq_mean_k3": k3_sum / denominator}
            for i in self.index["rs"]:
                bounds = self.rs_bounds[i]
                stat = statistics[str(self.scenarios[i].option)]
                keep = (stat >= bounds.low) & (stat <= bounds.high) if bounds.option.is_k1 else stat <= bounds.high
                drop_rows(i, ~keep & valid)
        if self.index["veto"]:
            catastrophic = log_ratio_c[:, None] < np.array(self.veto_logs, dtype=log_ratio_c.dtype)[None, :]
            vetoed = rows_hit(catastrophic) & valid[:, None]
            for j, i in enumerate(self.index["veto"]):
                drop_rows(i, vetoed[:, j])
        self.table += table

    def merge(self, other: WhatIfAccumulator) -> None:
        """Fold another shard's table in."""
        self.table += other.table
        self.tokens += other.tokens
        self.valid_rows += other.valid_rows

    def compute(self) -> Contribution:
        """The what-if table, one row per setting: truncated / masked fractions, masked sequences, mean weight, ESS."""
        tokens, valid_rows = self.tokens, self.valid_rows
        out: list[dict[str, object]] = []
        for scenario, row in zip(self.scenarios, self.table.tolist(), strict=True):
            is_weight = scenario.family in ("tis", "icepop")
            weight_tokens = row[_N]
            mean = row[_W] / (weight_tokens + 1e-8)
            mean_sq = row[_W2] / (weight_tokens + 1e-8)
            out.append({
                "name": scenario.name,
                "family": scenario.family,
                "level": scenario.level,
                "option": scenario.option,
                "threshold": scenario.threshold,
                "flags": scenario.flags,
                "truncated_token_fraction": row[_T] / tokens if scenario.family == "tis" and tokens else None,
                "masked_token_fraction": row[_M] / tokens if tokens else None,
                "masked_seq_fraction": row[_R] / valid_rows if valid_rows else None,
                "is_weight_mean": mean if is_weight and tokens else None,
                # verl's ESS, 1 / MM((w / (MM(w) + 1e-8))^2), of the weights the setting leaves.
                "ess": (mean + 1e-8) ** 2 / mean_sq if mean_sq > 0 else None,
                # verl's k1 `kl` (rollout − old, token mean) over the tokens the setting leaves in the mask.
                "kl": -row[_S] / (weight_tokens + 1e-8) if weight_tokens else None,
            })
        return Contribution(what_if=out)


__all__ = ["COLUMNS", "LADDER", "Scenario", "WhatIfAccumulator"]
