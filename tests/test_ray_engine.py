"""`--engine ray` on a local Ray cluster gives the local engine's metrics."""

from __future__ import annotations

import math

import pytest

ray = pytest.importorskip("ray")

from mismatch_cli.api import analyze  # noqa: E402
from mismatch_cli.correction import CorrectionConfig  # noqa: E402
from mismatch_cli.synth import SynthSpec, write_synthetic_dump  # noqa: E402


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_ray_engine_equals_local(cluster, tmp_path) -> None:
    files = []
    for i in range(3):
        path = tmp_path / f"part{i}.parquet"
        write_synthetic_dump(path, SynthSpec(tokens=30_000, turns=3, seed=i, steps=2, row_group_tokens=6_000))
        files.append(str(path))
    config = CorrectionConfig(rollout_is="token", rollout_is_threshold=2.0, rollout_rs="seq_mean_k1,token_k3",
                              rollout_rs_threshold="0.99_1.01,0.5")
    local = analyze(files, config, device="cpu", dtype="float64", group_by=("step",), bootstrap=50)
    distributed = analyze(files, config, device="cpu", dtype="float64", group_by=("step",), bootstrap=50,
                          engine="ray")
    assert local.metrics.keys() == distributed.metrics.keys()
    for key, value in local.metrics.items():
        other = distributed.metrics[key]
        if value is None or (isinstance(value, float) and math.isnan(value)):
            assert other is None or math.isnan(other), key
        else:
            # Shards merge in another order than one stream sums: equal up to float64 summation order.
            assert abs(other - value) <= 1e-10 * abs(value) + 1e-14, (key, value, other)
    assert [s["step"] for s in local.steps] == [s["step"] for s in distributed.steps]
    for mine, theirs in zip(local.steps, distributed.steps, strict=True):
        for key, value in mine["metrics"].items():
            if value is not None:
                assert abs(theirs["metrics"][key] - value) <= 1e-10 * abs(value) + 1e-14, key
    assert local.intervals.keys() == distributed.intervals.keys()
    for key, (low, high) in local.intervals.items():
        assert distributed.intervals[key] == pytest.approx([low, high], rel=1e-9, abs=1e-14)
    assert len(local.rounds) == len(distributed.rounds) >= 2
