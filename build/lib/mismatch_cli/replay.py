"""`replay(paths) -> ReplayReport`: one dump, every trainer under its defaults, concept by concept, with noise.

Columns: verl (its documented token TIS: its defaults turn no IS on), xtuner (its defaults) and every replayed
trainer of `REPLAY_FAMILIES` (its defaults). Rows: `CONCEPTS`, each read from the key the trainer logs for it.
All trainers fold the same chunks of ONE read (`engine.many.run_many`). Noise: a delete-a-group jackknife over
`GROUPS` row groups (row index in its file modulo GROUPS). Two trainers disagree on a concept when their values
differ by more than `SIGMAS` combined standard errors and by more than the keys' minimal practical difference;
the trainers' traits that differ say why (docs/replay.md).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from contextlib import closing
from dataclasses import dataclass, field
from typing import Any

from mismatch_cli.correction import CONCEPTS, REPLAY_FAMILIES, TRAITS, resolve_family
from mismatch_cli.correction.older import XTUNER_CONCEPTS, XTUNER_TRAITS
from mismatch_cli.correction.verl import VERL_CONCEPTS, VERL_REPLAY_FIELDS, VERL_REPLAY_NOTE, VERL_TRAITS
from mismatch_cli.errors import UsageError, did_you_mean
from mismatch_cli.gate.noise import min_difference_of
from mismatch_cli.io import ReadOptions, discover_inputs, iter_batches
from mismatch_cli.report import SCHEMA_VERSION, TOOL_NAME
from mismatch_cli.version import __version__

GROUPS = 10  # jackknife row groups
SIGMAS = 3.0  # a disagreement is beyond SIGMAS combined jackknife standard errors
# The traits that can explain a disagreement on each concept, most likely first.
REASONS: dict[str, tuple[str, ...]] = {
    "abs_diff": ("reduction", "threshold"),  # a rejection that drops tokens changes which |d| are averaged
    "kl": ("estimator", "reduction", "clamp"),
    "chi2": ("clamp", "reduction"),
    "weight_mean": ("sequence", "threshold", "clamp", "reduction"),
    "truncated": ("threshold", "sequence", "reduction"),
    "masked": ("threshold", "sequence", "reduction"),
    "dropped": ("threshold", "sequence", "reduction"),
}


@dataclass(frozen=True)
class Trainer:
    """One column: a trainer under its defaults, the keys it logs for the concepts, and its traits."""

    name: str
    title: str
    fields: Mapping[str, Any]  # the upstream fields the column runs (its defaults, or verl's TIS)
    concepts: Mapping[str, str]
    traits: Mapping[str, str]
    note: str = ""


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


def choose_trainers(names: Sequence[str] | None) -> list[str]:
    """The columns asked for (all, in the default order, when none); UsageError naming the known ones."""
    known = trainers()
    if names is None:
        return list(known)
    if not names:
        raise UsageError("--trainers names no trainer", hint=f"name some of {', '.join(known)}, or drop --trainers")
    chosen: list[str] = []
    for name in names:
        if name not in known:
            raise UsageError(f"--trainers: unknown trainer '{name}'",
                             hint=did_you_mean(name, tuple(known), f"use some of {', '.join(known)}"))
        if name not in chosen:
            chosen.append(name)
    return chosen


@dataclass
class Cell:
    """One trainer's value of one concept: its key (None: the trainer logs none), value, jackknife SE."""

    key: str | None  # None: the trainer logs no key for the concept under this column's settings
    value: float | None  # None: logged but undefined (overflow, no token)
    se: float | None
    disagrees: bool = False

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {"key": self.key, "value": self.value, "se": self.se, "disagrees": self.disagrees}


@dataclass
class ConceptRow:
    """One concept across the trainers, and why they disagree (None when they do not)."""

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
    """`mismatch replay`'s result: the trainers (columns), the concepts (rows) and the notes."""

    inputs: list[str]
    trainers: list[Trainer]
    rows: list[ConceptRow]
    groups: int
    sigmas: float = SIGMAS
    device: str = "cpu"
    dtype: str = "float32"
    notes: list[str] = field(default_factory=list)
    silent: list[str] = field(default_factory=list)  # trainers that log none of the concepts under their defaults

    @property
    def shown(self) -> list[Trainer]:
        """The trainers the table shows: all but the silent ones (JSON keeps every trainer)."""
        return [t for t in self.trainers if t.name not in self.silent] or list(self.trainers)

    def to_dict(self) -> dict[str, Any]:
        """The versioned JSON document (`schema_version` first, like every JSON the tool writes)."""
        return {
            "schema_version": SCHEMA_VERSION,
            "kind": "replay",
            "tool": {"name": TOOL_NAME, "version": __version__},
            "inputs": list(self.inputs),
            "noise": {"method": "delete-a-group jackknife", "groups": self.groups, "sigmas": self.sigmas},
            "device": self.device,
            "dtype": self.dtype,
            "trainers": [{"name": t.name, "title": t.title, "fields": dict(t.fields), "note": t.note,
                          "traits": dict(t.traits)} for t in self.trainers],
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


def why(concept: str, first: Trainer, second: Trainer) -> str:
    """One line: the trait that most likely explains why two trainers disagree on a concept."""
    order = [*REASONS.get(concept, ()), *(t for t in TRAITS if t not in REASONS.get(concept, ()))]
    differing = [t for t in order if t in first.traits and t in second.traits  # traits both state
                 and first.traits[t] != second.traits[t]]
    label = CONCEPTS[concept]
    if not differing:
        return (f"{label}: {first.name} and {second.name} state the same traits: the keys' formulas differ "
                "(docs/replay.md)")
    trait = differing[0]
    also = f" (also {', '.join(differing[1:])} differ)" if len(differing) > 1 else ""
    return (f"{label}, {trait}{also}: {first.name} {first.traits.get(trait, 'unstated')}; "
            f"{second.name} {second.traits.get(trait, 'unstated')}")


def _rows(columns: list[Trainer], results: Mapping[str, Any], sigmas: float) -> list[ConceptRow]:
    rows = []
    for concept, label in CONCEPTS.items():
        cells: dict[str, Cell] = {}
        for trainer in columns:
            key = trainer.concepts.get(concept)
            result = results[trainer.name]
            metrics = result.overall.overall.metrics
            if key is None or key not in metrics:  # not logged under this column's settings
                cells[trainer.name] = Cell(None, None, None)
                continue
            replicates = [None if r is None else r.metrics.get(key) for r in result.leave_one_out]
            cells[trainer.name] = Cell(key, metrics[key], jackknife_se(metrics[key], replicates))
        row = ConceptRow(concept, label, cells)
        pairs = [(abs(cells[a.name].value - cells[b.name].value), a, b)  # type: ignore[operator]
                 for i, a in enumerate(columns) for b in columns[i + 1:]
                 if disagree(cells[a.name], cells[b.name], sigmas)]
        for _, a, b in pairs:
            cells[a.name].disagrees = cells[b.name].disagrees = True
        if pairs:
            _, a, b = max(pairs, key=lambda p: p[0])
            row.why = why(concept, a, b)
        rows.append(row)
    return rows


def replay(paths: Sequence[str], names: Sequence[str] | None = None, read_options: ReadOptions | None = None,
           device: str = "auto", dtype: str = "float32", groups: int = GROUPS, sigmas: float = SIGMAS,
           read_workers: int = 2) -> ReplayReport:
    """Read the dumps once and replay every chosen trainer's default correction over them, with jackknife noise."""
    from mismatch_cli.engine.many import run_many  # torch is imported only when the replay really runs

    columns = [trainers()[name] for name in choose_trainers(names)]
    resolved = {t.name: resolve_family(t.name, dict(t.fields)) for t in columns}
    corrections = {name: correction for name, (correction, _) in resolved.items()}
    read_options = read_options or ReadOptions()
    files = discover_inputs(paths, read_options.input_format)
    source_names = tuple(f.path for f in files)
    with closing(iter_batches(files, read_options, workers=read_workers)) as batches:
        results = run_many(batches, corrections, device=device, dtype=dtype, groups=groups,
                           source_names=source_names)
    first = next(iter(results.values()))
    said: dict[str, list[str]] = {}  # a note -> the trainers it is about, so a shared note is said once
    for trainer in columns:
        for note in [trainer.note, *results[trainer.name].overall.overall.notes]:
            if note:
                said.setdefault(note, []).append(trainer.name)
    notes = [f"{', '.join(names)}: {note}" for note, names in said.items()]
    # Trainers whose defaults log none of the concepts (their corrections are off by default): one note, and
    # the table leaves their all-empty columns out.
    silent = [t.name for t in columns if t.name in REPLAY_FAMILIES
              and not any(key in results[t.name].overall.overall.metrics for key in t.concepts.values())]
    if silent:
        notes.append(f"{', '.join(silent)}: log none of these under their defaults (their corrections are off; "
                     "docs/trainers.md); analyze --semantics NAME --set FIELD=VALUE turns one on")
    if first.groups < 2:
        notes.append(f"only {first.groups} of {groups} row groups hold a row: no noise estimate, nothing is marked")
    return ReplayReport(inputs=list(source_names), trainers=columns, rows=_rows(columns, results, sigmas),
                        groups=first.groups, sigmas=sigmas, device=first.overall.device, dtype=dtype,
                        notes=notes, silent=silent)
