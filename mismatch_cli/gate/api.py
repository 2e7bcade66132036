"""`compare` and `check` as library calls, with the command line's semantics and typed results."""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mismatch_cli.correction import CorrectionConfig
from mismatch_cli.errors import MismatchError, MissingGroupError, UsageError
from mismatch_cli.gate.bugs import fail_bug_passes
from mismatch_cli.gate.comparison import Comparison, compare_reports, is_report_path, parse_min_differences
from mismatch_cli.gate.nway import RunsComparison, compare_runs, default_labels, refuse_repeated_inputs
from mismatch_cli.gate.thresholds import (
    MISSING_POLICIES,
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
from mismatch_cli.report import Report

Side = str | os.PathLike | Report  # a dump, a folder or glob of dumps, a report.json path, or a Report


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
class RunsResult:
    """Two or more runs side by side (no reference): the comparison and every run's report."""

    comparison: RunsComparison
    runs: list[Sided]

    @property
    def exit_code(self) -> int:
        """What `mismatch compare A B C ...` exits with: 0 (no limits apply to several runs)."""
        return 0

    def verdict(self) -> str:
        """The one-line verdict `mismatch compare` prints."""
        return self.comparison.verdict()

    def table(self) -> Any:
        """One row per metric and run (metric, run, value, low, high, best, worst, bug) as a pandas DataFrame."""
        import pandas as pd

        return pd.DataFrame([
            {"metric": row.metric, "run": label, "value": row.values[label],
             "low": (row.intervals[label] or [None, None])[0], "high": (row.intervals[label] or [None, None])[1],
             "best": row.best == label, "worst": row.worst == label, "bug": row.bug_values.get(label)}
            for row in self.comparison.rows for label in self.comparison.labels])


@dataclass
class CheckRun:
    """A check's outcome per rule, with the report it was held to and the baseline's."""

    result: CheckResult
    candidate: Report
    baseline: Report | None
    baseline_label: str | None = None  # the baseline as given (a path), from the call or the [check] table
    notes: list[str] = field(default_factory=list)  # what the flags could not do to a report input

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
    if isinstance(rules, (str, Rule)):  # one rule, not a sequence of one-letter rules
        rules = [rules]
    if rules is None or not isinstance(rules, Sequence) or not all(isinstance(r, (str, Rule)) for r in rules):
        raise UsageError(f"rules must be a list of rule strings, got {rules!r}",
                         hint="pass rules=['abs(kl)<=1e-3', 'max(step:abs(kl))<=1e-3']")
    if missing is not None and missing not in MISSING_POLICIES:
        raise UsageError(f"missing must be one of {', '.join(MISSING_POLICIES)}, got {missing!r}",
                         hint="pass missing='error' (the default), 'warn' or 'skip'")
    given = [rule if isinstance(rule, Rule) else parse_rule(rule) for rule in rules]
    return table, table.rules + given, missing or table.missing or "error"


def _known_options(options: Mapping[str, Any]) -> None:
    """Refuse a keyword `analyze` does not take (a misspelt one would otherwise be ignored without a word)."""
    from mismatch_cli.api import analyze

    known = set(inspect.signature(analyze).parameters) - {"paths", "correction"}
    unknown = sorted(set(options) - known)
    if unknown:
        raise UsageError(f"unknown keyword(s) {', '.join(unknown)}",
                         hint=f"rules go in rules=[...]; analyze options are {', '.join(sorted(known))}")


def _path_or_report(side: Any, what: str) -> Side:
    """A side as given: a Report, or a path (str or os.PathLike) to a dump, folder, glob or report.json."""
    if isinstance(side, (Report, str)):
        return side
    if isinstance(side, os.PathLike):
        return os.fspath(side)
    raise UsageError(f"{what} is a {type(side).__name__}, not a path or a Report",
                     hint=f"pass {what} as a path (dump, folder, glob or report.json) or a Report")


def _analyzer(options: dict[str, Any], rules: list[Rule]) -> Callable[[list[str]], Report]:
    """`analyze` with the caller's options, asking for the per-step / per-group tables the rules read."""
    from mismatch_cli.api import analyze

    by_step, columns = grouping_for(rules)
    given = list(options.pop("group_by", ()))
    group_by = [*given, *(["step"] if by_step or options.pop("by_step", False) else []), *columns]
    run = functools.partial(analyze, group_by=tuple(dict.fromkeys(group_by)), **options)

    def analyze_for_rules(paths: list[str]) -> Report:
        try:
            return run(paths)
        except MissingGroupError as exc:  # the column came from a rule, not from --by: say which rule
            if exc.column in given:
                raise
            rule = next((r.text for r in rules if r.scope == exc.column), None)
            raise (exc.asked_by(f"the rule {rule}") if rule else exc) from None

    return analyze_for_rules


def load_side(arg: str, analyze: Callable[[list[str]], Report]) -> tuple[Report, bool]:
    """A side's report: read back from report.json, or analyzed from its dumps; and whether it was a report."""
    if is_report_path(arg):
        path = os.path.join(arg, "report.json") if os.path.isdir(arg) else arg  # a missing x.json is named as given
        return Report.load(path), True
    return analyze([arg]), False


def correction_notes(label: str, report: Report, requested: dict[str, Any]) -> list[str]:
    """Warn when a report side was made with another correction than the flags ask for."""
    differing = [k for k, v in requested.items() if k in report.config and report.config[k] != v]
    if not differing:
        return []
    return [f"{label} is a report analyzed with {', '.join(f'{k}={report.config[k]!r}' for k in differing[:3])}; "
            "correction flags do not apply to a report (re-analyze its dumps to change them)"]


def _side(side: Side, analyze: Callable[[list[str]], Report], label: str | None) -> Sided:
    if isinstance(side, Report):
        return Sided(label or "report", side, True)
    report, from_report = load_side(side, analyze)
    return Sided(label or side, report, from_report)


def compare(base: Side, candidate: Side, rules: Sequence[str | Rule] = (), missing: str = "error",
            correction: CorrectionConfig | None = None, config: str | Path | None = None,
            labels: tuple[str, str] | None = None,
            min_difference: Mapping[str, float | str | None] | Sequence[str] | None = None,
            **analyze_options: Any) -> CompareResult:
    """Compare two runs (dumps or reports) as `mismatch compare` does; BASE is the reference and the baseline.

    `min_difference` overrides the registry's minimal practical difference per metric (a number in the
    metric's unit, "N%" of the base, or None for any change; or `METRIC=AMOUNT` strings as on the command line).
    """
    base, candidate = _path_or_report(base, "base"), _path_or_report(candidate, "candidate")
    _known_options(analyze_options)
    _, rule_list, policy = gather_rules(rules, config, missing)
    min_difference = _min_differences(min_difference)
    analyze = _analyzer({"correction": correction, **analyze_options}, rule_list)
    base_side = _side(base, analyze, labels[0] if labels else None)
    candidate_side = _side(candidate, analyze, labels[1] if labels else None)
    comparison = compare_reports(base_side.report, candidate_side.report, rule_list, policy, base_side.label,
                                 candidate_side.label, min_difference=min_difference)
    comparison.notes += _side_notes([base_side, candidate_side], correction, analyze_options)
    return CompareResult(comparison, base_side, candidate_side)


def _min_differences(min_difference: Mapping[str, float | str | None] | Sequence[str] | None,
                     ) -> Mapping[str, float | str | None] | None:
    """The caller's minimal practical differences as a mapping (`METRIC=AMOUNT` strings parsed)."""
    if min_difference is None or isinstance(min_difference, Mapping):
        return min_difference
    if isinstance(min_difference, str) or not isinstance(min_difference, Sequence):
        min_difference = [min_difference]  # type: ignore[list-item]
    if not all(isinstance(text, str) for text in min_difference):
        raise UsageError(f"min_difference must map metrics to amounts, got {min_difference!r}",
                         hint="pass min_difference={'kl': 1e-4, 'chi2_token': '5%'} (or 'kl=1e-4' strings)")
    return parse_min_differences(list(min_difference), "min_difference")


def _side_notes(sides: list[Sided], correction: CorrectionConfig | None, analyze_options: Mapping[str, Any],
                ) -> list[str]:
    """What the flags could not do to the sides that are reports: another correction, a missing --by table."""
    notes: list[str] = []
    if correction is not None:
        requested = correction.to_dict()
        for side in sides:
            if side.from_report:
                notes += correction_notes(side.label, side.report, requested)
    asked = [*(["step"] if analyze_options.get("by_step") else []), *analyze_options.get("group_by", ())]
    for side in sides:
        made = [*(["step"] if side.report.config.get("by_step") else []), *side.report.config.get("group_by", [])]
        lacking = [column for column in asked if column not in made]
        if side.from_report and lacking:  # --by does not re-analyze a report: say so rather than ignore it
            notes.append(f"{side.label} is a report made without --by {', '.join(lacking)}; --by does "
                         "not apply to a report (re-analyze its dumps with --by)")
    return notes


def compare_many(runs: Sequence[Side], correction: CorrectionConfig | None = None,
                 config: str | Path | None = None, labels: Sequence[str] | None = None,
                 min_difference: Mapping[str, float | str | None] | Sequence[str] | None = None,
                 **analyze_options: Any) -> RunsResult:
    """Put two or more runs side by side as `mismatch compare A B C ...` does: no reference, best and worst.

    Each run is analyzed (or read back) on its own, so its numbers do not depend on the other runs or their
    order. Labels default to the file stems (with parent folders where stems clash); the same file given
    twice is a usage error. Limits (`[check]` in `config`) need a baseline and are not applied; a note says so.
    """
    given = [_path_or_report(run, f"run {i + 1}") for i, run in enumerate(runs)] if not isinstance(
        runs, (str, Report, os.PathLike)) else []
    if len(given) < 2:
        raise UsageError(f"compare_many needs a list of two or more runs, got {runs!r}",
                         hint="pass runs=['fp32.parquet', 'bf16.parquet', 'fp8.parquet'] (paths or Reports)")
    if labels is not None and (isinstance(labels, str) or len(labels) != len(given)):
        raise UsageError(f"labels must name each of the {len(given)} runs, got {labels!r}",
                         hint="pass one label per run, or none for the file stems")
    refuse_repeated_inputs([run for run in given if isinstance(run, str)])
    _known_options(analyze_options)
    differences = _min_differences(min_difference)
    sources = [run if isinstance(run, str) else "report" for run in given]
    names = list(labels) if labels is not None else default_labels(
        [source if source != "report" else f"report{i + 1}" for i, source in enumerate(sources)])
    analyze = _analyzer({"correction": correction, **analyze_options}, [])
    sides = [_side(run, analyze, name) for run, name in zip(given, names, strict=True)]
    comparison = compare_runs([(side.label, side.report) for side in sides], sources, min_difference=differences)
    comparison.notes += _side_notes(sides, correction, analyze_options)
    if config is not None and load_check_config(Path(config)).rules:
        comparison.notes.append(f"the [check] limits of {config} are not applied: limits judge a candidate "
                                "against a baseline, so they need exactly two runs")
    return RunsResult(comparison, sides)


def check(inputs: Sequence[str | os.PathLike] | str | os.PathLike | Report, rules: Sequence[str | Rule] = (),
          baseline: Side | None = None,
          missing: str | None = None, correction: CorrectionConfig | None = None, config: str | Path | None = None,
          **analyze_options: Any) -> CheckRun:
    """Hold dumps (or one report) to rules as `mismatch check` does, against an optional baseline report."""
    if isinstance(inputs, (str, os.PathLike)):  # one path, not a sequence of one-letter paths
        inputs = [os.fspath(inputs)]
    if not isinstance(inputs, Report) and (not isinstance(inputs, Sequence) or not inputs or not all(
            isinstance(item, (str, os.PathLike)) for item in inputs)):
        raise UsageError(f"inputs must be a Report or a list of paths, got {inputs!r}",
                         hint="pass inputs=['dumps/'] (dumps, folders, globs or one report.json) or a Report")
    inputs = inputs if isinstance(inputs, Report) else [os.fspath(item) for item in inputs]
    if not isinstance(inputs, Report) and len(inputs) > 1 and any(is_report_path(item) for item in inputs):
        report = next(item for item in inputs if is_report_path(item))
        raise UsageError(f"check holds one report to the rules, got {report} among {len(inputs)} inputs",
                         hint="check a report on its own, or the dumps it was made from; "
                         "compare two reports with `mismatch compare`")
    _known_options(analyze_options)
    table, rule_list, policy = gather_rules(rules, config, missing)
    baseline = _path_or_report(baseline, "baseline") if baseline is not None else None
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
    from_report = isinstance(inputs, Report) or (len(inputs) == 1 and is_report_path(inputs[0]))
    notes = _side_notes([Sided("the input", candidate, True)], correction, analyze_options) if from_report else []
    baseline_side = _side(baseline, analyze, None) if baseline is not None else None
    baseline_report = baseline_side.report if baseline_side is not None else None
    result = evaluate(rule_list, candidate, baseline_report, policy)
    fail_bug_passes(result, candidate, baseline_report)  # a rule never passes on a value only a bug allows
    return CheckRun(result, candidate, baseline_report, baseline_side.label if baseline_side is not None else None,
                    notes)


def could_not_run(error: MismatchError) -> CheckResult:
    """The result of a check that could not run: one errored case saying why (for JUnit and annotations)."""
    return CheckResult([Outcome(Rule("mismatch check", "-", "<=", 0.0), "error", message=str(error),
                                exit_code=error.exit_code)])
