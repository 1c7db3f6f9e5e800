"""The data step of migration 3: version 2's rows (a row per test and night, per rank, per step) repacked into
one row per night and cell (`rows`), then version 2's tables dropped. Runs inside the migration's transaction."""

from __future__ import annotations

import sqlite3
from collections import defaultdict

from harness.history.rows import MAX_RANKS, NightTest, insert_cell, intern
from harness.results.training import MAX_STEPS
from harness.results.values import finite, number


def repack_version_2(connection: sqlite3.Connection) -> None:
    names = {row: (str(cell), str(test)) for row, cell, test in connection.execute("SELECT id, cell, test FROM tests")}
    peaks: dict[tuple[int, int], list[tuple[int, float]]] = defaultdict(list)
    for night, test, rank, peak in connection.execute(
            "SELECT night, test, rank, peak_mib FROM rank_peaks ORDER BY night, test, rank"):
        if isinstance(rank, int) and 0 <= rank < MAX_RANKS and (peak_value := _number(peak)) is not None:
            peaks[(night, test)].append((int(rank), peak_value))
    losses: dict[tuple[int, int], dict[int, float]] = defaultdict(dict)
    for night, test, step, loss in connection.execute("SELECT night, test, step, loss FROM losses"):
        if isinstance(step, int) and 1 <= step <= MAX_STEPS and (loss_value := _number(loss)) is not None:
            losses[(night, test)][int(step)] = loss_value
    name_ids = intern(connection, "names", "test", (test for _, test in names.values()))
    per_cell: dict[tuple[int, str], list[NightTest]] = defaultdict(list)
    for night, test, outcome, time_s, peak_mib, error in connection.execute(
            "SELECT night, test, outcome, time_s, peak_mib, error_over_bound FROM results ORDER BY night, test"):
        if test not in names:
            continue
        steps = losses.get((night, test), {})
        per_cell[(night, names[test][0])].append(NightTest(
            test=names[test][1], outcome=str(outcome), time_s=_number(time_s), peak_mib=_number(peak_mib),
            error_over_bound=_number(error),
            rank_peaks=tuple(peaks.get((night, test), ())),
            losses=tuple(steps.get(step) for step in range(1, max(steps, default=0) + 1))))
    for (night, cell), tests in per_cell.items():
        insert_cell(connection, night, cell, tests, name_ids)
    for table in ("results", "rank_peaks", "losses", "tests"):
        connection.execute(f"DROP TABLE {table}")


def _number(value: object) -> float | None:
    # Version 2 kept what was finite; a tampered file may hold text or a blob, which is not a number.
    return None if isinstance(value, (str, bytes)) else finite(number(value))


# Migration version -> the step that moves its data, run after the migration's SQL in its transaction.
DATA_STEPS = {3: repack_version_2}
