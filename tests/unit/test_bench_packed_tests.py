"""tests/benchmarks/bench_packed_tests.py counts what a run finished even when it is cut at its limit, before pytest
writes junit.xml: outcome_stream.py's lines class every outcome as junit.xml does, test by test, and a run killed
mid-test still lists the tests that ended before it; a packed run lists each test once."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"

EVERY_OUTCOME = '''
import pytest

@pytest.fixture
def broken():
    raise RuntimeError("setup fails")

def test_passes():
    pass

def test_fails():
    assert False

def test_errors_in_setup(broken):
    pass

def test_skips():
    pytest.skip("not here")

@pytest.mark.xfail(reason="known")
def test_known_bug():
    assert False

@pytest.mark.xfail(reason="known, fixed since")
def test_known_bug_fixed():
    pass

@pytest.mark.xfail(reason="known, strict", strict=True)
def test_known_bug_fixed_strictly():
    pass

def test_xfails_inside():
    pytest.xfail("found at run time")

@pytest.mark.parametrize("case", ["a-1", "b[2]"])
def test_parametrized(case):
    pass

class TestInAClass:
    def test_method(self):
        pass
'''


def load_bench():
    spec = importlib.util.spec_from_file_location("bench_packed_tests", BENCHMARKS / "bench_packed_tests.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_stream_classes_every_outcome_as_junit_xml_does(tmp_path):
    bench = load_bench()
    (tmp_path / "test_every_outcome.py").write_text(EVERY_OUTCOME)
    junit = tmp_path / "run.xml"
    figures = bench.run([str(tmp_path / "test_every_outcome.py"), f"--rootdir={tmp_path}"], junit, 300)
    assert not figures["cut"] and junit.exists()
    from_junit = bench.read_outcomes(junit)
    from_stream = bench.read_stream(junit.with_suffix(".jsonl"))
    assert from_stream == from_junit
    assert sorted(from_stream.values()) == sorted(["passed", "failure", "error", "skipped", "xfailed", "passed",
                                                   "failure", "xfailed", "passed", "passed", "passed"])


def test_a_run_killed_mid_test_still_lists_the_tests_that_ended(tmp_path):
    reached = tmp_path / "reached"
    (tmp_path / "test_cut.py").write_text(f'''
import pathlib, time

def test_first():
    pass

def test_second():
    assert False

def test_never_ends():
    pathlib.Path({str(reached)!r}).touch()
    time.sleep(3600)
''')
    stream = tmp_path / "cut.jsonl"
    pytest_run = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "outcome_stream",
                                   f"--outcome-stream={stream}", "-p", "no:cacheprovider", "-q",
                                   f"--rootdir={tmp_path}", str(tmp_path / "test_cut.py")],
                                  cwd=tmp_path, env=load_bench().with_outcome_stream(), stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
    try:
        while not reached.exists():  # the third test began, so the first two have ended
            assert pytest_run.poll() is None, "pytest ended before its last test began"
            time.sleep(0.05)
    finally:
        pytest_run.kill()
        pytest_run.wait()
    lines = [json.loads(line) for line in stream.read_text().splitlines()]
    assert [(line["test"], line["outcome"]) for line in lines] == [("test_cut::test_first", "passed"),
                                                                   ("test_cut::test_second", "failure")]
    assert all(isinstance(line["duration_s"], float) and line["duration_s"] >= 0 for line in lines)


PACKED = '''
import pytest

@pytest.mark.parametrize("world_size", [1])
@pytest.mark.parametrize("index", range(4))
def test_packed(world_size, index):
    assert index != 3
'''


def test_a_packed_run_streams_each_test_once_as_its_junit_xml_has_it(tmp_path, monkeypatch):
    """Workers inherit --outcome-stream; only the coordinator, which replays their reports, may write it."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    bench = load_bench()
    (tmp_path / "test_packed.py").write_text(PACKED)
    junit = tmp_path / "packed.xml"
    figures = bench.run([str(tmp_path / "test_packed.py"), f"--rootdir={tmp_path}", "--pack-tests"], junit, 300)
    assert not figures["cut"]
    lines = [json.loads(line) for line in junit.with_suffix(".jsonl").read_text().splitlines()]
    assert len(lines) == 4
    assert {line["test"]: line["outcome"] for line in lines} == bench.read_outcomes(junit)
