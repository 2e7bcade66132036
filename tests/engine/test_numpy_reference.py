"""The engine against an independent float64 numpy transcription of verl, on random padded dumps."""

from __future__ import annotations

import numpy as np
import pytest
import verl_numpy as ref
from helpers import batch_from_padded

from mismatch_cli.correction import CorrectionConfig, resolve
from mismatch_cli.engine.runner import run


def random_dump(seed: int, rows: int = 37, width: int = 23):
    rng = np.random.default_rng(seed)
    rollout = -rng.exponential(0.4, size=(rows, width)) - rng.exponential(0.02, size=(rows, width))
    old = rollout + rng.normal(0.0, 0.05, size=(rows, width)) * (1 + np.abs(rollout))
    spikes = rng.random((rows, width)) < 0.01
    old = np.where(spikes, old - rng.uniform(3, 25, size=(rows, width)), old)
    lengths = rng.integers(0, width + 1, size=rows)
    mask = (np.arange(width)[None, :] < lengths[:, None]).astype(float)
    mask[rng.random((rows, width)) < 0.1] = 0.0  # multi-turn style gaps
    mask[rng.integers(0, rows)] = 0.0  # at least one empty row
    old = np.where(mask > 0, old, rng.normal(size=(rows, width)))  # garbage in padding
    return old, rollout, mask


CONFIGS = [
    {},
    {"rollout_is": "token", "rollout_is_threshold": 2.0},
    {"rollout_is": "sequence", "rollout_is_threshold": 3.0, "rollout_is_batch_normalize": True},
    {"rollout_is": "token", "rollout_is_threshold": "0.5_5.0", "rollout_is_batch_normalize": True},
    {"rollout_is": "sequence", "rollout_is_threshold": "0.2_8.0"},
    {"rollout_rs": ",".join(["token_k1", "token_k2", "token_k3", "seq_sum_k1", "seq_sum_k2", "seq_sum_k3"]),
     "rollout_rs_threshold": "0.7_1.6,0.01,0.02,0.3_2.5,0.4,0.5"},
    {"rollout_rs": "seq_mean_k1,seq_mean_k2,seq_mean_k3,seq_max_k2,seq_max_k3",
     "rollout_rs_threshold": "1.02,0.003,0.004,0.5,0.8"},
    {"rollout_rs": "token_k1,seq_mean_k1", "rollout_rs_threshold": "0.5_1.5", "k1_bounds": "ratio"},
]


def _options(config: dict) -> list[tuple[str, float, float | None]]:
    return [(o.name, o.upper, o.lower) for o in resolve(CorrectionConfig(**config)).rs_options]


def expected(config: dict, old, rollout, mask) -> dict:
    out = ref.offpolicy(old, rollout, mask)
    if config.get("rollout_is"):
        threshold = config["rollout_is_threshold"]
        lower = None
        if isinstance(threshold, str):
            lower, threshold = (float(x) for x in threshold.split("_"))
        out.update(ref.importance(old, rollout, mask, config["rollout_is"], threshold, lower,
                                  config.get("rollout_is_batch_normalize", False)))
    if config.get("rollout_rs"):
        out.update(ref.rejection(old, rollout, mask, _options(config), config.get("k1_bounds") == "ratio"))
    return {f"rollout_corr/{k}": float(v) for k, v in out.items()}


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("config", CONFIGS, ids=[str(i) for i in range(len(CONFIGS))])
def test_engine_matches_numpy_reference(config: dict, seed: int) -> None:
    old, rollout, mask = random_dump(seed)
    want = expected(config, old, rollout, mask)
    result = run([batch_from_padded(old, rollout, mask)], resolve(CorrectionConfig(**config)), device="cpu",
                 dtype="float64")
    got = {k: v for k, v in result.overall.metrics.items() if k.startswith("rollout_corr/")}
    assert set(got) == set(want)
    wrong = {k: (got[k], v) for k, v in want.items() if not abs(got[k] - v) <= 1e-9 * abs(v) + 1e-12}
    assert not wrong
