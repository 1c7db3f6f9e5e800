"""The history's storage (harness.history.packing, rows, repack, night_reader): packed columns read back what was
written, a version 2 database with rows migrates to version 3 and reads the same, a tampered blob is refused, and
the streaming reader keeps of each test what the report's reader reads."""

from __future__ import annotations

import json
import math
import sqlite3
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
from history_helpers import Case, stored, write_night

from harness.history import migrations, schema_version
from harness.history.night_reader import read_night
from harness.history.packing import (
    Unpackable,
    float_array,
    pack_counts,
    pack_floats,
    pack_lists,
    unpack_counts,
    unpack_floats,
    unpack_lists,
)
from harness.history.rows import OUTCOMES, NightTest, night_test, outcome_code, outcome_name
from harness.results import Outcome, load_results

REPO = Path(__file__).resolve().parents[2]

# ---------------------------------------------------------------------------------------------
# Packed columns


def test_numbers_read_back_as_float32_and_not_recorded_stays_none():
    values = [0.0, 1.5, 512.3, 2.345, 123456.7, 1e-30, -5.0, None, 1e23]
    back = unpack_floats(pack_floats(values), len(values))
    assert back[:2] == [0.0, 1.5] and back[7] is None
    assert back == [None if value is None else pytest.approx(value, rel=1e-7) for value in values]
    # Beyond float32's range is not recorded (as beyond the results model's is), never inf or a wrong number.
    assert unpack_floats(pack_floats([1e39, -1e39, math.inf, math.nan]), 4) == [None] * 4


def test_ids_and_lists_read_back_equal():
    assert unpack_counts(pack_counts([3, 1, 2**32 - 1, 0]), 4) == [3, 1, 2**32 - 1, 0]
    lists = [(), (2.5, None, 1.25), (0.0, 512.5)]
    assert unpack_lists(pack_lists(lists), 3, 100) == lists


@pytest.mark.parametrize("blob", [b"", b"not zlib", zlib.compress(b"\x00" * 7), zlib.compress(b"\x00" * 9),
                                  zlib.compress(b"\x00" * 10**7)])
def test_a_blob_that_is_not_what_its_row_says_is_refused(blob):
    with pytest.raises(Unpackable):
        float_array(blob, 2)  # 8 bytes: fewer, more, or a bomb are refused, and the bomb is not inflated whole


def test_a_list_blob_claiming_more_values_than_allowed_is_refused():
    with pytest.raises(Unpackable, match="more than 10"):
        unpack_lists(pack_lists([(1.0,) * 11]), 1, 10)


def test_every_outcome_has_a_stored_code_and_an_unknown_code_reads_as_unknown():
    # The codes are positions in OUTCOMES, stored in every packed row: a new Outcome is appended there, never
    # inserted, or the history's older nights would read as other outcomes.
    assert {outcome.value for outcome in Outcome} <= set(OUTCOMES)
    assert [outcome_name(outcome_code(name)) for name in OUTCOMES] == list(OUTCOMES)
    assert outcome_name(len(OUTCOMES)) == outcome_name(2**32 - 1) == "unknown"


# ---------------------------------------------------------------------------------------------
# Migration from version 2


def version_2_database(path: Path) -> None:
    connection = sqlite3.connect(path)
    for migration in migrations()[:2]:
        connection.executescript(migration.sql)
    connection.execute("PRAGMA user_version = 2")
    connection.executemany("INSERT INTO nights (id, night, night_date) VALUES (?, ?, ?)",
                           [(1, "run-1", "2026-01-01T02:00:00+00:00"), (2, "run-2", "2026-01-02T02:00:00+00:00")])
    connection.executemany("INSERT INTO tests (id, cell, test) VALUES (?, ?, ?)",
                           [(1, "cell-a", "t.py::train"), (2, "cell-a", "t.py::grad"), (3, "cell-b", "t.py::grad")])
    connection.executemany("INSERT INTO results VALUES (?, ?, ?, ?, ?, ?)", [
        (1, 1, "passed", 4.5, 1010.5, 0.25), (1, 2, "failed", 2.0, None, 3.0), (1, 3, "passed", None, 800.0, None),
        (2, 1, "flaky", 9.25, 1020.0, None)])
    connection.executemany("INSERT INTO rank_peaks VALUES (?, ?, ?, ?)",
                           [(1, 1, 0, 1000.0), (1, 1, 1, 1010.5), (1, 3, 2, 800.0), (2, 1, 0, 1020.0)])
    connection.executemany("INSERT INTO losses VALUES (?, ?, ?, ?)",
                           [(1, 1, 1, 2.5), (1, 1, 2, 2.25), (1, 1, 4, 1.5), (2, 1, 1, 2.0)])
    connection.commit()
    connection.close()


def test_a_version_2_database_with_rows_migrates_and_reads_the_same(tmp_path):
    db = tmp_path / "v2.db"
    version_2_database(db)
    first = stored(db, "run-1")
    assert first == {
        ("cell-a", "t.py::train"): NightTest(test="t.py::train", outcome="passed", time_s=4.5, peak_mib=1010.5,
                                             error_over_bound=0.25, rank_peaks=((0, 1000.0), (1, 1010.5)),
                                             losses=(2.5, 2.25, None, 1.5)),
        ("cell-a", "t.py::grad"): NightTest(test="t.py::grad", outcome="failed", time_s=2.0, peak_mib=None,
                                            error_over_bound=3.0),
        ("cell-b", "t.py::grad"): NightTest(test="t.py::grad", outcome="passed", time_s=None, peak_mib=800.0,
                                            error_over_bound=None, rank_peaks=((2, 800.0),)),
    }
    assert stored(db, "run-2")[("cell-a", "t.py::train")] == NightTest(
        test="t.py::train", outcome="flaky", time_s=9.25, peak_mib=1020.0, error_over_bound=None,
        rank_peaks=((0, 1020.0),), losses=(2.0,))
    with sqlite3.connect(db) as connection:
        assert connection.execute("PRAGMA user_version").fetchone()[0] == schema_version()
        tables = {name for (name,) in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert "results" not in tables and "packed" in tables


def test_a_tampered_version_2_row_migrates_as_not_recorded(tmp_path):
    db = tmp_path / "v2.db"
    version_2_database(db)
    with sqlite3.connect(db) as connection:
        connection.execute("UPDATE results SET time_s = 'text', peak_mib = x'00' WHERE test = 1 AND night = 1")
        connection.execute("UPDATE rank_peaks SET rank = 'x' WHERE test = 1 AND rank = 0 AND night = 1")
    test = stored(db, "run-1")[("cell-a", "t.py::train")]
    assert (test.time_s, test.peak_mib, test.rank_peaks) == (None, None, ((1, 1010.5),))


# ---------------------------------------------------------------------------------------------
# The streaming reader against the report's


def test_the_streaming_reader_keeps_what_the_report_reads(tmp_path):
    folder = write_night(tmp_path / "night", {
        "cpu-2rank": [
            Case(test_id="tests/gpu/t.py::test_a", time_s=4.5, peaks_mib=(10.0, 30.0), error=2e-5, bound=1e-4),
            Case(test_id="tests/gpu/t.py::test_b", outcome="failed", error=3e-3, bound=1e-3),
            Case(test_id="tests/gpu/t.py::test_c", outcome="skipped", peaks_mib=()),
            Case(test_id="tests/gpu/t.py::test_d", peaks_mib=("inf", "12"), losses=(2.5, "nan", 1.5),
                 extra=(("max_logits_difference", "0.5"), ("logits_atol", "0.25"))),
            Case(test_id="tests/gpu/t.py::TestX::test_e", time_s="bad", peaks_mib=("1e308", "-5"), error=None),
        ],
        "cpu-1rank": [Case(test_id="tests/gpu/t.py::test_a", peaks_mib=(7.0,), losses=(1.0,))],
    })
    # A rerun (an empty attempt before the final one) and the test running when pytest stopped.
    junit = folder / "cpu-2rank" / "junit.xml"
    text = junit.read_text()
    attempt = '<testcase classname="tests.gpu.t" name="test_a" file="tests/gpu/t.py" time="1.5" />'
    junit.write_text(text.replace('<testcase classname="tests.gpu.t" name="test_a"',
                                  attempt + '<testcase classname="tests.gpu.t" name="test_a"', 1))
    (folder / "cpu-2rank" / "running-test.txt").write_text("tests/gpu/t.py::test_c\n")

    streamed = {(cell.cell, test.test): test for cell in read_night([folder]) for test in cell.tests}
    expected = {(cell.id, test.test_id): night_test(test.test_id, test.outcome.value, test.duration_s,
                                                    dict(test.properties))
                for cell in load_results([folder]).cells for test in cell.tests}
    assert streamed == expected
    assert streamed[("cpu-2rank", "tests/gpu/t.py::test_a")].outcome == "flaky"
    assert streamed[("cpu-2rank", "tests/gpu/t.py::test_a")].time_s == 6.0
    assert streamed[("cpu-2rank", "tests/gpu/t.py::test_c")].outcome == "errored"
    assert streamed[("cpu-2rank", "tests/gpu/t.py::test_d")].peak_mib is None  # one rank's inf: as the report
    assert streamed[("cpu-2rank", "tests/gpu/t.py::test_d")].error_over_bound == 2.0
    assert streamed[("cpu-2rank", "tests/gpu/t.py::test_d")].losses == (2.5, None, 1.5)


@pytest.mark.parametrize("junit", [
    b'<?xml version="1.0"?><!DOCTYPE x [<!ENTITY a "aaaa">]><testsuites><testcase name="&a;"/></testsuites>',
    b"<testsuites><testcase name='t'",
    b"<html><testcase name='t'/></html>",
    b"",
])
def test_a_junit_xml_the_report_cannot_read_keeps_no_tests(tmp_path, junit):
    folder = write_night(tmp_path / "night", {"cpu-2rank": [Case()]})
    (folder / "cpu-2rank" / "junit.xml").write_bytes(junit)
    [cell] = read_night([folder])
    assert cell.cell == "cpu-2rank" and cell.tests == ()
    assert load_results([folder]).cells[0].tests == ()


# Run in a process of its own: read_night reads here when its caller runs other threads, as a test session may.
SEVERAL_PROCESSES = """
import json, sys
from pathlib import Path
from harness.history import night_reader
folder = Path(sys.argv[1])
pools = []

class CountedPool(night_reader.ProcessPoolExecutor):
    def __init__(self, workers, **options):
        pools.append(workers)
        super().__init__(workers, **options)

night_reader.ProcessPoolExecutor = CountedPool
night_reader.os.sched_getaffinity = lambda pid: {0, 1, 2, 3}
here = night_reader.read_night([folder], workers=1)
same = [night_reader.read_night([folder], workers=workers) == here for workers in (2, 3, None)]
cells = {cell.cell: len(cell.tests) for cell in here}
print(json.dumps({"same": same, "pools": pools, "order": [cell.cell for cell in here],
                  "folders": [path.name for path in night_reader.cell_folders([folder])], "cells": cells}))
"""


def test_a_large_night_read_by_several_processes_is_the_night_read_here_in_its_order(tmp_path):
    cells = {f"cpu-{index}rank": [Case(test_id=f"tests/gpu/t.py::test_{case}", time_s=index + case / 10,
                                       peaks_mib=(float(index), 2.0))
                                  for case in range(3)] for index in range(11)}
    folder = write_night(tmp_path / "night", cells)
    (folder / "cpu-4rank" / "junit.xml").write_bytes(b"<testsuites><testcase name='t'")  # unreadable: no tests
    completed = subprocess.run([sys.executable, "-c", SEVERAL_PROCESSES, str(folder)], capture_output=True,
                               text=True, check=True, cwd=REPO)
    read = json.loads(completed.stdout)
    assert read["same"] == [True, True, True]
    assert read["pools"] == [2, 3, 4]  # read by that many processes, not here
    assert read["order"] == read["folders"]
    assert read["cells"]["cpu-4rank"] == 0 and read["cells"]["cpu-7rank"] == 3
