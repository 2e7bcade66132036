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

import torch

from mismatch_cli.correction import SAFETY_BOUND, RsOption
from mismatch_cli.engine.chunk import Chunk
from mismatch_cli.engine.formulas import ess
from mismatch_cli.engine.ops import numpy_kernels, padded_indices, scratch, total
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


def _float32_log(value: float) -> float:
    # verl-0.6/0.7 compute log(veto) as a float32 scalar tensor (docs/legacy-semantics.md §2).
    return float(torch.log(torch.tensor(value, dtype=torch.float32)).item())


class WhatIfAccumulator(Accumulator):
    """Truncated / masked token and sequence counts and weight sums for every ladder setting."""

    def __init__(self, k1_bounds: str, device: torch.device, scenarios: tuple[Scenario, ...] = LADDER) -> None:
        self.scenarios = scenarios
        self.device = device
        self.table = torch.zeros((len(scenarios), len(COLUMNS)), dtype=F64, device=device)
        self.tokens = 0
        self.valid_rows: torch.Tensor | int = 0  # a device count until compute()
        self.cell_index: dict[tuple[int, ...], torch.Tensor] = {}
        self.constants: dict[tuple[str, torch.dtype], torch.Tensor] = {}
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

        def put(i: int | list[int], columns: list[int], *values: torch.Tensor | float) -> None:
            rows_i = [i] if isinstance(i, int) else i
            for column, value in zip(columns, values, strict=True):
                if not isinstance(value, torch.Tensor):
                    value = torch.full((), value, dtype=F64, device=device)  # a fill, not a host-to-device copy
                cells.append(value.to(F64).reshape(-1).expand(len(rows_i)))
                cell_index.extend(r * len(COLUMNS) + column for r in rows_i)

        # Candidate tokens: the only ones a token-level rule can act on (padded on a device: padded_indices).
        is_candidate = torch.gt(chunk.abs_log_ratio, self.candidate_bound, out=scratch("flag", n, torch.bool, device))
        index, present = padded_indices(is_candidate)
        if present is not None:
            index = index.clamp(max=n - 1)
        real = present if present is not None else torch.ones_like(index, dtype=torch.bool)
        real64 = real.to(F64)
        log_ratio_c = chunk.log_ratio[index]
        ratio_c = chunk.ratio_safe[index]
        ratio_c64 = (ratio_c.to(F64) * real64)[:, None]
        ratio_sq_c = chunk.ratio_safe_sq[index].to(F64) * real64  # the squares row_r_sq holds
        # A padded slot belongs to the extra row B, dropped below.
        row_c = torch.searchsorted(torch.cumsum(chunk.lengths, 0), index, right=True)
        if present is not None:
            row_c = torch.where(real, row_c, rows)
        # Weight sums of the other tokens: total - candidates (the same float values on both sides), unless a
        # huge candidate weight (up to e^20) would swamp the small ones' squares; then they are summed directly.
        rest_r, rest_r_sq = row_r.sum() - ratio_c64.sum(), row_r_sq.sum() - ratio_sq_c.sum()
        huge = ratio_sq_c.sum() > 1e4 * tokens

        def direct() -> tuple[torch.Tensor, torch.Tensor]:
            rest = scratch("x", n, chunk.old.dtype, device).copy_(chunk.ratio_safe).masked_fill_(is_candidate, 0.0)
            # In float64: a float32 sum would depend on the chunking.
            return total(rest).to(device), total(rest.square_()).to(device)

        if numpy_kernels(device):
            if bool(huge):
                rest_r, rest_r_sq = direct()
        else:  # no host round trip: both ways, then pick
            direct_r, direct_r_sq = direct()
            rest_r, rest_r_sq = torch.where(huge, direct_r, rest_r), torch.where(huge, direct_r_sq, rest_r_sq)

        def rows_hit(flags: torch.Tensor) -> torch.Tensor:
            """[B, J] bool: the row holds at least one flagged (real) candidate, per setting."""
            hits = torch.zeros((rows + 1, flags.shape[1]), dtype=torch.int64, device=device)
            return hits.index_add_(0, row_c, (flags & real[:, None]).to(torch.int64))[:rows] > 0

        for i in self.index["none"]:
            put(i, [_W, _W2, _N], row_r.sum(), row_r_sq.sum(), tokens)
        if self.tis_token:
            upper = self._constant("tis", [float(self.scenarios[i].threshold) for i in self.tis_token], F64, device)
            # verl truncates with raw.clamp(max=U): a float32 weight above a float32 U.
            upper_c = self._constant("tis", [float(self.scenarios[i].threshold) for i in self.tis_token],
                                     ratio_c.dtype, device)
            over = (ratio_c[:, None] > upper_c[None, :]) & real[:, None]
            weight = torch.minimum(ratio_c64, upper[None, :]) * real64[:, None]
            put(self.tis_token, [_T, _W, _W2, _N], over.sum(0), rest_r + weight.sum(0),
                rest_r_sq + (weight**2).sum(0), torch.full_like(upper, tokens))
        if self.icepop_token:
            lower, upper = (self._constant(f"icepop{j}", list(b), ratio_c.dtype, device)
                            for j, b in enumerate(zip(*self.icepop_token_bands, strict=True)))
            zeroed = ~((ratio_c[:, None] >= lower) & (ratio_c[:, None] <= upper)) & real[:, None]
            weight = torch.where(zeroed, 0.0, ratio_c64)
            put(self.icepop_token, [_M, _R, _W, _W2, _N], zeroed.sum(0), rows_hit(zeroed).sum(0),
                rest_r + weight.sum(0), rest_r_sq + (weight**2).sum(0),
                torch.full((len(self.icepop_token),), tokens, dtype=F64, device=device))

        log_sum = chunk.log_ratio_row_sum
        raw_row = torch.exp(log_sum.clamp(-SAFETY_BOUND, SAFETY_BOUND))
        # IS never changes the mask (IcePop zeroes weights, it does not mask): those rows keep every token's kl.
        keeps_all = [*self.index["none"], *self.tis_token, *self.icepop_token, *self.tis_seq, *self.icepop_seq]
        if keeps_all:
            put(keeps_all, [_S], log_sum.sum())
        for i in self.tis_seq:
            upper = float(self.scenarios[i].threshold)
            weight = raw_row.clamp(max=upper)
            put(i, [_T, _W, _W2, _N], torch.where(raw_row > upper, row_tokens, 0.0).sum(), row_tokens @ weight,
                row_tokens @ weight**2, tokens)
        for i in self.icepop_seq:
            lower, upper = _bounds(str(self.scenarios[i].threshold))
            kept = (raw_row >= lower) & (raw_row <= upper)
            weight = torch.where(kept, raw_row, 0.0)
            put(i, [_M, _R, _W, _W2, _N], torch.where(kept, 0.0, row_tokens).sum(), (~kept & valid).sum(),
                row_tokens @ weight, row_tokens @ weight**2, tokens)

        def drop_rows(i: int, rejected: torch.Tensor) -> None:
            # Sums over the kept rows themselves: "total - dropped" would cancel when nearly all are dropped.
            masked = torch.where(rejected, row_tokens, 0.0).sum()
            put(i, [_M, _R, _W, _W2, _N, _S], masked, rejected.sum(), torch.where(rejected, 0.0, row_r).sum(),
                torch.where(rejected, 0.0, row_r_sq).sum(), tokens - masked, torch.where(rejected, 0.0, log_sum).sum())

        if self.index["rs"]:
            # Nothing clamped: sum_t (r - 1 - l) = sum_t r - n - S_i, summed in float64 (no token pass).
            safe_sum, k3_sum = log_sum, row_r - row_tokens - log_sum
            clamped = ((log_ratio_c.abs() > SAFETY_BOUND) & real).any()
            if not numpy_kernels(device) or bool(clamped):
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
                drop_rows(i, ~keep & valid)
        if self.index["veto"]:
            logs = self._constant("veto", self.veto_logs, log_ratio_c.dtype, device)
            vetoed = rows_hit(log_ratio_c[:, None] < logs[None, :]) & valid[:, None]
            for j, i in enumerate(self.index["veto"]):
                drop_rows(i, vetoed[:, j])
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
        self.tokens += other.tokens
        self.valid_rows = self.valid_rows + (other.valid_rows.to(self.device) if isinstance(other.valid_rows,
                                                                                              torch.Tensor) else 0)

    def compute(self) -> Contribution:
        """The what-if table, one row per setting: truncated / masked fractions, masked sequences, mean weight, ESS."""
        tokens, valid_rows = self.tokens, int(self.valid_rows)
        out: list[dict[str, object]] = []
        for scenario, row in zip(self.scenarios, self.table.cpu().tolist(), strict=True):
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
