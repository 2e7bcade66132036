"""Issue 34's "done when": the answers speak the user's trainer.

For every family, `analyze --semantics X` on the real temperature-bug, top-p-bug and fp8 samples puts X's own
settings (its vocabulary of fixes, or its word that it has none) in the first line of What to do, and none of
verl's unless X is verl; a configured correction that drops most of the batch leads What to do; the quick-start
screen never says both "a correction's job" and "no correction is needed"; several pooled runs get a hint towards
compare.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mismatch_cli.answers.advice import CAUSE_CONCERNS
from mismatch_cli.api import analyze
from mismatch_cli.correction import FAMILIES, CorrectionConfig
from mismatch_cli.correction.fixes import fixes_for
from mismatch_cli.render.lead import what_to_do_of
from mismatch_cli.render.summary import summary_lines
from mismatch_cli.synth import SynthSpec, write_synthetic_dump

REAL = Path(__file__).resolve().parents[1] / "sample_data" / "real"
VERL_WORDS = ("actor_rollout_ref.", "algorithm.rollout_correction")
CAUSE_OF = {"temperature_bug": "temperature_mismatch", "top_p_bug": "processed_logprobs", "fp8": "precision_gap"}


def _config(family: str, **fields: object) -> CorrectionConfig:
    return CorrectionConfig(semantics=family, family_fields=dict(fields)) if family not in ("verl", "verl-0.8") \
        else CorrectionConfig(semantics=family, **fields)


def _first_line(report) -> str:
    lines = what_to_do_of(report)
    assert lines, "no What to do"
    return lines[0].text


@pytest.mark.parametrize("sample", list(CAUSE_OF))
@pytest.mark.parametrize("family", FAMILIES)
def test_the_first_fix_speaks_the_users_trainer(family: str, sample: str) -> None:
    report = analyze([str(REAL / f"{sample}.parquet")], _config(family), bootstrap=0)
    first = _first_line(report)
    fixes = fixes_for(family)
    own = [s.text for concern in CAUSE_CONCERNS[CAUSE_OF[sample]] for s in fixes.settings.get(concern, ())]
    said = [fixes.missing[c] for c in CAUSE_CONCERNS[CAUSE_OF[sample]] if c in fixes.missing]
    assert fixes.trainer in first, (family, sample, first)
    assert any(text in first for text in own + said), (family, sample, first)
    if not family.startswith("verl"):
        assert not any(word in first for word in VERL_WORDS), (family, sample, first)


def test_a_skyrl_geometric_mask_that_drops_most_rows_leads() -> None:
    report = analyze([str(REAL / "fp8.parquet")],
                     _config("skyrl", tis_ratio_type="token", sequence_mask_metric="geometric"), bootstrap=0)
    share = report.metrics["policy/loss_metrics/geo_sequence_mask_masked_ratio"]
    assert share > 0.5  # the sample's rows mostly leave SkyRL's default band [0.99, 1.01]
    first = _first_line(report)
    assert first.startswith("your correction drops") and f"{round(share * 100)} % of sequences" in first
    assert report.summary["status"] != "healthy"
    assert "policy/loss_metrics/geo_sequence_mask_masked_ratio" in {c["metric"] for c in report.summary["checks"]}
    text = "\n".join(line.text for line in what_to_do_of(report))
    assert "trainer.algorithm.off_policy_correction" in text  # the replacement in SkyRL's own syntax
    assert not any(word in text for word in VERL_WORDS)


def test_a_preset_that_drops_99_percent_is_never_fine() -> None:
    report = analyze([str(REAL / "fp8.parquet")], CorrectionConfig(preset="decoupled_geo_rs_token_tis"), bootstrap=0)
    dropped = report.metrics["rollout_corr/rollout_rs_masked_fraction"]
    assert dropped > 0.9
    first = _first_line(report)
    assert first.startswith("your correction drops") and "99 % of tokens" in first
    text = "\n".join(line.text for line in what_to_do_of(report))
    assert "already brings every health check into its band" not in text


def test_the_quick_start_has_no_contradiction(tmp_path: Path) -> None:
    path = tmp_path / "run.parquet"
    write_synthetic_dump(path, SynthSpec(tokens=200_000, turns=4, steps=3))
    report = analyze([str(path)], CorrectionConfig(), group_by=("step",), bootstrap=0)
    screen = "\n".join(text for text, _ in summary_lines(report, 80))
    few = [c for c in report.summary["checks"] if c.get("few_tokens")]
    if few:
        assert "no correction is needed" not in screen
        assert "a correction's job" in screen or "correction's job" in screen


def test_pooled_arms_get_a_hint_towards_compare() -> None:
    paths = [str(REAL / f"{arm}.parquet") for arm in ("bf16", "top_p_bug", "fp8")]
    report = analyze(paths, CorrectionConfig(), bootstrap=0)
    text = "\n".join(line.text for line in what_to_do_of(report))
    assert report.summary["status"] != "healthy"
    assert "3 files analyzed as one run" in text and f"mismatch compare {paths[0]}" in text
    alone = analyze(paths[:1], CorrectionConfig(), bootstrap=0)
    assert "analyzed as one run" not in "\n".join(line.text for line in what_to_do_of(alone))
