"""Tests packed within a cell (issue 45, harness.ranks.packing): several tests at once on disjoint core sets, their
reports replayed by the coordinator so that the terminal, junit.xml, properties and exit status are a serial run's.
On this machine's cores: each test here needs one rank (a `world_size` of 1), so two run at once on two cores."""

from __future__ import annotations

import json
import os
import xml.etree.ElementTree as ET

import pytest
from packed_suites import MEET

from harness.ranks import packing

pytest_plugins = ["pytester"]

TWO_CORES = len(os.sched_getaffinity(0)) >= 2

SUITE = """
import json
import os
from pathlib import Path

import pytest

SEEN = Path(os.environ["PACK_TEST_SEEN"])


def where(name, world_size):
    with SEEN.open("a") as seen:
        seen.write(json.dumps({"test": name, "pid": os.getpid(), "cpus": sorted(os.sched_getaffinity(0)),
                               "threads": os.environ.get("OMP_NUM_THREADS")}) + "\\n")
    meet(SEEN, int(os.environ["PACK_TEST_PEERS"]))  # packed: two workers at once, not a race with the second's start


@pytest.mark.parametrize("world_size", [1])
@pytest.mark.parametrize("index", range(6))
def test_passes(record_property, world_size, index):
    where(f"passes{index}", world_size)
    record_property("index", index)
    print(f"output of test {index}")


@pytest.mark.parametrize("world_size", [1])
def test_fails(world_size):
    where("fails", world_size)
    assert 41 == 42, "the answer"


@pytest.mark.parametrize("world_size", [1])
def test_skips(world_size):
    pytest.skip("not here")


@pytest.mark.parametrize("world_size", [1])
def test_kills_its_worker(world_size):
    where("kills", world_size)
    os._exit(9)
""" + MEET


def run(pytester, monkeypatch, *args):
    monkeypatch.setenv("PACK_TEST_SEEN", str(pytester.path / "seen.jsonl"))
    monkeypatch.setenv("PACK_TEST_PEERS", "2" if "--pack-tests" in args else "1")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    pytester.makepyfile(test_suite=SUITE)
    junit = pytester.path / "junit.xml"
    result = pytester.runpytest_subprocess("-p", "harness.ranks.plugin", "-o", "junit_family=xunit1",
                                           "-o", "junit_logging=all", f"--junitxml={junit}", "-rfE", *args)
    seen = [json.loads(line) for line in (pytester.path / "seen.jsonl").read_text().splitlines()]
    return result, ET.parse(junit).getroot(), seen


def outcomes(root) -> dict[str, str]:
    found = {}
    for case in root.iter("testcase"):
        children = [child.tag for child in case if child.tag in ("failure", "error", "skipped")]
        found[case.get("name")] = children[0] if children else "passed"
    return found


@pytest.mark.skipif(not TWO_CORES, reason="packing needs two cores")
def test_packed_tests_run_at_once_on_disjoint_cores_and_report_as_a_serial_run(pytester, monkeypatch):
    packed, packed_junit, packed_seen = run(pytester, monkeypatch, "--pack-tests", "-k", "not kills")
    (pytester.path / "seen.jsonl").unlink()
    serial, serial_junit, serial_seen = run(pytester, monkeypatch, "-k", "not kills")
    assert outcomes(packed_junit) == outcomes(serial_junit)
    assert outcomes(packed_junit)["test_fails[1]"] == "failure"
    assert packed.ret == serial.ret == 1
    # the terminal's summary counts are a serial run's
    assert packed.parseoutcomes() == serial.parseoutcomes() == {"passed": 6, "failed": 1, "skipped": 1,
                                                                "deselected": 1}
    # properties and captured output travel with each test
    for case in packed_junit.iter("testcase"):
        if case.get("name").startswith("test_passes"):
            index = case.get("name").split("[")[1].split("-")[0]
            assert {prop.get("name"): prop.get("value") for prop in case.iter("property")} == {"index": index}
            assert f"output of test {index}" in case.find("system-out").text
    # two workers, each on a core of its own with one thread per rank; serially, one process on every core
    workers = {entry["pid"]: entry["cpus"] for entry in packed_seen}
    assert len(workers) >= 2 and all(len(cpus) == 1 for cpus in workers.values())
    assert len({cpus[0] for cpus in workers.values()}) == len(workers)
    assert {entry["threads"] for entry in packed_seen} == {"1"}
    assert len({entry["pid"] for entry in serial_seen}) == 1


@pytest.mark.skipif(not TWO_CORES, reason="packing needs two cores")
def test_a_worker_that_dies_fails_the_test_it_ran_with_its_last_words_and_the_others_still_run(pytester,
                                                                                              monkeypatch):
    _, junit, _ = run(pytester, monkeypatch, "--pack-tests", "-k", "kills or passes")
    assert outcomes(junit)["test_kills_its_worker[1]"] == "failure"
    failure = next(case for case in junit.iter("testcase") if case.get("name") == "test_kills_its_worker[1]")
    assert "exited with code 9 during this test" in failure.find("failure").get("message", "") + \
        (failure.find("failure").text or "")
    # nothing lost: the other worker, or the coordinator after the group, runs every test the dead one did not
    assert sorted(outcomes(junit).values()) == ["failure"] + ["passed"] * 6


class Declared:
    """A collected test as declared_world_size reads it: its parameters and its world_size marker."""

    def __init__(self, params=None, marker_args=None):
        self.nodeid = "tests/gpu/test_x.py::test_y"
        self.callspec = type("Callspec", (), {"params": params})() if params is not None else None
        self._marker = None if marker_args is None else pytest.mark.world_size(*marker_args).mark

    def get_closest_marker(self, name):
        return self._marker if name == "world_size" else None


def test_packing_is_left_off_where_no_two_tests_could_run_at_once(pytester, monkeypatch):
    """Two-rank tests on two cores: the session runs them itself (workers would only cost their start)."""
    units = packing.Units("cpu", ("0", "1"))
    two, one = Declared({"world_size": 2}), Declared({"world_size": 1})
    assert not packing.worth_packing(packing.pack_groups([two, two, one], 2, units))
    assert packing.worth_packing(packing.pack_groups([one, one, two], 2, units))


def test_a_world_larger_than_the_cell_stays_with_the_coordinator():
    """A cpu cell of 2 ranks on 16 cores: its 4- and 8-rank tests skip at once, in the coordinator."""
    assert sorted(packing.by_need([Declared({"world_size": world}) for world in (1, 2, 4, 8)], 2)) == [1, 2]


def test_workers_take_the_longest_tests_first_and_unknown_ones_in_collection_order():
    class Item:
        def __init__(self, nodeid):
            self.nodeid = nodeid

    durations = {"t1": 10.0, "t2": 6.0, "t4": 1.0}
    items = [Item(name) for name in ("t4", "u1", "t2", "u2", "t1")]  # u1, u2: no duration, weigh their need of 2
    assert packing.queue_order(items, 2, durations) == ["t1", "t2", "u1", "u2", "t4"]


def test_a_group_gets_a_worker_per_share_of_units_and_no_more_than_it_has_tests():
    units = packing.Units("gpu", ("a", "b", "c", "d", "e"))
    two = [Declared({"world_size": 2})] * 3
    assert [share.ids for share in packing.worker_units(two, 2, units)] == [("a", "b"), ("c", "d")]
    assert [share.ids for share in packing.worker_units(two[:1], 2, units)] == [("a", "b", "c", "d", "e")]
    assert [share.ids for share in packing.worker_units(two, 8, units)] == [("a", "b", "c", "d", "e")]


def test_workers_on_gpus_split_the_hosts_cpus_too():
    """Eight tests sharing one H100, each worker's ranks free to take a thread per core of the host: every test ran
    40 times slower than alone (0.7 s of work became 30-39 s). Each GPU worker runs on its own run of the CPUs."""
    one_device = [Declared({})] * 8
    shared = packing.Units("gpu", ("gpu0",) * 8)  # one GPU, eight slots (harness.ranks.gpushare)
    shares = packing.worker_units(one_device, 1, shared, list(range(16)))
    assert [share.cpus for share in shares] == [(2 * index, 2 * index + 1) for index in range(8)]
    two_gpus = packing.worker_units([Declared({"world_size": 2})] * 4, 2, packing.Units("gpu", tuple("abcd")),
                                    list(range(6)))
    assert [(share.ids, share.cpus) for share in two_gpus] == [(("a", "b"), (0, 1, 2)), (("c", "d"), (3, 4, 5))]
    # fewer CPUs than workers: each still runs on one, shared
    assert [share.cpus for share in packing.worker_units(one_device[:3], 1, shared, [4, 5])] == [(4,), (5,), (4,)]
    cpus = packing.worker_units([Declared({"world_size": 2})] * 2, 2, packing.Units("cpu", ("0", "1", "2", "3")))
    assert [share.cpus for share in cpus] == [(0, 1), (2, 3)]  # a CPU worker's units are its CPUs


def test_a_durations_file_that_is_not_an_object_of_seconds_is_a_usage_error(tmp_path):
    bad = tmp_path / "durations.json"
    bad.write_text("[1, 2]")
    with pytest.raises(pytest.UsageError, match=r"durations\.json: not a JSON object"):
        packing.read_durations(str(bad))
    bad.write_text(json.dumps({"a": 1.5, "b": "slow", "c": -1, "d": 1e300}))
    assert packing.read_durations(str(bad)) == {"a": 1.5}


@pytest.mark.parametrize(("flag", "packed"), [((), True), (("--serial-tests",), False)])
def test_harness_run_packs_a_cells_tests_unless_told_not_to(flag, packed):
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    shown = subprocess.run([sys.executable, "-m", "harness", "run", "--dry-run", *flag], cwd=repo,
                           capture_output=True, text=True, check=True).stdout
    command = next(line for line in shown.splitlines() if line.strip().startswith("command:"))
    assert ("--pack-tests" in command.split()) is packed


MARKED_SUITE = """
import json
import os
from pathlib import Path

import pytest

SEEN = Path(os.environ["PACK_TEST_SEEN"])


@pytest.mark.world_size(1)
@pytest.mark.parametrize("index", range(4))
def test_declared_by_its_marker(index):
    with SEEN.open("a") as seen:
        seen.write(json.dumps({"test": index, "pid": os.getpid()}) + "\\n")
    meet(SEEN, 2)  # two workers run these tests at once


@pytest.mark.world_size(1)
def test_calls_more_ranks_than_it_declares(ranks):
    ranks.run(2, print)
""" + MEET


@pytest.mark.skipif(not TWO_CORES, reason="packing needs two cores")
def test_a_test_that_declares_its_world_size_by_a_marker_is_packed_and_may_not_call_more(pytester, monkeypatch):
    """A test whose world size is no parameter (a module's constant) declares it with `world_size(N)`: packing gives
    it N units as it gives a parametrized one, and a call of more ranks fails before any rank starts."""
    monkeypatch.setenv("PACK_TEST_SEEN", str(pytester.path / "seen.jsonl"))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    pytester.makepyfile(test_marked=MARKED_SUITE)
    result = pytester.runpytest_subprocess("-p", "harness.ranks.plugin", "--strict-markers", "--pack-tests", "-rfE")
    result.assert_outcomes(passed=4, failed=1)
    result.stdout.fnmatch_lines(["*test_calls_more_ranks_than_it_declares declares 1 ranks (a world_size parameter "
                                 "or marker) and calls 2: declare the most it runs at once*"])
    seen = [json.loads(line) for line in (pytester.path / "seen.jsonl").read_text().splitlines()]
    assert len({entry["pid"] for entry in seen}) >= 2  # run by two workers at once, not by the coordinator


def test_a_test_needs_its_largest_world_then_its_marker_then_one_device():
    assert packing.need_of(Declared({"world_size": 2, "resume_world_size": 4})) == 4  # a resume on another world
    assert packing.need_of(Declared({"world_size": 4, "resume_world_size": 2})) == 4
    assert packing.need_of(Declared(marker_args=(2,))) == 2
    assert packing.need_of(Declared({"world_size": 8}, marker_args=(2,))) == 8  # the parameter is the test's own
    assert packing.need_of(Declared({"dtype": "float32"})) is None


@pytest.mark.parametrize("marker_args", [(), (0,), (True,), ("2",), (2, 4)])
def test_a_world_size_marker_that_is_not_one_whole_number_of_ranks_is_a_usage_error(marker_args):
    with pytest.raises(pytest.UsageError, match=r"tests/gpu/test_x.py::test_y: world_size.*expected one whole number"):
        packing.need_of(Declared(marker_args=marker_args))


BALANCE_SUITE = """
import os
import time
from pathlib import Path

import pytest

DONE = Path(os.environ["PACK_TEST_DONE"])
SHORT = 6


@pytest.mark.parametrize("world_size", [1])
def test_long(world_size):
    # Ends once every short test has: only if no worker holds a short test back while it runs this one.
    deadline = time.monotonic() + 300  # a bound for the failure only; on time the shorts end in seconds
    while len(list(DONE.glob("short*"))) < SHORT:
        assert time.monotonic() < deadline, f"{sorted(p.name for p in DONE.iterdir())}: a short test was held back"
        time.sleep(0.05)


@pytest.mark.parametrize("world_size", [1])
@pytest.mark.parametrize("index", range(SHORT))
def test_short(world_size, index):
    (DONE / f"short{index}").touch()
"""


@pytest.mark.skipif(not TWO_CORES, reason="packing needs two cores")
def test_a_worker_takes_its_next_test_only_when_it_ends_one_so_no_test_waits_behind_a_long_one(pytester,
                                                                                              monkeypatch):
    """The long test starts first (earlier durations say so) and waits for every short one: it ends only because
    the other worker took all six, none of them held back by the long test's worker (a split per worker, or a test
    taken before the current one runs, would hold one there and never end)."""
    done = pytester.path / "done"
    done.mkdir()
    monkeypatch.setenv("PACK_TEST_DONE", str(done))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    pytester.makepyfile(test_balance=BALANCE_SUITE)
    durations = pytester.path / "durations.json"
    durations.write_text(json.dumps({"test_balance.py::test_long[1]": 60.0}))
    result = pytester.runpytest_subprocess("-p", "harness.ranks.plugin", "--pack-tests",
                                           f"--pack-durations={durations}", "-p", "no:randomly")
    assert result.parseoutcomes() == {"passed": 7}


IMPORTED = """
import os
from pathlib import Path

with Path(os.environ["PACK_TEST_IMPORTS"]).open("a") as imports:
    imports.write(f"{__name__} {os.getpid()}\\n")
"""


@pytest.mark.skipif(not TWO_CORES, reason="packing needs two cores")
def test_a_worker_collects_only_the_files_of_its_groups_tests(pytester, monkeypatch):
    """Each module notes which process imported it: the files with no packed test (one beside the group's, one in a
    folder of its own) only the coordinator collects; the group's file every worker does; every test still runs."""
    imports = pytester.path / "imports.txt"
    monkeypatch.setenv("PACK_TEST_IMPORTS", str(imports))
    monkeypatch.setenv("PACK_TEST_SEEN", str(pytester.path / "seen.jsonl"))
    monkeypatch.setenv("PACK_TEST_PEERS", "2")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    (pytester.path / "packed").mkdir()
    (pytester.path / "packed" / "test_group.py").write_text(IMPORTED + SUITE)
    (pytester.path / "unpacked").mkdir()
    (pytester.path / "unpacked" / "test_elsewhere.py").write_text(IMPORTED + "\n\ndef test_here():\n    pass\n")
    pytester.makepyfile(test_beside=IMPORTED + "\n\ndef test_beside():\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "harness.ranks.plugin", "--pack-tests", "-p", "no:randomly",
                                           "-k", "passes or here or beside")
    assert result.parseoutcomes() == {"passed": 8, "deselected": 3}
    by_module: dict[str, set[str]] = {}
    for line in imports.read_text().splitlines():
        module, pid = line.split()
        by_module.setdefault(module.rpartition(".")[2], set()).add(pid)
    workers = {json.loads(line)["pid"] for line in (pytester.path / "seen.jsonl").read_text().splitlines()}
    assert len(workers) >= 2
    coordinator = by_module["test_beside"]
    assert len(coordinator) == 1 and not coordinator & {str(pid) for pid in workers}
    assert by_module["test_elsewhere"] == coordinator
    assert by_module["test_group"] == coordinator | {str(pid) for pid in workers}
