"""Issue 34, item 8: the docs' examples run as written.

Every `mismatch ...` line of a ```bash / ```sh block in README.md and docs/*.md (`\\` continuations
joined) is run word for word through the CLI, in process (`CliRunner` on `mismatch_cli.cli.app`). The
lines of one block run in order in a fresh temporary folder, since a later line reads what an earlier one
wrote (`synth run.parquet`, then `analyze run.parquet`; `analyze dumps/ --out-dir ci/`, then
`check ... --baseline ci/report.json`). The folder links `sample_data` to the repository's, so
`sample_data/...` resolves as from the repository root, and holds stand-ins for the inputs the docs take
as the reader's own (`dumps/`, `vllm_run/`, `fp32.parquet`, `run/token_exports`, ...): copies of the
bundled real-model dumps (`sample_data/real/`), or those dumps rewritten in the layout the name implies
(`step_N.safetensors` as formats.md §11 writes them, xtuner packs, prime-rl token exports). A stand-in
is put only where the block reads it and no earlier line of the block writes it, so a block that reads
a file it never makes fails here as it would for a reader who copies it.

A `> FILE` redirect writes the standard output to FILE; a trailing `# comment` is dropped. A line passes
with exit code 0, or 1 for a `check` / `compare` with `--fail-on` (a breach is the documented answer).

docs/python-api.md's ```python cells run in order in one namespace, in such a folder too: its paths are
the repository root's, and only the names it takes as the reader's own (`dumps/`, `LOG_DIR/`, the
tensors `old`, `rollout`, `mask`, a verl `batch`, ...) get stand-ins. The cells that subclass a trainer
class import a framework the suite does not install (TRL, SkyRL, AReaL, ms-swift): they are compiled,
not run.
"""

from __future__ import annotations

import re
import shlex
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from safetensors.numpy import save_file
from test_readme_walkthrough import SECTIONS, readme_commands
from typer.testing import CliRunner

from mismatch_cli import CorrectionConfig, analyze
from mismatch_cli.cli import app

sys.path.append(str(Path(__file__).resolve().parent / "io"))  # the dump writers live next to the reader tests
from framework_dumps import Seq, write_nemo, write_prime  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
API_PAGE = ROOT / "docs" / "python-api.md"
REAL = ROOT / "sample_data" / "real"
ARMS = ("fp32", "bf16", "fp16", "fp8")
# A real-model dump (bf16 engine, fp32 trainer, two steps of 40 sequences) stands in for "a run's dump".
RUN = REAL / "bf16.parquet"
# The names python-api.md takes as the reader's own; everything else it reads is the repository's.
API_STANDINS = ("dumps", "run", "LOG_DIR", "base", "cand")
# Modules of the trainer frameworks python-api.md's integration cells import; those cells are compiled only.
FRAMEWORKS = ("trl", "skyrl", "areal", "swift")
# Flags whose value is a path a line writes.
OUTPUT_FLAGS = ("--out-dir", "-o", "--output", "--html")
WALKTHROUGH = SECTIONS  # the README sections test_readme_walkthrough.py runs as written


# ------------------------------------------------------------------------------------------- the examples


@dataclass(frozen=True)
class Block:
    """One ```bash / ```sh block: its page, the line its fence opens on and its `mismatch` lines, in order."""

    page: str
    line: int
    commands: tuple[str, ...]

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def _fenced(text: str, language: str) -> list[tuple[int, str]]:
    """(line of the opening fence, body) of every ```LANGUAGE block of a Markdown page."""
    return [(text.count("\n", 0, m.start()) + 1, m[1])
            for m in re.finditer(rf"^```(?:{language})\n(.*?)^```", text, flags=re.M | re.S)]


def doc_blocks() -> list[Block]:
    """Every shell block of README.md and docs/*.md with at least one `mismatch` line, but the README's walk-through
    sections, which tests/test_readme_walkthrough.py runs in order, word for word."""
    blocks = []
    for page in PAGES:
        text = page.read_text()
        for line, body in _fenced(text, "bash|sh"):
            if page.name == "README.md" and _section(text, line) in WALKTHROUGH:
                continue
            lines = body.replace("\\\n", " ").splitlines()
            commands = tuple(" ".join(text.split()) for text in lines if text.strip().startswith("mismatch "))
            if commands:
                blocks.append(Block(str(page.relative_to(ROOT)), line, commands))
    return blocks


def _section(text: str, line: int) -> str:
    """The `## ` heading a line of a Markdown page sits under."""
    headings = [row[3:].strip() for row in text.splitlines()[:line] if row.startswith("## ")]
    return headings[-1] if headings else ""


BLOCKS = doc_blocks()


def test_the_docs_have_their_examples() -> None:
    # A fence pattern that silently matched nothing would let every test below pass.
    assert sum(len(block.commands) for block in BLOCKS) + len(readme_commands()) >= 39
    assert {"docs/commands.md", "docs/ci.md", "docs/report.md", "docs/trainers.md"} <= {block.page for block in BLOCKS}
    assert readme_commands()  # the README's own run in test_readme_walkthrough.py
    assert len(_fenced(API_PAGE.read_text(), "python")) >= 10


def _words(command: str) -> tuple[list[str], str | None]:
    """The arguments after `mismatch` (a trailing `# comment` dropped) and the FILE of a `> FILE` redirect."""
    words = shlex.split(command, comments=True)
    assert words[0] == "mismatch", command
    redirect = None
    if ">" in words:
        at = words.index(">")
        redirect = words[at + 1]
        words = words[:at] + words[at + 2:]
    return words[1:], redirect


def _top(path: str) -> str:
    """The first component of a relative path: the file or folder a stand-in is put as."""
    return Path(path).parts[0] if path else path


def _reads_and_writes(args: list[str], redirect: str | None) -> tuple[set[str], set[str]]:
    """The top-level names a line reads and those it writes (synth's output, `--out-dir`, `-o`, `--html`, `> FILE`)."""
    outputs = {i + 1 for i, flag in enumerate(args[:-1]) if flag in OUTPUT_FLAGS}
    if args[0] == "synth":
        outputs.add(next(i for i, arg in enumerate(args) if i and not arg.startswith("-")))
    writes = {_top(args[i]) for i in outputs} | ({_top(redirect)} if redirect else set())
    reads = {_top(arg) for i, arg in enumerate(args) if i and i not in outputs and not arg.startswith("-")}
    return reads, writes


def _allowed(args: list[str]) -> set[int]:
    """The exit codes a documented line may end with: 1 too for a gate with `--fail-on` (a breach is its answer)."""
    gate = args[0] in ("check", "compare") and any(a == "--fail-on" or a.startswith("--fail-on=") for a in args)
    return {0, 1} if gate else {0}


# ------------------------------------------------------------------------------------------- stand-ins


def _rows(table: pa.Table) -> list[tuple[list[float], list[float], list[int], int]]:
    """(old, rollout, mask, step) of every row of a wide parquet dump."""
    return list(zip(*(table.column(name).to_pylist()
                      for name in ("old_log_probs", "rollout_log_probs", "response_mask", "step")), strict=True))


def _padded(rows) -> dict[str, np.ndarray]:
    """Rows right-padded to `[B, T]` float32 / int8 arrays (the padding masked out), as verl holds them."""
    width = max(len(old) for old, *_ in rows)
    arrays = {"old_log_probs": np.zeros((len(rows), width), np.float32),
              "rollout_log_probs": np.zeros((len(rows), width), np.float32),
              "response_mask": np.zeros((len(rows), width), np.int8)}
    for i, (old, rollout, mask, _) in enumerate(rows):
        arrays["old_log_probs"][i, :len(old)] = old
        arrays["rollout_log_probs"][i, :len(old)] = rollout
        arrays["response_mask"][i, :len(old)] = mask
    return arrays


def _step_files(folder: Path, rows) -> None:
    """`folder/step_N.safetensors`, one padded file per step, as formats.md §11's `dump_mismatch` writes them."""
    folder.mkdir()
    for step in sorted({row[3] for row in rows}):
        save_file(_padded([row for row in rows if row[3] == step]), str(folder / f"step_{step}.safetensors"),
                  metadata={"step": str(step)})


def _pack(path: Path, rows) -> None:
    """An xtuner pack: `[1, N]` tensors holding the sequences back to back, with `num_tokens` `[B]`."""
    save_file({"old_log_probs": np.array([sum((row[0] for row in rows), [])], np.float32),
               "rollout_log_probs": np.array([sum((row[1] for row in rows), [])], np.float32),
               "response_mask": np.array([sum((row[2] for row in rows), [])], np.int8),
               "num_tokens": np.array([len(row[0]) for row in rows], np.int64)}, str(path))


def make_standins(folder: Path) -> None:
    """Every stand-in, each under its top-level name in `folder` (see the module docstring)."""
    run = pq.read_table(RUN)
    rows = _rows(run)
    for arm in ARMS:  # the precision arms
        shutil.copy(REAL / f"{arm}.parquet", folder / f"{arm}.parquet")
    for name in ("step_12", "step_80", "step_120", "dump"):  # "a run's dump"
        shutil.copy(RUN, folder / f"{name}.parquet")
    for side, arm in (("vllm_run", "bf16"), ("sglang_run", "fp16")):  # one run per engine
        (folder / side).mkdir()
        shutil.copy(REAL / f"{arm}.parquet", folder / side / "run.parquet")
    _step_files(folder / "dumps", rows)
    # a run whose trainer names its mask `loss_mask` (commands.md's `--column response_mask=loss_mask`)
    pq.write_table(run.rename_columns(["loss_mask" if c == "response_mask" else c for c in run.column_names]),
                   folder / "run.parquet")
    half = len(rows) // 2
    _pack(folder / "pack_000.safetensors", rows[:half])
    _pack(folder / "pack_001.safetensors", rows[half:])
    seqs = [Seq(old, rollout, mask, prompt=3, env=("math", "code")[i % 2], step=step)
            for i, (old, rollout, mask, step) in enumerate(rows)]
    steps = sorted({seq.step for seq in seqs})
    for step in steps:  # prime-rl's token exports, two ranks per step; NeMo-RL's train-data logs
        for rank in (0, 1):
            write_prime(str(folder / "run" / "token_exports"), step, rank,
                        [s for i, s in enumerate(seqs) if s.step == step and i % 2 == rank])
        write_nemo(str(folder / "LOG_DIR" / f"train_data_step{step}.jsonl"), [s for s in seqs if s.step == step])
    # docs/replay.md's example replay.toml, as that page shows it
    toml = [body for _, body in _fenced((ROOT / "docs" / "replay.md").read_text(), "toml") if "[replay-" in body]
    (folder / "replay.toml").write_text(toml[0] if toml else "")
    # a CI baseline of `dumps/` (commands.md's `check` takes one as given), and two reports to compare
    for name, dump, preset in (("ci", folder / "dumps", "decoupled_geo_rs_token_tis"),
                               ("base", REAL / "fp32.parquet", None), ("cand", REAL / "bf16.parquet", None)):
        (folder / name).mkdir()
        report = analyze([str(dump)], CorrectionConfig(preset=preset), by_step=True, bootstrap=50)
        (folder / name / "report.json").write_text(report.to_json())


@pytest.fixture(scope="session")
def standins(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("standins")
    make_standins(folder)
    return folder


def _stage(standins: Path, folder: Path, names) -> None:
    """A fresh `folder` holding `sample_data` (a link) and copies of the stand-ins `names`."""
    folder.mkdir()
    (folder / "sample_data").symlink_to(ROOT / "sample_data", target_is_directory=True)
    for name in names:
        source = standins / name
        if source.is_dir():
            shutil.copytree(source, folder / name)
        else:
            shutil.copy(source, folder / name)


def _needed(block: Block, standins: Path) -> set[str]:
    """The stand-ins a block reads before any of its lines writes them."""
    available = {path.name for path in standins.iterdir()}
    needed, written = set(), set()
    for command in block.commands:
        reads, writes = _reads_and_writes(*_words(command))
        needed |= (reads & available) - written
        written |= writes
    return needed


# ------------------------------------------------------------------------------------------- the tests


runner = CliRunner()


@pytest.mark.parametrize("block", BLOCKS, ids=[block.id for block in BLOCKS])
def test_the_example_runs_as_written(block: Block, standins: Path, tmp_path: Path, monkeypatch) -> None:
    _stage(standins, tmp_path / "work", _needed(block, standins))
    monkeypatch.chdir(tmp_path / "work")
    monkeypatch.setenv("COLUMNS", "100")
    for command in block.commands:
        args, redirect = _words(command)
        try:
            result = runner.invoke(app, args, catch_exceptions=False)
        except Exception as exc:  # a crash, not an exit code: a bug in the code, not in the docs
            raise AssertionError(f"{block.id}: `{command}` raised {exc!r}") from exc
        assert result.exit_code in _allowed(args), (
            f"{block.id}: `{command}` exited {result.exit_code}:\n{result.output}")
        if redirect is not None:
            Path(redirect).write_text(result.stdout)


def _api_namespace() -> dict:
    """The reader's own tensors and trainer objects python-api.md's cells take as given."""
    arrays = _padded(_rows(pq.read_table(RUN)))
    tensors = {name: torch.from_numpy(array) for name, array in arrays.items()}
    verl_batch = SimpleNamespace(batch=dict(tensors), meta_info={"global_steps": 3})  # a verl DataProto
    experience = SimpleNamespace(action_log_probs=tensors["old_log_probs"], action_mask=tensors["response_mask"] != 0,
                                 rollout_log_probs=tensors["rollout_log_probs"])  # an OpenRLHF Experience
    return {"__name__": "python_api_md", "old": tensors["old_log_probs"], "rollout": tensors["rollout_log_probs"],
            "mask": tensors["response_mask"], "step": 2, "batch": verl_batch,
            "self": SimpleNamespace(global_steps=3), "experiences": [experience, experience], "global_step": 4}


def test_the_python_api_cells_run_as_written(standins: Path, tmp_path: Path, monkeypatch) -> None:
    _stage(standins, tmp_path / "work", API_STANDINS)
    monkeypatch.chdir(tmp_path / "work")
    namespace, ran = _api_namespace(), 0
    for line, cell in _fenced(API_PAGE.read_text(), "python"):
        code = compile(cell, f"docs/python-api.md:{line}", "exec")
        imports = set(re.findall(r"^\s*(?:from|import) (\w+)", cell, flags=re.M))
        if imports & set(FRAMEWORKS):
            continue  # a trainer subclass: its framework is not installed here
        try:
            exec(code, namespace)
        except Exception as exc:
            raise AssertionError(f"the cell at docs/python-api.md:{line} raised {exc!r}:\n{cell}") from exc
        ran += 1
    assert ran >= 10, ran  # the framework filter skips the trainer subclasses only
