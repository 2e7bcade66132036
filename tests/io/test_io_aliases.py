"""The alias table: first match wins, --column overrides, errors say what to do."""

from __future__ import annotations

import pytest

from mismatch_cli.errors import InputError, UsageError
from mismatch_cli.io import ROLE_ALIASES, ReadOptions, resolve_roles


def test_first_alias_wins():
    available = ["loss_mask", "log_probs", "old_log_probs", "rollout_logprobs", "rollout_log_probs", "x"]
    assert resolve_roles(available, ReadOptions(), "f.parquet") == {
        "old_log_probs": "old_log_probs",
        "rollout_log_probs": "rollout_log_probs",
        "response_mask": "loss_mask",
    }


@pytest.mark.parametrize("role", list(ROLE_ALIASES))
def test_every_alias_is_recognized(role):
    others = {r: aliases[0] for r, aliases in ROLE_ALIASES.items() if r != role}
    for alias in ROLE_ALIASES[role]:
        resolved = resolve_roles([*others.values(), alias], ReadOptions(), "f.parquet")
        assert resolved[role] == alias


def test_column_override_and_no_mask():
    options = ReadOptions(columns={"old_log_probs": "fsdp_lp"}, no_mask=True)
    resolved = resolve_roles(["fsdp_lp", "old_log_probs", "inference_logprobs"], options, "f.parquet")
    assert resolved == {
        "old_log_probs": "fsdp_lp",
        "rollout_log_probs": "inference_logprobs",
        "response_mask": None,
    }


def test_errors():
    with pytest.raises(InputError) as err:
        resolve_roles(["a", "b", "rollout_log_probs", "response_mask"], ReadOptions(), "f.parquet")
    message = str(err.value)
    assert "no old_log_probs column in f.parquet" in message and "available columns: a, b," in message
    assert "--column old_log_probs=NAME" in message
    with pytest.raises(InputError, match="--no-mask"):
        resolve_roles(["old_log_probs", "rollout_log_probs"], ReadOptions(), "f.parquet")
    with pytest.raises(UsageError, match="unknown role 'mask'"):
        resolve_roles(["old_log_probs"], ReadOptions(columns={"mask": "m"}), "f.parquet")
    long = [f"c{i}" for i in range(100)]
    with pytest.raises(InputError, match=r"\(\+70 more\)"):
        resolve_roles(long, ReadOptions(), "f.parquet")
