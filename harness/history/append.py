"""One night's tests into the history, in one transaction: per cell one packed row (`rows`). Appending a night
again replaces its rows; nights past the newest KEEP_NIGHTS are dropped."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone

from harness.errors import ConfigError
from harness.history.renames import Rename, apply_renames
from harness.history.rows import NightCell, NightTest, insert_cell, intern

# The rule needs 16 nights and the page shows 30; twice that leaves room to change either without losing data,
# and bounds the artifact.
KEEP_NIGHTS = 60
NIGHT_ID_CHARS = 100


@dataclass(frozen=True, slots=True)
class Appended:
    night: str
    tests: int
    nights_kept: int
    renamed: int = 0  # stored test names the renames moved to their new file


def night_date(raw: str | None) -> str:
    """--date as ISO 8601 in UTC (now where not given); a naive time is taken as UTC."""
    if raw is None:
        return datetime.now(timezone.utc).isoformat(timespec="seconds")
    try:
        moment = datetime.fromisoformat(raw)
    except ValueError:
        raise ConfigError(f"--date {raw!r} is not an ISO 8601 date or time") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.astimezone(timezone.utc).isoformat(timespec="seconds")


def check_night_id(night: str) -> str:
    if not night or len(night) > NIGHT_ID_CHARS or not night.isprintable() or night != night.strip():
        raise ConfigError(f"--night {night!r} is not a night id (1 to {NIGHT_ID_CHARS} printable characters)")
    return night


def append_night(connection: sqlite3.Connection, night: str, date: str, cells: Sequence[NightCell],
                 renames: tuple[Rename, ...] = ()) -> Appended:
    """Write `cells` as night `night` in one transaction (a crash leaves the history as it was), after moving the
    earlier nights' tests of renamed files to their new names (`renames`)."""
    check_night_id(night)
    per_cell = merged(cells)
    connection.execute("BEGIN IMMEDIATE")
    try:
        renamed = apply_renames(connection, renames)
        night_row = _replace_night(connection, night, date)
        name_ids = intern(connection, "names", "test", (test.test for tests in per_cell.values() for test in tests))
        for cell, tests in per_cell.items():
            insert_cell(connection, night_row, cell, tests, name_ids)
        kept = _prune(connection)
    except BaseException:
        connection.execute("ROLLBACK")
        raise
    connection.execute("COMMIT")
    return Appended(night=night, tests=sum(len(tests) for tests in per_cell.values()), nights_kept=kept,
                    renamed=renamed)


def merged(cells: Sequence[NightCell]) -> dict[str, list[NightTest]]:
    """Each cell's tests once: one folder read twice (an artifact downloaded twice) lists a test twice; the last
    one counts."""
    per_cell: dict[str, dict[str, NightTest]] = {}
    for cell in cells:
        tests = per_cell.setdefault(cell.cell, {})
        for test in cell.tests:
            tests[test.test] = test
    return {cell: list(tests.values()) for cell, tests in per_cell.items()}


def _replace_night(connection: sqlite3.Connection, night: str, date: str) -> int:
    found = connection.execute("SELECT id FROM nights WHERE night = ?", (night,)).fetchone()
    if found is None:
        night_id = connection.execute("INSERT INTO nights (night, night_date) VALUES (?, ?)", (night, date)).lastrowid
        assert night_id is not None  # an INSERT into a rowid table always sets it
        return night_id
    connection.execute("DELETE FROM packed WHERE night = ?", (found[0],))
    connection.execute("UPDATE nights SET night_date = ? WHERE id = ?", (date, found[0]))
    return found[0]


def _prune(connection: sqlite3.Connection) -> int:
    """Drop the nights older than the newest KEEP_NIGHTS; the number of nights kept."""
    old = [(row,) for (row,) in connection.execute(
        "SELECT id FROM nights ORDER BY night_date DESC, id DESC LIMIT -1 OFFSET ?", (KEEP_NIGHTS,))]
    connection.executemany("DELETE FROM packed WHERE night = ?", old)
    connection.executemany("DELETE FROM nights WHERE id = ?", old)
    if old:  # name lists no night uses any more
        connection.execute("DELETE FROM name_lists WHERE id NOT IN (SELECT name_list FROM packed)")
    return connection.execute("SELECT count(*) FROM nights").fetchone()[0]
