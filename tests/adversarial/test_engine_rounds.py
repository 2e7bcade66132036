"""Rows whose mask alternates 1,0,1,0 (a round per token) cost memory linear in tokens, and their numbers are right."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from mismatch_cli.batch import Batch
from mismatch_cli.correction import CorrectionConfig, resolve
from mismatch_cli.engine.kernels.sketch import bucket_midpoints
from mismatch_cli.engine.runner import run

ROOT = Path(__file__).resolve().parents[2]
GIB = 1 << 30

# Runs `mismatch ARGS` in a fresh child and prints the child's peak RSS (KiB): RUSAGE_CHILDREN of this
# wrapper sees only that child, never an earlier test's.
PEAK_RSS = """
import resource, subprocess, sys
code = subprocess.run([sys.executable, "-m", "mismatch_cli", *sys.argv[1:]], capture_output=True).returncode
print(code, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
"""


def alternating_dump(path: Path, rows: int, tokens: int) -> None:
    """`rows` rows of `tokens` positions each, mask 1,0,1,0,...: tokens / 2 one-token rounds per row."""
    rng = np.random.default_rng(0)
    rollout = [(-rng.exponential(0.5, tokens)).astype(np.float32) for _ in range(rows)]
    old = [(r + rng.normal(0.0, 0.05, tokens)).astype(np.float32) for r in rollout]
    mask = [(np.arange(tokens) % 2 == 0).astype(np.int8) for _ in range(rows)]
    pq.write_table(pa.table({"old_log_probs": old, "rollout_log_probs": rollout, "response_mask": mask}), path)


def test_400k_alternating_tokens_run_in_bounded_memory(tmp_path: Path) -> None:
    dump = tmp_path / "alternating.parquet"
    alternating_dump(dump, rows=8, tokens=50_000)  # 25,000 rounds per row (this crashed at 4 GB per 10k tokens)
    out = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-c", PEAK_RSS, "analyze", str(dump), "--format", "json", "-o", str(out), "--bootstrap", "0"],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
    )
    code, peak_kib = (int(x) for x in proc.stdout.split())
    assert code == 0, proc.stderr
    assert peak_kib * 1024 < 1.5 * GIB, f"peak RSS {peak_kib / 1024:.0f} MiB"
    report = json.loads(out.read_text())
    assert report["metrics"]["per_round/total_rounds"] == 25_000
    assert len(report["rounds"]) == len(report["rounds_from_end"]) == 25_000
    assert all(entry["tokens"] == 8 and entry["rows"] == 8 for entry in report["rounds"])


def numpy_rounds(old: np.ndarray, rollout: np.ndarray, mask: np.ndarray, offsets: np.ndarray) -> dict[str, list]:
    """Per-round tokens, rows, mean |d|, kl and the sketch's p99, from the start and the end (plain numpy)."""
    groups: dict[str, dict[int, list[np.ndarray]]] = {"start": {}, "end": {}}
    for a, b in zip(offsets[:-1], offsets[1:], strict=True):
        m = np.concatenate(([0], mask[a:b].astype(np.int8), [0]))
        starts, ends = np.flatnonzero(np.diff(m) == 1) + a, np.flatnonzero(np.diff(m) == -1) + a
        for k, (s, e) in enumerate(zip(starts, ends, strict=True)):
            d = old[s:e] - rollout[s:e]
            groups["start"].setdefault(k, []).append(d)
            groups["end"].setdefault(len(starts) - 1 - k, []).append(d)
    out = {}
    for table, entries in groups.items():
        rows = []
        for k in sorted(entries):
            d = np.concatenate(entries[k])
            # The sketch reports each |d| as its float32 bucket's midpoint, then interpolates as numpy does.
            midpoints = bucket_midpoints(np.abs(d).astype(np.float32).view(np.int32) >> 16)
            rows.append({"rows": len(entries[k]), "tokens": d.size, "abs_diff_mean": np.abs(d).mean(),
                         "kl": (-d).mean(), "abs_diff_p99": float(np.quantile(midpoints, 0.99))})
        out[table] = rows
    return out


def test_many_rounds_per_row_match_a_numpy_reference(separate_chunks: None) -> None:
    rng = np.random.default_rng(3)
    lengths = rng.integers(1, 160, size=30)
    offsets = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
    total = int(offsets[-1])
    rollout = -rng.exponential(0.4, total)
    old = rollout + rng.normal(0.0, 0.1, total)
    mask = (np.arange(total) % 2 == 0) | (rng.random(total) < 0.2)  # up to ~80 rounds per row, uneven runs
    batch = Batch(old, rollout, mask, offsets, source="alternating")
    correction = resolve(CorrectionConfig())
    cuts = [0, 7, 8, 19, 30]  # several chunks: the sparse round sketches merge across them
    parts = [batch.slice_rows(a, b) for a, b in zip(cuts[:-1], cuts[1:], strict=True)]
    result = run(parts, correction, device="cpu", dtype="float64", bootstrap=0)
    want = numpy_rounds(old, rollout, mask, offsets)
    assert len(want["start"]) > 20  # far beyond the dense sketch rows
    for table, got in (("start", result.overall.rounds), ("end", result.overall.rounds_from_end)):
        assert len(got) == len(want[table])
        for ours, theirs in zip(got, want[table], strict=True):
            assert ours["rows"] == theirs["rows"] and ours["tokens"] == theirs["tokens"]
            for key in ("abs_diff_mean", "kl", "abs_diff_p99"):
                assert abs(ours[key] - theirs[key]) <= 1e-12 * abs(theirs[key]) + 1e-15, (table, key)


def test_tables_and_plots_show_a_bounded_number_of_rounds() -> None:
    from mismatch_cli.render.sections import SHOWN_ROUNDS, rounds_by_step_section, rounds_section
    from mismatch_cli.report import Report

    rounds = [{"round": k, "rows": 1, "tokens": 1, "abs_diff_mean": 0.01 * (k == 4000)} for k in range(5000)]
    report = Report(tool={}, created_at="", inputs=[], config={}, metrics={"rollout_corr/kl": 0.0}, rounds=rounds,
                    steps=[{"step": 0, "rounds": rounds}])
    section = rounds_section(report)
    assert len(section.columns) == 1 + SHOWN_ROUNDS + 1  # the first rounds, then the worst one
    assert section.columns[-1] == "r4000 *"
    assert "4976 more rounds in report.json" in section.note
    assert len(rounds_by_step_section(report).columns) == 1 + SHOWN_ROUNDS
    from mismatch_cli.gate.comparison import compare_reports
    from mismatch_cli.render.compare import round_cells

    cells = round_cells(compare_reports(report, report))
    assert len(cells) == SHOWN_ROUNDS + 1 and "+4976 more" in cells[-1][1]
