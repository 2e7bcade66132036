"""Library entry points: `analyze(paths, ...) -> Report`, usable from a notebook as from the CLI."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import closing
from dataclasses import replace
from datetime import datetime, timezone
from typing import Any

from mismatch_cli.answers.diagnosis import diagnose
from mismatch_cli.answers.drift import drift
from mismatch_cli.answers.findings import find
from mismatch_cli.answers.findings.causes import few_tokens
from mismatch_cli.answers.health import summarize
from mismatch_cli.answers.hypotheses import hypotheses
from mismatch_cli.answers.recommend import recommend
from mismatch_cli.correction import CorrectionConfig, ResolvedCorrection, resolve, trainer_warnings
from mismatch_cli.engine.core.breakdown import MISSING_LABEL
from mismatch_cli.errors import UsageError
from mismatch_cli.io import InputFile, ReadOptions, discover_inputs, discovery_warnings, iter_item_batches
from mismatch_cli.io.discover import fingerprint_file
from mismatch_cli.io.early import EarlyReads, start_early_reads
from mismatch_cli.io.parallel import BackgroundHashes
from mismatch_cli.io.remote import is_remote
from mismatch_cli.processes import early_readers, gpu_may_decide, read_threads, resolve_jobs
from mismatch_cli.report import TOOL_NAME, InputSummary, Report
from mismatch_cli.system.numbers import parse_integer
from mismatch_cli.system.runtime import loading
from mismatch_cli.version import __version__

# Poisson-bootstrap replicates: every chunk builds [rows, K] weight temporaries of ~12 bytes per cell
# (1024-row chunks: ~120 MB at K = 10000, measured +130 MB RSS on a 4 M-token dump; a 4096-row block
# ~0.5 GB). 95 % percentile intervals gain nothing beyond a few thousand replicates.
MAX_BOOTSTRAP = 10_000
BOOTSTRAP_HINT = f"use 200 (the default), up to {MAX_BOOTSTRAP}, or 0 to turn the intervals off"


FULL_HASH_BYTES = 256 << 20  # inputs up to this size are hashed in full by default (report.inputs[].sha256)


def check_bootstrap(value: Any, name: str = "--bootstrap") -> int:
    """The number of bootstrap replicates, a whole number in 0..MAX_BOOTSTRAP; else a usage error (exit 2)."""
    return parse_integer(value, name, 0, MAX_BOOTSTRAP, BOOTSTRAP_HINT)


QUALITY_KEYS = (
    "nonfinite_tokens",
    "sentinel_tokens",
    "positive_logprob_tokens",
    "one_side_zero_tokens",
)
QUALITY_WARNINGS = {
    "nonfinite_tokens": "valid tokens with a NaN or infinite log-prob were excluded from every metric",
    "sentinel_tokens": "valid tokens with a sentinel log-prob (<= -9000, e.g. -9999 or -1e4) were excluded",
    "positive_logprob_tokens": "valid tokens have a log-prob > 0 (kept; a probability above 1 is a dump bug)",
    "one_side_zero_tokens": "valid tokens have a log-prob of exactly 0.0 on one side only "
    "(kept; a missing log-prob filled with 0, or a top-p / top-k nucleus of one token: see Dump checks)",
}


def analyze(
    paths: Sequence[str],
    correction: CorrectionConfig | None = None,
    read_options: ReadOptions | None = None,
    device: str = "auto",
    dtype: str = "float32",
    by_step: bool = False,
    group_by: Sequence[str] = (),
    hash_inputs: bool | None = None,
    rounds: bool = True,
    bootstrap: int = 200,
    read_workers: int | None = None,
    engine: str = "local",
    ray_address: str | None = None,
    on_batch: Callable[[Any], None] | None = None,
    jobs: int | None = None,
) -> Report:
    """Read dumps, run verl's rollout correction over them as one batch, and build the report.

    `on_batch`, when given, sees every Batch as it is read (e.g. to drive a progress bar). `jobs` worker
    processes analyze a CPU run's work items (None: the usable cores on a large input, else 1); every number is
    the same whatever `jobs` is; `read_workers` read-ahead threads feed one process where no reader processes do
    (io/early.py; None: half the usable cores, 2 to 8). `hash_inputs`: the SHA-256 of every local input (None:
    when they hold at most FULL_HASH_BYTES together; every local input always gets its cheap fingerprint).
    """
    correction = correction or CorrectionConfig()
    if not isinstance(correction, CorrectionConfig):
        raise UsageError(f"correction must be a CorrectionConfig, got {type(correction).__name__}",
                         hint="build one: CorrectionConfig(rollout_is='token', rollout_is_threshold=2.0)")
    read_options = read_options or ReadOptions()
    if not isinstance(read_options, ReadOptions):
        raise UsageError(f"read_options must be a ReadOptions, got {type(read_options).__name__}",
                         hint="build one: ReadOptions(columns={'old_log_probs': 'NAME'}, chunk_rows=1024)")
    resolved = resolve(correction)
    group_by = (group_by,) if isinstance(group_by, str) else group_by  # one column, not its letters
    # `--by step` is the per-step breakdown; any other name is a group column the readers attach.
    by_step = by_step or "step" in group_by
    group_by = tuple(column for column in dict.fromkeys(group_by) if column != "step")
    if group_by:
        read_options = replace(read_options, group_columns=tuple(dict.fromkeys([*read_options.group_columns,
                                                                                 *group_by])))
    bootstrap = check_bootstrap(bootstrap)
    files = discover_inputs(paths, read_options.input_format)
    # Hash in the background: hashlib releases the GIL, so this overlaps with decoding. Objects in an object
    # store are not hashed (that would download each one a second time); their sha256 stays null.
    local = [f.path for f in files if not is_remote(f.path)]
    if hash_inputs is None:  # in full up to FULL_HASH_BYTES; past it the fingerprint, off the critical path
        hash_inputs = sum(f.bytes for f in files if not is_remote(f.path)) <= FULL_HASH_BYTES
    hashes = BackgroundHashes(local) if hash_inputs else None
    names = tuple(f.path for f in files)
    try:
        if engine == "ray":
            from mismatch_cli.distributed import run_on_ray

            if device not in ("auto", "cpu"):
                raise UsageError(f"--engine ray runs the engine on the workers' CPUs, so --device {device} does not "
                                 "apply", hint="drop --device, or analyze on this machine (--engine local)")

            result = run_on_ray(files, read_options, resolved, dtype=dtype, by_step=by_step, rounds=rounds,
                                group_by=group_by, bootstrap=bootstrap, address=ray_address, source_names=names)
        elif engine == "local":
            result = _run_local(files, read_options, resolved, device, dtype, by_step, rounds, group_by, bootstrap,
                                read_workers or read_threads(), jobs, names, on_batch)
        else:
            raise UsageError(f"unknown engine '{engine}'", hint="use local or ray")
    except BaseException:
        if hashes is not None:
            hashes.cancel()
        raise
    digests = hashes.result() if hashes is not None else {}
    return build_report(files, digests, result, correction, resolved, by_step, group_by=group_by)


def _run_local(files: Sequence[InputFile], read_options: ReadOptions, resolved: ResolvedCorrection, device: str,
               dtype: str, by_step: bool, rounds: bool, group_by: tuple[str, ...], bootstrap: int, read_workers: int,
               jobs: int | None, names: tuple[str, ...], on_batch: Callable[[Any], None] | None) -> Any:
    """The local engine: worker processes, or this one (item by item on the CPU, streaming on a GPU)."""
    # Reader processes start before anything imports torch (io/early.py), to read while it loads.
    readers = start_early_reads(files, read_options, early_readers(jobs, files, device))
    try:
        return _run_here(files, read_options, resolved, device, dtype, by_step, rounds, group_by, bootstrap,
                         read_workers, jobs, names, on_batch, readers)
    finally:
        if readers is not None:
            readers.close()


def _run_here(files: Sequence[InputFile], read_options: ReadOptions, resolved: ResolvedCorrection, device: str,
              dtype: str, by_step: bool, rounds: bool, group_by: tuple[str, ...], bootstrap: int, read_workers: int,
              jobs: int | None, names: tuple[str, ...], on_batch: Callable[[Any], None] | None,
              readers: EarlyReads | None) -> Any:
    early = None
    if readers is None and gpu_may_decide(jobs, files, device):  # asking torch takes its import: read meanwhile
        early = iter_item_batches(files, read_options, workers=read_workers)
    try:
        processes = resolve_jobs(jobs, files, device)
    except BaseException:
        if early is not None:
            early.close()
        raise
    if processes > 1:
        from mismatch_cli.processes import run_on_processes

        if early is not None:
            early.close()  # no GPU after all: the read-ahead threads stop before the workers fork
        _load_engine()
        return run_on_processes(files, read_options, _spec(files, resolved, dtype, by_step, rounds, group_by,
                                                           bootstrap), processes, names, on_batch, readers)
    source = early or (readers.tagged(read_workers) if readers is not None else None)
    # closing(): an error in the engine stops the read-ahead threads now, not when the iterator is collected.
    with closing(source or iter_item_batches(files, read_options, workers=read_workers)) as tagged:
        # torch is imported only when analysis really runs, while the readers read the first batches
        _load_engine()
        from mismatch_cli.engine.distributed import fold_items
        from mismatch_cli.engine.runner import resolve_device, run

        spec = _spec(files, resolved, dtype, by_step, rounds, group_by, bootstrap)
        observed = _observed(tagged, on_batch) if on_batch is not None else tagged
        if resolve_device(device).type == "cpu":
            return fold_items(observed, spec, names)
        # On a GPU the batches of one file join into large device chunks across work items.
        return run((batch for _, batch in observed), resolved, device=device, dtype=dtype, by_step=by_step,
                   source_names=names, rounds=rounds, group_by=group_by, bootstrap=bootstrap, fused=spec.fused)


def _load_engine() -> None:
    """Import the engine and torch (about 1.5 s) with the cycle collector paused (system/runtime.py says why)."""
    with loading():
        import mismatch_cli.engine.distributed  # noqa: F401


def _spec(files: Sequence[InputFile], resolved: ResolvedCorrection, dtype: str, by_step: bool, rounds: bool,
          group_by: tuple[str, ...], bootstrap: int) -> Any:
    """What every partial state of this run is built with (the fused CPU sweep where the input is large enough)."""
    from mismatch_cli.engine.kernels.sweep import worth_it
    from mismatch_cli.engine.partial import PartialSpec

    return PartialSpec(resolved, dtype, by_step, rounds, tuple(group_by), bootstrap,
                       fused=worth_it(sum(f.bytes for f in files)))


def _observed(tagged: Any, on_batch: Callable[[Any], None]) -> Iterator[Any]:
    for index, batch in tagged:
        on_batch(batch)
        yield index, batch


def build_report(
    files: Sequence[InputFile],
    digests: dict[str, str],
    result: Any,
    correction: CorrectionConfig,
    resolved: ResolvedCorrection,
    by_step: bool,
    group_by: Sequence[str] = (),
) -> Report:
    """Assemble the report from the engine's result (no computation over tokens happens here)."""
    inputs = []
    for f in files:
        stats = result.sources.get(f.path)
        quality = stats.quality if stats else {}
        valid = quality.get("masked_tokens", 0) - quality.get("nonfinite_tokens", 0) - quality.get(
            "sentinel_tokens", 0
        )
        inputs.append(
            InputSummary(
                path=f.path,
                format=f.format,
                bytes=f.bytes,
                sha256=digests.get(f.path),
                fingerprint=None if is_remote(f.path) else fingerprint_file(f.path),
                sequences=stats.sequences if stats else 0,
                tokens=valid,
            )
        )
    said = trainer_warnings(correction)  # the trainer's own warnings about the fields given: they lead the screen
    warnings = [*said, *_warnings(result, resolved, by_step)]
    data_quality = _data_quality(result, files)
    for key in QUALITY_KEYS:
        count = data_quality["totals"].get(key, 0)
        if count:
            warnings.append(f"{count} {QUALITY_WARNINGS[key]}{_first_example(data_quality, key)}")
    warnings.extend(discovery_warnings(files))
    groups = _groups(result, group_by)
    for column, entries in groups.items():
        warnings.extend(f"{column}={entry['group']}: {note}" for entry in entries for note in entry["notes"])
    config = {**correction.to_dict(), "device": result.device, "dtype": result.dtype, "by_step": by_step,
              "group_by": list(group_by)}
    few = few_tokens(getattr(result.overall, "signatures", {}))
    steps = [
        {
            "step": step,
            "valid_tokens": batch.valid_tokens,
            "metrics": batch.metrics,
            "rounds": batch.rounds,
            "notes": batch.notes,
        }
        for step, batch in result.steps.items()
    ]
    report = Report(
        tool={"name": TOOL_NAME, "version": __version__},
        created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        inputs=inputs,
        config=config,
        metrics=result.overall.metrics,
        summary=summarize(result.overall.metrics, config, result.overall.what_if, few),
        steps=steps,
        groups=groups,
        rounds=result.overall.rounds,
        rounds_from_end=result.overall.rounds_from_end,
        quantiles=result.overall.quantiles,
        histograms=result.overall.histograms,
        worst_sequences=result.overall.worst_sequences,
        what_if=result.overall.what_if,
        intervals=result.overall.intervals,
        data_quality=data_quality,
        warnings=warnings,
        recommendation=recommend(result.overall.metrics, config, result.overall.what_if, few),
        drift=drift(steps),
    )
    table = getattr(result.overall, "signatures", {})
    report.findings = [f.to_dict() for f in find(report, table)]
    report.summary, report.recommendation = diagnose(report.summary, report.recommendation, report.findings,
                                                      report.config)
    report.summary["causes"] = hypotheses(report.findings, report.metrics, table, report.summary["diagnosis"])
    if said:
        report.summary["setting_warnings"] = said
    return report


def _groups(result: Any, group_by: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
    """`--by COLUMN` results as the report stores them: one entry per value, like `steps`."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for column in group_by:
        groups[column] = [
            {
                "group": None if label == MISSING_LABEL else label,  # a missing value: null, apart from "null"
                "valid_tokens": batch.valid_tokens,
                "metrics": batch.metrics,
                "rounds": batch.rounds,
                "notes": batch.notes,
            }
            for label, batch in getattr(result, "groups", {}).get(column, {}).items()
        ]
    return groups


def _first_example(data_quality: dict[str, Any], key: str) -> str:
    for counts in data_quality["files"].values():
        examples = counts.get("examples", {}).get(key)
        if examples:
            first = examples[0]
            return f" (first: {first['file']} row {first['row']} position {first['position']})"
    return ""


def _data_quality(result: Any, inputs: Sequence[InputFile] = ()) -> dict[str, Any]:
    """Totals and per-file counts; each file also lists its first flagged tokens and its notes."""
    totals: dict[str, int] = {}
    files: dict[str, dict[str, Any]] = {}
    notes = {f.path: list(f.notes) for f in inputs if f.notes}
    for path, stats in result.sources.items():
        files[path] = dict(stats.quality)
        if getattr(stats, "examples", None):
            files[path]["examples"] = {key: list(stats.examples[key]) for key in QUALITY_KEYS if key in stats.examples}
        if path in notes:
            files[path]["notes"] = notes[path]
        for key, value in stats.quality.items():
            totals[key] = totals.get(key, 0) + value
    totals["excluded_tokens"] = totals.get("nonfinite_tokens", 0) + totals.get("sentinel_tokens", 0)
    totals["empty_rows"] = int(result.overall.metrics.get("diag/empty_rows") or 0)
    return {"totals": totals, "files": files}


def _warnings(result: Any, resolved: ResolvedCorrection, by_step: bool) -> list[str]:
    warnings: list[str] = []
    for option in resolved.asymmetric_k1:
        if resolved.k1_bounds == "verl":
            warnings.append(
                f"{option.name} with asymmetric bounds {option.lower}_{option.upper}: verl compares "
                f"k1 = -log(ratio) with [log L, log U], so it keeps ratios in [{1 / option.upper:.7g}, "
                f"{1 / option.lower:.7g}], not [{option.lower}, {option.upper}]; reproduced as verl does "
                "(use --k1-bounds ratio for the intended rule)"
            )
    for note in result.overall.notes:
        warnings.append(f"overall: {note}")
    if by_step and not result.steps:
        warnings.append("--by step: the input has no step column or metadata, so no per-step table was made")
    for step, batch in result.steps.items():
        for note in batch.notes:
            warnings.append(f"step {step}: {note}")
    return warnings
