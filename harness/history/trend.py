"""What `harness trend` shows, as data: the last nights, the tests worth a plot (every regression first, then the
largest rises) and the regressions the nightly issue lists."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from harness.history.query import NightRow, PackedRows, TestSeries, last_nights, ranked_tests, series, tests_in
from harness.history.rule import BASELINE_NIGHTS, CONFIRM_NIGHTS, METRIC_BY_NAME, Creep
from harness.results import finite, number
from harness.results.values import clean_text

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


# What the nightly issue reads back of `harness trend --json`: as many regressions as it may list, each name capped.
LARGEST_REGRESSIONS = 10_000
NAME_CHARS = 1_000


def regressions_from_json(document: object) -> tuple[Regression, ...]:
    """The regressions of `Trend.as_json()`, read back as input (the file is an artifact): a ValueError names the
    first thing that is not as written."""
    listed = document.get("regressions") if isinstance(document, dict) else None
    if not isinstance(listed, list):
        raise ValueError("no list of regressions")
    if len(listed) > LARGEST_REGRESSIONS:
        raise ValueError(f"{len(listed)} regressions, more than {LARGEST_REGRESSIONS}")
    return tuple(_regression(item, place) for place, item in enumerate(listed))


def _regression(item: object, place: int) -> Regression:
    where = f"regressions[{place}]"
    if not isinstance(item, dict):
        raise ValueError(f"{where} is not an object")
    texts = {key: item.get(key) for key in ("cell", "test")}
    for key, text in texts.items():
        if not isinstance(text, str) or not 0 < len(text) <= NAME_CHARS:
            raise ValueError(f"{where}.{key} is not a name of 1 to {NAME_CHARS} characters")
    metric_name = item.get("metric")
    metric = METRIC_BY_NAME.get(metric_name) if isinstance(metric_name, str) else None
    if metric is None:
        raise ValueError(f"{where}.metric is not one of {', '.join(METRIC_BY_NAME)}")
    last = item.get("last_values")
    if not isinstance(last, list) or not 0 < len(last) <= CONFIRM_NIGHTS:
        raise ValueError(f"{where}.last_values is not a list of 1 to {CONFIRM_NIGHTS} numbers")
    nights_over = item.get("nights_over")
    if not isinstance(nights_over, int) or isinstance(nights_over, bool) or not 0 < nights_over <= 10_000:
        raise ValueError(f"{where}.nights_over is not a count of nights")
    ratio = item.get("ratio")
    creep = Creep(metric=metric.name, baseline=_value(item.get("baseline"), f"{where}.baseline"),
                  last_values=tuple(_value(value, f"{where}.last_values") for value in last),
                  ratio=None if ratio is None else _value(ratio, f"{where}.ratio"),
                  threshold=_value(item.get("threshold"), f"{where}.threshold"), nights_over=nights_over)
    return Regression(cell=clean_text(texts["cell"]) or "", test=clean_text(texts["test"]) or "", creep=creep)


def _value(raw: object, where: str) -> float:
    value = finite(number(raw)) if isinstance(raw, (int, float)) and not isinstance(raw, bool) else None
    if value is None or value < 0.0:
        raise ValueError(f"{where} is not a number the trend writes")
    return value


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
