"""tests/benchmarks/bench_suite_time.py's verdicts: a base commit's test in a file renamed since is compared under its
new name (tests/gpu/renamed.yaml), so a rename is not a verdict that differs, and a real difference still is."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load_bench():
    sys.path.insert(0, str(BENCHMARKS))  # it imports base_tree beside it
    try:
        spec = importlib.util.spec_from_file_location("bench_suite_time", BENCHMARKS / "bench_suite_time.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCHMARKS))


def junit(path: Path, *cases: str) -> Path:
    path.write_text(f"<testsuites><testsuite>{''.join(cases)}</testsuite></testsuites>")
    return path


def test_a_renamed_files_tests_keep_their_verdicts_and_a_changed_verdict_still_differs(tmp_path):
    bench = load_bench()
    renames = bench.read_renames(bench.RENAMED)
    base = bench.verdicts(junit(tmp_path / "base.xml",
                                '<testcase classname="tests.gpu.test_deliberate_bugs" name="test_a[2]"/>',
                                '<testcase classname="tests.gpu.test_training" name="test_b"/>'), renames)
    current = bench.verdicts(junit(tmp_path / "current.xml",
                                   '<testcase classname="tests.gpu.test_planted_bugs" name="test_a[2]"/>',
                                   '<testcase classname="tests.gpu.test_training" name="test_b"><failure/></testcase>'))
    assert base == {"tests/gpu/test_planted_bugs.py::test_a[2]": "passed",
                    "tests/gpu/test_training.py::test_b": "passed"}
    assert [name for name in base.keys() | current.keys() if base.get(name) != current.get(name)] == [
        "tests/gpu/test_training.py::test_b"]


def test_rounds_interleave_abba_and_combine_into_one_figure_per_side():
    bench = load_bench()
    assert [bench.interleaved(index) for index in range(4)] == [
        ("base", "current"), ("current", "base"), ("base", "current"), ("current", "base")]
    first = {"seconds": 100.0, "exit": 0, "outcomes": {"passed": 4}, "slowest_files": {"test_a": 90.0}, "cases": 4,
             "calls": 6, "work_per_case_s": 20.0, "pool_overhead_per_case_s": 1.0, "wall_per_case_s": 25.0}
    second = {**first, "seconds": 140.0, "exit": 1, "work_per_case_s": 30.0, "wall_per_case_s": 35.0}
    side = bench.combined([first, second])
    assert side["seconds"] == 240.0 and side["rounds_s"] == [100.0, 140.0]
    assert side["exit"] == 1  # a round that failed is not hidden by one that passed
    assert (side["work_per_case_s"], side["wall_per_case_s"], side["cases"]) == (25.0, 30.0, 4)
