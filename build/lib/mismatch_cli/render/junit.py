"""JUnit XML for `mismatch check`: one test case per rule, so CI systems list each limit."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from mismatch_cli.gate.thresholds import CheckResult

SUITE = "mismatch check"


def render_junit(result: CheckResult, input_label: str = "") -> str:
    """A <testsuites> document: failures for breaches, errors for unevaluated rules, skips for warn/skip."""
    outcomes = result.outcomes
    counts = {
        "tests": len(outcomes),
        "failures": sum(o.status == "fail" for o in outcomes),
        "errors": sum(o.status == "error" for o in outcomes),
        "skipped": sum(o.status in ("warn", "skip") for o in outcomes),
    }
    suites = ET.Element("testsuites", {k: str(v) for k, v in counts.items()}, name=SUITE)
    suite = ET.SubElement(suites, "testsuite", {k: str(v) for k, v in counts.items()}, name=SUITE)
    if input_label:
        properties = ET.SubElement(suite, "properties")
        ET.SubElement(properties, "property", name="input", value=input_label)
    for outcome in outcomes:
        case = ET.SubElement(suite, "testcase", name=outcome.rule.text, classname="mismatch.check", time="0")
        if outcome.status == "fail":
            failure = ET.SubElement(case, "failure", message=outcome.message, type="breach")
            failure.text = f"{outcome.rule.describe()}: {outcome.message}"
        elif outcome.status == "error":
            error = ET.SubElement(case, "error", message=outcome.message, type="missing")
            error.text = outcome.message
        elif outcome.status in ("warn", "skip"):
            ET.SubElement(case, "skipped", message=outcome.message)
        else:  # pass, or held back as noise: a passing case whose output says which
            if outcome.status == "held":
                properties = ET.SubElement(case, "properties")
                ET.SubElement(properties, "property", name="held_back", value="noise")
            out = ET.SubElement(case, "system-out")
            out.text = outcome.message
        if outcome.warnings:
            err = ET.SubElement(case, "system-err")
            err.text = "\n".join(f"warning: {warning}" for warning in outcome.warnings)
    ET.indent(suites)
    return ET.tostring(suites, encoding="unicode", xml_declaration=True) + "\n"


__all__ = ["render_junit"]
