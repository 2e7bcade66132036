"""`mismatch replay` tells the truth (issue 34, item 6): the dump's own verdict leads every format and is analyze's;
each "why they differ" line rests on what the trainers computed on the dump (non-finite only when a value is, a
trait only when the two differ in it and it acts here, a row product's shrinking only when every row's Σd < 0);
`--set FAMILY.FIELD=VALUE` and `--config` run a trainer with its correction on, refused as `analyze` refuses them;
the HTML table fits a 1280-pixel page. Reference values are float64 numpy over the dump's columns, or the trainers'
formulas written out here."""

from __future__ import annotations

import io
import json
import math
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from rich.console import Console
from typer.testing import CliRunner

import mismatch_cli.replay as replay_module
from mismatch_cli.answers.replay import DumpFacts, Side, clauses, explain
from mismatch_cli.api import analyze
from mismatch_cli.cli import app
from mismatch_cli.correction import REPLAY_FAMILIES, correction_table, resolve_family, settings_from_pairs
from mismatch_cli.correction.verl import VERL_TRAITS
from mismatch_cli.render.replay import (
    HTML_COLUMNS,
    render_replay_html,
    render_replay_json,
    render_replay_markdown,
    render_replay_table,
)
from mismatch_cli.replay import ReplayReport, replay

ROOT = Path(__file__).resolve().parents[1]
DUMP = ROOT / "sample_data" / "real" / "top_p_bug.parquet"
FLOAT32_EXP_LIMIT = math.log(np.finfo(np.float32).max)


def _invoke(*argv: str):
    return CliRunner(env={"MISMATCH_DEBUG": None, "COLUMNS": "100"}).invoke(app, list(argv))


def _write(path: Path, old: np.ndarray, rollout: np.ndarray, mask: np.ndarray | None = None) -> Path:
    mask = np.ones(old.shape, dtype=np.int64) if mask is None else mask
    pq.write_table(pa.table({"old_log_probs": pa.array(old.tolist(), type=pa.list_(pa.float64())),
                             "rollout_log_probs": pa.array(rollout.tolist(), type=pa.list_(pa.float64())),
                             "response_mask": pa.array(mask.tolist(), type=pa.list_(pa.int64()))}), path)
    return path


def _rows(path: Path) -> list[np.ndarray]:
    """Each row's valid log-ratios d = old - rollout, in float64."""
    table = pq.read_table(path).to_pydict()
    out = []
    for old, rollout, mask in zip(table["old_log_probs"], table["rollout_log_probs"], table["response_mask"],
                                  strict=True):
        keep = np.asarray(mask, dtype=bool)
        out.append(np.asarray(old, dtype=np.float64)[keep] - np.asarray(rollout, dtype=np.float64)[keep])
    return out


@pytest.fixture(scope="module")
def dumps(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Small dumps on which one rule applies each: rows with Σd > 0, one |d| past float32's exp, a NaN log-prob,
    ratios above 2 for a threshold to cut, and log-probs that agree."""
    folder = tmp_path_factory.mktemp("dumps")
    rng = np.random.default_rng(7)
    rollout = -rng.exponential(1.0, (60, 50))
    positive = np.minimum(rollout + 0.05 + rng.normal(0, 0.01, rollout.shape), -1e-6)
    overflow = rollout + rng.normal(0, 0.05, rollout.shape)
    overflow[3, 5] = rollout[3, 5] + 100.0
    nan = rollout + rng.normal(0, 0.05, rollout.shape)
    nan[4, 7] = np.nan
    heavy = rollout + rng.normal(0, 0.8, rollout.shape)
    healthy = rollout + rng.normal(0, 0.01, rollout.shape)
    return {name: _write(folder / f"{name}.parquet", old, rollout) for name, old in (
        ("positive", positive), ("overflow", overflow), ("nan", nan), ("heavy", heavy), ("healthy", healthy))}


@pytest.fixture(scope="module")
def top_p() -> ReplayReport:
    return replay([str(DUMP)], device="cpu")


def _why(report: ReplayReport, concept: str) -> str:
    return next(row.why for row in report.rows if row.concept == concept) or ""


# --- the dump's verdict leads, and is analyze's ---------------------------------------------------------------


def _same_verdict(report: ReplayReport, path: Path) -> None:
    reference = analyze([str(path)], device="cpu", bootstrap=0)
    mine = report.verdict()
    assert mine is not None
    assert mine["status"] == reference.summary["status"]
    assert mine["diagnosis"] == reference.summary["diagnosis"]
    assert [(c["metric"], c["ok"]) for c in mine["checks"]] == [(c["metric"], c["ok"])
                                                                 for c in reference.summary["checks"]]
    for ours, theirs in zip(mine["checks"], reference.summary["checks"], strict=True):
        assert ours["value"] == pytest.approx(theirs["value"], rel=1e-9, abs=1e-12)
    assert [f["code"] for f in mine["findings"]] == [f["code"] for f in reference.findings]


def test_the_verdict_is_analyzes_from_the_verl_column(top_p: ReplayReport) -> None:
    _same_verdict(top_p, DUMP)
    assert top_p.verdict()["diagnosis"]["kind"] == "bug"  # type: ignore[index]
    assert top_p.verdict()["diagnosis"]["code"] == "processed_logprobs"  # type: ignore[index]


@pytest.mark.parametrize("name", ["positive", "healthy", "heavy"])
def test_the_verdict_is_analyzes_on_other_dumps(name: str, dumps: dict[str, Path]) -> None:
    _same_verdict(replay([str(dumps[name])], device="cpu"), dumps[name])


def test_without_a_verl_column_the_verdict_comes_from_the_same_read(monkeypatch: pytest.MonkeyPatch) -> None:
    reads: list[int] = []
    real = replay_module.iter_batches

    def counted(files, options, workers=0):
        reads.append(1)
        return real(files, options, workers=workers)

    monkeypatch.setattr(replay_module, "iter_batches", counted)
    report = replay([str(DUMP)], ["trl", "skyrl"], device="cpu")
    assert len(reads) == 1, "the verdict must not read the dump a second time"
    assert [t.name for t in report.trainers] == ["trl", "skyrl"]  # the stand-in is no column
    _same_verdict(report, DUMP)


def test_a_verl_column_with_rs_on_still_gives_analyzes_default_verdict() -> None:
    settings = {"verl": {"rollout_rs": "seq_mean_k1", "rollout_rs_threshold": "0.9_1.1"}}
    _same_verdict(replay([str(DUMP)], ["verl"], device="cpu", settings=settings), DUMP)


def test_the_verdict_leads_every_format(top_p: ReplayReport) -> None:
    title = top_p.verdict()["diagnosis"]["title"]  # type: ignore[index]
    headline = f"BUG IN THE DUMP OR CONFIG - {title}"
    console = Console(file=io.StringIO(), width=400, record=True, color_system=None)
    render_replay_table(top_p, console)
    lines = console.export_text().splitlines()
    assert lines[1] == f"dump: {headline}"
    assert lines.index(next(line for line in lines if line.startswith("concept"))) > 1
    markdown = render_replay_markdown(top_p)
    assert markdown.index(f"dump: {headline}") < markdown.index("| concept |")
    data = json.loads(render_replay_json(top_p))
    assert list(data).index("dump") < list(data).index("trainers") < list(data).index("concepts")
    assert data["dump"]["headline"] == headline and data["dump"]["status"] == "bug"
    page = render_replay_html(top_p)
    assert page.index(f"dump: {headline}") < page.index("<table")


# --- a row's product of ratios: shrinks toward 0 only where every row's Σd < 0 ---------------------------------


def test_top_p_bug_trl_weight_is_the_row_product_that_shrinks(top_p: ReplayReport) -> None:
    rows = _rows(DUMP)
    sums = np.array([d.sum() for d in rows])
    assert (sums < 0).all()
    weights = np.exp(sums)
    weights[weights > 3.0] = 0.0  # TRL sequence_mask: a row's exp(Σd) masked to 0 above clip_max 3
    row = next(r for r in top_p.rows if r.concept == "weight_mean")
    assert row.cells["trl"].value == pytest.approx(weights.mean(), rel=1e-4)
    why = _why(top_p, "weight_mean")
    assert "trl" in why and "product of its ratios" in why and "shrinks toward 0" in why
    assert "every row here has Σd < 0" in why
    per_row = sum(len(d) for d in rows) / len(rows)
    assert f"mean {sums.mean():.4g} over {per_row:.0f} tokens a row" in why
    assert "weights each token" in why  # the other side is token-level, as its settings say


def test_rows_with_positive_sums_grow_and_trls_mask_cuts_them(dumps: dict[str, Path]) -> None:
    rows = _rows(dumps["positive"])
    sums = np.array([d.sum() for d in rows])
    assert (sums > 0).all() and sums.mean() >= 1.0 and (np.exp(sums) > 3.0).all()  # every row masked to 0
    report = replay([str(dumps["positive"])], ["verl", "trl"], device="cpu")
    assert next(r for r in report.rows if r.concept == "weight_mean").cells["trl"].value == 0.0
    why = _why(report, "weight_mean")
    assert "grows above 1" in why and "cuts it to 0" in why and "shrinks" not in why
    assert "overflow" not in why and "non-finite" not in why


def test_the_shrink_rule_needs_every_row_below_zero_and_far() -> None:
    trl = Side("trl", 0.9, "k", "product", None, {}, "s")
    verl = Side("verl", 0.95, "k", "token", None, {}, "s")
    near = DumpFacts("float32", 0.1, -0.4, 100.0, rows_negative=True)
    mixed = DumpFacts("float32", 0.1, -5.0, 100.0, rows_negative=False)
    far = DumpFacts("float32", 0.1, -5.0, 100.0, rows_negative=True)
    for facts in (near, mixed):
        text = explain("weight_mean", "IS weight mean", trl, verl, facts)
        assert "shrinks" not in text and "product of its ratios" in text and "weights each token" in text
    assert "shrinks toward 0" in explain("weight_mean", "IS weight mean", trl, verl, far)
    larger = Side("trl", 1.2, "k", "product", None, {}, "s")  # a product above the token mean does not shrink
    assert "shrinks" not in explain("weight_mean", "IS weight mean", larger, verl, far)


# --- non-finite: only when a value is, with the dump's cause when the engine reports it -----------------------


def test_top_p_bug_names_no_overflow(top_p: ReplayReport) -> None:
    assert max(np.abs(np.concatenate(_rows(DUMP)))) < 1.0
    for row in top_p.rows:
        assert not any(cell.nonfinite for cell in row.cells.values())
        assert not re.search(r"overflow|non-finite|\binf\b", row.why or ""), row.why
        assert "clamp" not in (row.why or "") and "threshold" not in (row.why or "")  # |d| < 1, no share cut


def test_an_overflowing_log_ratio_is_named_non_finite(dumps: dict[str, Path]) -> None:
    d = np.concatenate(_rows(dumps["overflow"]))
    assert np.abs(d).max() > FLOAT32_EXP_LIMIT
    with np.errstate(over="ignore"):
        assert np.isinf(np.exp(d.astype(np.float32))).sum() == 1  # k3 = exp(d) - 1 - d overflows on that token
    report = replay([str(dumps["overflow"])], ["verl", "nemo-rl"], device="cpu")
    row = next(r for r in report.rows if r.concept == "kl")
    assert row.cells["nemo-rl"].nonfinite and row.cells["nemo-rl"].value is None
    assert not row.cells["verl"].nonfinite and math.isfinite(row.cells["verl"].value)  # k1 does not overflow
    assert f"|d| reaches {np.abs(d).max():.4g}" in (row.why or "") and "nemo-rl: gen_kl_error non-finite" in row.why
    assert all(not (r.why or "") or "non-finite" not in r.why for r in report.rows if r.concept != "kl"
               and not any(c.nonfinite for c in r.cells.values()))


def test_a_nan_log_prob_is_counted(dumps: dict[str, Path]) -> None:
    table = pq.read_table(dumps["nan"]).to_pydict()
    count = int(sum(np.isnan(np.asarray(row, dtype=np.float64)).sum() for row in table["old_log_probs"]))
    assert count == 1
    report = replay([str(dumps["nan"])], ["verl", "nemo-rl"], device="cpu")
    broken = [r for r in report.rows if any(c.nonfinite for c in r.cells.values())]
    assert broken and all(f"{count} valid tokens have a NaN or infinite log-prob" in (r.why or "") for r in broken)


# --- a trait is blamed only where the two differ in it and it acts on this dump -------------------------------


def test_the_kl_estimators_differ_on_top_p_bug(top_p: ReplayReport) -> None:
    rows = _rows(DUMP)
    d = np.concatenate(rows)
    row = next(r for r in top_p.rows if r.concept == "kl")
    assert row.cells["slime-mis"].value == pytest.approx(np.mean([(-x).mean() for x in rows]), rel=1e-5)  # k1
    assert row.cells["nemo-rl"].value == pytest.approx(np.mean(np.exp(d) - 1 - d), rel=1e-4)  # k3
    why = _why(top_p, "kl")
    assert "estimator" in why and "k1" in why and "k3" in why


def test_a_shared_clamp_is_never_blamed() -> None:
    miles, mis = REPLAY_FAMILIES["miles"].traits, REPLAY_FAMILIES["miles-mis"].traits
    assert miles["clamp"] != mis["clamp"] and clauses(miles["clamp"], "kl") == clauses(mis["clamp"], "kl")
    facts = DumpFacts("float32", max_abs_d=50.0)  # past both clamps
    a = Side("miles", 0.01, "k", None, "k3", miles, "s")
    b = Side("miles-mis", 0.02, "k", None, "k3", mis, "s")
    text = explain("kl", "KL estimate", a, b, facts)
    assert "clamp" not in text and "estimator" not in text  # same estimator, same KL clamp


def test_a_clamp_is_blamed_only_where_the_log_ratios_reach_it() -> None:
    slime = REPLAY_FAMILIES["slime"].traits
    verl = Side("verl", 1.0, "k", None, "k1", VERL_TRAITS, "s")
    other = Side("slime", 2.0, "k", None, None, {"clamp": slime["clamp"]}, "s")
    reached = explain("chi2", "chi-square", verl, other, DumpFacts("float32", max_abs_d=25.0))
    assert "clamp" in reached and "verl clamps d at ±20" in reached and "overflow" not in reached
    assert "clamp" not in explain("chi2", "chi-square", verl, other, DumpFacts("float32", max_abs_d=0.5))


def test_nemo_rl_is_token_level_under_its_defaults() -> None:
    report = replay([str(DUMP)], ["trl", "nemo-rl"], device="cpu")
    why = _why(report, "weight_mean")
    assert "nemo-rl weights each token" in why and "trl weights a row by the product" in why
    assert REPLAY_FAMILIES["nemo-rl"].traits["sequence"] not in why
    columns, _ = replay_module.configure(["nemo-rl"], {"nemo-rl": {
        "use_importance_sampling_correction": True, "sequence_level_importance_ratios": True,
        "token_level_loss": False}})
    assert columns[0].form == "product"


@pytest.mark.parametrize(("name", "settings", "form"), [
    ("verl", {}, "token"), ("verl", {"rollout_is": "sequence"}, "product"),  # verl's sequence IS: exp(Σd)
    ("trl", {}, "product"), ("trl", {"vllm_importance_sampling_mode": "token_truncate"}, "token"),
    ("skyrl", {"tis_ratio_type": "sequence"}, "product"), ("skyrl", {"tis_ratio_type": "token"}, "token"),
    ("nemo-rl", {}, "token"), ("slime-mis", {}, "token"), ("slime", {}, "token"),
    ("slime-mis", {"tis_level": "geometric", "tis_batch_normalize": False}, "geometric"),
    ("areal", {"rejection_sampling": True, "level": "sequence"}, "geometric"),  # exp(mean d) with metric ratio
    ("openrlhf", {"is_correction_level": "seq"}, "geometric"),
    ("ms-swift", {"rollout_importance_sampling_mode": "sequence_mask"}, "geometric"),
    ("xtuner", {"rollout_is_threshold": "2.0,0.5", "rollout_is_level": "sequence"}, "product"),
])
def test_the_weight_form_follows_the_resolved_settings(name: str, settings: dict, form: str) -> None:
    columns, _ = replay_module.configure([name], {name: settings} if settings else None)
    assert columns[0].form == form


def test_a_threshold_is_blamed_where_it_cuts(dumps: dict[str, Path]) -> None:
    d = np.concatenate(_rows(dumps["heavy"]))
    ratio = np.exp(d)
    settings = {"trl": {"vllm_importance_sampling_mode": "token_truncate"}}
    report = replay([str(dumps["heavy"])], ["verl", "trl"], device="cpu", dtype="float64", settings=settings)
    cells = {r.concept: r.cells for r in report.rows}
    assert cells["weight_mean"]["verl"].value == pytest.approx(np.minimum(ratio, 2.0).mean(), rel=1e-9)
    assert cells["weight_mean"]["trl"].value == pytest.approx(np.minimum(ratio, 3.0).mean(), rel=1e-9)
    assert cells["truncated"]["verl"].value == pytest.approx((ratio > 2.0).mean(), rel=1e-9)
    why = _why(report, "weight_mean")
    assert why.startswith("IS weight mean: verl") and "threshold" in why
    assert f"cuts up to {(ratio > 2.0).mean():.3g} here" in why
    assert "vllm_importance_sampling_mode=token_truncate" in why
    idle = Side("verl", 0.9, "k", "token", "k1", VERL_TRAITS, "s", (0.0,))
    other = Side("trl", 0.95, "k", "token", None, REPLAY_FAMILIES["trl"].traits, "s")
    assert "threshold" not in explain("weight_mean", "IS weight mean", idle, other, DumpFacts("float32", 0.1))


def test_a_trainer_that_compares_no_differing_log_probs_is_said_so() -> None:
    report = replay([str(DUMP)], ["verl", "areal"], device="cpu", settings={"areal": {"rejection_sampling": True}})
    row = next(r for r in report.rows if r.concept == "kl")
    assert row.cells["areal"].value == 0.0 and np.abs(np.concatenate(_rows(DUMP))).max() > 0
    assert "areal's is exactly what d = 0 gives" in (row.why or "") and "use_decoupled_loss=false" in row.why


# --- --set and --config ----------------------------------------------------------------------------------------


def test_set_turns_a_correction_on_and_is_echoed(tmp_path: Path) -> None:
    d = np.concatenate(_rows(DUMP))
    result = _invoke("replay", str(DUMP), "--trainers", "verl,trl,skyrl", "--device", "cpu", "--dtype", "float64",
                     "--set", "skyrl.tis_ratio_type=token", "--set", "trl.vllm_importance_sampling_mode=token_truncate",
                     "--format", "json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["silent"] == []
    trainers = {t["name"]: t for t in data["trainers"]}
    assert trainers["skyrl"]["set"] == {"tis_ratio_type": "token"} and trainers["verl"]["set"] == {}
    assert "tis_ratio_type=token" in trainers["skyrl"]["settings"]
    weight = next(c for c in data["concepts"] if c["concept"] == "weight_mean")["cells"]
    assert weight["trl"]["value"] == pytest.approx(np.minimum(np.exp(d), 3.0).mean(), rel=1e-9)  # token TIS at 3
    assert weight["skyrl"]["key"] == "policy/loss_metrics/is_ratio_mean" and weight["skyrl"]["value"] is not None
    table = _invoke("replay", str(DUMP), "--trainers", "verl,trl,skyrl", "--device", "cpu",
                    "--set", "skyrl.tis_ratio_type=token").stdout
    assert "settings:\n  skyrl: tis_ratio_type=token" in table and "verl:" not in table.split("concept")[0]
    assert "(skyrl with the settings below, the rest under their defaults)" in " ".join(table.split())


def _error(result) -> str:
    return result.output.strip().splitlines()[-1]


@pytest.mark.parametrize("pair", ["skyrl.foo=bar", "skyrl.tis_ratio_type=bogus", "trl.vllm_importance_sampling_mode=x",
                                  "nemo-rl.use_importance_sampling_correction=maybe", "verl.rollout_is_threshold=abc",
                                  "skyrl.micro_train_batch_size_per_gpu=0"])
def test_a_bad_setting_is_refused_as_analyze_refuses_it(pair: str) -> None:
    family, _, field = pair.partition(".")
    ours = _invoke("replay", str(DUMP), "--set", pair)
    theirs = _invoke("analyze", str(DUMP), "--semantics", family, "--set", field, "--bootstrap", "0")
    assert ours.exit_code == theirs.exit_code == 2, (ours.output, theirs.output)
    assert _error(ours) == re.sub(r" \(on the command line, [^)]*\)$", "", _error(theirs))
    with pytest.raises(Exception) as refused:  # the correction model itself, the same message
        resolve_family(family, {**replay_module.trainers()[family].fields, **settings_from_pairs([field], family)})
    assert str(refused.value.message) in _error(ours)  # type: ignore[attr-defined]


@pytest.mark.parametrize(("argv", "expected"), [
    (["--set", "skyrll.tis_ratio_type=token"], "unknown trainer 'skyrll'; fix: did you mean skyrl?"),
    (["--set", "skyrl"], "--set expects FAMILY.FIELD=VALUE"),
    (["--set", "tis_ratio_type=token"], "--set expects FAMILY.FIELD=VALUE"),
    (["--trainers", "verl,trl", "--set", "skyrl.tis_ratio_type=token"], "skyrl is not among the columns"),
])
def test_set_names_the_trainer(argv: list[str], expected: str) -> None:
    result = _invoke("replay", str(DUMP), *argv)
    assert result.exit_code == 2 and expected in result.output, result.output


def test_config_tables_and_set_wins(tmp_path: Path) -> None:
    config = tmp_path / "replay.toml"
    config.write_text('[correction]\nsemantics = "verl"\n\n[replay-skyrl]\ntis_ratio_type = "token"\n'
                      'token_tis_ratio_clip_high = 3.0\n\n[replay-trl]\nvllm_importance_sampling_mode = "token_mask"\n')
    result = _invoke("replay", str(DUMP), "--trainers", "trl,skyrl", "--config", str(config), "--device", "cpu",
                     "--set", "trl.vllm_importance_sampling_mode=token_truncate", "--format", "json")
    assert result.exit_code == 0, result.output
    trainers = {t["name"]: t for t in json.loads(result.stdout)["trainers"]}
    assert trainers["skyrl"]["set"] == {"tis_ratio_type": "token", "token_tis_ratio_clip_high": 3.0}
    assert trainers["trl"]["set"] == {"vllm_importance_sampling_mode": "token_truncate"}  # --set wins
    assert set(REPLAY_FAMILIES["skyrl"].kinds) <= set(correction_table())


@pytest.mark.parametrize(("text", "expected"), [
    ('[replay-skyrl]\ntis_ratio_type = 3\n', "[replay-skyrl] tis_ratio_type must be a string"),
    ('[replay-skyrl]\ntis_ratio_typ = "token"\n', "did you mean tis_ratio_type?"),
    ('[replay-skyrll]\ntis_ratio_type = "token"\n', "did you mean [replay-skyrl]?"),
    ('[replay.skyrl]\ntis_ratio_type = "token"\n', "[replay-NAME] (a dash, not a dot)"),
    ('[replay-skyrl]\ntis_ratio_type = "bogus"\n', "`tis_ratio_type` must be"),
])
def test_a_bad_config_is_refused(text: str, expected: str, tmp_path: Path) -> None:
    config = tmp_path / "replay.toml"
    config.write_text(text)
    result = _invoke("replay", str(DUMP), "--config", str(config))
    assert result.exit_code == 2 and expected in result.output, result.output


# --- HTML: blocks of at most HTML_COLUMNS trainers --------------------------------------------------------------


def test_the_html_table_stacks_blocks_that_fit(tmp_path: Path) -> None:
    settings = {"skyrl": {"tis_ratio_type": "token"}, "areal": {"rejection_sampling": True},
                "openrlhf": {"is_correction_level": "token"},
                "ms-swift": {"rollout_importance_sampling_mode": "token_truncate"}}
    report = replay([str(DUMP)], device="cpu", settings=settings)
    assert not report.silent and len(report.shown) > 2 * HTML_COLUMNS
    page = render_replay_html(report)
    heads = re.findall(r"<thead><tr><th>concept</th>(.*?)</tr></thead>", page)
    names = [re.findall(r"<th>([^<]*)</th>", head) for head in heads]
    assert all(len(block) <= HTML_COLUMNS for block in names)
    assert [n for block in names for n in block] == [t.name for t in report.shown]
    path = tmp_path / "replay.html"
    path.write_text(page)
    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if browser is None:
        pytest.skip("no headless Chromium to measure the page (the rule above still holds)")
    script = ("<script>window.onload=function(){var r=[];document.querySelectorAll('table').forEach(function(t)"
              "{r.push(t.getBoundingClientRect().right)});document.body.setAttribute('data-w',JSON.stringify({r:r,"
              "m:document.querySelector('main').getBoundingClientRect().right}))}</script>")
    path.write_text(page.replace("</body>", script + "</body>"))
    dom = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1280,2000",
                          "--dump-dom", path.as_uri()], capture_output=True, text=True, timeout=120).stdout
    found = re.search(r'data-w="([^"]*)"', dom)
    assert found, dom[-500:]
    widths = json.loads(found[1].replace("&quot;", '"'))
    assert max(widths["r"]) <= widths["m"] <= 1280, widths
