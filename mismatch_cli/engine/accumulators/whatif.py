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
from mismatch_cli.engine.accumulators.rejection import OptionBounds, token_statistic
from mismatch_cli.engine.core.chunk import Chunk
from mismatch_cli.engine.core.formulas import ess
from mismatch_cli.engine.core.protocol import Accumulator, ChunkDecisions, Contribution
from mismatch_cli.engine.core.state import F64
from mismatch_cli.engine.kernels import sweep
from mismatch_cli.engine.kernels.ops import numpy_kernels, scratch, total


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


def _float32_log(value: float) -> float:
    # verl-0.6/0.7 compute log(veto) as a float32 scalar tensor (docs/legacy-semantics.md §2).
    return float(torch.log(torch.tensor(value, dtype=torch.float32)).item())


def _rest_weights(chunk: Chunk, is_candidate: torch.Tensor, by_difference_r: torch.Tensor,
                  by_difference_r_sq: torch.Tensor, huge: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Float64 sums of the non-candidate tokens' safe ratios and their squares: total - candidates (the same float
    values on both sides), unless a huge candidate weight (up to e^20) would swamp the small ones' squares; then
    they are summed directly (on a device both ways, then picked, without a host round trip)."""
    device = chunk.old.device

    def direct() -> tuple[torch.Tensor, torch.Tensor]:
        rest = scratch("x", chunk.num_tokens, chunk.old.dtype, device).copy_(chunk.ratio_safe)
        rest.masked_fill_(is_candidate, 0.0)
        # In float64: a float32 sum would depend on the chunking.
        return total(rest).to(device), total(rest.square_()).to(device)

    if numpy_kernels(device):
        return direct() if bool(huge) else (by_difference_r, by_difference_r_sq)
    direct_r, direct_r_sq = direct()
    return torch.where(huge, direct_r, by_difference_r), torch.where(huge, direct_r_sq, by_difference_r_sq)


class WhatIfAccumulator(Accumulator):
    """Truncated / masked token and sequence counts and weight sums for every ladder setting."""

    def __init__(self, k1_bounds: str, device: torch.device, scenarios: tuple[Scenario, ...] = LADDER) -> None:
        self.scenarios = scenarios
        self.device = device
        self.table = torch.zeros((len(scenarios), len(COLUMNS)), dtype=F64, device=device)
        self.host_table = np.zeros((len(scenarios), len(COLUMNS)))  # the cells the host knows (token counts)
        self.tokens = 0
        self.valid_rows: torch.Tensor | int = 0  # a device count until compute()
        self.cell_index: dict[tuple[int, ...], torch.Tensor] = {}
        self.constants: dict[tuple[str, torch.dtype], torch.Tensor] = {}
        self.index = {family: [i for i, s in enumerate(scenarios) if s.family == family]
                      for family in ("none", "tis", "icepop", "rs", "veto")}
        # IS never changes the mask (IcePop zeroes weights, it does not mask): these settings keep every token.
        self.keeps_all = [i for i, s in enumerate(scenarios) if s.family not in ("rs", "veto")]
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
        """Fold one chunk of whole sequences into every setting's counts and sums, on the chunk's device."""
        valid = chunk.row_valid
        self.tokens += chunk.num_tokens
        self.valid_rows = self.valid_rows + valid.sum()
        if chunk.num_tokens == 0:
            return
        device, n, rows = chunk.old.device, chunk.num_tokens, chunk.num_rows
        tokens = float(n)
        row_tokens = chunk.row_tokens
        row_r, row_r_sq = chunk.row_sum(chunk.ratio_safe), chunk.row_sum(chunk.ratio_safe_sq)

        cells: list[torch.Tensor] = []  # this chunk's additions, one flat table cell per element
        cell_index: list[int] = []

        def put_block(settings: list[int], columns: list[int], block: torch.Tensor) -> None:
            """Add a float64 [settings, columns] block (one row may stand for every setting) to those cells."""
            cells.append(block.expand(len(settings), len(columns)).reshape(-1))
            cell_index.extend(r * len(COLUMNS) + column for r in settings for column in columns)

        # Candidate tokens: the only ones a token-level rule can act on. On the CPU they are picked out; on a
        # device every token stays, the others weighted 0 (a padded gather costs as much as the tokens, and
        # the padding's scatter into one row serialized on a GPU's atomics).
        on_host = numpy_kernels(device)
        one_pass = on_host and sweep.wanted(chunk.abs_log_ratio, chunk.fused)
        is_candidate: torch.Tensor | None = None
        rest: tuple[torch.Tensor, torch.Tensor] | None = None
        if one_pass:
            # The candidates and the others' weight sums in one pass (kernels/sweep.py), summed directly: the more
            # exact of _rest_weights' two ways, so the fused and numpy paths may differ by the difference's error.
            index, *others = sweep.candidates(chunk.abs_log_ratio, chunk.ratio_safe, self.candidate_bound)
            rest = (others[0], others[1])
        else:
            is_candidate = torch.gt(chunk.abs_log_ratio, self.candidate_bound,
                                    out=scratch("flag", n, torch.bool, device))
            index = torch.from_numpy(np.flatnonzero(is_candidate.numpy())) if on_host else None
        if on_host:
            log_ratio_c, ratio_c, ratio_sq_c = (chunk.log_ratio[index], chunk.ratio_safe[index],
                                                chunk.ratio_safe_sq[index].to(F64))
            real = torch.ones_like(index, dtype=torch.bool)
            row_c = torch.searchsorted(torch.cumsum(chunk.lengths, 0), index, right=True)
        else:
            assert is_candidate is not None
            log_ratio_c, ratio_c, real = chunk.log_ratio, chunk.ratio_safe, is_candidate
            ratio_sq_c = chunk.ratio_safe_sq.to(F64) * real
        real64 = real.to(F64)
        ratio_c64 = (ratio_c.to(F64) * real64)[:, None]
        if rest is None:
            assert is_candidate is not None
            rest = _rest_weights(chunk, is_candidate, row_r.sum() - ratio_c64.sum(), row_r_sq.sum() - ratio_sq_c.sum(),
                                 ratio_sq_c.sum() > 1e4 * tokens)
        rest_r, rest_r_sq = rest

        def rows_hit(flags: torch.Tensor) -> torch.Tensor:
            """[B, J] bool: the row holds at least one flagged candidate, per setting (the CPU's candidates)."""
            hits = torch.zeros((rows, flags.shape[1]), dtype=torch.int64, device=device)
            return hits.index_add_(0, row_c, flags.to(torch.int64)) > 0

        def extreme(values: torch.Tensor, how: str) -> torch.Tensor:
            """[B, 1] each row's smallest or largest value (+-inf for an empty row, which nothing hits)."""
            initial = math.inf if how == "min" else -math.inf
            return torch.segment_reduce(values, how, lengths=chunk.lengths, unsafe=True, initial=initial)[:, None]

        # The tokens the IS settings weigh (all of them) are known on the host: no device op.
        self.host_table[self.keeps_all, _N] += tokens
        none = self.index["none"]
        if none:
            put_block(none, [_W, _W2], torch.stack([row_r.sum(), row_r_sq.sum()])[None, :])
        if self.tis_token:
            upper = self._constant("tis", [float(self.scenarios[i].threshold) for i in self.tis_token], F64, device)
            # verl truncates with raw.clamp(max=U): a float32 weight above a float32 U.
            upper_c = self._constant("tis", [float(self.scenarios[i].threshold) for i in self.tis_token],
                                     ratio_c.dtype, device)
            over = (ratio_c[:, None] > upper_c[None, :]) & real[:, None]
            weight = torch.minimum(ratio_c64, upper[None, :]) * real64[:, None]
            put_block(self.tis_token, [_T, _W, _W2], torch.stack(
                [over.sum(0).to(F64), rest_r + weight.sum(0), rest_r_sq + (weight**2).sum(0)], dim=1))
        if self.icepop_token:
            lower, upper = (self._constant(f"icepop{j}", list(b), ratio_c.dtype, device)
                            for j, b in enumerate(zip(*self.icepop_token_bands, strict=True)))
            zeroed = ~((ratio_c[:, None] >= lower) & (ratio_c[:, None] <= upper)) & real[:, None]
            weight = torch.where(zeroed, 0.0, ratio_c64)
            # Valid tokens are finite, so a row holds a zeroed one iff its smallest or largest ratio is outside.
            hit = rows_hit(zeroed) if on_host else (extreme(ratio_c, "min") < lower) | (extreme(ratio_c, "max") > upper)
            put_block(self.icepop_token, [_M, _R, _W, _W2], torch.stack(
                [zeroed.sum(0).to(F64), hit.sum(0).to(F64), rest_r + weight.sum(0), rest_r_sq + (weight**2).sum(0)],
                dim=1))

        log_sum = chunk.log_ratio_row_sum
        raw_row = torch.exp(log_sum.clamp(-SAFETY_BOUND, SAFETY_BOUND))[:, None]
        if self.keeps_all:  # every token's kl
            put_block(self.keeps_all, [_S], log_sum.sum().reshape(1, 1))
        if self.tis_seq:  # every threshold at once: [B, J] weights, row-token-weighted sums by one product
            upper = self._constant("tis_seq", [float(self.scenarios[i].threshold) for i in self.tis_seq], F64, device)
            weight = torch.minimum(raw_row, upper)
            truncated = (raw_row > upper).to(F64)
            put_block(self.tis_seq, [_T, _W, _W2],
                      (row_tokens @ torch.stack([truncated, weight, weight * weight], dim=2).reshape(rows, -1))
                      .reshape(-1, 3))
        if self.icepop_seq:
            lower, upper = (self._constant(f"icepop_seq{j}", [_bounds(str(self.scenarios[i].threshold))[j]
                                                               for i in self.icepop_seq], F64, device)
                            for j in (0, 1))
            kept = (raw_row >= lower) & (raw_row <= upper)
            weight = torch.where(kept, raw_row, 0.0)
            sums = row_tokens @ torch.stack([(~kept).to(F64), weight, weight * weight], dim=2).reshape(rows, -1)
            sums = sums.reshape(-1, 3)
            put_block(self.icepop_seq, [_M, _R, _W, _W2], torch.stack(
                [sums[:, 0], (~kept & valid[:, None]).sum(0).to(F64), sums[:, 1], sums[:, 2]], dim=1))

        dropping: list[int] = []  # settings that drop whole rows, and their rejected rows
        rejected: list[torch.Tensor] = []
        if self.index["rs"]:
            # Nothing clamped: sum_t (r - 1 - l) = sum_t r - n - S_i, summed in float64 (no token pass).
            safe_sum, k3_sum = log_sum, row_r - row_tokens - log_sum
            clamped = ((log_ratio_c.abs() > SAFETY_BOUND) & real).any()
            if not on_host or bool(clamped):
                # Some token is clamped at +-20: the clamped statistics as verl computes them (on a device,
                # computed either way and picked without a host round trip).
                direct_safe = chunk.row_sum(chunk.log_ratio_safe)
                direct_k3 = chunk.row_sum(token_statistic(chunk, "k3"))
                safe_sum, k3_sum = torch.where(clamped, direct_safe, safe_sum), torch.where(clamped, direct_k3, k3_sum)
            denominator = row_tokens + 1e-8  # verl's masked_mean
            statistics = {"seq_mean_k1": -safe_sum / denominator, "seq_sum_k1": -safe_sum,
                          "seq_mean_k3": k3_sum / denominator}
            for i in self.index["rs"]:
                bounds = self.rs_bounds[i]
                stat = statistics[str(self.scenarios[i].option)]
                keep = (stat >= bounds.low) & (stat <= bounds.high) if bounds.option.is_k1 else stat <= bounds.high
                dropping.append(i)
                rejected.append(~keep & valid)
        if self.index["veto"]:
            logs = self._constant("veto", self.veto_logs, log_ratio_c.dtype, device)
            vetoed = (rows_hit(log_ratio_c[:, None] < logs[None, :]) if on_host
                      else extreme(log_ratio_c, "min") < logs[None, :]) & valid[:, None]
            dropping += self.index["veto"]
            rejected += list(vetoed.unbind(1))
        if dropping:
            # Sums over the kept rows themselves: "total - dropped" would cancel when nearly all are dropped.
            dropped = torch.stack(rejected, dim=1)  # [B, settings]
            masked = row_tokens @ dropped.to(F64)
            kept_sums = torch.stack([row_r, row_r_sq, log_sum], dim=1).T @ (~dropped).to(F64)  # [3, settings]
            put_block(dropping, [_M, _R, _W, _W2, _S, _N], torch.stack(
                [masked, dropped.sum(0).to(F64), *kept_sums.unbind(0), tokens - masked], dim=1))
        key = tuple(cell_index)  # the same cells every chunk: their index goes to the device once
        if key not in self.cell_index:
            self.cell_index[key] = torch.tensor(key, dtype=torch.int64, device=device)
        self.table.view(-1).index_add_(0, self.cell_index[key], torch.cat(cells))

    def _constant(self, name: str, values: list[float], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """Thresholds as a device tensor, copied there once."""
        key = (name, dtype)
        if key not in self.constants:
            self.constants[key] = torch.tensor(values, dtype=dtype, device=device)
        return self.constants[key]

    def merge(self, other: WhatIfAccumulator) -> None:
        """Fold another shard's table in."""
        self.table += other.table.to(self.table.device)
        self.host_table += other.host_table
        self.tokens += other.tokens
        self.valid_rows = self.valid_rows + (other.valid_rows.to(self.device) if isinstance(other.valid_rows,
                                                                                              torch.Tensor) else 0)

    def compute(self) -> Contribution:
        """The what-if table, one row per setting: truncated / masked fractions, masked sequences, mean weight, ESS."""
        tokens, valid_rows = self.tokens, int(self.valid_rows)
        out: list[dict[str, object]] = []
        for scenario, row in zip(self.scenarios, (self.table.cpu().numpy() + self.host_table).tolist(), strict=True):
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
                "ess": ess(mean, mean_sq) if mean_sq > 0 else None,  # of the weights the setting leaves
                # verl's k1 `kl` (rollout − old, token mean) over the tokens the setting leaves in the mask.
                "kl": -row[_S] / (weight_tokens + 1e-8) if weight_tokens else None,
            })
        return Contribution(what_if=out)


__all__ = ["COLUMNS", "LADDER", "Scenario", "WhatIfAccumulator"]
