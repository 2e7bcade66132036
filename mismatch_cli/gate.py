"""`compare` and `check` as library calls, with the command line's semantics and typed results."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mismatch_cli.comparison import Comparison, compare_reports, correction_notes, is_report_path, load_side
from mismatch_cli.correction import CorrectionConfig
from mismatch_cli.errors import MismatchError, UsageError
from mismatch_cli.report import Report
from mismatch_cli.thresholds import (
    CheckConfig,
    CheckResult,
    Outcome,
    Rule,
    evaluate,
    grouping_for,
    load_check_config,
    parse_rule,
    require_baseline,
)

Side = str | Report  # a dump, a folder or glob of dumps, a report.json path, or a Report already made


@dataclass
class Sided:
    """One side of a comparison (or the input of a check): its label, its report, and whether it was a report."""

    label: str
    report: Report
    from_report: bool


@dataclass
class CompareResult:
    """Two runs side by side: the comparison (and its check, with rules) and both sides' reports."""

    comparison: Comparison
    base: Sided
    candidate: Sided

    @property
    def exit_code(self) -> int:
        """What `mismatch compare` exits with: 1 when a given limit is breached, else 0."""
        check = self.comparison.check
        return check.exit_code if check is not None else 0

    def verdict(self) -> str:
        """The one-line verdict `mismatch compare` prints."""
        return self.comparison.verdict()

    def table(self) -> Any:
        """The side-by-side metrics as a pandas DataFrame (one row per metric)."""
        import pandas as pd

        return pd.DataFrame([row.to_dict() for row in self.comparison.rows])


@dataclass
class CheckRun:
    """A check's outcome per rule, with the report it was held to and the baseline's."""

    result: CheckResult
    candidate: Report
    baseline: Report | None
    baseline_label: str | None = None  # the baseline as given (a path), from the call or the [check] table

    @property
    def exit_code(self) -> int:
        """What `mismatch check` exits with: 0 pass, 1 breach, 2 / 3 a rule that could not be evaluated."""
        return self.result.exit_code

    def verdict(self) -> str:
        """The one-line verdict `mismatch check` prints."""
        return self.result.verdict()

    def table(self) -> Any:
        """Every rule's outcome as a pandas DataFrame (one row per rule)."""
        import pandas as pd

        return pd.DataFrame([outcome.to_dict() for outcome in self.result.outcomes])


def gather_rules(rules: Sequence[str | Rule] = (), config: str | Path | None = None,
                 missing: str | None = None) -> tuple[CheckConfig, list[Rule], str]:
    """The `[check]` table of a TOML file, its rules followed by the given ones, and the missing-metric policy."""
    table = load_check_config(Path(config) if config is not None else None)
    given = [rule if isinstance(rule, Rule) else parse_rule(rule) for rule in rules]
    return table, table.rules + given, missing or table.missing or "error"


def _analyzer(options: dict[str, Any], rules: list[Rule]) -> Callable[[list[str]], Report]:
    """`analyze` with the caller's options, asking for the per-step / per-group tables the rules read."""
    from mismatch_cli.api import analyze

    by_step, columns = grouping_for(rules)
    group_by = [*options.pop("group_by", ()), *(["step"] if by_step or options.pop("by_step", False) else []),
                *columns]
    return functools.partial(analyze, group_by=tuple(dict.fromkeys(group_by)), **options)


def _side(side: Side, analyze: Callable[[list[str]], Report], label: str | None) -> Sided:
    if isinstance(side, Report):
        return Sided(label or "report", side, True)
    report, from_report = load_side(side, analyze)
    return Sided(label or side, report, from_report)


def compare(base: Side, candidate: Side, rules: Sequence[str | Rule] = (), missing: str = "error",
            correction: CorrectionConfig | None = None, config: str | Path | None = None,
            labels: tuple[str, str] | None = None, min_difference: Mapping[str, float | str | None] | None = None,
            **analyze_options: Any) -> CompareResult:
    """Compare two runs (dumps or reports) as `mismatch compare` does; BASE is the reference and the baseline.

    `min_difference` overrides the registry's minimal practical difference per metric (a number in the
    metric's unit, "N%" of the base, or None for any change).
    """
    _, rule_list, policy = gather_rules(rules, config, missing)
    analyze = _analyzer({"correction": correction, **analyze_options}, rule_list)
    base_side = _side(base, analyze, labels[0] if labels else None)
    candidate_side = _side(candidate, analyze, labels[1] if labels else None)
    comparison = compare_reports(base_side.report, candidate_side.report, rule_list, policy, base_side.label,
                                 candidate_side.label, min_difference=min_difference)
    if correction is not None:
        requested = correction.to_dict()
        for side in (base_side, candidate_side):
            if side.from_report:
                comparison.notes += correction_notes(side.label, side.report, requested)
    return CompareResult(comparison, base_side, candidate_side)


def check(inputs: Sequence[str] | Report, rules: Sequence[str | Rule] = (), baseline: Side | None = None,
          missing: str | None = None, correction: CorrectionConfig | None = None, config: str | Path | None = None,
          **analyze_options: Any) -> CheckRun:
    """Hold dumps (or one report) to rules as `mismatch check` does, against an optional baseline report."""
    table, rule_list, policy = gather_rules(rules, config, missing)
    baseline = baseline if baseline is not None else table.baseline
    if not rule_list:
        raise UsageError("no rules to check", hint="pass --fail-on RULE or a --config with a [check] table")
    require_baseline(rule_list, baseline if baseline is None or isinstance(baseline, str) else "report")
    analyze = _analyzer({"correction": correction, **analyze_options}, rule_list)
    if isinstance(inputs, Report):
        candidate = inputs
    elif len(inputs) == 1 and is_report_path(inputs[0]):
        candidate = load_side(inputs[0], analyze)[0]
    else:
        candidate = analyze(list(inputs))
    baseline_side = _side(baseline, analyze, None) if baseline is not None else None
    baseline_report = baseline_side.report if baseline_side is not None else None
    return CheckRun(evaluate(rule_list, candidate, baseline_report, policy), candidate, baseline_report,
                    baseline_side.label if baseline_side is not None else None)


def could_not_run(error: MismatchError) -> CheckResult:
    """The result of a check that could not run: one errored case saying why (for JUnit and annotations)."""
    return CheckResult([Outcome(Rule("mismatch check", "-", "<=", 0.0), "error", message=str(error),
                                exit_code=error.exit_code)])
