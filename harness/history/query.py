"""Read the history back: the last nights, the tests that may have crept, and the series of the few tests a page
plots.

The ranking runs over whole packed columns (a night of 200,000 tests is 100 rows, each a few arrays), with the
per-test work done by `map(min, ...)` over aligned arrays rather than a Python loop per test and night.

The database is an artifact of an earlier run, so every value read is checked again: a blob that does not unpack
to what its row says makes that row read as absent; a number that is not finite, negative, or out of the range
the results model computes with reads as None; texts are shown escaped."""

from __future__ import annotations

import heapq
import math
import sqlite3
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from harness.history.packing import (
    Unpackable,
    float_array,
    pack_counts,
    unpack_counts,
    unpack_floats,
    unpack_lists,
)
from harness.history.rows import LIST_VALUES_PER_TEST, NightCell, NightTest, outcome_code, outcome_name
from harness.history.rule import BASELINE_NIGHTS, CONFIRM_NIGHTS, METRICS, Creep, Night, creeps
from harness.results import finite, number

_Unpacked = TypeVar("_Unpacked")  # what a column's blob unpacks to

SERIES_COLUMNS = ("time_s", "peak_mib", "error_over_bound")
_READ = ("names", "outcomes", *SERIES_COLUMNS)  # what the ranking and the series read of a packed row
_PASSED = outcome_code("passed")
_UNUSABLE = math.inf  # what packing writes for not recorded

TestKey = tuple[int, int]  # (cell id, name id)


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


class PackedRows:
    """The packed rows of some nights, unpacked on first use and kept (the ranking and the series share them)."""

    def __init__(self, connection: sqlite3.Connection) -> None:
        self.connection = connection
        self._rows: dict[tuple[int, int], dict[str, tuple[bytes, int]] | None] = {}
        self._columns: dict[tuple[int, int, str], list | array | None] = {}
        self._positions: dict[bytes, dict[int, int]] = {}
        self._names: dict[bytes, list[int] | None] = {}  # a name list is shared by many rows
        self._all_passed: dict[int, bytes] = {}

    def cells(self, night: int) -> list[tuple[int, int]]:
        """(cell id, tests) of each row of `night`."""
        return [(int(cell), int(tests)) for cell, tests in self.connection.execute(
            "SELECT cell, tests FROM packed WHERE night = ? AND typeof(cell) = 'integer'"
            " AND typeof(tests) = 'integer'", (night,))]

    def column(self, night: int, cell: int, name: str) -> list[int] | array | None:
        """A row's column: names and outcomes as ints, numbers as float32 (+inf not recorded); None where the row
        is absent or does not unpack."""
        key = (night, cell, name)
        if key not in self._columns:
            self._columns[key] = self._unpack(night, cell, name)
        return self._columns[key]

    def positions(self, night: int, cell: int) -> dict[int, int] | None:
        """name id -> place in the row's columns."""
        blob = (self._row(night, cell) or {}).get("names")
        if blob is None:
            return None
        if blob[0] not in self._positions:
            names = self.column(night, cell, "names")
            self._positions[blob[0]] = {} if names is None else {name: place for place, name in enumerate(names)}
        return self._positions[blob[0]]

    def _row(self, night: int, cell: int) -> dict[str, tuple[bytes, int]] | None:
        """The row's blobs the trend reads, fetched once; each with the row's test count."""
        if (night, cell) not in self._rows:
            found = self.connection.execute(
                f"SELECT tests, (SELECT names FROM name_lists WHERE id = name_list), {', '.join(_READ[1:])}"
                " FROM packed WHERE night = ? AND cell = ?", (night, cell)).fetchone()
            usable = found is not None and isinstance(found[0], int) and found[0] >= 0
            self._rows[(night, cell)] = {name: (blob, found[0]) for name, blob in zip(_READ, found[1:], strict=True)
                                         if isinstance(blob, bytes)} if usable else None
        return self._rows[(night, cell)]

    def _unpack(self, night: int, cell: int, name: str) -> list[int] | array | None:
        blob = (self._row(night, cell) or {}).get(name)
        if blob is None:
            return None
        if name == "names":
            if blob[0] not in self._names:
                self._names[blob[0]] = _unpacked(unpack_counts, blob)
            return self._names[blob[0]]
        if name == "outcomes":
            count = blob[1]
            if count not in self._all_passed:
                self._all_passed[count] = pack_counts([_PASSED] * count)
            # Most nights every test passed: the same bytes, so nothing to inflate.
            return [_PASSED] * count if blob[0] == self._all_passed[count] else _unpacked(unpack_counts, blob)
        return _unpacked(float_array, blob)


def _unpacked(unpack: Callable[[bytes, int], _Unpacked], blob: tuple[bytes, int]) -> _Unpacked | None:
    try:
        return unpack(*blob)
    except Unpackable:
        return None


def tests_in(connection: sqlite3.Connection, night: NightRow) -> int:
    found = connection.execute("SELECT sum(tests) FROM packed WHERE night = ? AND typeof(tests) = 'integer'",
                               (night.row,)).fetchone()[0]
    return int(found or 0)


def stored_night(connection: sqlite3.Connection, night: str) -> tuple[NightCell, ...]:
    """Everything the history keeps of night `night`, by cell (a row that does not unpack is left out)."""
    found = []
    for cell, count, *blobs in connection.execute(
            "SELECT c.cell, p.tests, l.names, p.outcomes, p.time_s, p.peak_mib, p.error_over_bound, p.rank_peaks,"
            " p.ranks, p.losses FROM packed p JOIN nights n ON n.id = p.night JOIN cells c ON c.id = p.cell"
            " JOIN name_lists l ON l.id = p.name_list WHERE n.night = ? ORDER BY c.cell", (night,)):
        try:
            found.append(NightCell(cell=str(cell), tests=_unpacked_tests(connection, count, *blobs)))
        except (Unpackable, TypeError):
            continue
    return tuple(found)


def _unpacked_tests(connection: sqlite3.Connection, count: int, names: bytes, outcomes: bytes, *blobs: bytes
                    ) -> tuple[NightTest, ...]:
    name_ids = unpack_counts(names, count)
    texts = _texts(connection, "names", "test", set(name_ids))
    time_s, peak_mib, error = (unpack_floats(blob, count) for blob in blobs[:3])
    peaks_blob, ranks_blob, losses_blob = blobs[3:]
    peaks, losses = (unpack_lists(blob, count, count * LIST_VALUES_PER_TEST) for blob in (peaks_blob, losses_blob))
    flat_ranks = iter(unpack_counts(ranks_blob, sum(map(len, peaks))))
    ranks = [tuple(next(flat_ranks) for _ in test_peaks) for test_peaks in peaks]
    return tuple(NightTest(test=texts.get(name, ""), outcome=outcome_name(code), time_s=time_s[place],
                           peak_mib=peak_mib[place], error_over_bound=error[place],
                           rank_peaks=tuple((rank, peak) for rank, peak in zip(ranks[place], peaks[place],
                                                                               strict=True) if peak is not None),
                           losses=losses[place])
                 for place, (name, code) in enumerate(zip(name_ids, unpack_counts(outcomes, count), strict=True)))


def ranked_tests(rows: PackedRows, nights: Sequence[NightRow], limit: int) -> list[tuple[TestKey, float]]:
    """(test, rise) for every test that may have crept, then the next highest rises up to `limit` in all.

    The rise of a metric is the smaller of its last CONFIRM_NIGHTS values over the smallest passing value of the
    BASELINE_NIGHTS before them, divided by the metric's ratio: above 1 is necessary for a creep (a median is never
    below the minimum), so every test the rule could flag is here, and `creeps` decides."""
    window = nights[-(CONFIRM_NIGHTS + BASELINE_NIGHTS):]
    if len(window) <= CONFIRM_NIGHTS:
        return []
    baseline, last = window[:-CONFIRM_NIGHTS], window[-CONFIRM_NIGHTS:]
    flagged: list[tuple[float, TestKey]] = []
    nearest: list[tuple[float, TestKey]] = []
    for cell, count in rows.cells(last[-1].row):
        names = rows.column(last[-1].row, cell, "names")
        if names is None or len(names) != count:
            continue
        rises = [-math.inf] * count
        for metric in METRICS:
            lows = list(map(min, *(_aligned(rows, night.row, cell, names, metric.name, -math.inf)
                                   for night in last), [math.inf] * count))
            bases = list(map(min, *(_aligned(rows, night.row, cell, names, metric.name, math.inf)
                                    for night in baseline), [math.inf] * count))
            scale = 1.0 / metric.ratio
            rises = list(map(max, rises, [low / base * scale if 0.0 < base < math.inf and low > -math.inf
                                          else (0.0 if low > -math.inf else -math.inf)
                                          for low, base in zip(lows, bases, strict=True)]))
        # The cell's `limit` highest rises at most can be among the nearest: cut there before making pairs.
        cut = sorted(rises)[-limit] if len(rises) > limit else -math.inf
        flagged += [(rise, (cell, names[place])) for place, rise in enumerate(rises) if rise > 1.0]
        nearest += [(rise, (cell, names[place])) for place, rise in enumerate(rises)
                    if rise >= cut and -math.inf < rise <= 1.0]
    ranked = sorted(flagged, reverse=True) + heapq.nlargest(max(limit - len(flagged), 0), nearest)
    return [(key, rise) for rise, key in ranked]


def series(rows: PackedRows, nights: Sequence[NightRow], tests: Sequence[TestKey]) -> list[TestSeries]:
    """Each test's numbers over `nights`, with the creeps the rule finds in them, in the order of `tests`."""
    if not tests or not nights:
        return []
    cell_names = _texts(rows.connection, "cells", "cell", {cell for cell, _ in tests})
    test_names = _texts(rows.connection, "names", "test", {name for _, name in tests})
    found = []
    for cell, name in tests:
        if cell not in cell_names or name not in test_names:
            continue
        points = tuple(_night(rows, night.row, cell, name) for night in nights)
        found.append(TestSeries(cell=cell_names[cell], test=test_names[name], nights=points, creeps=creeps(points)))
    return found


def _aligned(rows: PackedRows, night: int, cell: int, names: Sequence[int], column: str,
             unusable: float) -> Sequence[float]:
    """`column` of the cell on `night`, in the order of `names`; `unusable` where the test did not pass, was not
    recorded or is absent."""
    values = rows.column(night, cell, column)
    outcomes = rows.column(night, cell, "outcomes")
    own_names = rows.column(night, cell, "names")
    if values is None or outcomes is None or own_names is None or not len(values) == len(outcomes) == len(
            own_names):
        return [unusable] * len(names)
    if own_names == names and outcomes.count(_PASSED) == len(outcomes):  # the common night: same tests, all passed
        return values if unusable == _UNUSABLE else [unusable if value == _UNUSABLE else value for value in values]
    positions = rows.positions(night, cell) or {}
    aligned = []
    for name in names:
        place = positions.get(name)
        value = values[place] if place is not None and outcomes[place] == _PASSED else _UNUSABLE
        aligned.append(unusable if value == _UNUSABLE else value)
    return aligned


def _night(rows: PackedRows, night: int, cell: int, name: int) -> Night:
    place = (rows.positions(night, cell) or {}).get(name)
    outcomes = rows.column(night, cell, "outcomes")
    if place is None or outcomes is None or place >= len(outcomes):
        return Night(outcome=None, values={})
    values = {}
    for column in SERIES_COLUMNS:
        packed = rows.column(night, cell, column)
        values[column] = _usable(packed[place]) if packed is not None and place < len(packed) else None
    return Night(outcome=outcome_name(outcomes[place]), values=values)


def _texts(connection: sqlite3.Connection, table: str, column: str, ids: set[int]) -> dict[int, str]:
    listed = sorted(ids)
    found: dict[int, str] = {}
    for start in range(0, len(listed), 500):  # SQLite's bound-parameter limit
        chunk = listed[start:start + 500]
        # Table and column names are the code's own; values are bound.
        found.update((int(row), str(text)) for row, text in connection.execute(
            f"SELECT id, {column} FROM {table} WHERE id IN ({', '.join('?' * len(chunk))})", chunk))
    return found


def _usable(value: float) -> float | None:
    # Not recorded (+inf), or a tampered row's -inf, 1e38 or negative value: only what the results model computes
    # with passes.
    usable = finite(number(value))
    return usable if usable is None or usable >= 0.0 else None
