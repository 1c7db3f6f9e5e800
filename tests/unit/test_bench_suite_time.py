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
