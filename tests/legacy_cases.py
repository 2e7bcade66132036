"""Load legacy_parity_cases.json and turn each (case, backend) into engine inputs and expected values."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from helpers import REFERENCE, batch_from_padded

from mismatch_cli.batch import Batch

BACKEND_FAMILY = {
    "verl-0.7.0": ("verl_old", "verl-0.7.0"),
    "verl-0.6.1": ("verl_old", "verl-0.6.1"),
    "verl-0.6.0": ("verl_060", "verl-0.6.0"),
    "verl-0.7.1": ("verl_071", "verl-0.7.1"),
    "xtuner-head": ("xtuner", "xtuner"),
    "xtuner-2025-12-29": ("xtuner", "xtuner-2025-12"),
}


def decode(value: Any) -> Any:
    """The file encodes non-finite floats as strings."""
    if isinstance(value, list):
        return [decode(v) for v in value]
    if value in ("nan", "inf", "-inf"):
        return float(value)
    return value


@dataclass
class LegacyCase:
    """One (case, backend, dtype) with its inputs, config and expected outcome."""

    case: str
    backend: str
    family: str
    fields: dict[str, Any]
    dtype: str
    batch: Batch | None
    expected: dict[str, float] | None  # the float64 values; None for an error case
    error: str | None
    overflows: frozenset[str] = frozenset()  # keys that upstream's own run of this dtype overflows

    @property
    def id(self) -> str:
        return f"{self.case}-{self.backend}-{self.dtype}"


def _batch(case: dict, family: str) -> Batch:
    if family.startswith("xtuner"):
        packed = case["packed"]
        old = np.asarray(decode(packed["old_log_prob"]), dtype=np.float64).reshape(-1)
        rollout = np.asarray(decode(packed["rollout_log_prob"]), dtype=np.float64).reshape(-1)
        mask = np.asarray(packed["response_mask"]).reshape(-1) != 0
        offsets = np.concatenate([[0], np.cumsum(case["num_tokens"])]).astype(np.int64)
        return Batch(old, rollout, mask, offsets, source="pack")
    return batch_from_padded(decode(case["old_log_prob"]), decode(case["rollout_log_prob"]),
                             decode(case["response_mask"]))


def _fields(case: dict, config_key: str, backend: str) -> dict[str, Any] | None:
    configs = case["configs"]
    if config_key in configs:
        return dict(configs[config_key])
    preset = configs.get(f"{config_key}_preset")
    if preset is not None:
        version = backend.replace("verl-", "")
        return {"preset": preset.get(version, preset["default"])}
    return None


def _metrics(outcome: dict) -> dict[str, float]:
    merged = dict(outcome.get("metrics", {}))
    merged.update(outcome.get("mismatch_metrics", {}))
    merged.update(outcome.get("is_metrics", {}))
    return {k: float(decode(v)) for k, v in merged.items()}


def load_legacy_cases() -> list[LegacyCase]:
    """Every numeric and error result of every backend, for both dtypes (the merge case excluded)."""
    data = json.loads((REFERENCE / "legacy_parity_cases.json").read_text())
    out = []
    for case in data["cases"]:
        if "packs" in case:
            continue
        for backend, result in case["results"].items():
            config_key, family = BACKEND_FAMILY[backend]
            fields = _fields(case, config_key, backend)
            if fields is None:
                continue
            if case.get("verl_mask") == "bool" and not family.startswith("xtuner"):
                fields["mask_dtype"] = "bool"  # this case hands verl a bool mask
            if "identical_to" in result:
                result = case["results"][result["identical_to"]]
            for dtype in ("fp64", "fp32"):
                # float32 runs are judged against the float64 values, as the parity rule says.
                outcome = result["fp64"]
                error = outcome["error"]["type"] if "error" in outcome else None
                expected = None
                overflows: frozenset[str] = frozenset()
                if error is None:
                    expected = _metrics(outcome)
                    own = _metrics(result[dtype])
                    overflows = frozenset(k for k, v in own.items() if not math.isfinite(v))
                out.append(LegacyCase(case["name"], backend, family, fields,
                                      "float64" if dtype == "fp64" else "float32", _batch(case, family),
                                      expected, error, overflows))
    return out


def matches(ours: float | None, reference: float, rel: float, abs_: float) -> bool:
    """Parity tolerance; a non-finite reference is reported as null (JSON has no inf)."""
    if not math.isfinite(reference):
        return ours is None or ours == reference or (math.isnan(reference) and ours is not None and math.isnan(ours))
    return ours is not None and abs(ours - reference) <= rel * abs(reference) + abs_
