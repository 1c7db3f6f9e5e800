"""harness.ranks.group_queue: a packed group's tests, taken one at a time by its workers, each test by one worker
only, and the log of who took what that the coordinator reads after a worker died."""

from __future__ import annotations

import multiprocessing

from harness.ranks.group_queue import GroupQueue

TESTS = [f"test_x.py::test_{index}" for index in range(200)]


def take_all(folder, worker, barrier):
    queue = GroupQueue(folder)
    barrier.wait()  # every worker claims at once
    while queue.claim(worker) is not None:
        pass


def test_workers_claiming_at_once_take_every_test_exactly_once(tmp_path):
    queue = GroupQueue.create(tmp_path, TESTS)
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(4)
    workers = [context.Process(target=take_all, args=(tmp_path, f"worker{index}", barrier)) for index in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert all(worker.exitcode == 0 for worker in workers)
    taken = [test for index in range(4) for test in queue.claimed_by(f"worker{index}")]
    assert sorted(taken) == sorted(TESTS)
    assert queue.unclaimed() == []


def test_the_log_says_who_took_what_and_what_is_left(tmp_path):
    queue = GroupQueue.create(tmp_path, ["a", "b", "c", "d"])
    assert [queue.claim("w0"), queue.claim("w1"), queue.claim("w0")] == ["a", "b", "c"]
    assert queue.claimed_by("w0") == ["a", "c"]
    assert queue.claimed_by("w1") == ["b"]
    assert queue.unclaimed() == ["d"]
    assert queue.claim("w1") == "d"
    assert queue.claim("w0") is None
    assert queue.unclaimed() == []
