"""The repository documents itself: no pointer outside it, every link and anchor resolves, and the
reference pages name every family and preset the CLI accepts."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mismatch_cli.correction import FAMILIES, PRESETS, older_presets

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "tests" / "data" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# Spelled in two parts so that this file does not match itself.
OUTSIDE = "../" + "shared"
SKIP_DIRS = {".git", ".venv", "venv", "__pycache__", ".pytest_cache", ".ruff_cache", "build", "dist", ".hypothesis"}
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def _repository_files() -> list[Path]:
    files = []
    for path in ROOT.rglob("*"):
        parts = path.relative_to(ROOT).parts
        if any(p in SKIP_DIRS or p.endswith(".egg-info") for p in parts) or not path.is_file():
            continue
        files.append(path)
    return files


def _prose(path: Path) -> str:
    """The Markdown text outside fenced code blocks."""
    return re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)


def _anchors(path: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces turned into hyphens."""
    anchors: set[str] = set()
    for line in _prose(path).splitlines():
        match = re.match(r"#{1,6}\s+(.*)", line)
        if match:
            slug = re.sub(r"[^\w\- ]", "", match[1].strip().lower()).replace(" ", "-")
            anchors.add(slug)
    return anchors


def test_no_file_points_outside_the_repository():
    offenders = []
    for path in _repository_files():
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # binary files (plots, parquet samples)
        if OUTSIDE in text:
            offenders.append(str(path.relative_to(ROOT)))
    assert not offenders, f"files refer to {OUTSIDE}, which a clone does not have: {offenders}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_anchor_resolves(page: Path):
    assert page.exists()
    broken = []
    for target in LINK.findall(_prose(page)):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto
        file_part, _, anchor = target.partition("#")
        destination = (page.parent / file_part).resolve() if file_part else page
        if ROOT not in destination.parents and destination != ROOT:
            broken.append(f"{target} (outside the repository)")
        elif not destination.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and destination.suffix == ".md" and anchor not in _anchors(destination):
            broken.append(f"{target} (no such heading)")
    assert not broken, f"{page.relative_to(ROOT)}: {broken}"


def test_reference_pages_exist_and_are_linked_from_the_readme():
    readme = (ROOT / "README.md").read_text()
    pages = ("commands", "report", "ci", "formats", "metrics", "python-api", "performance", "architecture",
             "verl-semantics", "legacy-semantics")
    for name in (*(f"docs/{page}.md" for page in pages), "tests/data/README.md"):
        assert (ROOT / name).exists(), name
        assert f"]({name})" in readme, f"README.md does not link {name}"


def test_release_table_names_every_semantics_family():
    text = (ROOT / "docs" / "verl-semantics.md").read_text()
    table = text.split("## 10. Which `--semantics` for which release", 1)[1].split("\n## ", 1)[0]
    missing = [family for family in FAMILIES if f"`{family}`" not in table]
    assert not missing, f"docs/verl-semantics.md §10 does not name {missing}"


def test_preset_tables_name_every_preset():
    verl = (ROOT / "docs" / "verl-semantics.md").read_text()
    assert [name for name in PRESETS if f"| `{name}` |" not in verl] == []
    legacy = (ROOT / "docs" / "legacy-semantics.md").read_text()
    for family in ("verl-0.6.1", "verl-0.7.0"):
        missing = [name for name in older_presets(family) if f"`{name}`" not in legacy]
        assert not missing, f"docs/legacy-semantics.md does not name {family} presets {missing}"


def test_trainers_page_names_every_replayed_trainer_and_its_fields() -> None:
    from mismatch_cli.correction import REPLAY_FAMILIES

    page = (ROOT / "docs" / "trainers.md").read_text()
    for name, family in REPLAY_FAMILIES.items():
        assert f"| `{name}` |" in page, f"docs/trainers.md lacks a row for {name}"
        missing = [field for field in family.defaults if f"`{field}`" not in page]
        assert not missing, f"docs/trainers.md does not name {name}'s fields {missing}"
