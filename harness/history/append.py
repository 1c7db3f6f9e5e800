"""One night's results into the history: per test its outcome, time, peak memory (largest and per rank), largest
error over bound and a training case's loss per step. Appending a night again replaces its rows."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

from harness.contract import PARAM_BOUND, PARAM_ERROR, PEAK_ALLOCATED_PREFIX
from harness.errors import ConfigError
from harness.results import Number, ResultSet, TestResult, finite, number
from harness.results.values import whole_number

# The rule needs 16 nights and the page shows 30; twice that leaves room to change either without losing data,
# and bounds the artifact (a 100 x 2,000 night is some 10 MB).
KEEP_NIGHTS = 60
NIGHT_ID_CHARS = 100


@dataclass(frozen=True, slots=True)
class Appended:
    night: str
    tests: int
    nights_kept: int


def night_date(raw: str | None) -> str:
    """--date as ISO 8601 in UTC (now where not given); a naive time is taken as UTC."""
    if raw is None:
        return datetime.now(UTC).isoformat(timespec="seconds")
    try:
        moment = datetime.fromisoformat(raw)
    except ValueError:
        raise ConfigError(f"--date {raw!r} is not an ISO 8601 date or time") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).isoformat(timespec="seconds")


def check_night_id(night: str) -> str:
    if not night or len(night) > NIGHT_ID_CHARS or not night.isprintable() or night != night.strip():
        raise ConfigError(f"--night {night!r} is not a night id (1 to {NIGHT_ID_CHARS} printable characters)")
    return night


def append_night(connection: sqlite3.Connection, night: str, date: str, results: ResultSet) -> Appended:
    """Write `results` as night `night` in one transaction (a crash leaves the history as it was)."""
    check_night_id(night)
    connection.execute("BEGIN IMMEDIATE")
    try:
        night_row = _replace_night(connection, night, date)
        test_ids = _test_ids(connection, results)
        rows, peaks, losses = [], [], []
        for cell in results.cells:
            for test in cell.tests:
                test_row = test_ids[(cell.id, test.test_id)]
                rows.append((night_row, test_row, test.outcome.value, finite(test.duration_s),
                             finite(test.peak_allocated_mib), error_over_bound(test)))
                peaks.extend((night_row, test_row, rank, peak) for rank, peak in rank_peaks(test))
                losses.extend((night_row, test_row, step, loss) for step, loss in training_losses(test))
        # OR REPLACE: one folder read twice (an artifact downloaded twice) lists a test twice; the last one counts.
        connection.executemany("INSERT OR REPLACE INTO results VALUES (?, ?, ?, ?, ?, ?)", rows)
        connection.executemany("INSERT OR REPLACE INTO rank_peaks VALUES (?, ?, ?, ?)", peaks)
        connection.executemany("INSERT OR REPLACE INTO losses VALUES (?, ?, ?, ?)", losses)
        kept = _prune(connection)
    except BaseException:
        connection.execute("ROLLBACK")
        raise
    connection.execute("COMMIT")
    return Appended(night=night, tests=len(rows), nights_kept=kept)


def error_over_bound(test: TestResult) -> float | None:
    """The largest of the case's recorded errors over their bounds (gradients, logits, updated parameters)."""
    pairs = ((test.grad_error, test.grad_bound), (test.logits_difference, test.logits_atol),
             (test.number(PARAM_ERROR), test.number(PARAM_BOUND)))
    ratios = [_ratio(error, bound) for error, bound in pairs]
    usable = [ratio for ratio in ratios if ratio is not None]
    return max(usable) if usable else None


def rank_peaks(test: TestResult) -> Iterator[tuple[int, float]]:
    for key, value in test.properties:
        if key.startswith(PEAK_ALLOCATED_PREFIX):
            rank = whole_number(key[len(PEAK_ALLOCATED_PREFIX):].removeprefix("rank"), 0)
            peak = finite(number(value))
            if rank is not None and peak is not None:
                yield rank, peak


def training_losses(test: TestResult) -> Iterator[tuple[int, float]]:
    if test.training is not None:
        for step, loss in enumerate(test.training.losses, start=1):
            if finite(loss) is not None:
                yield step, loss


def _ratio(error: Number | None, bound: Number | None) -> float | None:
    error, bound = finite(error), finite(bound)
    if error is None or bound is None or bound <= 0.0:
        return None
    ratio = error / bound
    return ratio if finite(number(ratio)) is not None else None  # 1e300 / 1e-300 overflows to inf


def _replace_night(connection: sqlite3.Connection, night: str, date: str) -> int:
    found = connection.execute("SELECT id FROM nights WHERE night = ?", (night,)).fetchone()
    if found is None:
        return connection.execute("INSERT INTO nights (night, night_date) VALUES (?, ?)", (night, date)).lastrowid
    _delete_nights(connection, [found[0]])
    connection.execute("UPDATE nights SET night_date = ? WHERE id = ?", (date, found[0]))
    return found[0]


def _test_ids(connection: sqlite3.Connection, results: ResultSet) -> dict[tuple[str, str], int]:
    wanted = {(cell.id, test.test_id) for cell in results.cells for test in cell.tests}
    known = {(cell, test): row for row, cell, test in connection.execute("SELECT id, cell, test FROM tests")}
    connection.executemany("INSERT INTO tests (cell, test) VALUES (?, ?)", sorted(wanted - known.keys()))
    if wanted - known.keys():
        known = {(cell, test): row for row, cell, test in connection.execute("SELECT id, cell, test FROM tests")}
    return known


def _prune(connection: sqlite3.Connection) -> int:
    """Drop the nights older than the newest KEEP_NIGHTS; the number of nights kept."""
    old = [row for (row,) in connection.execute(
        "SELECT id FROM nights ORDER BY night_date DESC, id DESC LIMIT -1 OFFSET ?", (KEEP_NIGHTS,))]
    if old:
        _delete_nights(connection, old)
        connection.executemany("DELETE FROM nights WHERE id = ?", [(row,) for row in old])
    return connection.execute("SELECT count(*) FROM nights").fetchone()[0]


def _delete_nights(connection: sqlite3.Connection, rows: list[int]) -> None:
    for table in ("results", "rank_peaks", "losses"):
        connection.executemany(f"DELETE FROM {table} WHERE night = ?", [(row,) for row in rows])
