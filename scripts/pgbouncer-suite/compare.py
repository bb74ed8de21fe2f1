#!/usr/bin/env python3
"""Counts the outcomes in a pytest JUnit XML report and compares each test's
outcome with a list of expected differences.

    compare.py REPORT.xml EXPECTED.txt
    compare.py RESULTS.txt EXPECTED.txt

REPORT.xml is pytest's JUnit XML; RESULTS.txt has one `OUTCOME NAME` a line
(what legacy.py writes for the shell suites).

EXPECTED.txt has one line per test that is not expected to pass:

    OUTCOME  FILE::TEST  -- why

OUTCOME is failed, error or skipped (failed and error are taken as one:
the test does not pass); `#` starts a comment. Every test not listed is expected to pass.
Exit status 0 when every outcome is the expected one.
"""
import sys
import xml.etree.ElementTree as ET


def outcomes(report):
    if not report.endswith(".xml"):
        with open(report, encoding="utf-8") as f:
            return {name: outcome for outcome, name in (line.split() for line in f if line.strip())}
    out = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        module = case.get("classname", "").split(".")[-1]
        name = f"{module}.py::{case.get('name')}"
        kinds = {child.tag for child in case}
        if "error" in kinds:
            outcome = "error"
        elif "failure" in kinds:
            outcome = "failed"
        elif "skipped" in kinds:
            outcome = "skipped"
        else:
            outcome = "passed"
        # A test that failed and then errored at teardown counts as failed.
        if outcome == "error" and "failure" in kinds:
            outcome = "failed"
        out[name] = outcome
    return out


def expected(path):
    out = {}
    try:
        lines = open(path, encoding="utf-8").read().splitlines()
    except FileNotFoundError:
        return out
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        outcome, name = line.split()[:2]
        out[name] = (outcome, line.partition("--")[2].strip())
    return out


def main():
    report, listed_path = sys.argv[1:3]
    got = outcomes(report)
    listed = expected(listed_path)
    counts = {}
    for outcome in got.values():
        counts[outcome] = counts.get(outcome, 0) + 1
    total = len(got)
    print(
        f"weir: {counts.get('passed', 0)} passed, {counts.get('failed', 0)} failed, "
        f"{counts.get('error', 0)} error, {counts.get('skipped', 0)} skipped (of {total})"
    )
    differ = []
    for name, outcome in sorted(got.items()):
        want = listed.get(name, ("passed", ""))[0]
        # A test that does not pass may fail in its body or at setup/teardown.
        same = outcome == want or {outcome, want} == {"failed", "error"}
        if not same:
            differ.append(f"  {name}: {outcome}, expected {want}")
    ran = set(got)
    stale = [n for n in listed if n not in ran]
    if differ:
        print(f"{len(differ)} outcome(s) differ from {listed_path}:")
        print("\n".join(differ))
    if stale and len(ran) > 100:
        print(f"{len(stale)} listed test(s) did not run: " + ", ".join(sorted(stale)))
    if not differ:
        print(f"every outcome is the one {listed_path} expects")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
