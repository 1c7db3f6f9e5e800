"""The suite's verdicts in seeded random orders with the rank pool, against its verdicts with one spawn per
test (`--no-ranks-pool`), in one invocation. Not a pytest file:

    python tests/benchmarks/bench_orders.py OUT.json [--seeds 1,2,3] [--shards 4] [--jobs 4] [-- PYTEST OPTIONS]
    python tests/benchmarks/bench_orders.py OUT.json --merge A.json B.json   # runs made apart (--seeds '', --shards 0)

PYTEST OPTIONS (`-m deep`, `-k qwen`) choose the tests; every run gets them, a no-pool shard its node ids too.

Runs, at most --jobs at a time, under the caller's environment (HARNESS_CPU_RANKS, CUDA_VISIBLE_DEVICES pass
through): one pooled run per seed (`--random-order SEED`), and the no-pool baseline split into --shards runs
over disjoint node ids (spawned ranks share nothing, so shards only shorten its wall time). Each run writes
JUnit; a test's verdict is its outcome there (passed, failed, errored, skipped, xfailed, flaky).

OUT.json holds each run's wall time, outcome counts and pool starts (calls whose HARNESS_RANKS_TIMING line has
`pool_start_s` > 0), and `differences`: every test whose verdict in a seeded run is not its no-pool verdict,
or that one of them lacks. Exit 1 when there is one, or when a run broke (pytest exit other than 0 or 1).
Wall times of runs that shared the machine are not comparable: bench_pool.py times pool on against off.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(Path(__file__).resolve().parent)]  # the checkout's harness; bench_pool beside
from bench_pool import SUITE_COMMAND, pools_started, read_timing, split_pytest_args, suite_environ  # noqa: E402

from harness.results.junit import read_junit_tests  # noqa: E402

SUITE = SUITE_COMMAND
SUITE_OPTIONS = [arg for arg in SUITE_COMMAND if arg != "tests/gpu"]  # a no-pool shard names its node ids
BASELINE = "no-pool"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ours, pytest_args = split_pytest_args(argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("json", type=Path, help="where to write the figures")
    parser.add_argument("--seeds", default="1,2,3", help="comma-separated --random-order seeds (default 1,2,3)")
    parser.add_argument("--shards", type=int, default=1, help="split the no-pool run into this many (default 1)")
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time (default 1)")
    parser.add_argument("--keep", type=Path, metavar="DIR", help="keep each run's JUnit, timing and log in DIR")
    parser.add_argument("--merge", type=Path, nargs="+", metavar="IN",
                        help="compare the verdicts of earlier OUT.json files")
    args = parser.parse_args(ours)
    try:
        args.seeds = [int(seed) for seed in args.seeds.split(",") if seed.strip()]
    except ValueError:
        parser.error(f"--seeds takes integers; got {args.seeds!r}")
    if args.shards < 0 or args.jobs < 1 or not (args.seeds or args.shards or args.merge):
        parser.error("nothing to run: give --seeds or --shards (at least 0; --jobs at least 1)")
    args.pytest_args = pytest_args
    return args


def collect(pytest_args: list[str]) -> list[str]:
    """The suite's node ids, in collection order."""
    completed = subprocess.run([sys.executable, *SUITE, "--collect-only", *pytest_args], cwd=REPO,
                               env=suite_environ(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    ids = [line for line in completed.stdout.splitlines() if "::" in line and not line.startswith(" ")]
    if completed.returncode != 0 or not ids:
        sys.exit(f"bench_orders: collecting the suite failed (exit {completed.returncode}):\n"
                 f"{completed.stdout[-3000:]}")
    return ids


def plan(args: argparse.Namespace, ids: list[str], scratch: Path) -> list[dict[str, Any]]:
    runs = [{"name": f"seed {seed}", "group": f"seed {seed}", "args": [*SUITE, "--random-order", str(seed)]}
            for seed in args.seeds]
    for shard in range(args.shards):
        listing = scratch / f"shard-{shard}.txt"
        listing.write_text("\n".join(ids[shard::args.shards]) + "\n")
        runs.append({"name": f"{BASELINE} {shard + 1}/{args.shards}", "group": BASELINE,
                     "args": [*SUITE_OPTIONS, "--no-ranks-pool", f"@{listing}"]})
    for index, run in enumerate(runs):
        run.update(junit=scratch / f"junit-{index}.xml", timing=scratch / f"timing-{index}.jsonl",
                   log=scratch / f"log-{index}.txt")
    return runs


def execute(runs: list[dict[str, Any]], pytest_args: list[str], jobs: int) -> None:
    """Every run, `jobs` at a time; each gets its wall time and exit code."""
    waiting, running = list(runs), []
    while waiting or running:
        while waiting and len(running) < jobs:
            run = waiting.pop(0)
            command = [sys.executable, *run["args"], f"--junitxml={run['junit']}", *pytest_args]
            print(f"[{run['name']}] started", file=sys.stderr, flush=True)
            run["started"] = time.perf_counter()
            with run["log"].open("w") as log:  # the child holds its own copy of the descriptor
                run["process"] = subprocess.Popen(command, cwd=REPO, env=suite_environ(run["timing"]), stdout=log,
                                                  stderr=subprocess.STDOUT)
            running.append(run)
        time.sleep(1)
        for run in [run for run in running if run["process"].poll() is not None]:
            run["wall_s"] = round(time.perf_counter() - run["started"], 1)
            run["exit_code"] = run["process"].returncode
            running.remove(run)
            print(f"[{run['name']}] exit {run['exit_code']} after {run['wall_s']} s", file=sys.stderr, flush=True)


def verdicts(runs: list[dict[str, Any]]) -> dict[str, dict[str, str]]:
    """Per group (a seed, or the no-pool shards together): test id -> outcome."""
    found: dict[str, dict[str, str]] = {}
    for run in runs:
        tests = read_junit_tests(run["junit"])  # none when pytest never wrote it
        found.setdefault(run["group"], {}).update({test.test_id: test.outcome.value for test in tests})
    return found


def differences(found: dict[str, dict[str, str]]) -> list[dict[str, Any]]:
    baseline = found.get(BASELINE, {})
    listed = []
    for group, outcomes in found.items():
        if group == BASELINE:
            continue
        for test_id in sorted(baseline.keys() | outcomes.keys()):
            if outcomes.get(test_id) != baseline.get(test_id):
                listed.append({"test": test_id, group: outcomes.get(test_id), BASELINE: baseline.get(test_id)})
    return listed


def summarize(runs: list[dict[str, Any]], found: dict[str, dict[str, str]], listed: list[dict[str, Any]],
              ids: list[str]) -> dict[str, Any]:
    groups: dict[str, dict[str, Any]] = {}
    for run in runs:
        calls = read_timing(run["timing"])
        group = groups.setdefault(run["group"], {"runs": [], "pools_started": 0, "calls": 0})
        group["runs"].append({"name": run["name"], "wall_s": run["wall_s"], "exit_code": run["exit_code"]})
        group["calls"] += len(calls)
        group["pools_started"] += pools_started(calls)
    for name, group in groups.items():
        if name == BASELINE:  # spawned ranks write no timing lines: every call starts its own
            group["pools_started"] = group["calls"] = None
        group["outcomes"] = dict(sorted(Counter(found.get(name, {}).values()).items()))
    return {"schema": 1, "collected": len(ids), "cpus": os.cpu_count(),
            "cpu_ranks": os.environ.get("HARNESS_CPU_RANKS", "2 (default)"), "groups": groups,
            "same_verdicts": not listed if BASELINE in found and len(found) > 1 else None,
            "differences": listed, "verdicts": found}


def merge(paths: list[Path]) -> dict[str, Any]:
    """One report from reports of runs made apart (the baseline on one machine call, the seeds on another)."""
    reports = [json.loads(path.read_text()) for path in paths]
    groups = {name: group for report in reports for name, group in report["groups"].items()}
    found = {name: outcomes for report in reports for name, outcomes in report["verdicts"].items()}
    listed = differences(found) if BASELINE in found else [{"error": f"no {BASELINE} run among the inputs"}]
    return {"schema": 1, "merged": [str(path) for path in paths], "collected": max(r["collected"] for r in reports),
            "cpus": reports[0]["cpus"], "cpu_ranks": reports[0]["cpu_ranks"], "groups": groups,
            "same_verdicts": not listed, "differences": listed, "verdicts": found,
            "broken_runs": [name for report in reports for name in report["broken_runs"]]}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    report = merge(args.merge) if args.merge else run_all(args)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    for name, group in report["groups"].items():
        walls = ", ".join(f"{run['wall_s']} s" for run in group["runs"])
        pools = ("every call spawns its ranks" if group["calls"] is None
                 else f"pools started {group['pools_started']} in {group['calls']} calls")
        print(f"{name:<10} {group['outcomes']}  {pools}; wall {walls}")
    listed = report["differences"]
    print(f"verdicts that differ from {BASELINE}: {len(listed)}")
    for difference in listed[:50]:
        print(f"  {difference}")
    return 1 if listed or report["broken_runs"] else 0


def run_all(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-orders-") as scratch:
        if args.keep:
            args.keep.mkdir(parents=True, exist_ok=True)
            scratch = args.keep
        ids = collect(args.pytest_args)
        runs = plan(args, ids, Path(scratch))
        execute(runs, args.pytest_args, args.jobs)
        found = verdicts(runs)
        listed = differences(found) if BASELINE in found else []  # compared when merged with a baseline
        report = summarize(runs, found, listed, ids)
        broken = [run["name"] for run in runs if run["exit_code"] not in (0, 1)]
        for run in runs:
            if run["exit_code"] not in (0, 1):
                print(f"[{run['name']}] broke:\n{run['log'].read_text()[-3000:]}", file=sys.stderr)
    report["broken_runs"] = broken
    return report


if __name__ == "__main__":
    raise SystemExit(main())
