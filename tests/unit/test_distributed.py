"""The rank launcher (harness/ranks/spawn.py) and its pytest fixture, on CPU ranks with gloo."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from process_helpers import is_alive, sleep_forever

from harness.ranks import RankFailedError, RankTimeoutError, run_distributed
from harness.ranks.raised import NO_MESSAGE, first_line, raising_frame, relative_to_sys_path

pytest.importorskip("torch")
pytest_plugins = ["pytester"]


# ---------------------------------------------------------------- functions the ranks run (module level)


def report_rank(tag):
    import torch.distributed as dist

    return {"tag": tag, "rank": dist.get_rank(), "world_size": dist.get_world_size(),
            "backend": dist.get_backend(), "RANK": os.environ["RANK"]}


def fail_on_rank_one():
    import torch.distributed as dist

    if dist.get_rank() == 1:
        check_the_answer(41)
    return "fine"


def check_the_answer(answer):
    assert answer == 42, f"the answer is {answer}"


def exit_without_result():
    import torch.distributed as dist

    if dist.get_rank() == 1:
        os._exit(7)
    return "fine"


def crash_while_a_peer_waits():
    """Rank 1 dies without a word; rank 0 then fails in the barrier because its peer is gone."""
    import torch.distributed as dist

    if dist.get_rank() == 1:
        os._exit(3)
    dist.barrier()


def hang_with_a_child(pid_dir):
    """Rank 1 sleeps (in a function whose name the stack must show) while rank 0 waits at a barrier;
    each rank first starts a child process that must not outlive the run."""
    import torch.distributed as dist

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    rank = dist.get_rank()
    Path(pid_dir, f"rank{rank}").write_text(f"{os.getpid()} {child.pid}")
    if rank == 1:
        sleep_forever()
    dist.barrier()


# ---------------------------------------------------------------- launcher


def test_every_rank_runs_the_function_with_the_process_group_initialised():
    results = run_distributed(2, report_rank, "x", timeout=60, device="cpu")
    assert [result.rank for result in results] == [0, 1]
    assert [result.value for result in results] == [
        {"tag": "x", "rank": rank, "world_size": 2, "backend": "gloo", "RANK": str(rank)} for rank in (0, 1)]
    assert all(result.peak_allocated_mib is None and result.peak_reserved_mib is None for result in results)


def test_an_assertion_on_one_rank_raises_with_that_ranks_traceback():
    with pytest.raises(RankFailedError) as failure:
        run_distributed(2, fail_on_rank_one, timeout=60, device="cpu")
    error = failure.value
    assert error.rank == 1
    assert error.summary == "raised AssertionError: the answer is 41"
    assert (error.error_type, error.error_message) == ("AssertionError", "the answer is 41")
    assert str(error).startswith("rank 1 raised AssertionError: the answer is 41")
    assert "in check_the_answer" in error.details and "in fail_on_rank_one" in error.details
    # where it raised travels as data: the innermost frame, its file relative to the sys.path entry holding it
    assert error.error_frame.location == "test_distributed.py:check_the_answer"
    assert error.error_frame.line == check_the_answer.__code__.co_firstlineno + 1


def test_the_raising_frame_is_the_innermost_one_named_by_its_file_within_its_package():
    import torch.distributed.tensor.placement_types as placement_types

    assert relative_to_sys_path(placement_types.__file__) == "torch/distributed/tensor/placement_types.py"
    assert relative_to_sys_path("/nowhere/on/sys/path/module.py") == "module.py"
    try:
        check_the_answer(41)
    except AssertionError as error:
        frame = raising_frame(error)
    assert (frame.file, frame.function) == ("test_distributed.py", "check_the_answer")
    assert raising_frame(AssertionError()) is None  # never raised: no traceback
    assert first_line(AssertionError()) == NO_MESSAGE


def test_a_rank_that_dies_without_a_result_is_reported_with_its_exit_code():
    with pytest.raises(RankFailedError, match=r"^rank 1 exited with code 7 without a result") as failure:
        run_distributed(2, exit_without_result, timeout=60, device="cpu")
    assert (failure.value.error_type, failure.value.error_frame) == (None, None)


def test_a_rank_that_crashed_is_the_first_failure_not_the_peer_that_lost_it():
    with pytest.raises(RankFailedError) as failure:
        run_distributed(2, crash_while_a_peer_waits, timeout=60, device="cpu")
    error = failure.value
    assert error.rank == 1
    assert str(error).startswith("rank 1 exited with code 3 without a result")
    assert len(error.other_failures) == 1 and error.other_failures[0].startswith("rank 0 ")


def test_a_hang_is_killed_at_the_timeout_with_every_ranks_stack_and_nothing_left_running(tmp_path):
    started = time.monotonic()
    with pytest.raises(RankTimeoutError) as failure:
        run_distributed(2, hang_with_a_child, str(tmp_path), timeout=5, device="cpu")
    # The 5 s start once both ranks are ready: spawning them (importing torch) on a busy machine is not
    # bounded by the timeout, so only a launch that never ends fails here.
    assert time.monotonic() - started < 120
    error = failure.value
    assert error.hung_ranks == [0, 1]
    assert "in sleep_forever" in error.stacks[1]
    assert "in hang_with_a_child" in error.stacks[0] and "barrier" in error.stacks[0]
    assert str(error).startswith("ranks [0, 1] still running after 5s; killed. Hung first: ranks [1]; "
                                 "ranks [0] waited for them in a collective.")
    assert error.hung_first == [1]
    assert str(error).index("--- rank 1 ---") < str(error).index("--- rank 0 ---")
    pids = [int(pid) for rank in (0, 1) for pid in (tmp_path / f"rank{rank}").read_text().split()]
    deadline = time.monotonic() + 5
    while any(is_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [pid for pid in pids if is_alive(pid)] == []


def test_starting_the_ranks_does_not_count_against_the_timeout(tmp_path, monkeypatch):
    # Each rank's interpreter sleeps while it starts (sitecustomize runs before any rank code), so starting
    # takes longer than the call's timeout on every machine, however fast; the call itself then fits in it.
    (tmp_path / "sitecustomize.py").write_text("import time\ntime.sleep(STARTUP_S)\n".replace("STARTUP_S", "4"))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    started = time.monotonic()
    results = run_distributed(2, report_rank, "x", timeout=3, device="cpu")
    assert [result.value["rank"] for result in results] == [0, 1]
    assert time.monotonic() - started > 4


def test_a_function_that_does_not_pickle_is_refused_before_any_rank_starts():
    with pytest.raises(TypeError, match="module-level function and picklable arguments"):
        run_distributed(2, lambda: None, timeout=60, device="cpu")


@pytest.mark.parametrize(("world_size", "device"), [(0, "cpu"), (2, "tpu")])
def test_bad_arguments_are_refused(world_size, device):
    with pytest.raises(ValueError):
        run_distributed(world_size, report_rank, "x", device=device)


# ---------------------------------------------------------------- the fixture (harness/ranks/plugin.py)

FAKE_LAUNCHER_CONFTEST = """
import pytest
from harness.ranks import RankResult
from harness.ranks.plugin import LAUNCHER_KEY

pytest_plugins = ["harness.ranks.plugin"]


def pytest_configure(config):
    # stands in for a persistent rank pool: the tests below run unchanged on it
    def launcher(world_size, fn, *args, timeout):
        return [RankResult(rank, fn(rank, *args), 100.0 + rank, 200.0 + rank) for rank in range(world_size)]
    config.stash[LAUNCHER_KEY] = launcher
"""

FIXTURE_TESTS = """
import pytest


def double(rank, value):
    return rank, 2 * value


@pytest.mark.parametrize("world_size", [2, 3])
def test_runs(ranks, world_size):
    assert ranks.run(world_size, double, 21) == [(rank, 42) for rank in range(world_size)]
    ranks.record(max_rel_grad_error=0.001, grad_error_bound=0.03)


@pytest.mark.timeout(100)
def test_launches_end_before_the_test_timeout(ranks):
    assert ranks.timeout_s == 70
"""


def test_the_fixture_skips_world_sizes_beyond_the_cpu_ranks_and_records_properties(pytester, monkeypatch):
    monkeypatch.setenv("HARNESS_CPU_RANKS", "2")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    pytester.makeconftest(FAKE_LAUNCHER_CONFTEST)
    pytester.makepyfile(test_fixture=FIXTURE_TESTS)
    junit = pytester.path / "junit.xml"
    result = pytester.runpytest("-rs", "-o", "junit_family=xunit1", f"--junitxml={junit}")
    result.assert_outcomes(passed=2, skipped=1)
    result.stdout.fnmatch_lines(["*SKIPPED*needs 3 ranks (HARNESS_CPU_RANKS=2)*"])
    xml = junit.read_text()
    for prop in ('name="world_size" value="2"', 'name="peak_allocated_mib.rank1" value="101.0"',
                 'name="peak_reserved_mib.rank0" value="200.0"', 'name="max_rel_grad_error" value="0.001"'):
        assert prop in xml


NOT_RUN_TESTS = """
import pytest


def fail_on_rank_one(rank):
    assert rank != 1, "rank 1 disagrees"


@pytest.mark.parametrize("world_size", [2, 3])
def test_parametrized(ranks, world_size):
    pass


def test_asks_for_more_ranks_inside(ranks):
    ranks.run(4, fail_on_rank_one)


def test_fails_on_its_ranks(ranks):
    ranks.run(2, fail_on_rank_one)
"""


def test_what_the_host_could_not_run_is_recorded_as_data_and_a_failed_launch_keeps_its_world_size(
        pytester, monkeypatch):
    import xml.etree.ElementTree as ET

    monkeypatch.setenv("HARNESS_CPU_RANKS", "2")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    pytester.makeconftest(FAKE_LAUNCHER_CONFTEST)
    pytester.makepyfile(test_not_run=NOT_RUN_TESTS)
    junit = pytester.path / "junit.xml"
    pytester.runpytest("-o", "junit_family=xunit1", f"--junitxml={junit}").assert_outcomes(
        passed=1, skipped=2, failed=1)
    recorded = {case.get("name"): {prop.get("name"): prop.get("value") for prop in case.iter("property")}
                for case in ET.parse(junit).getroot().iter("testcase")}
    # skipped in the fixture (a world_size parameter) and in ranks.run: the same properties, both ways
    assert recorded["test_parametrized[3]"] == {"needs_world_size": "3", "host_ranks": "2", "host_rank_unit": "ranks"}
    assert recorded["test_asks_for_more_ranks_inside"] == {
        "needs_world_size": "4", "host_ranks": "2", "host_rank_unit": "ranks"}
    assert recorded["test_fails_on_its_ranks"] == {"world_size": "2"}  # recorded before the launch that failed
    assert recorded["test_parametrized[2]"] == {}


def test_a_bad_cpu_rank_count_is_a_usage_error(pytester, monkeypatch):
    monkeypatch.setenv("HARNESS_CPU_RANKS", "two")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    pytester.makeconftest(FAKE_LAUNCHER_CONFTEST)
    pytester.makepyfile(test_fixture=FIXTURE_TESTS)
    result = pytester.runpytest()
    assert "HARNESS_CPU_RANKS must be a whole number of CPU ranks, got 'two'" in result.stdout.str() + \
        result.stderr.str()


def test_a_failed_launch_records_how_the_launcher_saw_it_end():
    """The launch_failed property triage reads: from the launcher's own error types, never a message's words."""
    from harness.ranks.failures import HostLostError, RankFailedError, RankTimeoutError
    from harness.ranks.plugin import launch_failure

    assert launch_failure(HostLostError(1, "h1", "no heartbeat for 10.1s")) == "host_lost"
    assert launch_failure(RankTimeoutError(60.0, [1], {1: "waiting"})) == "timed_out"
    assert launch_failure(RankFailedError(1, "exited by signal SIGKILL without a result", "", [])) == "rank_died"
    # a rank's own exception is the case's failure, whatever it says (an OOM under the code under test)
    oom = RankFailedError(1, "raised OutOfMemoryError: CUDA out of memory", "", [], error_type="OutOfMemoryError",
                          error_message="CUDA out of memory. Tried to allocate 2.00 GiB")
    assert launch_failure(oom) is None
    assert launch_failure(KeyboardInterrupt()) is None
