"""Issue 38: no correction that silently means something else.

A setting the trainer accepts but that makes its correction degenerate runs exactly as the trainer runs it and
leads the screen and the JSON with a warning naming the field and what it does on this dump; a deprecated field
that replaces an explicit one warns as the trainer does; an empty value is refused; readers accept only the types
their writers write; a file given twice is caught by its inode; `-` is never a file name; messages name what was
refused and where. Expected shares are hand-computed (a reversed band keeps nothing, so its share is exactly 1).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from typer.testing import CliRunner

from mismatch_cli.cli import app

ROOT = Path(__file__).resolve().parents[2]
BF16 = str(ROOT / "sample_data" / "real" / "bf16.parquet")
MILES = ROOT / "tests" / "data" / "miles_dumps" / "train_data" / "3_0.pt"


def invoke(*args: object, env: dict | None = None):
    """Run the CLI in this process."""
    return CliRunner().invoke(app, [str(a) for a in args], env={"MISMATCH_DEBUG": None, "NO_COLOR": "1", **(env or {})})


def write_miles_dump(path: Path, cp_size: object) -> Path:
    """The bundled Miles train_data dump (tests/data/miles_dumps, our own file) with another cp_size."""
    payload = torch.load(MILES, weights_only=False)
    payload["cp_size"] = cp_size
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(payload, path)
    return path


def _json(*args: str) -> tuple[dict, str]:
    result = invoke("analyze", BF16, *args, "--format", "json", "--bootstrap", "0", "--device", "cpu")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout), result.stderr


def _screen(*args: str) -> str:
    result = invoke("analyze", BF16, *args, "--bootstrap", "0", "--device", "cpu", env={"COLUMNS": "100"})
    assert result.exit_code == 0, result.output
    return " ".join(result.stdout.split())


DEGENERATE = [
    # (settings, the fields named, the key measuring it, its value here by hand: a reversed band keeps nothing)
    (("--semantics", "skyrl", "--set", "sequence_mask_metric=geometric", "--set", "geo_mask_low=1.5",
      "--set", "geo_mask_high=0.5"), ("geo_mask_low", "geo_mask_high"),
     "policy/loss_metrics/geo_sequence_mask_masked_ratio", 1.0),
    (("--semantics", "skyrl", "--set", "sequence_mask_metric=product", "--set", "product_mask_low=2",
      "--set", "product_mask_high=0.5"), ("product_mask_low", "product_mask_high"),
     "policy/loss_metrics/product_sequence_mask_masked_ratio", 1.0),
    (("--semantics", "skyrl", "--set", "token_mask_is_threshold_low=3", "--set", "token_mask_is_threshold_high=0.3"),
     ("token_mask_is_threshold_low",), "policy/loss_metrics/token_mask_ratio", 1.0),
    (("--semantics", "skyrl", "--set", "outlier_token_is_threshold_low=3",
      "--set", "outlier_token_is_threshold_high=0.3"), ("outlier_token_is_threshold_low",),
     "policy/loss_metrics/outlier_seq_masked_ratio", 1.0),
    (("--semantics", "skyrl", "--set", "tis_ratio_type=token", "--set", "token_tis_ratio_clip_high=-1"),
     ("token_tis_ratio_clip_high",), "policy/loss_metrics/tis_token_clip_high_ratio", 1.0),
    (("--semantics", "openrlhf", "--set", "is_correction_level=token", "--set", "is_correction_threshold=5_0.5"),
     ("is_correction_threshold",), "train/is_filter_ratio", 1.0),
    (("--semantics", "openrlhf", "--set", "is_correction_level=token", "--set", "is_correction_threshold=-1"),
     ("is_correction_threshold",), "train/is_filter_ratio", 1.0),
    (("--semantics", "slime", "--set", "use_tis=true", "--set", "tis_clip_low=3", "--set", "tis_clip=0.5"),
     ("tis_clip_low", "tis_clip"), "train/tis_clipfrac", 1.0),
    (("--semantics", "ms-swift", "--set", "rollout_importance_sampling_mode=token_truncate",
      "--set", "rollout_importance_sampling_threshold=-2"), ("rollout_importance_sampling_threshold",),
     "rollout_correction/clipped_frac", 1.0),
    (("--semantics", "slime-mis", "--set", "use_tis=true", "--set", "use_rs=true", "--set", "rs_veto_threshold=-1"),
     ("rs_veto_threshold",), None, None),
]


@pytest.mark.parametrize(("args", "fields", "key", "share"), DEGENERATE,
                         ids=[f"{a[1]}-{f[0]}" + ("-neg" if "-1" in " ".join(a) else "") for a, f, _, _ in DEGENERATE])
def test_a_degenerate_setting_runs_and_leads_with_a_warning(args, fields, key, share) -> None:
    report, _ = _json(*args)
    found = [f for f in report["findings"] if f["code"] == "degenerate_setting"]
    assert found and all(name in found[0]["title"] for name in fields), report["findings"]
    if key is not None:
        assert report["metrics"][key] == pytest.approx(share)  # replayed as the trainer runs it
        assert found[0]["evidence"]["value"] == pytest.approx(share)
    assert report["summary"]["status"] != "healthy"
    assert report["summary"]["diagnosis"]["code"] == "degenerate_setting"
    screen = _screen(*args)
    assert screen.split(" Health:", 1)[0].count("warning: ") >= 1 and fields[0] in screen.split(" Health:", 1)[0]
    assert "no correction is needed" not in screen


def test_openrlhf_reads_a_reversed_toml_band_as_the_flag(tmp_path: Path) -> None:
    config = tmp_path / "m.toml"
    config.write_text('[correction]\nsemantics = "openrlhf"\nis_correction_level = "token"\n'
                      "is_correction_threshold = [5.0, 0.5]\n")
    report, _ = _json("--config", str(config))
    assert report["metrics"]["train/is_filter_ratio"] == pytest.approx(1.0)
    assert any(f["code"] == "degenerate_setting" for f in report["findings"])


def test_trls_deprecated_cap_warns_as_trl_does() -> None:
    report, _ = _json("--semantics", "trl", "--set", "vllm_importance_sampling_cap=0.5",
                      "--set", "vllm_importance_sampling_clip_max=3")
    said = report["summary"]["setting_warnings"]
    assert "`vllm_importance_sampling_cap` argument is deprecated" in said[0]
    assert "replaces the vllm_importance_sampling_clip_max=3" in said[0]
    assert report["config"]["vllm_importance_sampling_clip_max"] == 0.5  # TRL's own behaviour, replayed
    screen = _screen("--semantics", "trl", "--set", "vllm_importance_sampling_cap=0.5")
    assert screen.split(" Health:", 1)[0].endswith("(grpo_config.py:1143)")


@pytest.mark.parametrize("pair", ["tis_ratio_type=", "vllm_importance_sampling_mode="])
def test_an_empty_value_is_refused(pair: str) -> None:
    semantics = "skyrl" if pair.startswith("tis") else "trl"
    result = invoke("analyze", BF16, "--semantics", semantics, "--set", pair)
    assert result.exit_code == 2 and f"{pair[:-1]} has an empty value" in result.stderr
    assert "Unknown" not in result.stderr


def test_slime_mis_names_the_bound_the_user_set() -> None:
    result = invoke("analyze", BF16, "--semantics", "slime-mis", "--set", "use_tis=true", "--set", "use_rs=true",
                    "--set", "tis_mode=mask", "--set", "tis_lower_bound=0.5", "--set", "tis_upper_bound=2",
                    "--set", "rs_upper_bound=0.4")
    assert result.exit_code == 2
    assert "rs_lower_bound (unset, so tis_lower_bound's) = 0.5" in result.stderr


@pytest.mark.parametrize("cp_size", [2.0, "2", True])
def test_a_miles_cp_size_of_another_type_is_refused(tmp_path: Path, cp_size) -> None:
    path = write_miles_dump(tmp_path / "train_data" / "3_0.pt", cp_size)
    result = invoke("analyze", str(path))
    assert result.exit_code == 3 and "cp_size must be a whole number" in result.stderr
    assert repr(cp_size) in result.stderr


def test_a_missing_label_is_its_own_group(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    old = [(-rng.exponential(1, 20)).astype(np.float32) for _ in range(6)]
    path = tmp_path / "labels.parquet"
    pq.write_table(pa.table({"old_log_probs": [list(o) for o in old], "rollout_log_probs": [list(o) for o in old],
                             "response_mask": [[1] * 20] * 6, "env": ["a", None, "null", "a", None, "null"]}), path)
    result = invoke("analyze", str(path), "--by", "env", "--format", "json", "--bootstrap", "0")
    groups = {g["group"]: g["valid_tokens"] for g in json.loads(result.stdout)["groups"]["env"]}
    assert groups == {None: 40, "a": 40, "null": 40}


def test_a_null_advantage_under_prime_rl_is_counted_and_warned(tmp_path: Path) -> None:
    import sys

    sys.path.append(str(ROOT / "tests" / "io"))  # the dump writers live next to the reader tests
    from framework_dumps import make_seqs, prime_record, write_prime

    seqs = make_seqs(seed=3, count=4)
    records = [prime_record(s, 0, 0, i) for i, s in enumerate(seqs)]
    position = records[0]["loss_mask"].index(True)
    records[0]["advantages"][position] = None
    write_prime(str(tmp_path), 0, 0, seqs, records=records)
    result = invoke("analyze", str(tmp_path), "--semantics", "prime-rl", "--format", "json", "--bootstrap", "0")
    assert result.exit_code == 0, result.output
    warnings = json.loads(result.stdout)["warnings"]
    assert any(w.startswith("overall: 1 valid token has a null advantage") for w in warnings), warnings


def test_the_same_file_under_two_names_is_one_run(tmp_path: Path) -> None:
    first, link = tmp_path / "a.parquet", tmp_path / "a_link.parquet"
    shutil.copy(BF16, first)
    os.link(first, link)
    result = invoke("compare", str(first), str(link), BF16.replace("bf16", "fp8"))
    assert result.exit_code == 2 and "the same run is given twice" in result.stderr
    both = json.loads(invoke("analyze", str(first), str(link), "--format", "json", "--bootstrap", "0").stdout)
    alone = json.loads(invoke("analyze", str(first), "--format", "json", "--bootstrap", "0").stdout)
    assert both["metrics"]["diag/valid_tokens"] == alone["metrics"]["diag/valid_tokens"]


@pytest.mark.parametrize("args", [("replay", BF16, "--html", "-"),
                                  ("check", BF16, "--fail-on", "chi2_token<=1", "--junit-xml", "-")])
def test_a_dash_is_never_a_file_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args) -> None:
    monkeypatch.chdir(tmp_path)
    result = invoke(*args)
    assert result.exit_code == 2 and "standard output already carries" in result.stderr
    assert not (tmp_path / "-").exists()


def test_a_refused_pickle_field_names_the_global(tmp_path: Path) -> None:
    import io as bytes_io

    from mismatch_cli.errors import InputError
    from mismatch_cli.io.skyrl import _decode

    class Payload:
        def __reduce__(self):
            return (os.system, ("echo never",))

    buffer = bytes_io.BytesIO()
    torch.save({"x": Payload()}, buffer)
    with pytest.raises(InputError) as caught:
        _decode({"format": "torch", "data": buffer.getvalue()}, "old_log_probs", "dump.pkl")
    text = str(caught.value)
    assert "refused key 'old_log_probs'" in text and "system" in text
    assert "\x1b[" not in text and "truncated" not in text and "weights_only=False" not in text


def test_config_errors_name_the_file_and_a_conflict_is_named(tmp_path: Path) -> None:
    config = tmp_path / "m.toml"
    config.write_text('[correction]\nsemantics = "skyrl"\ntis_ratio_type = "bogus"\n')
    result = invoke("analyze", BF16, "--config", str(config))
    assert result.exit_code == 2 and f"{config}: [correction]" in result.stderr
    conflict = invoke("analyze", BF16, "--config", str(config), "--semantics", "trl")
    assert conflict.exit_code == 2 and "--semantics trl conflicts with semantics = \"skyrl\"" in conflict.stderr


def test_undefined_is_not_called_an_overflow() -> None:
    from mismatch_cli.engine import INFINITE_NOTE, UNDEFINED_NOTE

    assert "overflow" not in UNDEFINED_NOTE and "undefined" in UNDEFINED_NOTE and "overflow" in INFINITE_NOTE


def test_check_says_which_steps_it_left_out(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    old = [(-rng.exponential(1, 20)).astype(np.float32) for _ in range(6)]
    rollout = [(o + rng.normal(0, 0.01, 20)).astype(np.float32) for o in old]
    path = tmp_path / "steps.parquet"
    pq.write_table(pa.table({"old_log_probs": [list(o) for o in old], "rollout_log_probs": [list(r) for r in rollout],
                             "response_mask": [[1] * 20] * 4 + [[0] * 20] * 2, "step": [1, 1, 2, 2, 3, 3]}), path)
    rule = ("--fail-on", "max(step:abs(kl))<=0.1", "--by", "step", "--bootstrap", "0")
    table = invoke("check", str(path), *rule)
    assert table.exit_code == 0 and "left out (step 3)" in " ".join(table.stdout.split() + table.stderr.split())
    data = json.loads(invoke("check", str(path), *rule, "--format", "json").stdout)
    assert any("left out (step 3)" in w for w in data["rules"][0]["warnings"])
    junit = tmp_path / "junit.xml"
    invoke("check", str(path), *rule, "--junit-xml", str(junit))
    assert "left out (step 3)" in junit.read_text()
