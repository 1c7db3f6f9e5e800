"""The line a long session's terminal gets now and then (harness.ranks.progress): when it is due, what it says, and
where it is left out. Time comes from a fake clock that each test advances by a set number of seconds, so nothing
here depends on how fast the machine is."""

from __future__ import annotations

import json

import pytest

from harness.ranks import progress
from harness.ranks.group_queue import GroupQueue

pytest_plugins = ["pytester"]


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def lines_of_a_run(tests: int, seconds_each: float, durations: dict[str, float] | None = None) -> list[str]:
    """The lines written while `tests` tests finish one after another, each taking `seconds_each`."""
    clock, written = FakeClock(), []
    ids = [f"test_{index}" for index in range(tests)]
    line = progress.ProgressLine(written.append, ids, durations or {}, clock)
    for test_id in ids:
        clock.now += seconds_each
        line.pytest_runtest_logfinish(test_id, None)
    return written


def finished_counts(lines: list[str]) -> list[int]:
    return [int(line.split()[1].split("/")[0]) for line in lines]


@pytest.mark.parametrize(("tests", "seconds_each", "counts"), [
    (30, 30.0, [3, 6, 9, 12, 15, 18, 21, 24, 27]),  # a minute passes every 2 tests: a tenth of them is rarer
    (30, 5.0, [12, 24]),  # a tenth passes every 15 s: a minute is rarer
    (30, 1.0, []),  # under a minute in all
    (640, 0.9375, [64, 128, 192, 256, 320, 384, 448, 512, 576]),  # the 10-minute default run: 9 lines
])
def test_a_line_needs_a_minute_and_a_tenth_of_the_tests_whichever_is_rarer(tests, seconds_each, counts):
    assert finished_counts(lines_of_a_run(tests, seconds_each)) == counts


def test_the_line_says_the_tests_the_time_elapsed_and_about_how_long_is_left():
    assert lines_of_a_run(30, 20.0)[:2] == [
        "harness: 3/30 tests, 1m00s elapsed, about 9m left (from the collected count)",  # 60 s / 3 tests x 27 left
        "harness: 6/30 tests, 2m00s elapsed, about 8m left (from the collected count)",
    ]


def test_earlier_durations_weigh_the_tests_left():
    slow_last = {f"test_{index}": 1.0 for index in range(19)} | {"test_19": 39.0}
    # 2 tests of 1 s each took 60 s: the 56 s of work left takes 28 minutes at this pace.
    assert lines_of_a_run(20, 30.0, slow_last)[0] == (
        "harness: 2/20 tests, 1m00s elapsed, about 28m left (from earlier durations)")
    last_unknown = {f"test_{index}": 1.0 for index in range(19)}  # test_19 weighs their mean, 1 s: 18 s left
    assert lines_of_a_run(20, 30.0, last_unknown)[0] == (
        "harness: 2/20 tests, 1m00s elapsed, about 9m left (from earlier durations)")


def test_a_test_that_finishes_again_counts_once():
    clock = FakeClock()
    line = progress.ProgressLine(print, [f"t{index}" for index in range(10)], {}, clock)
    clock.now += 120.0
    assert line.finished("t0") == "harness: 1/10 tests, 2m00s elapsed, about 18m left (from the collected count)"
    clock.now += 120.0
    assert line.finished("t0") is None and line.finished_count == 1


@pytest.mark.parametrize(("seconds", "elapsed", "left"), [
    (10, "10s", "1m"), (250, "4m10s", "4m"), (480, "8m00s", "8m"), (3725, "1h02m", "1h02m"),
])
def test_times_read_as_a_clock_and_estimates_in_whole_minutes(seconds, elapsed, left):
    assert (progress.clock_words(seconds), progress.left_words(seconds)) == (elapsed, left)


# ---------------------------------------------------------------- in a pytest session


class EachTestTakes:
    """A plugin for the inner session: each test's call advances the fake clock."""

    def __init__(self, clock: FakeClock, seconds: float) -> None:
        self.clock, self.seconds = clock, seconds

    def pytest_runtest_call(self, item: pytest.Item) -> None:
        self.clock.now += self.seconds


def session_output(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, *args: str) -> list[str]:
    """30 tests of 20 fake seconds each, in one pytest session: its terminal's lines."""
    clock = FakeClock()
    monkeypatch.setattr(progress, "clock", clock)
    pytester.makepyfile(test_thirty="\n".join(f"def test_{index}():\n    pass\n" for index in range(30)))
    result = pytester.runpytest_inprocess("-p", "harness.ranks.plugin", *args, plugins=[EachTestTakes(clock, 20.0)])
    assert result.ret == 0
    return result.outlines


def session_lines(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, *args: str) -> list[str]:
    """The progress lines, each starting its own line."""
    return [line for line in session_output(pytester, monkeypatch, *args) if line.startswith("harness: ")]


@pytest.mark.parametrize("args", [(), ("-q",), ("-v",)])
def test_a_session_writes_the_line_on_its_terminal(pytester, monkeypatch, args):
    assert session_lines(pytester, monkeypatch, *args) == [
        f"harness: {3 * k}/30 tests, {k}m00s elapsed, about {10 - k}m left (from the collected count)"
        for k in range(1, 10)
    ]


def test_the_files_dots_go_on_below_the_line(pytester, monkeypatch):
    """Not a blank line and the file's name again after each line: 2 lines where 3 would be."""
    output = session_output(pytester, monkeypatch)
    after = [output[index + 1] for index, line in enumerate(output) if line.startswith("harness: ")]
    assert [line.split()[0] for line in after] == ["..."] * 9  # the last also has pytest's [100%]


def test_a_durations_file_is_the_estimates_basis(pytester, monkeypatch):
    durations = pytester.path / "durations.json"
    durations.write_text(json.dumps({f"test_thirty.py::test_{index}": 1.0 if index < 29 else 28.0
                                     for index in range(30)}))
    # 3 tests of 1 s each took 60 s; the 26 + 28 s left take 18 minutes at this pace.
    assert session_lines(pytester, monkeypatch, f"--pack-durations={durations}")[0] == (
        "harness: 3/30 tests, 1m00s elapsed, about 18m left (from earlier durations)")


def test_no_line_when_quietest_or_in_a_packed_worker(pytester, monkeypatch):
    assert session_lines(pytester, monkeypatch, "-qq") == []
    queue = GroupQueue.create(pytester.path / "group", [f"test_thirty.py::test_{index}" for index in range(30)])
    worker = queue.folder / "worker0"
    worker.mkdir()
    assert session_lines(pytester, monkeypatch, f"--pack-worker={worker}") == []
    assert len((worker / "reports.jsonl").read_text().splitlines()) == 90  # the worker did run the 30 tests
