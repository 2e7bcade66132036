"""Numbers and threshold flags are read strictly: no '_' digit separators, nan, inf or overflow; bands are bands."""

from __future__ import annotations

import json
from decimal import Decimal, InvalidOperation

import pytest
from conftest import ROOT, assert_clean_failure, mismatch, snapshot
from hypothesis import given, settings
from hypothesis import strategies as st

from mismatch_cli.correction import parse_is_threshold, parse_rs_thresholds
from mismatch_cli.errors import UsageError
from mismatch_cli.system.numbers import check_threshold_text, parse_band, parse_integer, parse_number

DUMP = ROOT / "sample_data" / "single_turn.parquet"


# ------------------------------------------------------------------------------------ a reference model


def reference_number(text: str) -> float | None:
    """What a plain decimal / scientific literal means, by hand (no regex, no float()): None if not one."""
    body = text.strip()
    if body[:1] in "+-":
        body = body[1:]
    mantissa, _, exponent = body.replace("E", "e").partition("e")
    if "e" in body.replace("E", "e") and not exponent:
        return None
    if exponent:
        digits = exponent[1:] if exponent[:1] in "+-" else exponent
        if not digits or not all(c in "0123456789" for c in digits):
            return None
    whole, dot, fraction = mantissa.partition(".")
    if not (whole or fraction) or not all(c in "0123456789" for c in whole + fraction):
        return None
    try:
        value = float(Decimal(text.strip()))  # Decimal -> float rounds correctly, as a parser must
    except InvalidOperation:  # an exponent past Decimal's own range: far past float's too (inf or 0)
        return None
    if value in (float("inf"), float("-inf")) or (value == 0 and any(c in "123456789" for c in whole + fraction)):
        return None
    return value


def reference_band(text: str) -> tuple[float | None, float] | None:
    parts = text.strip().split("_")
    if len(parts) > 2:
        return None
    values = [reference_number(p) for p in parts]
    if any(v is None for v in values):
        return None
    return (None, values[0]) if len(values) == 1 else (values[0], values[1])


LITERAL_CHARS = st.sampled_from(list("0123456789") * 3 + list("._eE+- ") + ["nan", "inf", "x", "1e999", "1e-999"])
TEXTS = st.lists(LITERAL_CHARS, min_size=1, max_size=10).map("".join)


@settings(max_examples=600, deadline=None)
@given(TEXTS)
def test_parse_number_agrees_with_the_reference(text):
    expected = reference_number(text)
    if expected is None:
        with pytest.raises(UsageError):
            parse_number(text, "--x")
    else:
        assert parse_number(text, "--x") == expected


@settings(max_examples=600, deadline=None)
@given(st.lists(st.one_of(TEXTS, st.just("_")), min_size=1, max_size=4).map("".join))
def test_parse_band_agrees_with_the_reference(text):
    expected = reference_band(text)
    if expected is None:
        with pytest.raises(UsageError):
            parse_band(text, "--x")
    else:
        assert parse_band(text, "--x") == expected


@settings(max_examples=300, deadline=None)
@given(st.floats(min_value=1e-6, max_value=1e6), st.floats(min_value=1e-6, max_value=1e6))
def test_a_band_is_never_read_as_one_number(lower, upper):
    # float("0.5_5") == 0.55: the underscore must split the band, never join the digits.
    text = f"{lower!r}_{upper!r}"
    assert parse_band(text, "rollout_is_threshold") == (lower, upper)
    if lower <= upper:
        threshold = parse_is_threshold(text)
        assert (threshold.lower, threshold.upper) == (lower, upper)


@pytest.mark.parametrize("text", ["0.5_5", "5_0.5", "1_000", "nan", "inf", "-inf", "Infinity", "1e999", "1e-400",
                                  "0x10", "2,5", "", " ", "1__0", "_1", "1_", "½", "٣"])
def test_python_float_accepts_what_we_refuse(text):
    with pytest.raises(UsageError) as info:
        parse_number(text, "--is-threshold")
    assert "--is-threshold" in str(info.value) and info.value.hint


@pytest.mark.parametrize(("text", "value"), [("2", 2.0), (" 2 ", 2.0), ("+.5", 0.5), ("5.", 5.0), ("1E-3", 1e-3),
                                             ("-0", 0.0), ("1e308", 1e308)])
def test_plain_literals(text, value):
    assert parse_number(text, "x") == value


def test_parse_integer_refuses_separators_and_bounds():
    assert parse_integer(" 12 ", "--n", 0, 20, "hint") == 12
    for bad in ("1_0", "1.0", "1e3", "", "ten", True, 2.0):
        with pytest.raises(UsageError):
            parse_integer(bad, "--n", 0, 100, "hint")
    with pytest.raises(UsageError, match="between 0 and 20"):
        parse_integer("21", "--n", 0, 20, "hint")


def test_rs_thresholds_use_the_same_grammar():
    (k1, k3) = parse_rs_thresholds(["seq_mean_k1", "seq_mean_k3"], "0.5_2, 0.05")
    assert (k1.lower, k1.upper, k3.upper) == (0.5, 2.0, 0.05)
    for bad in ("0.5_2_3", "1_0", "nan", "0.5_x"):
        with pytest.raises(UsageError):
            parse_rs_thresholds(["seq_mean_k3"], bad)
    with pytest.raises(UsageError, match="positive"):
        parse_rs_thresholds(["token_k1"], 0)  # was a ZeroDivisionError inside 1/U
    with pytest.raises(UsageError):
        parse_rs_thresholds(["token_k2"], float("nan"))


def test_threshold_text_is_one_grammar_for_lists():
    assert check_threshold_text(" 0.5_2.0, 0.05 ", "--rs-threshold") == "0.5_2.0, 0.05"
    for bad in ("0.5_2.0,abc", ",", "1_0_0"):
        with pytest.raises(UsageError):
            check_threshold_text(bad, "--rs-threshold")


# ---------------------------------------------------------------------------------------------- the CLI


def _config(tmp_path, *args):
    out = tmp_path / "out"
    run = mismatch("analyze", DUMP, *args, "--bootstrap", "0", "--no-plots", "--out-dir", out, "-q")
    assert run.code == 0, run.stderr
    return json.loads((out / "report.json").read_text())["config"]


def test_is_band_is_a_band_not_a_number(tmp_path):
    config = _config(tmp_path, "--is", "token", "--is-threshold", "0.5_5")
    assert config["rollout_is_threshold"] == "0.5_5"  # IcePop [0.5, 5], not TIS 0.55


def test_rs_band_is_a_band_not_a_number(tmp_path):
    config = _config(tmp_path, "--rs", "seq_mean_k1", "--rs-threshold", "0.5_2")
    assert config["rollout_rs_threshold"] == "0.5_2"


@pytest.mark.parametrize(
    ("args", "mentions"),
    [
        (["--is", "token", "--is-threshold", "5_0.5"], ["rollout_is_threshold", "5_0.5"]),
        (["--is", "token", "--is-threshold", "nan"], ["--is-threshold", "nan"]),
        (["--is", "token", "--is-threshold", "1e999"], ["--is-threshold", "1e999"]),
        (["--is", "token", "--is-threshold", "0.5_5_6"], ["--is-threshold"]),
        (["--rs", "seq_mean_k3", "--rs-threshold", "1_0"], ["seq_mean_k3", "1_0"]),
        (["--semantics", "verl-0.7.0", "--is", "token", "--is-threshold", "abc"], ["--is-threshold", "abc"]),
        (["--semantics", "verl-0.7.0", "--is", "token", "--is-threshold", "0"], ["rollout_is_threshold"]),
        (["--semantics", "verl-0.7.0", "--veto-threshold", "abc"], ["--veto-threshold", "abc"]),
        (["--semantics", "verl-0.7.0", "--rs", "sequence", "--rs-threshold", "0"], ["rollout_rs_threshold", "0"]),
        (["--semantics", "verl-0.7.0", "--rs", "sequence", "--rs-threshold", "2", "--rs-threshold-lower", "x"],
         ["--rs-threshold-lower"]),
        (["--semantics", "verl-0.6.0", "--is-threshold", "abc"], ["--is-threshold", "abc"]),
        (["--semantics", "verl-0.6.0", "--is-threshold", "0"], ["rollout_is_threshold", "0"]),
        (["--semantics", "verl-0.6.0", "--is-threshold", "2", "--is-threshold-lower", "1_0"], ["1_0"]),
        (["--semantics", "xtuner", "--is-threshold", "2,abc"], ["rollout_is_threshold", "abc"]),
        (["--semantics", "xtuner", "--is-threshold", "2,0.5", "--veto-threshold", "inf,0"], ["inf"]),
        (["--bootstrap", "100000000"], ["--bootstrap", "10000"]),
        (["--bootstrap", "-1"], ["--bootstrap"]),
        (["--bootstrap", "1_0"], ["--bootstrap", "1_0"]),
    ],
)
def test_bad_numbers_are_exit_2_and_write_nothing(tmp_path, args, mentions):
    out = tmp_path / "out"
    before = snapshot(tmp_path)
    line = assert_clean_failure(mismatch("analyze", DUMP, *args, "--out-dir", out), 2, *mentions)
    assert "; fix: " in line
    assert snapshot(tmp_path) == before and not out.exists()


@pytest.mark.parametrize("args", [["--tokens", "1_000"], ["--noise", "1_0"], ["--noise", "nan"],
                                  ["--empty-rows", "inf"], ["--seed", "0x1"]])
def test_synth_numbers_are_strict(tmp_path, args):
    target = tmp_path / "s.parquet"
    assert_clean_failure(mismatch("synth", target, *args), 2, args[0])
    assert not target.exists()


def test_compare_of_reports_still_refuses_a_bad_threshold(tmp_path):
    # With two reports nothing is analyzed, but a bad correction flag must not pass silently.
    report = tmp_path / "r.json"
    report.write_text("{}")
    assert_clean_failure(mismatch("compare", report, report, "--is", "token", "--is-threshold", "1_0_0"), 2,
                         "--is-threshold")


def test_fail_on_limit_is_strict(tmp_path):
    assert_clean_failure(mismatch("check", DUMP, "--fail-on", "rollout_corr/kl<=1e999"), 2, "1e999")


def test_a_tis_bound_below_float32_is_named_as_tis(tmp_path):
    # 1e-320 is a valid float64 but 0 in float32: every weight is truncated to 0 (verl divides by zero there).
    line = assert_clean_failure(mismatch("analyze", DUMP, "--is", "token", "--is-threshold", "1e-320", "--bootstrap",
                                         "0"), 2, "TIS bound")
    assert "None" not in line and "IcePop" not in line
