"""The suite's wall time at another commit and at this checkout, one after the other on this machine, and their
ratio (issue 31: the embedded default with the training layer at most 1.5x the suite before it; issue 45: at most
0.5x the commit before kept process groups), with the cost per case (the ranks' work, the pool's overhead) and the
tests whose verdicts differ between the two sides.

    python tests/benchmarks/bench_suite_time.py [--base REV] [--rounds N] [--json OUT] [-- PYTEST_ARGS...]

Each side runs `python -m pytest tests/gpu` (its own tree: the base commit exported with `git archive` into a
temporary folder, its `harness` first on the import path) with this interpreter's torch and transformers, 2 gloo
ranks unless HARNESS_CPU_RANKS says otherwise, and the same PYTEST_ARGS (e.g. `-k mixtral` for a quick look).
Prints each side's seconds, its outcome counts and its slowest test files (from its junit.xml), then the ratio and
the tests whose verdicts differ, the base's test ids carried to their files' new names by tests/gpu/renamed.yaml.

`--rounds N` runs the two sides N times each, interleaved base, current, current, base, ... (ABBA: a machine whose
load drifts over the run weighs on both sides alike), and reports each round and the ratio of the sides' totals.
On a shared machine one pair can be off by a third; read the rounds.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from xml.etree import ElementTree

from base_tree import export

from harness.history.renames import Rename, read_renames

REPO = Path(__file__).resolve().parents[2]
DEFAULT_BASE = "ba0dc9e"  # the commit before the training layer
RENAMED = REPO / "tests" / "gpu" / "renamed.yaml"


def timed_suite(tree: Path, junit: Path, pytest_args: list[str]) -> dict:
    timing = junit.with_suffix(".timing.jsonl")
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(tree), os.environ.get("PYTHONPATH")])),
               "HF_HUB_OFFLINE": "1", "HARNESS_RANKS_TIMING": str(timing)}
    command = [sys.executable, "-m", "pytest", "tests/gpu", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}",
               *pytest_args]
    started = time.perf_counter()
    completed = subprocess.run(command, cwd=tree, env=environ, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    summary = junit_summary(junit)
    return {"seconds": round(seconds, 1), "exit": completed.returncode, **summary,
            **cost_per_case(timing, sum(summary["outcomes"].values()), seconds)}


def cost_per_case(timing: Path, cases: int, wall: float) -> dict:
    """What a case costs, from the pool's timing lines: the ranks' work (the slowest rank's seconds in `fn`), the
    pool's overhead around it (the call's wall time less that work: starting pools, sending, gathering) and the
    session's wall, each divided by the cases junit.xml counts."""
    calls = [json.loads(line) for line in timing.read_text().splitlines()] if timing.exists() else []
    work = sum(call["work_s"] or 0.0 for call in calls)
    in_calls = sum(call["call_s"] for call in calls)
    per = max(cases, 1)
    return {"cases": cases, "calls": len(calls), "work_per_case_s": round(work / per, 3),
            "pool_overhead_per_case_s": round((in_calls - work) / per, 3),
            "wall_per_case_s": round(wall / per, 3)}


def verdicts(junit: Path, renames: tuple[Rename, ...] = ()) -> dict[str, str]:
    """Test id (a node id, its file renamed where `renames` says) -> passed, failure, error or skipped."""
    found = {}
    for case in ElementTree.parse(junit).iter("testcase"):
        tags = [child.tag for child in case if child.tag in ("failure", "error", "skipped")]
        node = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"
        node = next((rename.applied(node) for rename in renames if rename.matches(node)), node)
        found[node] = tags[0] if tags else "passed"
    return found


def junit_summary(junit: Path) -> dict:
    """Outcome counts and the five test files that took longest, from a junit.xml."""
    outcomes, by_file = collections.Counter(), collections.Counter()
    for case in ElementTree.parse(junit).iter("testcase"):
        skipped = case.find("skipped")
        if case.find("failure") is not None or case.find("error") is not None:
            outcomes["failed"] += 1
        elif skipped is not None:
            outcomes["xfailed" if "xfail" in (skipped.get("type") or "") else "skipped"] += 1
        else:
            outcomes["passed"] += 1
        by_file[case.get("classname", "").rsplit(".", 1)[-1]] += float(case.get("time") or 0)
    return {"outcomes": dict(outcomes), "slowest_files": {name: round(t, 1) for name, t in by_file.most_common(5)}}


def interleaved(index: int) -> tuple[str, str]:
    """The sides' order in round `index`: base first in even rounds, current first in odd ones (ABBA)."""
    return ("base", "current") if index % 2 == 0 else ("current", "base")


def combined(runs: list[dict]) -> dict:
    """One side's rounds as one figure: the seconds and each per-case cost summed over the rounds' cases; the
    outcomes and slowest files of its first round; the worst exit; every round's seconds beside."""
    cases = sum(run["cases"] for run in runs)
    seconds = sum(run["seconds"] for run in runs)

    def per_case(key: str) -> float:
        return round(sum(run[key] * run["cases"] for run in runs) / max(cases, 1), 3)

    return {"seconds": round(seconds, 1), "exit": max(run["exit"] for run in runs), "outcomes": runs[0]["outcomes"],
            "slowest_files": runs[0]["slowest_files"], "cases": runs[0]["cases"],
            "calls": sum(run["calls"] for run in runs) // len(runs),
            "work_per_case_s": per_case("work_per_case_s"),
            "pool_overhead_per_case_s": per_case("pool_overhead_per_case_s"),
            "wall_per_case_s": per_case("wall_per_case_s"), "rounds_s": [run["seconds"] for run in runs]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default=DEFAULT_BASE, help=f"the commit to compare with (default {DEFAULT_BASE})")
    parser.add_argument("--rounds", type=int, default=1, help="runs of each side, interleaved ABBA (default 1)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("pytest_args", nargs=argparse.REMAINDER, help="after --: passed to both sides' pytest")
    args = parser.parse_args()
    pytest_args = [arg for arg in args.pytest_args if arg != "--"]
    if args.rounds < 1:
        parser.error(f"--rounds {args.rounds}: at least 1")
    runs: dict[str, list[dict]] = {"base": [], "current": []}
    differ: set[str] = set()
    with tempfile.TemporaryDirectory(prefix="bench-suite-") as scratch:
        folder = Path(scratch)
        trees = {"base": export(args.base, folder), "current": REPO}
        for index in range(args.rounds):
            for side in interleaved(index):
                junit = folder / f"{side}-{index}.xml"
                runs[side].append(timed_suite(trees[side], junit, pytest_args))
                print(f"round {index + 1} {side:8s} {runs[side][-1]['seconds']:7.1f} s", flush=True)
            before = verdicts(folder / f"base-{index}.xml", read_renames(RENAMED))
            after = verdicts(folder / f"current-{index}.xml")
            differ |= {name for name in before.keys() | after.keys() if before.get(name) != after.get(name)}
    figures = {"base": {"revision": args.base, **combined(runs["base"])}, "current": combined(runs["current"]),
               "verdicts_differ": sorted(differ)}
    figures["ratio"] = round(figures["current"]["seconds"] / figures["base"]["seconds"], 2)
    figures["work_per_case_ratio"] = round(
        figures["current"]["work_per_case_s"] / max(figures["base"]["work_per_case_s"], 1e-9), 2)
    for side in ("base", "current"):
        each = figures[side]
        print(f"{side:8s} {each['seconds']:7.1f} s  exit {each['exit']}  {each['outcomes']}  per case: work "
              f"{each['work_per_case_s']} s, pool overhead {each['pool_overhead_per_case_s']} s, wall "
              f"{each['wall_per_case_s']} s  slowest: {each['slowest_files']}")
    print(f"ratio    {figures['ratio']}x wall, {figures['work_per_case_ratio']}x work per case (current / base, "
          f"{args.rounds} round(s) interleaved on this machine); verdicts that differ: {len(differ)} "
          f"{sorted(differ)[:5]}")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
