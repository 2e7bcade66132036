"""Issue 25, "Done when": the README's walk-through passes as written.

Every `mismatch …` line of the README's Quick start and Three commands sections (analyze, compare,
check) is run, in order and word for word, through the CLI in a temporary folder holding a copy of
`sample_data/`. The few inputs the README takes as the reader's own (`dumps/`, `vllm_run/`, the
precision arms `fp32.parquet` …) are made first: synthetic runs (`mismatch synth`) and copies of the
real-model arms. Anything else a command reads (the `check` baseline) must come from an earlier README
line. `check` runs on a repeat of the baseline's healthy run: the same synth settings, another seed, as
a CI job's fresh dump would be (tests/test_check_noise.py holds the README's rules to all 30 ordered
pairs of six such seeds).
"""

from __future__ import annotations

import re
import shlex
import shutil
from pathlib import Path

from test_cli import invoke

ROOT = Path(__file__).resolve().parents[1]
SECTIONS = ("Quick start", "Three commands")
# The reader's own dumps: a healthy synthetic run with steps (the README breaks `dumps/` down `--by step`),
# at the size docs/ci.md studies its noise on. `check` gets the same settings with another seed.
RUN = ["--tokens", "30000", "--steps", "3", "-q"]
BASELINE_SEED, REPEAT_SEEDS = "1", ("2", "3")
ARMS = ("fp32", "bf16", "fp16", "fp8")
EXIT_CODES: dict[str, int] = {}  # a command whose documented exit code is not 0 (none in these sections)


def readme_commands() -> list[list[str]]:
    """The `mismatch` command lines a reader copies from the walk-through sections, in order."""
    text = (ROOT / "README.md").read_text()
    commands = []
    for section in re.split(r"^## ", text, flags=re.M)[1:]:
        if section.split("\n", 1)[0].strip() not in SECTIONS:
            continue
        for block in re.findall(r"^```bash\n(.*?)^```", section, flags=re.M | re.S):
            for line in block.replace("\\\n", " ").splitlines():
                words = shlex.split(line, comments=True)
                if words and words[0] == "mismatch":
                    commands.append(words[1:])
                else:
                    assert not words or words[0] in ("pip", "python", "python3"), line  # install lines only
    return commands


def test_the_walkthrough_covers_every_command() -> None:
    names = [command[0] for command in readme_commands()]
    assert {"synth", "analyze", "compare", "check"} <= set(names), names
    assert names.index("analyze", names.index("synth")) > names.index("synth")  # made, then read


def _synth(path: str, seed: str) -> None:
    shutil.rmtree(Path(path).parent, ignore_errors=True)
    result = invoke("synth", path, "--seed", seed, *RUN)
    assert result.exit_code == 0, result.output


def test_the_readme_walkthrough_passes_as_written(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "100")
    shutil.copytree(ROOT / "sample_data", "sample_data")
    for arm in ARMS:
        shutil.copy(ROOT / "sample_data" / "real" / f"{arm}.parquet", f"{arm}.parquet")
    _synth("dumps/run.parquet", BASELINE_SEED)
    _synth("vllm_run/run.parquet", "3")
    _synth("sglang_run/run.parquet", "4")
    commands = readme_commands()
    for command in commands:
        if command[0] == "check":  # a later CI run: fresh dumps of the same healthy setting
            _synth("dumps/run.parquet", REPEAT_SEEDS[0])
        _run(command)
    # The Quick start's --out-dir and the check's baseline were written where the README says.
    assert Path("out/report.json").is_file() and Path("out/report.html").is_file()
    assert Path("ci/report.json").is_file()
    for seed in REPEAT_SEEDS[1:]:  # another repeat against the same baseline
        _synth("dumps/run.parquet", seed)
        for command in commands:
            if command[0] == "check":
                _run(command)


def _run(command: list[str]) -> None:
    result = invoke(*command)
    expected = EXIT_CODES.get(command[0], 0)
    assert result.exit_code == expected, (shlex.join(["mismatch", *command]), result.exit_code, result.output)
    if command[0] == "check":
        assert "PASS" in result.output, result.output
