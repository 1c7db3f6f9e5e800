"""`harness known-bugs verify RESULTS`: each entry's newest release seen moves forward from real results folders
(junit.xml with the suite's known-bug properties, env.json with the cell's versions), never back, and nothing
untrusted reaches the table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness import cli
from harness.contract import ENV_JSON, JUNIT_XML, KNOWN_BUG, KNOWN_BUG_FIXED

SUITE_TABLE = Path(__file__).resolve().parents[1] / "gpu" / "upstream/known_bugs_verified.json"


def write_cell(results: Path, cell_id: str, versions: dict[str, str], cases: list[tuple[str, str, str | None]]) -> None:
    """cases: (name, outcome, property) with outcome xfailed (property: KNOWN_BUG key), xpassed (KNOWN_BUG_FIXED
    key, reported failed as a strict XPASS) or passed."""
    folder = results / cell_id
    folder.mkdir(parents=True)
    (folder / ENV_JSON).write_text(json.dumps({
        "schema": 1, "cell": {"id": cell_id, "gpu": "cpu", "gpus": 2, "torch": versions["torch"],
                              "transformers": versions["transformers"]},
        "status": "failed", "exit_code": 1, "versions": versions,
    }))
    testcases = []
    for name, outcome, key in cases:
        properties = ""
        if outcome == "xfailed":
            properties = f'<properties><property name="{KNOWN_BUG}" value="{key}"/></properties>'
            body = '<skipped type="pytest.xfail" message="known upstream bug: ..."/>'
        elif outcome == "xpassed":
            properties = f'<properties><property name="{KNOWN_BUG_FIXED}" value="{key}"/></properties>'
            body = '<failure message="[XPASS(strict)] fixed upstream: close the range">XPASS</failure>'
        else:
            body = ""
        testcases.append(f'<testcase classname="tests.gpu.test_training" name="{name}" time="1.0">'
                         f"{properties}{body}</testcase>")
    (folder / JUNIT_XML).write_text(
        f'<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" tests="{len(testcases)}">'
        f'{"".join(testcases)}</testsuite></testsuites>'
    )


def write_table(path: Path, entries: dict) -> Path:
    path.write_text(json.dumps({"schema": 1, "entries": entries}, indent=2) + "\n")
    return path


def verify(table: Path, *results: Path, dry_run: bool = False) -> int:
    return cli.main(["known-bugs", "verify", "--table", str(table), *(["--dry-run"] if dry_run else []),
                     *map(str, results)])


def test_verify_moves_each_matched_entry_to_the_newest_release_it_was_seen_on(tmp_path, capsys):
    table = write_table(tmp_path / "verified.json", {
        "alpha-bug": {"transformers": "5.24.0", "torch": "2.13.0"},
        "beta-bug": {"transformers": "5.24.0", "torch": "2.13.0"},
        "gamma-bug": {"transformers": "5.17.0", "torch": "2.13.0"},
        "delta-bug": {},  # a new entry: filled from the first results that show it
    })
    results = tmp_path / "results"
    write_cell(results, "cpu-2rank-torch2.13.0-tf5.25.0", {"transformers": "5.25.0", "torch": "2.13.0+cpu"},
               [("test_a[x]", "xfailed", "alpha-bug"), ("test_b[x]", "passed", None)])
    write_cell(results, "cpu-2rank-torch2.15.0-tf5.24.0", {"transformers": "5.24.0", "torch": "2.15.0"},
               [("test_a[x]", "xfailed", "alpha-bug"), ("test_c[x]", "xfailed", "beta-bug"),
                ("test_d[x]", "xfailed", "delta-bug")])
    write_cell(results, "cpu-2rank-torch2.11.0-tf5.20.0", {"transformers": "5.20.0", "torch": "2.11.0"},
               [("test_c[x]", "xfailed", "beta-bug")])  # older than what the table holds: never moves it back
    assert verify(table, results) == 0
    entries = json.loads(table.read_text())["entries"]
    assert entries == {
        "alpha-bug": {"transformers": "5.25.0", "torch": "2.15.0"},
        "beta-bug": {"transformers": "5.24.0", "torch": "2.15.0"},
        "gamma-bug": {"transformers": "5.17.0", "torch": "2.13.0"},  # not seen: untouched
        "delta-bug": {"transformers": "5.24.0", "torch": "2.15.0"},
    }
    out = capsys.readouterr().out
    assert "alpha-bug: transformers 5.24.0 -> 5.25.0" in out and "alpha-bug: torch 2.13.0 -> 2.15.0" in out
    assert "delta-bug: transformers (none) -> 5.24.0" in out
    assert "5 cases matched 3 entries; 5 releases moved forward" in out


def test_verify_lists_a_fixed_entry_and_leaves_closing_its_range_to_a_person(tmp_path, capsys):
    table = write_table(tmp_path / "verified.json", {"alpha-bug": {"transformers": "5.24.0", "torch": "2.13.0"}})
    results = tmp_path / "results"
    write_cell(results, "cpu-2rank-torch2.13.0-tf5.25.0", {"transformers": "5.25.0", "torch": "2.13.0"},
               [("test_a[x]", "xpassed", "alpha-bug")])
    before = table.read_text()
    assert verify(table, results) == 0
    assert table.read_text() == before
    assert ("fixed upstream: alpha-bug passed on torch 2.13.0, transformers 5.25.0 (tests.gpu.test_training::"
            "test_a[x] in cpu-2rank-torch2.13.0-tf5.25.0): close its range") in capsys.readouterr().out


def test_verify_dry_run_writes_nothing(tmp_path, capsys):
    table = write_table(tmp_path / "verified.json", {"alpha-bug": {"transformers": "5.24.0", "torch": "2.13.0"}})
    results = tmp_path / "results"
    write_cell(results, "c1", {"transformers": "5.25.0", "torch": "2.13.0"}, [("test_a[x]", "xfailed", "alpha-bug")])
    before = table.read_text()
    assert verify(table, results, dry_run=True) == 0
    assert table.read_text() == before
    assert "(dry run: nothing written)" in capsys.readouterr().out


@pytest.mark.parametrize(("versions", "key"), [
    ({"transformers": "5.25.0; rm -rf /", "torch": "2.13.0"}, "alpha-bug"),  # not a release: never written
    ({"transformers": "99.0.0", "torch": "2.13.0"}, "not-in-the-table"),  # an unknown key: reported, ignored
])
def test_verify_takes_nothing_untrusted_into_the_table(tmp_path, capsys, versions, key):
    table = write_table(tmp_path / "verified.json", {"alpha-bug": {"transformers": "5.24.0", "torch": "2.13.0"}})
    results = tmp_path / "results"
    write_cell(results, "c1", versions, [("test_a[x]", "xfailed", key)])
    assert verify(table, results) == 0
    assert json.loads(table.read_text())["entries"] == {"alpha-bug": {"transformers": "5.24.0", "torch": "2.13.0"}}
    if key == "not-in-the-table":
        assert "ignored: the results name 'not-in-the-table'" in capsys.readouterr().out


@pytest.mark.parametrize(("text", "names"), [
    ("{not json", "not readable as JSON"),
    ('{"schema": 2, "entries": {}}', 'expected {"schema": 1'),
    ('{"schema": 1, "entries": {"a": {"transformers": "5.x"}}}', "entries.a.transformers: '5.x' is not a release"),
    ('{"schema": 1, "entries": {"a": {"jax": "0.4.0"}}}', "entries.a: expected an object of transformers, torch"),
])
def test_a_bad_table_is_one_line_naming_the_file_and_key_and_exit_2(tmp_path, capsys, text, names):
    table = tmp_path / "verified.json"
    table.write_text(text)
    results = tmp_path / "results"
    write_cell(results, "c1", {"transformers": "5.25.0", "torch": "2.13.0"}, [("test_a[x]", "xfailed", "a")])
    assert verify(table, results) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and str(table) in error and names in error


def test_the_suites_table_is_what_the_command_reads():
    from harness.upstream.verify import read_table

    entries = read_table(SUITE_TABLE)
    assert entries and all(set(seen) <= {"transformers", "torch"} for seen in entries.values())
