"""What `harness trend` shows, as data: the last nights, the tests worth a plot (every regression first, then the
largest rises) and the regressions the nightly issue lists."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from harness.history.query import NightRow, PackedRows, TestSeries, last_nights, ranked_tests, series, tests_in
from harness.history.rule import BASELINE_NIGHTS, CONFIRM_NIGHTS, METRIC_BY_NAME, Creep

# A plot per test of a 200,000-test night is a page nobody reads and no browser opens: the page plots the
# regressions and then the tests that rose most, up to this many; the database keeps the rest.
PLOTTED_TESTS = 100


@dataclass(frozen=True, slots=True, kw_only=True)
class Regression:
    cell: str
    test: str
    creep: Creep

    def as_json(self) -> dict[str, object]:
        metric = METRIC_BY_NAME[self.creep.metric]
        return {"cell": self.cell, "test": self.test, "metric": metric.name, "unit": metric.unit,
                "baseline": self.creep.baseline, "last_values": list(self.creep.last_values),
                "ratio": self.creep.ratio, "threshold_ratio": metric.ratio, "threshold": self.creep.threshold,
                "nights_over": self.creep.nights_over}


@dataclass(frozen=True, slots=True, kw_only=True)
class Trend:
    nights: tuple[NightRow, ...]  # shown, oldest first
    tests_last_night: int
    plotted: tuple[TestSeries, ...]  # regressions first; each series over `nights`
    regressions: tuple[Regression, ...]

    def as_json(self) -> dict[str, object]:
        return {
            "nights": [{"night": night.night, "date": night.date} for night in self.nights],
            "rule": {"baseline_nights": BASELINE_NIGHTS, "confirm_nights": CONFIRM_NIGHTS,
                     "ratios": {name: metric.ratio for name, metric in METRIC_BY_NAME.items()}},
            "regressions": [regression.as_json() for regression in self.regressions],
        }


def build_trend(connection: sqlite3.Connection, nights: int) -> Trend:
    # The rule always sees its own window, whatever the page shows.
    window = last_nights(connection, max(nights, CONFIRM_NIGHTS + BASELINE_NIGHTS))
    rows = PackedRows(connection)
    ranked = ranked_tests(rows, window, PLOTTED_TESTS)
    found = series(rows, window, [test for test, _ in ranked])
    regressions = tuple(Regression(cell=one.cell, test=one.test, creep=creep) for one in found for creep in one.creeps)
    flagged = [one for one in found if one.creeps]
    plotted = (flagged + [one for one in found if not one.creeps])[:max(PLOTTED_TESTS, len(flagged))]
    shown = window[-nights:] if nights else ()
    trimmed = tuple(TestSeries(cell=one.cell, test=one.test, nights=one.nights[len(window) - len(shown):],
                               creeps=one.creeps) for one in plotted)
    return Trend(nights=tuple(shown), tests_last_night=tests_in(connection, window[-1]) if window else 0,
                 plotted=trimmed, regressions=regressions)
