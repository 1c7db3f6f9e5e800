"""Read the history back: the last nights, the tests that may have crept (found in SQL, so a night of 200,000
tests is not pulled into Python), and the series of the few tests a page plots.

The database is an artifact of an earlier run, so every value read is checked again: a number that is not
finite, or out of the range the results model computes with, reads as None; texts are shown escaped."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass

from harness.history.rule import BASELINE_NIGHTS, CONFIRM_NIGHTS, METRICS, PASSED, Creep, Night, creeps
from harness.results import finite, number

SERIES_COLUMNS = ("time_s", "peak_mib", "error_over_bound")


@dataclass(frozen=True, slots=True)
class NightRow:
    row: int
    night: str
    date: str


@dataclass(frozen=True, slots=True, kw_only=True)
class TestSeries:
    __test__ = False  # not a pytest test class

    cell: str
    test: str
    nights: tuple[Night, ...]  # one per night of the window, oldest first
    creeps: tuple[Creep, ...] = ()


def last_nights(connection: sqlite3.Connection, count: int) -> tuple[NightRow, ...]:
    """The newest `count` nights, oldest first."""
    rows = connection.execute("SELECT id, night, night_date FROM nights ORDER BY night_date DESC, id DESC LIMIT ?",
                              (count,)).fetchall()
    return tuple(NightRow(int(row), str(night), str(date)) for row, night, date in reversed(rows))


def tests_in(connection: sqlite3.Connection, night: NightRow) -> int:
    return connection.execute("SELECT count(*) FROM results WHERE night = ?", (night.row,)).fetchone()[0]


def ranked_tests(connection: sqlite3.Connection, nights: Sequence[NightRow], limit: int) -> list[tuple[int, float]]:
    """(test row, rise) for every test that may have crept, then the next highest rises up to `limit` in all.

    The rise of a metric is the smaller of its last CONFIRM_NIGHTS values over the smallest passing value of the
    BASELINE_NIGHTS before them, divided by the metric's ratio: above 1 is necessary for a creep (a median is never
    below the minimum), so every test the rule could flag is here, and `creeps` decides."""
    window = nights[-(CONFIRM_NIGHTS + BASELINE_NIGHTS):]
    if len(window) <= CONFIRM_NIGHTS:
        return []
    last = [night.row for night in window[-CONFIRM_NIGHTS:]]
    marks = ", ".join("?" * len(window))
    last_marks = ", ".join("?" * len(last))
    rises = []
    parameters: list[object] = []
    for metric in METRICS:
        # Names come from METRICS, the code's own constants; values are bound.
        rises.append(f"min(CASE WHEN night IN ({last_marks}) THEN {metric.name} END)"
                     f" / nullif(min(CASE WHEN night NOT IN ({last_marks}) AND outcome = '{PASSED}'"
                     f" THEN {metric.name} END), 0) / ?")
        parameters += [*last, *last, metric.ratio]
    sql = (f"SELECT test, max({', '.join(f'coalesce({rise}, 0)' for rise in rises)}) AS rise FROM results"
           f" WHERE night IN ({marks}) GROUP BY test"
           f" HAVING sum(night IN ({last_marks}) AND outcome = '{PASSED}') = ?"
           f" ORDER BY rise DESC")
    cursor = connection.execute(sql, [*parameters, *(night.row for night in window), *last, len(last)])
    ranked = []
    for test, rise in cursor:
        rise = finite(number(rise))
        if rise is None:
            continue
        if len(ranked) >= limit and rise <= 1.0:
            break
        ranked.append((int(test), rise))
    return ranked


def series(connection: sqlite3.Connection, nights: Sequence[NightRow], tests: Sequence[int]) -> list[TestSeries]:
    """Each test's numbers over `nights`, with the creeps the rule finds in them, in the order of `tests`."""
    if not tests or not nights:
        return []
    index = {night.row: position for position, night in enumerate(nights)}
    per_test: dict[int, list[Night]] = {test: [Night(outcome=None, values={})] * len(nights) for test in tests}
    names: dict[int, tuple[str, str]] = {}
    for chunk in _chunks(list(tests), 500):  # SQLite's bound-parameter limit
        marks = ", ".join("?" * len(chunk))
        names.update((row, (str(cell), str(test))) for row, cell, test in connection.execute(
            f"SELECT id, cell, test FROM tests WHERE id IN ({marks})", chunk))
        night_marks = ", ".join("?" * len(nights))
        for night, test, outcome, *values in connection.execute(
                f"SELECT night, test, outcome, {', '.join(SERIES_COLUMNS)} FROM results"
                f" WHERE test IN ({marks}) AND night IN ({night_marks})", [*chunk, *index]):
            per_test[test][index[night]] = Night(
                outcome=str(outcome), values={name: _usable(value) for name, value in zip(SERIES_COLUMNS, values,
                                                                                         strict=True)})
    return [TestSeries(cell=names[test][0], test=names[test][1], nights=tuple(per_test[test]),
                       creeps=creeps(per_test[test])) for test in tests if test in names]


def _usable(value: object) -> float | None:
    # A tampered row may hold a text, a blob, inf or 1e308: only what the results model computes with passes.
    if isinstance(value, (bytes, str)):
        return None
    usable = finite(number(value))
    return usable if usable is None or usable >= 0.0 else None


def _chunks(items: list[int], size: int) -> list[list[int]]:
    return [items[start:start + size] for start in range(0, len(items), size)]
