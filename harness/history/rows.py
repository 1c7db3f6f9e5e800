"""What the history keeps of a test on a night, and its storage: one `packed` row per night and cell, each column a
blob (`packing`); cells and test names interned as integer ids. Written by `append` and by the migration to
version 3 (`repack`), read by `query`."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

from harness.contract import (
    GRAD_BOUND,
    GRAD_ERROR,
    LOGITS_ATOL,
    LOGITS_DIFFERENCE,
    LOSS_STEP,
    PARAM_BOUND,
    PARAM_ERROR,
    PEAK_ALLOCATED_PREFIX,
    TRAIN_STEPS,
)
from harness.history.packing import pack_counts, pack_floats, pack_lists
from harness.results.training import MAX_STEPS, training_curve
from harness.results.values import Number, finite, number, whole_number

# The outcome's code is its place here (results.Outcome's values); a code past the end reads as "unknown".
OUTCOMES = ("passed", "failed", "errored", "skipped", "xfailed", "flaky")
UNKNOWN_OUTCOME = "unknown"
# Ranks a test's per-rank peaks keep (a hostile junit.xml may name rank 10**9); the largest stays in peak_mib.
MAX_RANKS = 4096
# The property names the history reads: everything else in a test's properties is skipped while parsing.
ERROR_PAIRS = ((GRAD_ERROR, GRAD_BOUND), (LOGITS_DIFFERENCE, LOGITS_ATOL), (PARAM_ERROR, PARAM_BOUND))
COLUMNS = ("outcomes", "time_s", "peak_mib", "error_over_bound", "rank_peaks", "ranks", "losses")


class NightTest(NamedTuple):
    """One test on one night; None is not recorded (or not finite). A named tuple: a night makes 200,000."""

    test: str  # pytest's node id
    outcome: str  # one of OUTCOMES
    time_s: float | None
    peak_mib: float | None  # the largest over ranks
    error_over_bound: float | None  # the largest of the case's errors over their bounds
    rank_peaks: tuple[tuple[int, float], ...] = ()  # (rank, peak MiB), by rank
    losses: tuple[float | None, ...] = ()  # a training case's loss per step, step 1 first


@dataclass(frozen=True, slots=True, kw_only=True)
class NightCell:
    cell: str
    tests: tuple[NightTest, ...]


def night_test(test: str, outcome: str, time_s: Number | None, properties: Mapping[str, str]) -> NightTest:
    """What the history keeps of a test, from its junit properties (read as the results model reads them)."""
    peaks, largest, odd = [], None, False
    for key, text in properties.items():
        if key.startswith(PEAK_ALLOCATED_PREFIX):
            value = number(text)
            if isinstance(value, float):
                largest = value if largest is None or value > largest else largest
                rank = _rank(key)
                if rank is not None:
                    peaks.append((rank, value))
            elif value is not None:  # inf, nan, out of range: as in the results model, the largest is not a number
                odd = True
    return NightTest(test=test, outcome=outcome, time_s=finite(time_s), peak_mib=None if odd else largest,
                     error_over_bound=error_over_bound(properties), rank_peaks=tuple(sorted(peaks)),
                     losses=training_losses(properties) if TRAIN_STEPS in properties else ())


def training_losses(properties: Mapping[str, str]) -> tuple[float | None, ...]:
    curve = training_curve(properties)
    losses = tuple(finite(loss) for loss in curve.losses) if curve is not None else ()
    while losses and losses[-1] is None:  # a claimed step count with no losses recorded costs nothing
        losses = losses[:-1]
    return losses


def wanted_property(name: str) -> bool:
    """The properties `night_test` reads (the parser keeps only these)."""
    return name in _WANTED or name.startswith(_WANTED_PREFIXES)


def error_over_bound(properties: Mapping[str, str]) -> float | None:
    """The largest of the case's recorded errors over their bounds (gradients, logits, updated parameters)."""
    largest = None
    for error, bound in ERROR_PAIRS:
        if error in properties:
            ratio = _ratio(number(properties[error]), number(properties.get(bound)))
            if ratio is not None and (largest is None or ratio > largest):
                largest = ratio
    return largest


def outcome_code(outcome: str) -> int:
    return OUTCOMES.index(outcome) if outcome in OUTCOMES else len(OUTCOMES)


def outcome_name(code: int) -> str:
    return OUTCOMES[code] if 0 <= code < len(OUTCOMES) else UNKNOWN_OUTCOME


def insert_cell(connection: sqlite3.Connection, night_row: int, cell: str, tests: Sequence[NightTest],
                name_ids: Mapping[str, int]) -> None:
    """One packed row: the cell's tests on the night, in the order given."""
    cell_row = intern(connection, "cells", "cell", [cell])[cell]
    names = pack_counts(name_ids[test.test] for test in tests)
    connection.execute("INSERT OR IGNORE INTO name_lists (names) VALUES (?)", (names,))
    connection.execute(
        f"INSERT OR REPLACE INTO packed (night, cell, tests, name_list, {', '.join(COLUMNS)})"
        f" VALUES (?, ?, ?, (SELECT id FROM name_lists WHERE names = ?){', ?' * len(COLUMNS)})",
        (night_row, cell_row, len(tests), names,
         pack_counts(outcome_code(test.outcome) for test in tests),
         pack_floats(test.time_s for test in tests),
         pack_floats(test.peak_mib for test in tests),
         pack_floats(test.error_over_bound for test in tests),
         pack_lists([[peak for _, peak in test.rank_peaks] for test in tests]),
         pack_counts(rank for test in tests for rank, _ in test.rank_peaks),
         pack_lists([test.losses for test in tests])))


def intern(connection: sqlite3.Connection, table: str, column: str, values: Iterable[str]) -> dict[str, int]:
    """The ids of `values` in `table` (cells or names, the code's own names), adding those not there yet."""
    wanted = set(values)
    known: dict[str, int] = {}
    listed = sorted(wanted)
    for start in range(0, len(listed), 500):  # SQLite's bound-parameter limit
        chunk = listed[start:start + 500]
        known.update((str(value), int(row)) for row, value in connection.execute(
            f"SELECT id, {column} FROM {table} WHERE {column} IN ({', '.join('?' * len(chunk))})", chunk))
    missing = sorted(wanted - known.keys())
    if missing:
        first = connection.execute(f"SELECT coalesce(max(id), 0) + 1 FROM {table}").fetchone()[0]
        added = {value: first + offset for offset, value in enumerate(missing)}
        connection.executemany(f"INSERT INTO {table} (id, {column}) VALUES (?, ?)",
                               [(row, value) for value, row in added.items()])
        known.update(added)
    return known


# Most steps or ranks kept: what one packed row's lists may hold per test, read back.
LIST_VALUES_PER_TEST = max(MAX_STEPS, MAX_RANKS)

_WANTED = frozenset(name for pair in ERROR_PAIRS for name in pair)
_WANTED_PREFIXES = (PEAK_ALLOCATED_PREFIX, TRAIN_STEPS, LOSS_STEP.split("{", 1)[0])


@lru_cache(maxsize=MAX_RANKS)
def _rank(key: str) -> int | None:
    # The keys repeat on every test (peak_allocated_mib.rank0, ...): each is read once.
    rank = whole_number(key[len(PEAK_ALLOCATED_PREFIX):].removeprefix("rank"), 0)
    return rank if rank is not None and rank < MAX_RANKS else None


def _ratio(error: Number | None, bound: Number | None) -> float | None:
    error, bound = finite(error), finite(bound)
    if error is None or bound is None or bound <= 0.0:
        return None
    ratio = error / bound
    return ratio if finite(number(ratio)) is not None else None  # 1e300 / 1e-300 overflows to inf
