"""A pytest plugin for the benchmarks: each test's outcome is appended to a file the moment the test ends, so a run
cut at its time limit (before pytest writes junit.xml) still says which tests it finished and how.

    python -m pytest -p outcome_stream --outcome-stream PATH ...   (tests/benchmarks on sys.path)

One JSON line per test: {"test": "<classname>::<name>", "outcome": passed|failure|error|skipped|xfailed,
"duration_s": its phases' seconds}, with the test named and its outcome classed as in junit.xml, so a cut run and a
finished one compare test by test. In a packed run the coordinator streams the reports it replays from its workers;
the workers, which inherit the option, stream nothing, so each test is one line.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--outcome-stream", metavar="PATH", help="append each ended test's outcome here (JSON lines)")


def pytest_configure(config: pytest.Config) -> None:
    path = config.getoption("outcome_stream")
    if path and not getattr(config.option, "pack_worker", None):  # a packed worker's reports reach the coordinator
        config.pluginmanager.register(OutcomeStream(Path(path)), "outcome-stream-writer")


class OutcomeStream:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.phases: dict[str, list[pytest.TestReport]] = {}  # a running test's reports so far

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        reports = self.phases.setdefault(report.nodeid, [])
        reports.append(report)
        if report.when != "teardown":
            return
        del self.phases[report.nodeid]
        with self.path.open("a", encoding="utf-8") as stream:
            stream.write(json.dumps({"test": junit_name(report.nodeid), "outcome": outcome(reports),
                                     "duration_s": round(sum(report.duration for report in reports), 3)}) + "\n")


def outcome(reports: list[pytest.TestReport]) -> str:
    """A test's outcome from its phases' reports, classed as junit.xml classes it."""
    by_phase = {report.when: report for report in reports}
    call = by_phase.get("call")
    if any(report.failed for phase, report in by_phase.items() if phase != "call"):
        return "error"
    if call is not None and call.failed:
        return "failure"
    expected_to_fail = next((report for report in reports if hasattr(report, "wasxfail")), None)
    if expected_to_fail is not None:  # an unexpected pass that is not strict is a pass, as in junit.xml
        return "xfailed" if expected_to_fail.skipped else "passed"
    if any(report.skipped for report in reports):
        return "skipped"
    return "passed"


def junit_name(nodeid: str) -> str:
    """`tests/a/test_b.py::test_c[x]` as junit.xml's `tests.a.test_b::test_c[x]` (classname::name)."""
    path, _, name = nodeid.partition("::")
    module = path.removesuffix(".py").replace("/", ".")
    if "::" in name:  # a test in a class: the class joins the classname
        cls, _, name = name.rpartition("::")
        module = f"{module}.{cls.replace('::', '.')}"
    return f"{module}::{name}"
