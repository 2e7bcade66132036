"""The accumulator protocol: deciders before consumers, typed per-chunk decisions (cycles: test_architecture.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mismatch_cli.batch import Batch
from mismatch_cli.correction import CorrectionConfig, resolve
from mismatch_cli.engine.accumulators.importance import ImportanceAccumulator
from mismatch_cli.engine.accumulators.rejection import RejectionAccumulator
from mismatch_cli.engine.accumulators.rounds import RoundsAccumulator
from mismatch_cli.engine.analysis import BatchAccumulator
from mismatch_cli.engine.core.bootstrap import BootstrapAccumulator
from mismatch_cli.engine.core.chunk import make_chunk
from mismatch_cli.engine.core.protocol import Accumulator, ChunkDecisions, check_order

CPU = torch.device("cpu")


def _chunk():
    # Two rows: log-ratios 0.1, 0.2 | 3.0 (the second row's weight is far above a TIS bound of 2).
    old = np.array([-1.0, -1.0, -0.5])
    rollout = np.array([-1.1, -1.2, -3.5])
    batch = Batch(old_log_probs=old, rollout_log_probs=rollout, response_mask=np.ones(3, dtype=np.int8),
                  offsets=np.array([0, 2, 3]), source="x.parquet")
    return make_chunk(batch, CPU, torch.float64)


def test_a_consumer_placed_before_its_decider_is_refused() -> None:
    correction = resolve(CorrectionConfig(rollout_is="token", rollout_is_threshold=2.0))
    importance = ImportanceAccumulator("token", correction.is_threshold, False, CPU)
    with pytest.raises(AssertionError, match="is_token_weight"):
        check_order([RoundsAccumulator(CPU), importance])
    check_order([importance, RoundsAccumulator(CPU)])


def test_a_missing_decision_fails_loudly_instead_of_reading_nothing() -> None:
    bootstrap = BootstrapAccumulator(10, CPU, is_level="token")
    with pytest.raises(AssertionError, match="is_token_weight is read before any accumulator decided it"):
        bootstrap.update(_chunk(), ChunkDecisions())


def test_a_decision_is_made_once_per_chunk() -> None:
    decisions = ChunkDecisions()
    decisions.decide(rs_row_reject=torch.tensor([True]))
    with pytest.raises(AssertionError, match="decided twice"):
        decisions.decide(rs_row_reject=torch.tensor([False]))


def test_deciders_fill_typed_decisions_with_the_values_verl_uses() -> None:
    chunk, decisions = _chunk(), ChunkDecisions()
    correction = resolve(CorrectionConfig(rollout_is="token", rollout_is_threshold=2.0, rollout_rs="seq_max_k2",
                                          rollout_rs_threshold=1.0))
    ImportanceAccumulator("token", correction.is_threshold, False, CPU).update(chunk, decisions)
    RejectionAccumulator(correction.rs_options, "verl", CPU).update(chunk, decisions)
    # TIS truncates exp(3.0) to 2.0; the others keep exp(delta).
    assert decisions.is_token_weight.tolist() == pytest.approx([np.exp(0.1), np.exp(0.2), 2.0])
    # seq_max_k2 = max 0.5 delta^2 per row: 0.02 keeps row 0, 4.5 > 1.0 rejects row 1; no token option.
    assert decisions.rs_row_reject.tolist() == [False, True]
    assert decisions.rs_token_reject is None


@pytest.mark.parametrize("config", [
    CorrectionConfig(),
    CorrectionConfig(rollout_is="sequence", rollout_is_threshold=2.0, rollout_rs="token_k1",
                     rollout_rs_threshold="0.5_1.5"),
    CorrectionConfig(semantics="verl-0.7.0", family_fields={"rollout_rs": "token", "rollout_rs_threshold": 2.0,
                                                            "rollout_token_veto_threshold": 1e-4}),
])
def test_every_batch_accumulator_runs_deciders_first(config: CorrectionConfig) -> None:
    batch = BatchAccumulator(resolve(config), CPU, bootstrap=10)
    assert all(isinstance(a, Accumulator) for a in batch.accumulators)
    check_order(batch.accumulators)
    batch.update(_chunk())
    assert batch.compute().valid_tokens == 3
