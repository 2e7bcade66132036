"""slime's and Miles's correction mappings are exact: each ladder row they express, run through semantics slime /
slime-mis / miles / miles-mis with the mapped fields (Miles's own hook and helper paths), truncates / masks exactly the
tokens and rows that float64 numpy finds from the dump's own columns, with slime's reducer (per sample the mean over
its tokens, then the mean over samples; Miles keeps it), and the same share as the what-if ladder's row under the
per-token reducer. On a synthetic dump whose log-ratios reach every threshold of the ladder (and past the ±20 safety
bound), and on sample_data/real/fp8.parquet."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mismatch_cli import CorrectionConfig, analyze
from mismatch_cli.correction.fixes import fixes_for, threshold_bounds
from mismatch_cli.engine.accumulators.whatif import LADDER

REAL = Path(__file__).resolve().parents[2] / "sample_data" / "real" / "fp8.parquet"


def _row(scenario) -> dict:
    return {"name": scenario.name, "family": scenario.family, "level": scenario.level,
            "threshold": scenario.threshold, "option": scenario.option}


def _expressed(family: str) -> list:
    fixes = fixes_for(family)
    return [s for s in LADDER if fixes.correction(_row(s)) is not None]


def _synthetic(path: Path) -> Path:
    """96 samples of 4-60 tokens (then padding): calm, moderate and wild ones (wide tokens, a few beyond -20)."""
    rng = np.random.default_rng(7)
    columns: dict[str, list] = {"old_log_probs": [], "rollout_log_probs": [], "response_mask": []}
    for i in range(96):
        n, kind = int(rng.integers(4, 61)), i % 3
        d = rng.normal(0.0, (0.005, 0.03, 0.2)[kind], n)
        if kind == 2:
            d = np.where(rng.random(n) < 0.15, rng.normal(0.0, 1.5, n), d)
            d[rng.random(n) < 0.03] = -25.0
        anchor = -rng.exponential(1.0, n)
        old = np.where(d < 0, anchor + d, anchor)  # both sides stay log-probs (<= 0)
        columns["old_log_probs"].append([*old.astype(np.float32), 0.0, 0.0])
        columns["rollout_log_probs"].append([*(old - d).astype(np.float32), 0.0, 0.0])
        columns["response_mask"].append([1] * n + [0, 0])
    pq.write_table(pa.table(columns), path)
    return path


@pytest.fixture(scope="module", params=["synthetic", "real"])
def dump(request, tmp_path_factory) -> Path:
    return _synthetic(tmp_path_factory.mktemp("slime") / "dump.parquet") if request.param == "synthetic" else REAL


@pytest.fixture(scope="module")
def rows(dump) -> list[np.ndarray]:
    """Each sample's d = old - rollout over its response-mask tokens, float64."""
    table = pq.read_table(dump).to_pydict()
    out = []
    for old, rollout, mask in zip(table["old_log_probs"], table["rollout_log_probs"], table["response_mask"],
                                  strict=True):
        keep = np.asarray(mask, dtype=bool)
        out.append(np.asarray(old, np.float64)[keep] - np.asarray(rollout, np.float64)[keep])
    return out


def _sample_mean(per_token: list[np.ndarray]) -> float:
    """slime's default reducer: each sample's sum / max(tokens, 1), averaged over the samples."""
    return float(np.mean([x.sum() / max(x.size, 1) for x in per_token]))


def _run(dump: Path, family: str, fields: dict, per_token: bool = False):
    extra = {"calculate_per_token_loss": True} if per_token else {}
    return analyze([str(dump)], CorrectionConfig(semantics=family, family_fields={**fields, **extra}), bootstrap=0)


def _ladder(report, name: str) -> dict:
    return next(r for r in report.what_if if r["name"] == name)


def _hit(d: np.ndarray, scenario) -> np.ndarray:
    """Per token, whether the row's rule truncates (TIS) or zeroes (IcePop) it: on exp(d) or the sample's exp(sum d)."""
    lower, upper = threshold_bounds(str(scenario.threshold))
    x = d if scenario.level == "token" else np.full(d.size, d.sum())
    w = np.exp(np.clip(x, -20.0, 20.0))
    return w > upper if scenario.family == "tis" else (w < lower) | (w > upper)


def _cases(*families: str) -> list:
    return [pytest.param(family, scenario, id=f"{family}-{scenario.name}")
            for family in families for scenario in _expressed(family)]


@pytest.mark.parametrize(("family", "scenario"), _cases("slime", "miles"))
def test_the_hook_truncates_or_zeroes_the_ladders_tokens(family, scenario, dump, rows) -> None:
    fields = fixes_for(family).correction(_row(scenario))
    report = _run(dump, family, fields)
    # train/tis_clipfrac: 1 where the hook's weight differs from exp(d) (clamped, or IcePop's 0).
    expected = _sample_mean([_hit(d, scenario).astype(np.float64) for d in rows])
    assert expected > 0 or dump == REAL
    assert report.metrics["train/tis_clipfrac"] == pytest.approx(expected, abs=1e-6)
    per_token = _run(dump, family, fields, per_token=True)
    share = "truncated_token_fraction" if scenario.family == "tis" else "masked_token_fraction"
    assert per_token.metrics["train/tis_clipfrac"] == pytest.approx(_ladder(per_token, scenario.name)[share],
                                                                    abs=1e-6)


@pytest.mark.parametrize(("family", "scenario"), _cases("slime-mis", "miles-mis"))
def test_mis_helper_truncates_or_masks_the_ladders_tokens(family, scenario, dump, rows) -> None:
    fields = fixes_for(family).correction(_row(scenario))
    report = _run(dump, family, fields)
    hits = [_hit(d, scenario) for d in rows]
    expected = _sample_mean([h.astype(np.float64) for h in hits])
    assert expected > 0 or dump == REAL
    if scenario.family == "tis":
        got = report.metrics["train/mis_tis_truncate_fraction"]
        _, upper = threshold_bounds(str(scenario.threshold))
        weights = [np.minimum(np.exp(np.clip(d if scenario.level == "token" else np.full(d.size, d.sum()),
                                             -20.0, 20.0)), upper) for d in rows]
        assert report.metrics["train/mis_is_ratio_mean_final"] == pytest.approx(_sample_mean(weights), rel=1e-5)
    else:  # mask mode: its own low / high keys; the loss's abs diff is then over the kept tokens only
        got = report.metrics["train/mis_tis_mask_fraction_low"] + report.metrics["train/mis_tis_mask_fraction_high"]
        kept = _sample_mean([np.abs(d) * ~h for d, h in zip(rows, hits, strict=True)])
        assert report.metrics["train/train_rollout_logprob_abs_diff"] == pytest.approx(kept, rel=1e-5)
    assert got == pytest.approx(expected, abs=1e-6)
    per_token = _run(dump, family, fields, per_token=True)
    ladder = _ladder(per_token, scenario.name)
    if scenario.family == "tis":
        assert per_token.metrics["train/mis_tis_truncate_fraction"] == pytest.approx(
            ladder["truncated_token_fraction"], abs=1e-6)
    else:
        masked = (per_token.metrics["train/mis_tis_mask_fraction_low"]
                  + per_token.metrics["train/mis_tis_mask_fraction_high"])
        assert masked == pytest.approx(ladder["masked_token_fraction"], abs=1e-6)


@pytest.mark.parametrize(("hook", "mis"), [("slime", "slime-mis"), ("miles", "miles-mis")])
def test_what_slime_and_miles_cannot_compute_maps_to_none(hook, mis) -> None:
    # The hook has no sequence level; the MIS helper always weighs the tokens RS or the veto keep.
    assert {s.name for s in _expressed(hook)} == {s.name for s in LADDER
                                                  if s.family in ("tis", "icepop") and s.level == "token"}
    assert {s.name for s in _expressed(mis)} == {s.name for s in LADDER if s.family in ("tis", "icepop")}


def test_native_writes_flags_and_a_yaml_pyyaml_reads_back() -> None:
    yaml = pytest.importorskip("yaml")

    icepop = next(s for s in LADDER if s.family == "icepop" and s.level == "token")
    assert fixes_for("slime").native(fixes_for("slime").correction(_row(icepop))) == (
        "--use-tis --custom-tis-function-path slime.backends.megatron_utils.loss.icepop_function "
        "--tis-clip-low 0.5 --tis-clip 2.0")
    mis = fixes_for("slime-mis")
    fields = mis.correction(_row(next(s for s in LADDER if s.family == "tis" and s.level == "sequence")))
    flags, _, config = mis.native({**fields, "rs_veto_threshold": 1e-5}).partition("  # mis.yaml: ")
    assert flags.startswith("--use-tis --custom-config-path mis.yaml --custom-tis-function-path examples.")
    loaded = yaml.safe_load(config)
    assert loaded["rs_veto_threshold"] == 1e-5 and loaded["use_rs"] is False and loaded["tis_level"] == "sequence"


def test_miles_native_names_its_own_paths() -> None:
    yaml = pytest.importorskip("yaml")
    icepop = next(s for s in LADDER if s.family == "icepop" and s.level == "token")
    assert fixes_for("miles").native(fixes_for("miles").correction(_row(icepop))) == (
        "--use-tis --custom-tis-function-path miles.backends.training_utils.loss_hub.corrections.icepop_function "
        "--tis-clip-low 0.5 --tis-clip 2.0")
    mis = fixes_for("miles-mis")
    fields = mis.correction(_row(next(s for s in LADDER if s.family == "tis" and s.level == "sequence")))
    flags, _, config = mis.native({**fields, "rs_veto_threshold": 1e-5}).partition("  # mis.yaml: ")
    assert flags.endswith("--custom-tis-function-path examples.infra_features.train_infer_mismatch_helper.mis."
                          "compute_mis_weights_with_cp")
    loaded = yaml.safe_load(config)
    assert loaded["rs_veto_threshold"] == 1e-5 and loaded["use_rs"] is False and loaded["tis_level"] == "sequence"
