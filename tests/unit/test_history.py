"""The history database (harness.history) and `harness history append` / `harness trend`: migrations, idempotent
appends, hostile input, and the creep rule over generated nights."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import replace
from pathlib import Path

import pytest
from history_helpers import (
    CREEP_CELL,
    CREEP_TEST,
    SPIKE_TEST,
    Case,
    generated_night,
    stored,
    write_night,
)

from harness.cli import main
from harness.history import CONFIRM_NIGHTS, Night, creeps, migrations, open_history, schema_version
from harness.report.filters import code_span, significant


def append(db: Path, night: str, folder: Path, date: str) -> int:
    return main(["history", "append", "--db", str(db), "--night", night, "--date", date, str(folder)])


def history_of(tmp_path: Path, nights: int = 30, creep_from: int | None = None,
               last_night_cases=None) -> Path:
    db = tmp_path / "history.db"
    for night in range(nights):
        cells = generated_night(night, nights, creep_from=creep_from)
        if last_night_cases is not None and night == nights - 1:
            cells = last_night_cases(cells)
        folder = write_night(tmp_path / f"night{night}", cells)
        assert append(db, f"run-{night}", folder, f"2026-01-{night + 1:02d}T02:00:00+00:00") == 0
    return db


def trend(tmp_path: Path, db: Path, *extra: str) -> tuple[int, str, dict]:
    html, out = tmp_path / "trend.html", tmp_path / "trend.json"
    code = main(["trend", "--db", str(db), "--html", str(html), "--json", str(out), *extra])
    if code != 0:
        return code, "", {}
    return code, html.read_text(), json.loads(out.read_text())


def rows(db: Path, table: str) -> int:
    with sqlite3.connect(db) as connection:
        return connection.execute(f"SELECT count(*) FROM {table}").fetchone()[0]


# ---------------------------------------------------------------------------------------------
# Schema and migrations


def test_a_new_database_gets_every_migration(tmp_path):
    connection = open_history(tmp_path / "new.db", create=True)
    version = connection.execute("PRAGMA user_version").fetchone()[0]
    tables = {name for (name,) in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    connection.close()
    assert version == schema_version() == len(migrations()) >= 3
    assert {"nights", "cells", "names", "packed"} <= tables
    assert not {"tests", "results", "rank_peaks", "losses"} & tables  # version 2's, repacked by migration 3


def test_a_version_1_database_is_migrated_and_keeps_its_nights(tmp_path):
    db = tmp_path / "v1.db"
    connection = sqlite3.connect(db)
    connection.executescript(migrations()[0].sql)
    connection.execute("PRAGMA user_version = 1")
    connection.execute("INSERT INTO nights (night, night_date) VALUES ('old-night', '2025-12-01T02:00:00+00:00')")
    connection.commit()
    connection.close()
    folder = write_night(tmp_path / "night", {"cpu-2rank": [Case(losses=(2.0, 1.5, 1.2))]})
    assert append(db, "new-night", folder, "2025-12-02") == 0
    with sqlite3.connect(db) as connection:
        assert connection.execute("PRAGMA user_version").fetchone()[0] == schema_version()
        assert [night for (night,) in connection.execute("SELECT night FROM nights ORDER BY id")] == [
            "old-night", "new-night"]
    [test] = stored(db, "new-night").values()
    assert test.losses == pytest.approx((2.0, 1.5, 1.2), rel=1e-7)


def test_a_database_newer_than_the_code_is_refused(tmp_path, capsys):
    db = tmp_path / "future.db"
    with sqlite3.connect(db) as connection:
        connection.execute(f"PRAGMA user_version = {schema_version() + 1}")
        connection.execute("CREATE TABLE nights (id INTEGER)")
    folder = write_night(tmp_path / "night", {"cpu-2rank": [Case()]})
    assert append(db, "n1", folder, "2026-01-01") == 2
    assert trend(tmp_path, db)[0] == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 2 and all(f"schema version {schema_version() + 1}" in line and str(db) in line
                                   for line in lines)


@pytest.mark.parametrize("content", [b"<html>not a database</html>", b"SQLite format 3\x00" + b"\xff" * 200])
def test_a_file_that_is_not_a_history_is_refused_and_left_alone(tmp_path, capsys, content):
    db = tmp_path / "history.db"
    db.write_bytes(content)
    folder = write_night(tmp_path / "night", {"cpu-2rank": [Case()]})
    assert append(db, "n1", folder, "2026-01-01") == 2
    assert trend(tmp_path, db)[0] == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("harness: error: history database") for line in err)
    assert db.read_bytes() == content


def test_bad_arguments_exit_2_naming_the_value(tmp_path, capsys):
    folder = write_night(tmp_path / "night", {"cpu-2rank": [Case()]})
    db = tmp_path / "history.db"
    assert append(db, "n1", folder, "yesterday") == 2
    assert "--date 'yesterday'" in capsys.readouterr().err
    assert append(db, "n1\nforged", folder, "2026-01-01") == 2
    assert "--night" in capsys.readouterr().err
    assert main(["trend", "--db", str(tmp_path / "missing.db"), "--html", str(tmp_path / "t.html")]) == 2
    assert "missing.db does not exist" in capsys.readouterr().err
    assert not db.exists()


# ---------------------------------------------------------------------------------------------
# Appending


def test_appending_the_same_night_again_replaces_it(tmp_path):
    db = tmp_path / "history.db"
    first = write_night(tmp_path / "first", {"cpu-2rank": [Case(peaks_mib=(100.0, 200.0), losses=(2.0, 1.0))]})
    again = write_night(tmp_path / "again", {"cpu-2rank": [Case(peaks_mib=(300.0, 400.0), losses=(2.0, 1.0))]})
    assert append(db, "run-7", first, "2026-01-01") == 0
    counts = {table: rows(db, table) for table in ("nights", "cells", "names", "packed")}
    assert append(db, "run-7", again, "2026-01-01") == 0
    assert {table: rows(db, table) for table in counts} == counts == {"nights": 1, "cells": 1, "names": 1,
                                                                      "packed": 1}
    [test] = stored(db, "run-7").values()
    assert (test.peak_mib, test.rank_peaks, test.losses) == (400.0, ((0, 300.0), (1, 400.0)), (2.0, 1.0))


def test_what_a_night_stores_per_test(tmp_path):
    db = tmp_path / "history.db"
    folder = write_night(tmp_path / "night", {"cpu-2rank": [
        Case(test_id="tests/gpu/t.py::test_a", time_s=4.5, peaks_mib=(10.0, 30.0), error=2e-5, bound=1e-4),
        Case(test_id="tests/gpu/t.py::test_b", outcome="failed", error=3e-3, bound=1e-3)]})
    assert append(db, "n1", folder, "2026-01-01") == 0
    kept = [(test.test, test.outcome, test.time_s, test.peak_mib, test.error_over_bound)
            for _, test in sorted(stored(db, "n1").items())]
    assert kept[0] == ("tests/gpu/t.py::test_a", "passed", 4.5, 30.0, pytest.approx(0.2))
    assert kept[1][:2] == ("tests/gpu/t.py::test_b", "failed") and kept[1][4] == pytest.approx(3.0)


def test_hostile_values_are_stored_as_not_recorded_and_names_are_escaped(tmp_path):
    db = tmp_path / "history.db"
    name = 'tests/gpu/t.py::test_x[<script>alert(1)</script>"&]'
    cells = {"cpu-<img src=x onerror=alert(1)>": [
        Case(test_id=name, time_s="nan", peaks_mib=("inf", "1e308", "-5"), error="nan", bound="0",
             losses=("nan", "1e999", 1.0)),
        Case(test_id="tests/gpu/t.py::test_huge", time_s="1e400", peaks_mib=("99999999999999999999999",),
             error="1e300", bound="1e-300")]}
    for night in range(3):
        assert append(db, f"n{night}", write_night(tmp_path / f"n{night}", cells), f"2026-01-0{night + 1}") == 0
    kept = stored(db, "n2").values()
    values = sorted(((test.time_s, test.peak_mib, test.error_over_bound) for test in kept),
                    key=lambda kept_values: kept_values[1] is not None)
    peaks = sorted(peak for test in kept for _, peak in test.rank_peaks)
    # junit's reader reads a time it cannot use as 0; inf, nan, an overflowing ratio and 1e308 (out of the model's
    # range) as not recorded; 1e23 MiB is absurd but finite, and is kept (to float32's 7 digits).
    assert values == [(0.0, None, None), (0.0, pytest.approx(1e23, rel=1e-7), None)]
    assert peaks == [-5.0, pytest.approx(1e23, rel=1e-7)]  # what is finite and in range is kept as recorded
    assert sorted(test.losses for test in kept) == [(), (None, None, 1.0)]  # step 3 kept at its place
    code, html, data = trend(tmp_path, db)
    assert code == 0 and data["regressions"] == []
    assert "<script>" not in html and "<img" not in html and "&lt;script&gt;" in html


def test_a_tampered_database_cannot_inject_markup_or_break_the_json(tmp_path):
    db = history_of(tmp_path, nights=16)
    with sqlite3.connect(db) as connection:
        connection.execute("UPDATE names SET test = '<script>alert(1)</script>' WHERE test = ?", (CREEP_TEST,))
        connection.execute("UPDATE packed SET time_s = 'text', peak_mib = x'789c0300' WHERE"
                           " night = (SELECT max(id) FROM nights)")
        connection.execute("UPDATE packed SET outcomes = x'00ff', tests = -3 WHERE night = 1")
        connection.execute("UPDATE nights SET night = '<iframe>' WHERE id = 2")
    code, html, data = trend(tmp_path, db)
    assert code == 0
    assert "<script>" not in html and "<iframe>" not in html and "<b>" not in html
    assert data["regressions"] == []  # the last night's memory reads as not recorded: nothing to flag


# ---------------------------------------------------------------------------------------------
# The creep rule


def test_one_planted_creep_over_30_nights_is_the_one_regression(tmp_path):
    db = history_of(tmp_path, creep_from=27)
    code, html, data = trend(tmp_path, db)
    assert code == 0
    assert [(r["cell"], r["test"], r["metric"], r["nights_over"]) for r in data["regressions"]] == [
        (CREEP_CELL, CREEP_TEST, "peak_mib", 3)]
    regression = data["regressions"][0]
    assert 1.2 < regression["ratio"] < 1.4 and len(regression["last_values"]) == CONFIRM_NIGHTS
    assert all(value > regression["baseline"] * 1.1 for value in regression["last_values"])
    assert len(data["nights"]) == 30
    # Flagged first on the page: the regression table, then its plots before any other test's.
    assert html.index(CREEP_TEST) < html.index(SPIKE_TEST) if SPIKE_TEST in html else True
    sections = html.split('<section class="test')
    assert sections[1].startswith(" flagged") and CREEP_TEST in sections[1]
    assert sum(section.startswith(" flagged") for section in sections) == 1


def test_noise_and_a_one_night_spike_are_not_flagged(tmp_path):
    db = history_of(tmp_path)  # the spike test's time triples on the last night
    code, _, data = trend(tmp_path, db)
    assert code == 0 and data["regressions"] == []


def test_a_creep_that_fails_on_the_last_night_is_a_red_not_a_regression(tmp_path):
    def failing(cells):
        return {cell: [replace(case, outcome="failed") if case.test_id == CREEP_TEST else case
                       for case in cases] for cell, cases in cells.items()}

    db = history_of(tmp_path, creep_from=27, last_night_cases=failing)
    assert trend(tmp_path, db)[2]["regressions"] == []


def test_the_creep_found_again_when_the_page_shows_fewer_nights(tmp_path):
    db = history_of(tmp_path, creep_from=27)
    code, _, data = trend(tmp_path, db, "--nights", "3")
    assert code == 0 and len(data["nights"]) == 3 and len(data["regressions"]) == 1


def test_the_page_plots_up_to_its_cap_and_says_so(tmp_path, monkeypatch):
    monkeypatch.setattr("harness.history.trend.PLOTTED_TESTS", 5)
    monkeypatch.setattr("harness.report.trend_page.PLOTTED_TESTS", 5)
    db = history_of(tmp_path, creep_from=27)  # 2 cells x 10 tests
    code, html, data = trend(tmp_path, db)
    assert code == 0 and len(data["regressions"]) == 1
    assert html.count('<section class="test') == 5 and html.index(CREEP_TEST) < html.index('<section class="test')
    assert "5 of 20 tests (the page plots every regression and at most 5 tests in all)" in html


def passing(*values: float, metric: str = "peak_mib") -> list[Night]:
    return [Night(outcome="passed", values={metric: value}) for value in values]


@pytest.mark.parametrize(("series", "flagged"), [
    (passing(*[1000.0] * 14, 1200, 1200), ["peak_mib"]),           # two nights 20% over: a regression
    (passing(*[1000.0] * 14, 1000, 1200), []),                      # one night over: a spike
    (passing(*[1000.0] * 14, 1200, 1000), []),                      # over, then back
    (passing(*[1000.0] * 14, 1090, 1090), []),                      # under the 10% ratio
    (passing(*[100.0] * 14, 130, 130), []),                         # 30% but under the 64 MiB floor
    (passing(*[1000.0] * 6, 1200, 1200), []),                       # too short a baseline
    (passing(*[1000.0] * 10, 5000, 5000, 5000, 5000, 1200, 1200), ["peak_mib"]),  # a median, not a mean
    (passing(*[10.0] * 14, 12.0, 12.0, metric="time_s"), []),       # time: 20% is under its 25%
    (passing(*[10.0] * 14, 13.0, 13.0, metric="time_s"), ["time_s"]),
])
def test_the_rule(series, flagged):
    assert [creep.metric for creep in creeps(series)] == flagged


def test_failing_nights_are_not_a_baseline_and_not_a_creep():
    reds = [Night(outcome="failed", values={"peak_mib": 9000.0})] * 14
    assert creeps([*reds, *passing(1200, 1200)]) == ()
    assert creeps([*passing(*[1000.0] * 14, 1200), Night(outcome="failed", values={"peak_mib": 1200.0})]) == ()


# ---------------------------------------------------------------------------------------------
# The nightly issue's Creeping section (`harness gh nightly-issue --trend-json`)


def nightly_issue(tmp_path: Path, results: Path, trend_json: Path) -> int:
    return main(["gh", "nightly-issue", "--results", str(results), "--sha", "6dcb09b5b578",
                 "--trend-json", str(trend_json)])


def last_night_folder(tmp_path: Path, creep_from: int | None) -> Path:
    return write_night(tmp_path / "tonight", generated_night(29, 30, creep_from=creep_from))


def test_the_nightly_issue_lists_the_planted_creep_though_every_test_passed(fake, env, tmp_path, capsys):
    db = history_of(tmp_path, creep_from=27)
    assert trend(tmp_path, db)[0] == 0
    assert nightly_issue(tmp_path, last_night_folder(tmp_path, 27), tmp_path / "trend.json") == 0
    [issue] = fake.issues.values()
    assert "opened issue" in capsys.readouterr().out
    section = issue["body"].split("### Creeping (still passing)\n", 1)[1]
    [line] = [line for line in section.splitlines() if line.startswith("- ")]
    creep = json.loads((tmp_path / "trend.json").read_text())["regressions"][0]
    assert line.startswith(f"- `{CREEP_CELL}` `{CREEP_TEST}`: peak memory ")
    assert f"over the last 2 nights, baseline {significant(creep['baseline'])} MiB" in line
    assert f"(×{creep['ratio']:.2f}; threshold ×1.10" in line and "over it 3 nights running" in line


def test_a_one_night_spike_opens_no_issue(fake, env, tmp_path, capsys):
    db = history_of(tmp_path)  # the spike test's time triples on the last night only
    assert trend(tmp_path, db)[0] == 0
    assert nightly_issue(tmp_path, last_night_folder(tmp_path, None), tmp_path / "trend.json") == 0
    assert fake.issues == {} and "all green" in capsys.readouterr().out


def test_hostile_names_in_the_trend_json_stay_inside_their_code_spans(fake, env, tmp_path):
    cell, test = "cell-<img src=x onerror=alert(1)>", "t.py::test_x[``\n### forged heading](javascript:alert(1))]"
    trend_json = tmp_path / "trend.json"
    trend_json.write_text(json.dumps({"regressions": [{
        "cell": cell, "test": test, "metric": "time_s", "unit": "s", "baseline": 10.0, "last_values": [13.0, 14.0],
        "ratio": 1.3, "threshold_ratio": 1.25, "threshold": 12.5, "nights_over": 2}]}))
    assert nightly_issue(tmp_path, last_night_folder(tmp_path, None), trend_json) == 0
    [issue] = fake.issues.values()
    [line] = [line for line in issue["body"].splitlines() if "forged heading" in line]
    # One line, each name in a code span longer than any backtick run in it: no heading, link or markup forged.
    assert line == (f"- {code_span(cell)} {code_span(test)}: time 13, 14 s over the last 2 nights, baseline 10 s "
                    "(×1.30; threshold ×1.25, 12.5 s); over it 2 nights running")
    assert code_span(test).startswith("```t.py::test_x[`` ### forged heading")
    assert not any(line.startswith("### forged") for line in issue["body"].splitlines())


@pytest.mark.parametrize(("content", "says"), [
    ("not json", "not the JSON"),
    ('{"regressions": [{"cell": "c", "test": "t", "metric": "rm -rf"}]}', "regressions[0].metric"),
    ('{"regressions": [{"cell": "c", "test": "t", "metric": "time_s", "last_values": [1, 2, 3]}]}',
     "regressions[0].last_values"),
    ('{"regressions": [{"cell": "c", "test": "t", "metric": "time_s", "baseline": 1, "threshold": 2,'
     ' "last_values": [1e999], "nights_over": 2}]}',
     "regressions[0].last_values"),
])
def test_a_trend_json_that_is_not_one_is_one_line_and_exit_2(fake, env, tmp_path, capsys, content, says):
    trend_json = tmp_path / "trend.json"
    trend_json.write_text(content)
    assert nightly_issue(tmp_path, last_night_folder(tmp_path, None), trend_json) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert str(trend_json) in line and says in line and fake.issues == {}
