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
    fingerprint: str | None = None  # SHA-256 of the size, first and last MiB (io.discover.fingerprint_file)


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
    # The least invasive what-if setting whose after-health is in band, or why there is none (recommend.py).
    recommendation: dict[str, Any] | None = None
    drift: dict[str, dict[str, Any]] = field(default_factory=dict)  # metric -> trend over steps (drift.py)
    # Causes and bug signatures, most severe first: {code, severity, title, evidence, detail} (answers/findings).
    findings: list[dict[str, Any]] = field(default_factory=list)
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
    def from_dict(cls, data: Any, source: str = "report") -> Report:
        """Rebuild a report from its JSON mapping, refusing other schema versions and malformed fields."""
        validate_report(data, source)
        inputs = [InputSummary(**item) for item in data["inputs"]]
        fields = {k: v for k, v in data.items() if k not in ("schema_version", "inputs")}
        return cls(inputs=inputs, **fields)

    @classmethod
    def load(cls, path: str | Path) -> Report:
        """Read a report.json written by `mismatch analyze`."""
        try:
            data = json.loads(Path(path).read_text(), parse_constant=_refuse_constant)
        except RecursionError:
            raise InputError(f"cannot read report {path}: it is nested deeper than any report",
                             hint="pass a report.json written by `mismatch analyze`") from None
        except (OSError, ValueError) as exc:
            raise InputError(f"cannot read report {path}: {exc}", hint="pass a report.json") from None
        return cls.from_dict(data, source=str(path))


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON (a report writes null for undefined numbers)")


# ------------------------------------------------------------------------------------------ validation


class _Check:
    """Walks one report mapping; every failure names the file and the JSON path of the field."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, path: str, expected: str, value: Any) -> None:
        got = "missing" if value is _MISSING else f"got {_kind(value)}"
        raise InputError(f"{self.source}: {path} must be {expected}, {got}",
                         hint="regenerate the report with `mismatch analyze --out-dir DIR`, or fix that field")

    def obj(self, value: Any, path: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            self.fail(path, "an object", value)
        return value

    def array(self, value: Any, path: str) -> list[Any]:
        if not isinstance(value, list):
            self.fail(path, "an array", value)
        return value

    def number(self, value: Any, path: str, nullable: bool = True, low: float = -math.inf) -> None:
        if value is None and nullable:
            return
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                or value < low:
            bound = "" if low == -math.inf else f" >= {low:g}"
            self.fail(path, f"a finite number{bound}" + (" or null" if nullable else ""), value)

    def numbers(self, value: Any, path: str, nullable: bool = True, low: float = -math.inf) -> list[Any]:
        for i, item in enumerate(self.array(value, path)):
            self.number(item, f"{path}[{i}]", nullable, low)
        return value

    def metrics(self, value: Any, path: str) -> None:
        for key, item in self.obj(value, path).items():
            self.number(item, f"{path}[{json.dumps(key)}]")

    def entries(self, value: Any, path: str, label: str) -> None:
        """Round-like rows: objects of numbers (the label an integer)."""
        for i, entry in enumerate(self.array(value, path)):
            for key, item in self.obj(entry, f"{path}[{i}]").items():
                self.number(item, f"{path}[{i}].{key}", nullable=key != label)

    def histogram(self, value: Any, path: str) -> None:
        entry = self.obj(value, path)
        if "bin_width" in entry:  # the by-position profile
            self.number(entry["bin_width"], f"{path}.bin_width", nullable=False, low=1)
            tokens = self.numbers(entry.get("tokens", _MISSING), f"{path}.tokens", nullable=False, low=0)
            means = self.numbers(entry.get("abs_log_ratio_mean", _MISSING), f"{path}.abs_log_ratio_mean")
            if len(means) != len(tokens):
                self.fail(f"{path}.abs_log_ratio_mean", f"an array of {len(tokens)} values (one per bin)", means)
            return
        edges = self.numbers(entry.get("edges", _MISSING), f"{path}.edges", nullable=False)
        if any(b < a for a, b in zip(edges, edges[1:], strict=False)):
            self.fail(f"{path}.edges", "non-decreasing", edges)
        bins = max(len(edges) - 1, 0)
        sides = ("counts",) if "counts" in entry else ("negative", "positive")
        if "counts" not in entry and edges and edges[0] < 0:
            self.fail(f"{path}.edges", "magnitudes >= 0 (with negative / positive counts)", edges)
        for side in sides:
            counts = self.numbers(entry.get(side, _MISSING), f"{path}.{side}", nullable=False, low=0)
            if len(counts) != bins:
                self.fail(f"{path}.{side}", f"an array of {bins} counts (one per pair of edges)", counts)
        if "zero" in entry:
            self.number(entry["zero"], f"{path}.zero", nullable=False, low=0)


_MISSING = object()
_TOP_LEVEL: dict[str, str] = {  # field -> JSON type
    "tool": "object", "created_at": "string", "inputs": "array", "config": "object", "metrics": "object",
    "summary": "object", "steps": "array", "groups": "object", "rounds": "array", "rounds_from_end": "array",
    "quantiles": "object", "histograms": "object", "worst_sequences": "array", "what_if": "array",
    "intervals": "object", "data_quality": "object", "warnings": "array", "recommendation": "object or null",
    "drift": "object", "findings": "array",
}
_FINDING_FIELDS = {"code": "a string", "severity": "error, warning or info", "title": "a string",
                   "evidence": "an object", "detail": "a string"}
_EXPECTED = {"object": "an object", "array": "an array", "string": "a string", "object or null": "an object or null"}
_REQUIRED = ("tool", "created_at", "inputs", "config", "metrics")
_INPUT_FIELDS = {"path": str, "format": str, "bytes": int, "sha256": (str, type(None)), "sequences": int,
                 "tokens": int}
_OPTIONAL_INPUT_FIELDS = {"fingerprint": (str, type(None))}  # absent in reports written before it


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, (int, float)):
        return f"the number {value!r}"
    if isinstance(value, str):
        return f"the string {json.dumps(value[:40])}"
    if isinstance(value, list):
        return f"an array of {len(value)} item{'s' if len(value) != 1 else ''}"
    return "an object" if isinstance(value, dict) else type(value).__name__


def validate_report(data: Any, source: str = "report") -> None:
    """Refuse a report whose fields the readers cannot use (exit 3), naming the file and the field's JSON path."""
    check = _Check(source)
    check.obj(data, "$")
    version = data.get("schema_version")
    if version != SCHEMA_VERSION or isinstance(version, bool):
        raise InputError(
            f"{source}: unsupported report schema_version {version!r} (this tool reads {SCHEMA_VERSION})",
            hint="re-run `mismatch analyze` with this version to regenerate the report",
        )
    for key in _REQUIRED:
        if key not in data:
            check.fail(f"$.{key}", _EXPECTED[_TOP_LEVEL[key]], _MISSING)
    for key, value in data.items():
        kind = _TOP_LEVEL.get(key)
        if kind is None and key != "schema_version":
            raise InputError(f"{source}: $.{key} is not a field of a mismatch report",
                             hint="pass a report.json written by `mismatch analyze`")
        if kind == "object" or (kind == "object or null" and value is not None):
            check.obj(value, f"$.{key}")
        elif kind == "array":
            check.array(value, f"$.{key}")
        elif kind == "string" and not isinstance(value, str):
            check.fail(f"$.{key}", "a string", value)
    for i, item in enumerate(data["inputs"]):
        check.obj(item, f"$.inputs[{i}]")
        for name, kind in _INPUT_FIELDS.items():
            value = item.get(name, _MISSING)
            if isinstance(value, bool) or not isinstance(value, kind):
                check.fail(f"$.inputs[{i}].{name}", "a string" if kind is str else "an integer"
                           if kind is int else "a string or null", value)
        for name, kind in _OPTIONAL_INPUT_FIELDS.items():
            if name in item and not isinstance(item[name], kind):
                check.fail(f"$.inputs[{i}].{name}", "a string or null", item[name])
        extra = sorted(set(item) - set(_INPUT_FIELDS) - set(_OPTIONAL_INPUT_FIELDS))
        if extra:
            check.fail(f"$.inputs[{i}].{extra[0]}", "absent (not a field of an input)", item[extra[0]])
    check.metrics(data["metrics"], "$.metrics")
    for key, interval in data.get("intervals", {}).items():
        path = f"$.intervals[{json.dumps(key)}]"
        if not isinstance(interval, list) or len(interval) != 2:
            check.fail(path, "an array [low, high] of two numbers", interval)
        check.numbers(interval, path, nullable=False)
        if interval[0] > interval[1]:
            check.fail(path, "[low, high] with low <= high", interval)
    check.entries(data.get("rounds", []), "$.rounds", "round")
    check.entries(data.get("rounds_from_end", []), "$.rounds_from_end", "round_from_end")
    for where, rows in [("$.steps", data.get("steps", []))] + [
            (f"$.groups[{json.dumps(k)}]", v) for k, v in data.get("groups", {}).items()]:
        for i, row in enumerate(check.array(rows, where)):
            check.obj(row, f"{where}[{i}]")
            check.metrics(row.get("metrics", _MISSING), f"{where}[{i}].metrics")
            check.entries(row.get("rounds", []), f"{where}[{i}].rounds", "round")
            if where == "$.steps" and (isinstance(row.get("step"), bool) or not isinstance(row.get("step"), int)):
                check.fail(f"{where}[{i}].step", "an integer", row.get("step", _MISSING))
    for key, histogram in data.get("histograms", {}).items():
        check.histogram(histogram, f"$.histograms.{key}")
    for key, marks in data.get("quantiles", {}).items():
        if isinstance(marks, dict):
            check.metrics(marks, f"$.quantiles.{key}")
    for key in ("worst_sequences", "what_if"):
        for i, row in enumerate(data.get(key, [])):
            check.obj(row, f"$.{key}[{i}]")
    if data.get("recommendation") is not None:
        _recommendation(check, data["recommendation"])
    for key, entry in data.get("drift", {}).items():
        _drift(check, entry, f"$.drift[{json.dumps(key)}]")
    for i, finding in enumerate(data.get("findings", [])):
        _check_finding(check, finding, f"$.findings[{i}]")
    for i, warning in enumerate(data.get("warnings", [])):
        if not isinstance(warning, str):
            check.fail(f"$.warnings[{i}]", "a string", warning)


def _recommendation(check: _Check, value: dict[str, Any]) -> None:
    """`scenario` and `flags` strings or null, `reason` a string, `cost` numbers, the health verdicts objects."""
    for key in ("scenario", "flags", "preset"):
        if value.get(key) is not None and not isinstance(value[key], str):
            check.fail(f"$.recommendation.{key}", "a string or null", value[key])
    if not isinstance(value.get("reason", _MISSING), str):
        check.fail("$.recommendation.reason", "a string", value.get("reason", _MISSING))
    for where in ("cost", "health_before", "health_after", "fields", "best_partial"):
        if value.get(where) is not None:
            check.obj(value[where], f"$.recommendation.{where}")
    for key, number in (value.get("cost") or {}).items():
        check.number(number, f"$.recommendation.cost.{key}", low=0)
    check.array(value.get("alternatives", []), "$.recommendation.alternatives")


def _drift(check: _Check, value: Any, path: str) -> None:
    """One metric's drift: a finite slope, an interval [low, high], integer steps or null."""
    entry = check.obj(value, path)
    check.number(entry.get("slope", _MISSING), f"{path}.slope", nullable=False)
    interval = check.numbers(entry.get("slope_interval", _MISSING), f"{path}.slope_interval", nullable=False)
    if len(interval) != 2 or interval[0] > interval[1]:
        check.fail(f"{path}.slope_interval", "[low, high] with low <= high", interval)
    for key in ("first_out_of_band_step", "change_point_step"):
        step = entry.get(key)
        if step is not None and (isinstance(step, bool) or not isinstance(step, int)):
            check.fail(f"{path}.{key}", "an integer step or null", step)
    for i, step in enumerate(check.array(entry.get("bad_steps", _MISSING), f"{path}.bad_steps")):
        if isinstance(step, bool) or not isinstance(step, int):
            check.fail(f"{path}.bad_steps[{i}]", "an integer step", step)


def _check_finding(check: _Check, finding: Any, path: str) -> None:
    """A finding: the five fields, of their types (the evidence any JSON object)."""
    check.obj(finding, path)
    for name, expected in _FINDING_FIELDS.items():
        value = finding.get(name, _MISSING)
        ok = (isinstance(value, dict) if name == "evidence" else value in ("error", "warning", "info")
              if name == "severity" else isinstance(value, str))
        if not ok:
            check.fail(f"{path}.{name}", expected, value)
    if not isinstance(finding.get("fix", ""), str):
        check.fail(f"{path}.fix", "a string", finding["fix"])
    extra = sorted(set(finding) - set(_FINDING_FIELDS) - {"fix"})
    if extra:
        check.fail(f"{path}.{extra[0]}", "absent (not a field of a finding)", finding[extra[0]])


def strict_json(value: Any) -> Any:
    """A JSON-ready value with every non-finite float replaced by None (JSON has no inf / NaN)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: strict_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [strict_json(v) for v in value]
    return value
