"""A cell on one host starts its longest tests first by their seconds in the newest run the results folder kept
(harness.results.durations): `harness run` hands them to the cell's pytest as `--pack-durations`. Kept runs are
untrusted input: a link is not followed, and a time that is not a finite, non-negative number is left out."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

from env_helpers import CELL

from harness.engines.base import pytest_command
from harness.engines.local import run_pytest
from harness.results.durations import earlier_durations

SUITE_ID = "suite/test_seen.py"


def junit(*tests: tuple[str, str]) -> str:
    cases = "".join(f'<testcase classname="suite.test_seen" name="{name}" file="{SUITE_ID}" time="{time}"/>'
                    for name, time in tests)
    return f'<testsuites><testsuite name="pytest" tests="{len(tests)}">{cases}</testsuite></testsuites>'


def kept_run(results: Path, started: str, cell_id: str, text: str) -> Path:
    folder = results / ".earlier" / started / cell_id
    folder.mkdir(parents=True)
    (folder / "junit.xml").write_text(text)
    return folder


def test_the_newest_kept_run_of_the_cell_gives_each_tests_seconds(tmp_path):
    kept_run(tmp_path, "20261201T000000Z", CELL.id, junit(("test_a", "9.0")))
    kept_run(tmp_path, "20261205T000000Z", CELL.id, junit(("test_a", "2.5"), ("test_c", "-1"),
                                                          ("test_d", "0.25")))
    kept_run(tmp_path, "20261206T000000Z", "another-cell", junit(("test_a", "7.0")))
    assert earlier_durations(tmp_path, CELL.id) == {f"{SUITE_ID}::test_a": 2.5, f"{SUITE_ID}::test_d": 0.25}


def test_no_kept_run_a_linked_one_or_an_unreadable_one_gives_none(tmp_path):
    assert earlier_durations(tmp_path, CELL.id) == {}
    elsewhere = kept_run(tmp_path / "outside", "20261201T000000Z", CELL.id, junit(("test_a", "1.0")))
    (tmp_path / ".earlier").mkdir()
    os.symlink(elsewhere.parent, tmp_path / ".earlier" / "20261207T000000Z")
    kept_run(tmp_path, "20261205T000000Z", CELL.id, "<testsuites><testsuite")  # truncated
    assert earlier_durations(tmp_path, CELL.id) == {}


def test_the_command_names_the_durations_only_for_a_packed_cell_on_one_host(tmp_path):
    durations = tmp_path / "durations.json"
    packed = pytest_command(CELL, Path("python"), tmp_path, [], pack_tests=True, durations=durations)
    assert f"--pack-durations={durations}" in packed
    assert not any(arg.startswith("--pack-durations") for arg in pytest_command(
        CELL, Path("python"), tmp_path, [], pack_tests=False, durations=durations))
    across_hosts = dataclasses.replace(CELL, hosts=2)
    assert not any(arg.startswith("--pack-") for arg in pytest_command(
        across_hosts, Path("python"), tmp_path, [], pack_tests=True, durations=durations))


SEEN_TEST = """
import json
import os
from pathlib import Path


def test_a(request):
    given = request.config.getoption("pack_durations")
    Path(os.environ["DURATIONS_SEEN"]).write_text(json.dumps(json.loads(Path(given).read_text()) if given else None))
"""


def test_a_packed_cell_is_handed_the_seconds_of_its_last_kept_run(tmp_path, monkeypatch):
    project = tmp_path / "project"
    (project / "suite").mkdir(parents=True)
    (project / "suite" / "test_seen.py").write_text(SEEN_TEST)
    results = tmp_path / "results"
    cell = dataclasses.replace(CELL, suite=("suite",))
    kept_run(results, "20261205T000000Z", cell.id, junit(("test_a", "4.0")))
    folder = results / cell.id
    folder.mkdir()
    seen = tmp_path / "seen.json"
    monkeypatch.setenv("DURATIONS_SEEN", str(seen))
    for pack_tests, expected in ((True, {f"{SUITE_ID}::test_a": 4.0}), (False, None)):
        exit_code, timed_out = run_pytest(cell, Path(sys.executable), folder, [], [], lambda line: None,
                                          project=project, echo=lambda data: None, pack_tests=pack_tests)
        assert (exit_code, timed_out) == (0, False), (folder / "pytest.log").read_text()
        assert json.loads(seen.read_text()) == expected
