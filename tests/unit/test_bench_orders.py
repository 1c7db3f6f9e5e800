"""tests/benchmarks/bench_orders.py's comparison: a seeded run's verdict that is not the no-pool one is listed,
a test one side lacks too, and a merge without a baseline says so instead of passing."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_orders.py"


def load_bench():
    spec = importlib.util.spec_from_file_location("bench_orders", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_changed_or_missing_verdict_is_a_difference():
    bench = load_bench()
    found = {"no-pool": {"a": "passed", "b": "failed", "c": "xfailed"},
             "seed 1": {"a": "passed", "b": "failed", "c": "xfailed"},
             "seed 2": {"a": "failed", "b": "failed"}}
    assert bench.differences(found) == [
        {"test": "a", "seed 2": "failed", "no-pool": "passed"},
        {"test": "c", "seed 2": None, "no-pool": "xfailed"},
    ]


def test_a_merge_compares_runs_made_apart_and_needs_the_baseline(tmp_path):
    bench = load_bench()

    def report(name, group, outcomes):
        path = tmp_path / name
        path.write_text(json.dumps({"collected": 2, "cpus": 16, "cpu_ranks": "2", "broken_runs": [],
                                    "groups": {group: {"runs": [], "calls": None, "pools_started": None,
                                                               "outcomes": {}}},
                                    "verdicts": {group: outcomes}}))
        return path

    seeds = report("seeds.json", "seed 1", {"a": "passed", "b": "skipped"})
    baseline = report("baseline.json", "no-pool", {"a": "passed", "b": "passed"})
    merged = bench.merge([seeds, baseline])
    assert merged["differences"] == [{"test": "b", "seed 1": "skipped", "no-pool": "passed"}]
    assert merged["same_verdicts"] is False
    alone = bench.merge([seeds])
    assert alone["same_verdicts"] is False and alone["differences"] == [{"error": "no no-pool run among the inputs"}]
    assert bench.main([str(tmp_path / "out.json"), "--merge", str(seeds), str(baseline)]) == 1
