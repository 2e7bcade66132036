"""The versioned analysis report: dataclasses that round-trip through JSON for compare / check."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mismatch_cli.errors import InputError

SCHEMA_VERSION = 1
TOOL_NAME = "mismatch"
# `config` keys that say how a run was made rather than which correction it used (compare ignores them).
RUN_SETTINGS = ("device", "dtype", "by_step", "group_by")
TABLES = ("metrics", "steps", "groups", "rounds", "rounds_from_end", "what_if", "worst_sequences")


@dataclass
class InputSummary:
    """One input file as the report records it."""

    path: str
    format: str
    bytes: int
    sha256: str | None
    sequences: int
    tokens: int


@dataclass
class Report:
    """Everything `analyze` found; `metrics` is a flat map of key -> number or None."""

    tool: dict[str, str]
    created_at: str
    inputs: list[InputSummary]
    config: dict[str, Any]
    metrics: dict[str, float | None]
    summary: dict[str, Any] = field(default_factory=dict)
    steps: list[dict[str, Any]] = field(default_factory=list)
    groups: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # --by COLUMN: column -> per-value results
    rounds: list[dict[str, Any]] = field(default_factory=list)
    rounds_from_end: list[dict[str, Any]] = field(default_factory=list)
    quantiles: dict[str, Any] = field(default_factory=dict)
    histograms: dict[str, Any] = field(default_factory=dict)
    worst_sequences: list[dict[str, Any]] = field(default_factory=list)
    what_if: list[dict[str, Any]] = field(default_factory=list)  # every common IS / RS setting on this dump
    intervals: dict[str, list[float]] = field(default_factory=dict)  # metric -> 95 % bootstrap [low, high]
    data_quality: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    schema_version: int = SCHEMA_VERSION

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready mapping with `schema_version` first."""
        body = asdict(self)
        body.pop("schema_version")
        return {"schema_version": self.schema_version, **body}

    @property
    def correction(self) -> dict[str, Any]:
        """The correction fields of `config`: everything but the run settings (device, dtype, grouping)."""
        return {k: v for k, v in self.config.items() if k not in RUN_SETTINGS}

    def table(self, name: str) -> Any:
        """One of the report's tables as a pandas DataFrame (see `TABLES` for the names)."""
        import pandas as pd  # imported on use: `mismatch --help` stays fast

        if name == "metrics":
            rows = [{"metric": k, "value": v, "interval_low": (self.intervals.get(k) or [None, None])[0],
                     "interval_high": (self.intervals.get(k) or [None, None])[1]} for k, v in self.metrics.items()]
        elif name in ("steps", "groups"):
            entries = [("step", e) for e in self.steps] if name == "steps" else [
                (column, e) for column, values in self.groups.items() for e in values]
            rows = [{**({"column": column, "group": e["group"]} if name == "groups" else {"step": e["step"]}),
                     "valid_tokens": e["valid_tokens"], **e["metrics"]} for column, e in entries]
        elif name in ("rounds", "rounds_from_end", "what_if", "worst_sequences"):
            rows = list(getattr(self, name))
        else:
            raise KeyError(f"no table {name!r}; the report has {', '.join(TABLES)}")
        return pd.DataFrame(rows)

    def to_json(self) -> str:
        """Strict JSON (non-finite numbers become null)."""
        return json.dumps(strict_json(self.to_dict()), indent=2, allow_nan=False) + "\n"

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "report") -> Report:
        """Rebuild a report from its JSON mapping, refusing other schema versions."""
        version = data.get("schema_version")
        if version != SCHEMA_VERSION:
            raise InputError(
                f"{source}: unsupported report schema_version {version!r} (this tool reads {SCHEMA_VERSION})",
                hint="re-run `mismatch analyze` with this version to regenerate the report",
            )
        try:
            inputs = [InputSummary(**item) for item in data["inputs"]]
            fields = {k: v for k, v in data.items() if k not in ("schema_version", "inputs")}
            return cls(inputs=inputs, **fields)
        except (KeyError, TypeError) as exc:
            raise InputError(f"{source}: not a mismatch report ({exc})", hint="pass a report.json") from None

    @classmethod
    def load(cls, path: str | Path) -> Report:
        """Read a report.json written by `mismatch analyze`."""
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            raise InputError(f"cannot read report {path}: {exc}", hint="pass a report.json") from None
        return cls.from_dict(data, source=str(path))


def strict_json(value: Any) -> Any:
    """A JSON-ready value with every non-finite float replaced by None (JSON has no inf / NaN)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: strict_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [strict_json(v) for v in value]
    return value
