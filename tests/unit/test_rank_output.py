"""A rank's output belongs to its test (harness/ranks/output.py, harness/ranks/sections.py): captured per call and
per rank at the file-descriptor level, in every launcher, capped, carried back with the call's result or error,
and attached to the test's report (terminal on failure, junit.xml's system-out / system-err), never the next
test's; with -s it streams; outside calls it goes to the rank log."""

from __future__ import annotations

import ctypes
import os
import re
import subprocess
import sys
import tempfile
import textwrap
import time
import xml.etree.ElementTree as ET

import pytest

from harness.engines.credentials import write as write_credentials
from harness.ranks import RankFailedError, RankTimeoutError, run_distributed
from harness.ranks.output import head_and_tail, merge, read_output, stream_limits
from harness.ranks.pool import PoolLauncher
from harness.ranks.ports import port_outside_ephemeral_range
from harness.ranks.protocol import OutputCapture, RankOutput
from harness.ranks.sections import JunitBudget, rank_sections

pytest.importorskip("torch")
pytest_plugins = ["pytester"]
CAP = 64 * 1024

# ---------------------------------------------------------------- functions the ranks run (module level)


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank()


def write_everywhere(tag):
    """Python's print, a raw write to each fd and C's stdio (buffered: it must be flushed to be seen)."""
    rank = _rank()
    print(f"{tag} print {rank}")
    os.write(1, f"{tag} fd1 {rank}\n".encode())
    os.write(2, f"{tag} fd2 {rank}\n".encode())
    ctypes.CDLL(None).printf(f"{tag} printf {rank}\n".encode())
    return rank


def write_nothing():
    return _rank()


def write_then_fail_on_rank_one(tag):
    write_everywhere(tag)
    if _rank() == 1:
        raise AssertionError("rank one fails")


def write_then_exit_on_rank_one(tag):
    print(f"{tag} print {_rank()}")
    os.write(2, f"{tag} fd2 {_rank()}\n".encode())
    if _rank() == 1:
        os._exit(3)
    import torch.distributed as dist

    dist.barrier()


def write_then_hang_on_rank_one(tag):
    print(f"{tag} print {_rank()}")
    while _rank() == 1:
        time.sleep(1)


def write_a_lot(megabytes):
    sys.stdout.write("HEAD\n" + "x" * (megabytes * 1024 * 1024) + "\nTAIL\n")
    os.write(2, b"not utf-8: \xff\xfe\n")


# ---------------------------------------------------------------- launchers


def lines(text: str) -> list[str]:
    return sorted(text.splitlines())


def expected(tag: str, rank: int) -> RankOutput:
    return RankOutput(stdout=f"{tag} print {rank}\n{tag} fd1 {rank}\n{tag} printf {rank}\n",
                      stderr=f"{tag} fd2 {rank}\n")


@pytest.fixture(scope="module")
def buffered_c_stdio():
    """Ranks started in this module keep C's stdio buffered, as they do by default (PYTHONUNBUFFERED unbuffers it),
    so a call's printf reaches its output only through the rank's flush."""
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("PYTHONUNBUFFERED", raising=False)
        yield


@pytest.fixture(scope="module")
def capture(tmp_path_factory, buffered_c_stdio) -> OutputCapture:
    return OutputCapture(log=str(tmp_path_factory.mktemp("ranks") / "ranks.log"))


@pytest.fixture(scope="module")
def pool(capture):
    launcher = PoolLauncher(capture=capture)
    yield launcher
    launcher.close()


@pytest.mark.parametrize("kind", ["forked pool", "spawned pool", "spawn per call"])
def test_each_rank_returns_what_it_wrote_to_fds_1_and_2_from_python_and_c(capture, pool, kind):
    if kind == "forked pool":
        results = pool(2, write_everywhere, "hello", timeout=60, device="cpu")
    elif kind == "spawned pool":
        spawned = PoolLauncher(fork=False, capture=capture)
        try:
            results = spawned(2, write_everywhere, "hello", timeout=60, device="cpu")
        finally:
            spawned.close()
    else:
        results = run_distributed(2, write_everywhere, "hello", timeout=60, device="cpu", capture=capture)
    for result in results:
        want = expected("hello", result.rank)
        assert lines(result.output.stdout) == lines(want.stdout)
        assert result.output.stderr == want.stderr


def test_a_call_gets_only_its_own_output(pool):
    pool(2, write_everywhere, "first", timeout=60, device="cpu")
    assert [result.output for result in pool(2, write_nothing, timeout=60, device="cpu")] == [RankOutput()] * 2
    third = pool(2, write_everywhere, "third", timeout=60, device="cpu")
    assert [lines(result.output.stdout) for result in third] == [lines(expected("third", rank).stdout)
                                                                 for rank in range(2)]


def test_without_capture_nothing_comes_back():
    assert [result.output for result in run_distributed(2, write_nothing, timeout=60, device="cpu")] == [None] * 2


def test_a_failing_call_carries_every_ranks_output(pool):
    with pytest.raises(RankFailedError) as raised:
        pool(2, write_then_fail_on_rank_one, "failing", timeout=60, device="cpu")
    assert raised.value.rank == 1
    for rank in range(2):
        assert lines(raised.value.rank_outputs[rank].stdout) == lines(expected("failing", rank).stdout)


def test_a_rank_that_dies_leaves_what_it_wrote_before(pool):
    with pytest.raises(RankFailedError, match="rank 1 exited with code 3") as raised:
        pool(2, write_then_exit_on_rank_one, "dying", timeout=60, device="cpu")
    # print is line-buffered in a rank: the line is in the file before os._exit
    assert raised.value.rank_outputs[1] == RankOutput(stdout="dying print 1\n", stderr="dying fd2 1\n")


def test_a_hung_ranks_output_until_it_was_killed_comes_with_the_timeout(pool):
    with pytest.raises(RankTimeoutError) as raised:
        pool(2, write_then_hang_on_rank_one, "hanging", timeout=2, device="cpu")
    assert raised.value.rank_outputs == {0: RankOutput(stdout="hanging print 0\n"),
                                         1: RankOutput(stdout="hanging print 1\n")}


def test_output_past_the_cap_keeps_its_head_and_tail_and_says_how_much_was_cut(pool):
    results = pool(2, write_a_lot, 2, timeout=60, device="cpu")
    written = len("HEAD\n\nTAIL\n") + 2 * 1024 * 1024
    for result in results:
        stdout, stderr = result.output.stdout, result.output.stderr
        assert stdout.startswith("HEAD\nxxx") and stdout.endswith("xxx\nTAIL\n")
        kept = CAP - len(b"not utf-8: \xff\xfe\n")
        assert f"[... {written - kept:,} bytes of this rank's output cut here" in stdout
        assert stderr == "not utf-8: \ufffd\ufffd\n"


# ---------------------------------------------------------------- capping, pure


@pytest.mark.parametrize(("sizes", "kept"), [
    ((10, 10), (10, 10)),  # both fit
    ((10, 500), (10, 90)),  # stderr gets what stdout leaves
    ((500, 30), (70, 30)),
    ((0, 500), (0, 100)),
    ((500, 500), (50, 50)),  # each its half
])
def test_stdout_and_stderr_share_a_ranks_cap(sizes, kept):
    limits = stream_limits(sizes, 100)
    assert tuple(min(size, limit) for size, limit in zip(sizes, limits, strict=True)) == kept


def test_head_and_tail_decodes_what_it_keeps_and_names_the_cut():
    assert head_and_tail(b"short \xff", 100) == "short \ufffd"
    assert head_and_tail(b"a" * 50 + b"b" * 50, 10) == \
        "aaaaa\n[... 90 bytes of this rank's output cut here: its first and last bytes are kept ...]\nbbbbb"


def test_reading_a_huge_file_reads_only_its_head_and_tail(tmp_path):
    stdout, stderr = tmp_path / "out", tmp_path / "err"
    with stdout.open("wb") as big:
        big.write(b"start")
        big.seek(10 * 1024 * 1024 * 1024)  # sparse: 10 GiB on paper, nothing on disk
        big.write(b"end")
    output = read_output((stdout, stderr), limit=100)
    assert output.stdout.startswith("start") and output.stdout.endswith("end") and output.stderr == ""
    assert len(output.stdout) < 300


def test_a_tests_calls_merge_per_rank_in_order_and_are_labelled():
    calls = [{0: RankOutput(stdout="a0\n"), 1: RankOutput(stderr="b1")}, {0: RankOutput(stdout="c0\n")}]
    assert rank_sections(calls) == [("stdout (rank 0)", "--- rank 0 stdout ---\na0\nc0\n"),
                                    ("stderr (rank 1)", "--- rank 1 stderr ---\nb1\n")]
    assert merge([RankOutput(stdout="x" * 80), RankOutput(stdout="y" * 80)], limit=100).stdout.startswith("x" * 50)


def test_the_session_budget_keeps_room_for_failures():
    budget = JunitBudget()
    half = 8 * 1024 * 1024
    assert budget.take(half, failed=False)
    assert not budget.take(1, failed=False)
    assert budget.take(half, failed=True)
    assert not budget.take(1, failed=True)


# ---------------------------------------------------------------- the plugin, in a pytest session of its own

SUITE = '''
import ctypes
import os
import signal
import time

import pytest

# Each test's ranks import this module in their first call: a zygote imports installed code only.
print("imported by", os.getpid())


def _rank():
    import torch.distributed as dist

    return dist.get_rank()


def write_everywhere(tag):
    rank = _rank()
    print(f"{tag} print {rank}")
    os.write(2, f"{tag} fd2 {rank}\\n".encode())
    ctypes.CDLL(None).printf(f"{tag} printf {rank}\\n".encode())


def fail_on_rank_one(tag):
    write_everywhere(tag)
    assert _rank() != 1, "rank one fails"


def exit_on_rank_one(tag):
    write_everywhere(tag)
    if _rank() == 1:
        os._exit(3)
    import torch.distributed as dist

    dist.barrier()


def hang_on_rank_one(tag):
    write_everywhere(tag)
    while _rank() == 1:
        time.sleep(1)


def interrupt_the_test_from_rank_one(tag, test_pid):
    """Once both ranks wrote: SIGALRM to the test, as pytest-timeout's signal method sends it, then hang."""
    import torch.distributed as dist

    write_everywhere(tag)
    dist.barrier()
    if _rank() == 1:
        os.kill(test_pid, signal.SIGALRM)
        while True:
            time.sleep(1)


def test_passes(ranks):
    ranks.run(2, write_everywhere, "passes")


def test_fails(ranks):
    ranks.run(2, fail_on_rank_one, "fails")


def test_is_quiet(ranks):
    ranks.run(2, _rank)


def test_crashes(ranks):
    ranks.run(2, exit_on_rank_one, "crashes")


def test_hangs(ranks):
    ranks.timeout_s = 2
    ranks.run(2, hang_on_rank_one, "hangs")


def test_is_interrupted(ranks):
    def interrupt(signum, frame):
        pytest.fail("interrupted while the ranks ran")

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        ranks.run(2, interrupt_the_test_from_rank_one, "interrupted", os.getpid())
    finally:
        signal.signal(signal.SIGALRM, previous)
'''

TESTS = ("passes", "fails", "quiet", "crashes", "hangs", "interrupted")


def run_session(pytester, monkeypatch, *args: str, pool: str | None = None):
    """The suite above in a pytest of its own (a subprocess: what reaches its fds 1 and 2 is its terminal); the
    result, each test's (system-out, system-err) in junit.xml without the suite's import lines, and the rank
    log's path."""
    monkeypatch.setenv("HARNESS_CPU_RANKS", "2")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.delenv("PYTHONUNBUFFERED", raising=False)  # C's stdio buffers, as a rank has them by default
    if pool is None:
        monkeypatch.delenv("HARNESS_RANKS_POOL", raising=False)
    else:
        monkeypatch.setenv("HARNESS_RANKS_POOL", pool)
    pytester.makepyfile(test_suite=SUITE)
    junit, log = pytester.path / "junit.xml", pytester.path / "ranks.log"
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-o", "junit_family=xunit1",
                                           "-o", "junit_logging=all", f"--junitxml={junit}", f"--ranks-log={log}",
                                           *args, timeout=600)
    return result, junit_outputs(junit), log


def junit_outputs(junit) -> dict[str, tuple[str, str]]:
    """Each test's (system-out, system-err), by its name without test_ (and is_), the suite's import lines left out."""
    return {case.get("name").removeprefix("test_").removeprefix("is_"):
            (without_imports(case.findtext("system-out") or ""), without_imports(case.findtext("system-err") or ""))
            for case in ET.parse(junit).getroot().iter("testcase")}


def launch_failures(junit) -> dict[str, str]:
    """Each test's launch_failed property (contract.LAUNCH_FAILED), by its name without test_."""
    return {case.get("name").removeprefix("test_"): prop.get("value")
            for case in ET.parse(junit).getroot().iter("testcase")
            for prop in case.iter("property") if prop.get("name") == "launch_failed"}


def without_imports(text: str) -> str:
    return "".join(line for line in text.splitlines(keepends=True) if not line.startswith("imported by"))


def said(tag: str, rank: int) -> tuple[str, str]:
    """What write_everywhere(tag) puts on stdout and on stderr of `rank`."""
    return f"{tag} print {rank}\n{tag} printf {rank}\n", f"{tag} fd2 {rank}\n"


LAUNCHERS = {"forked pool": ((), None), "spawned pool": ((), "spawn"), "no pool": (("--no-ranks-pool",), None)}


@pytest.mark.parametrize("how", list(LAUNCHERS))
def test_each_ranks_output_is_its_own_tests_in_junit_and_shows_only_with_a_failure(pytester, monkeypatch, how):
    args, pool = LAUNCHERS[how]
    result, cases, log = run_session(pytester, monkeypatch, *args, pool=pool)
    result.assert_outcomes(passed=2, failed=4)
    terminal = result.stdout.str() + result.stderr.str()
    assert_each_test_holds_its_own_output(terminal, cases)
    # How each launch failed, as the launcher saw it: the property triage reads (a rank's own exception is none).
    assert launch_failures(pytester.path / "junit.xml") == {"crashes": "rank_died", "hangs": "timed_out"}
    if how == "forked pool":
        # The suite is no installed code: the zygote never imports it (harness.ranks.preload), so nothing of it
        # runs, or writes, outside a call.
        assert not log.exists() or "imported by" not in log.read_text()


def assert_each_test_holds_its_own_output(terminal: str, cases: dict[str, tuple[str, str]]) -> None:
    """Every rank's output in its own test's system-out / system-err and nowhere else; a failure's on the terminal,
    a pass's not."""
    for test in ("passes", "quiet"):  # a passing test's output is in its report only
        assert f"{test} print" not in terminal and f"{test} fd2" not in terminal
    # A rank that sent no answer (it died, hung, or the wait for it was interrupted) may leave C's buffer unwritten;
    # what Python and the fd wrote is in its file.
    for test, unanswered in (("fails", ()), ("crashes", (1,)), ("hangs", (1,)), ("interrupted", (0, 1))):
        stdout, stderr = cases[test]
        for rank in range(2):
            rank_stdout, rank_stderr = said(test, rank)
            if rank in unanswered:
                rank_stdout = rank_stdout.splitlines(keepends=True)[0]
            assert f"--- rank {rank} stdout ---\n{rank_stdout}" in stdout
            assert f"--- rank {rank} stderr ---\n{rank_stderr}" in stderr
            assert f"Captured stdout (rank {rank}) call" in terminal and rank_stdout in terminal
    stdout, stderr = cases["passes"]
    assert all(said("passes", rank)[0] in stdout and said("passes", rank)[1] in stderr for rank in range(2))
    for test in TESTS:  # each test holds its own output, and no other test's
        others = [other for other in TESTS if other != test]
        assert not any(f"{other} print" in cases[test][0] or f"{other} fd2" in cases[test][1] for other in others)
    quiet = cases["quiet"][0] + cases["quiet"][1]
    assert [line for line in quiet.splitlines() if line and not line.startswith("-")] == []


def test_a_rank_on_another_host_sends_its_output_through_its_agent(pytester, monkeypatch):
    """Two hosts on this machine (harness host 0 runs pytest, host 1 an agent), a rank each: rank 1's output comes
    back in its call's result, or from its agent when it died or hung; outside calls it is in host 1's log."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.delenv("PYTHONUNBUFFERED", raising=False)
    monkeypatch.delenv("HARNESS_RANKS_POOL", raising=False)
    pytester.makepyfile(test_suite=SUITE)
    junit = pytester.path / "junit.xml"
    credentials = write_credentials(pytester.path / "private", "two-hosts")
    host = [sys.executable, "-m", "harness", "host", "--count", "2", "--host0", "127.0.0.1", "--ranks-per-host", "1",
            "--hub-port", str(port_outside_ephemeral_range("127.0.0.1")), "--credentials", str(credentials)]
    pytest_command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-o", "junit_family=xunit1",
                      "-o", "junit_logging=all", f"--junitxml={junit}"]
    with (pytester.path / "host1.log").open("w+") as host1_log:
        agent = subprocess.Popen([*host, "--index", "1"], stdout=host1_log, stderr=subprocess.STDOUT)
        try:
            leader = subprocess.run([*host, "--index", "0", "--cpu-ranks", "--cwd", str(pytester.path), "--",
                                     *pytest_command], capture_output=True, text=True, timeout=600)
        finally:
            agent.wait(timeout=60)
        host1_log.seek(0)
        host1 = host1_log.read()
    assert "4 failed, 2 passed" in leader.stdout, leader.stdout[-3000:]
    assert_each_test_holds_its_own_output(leader.stdout + leader.stderr, junit_outputs(junit))
    assert "imported by" not in host1  # host 1's zygote never imports the suite: rank 1 does, in its call


def test_with_s_the_ranks_write_to_the_terminal_as_they_go(pytester, monkeypatch):
    result, cases, _ = run_session(pytester, monkeypatch, "-s", "-k", "passes or fails")
    result.assert_outcomes(passed=1, failed=1)
    terminal = result.stdout.str() + result.stderr.str()
    for test in ("passes", "fails"):
        for rank in range(2):
            stdout, stderr = said(test, rank)
            assert all(line in terminal for line in (stdout + stderr).splitlines())
        assert "--- rank" not in cases[test][0] + cases[test][1]
    assert "Captured stdout (rank" not in terminal


def test_past_the_sessions_budget_a_note_stands_for_the_output(pytester, monkeypatch):
    """In process, with a budget this small: the first test's output fits, the second's is a note."""
    monkeypatch.setattr("harness.ranks.sections.RANK_OUTPUT_JUNIT_BYTES", 200)
    pytester.makeconftest(textwrap.dedent("""
        import pytest
        from harness.ranks import RankResult
        from harness.ranks.plugin import LAUNCHER_KEY
        from harness.ranks.protocol import RankOutput

        pytest_plugins = ["harness.ranks.plugin"]


        def pytest_configure(config):
            def launcher(world_size, fn, *args, timeout):
                return [RankResult(rank, None, None, None, RankOutput(stdout=fn(rank)))
                        for rank in range(world_size)]
            config.stash[LAUNCHER_KEY] = launcher
    """))
    pytester.makepyfile(test_budget="""
        def say(rank):
            return f"rank {rank} says hello\\n"

        def test_first(ranks):
            ranks.run(2, say)

        def test_second(ranks):
            ranks.run(2, say)
    """)
    monkeypatch.setenv("HARNESS_CPU_RANKS", "2")
    junit = pytester.path / "junit.xml"
    pytester.runpytest("-o", "junit_logging=all", f"--junitxml={junit}").assert_outcomes(passed=2)
    first, second = [case.findtext("system-out") + case.findtext("system-err")
                     for case in ET.parse(junit).getroot().iter("testcase")]
    assert "rank 1 says hello" in first and "left out" not in first
    assert "rank 1 says hello" not in second and "bytes the ranks wrote are left out" in second


def test_the_rank_log_is_where_the_ini_says_and_an_empty_temporary_one_is_removed(pytester, monkeypatch):
    temporary = pytester.path / "tmp"
    temporary.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))
    pytester.makepyfile(test_nothing="def test_nothing():\n    pass\n")
    pytester.runpytest().assert_outcomes(passed=1)
    assert list(temporary.iterdir()) == []
    pytester.makeini("[pytest]\nranks_log = logs/ranks.log\n")
    pytester.runpytest().assert_outcomes(passed=1)
    assert (pytester.path / "logs" / "ranks.log").is_file()


# ---------------------------------------------------------------- a rank's failure leads with the rank's own frames

TRACEBACK_SUITE = '''
def fail_in_the_rank():
    raise_here()


def raise_here():
    raise AssertionError("the rank's own failure")


def test_fails(ranks):
    ranks.run(2, fail_in_the_rank)
'''


@pytest.mark.parametrize("how", list(LAUNCHERS))
def test_a_rank_failures_traceback_shows_the_tests_line_then_the_ranks_frames_and_no_harness_frame(
        pytester, monkeypatch, how):
    """The launcher's frames (Ranks.run, the pool or run_distributed, RankSet.call and _gather) are hidden from a
    launch's error, and the rank's traceback starts at the test's function, not in harness/ranks/rank.py."""
    args, pool = LAUNCHERS[how]
    monkeypatch.setenv("HARNESS_CPU_RANKS", "2")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setenv("HARNESS_RANKS_POOL", pool) if pool else monkeypatch.delenv("HARNESS_RANKS_POOL", raising=False)
    pytester.makepyfile(test_tracebacks=TRACEBACK_SUITE)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", *args, timeout=300)
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    failure = out[out.index("_ test_fails _"):out.index("short test summary info")]
    assert "harness/ranks/" not in failure, failure
    lines = [line.strip() for line in failure.splitlines()]
    call = lines.index("def test_fails(ranks):")
    assert lines[call + 1] == ">       ranks.run(2, fail_in_the_rank)".strip()
    assert re.fullmatch(r"E\s+harness\.ranks\.failures\.RankFailedError: rank [01] raised AssertionError: "
                        "the rank's own failure", lines[call + 2])
    start = lines.index("E       Traceback (most recent call last):")
    assert lines[start + 1].startswith("E         File ") and lines[start + 1].endswith(", in fail_in_the_rank")
    assert lines[start + 3].endswith(", in raise_here")
    assert any(re.fullmatch(r"test_tracebacks\.py:\d+: RankFailedError", line) for line in lines)


def test_only_a_launchs_error_hides_harnesss_frames_and_a_harness_error_keeps_the_ranks_whole_traceback():
    from harness.ranks.failures import DistributedError, hidden_from_a_failure
    from harness.ranks.rank import call_fn, called_traceback

    for error, hidden in ((DistributedError("a rank raised", [], []), True), (ValueError("a bug of harness"), False)):
        with pytest.raises(type(error)) as raised:
            raise error
        assert hidden_from_a_failure(raised) is hidden
    assert not hidden_from_a_failure(None)

    def the_tests_function():
        raise ValueError("in the test's code")

    try:
        call_fn(the_tests_function, ())
    except ValueError as error:
        called = called_traceback(error)
    assert called.splitlines()[1].endswith("in the_tests_function") and "call_fn" not in called
    try:
        raise ValueError("in harness, before the function ran")
    except ValueError as error:
        whole = called_traceback(error)
    assert "in test_only_a_launchs_error_hides_harnesss_frames" in whole
