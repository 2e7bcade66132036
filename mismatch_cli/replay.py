"""`replay(paths) -> ReplayReport`: one dump, every trainer (under its defaults, or the settings given), concept by
concept, with noise, led by the dump's own verdict.

Columns: verl (its documented token TIS: its defaults turn no IS on), xtuner (its defaults) and every replayed
trainer of `REPLAY_FAMILIES` (its defaults); `settings` changes any column's fields, validated as `analyze
--semantics NAME` validates them. Rows: `CONCEPTS`, each read from the key the trainer logs for it. All trainers
fold the same chunks of ONE read (`engine.many.run_many`); the dump's verdict is `analyze`'s (its default, verl
with no correction) built from the same read. Noise: a delete-a-group jackknife over `GROUPS` row groups (row index
in its file modulo GROUPS). Two trainers disagree on a concept when their values differ by more than `SIGMAS`
combined standard errors and by more than the keys' minimal practical difference; `answers.replay` says why, from
what the trainers computed on this dump (docs/replay.md).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from contextlib import closing
from dataclasses import dataclass, field, replace
from typing import Any

from mismatch_cli.answers.replay import (
    Side,
    dump_facts,
    estimator_of,
    explain,
    nonfinite_text,
    normalizes,
    weight_form,
)
from mismatch_cli.correction import CONCEPTS, REPLAY_FAMILIES, CorrectionConfig, resolve, resolve_family
from mismatch_cli.correction.older import XTUNER_CONCEPTS, XTUNER_TRAITS
from mismatch_cli.correction.verl import VERL_CONCEPTS, VERL_REPLAY_FIELDS, VERL_REPLAY_NOTE, VERL_TRAITS
from mismatch_cli.engine import INFINITE_NOTE, UNDEFINED_NOTE
from mismatch_cli.errors import UsageError, did_you_mean
from mismatch_cli.gate.noise import min_difference_of
from mismatch_cli.io import ReadOptions, discover_inputs, iter_batches
from mismatch_cli.metrics import lookup
from mismatch_cli.metrics.catalog import IS, RS_OPTION, RS_TOTAL
from mismatch_cli.report import SCHEMA_VERSION, TOOL_NAME, Report
from mismatch_cli.system.runtime import loading
from mismatch_cli.version import __version__

GROUPS = 10  # jackknife row groups
SIGMAS = 3.0  # a disagreement is beyond SIGMAS combined jackknife standard errors
DUMP = "(dump)"  # run_many's name for analyze's default correction when no verl column can stand in for it
CORRECTION_FAMILIES = (IS, RS_TOTAL, RS_OPTION)  # the keys a verl 0.9 column adds to analyze's default run


@dataclass(frozen=True)
class Trainer:
    """One column: a trainer under its defaults (or the settings given), its keys for the concepts, its traits."""

    name: str
    title: str
    fields: Mapping[str, Any]  # the upstream fields the column runs (its defaults, or verl's TIS, plus `changed`)
    concepts: Mapping[str, str]
    traits: Mapping[str, str]
    note: str = ""
    changed: Mapping[str, Any] = field(default_factory=dict)  # the fields given (--set, --config), if any
    settings: str = ""  # the effective settings in words (the trainer's correction line), once resolved
    form: str | None = None  # how its IS weight is formed under these settings: token, product, geometric


def trainers() -> dict[str, Trainer]:
    """Every column `replay` knows, in its default order: verl, xtuner, then the replayed trainers."""
    columns = [
        Trainer("verl", "verl 0.9 rollout correction", VERL_REPLAY_FIELDS, VERL_CONCEPTS, VERL_TRAITS,
                VERL_REPLAY_NOTE),
        Trainer("xtuner", "xtuner rollout IS (main)", {}, XTUNER_CONCEPTS, XTUNER_TRAITS,
                "its defaults: no IS weight (rollout_is_threshold unset), so only its mismatch/ keys"),
        *(Trainer(f.name, f.title, {}, f.concepts, f.traits) for f in REPLAY_FAMILIES.values()),
    ]
    return {t.name: t for t in columns}


def known_trainer(name: str, origin: str) -> str:
    """`name` when it is a column `replay` knows; else a UsageError naming the closest and every known one."""
    known = trainers()
    if name not in known:
        raise UsageError(f"{origin}: unknown trainer '{name}'",
                         hint=did_you_mean(name, tuple(known), f"use one of {', '.join(known)}"))
    return name


def choose_trainers(names: Sequence[str] | None) -> list[str]:
    """The columns asked for (all, in the default order, when none); UsageError naming the known ones."""
    known = trainers()
    if names is None:
        return list(known)
    if not names:
        raise UsageError("--trainers names no trainer", hint=f"name some of {', '.join(known)}, or drop --trainers")
    return list(dict.fromkeys(known_trainer(name, "--trainers") for name in names))


def configure(names: Sequence[str], settings: Mapping[str, Mapping[str, Any]] | None = None
              ) -> tuple[list[Trainer], dict[str, Any]]:
    """The chosen columns with the settings given (family -> its upstream fields), each validated as `analyze
    --semantics NAME` validates them (the same errors, exit 2), and their resolved corrections."""
    settings = settings or {}
    for name in settings:
        known_trainer(name, f"--set {name}.FIELD")
        if name not in names:
            raise UsageError(f"--set {name}.FIELD: {name} is not among the columns ({', '.join(names)})",
                             hint=f"add {name} to --trainers, or drop its settings")
    columns, corrections = [], {}
    for name in names:
        trainer = trainers()[name]
        given = dict(settings.get(name, {}))
        fields = {**trainer.fields, **given}
        resolved, effective = resolve_family(name, dict(fields))
        family = REPLAY_FAMILIES.get(name)
        words = family.describe(effective) if family is not None else \
            ", ".join(f"{k}={v}" for k, v in fields.items()) or "its defaults"
        columns.append(replace(trainer, fields=fields, changed=given, settings=words,
                               form=weight_form(resolved, trainer.traits)))
        corrections[name] = resolved
    return columns, corrections


@dataclass
class Cell:
    """One trainer's value of one concept: its key (None: the trainer logs none), value, jackknife SE."""

    key: str | None  # None: the trainer logs no key for the concept under this column's settings
    value: float | None  # None: logged but undefined (non-finite, no token, an input the dump lacks)
    se: float | None
    disagrees: bool = False
    nonfinite: bool = False  # the value is NaN or infinite (the engine reports it as overflowed)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {"key": self.key, "value": self.value, "se": self.se, "disagrees": self.disagrees,
                "nonfinite": self.nonfinite}


@dataclass
class ConceptRow:
    """One concept across the trainers, and why they differ (None when no value is non-finite or disagrees)."""

    concept: str
    label: str
    cells: dict[str, Cell]
    why: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {"concept": self.concept, "label": self.label, "why": self.why,
                "cells": {name: cell.to_dict() for name, cell in self.cells.items()}}


@dataclass
class ReplayReport:
    """`mismatch replay`'s result: the dump's verdict, the trainers (columns), the concepts (rows) and the notes."""

    inputs: list[str]
    trainers: list[Trainer]
    rows: list[ConceptRow]
    groups: int
    sigmas: float = SIGMAS
    device: str = "cpu"
    dtype: str = "float32"
    notes: list[str] = field(default_factory=list)
    silent: list[str] = field(default_factory=list)  # trainers that log none of the concepts under their settings
    dump: Report | None = None  # `analyze`'s report of the dump under its default (verl, no correction)

    @property
    def shown(self) -> list[Trainer]:
        """The trainers the table shows: all but the silent ones (JSON keeps every trainer)."""
        return [t for t in self.trainers if t.name not in self.silent] or list(self.trainers)

    @property
    def changed(self) -> list[Trainer]:
        """The trainers run with settings given (not at their column's defaults)."""
        return [t for t in self.trainers if t.changed]

    def verdict(self) -> dict[str, Any] | None:
        """The dump's verdict as `analyze` gives it: status, diagnosis, health checks, bug signatures."""
        if self.dump is None:
            return None
        summary = self.dump.summary
        checks = [{k: c.get(k) for k in ("metric", "label", "value", "healthy_range", "ok")}
                  for c in summary.get("checks", [])]
        findings = [{k: f.get(k) for k in ("code", "severity", "title")} for f in self.dump.findings]
        return {"status": summary.get("status"), "diagnosis": summary.get("diagnosis"), "checks": checks,
                "findings": findings}

    def to_dict(self) -> dict[str, Any]:
        """The versioned JSON document (`schema_version` first, like every JSON the tool writes)."""
        return {
            "schema_version": SCHEMA_VERSION,
            "kind": "replay",
            "tool": {"name": TOOL_NAME, "version": __version__},
            "inputs": list(self.inputs),
            "dump": self.verdict(),
            "noise": {"method": "delete-a-group jackknife", "groups": self.groups, "sigmas": self.sigmas},
            "device": self.device,
            "dtype": self.dtype,
            "trainers": [{"name": t.name, "title": t.title, "fields": dict(t.fields), "set": dict(t.changed),
                          "settings": t.settings, "weight": t.form, "note": t.note, "traits": dict(t.traits)}
                         for t in self.trainers],
            "concepts": [row.to_dict() for row in self.rows],
            "notes": list(self.notes),
            "silent": list(self.silent),
        }


def jackknife_se(full: float | None, leave_one_out: Sequence[float | None]) -> float | None:
    """Delete-a-group jackknife standard error from the G leave-one-out values (None when any is undefined)."""
    g = len(leave_one_out)
    if full is None or g < 2 or any(v is None or not math.isfinite(v) for v in leave_one_out):
        return None
    values = [float(v) for v in leave_one_out]  # type: ignore[arg-type]
    mean = math.fsum(values) / g
    return math.sqrt((g - 1) / g * math.fsum((v - mean) ** 2 for v in values))


def disagree(a: Cell, b: Cell, sigmas: float = SIGMAS) -> bool:
    """Whether two trainers' values differ beyond noise and beyond the keys' minimal practical difference."""
    if a.value is None or b.value is None or a.se is None or b.se is None or a.key is None or b.key is None:
        return False
    difference = abs(a.value - b.value)
    floor = max(min_difference_of(a.key, a.value) or 0.0, min_difference_of(b.key, b.value) or 0.0)
    return difference > sigmas * math.hypot(a.se, b.se) and difference > floor


def overflowed(notes: Sequence[str]) -> set[str]:
    """The keys the engine reports as non-finite: infinite ("KEY, KEY overflowed to infinity …") or undefined."""
    return {key.strip() for note in notes for suffix in (INFINITE_NOTE, UNDEFINED_NOTE)
            if note.endswith(" " + suffix) for key in note.removesuffix(" " + suffix).split(",")}


def _cells(columns: list[Trainer], results: Mapping[str, Any]) -> dict[str, dict[str, Cell]]:
    cells: dict[str, dict[str, Cell]] = {concept: {} for concept in CONCEPTS}
    for trainer in columns:
        result = results[trainer.name]
        metrics = result.overall.overall.metrics
        bad = overflowed(result.overall.overall.notes)
        for concept in CONCEPTS:
            key = trainer.concepts.get(concept)
            if key is None or key not in metrics:  # not logged under this column's settings
                cells[concept][trainer.name] = Cell(None, None, None)
                continue
            replicates = [None if r is None else r.metrics.get(key) for r in result.leave_one_out]
            cells[concept][trainer.name] = Cell(key, metrics[key], jackknife_se(metrics[key], replicates),
                                                nonfinite=metrics[key] is None and key in bad)
    return cells


def _side(trainer: Trainer, concept: str, cells: Mapping[str, Mapping[str, Cell]],
          resolved: Any) -> Side:
    cell = cells[concept][trainer.name]
    shares = [cells[c][trainer.name].value for c in ("truncated", "masked", "dropped")]
    return Side(trainer.name, cell.value, cell.key, trainer.form, estimator_of(resolved, trainer.traits),
                trainer.traits, trainer.settings, tuple(v for v in shares if v is not None), normalizes(resolved))


def _rows(columns: list[Trainer], results: Mapping[str, Any], corrections: Mapping[str, Any], facts: Any,
          sigmas: float) -> list[ConceptRow]:
    cells = _cells(columns, results)
    rows = []
    for concept, label in CONCEPTS.items():
        row = ConceptRow(concept, label, cells[concept])
        found = [(abs(row.cells[a.name].value - row.cells[b.name].value), a, b)  # type: ignore[operator]
                 for i, a in enumerate(columns) for b in columns[i + 1:]
                 if disagree(row.cells[a.name], row.cells[b.name], sigmas)]
        for _, a, b in found:
            row.cells[a.name].disagrees = row.cells[b.name].disagrees = True
        said = []
        broken = [t.name for t in columns if row.cells[t.name].nonfinite]
        if broken:
            said.append(nonfinite_text(label, broken, [row.cells[n].key or "" for n in broken], facts))
        if found:
            _, a, b = max(found, key=lambda p: p[0])
            said.append(explain(concept, label, _side(a, concept, cells, corrections[a.name]),
                                _side(b, concept, cells, corrections[b.name]), facts))
        row.why = "; ".join(said) or None
        rows.append(row)
    return rows


def _dump_report(files: Sequence[Any], results: Mapping[str, Any], corrections: Mapping[str, Any]) -> Report:
    """`analyze`'s report of the dump under its default (verl 0.9, no correction), from this replay's one read.

    A verl 0.9 column stands in for analyze's default run: its IS and RS deciders feed only the rounds and the
    older families' blocks (off here), so its off-policy, diagnostics and signature state is the default run's,
    and its metrics are the default run's plus the IS / RS families' keys, which are left out."""
    from mismatch_cli.api import build_report

    default = CorrectionConfig()
    name = DUMP if DUMP in results else next(n for n, c in corrections.items() if _stands_in(c))
    result = results[name].overall
    metrics = {k: v for k, v in result.overall.metrics.items()
               if (lookup(k) is None or lookup(k).family not in CORRECTION_FAMILIES)}  # type: ignore[union-attr]
    result = replace(result, overall=replace(result.overall, metrics=metrics))
    return build_report(files, {}, result, default, resolve(default), by_step=False)


def _stands_in(correction: Any) -> bool:
    """Whether a column's correction is a verl 0.8 / 0.9 one (verl's off-policy keys, no older family's blocks)."""
    return correction.family_spec is None and not correction.replay


def replay(paths: Sequence[str], names: Sequence[str] | None = None, read_options: ReadOptions | None = None,
           device: str = "auto", dtype: str = "float32", groups: int = GROUPS, sigmas: float = SIGMAS,
           read_workers: int = 2, settings: Mapping[str, Mapping[str, Any]] | None = None) -> ReplayReport:
    """Read the dumps once and replay every chosen trainer's correction over them, with jackknife noise.

    `settings` maps a column to the upstream fields it runs instead of its defaults (`{"skyrl": {"tis_ratio_type":
    "token"}}`), validated before anything is read."""
    with loading():  # torch is imported only when the replay really runs, with the cycle collector paused
        from mismatch_cli.engine.many import run_many

    columns, corrections = configure(choose_trainers(names), settings)
    engine_corrections = dict(corrections)
    if not any(_stands_in(c) for c in corrections.values()):
        engine_corrections[DUMP] = resolve(CorrectionConfig())  # analyze's default, on the same read
    read_options = read_options or ReadOptions()
    files = discover_inputs(paths, read_options.input_format)
    source_names = tuple(f.path for f in files)
    with closing(iter_batches(files, read_options, workers=read_workers)) as batches:
        results = run_many(batches, engine_corrections, device=device, dtype=dtype, groups=groups,
                           source_names=source_names)
    dump = _dump_report(files, results, corrections)
    first = results[columns[0].name]
    said: dict[str, list[str]] = {}  # a note -> the trainers it is about, so a shared note is said once
    for trainer in columns:
        notes = results[trainer.name].overall.overall.notes
        for note in [trainer.note if not trainer.changed else "", *notes]:
            if note:
                said.setdefault(note, []).append(trainer.name)
    notes = [f"{', '.join(who)}: {note}" for note, who in said.items()]
    # Trainers whose settings log none of the concepts (their corrections are off by default): one note, and
    # the table leaves their all-empty columns out.
    silent = [t.name for t in columns if t.name in REPLAY_FAMILIES
              and not any(key in results[t.name].overall.overall.metrics for key in t.concepts.values())]
    if silent:
        under = "these settings" if any(t.changed for t in columns if t.name in silent) else "their defaults"
        notes.append(f"{', '.join(silent)}: log none of these under {under} (their corrections are off; "
                     "docs/trainers.md); --set NAME.FIELD=VALUE turns one on")
    if first.groups < 2:
        notes.append(f"only {first.groups} of {groups} row groups hold a row: no noise estimate, nothing is marked")
    facts = dump_facts(dump.metrics, dtype)
    return ReplayReport(inputs=list(source_names), trainers=columns,
                        rows=_rows(columns, results, corrections, facts, sigmas), groups=first.groups,
                        sigmas=sigmas, device=first.overall.device, dtype=dtype, notes=notes, silent=silent,
                        dump=dump)
