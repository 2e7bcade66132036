"""The alias table: which column or tensor name plays which role."""

from __future__ import annotations

from collections.abc import Sequence

from ..batch import ROLES
from ..errors import InputError, UsageError, did_you_mean, format_available
from .options import ReadOptions

# First match wins; the comments name the framework that writes each spelling (SPEC §2.1).
ROLE_ALIASES: dict[str, tuple[str, ...]] = {
    "old_log_probs": (
        "old_log_probs",
        "old_log_prob",  # verl
        "log_probs",  # slime
        "prev_logprobs",  # NeMo-RL
        "trainer_logprobs",  # prime-rl
        "action_log_probs",  # SkyRL
        "old_per_token_logps",  # TRL
    ),
    "rollout_log_probs": (
        "rollout_log_probs",
        "rollout_log_prob",
        "rollout_logprobs",
        "generation_logprobs",
        "inference_logprobs",
        "sampling_per_token_logps",  # TRL
        "rollout_per_token_logps",  # ms-swift
    ),
    "response_mask": (
        "response_mask",
        "loss_mask",
        "loss_masks",
        "token_loss_mask",
        "action_mask",
        "completion_mask",
    ),
}


# An optional per-token (or per-row) advantage, for a replayed trainer that masks on its sign (prime-rl).
ADVANTAGE_ALIASES: tuple[str, ...] = ("advantages", "advantage", "token_advantages")
# An optional per-row rank of the trainer process that held the row (accelerate's name), for a replayed
# trainer that reduces per process first (TRL).
PROCESS_COLUMN = "process_index"
# An optional policy version per row (or per token: the row's oldest is kept), for the policy-lag evidence: the
# versions a trainer stamps on its samples, first match wins (docs/formats.md, "Policy versions"). A lag column
# says how many versions behind the sample is; a version column counts up, and a row's lag is then the newest
# version of its step minus its own.
# Optional sampled token ids, one list per row aligned with the log-probs, for the repetition evidence.
TOKEN_ID_COLUMNS: tuple[str, ...] = (
    "response_ids",
    "responses",  # verl's DataProto key
    "completion_ids",  # TRL
    "token_ids",
    "output_token_ids",
)
LAG_COLUMNS: tuple[str, ...] = (
    "policy_lag",
    "staleness",  # SkyRL's fully async trainer (global_step - global_step_when_scheduled)
    "seq_staleness",  # xtuner RolloutState
    "off_policy_steps",
    "trajectory_staleness",
)
VERSION_COLUMNS: tuple[str, ...] = (
    "policy_version",
    "model_version",  # TRL's experimental async GRPO
    "weight_version",
    "oldest_weight_version",  # slime / Miles Sample
    "weight_versions",  # slime / Miles Sample, one per turn (the oldest is kept)
    "versions",  # AReaL, one per token, -1 on prompt tokens
    "response_model_steps",  # xtuner, one per token
    "min_global_steps",  # verl's agent loop (V1 trainer)
    "global_step_when_scheduled",  # SkyRL's fully async trainer
    "trajectory_versions",  # NeMo-RL's async replay buffer
)


def check_options(options: ReadOptions) -> None:
    """Raise UsageError for a `--column` role that does not exist or a non-positive chunk size."""
    for role, name in options.columns.items():
        if role not in ROLES:
            raise UsageError(
                f"unknown role {role!r} in --column {role}={name}",
                hint=f"use one of {', '.join(ROLES)}",
            )
        if not name:
            raise UsageError(f"empty column name in --column {role}=", hint=f"write --column {role}=NAME")
    if options.chunk_rows < 1:
        raise UsageError(f"chunk size must be at least 1 row, got {options.chunk_rows}",
                         hint="read at least one row per chunk (chunk_rows >= 1)")
    _refuse_shared(options.columns, options)


def _refuse_shared(resolved: dict[str, str | None], options: ReadOptions, source: str = "") -> None:
    """Refuse two roles reading one column: old vs rollout of the same values reports a perfectly healthy run."""
    by_name: dict[str, list[str]] = {}
    for role, name in resolved.items():
        if name is not None:
            by_name.setdefault(name, []).append(role)
    for name, roles in by_name.items():
        if len(roles) > 1:
            given = " ".join(f"--column {r}={options.columns[r]}" for r in roles if r in options.columns)
            where = f" in {source}" if source else ""
            raise UsageError(
                f"roles {' and '.join(roles)} would both read column {name!r}{where} (from {given})",
                hint="map each role to its own column with --column ROLE=NAME",
            )


def resolve_roles(
    available: Sequence[str], options: ReadOptions, source: str, *, noun: str = "column"
) -> dict[str, str | None]:
    """Map each role to the name that holds it in `available` (None only for a mask under `--no-mask`)."""
    check_options(options)
    present = set(available)
    resolved: dict[str, str | None] = {}
    problems: list[str] = []  # every role that cannot be read, so that one run shows them all
    looked: list[str] = []
    fixes: list[str] = []
    for role in ROLES:
        override = options.columns.get(role)
        if override is not None:
            if override not in present:
                problems.append(f"no {noun} {override!r} (given by --column {role}={override})")
                close = did_you_mean(override, available, spelled=f"--column {role}={{}}")
                fixes.append(close or f"pick one of the available {noun}s with --column {role}=NAME")
            resolved[role] = override
            continue
        match = next((name for name in ROLE_ALIASES[role] if name in present), None)
        if match is None and role == "response_mask" and options.no_mask:
            resolved[role] = None
        elif match is None:
            problems.append(f"no {role} {noun}")
            looked.append(f"{role}: looked for {', '.join(ROLE_ALIASES[role])}")
            fix = f"--column {role}=NAME" + (" (or --no-mask to train on every token)"
                                               if role == "response_mask" else "")
            fixes.append(f"map it with {fix}")
        else:
            resolved[role] = match
    if problems:
        what = ", ".join(problems[:-1]) + " and " + problems[-1] if len(problems) > 1 else problems[0]
        detail = f" ({'; '.join(looked)})" if looked else ""
        raise InputError(f"{what} in {source}{detail}; available {noun}s: {format_available(available)}",
                         hint="; ".join(fixes))
    _refuse_shared(resolved, options, source)
    return resolved
