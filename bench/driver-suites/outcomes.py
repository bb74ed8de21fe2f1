"""pytest plugin: one JSON line per finished test in $SUITE_OUTCOMES.

Written as each test ends, so a suite cut short by its time bound still
leaves the outcomes of every test that finished.
"""

import json
import os

_PHASES = {}


def _summary(report):
    """The last `E   ` line of a failure (the exception), or its last line."""
    text = report.longreprtext or ""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    errors = [ln[1:].strip() for ln in lines if ln.startswith("E ")]
    if errors:
        return errors[-1][:300]
    return (lines[-1].strip() if lines else "")[:300]


def pytest_runtest_logreport(report):
    entry = _PHASES.setdefault(report.nodeid, {"outcome": "passed", "error": ""})
    if report.failed and entry["outcome"] != "failed":
        entry["outcome"] = "failed"
        entry["error"] = f"{report.when}: {_summary(report)}"
    elif report.skipped and report.when in ("setup", "call") and entry["outcome"] == "passed":
        entry["outcome"] = "skipped"
    if report.when == "teardown":
        with open(os.environ["SUITE_OUTCOMES"], "a", encoding="utf-8") as f:
            f.write(json.dumps({"id": report.nodeid, **_PHASES.pop(report.nodeid)}) + "\n")
