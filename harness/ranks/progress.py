"""pytest plugin part: now and then, a line on a long session's terminal saying how far it is and about how long is
left, e.g. `harness: 212/642 tests, 4m10s elapsed, about 8m left (from the collected count)`.

The estimate is the time elapsed since the tests started, times the share of the work left over the share done:
by test count, or (`--pack-durations`) by each test's earlier seconds. The coordinator of a packed session counts
the tests its workers finish as it replays them; a worker writes no line. Needs the standard library and pytest.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Collection, Mapping

import pytest

from harness.ranks.packing import read_durations

# Read when a session starts; a test replaces it, so no test of this module races a real clock.
clock: Callable[[], float] = time.monotonic
# A line needs both a minute and a tenth of the tests since the last (whichever is rarer): at most 9 lines however
# long the run (the tenth; none after the last test), none in a run under a minute, at most 1 a minute in a long one.
INTERVAL_S = 60.0
INTERVAL_SHARE = 0.1
# -q -q hides what pytest itself would say beyond the dots; the line stays away from it too.
QUIETEST_SHOWN = -1
PLUGIN_NAME = "harness-progress"


class ProgressLine:
    """Counts finished tests (pytest_runtest_logfinish) and writes a line when one is due."""

    def __init__(self, write_line: Callable[[str], None], test_ids: Collection[str], durations: Mapping[str, float],
                 now: Callable[[], float]):
        self.write_line = write_line
        self.left = set(test_ids)
        self.total = len(self.left)
        self.weigh = weights_of(self.left, durations)
        self.basis = "earlier durations" if any(test in durations for test in self.left) else "the collected count"
        self.now = now
        self.started = self.last_line_at = now()
        self.done_weight = 0.0
        self.finished_at_last_line = 0

    def pytest_runtest_logfinish(self, nodeid: str, location: object) -> None:
        line = self.finished(nodeid)
        if line is not None:
            self.write_line(line)

    def finished(self, test_id: str) -> str | None:
        """The line to write now that `test_id` finished, if one is due; a test that finishes again counts once."""
        if test_id not in self.left:
            return None
        self.left.discard(test_id)
        self.done_weight += self.weigh(test_id)
        now = self.now()
        if not self.left or not self.due(now):
            return None  # after the last test pytest's summary follows
        self.last_line_at, self.finished_at_last_line = now, self.finished_count
        return self.describe(now - self.started)

    @property
    def finished_count(self) -> int:
        return self.total - len(self.left)

    def due(self, now: float) -> bool:
        enough_tests = self.finished_count - self.finished_at_last_line >= math.ceil(INTERVAL_SHARE * self.total)
        return enough_tests and now - self.last_line_at >= INTERVAL_S

    def describe(self, elapsed_s: float) -> str:
        left_s = estimate_left_s(elapsed_s, self.done_weight, sum(self.weigh(test) for test in self.left))
        return (f"harness: {self.finished_count}/{self.total} tests, {clock_words(elapsed_s)} elapsed, "
                f"about {left_words(left_s)} left (from {self.basis})")


def weights_of(test_ids: Collection[str], durations: Mapping[str, float]) -> Callable[[str], float]:
    """Each test's share of the work: its earlier seconds (a test without any weighs their mean), else 1."""
    known = [durations[test] for test in test_ids if test in durations]
    if not known:
        return lambda test: 1.0
    mean = sum(known) / len(known)
    return lambda test: durations.get(test, mean)


def estimate_left_s(elapsed_s: float, done_weight: float, left_weight: float) -> float:
    """This run's pace over the work done so far, applied to the work left: it holds this machine's speed and
    packing's parallelism, which earlier durations alone do not."""
    if done_weight <= 0:  # only tests of no earlier seconds finished: the durations as they are
        return left_weight
    return elapsed_s * left_weight / done_weight


def clock_words(seconds: float) -> str:
    """`45s`, `4m10s`, `1h02m`."""
    whole = int(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


def left_words(seconds: float) -> str:
    """Whole minutes, at least one: an estimate finer than that would claim more than it knows."""
    minutes = max(1, round(seconds / 60))
    return f"{minutes}m" if minutes < 60 else f"{minutes // 60}h{minutes % 60:02d}m"


def shown(config: pytest.Config) -> bool:
    """Progress on the terminal, in the session that runs or replays the tests (not a packed worker)."""
    return (config.get_verbosity() >= QUIETEST_SHOWN
            and not config.getoption("pack_worker", default=None)
            and not config.option.collectonly)


def start(session: pytest.Session) -> None:
    """Once the tests are collected: the line's plugin, where a terminal reporter shows progress."""
    config = session.config
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None or not session.items or not shown(config):
        return

    def write_line(line: str) -> None:
        # write_line starts a new line only after a file's name (pytest's currentfspath): -q's dots have none, so they
        # are marked as pytest marks its own mid-line writes. The name is kept, so the file's next dots go on below
        # the line rather than after a blank line and the name again (3 lines where 2 will do).
        shown_file = reporter.currentfspath
        if reporter._tw.width_of_current_line and not shown_file:
            reporter.currentfspath = -2
        reporter.write_line(line)
        reporter.currentfspath = shown_file

    line = ProgressLine(write_line, [item.nodeid for item in session.items], earlier_durations(config), clock)
    config.pluginmanager.register(line, PLUGIN_NAME)


def earlier_durations(config: pytest.Config) -> dict[str, float]:
    """`--pack-durations`, where given and readable; a file packing refuses leaves the estimate to the test count
    (packing says what is wrong with it)."""
    try:
        return read_durations(config.getoption("pack_durations", default=None))
    except pytest.UsageError:
        return {}
