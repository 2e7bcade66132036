"""Every family's vocabulary of fixes: complete, sourced at a named version, in its own syntax, and its correction
mapping valid for the trainer it names."""

from __future__ import annotations

import re
from dataclasses import asdict

import pytest

from mismatch_cli.correction import FAMILIES, REPLAY_FAMILIES, resolve_family
from mismatch_cli.correction.fixes import CONCERNS, fixes_for
from mismatch_cli.engine.accumulators.whatif import LADDER

SOURCE = re.compile(r"^[\w./-]+\.(py|yaml|yml|md|sh|toml|patch):\d+(-\d+)?( \(.+\))?$|^engine: .+")
VERSION = re.compile(r"\d+\.\d+(\.\d+)?|[0-9a-f]{8,}")
VERL_WORDS = ("actor_rollout_ref.", "algorithm.rollout_correction", "rollout_is_threshold")


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_has_a_sourced_vocabulary(family: str) -> None:
    fixes = fixes_for(family)
    assert fixes is not None, family
    assert VERSION.search(fixes.trainer), f"{family}: the vocabulary names no version ({fixes.trainer!r})"
    for concern in CONCERNS:
        assert fixes.settings.get(concern) or fixes.missing.get(concern), f"{family}: nothing for {concern}"
    unknown = (set(fixes.settings) | set(fixes.missing)) - set(CONCERNS)
    assert not unknown, f"{family}: unknown concerns {unknown}"
    for concern, settings in fixes.settings.items():
        for setting in settings:
            assert "(" not in setting.note, f"{family} {concern}: the screen puts a note in parentheses"
            for part in setting.source.split("; "):
                assert SOURCE.match(part), f"{family} {concern}: source {setting.source!r} is not file:line"
    for trap in fixes.traps:
        assert trap.causes and trap.text and SOURCE.match(trap.source.split("; ")[0]), (family, asdict(trap))


@pytest.mark.parametrize("family", [f for f in FAMILIES if not f.startswith("verl")])
def test_no_other_family_speaks_verl(family: str) -> None:
    fixes = fixes_for(family)
    texts = [s.text for settings in fixes.settings.values() for s in settings]
    assert not [t for t in texts if any(word in t for word in VERL_WORDS)], family


@pytest.mark.parametrize("family", list(REPLAY_FAMILIES))
def test_a_trainer_expresses_ladder_rows_with_its_own_valid_fields(family: str) -> None:
    fixes = fixes_for(family)
    expressed = []
    for scenario in LADDER:
        row = {"name": scenario.name, "family": scenario.family, "level": scenario.level,
               "threshold": scenario.threshold, "option": scenario.option}
        fields = fixes.correction(row) if fixes.correction else None
        if fields is None:
            continue
        expressed.append(scenario.name)
        assert set(fields) <= set(REPLAY_FAMILIES[family].defaults), (family, scenario.name, fields)
        resolved, _ = resolve_family(family, dict(fields))
        assert resolved.trainer is not None, (family, scenario.name)
        snippet = fixes.native(fields)
        assert snippet and not any(word in snippet for word in VERL_WORDS), (family, snippet)
    if fixes.correction is None:
        assert fixes.missing.get("correction"), f"{family}: no correction mapping and no word why"
    else:
        assert expressed, f"{family}: a correction mapping that expresses no ladder row"


def test_the_docs_page_is_fresh() -> None:
    from pathlib import Path

    from mismatch_cli.render.fixes import render_fixes_markdown

    page = Path(__file__).resolve().parents[1] / "docs" / "fixes.md"
    expected = render_fixes_markdown({f: fixes_for(f) for f in FAMILIES})
    assert page.read_text() == expected, "docs/fixes.md is stale: mismatch fixes --format markdown > docs/fixes.md"
