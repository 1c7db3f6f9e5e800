"""The creep rule, pure: a test whose peak memory or time rose over its own baseline while it still passes.

As PyTorch's benchmark regression report does it: the baseline is the median of the test's previous
BASELINE_NIGHTS nights (the nights under test left out), a metric is over it above a stated ratio, and it is a
regression only when each of the last CONFIRM_NIGHTS nights is over (one slow night is noise, two in a row is a
trend). A night counts only where the test passed: a failing test is a red, not a creep, and a flaky pass carries
its reruns' time.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

BASELINE_NIGHTS = 14
CONFIRM_NIGHTS = 2
# A baseline needs this many passing nights: fewer and one odd night moves the median.
MIN_BASELINE_NIGHTS = 7
PASSED = "passed"


@dataclass(frozen=True, slots=True)
class Metric:
    name: str  # the results column
    label: str
    unit: str
    ratio: float  # over the baseline above this ratio
    floor: float  # ... and by more than this much, so a tiny value's jitter is not a rise


# Memory is near-deterministic for a fixed model and world (the allocator's rounding moves it a little), so 10% is
# a real change. Time shares a host with other work and jitters more: 25%. The floors keep a 3 MiB case gaining
# 1 MiB, or a 0.2 s case taking 0.3 s, out of the issue.
METRICS = (
    Metric("peak_mib", "peak memory", "MiB", ratio=1.10, floor=64.0),
    Metric("time_s", "time", "s", ratio=1.25, floor=1.0),
)
METRIC_BY_NAME = {metric.name: metric for metric in METRICS}


@dataclass(frozen=True, slots=True, kw_only=True)
class Night:
    """One test's numbers on one night (None: not run, not recorded or not finite)."""

    outcome: str | None
    values: dict[str, float | None]


@dataclass(frozen=True, slots=True, kw_only=True)
class Creep:
    metric: str
    baseline: float  # the median of the baseline nights
    last_values: tuple[float, ...]  # the nights under test, oldest first
    ratio: float | None  # the smallest of last_values over the baseline (None for a baseline of 0)
    threshold: float
    nights_over: int  # how many nights in a row, up to the last, are over the threshold


def creeps(nights: Sequence[Night]) -> tuple[Creep, ...]:
    """Each metric that crept over the last nights of `nights` (oldest first, one entry per night of the
    history, the test's absences included)."""
    if len(nights) < CONFIRM_NIGHTS + MIN_BASELINE_NIGHTS:
        return ()
    under_test = nights[-CONFIRM_NIGHTS:]
    if any(night.outcome != PASSED for night in under_test):
        return ()
    earlier = nights[-CONFIRM_NIGHTS - BASELINE_NIGHTS:-CONFIRM_NIGHTS]
    found = []
    for metric in METRICS:
        creep = _creep(metric, earlier, under_test, nights)
        if creep is not None:
            found.append(creep)
    return tuple(found)


def _creep(metric: Metric, earlier: Sequence[Night], under_test: Sequence[Night],
           nights: Sequence[Night]) -> Creep | None:
    baseline_values = [night.values.get(metric.name) for night in earlier if night.outcome == PASSED]
    usable = [value for value in baseline_values if value is not None]
    last_values = [night.values.get(metric.name) for night in under_test]
    last = [value for value in last_values if value is not None]
    if len(usable) < MIN_BASELINE_NIGHTS or len(last) < len(last_values):  # a night under test without the value
        return None
    baseline = statistics.median(usable)
    threshold = max(baseline * metric.ratio, baseline + metric.floor)
    if not all(value > threshold for value in last):
        return None
    over = 0
    for night in reversed(nights):
        value = night.values.get(metric.name)
        if night.outcome != PASSED or value is None or value <= threshold:
            break
        over += 1
    smallest = min(last)
    return Creep(metric=metric.name, baseline=baseline, last_values=tuple(last),
                 ratio=smallest / baseline if baseline > 0 else None, threshold=threshold,
                 nights_over=over)
