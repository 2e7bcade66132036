"""Every case of legacy_parity_cases.json (produced by verl 0.6.0-0.7.1 and xtuner) through the engine."""

from __future__ import annotations

import math

import pytest
from helpers import cancelled_std_abs
from legacy_cases import load_legacy_cases, matches

from mismatch_cli.correction import resolve_family
from mismatch_cli.engine.runner import run
from mismatch_cli.errors import ConfigError, DataError

CASES = load_legacy_cases()
NUMERIC = [c for c in CASES if c.error is None]
ERRORS = [c for c in CASES if c.error is not None]
TOLERANCE = {"float64": (1e-9, 1e-12), "float32": (1e-3, 1e-5)}


def test_every_backend_is_covered() -> None:
    backends = {c.backend for c in CASES}
    assert backends == {"verl-0.7.0", "verl-0.6.1", "verl-0.6.0", "verl-0.7.1", "xtuner-head", "xtuner-2025-12-29"}
    assert len(NUMERIC) > 200 and len(ERRORS) > 20


@pytest.mark.parametrize("case", NUMERIC, ids=[c.id for c in NUMERIC])
def test_numeric_case_matches_upstream(case) -> None:
    resolved, _ = resolve_family(case.family, case.fields)
    metrics = run([case.batch], resolved, device="cpu", dtype=case.dtype).overall.metrics
    ours = {k: v for k, v in metrics.items() if k.startswith(("rollout_corr/", "mismatch/"))}
    assert set(ours) == set(case.expected)
    wrong = {
        k: (ours[k], v) for k, v in case.expected.items()
        if not (matches(ours[k], v, *_tolerance(k, case)) or (k in case.overflows and ours[k] is None))
    }
    assert not wrong


def _tolerance(key: str, case) -> tuple[float, float]:
    """The dtype's tolerance; a float64 std taken by cancellation also its rounding (the std of a near-constant is
    residue whose last bits follow the summation order, which a GPU's differs from the CPU's)."""
    rel, abs_ = TOLERANCE[case.dtype]
    mean = case.expected.get(key.removesuffix("_std") + "_mean") if key.endswith("_std") else None
    if case.dtype == "float64" and mean is not None and math.isfinite(mean) and math.isfinite(case.expected[key]):
        abs_ = max(abs_, cancelled_std_abs(mean, case.expected[key]))
    return rel, abs_


@pytest.mark.parametrize("case", ERRORS, ids=[c.id for c in ERRORS])
def test_error_case_is_refused(case) -> None:
    with pytest.raises((ConfigError, DataError)) as info:
        resolved, _ = resolve_family(case.family, case.fields)
        run([case.batch], resolved, device="cpu", dtype=case.dtype)
    assert str(info.value)
    if case.error in ("ValueError", "AssertionError") and "response_mask" not in str(info.value):
        assert isinstance(info.value, ConfigError)


def _pack_batch(pack: dict, source: str):
    import numpy as np
    from legacy_cases import decode

    from mismatch_cli.batch import Batch

    lengths = pack["num_tokens"]
    rows = [(np.asarray(decode(pack[k]), dtype=np.float64)) for k in ("old_log_prob", "rollout_log_prob")]
    mask = np.asarray(pack["response_mask"])
    flat = [np.concatenate([r[i, :n] for i, n in enumerate(lengths)]) for r in (*rows, mask)]
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    return Batch(flat[0], flat[1], flat[2] != 0, offsets, source=source)


@pytest.mark.parametrize(("family", "backend"), [("xtuner", "xtuner-head"), ("xtuner-2025-12", "xtuner-2025-12-29")])
def test_xtuner_merges_packs_like_merge_rollout_is_metrics(family: str, backend: str) -> None:
    import json
    import math

    from helpers import REFERENCE
    from legacy_cases import decode

    case = next(c for c in json.loads((REFERENCE / "legacy_parity_cases.json").read_text())["cases"]
                if c["name"] == "xtuner_merge_three_packs")
    resolved, _ = resolve_family(family, case["configs"]["xtuner_merge"])
    batches = [_pack_batch(pack, f"pack{i}.safetensors") for i, pack in enumerate(case["packs"])]
    metrics = run(batches, resolved, device="cpu", dtype="float64").overall.metrics
    expected = case["results"][backend]["fp64"]
    expected = {k: float(decode(v)) for k, v in {**expected["merged_mismatch_metrics"],
                                                  **expected["merged_is_metrics"]}.items()}
    ours = {k: v for k, v in metrics.items() if k.startswith("mismatch/")}
    assert set(ours) == set(expected)
    for key, value in expected.items():
        if math.isfinite(value):
            assert abs(ours[key] - value) <= 1e-6 * abs(value) + 1e-9, key  # merged through float32
        else:
            assert ours[key] is None, key


FAMILY_CONFIGS = [
    ("verl-0.7.1", {"rollout_is": "sequence", "rollout_is_threshold": 2.0, "rollout_is_batch_normalize": True,
                    "rollout_rs": "token_k1,seq_max_k2", "rollout_rs_threshold": "0.7_1.2,0.5"}),
    ("verl-0.7.0", {"rollout_is": "token", "rollout_is_threshold": 2.0, "rollout_is_batch_normalize": True,
                    "rollout_rs": "geometric", "rollout_rs_threshold": 1.02, "rollout_token_veto_threshold": 1e-3}),
    ("verl-0.6.1", {"rollout_is": "sequence", "rollout_is_threshold": 3.0, "rollout_is_batch_normalize": True,
                    "rollout_rs": "token", "rollout_rs_threshold": 2.0, "rollout_rs_threshold_lower": 0.6}),
    ("verl-0.6.0", {"rollout_is_level": "geometric", "rollout_is_mode": "mask", "rollout_is_threshold": 1.05}),
    ("verl-0.6.0", {"rollout_is_level": "token", "rollout_is_mode": "truncate", "rollout_is_threshold": 2.0,
                    "rollout_is_threshold_lower": 0.7}),
    ("xtuner", {"rollout_is_level": "sequence", "rollout_is_mode": "both", "rollout_is_threshold": [5.0, 0.2],
                "rollout_is_mask_threshold": [3.0, 0.3], "rollout_is_veto_threshold": [50.0, 1e-3]}),
    ("xtuner-2025-12", {"rollout_is_level": "token", "rollout_is_mode": "mask", "rollout_is_threshold": [2.0, 0.5]}),
]


@pytest.mark.parametrize(("family", "fields"), FAMILY_CONFIGS, ids=[f for f, _ in FAMILY_CONFIGS])
def test_every_family_is_chunking_invariant(family: str, fields: dict) -> None:
    from helpers import batch_from_padded
    from test_chunking import assert_same, split
    from test_numpy_reference import random_dump

    old, rollout, mask = random_dump(21, rows=40)
    whole = batch_from_padded(old, rollout, mask)
    resolved, _ = resolve_family(family, fields)
    one = run([whole], resolved, device="cpu", dtype="float64").overall.metrics
    many = run(split(whole, list(range(1, 40))), resolved, device="cpu", dtype="float64").overall.metrics
    assert_same(one, many)
